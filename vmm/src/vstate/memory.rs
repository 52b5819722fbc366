//! Guest RAM: its regions (the KVM memslots) and the one way the VMM reads and writes it —
//! rust-vmm's vm-memory [`Bytes`] (`read_obj`, `write_slice`, `load`, ...), implemented by
//! [`GuestRam`] for both kinds of RAM:
//!
//! - **Local**: anonymous private `MAP_NORESERVE` memory the VMM maps itself, as a vm-memory
//!   [`GuestMemoryMmap`]; accesses go straight through it.
//! - **Paged** by the paging engine (`farvm-ept`, remote memory): KVM's memslot is the engine's
//!   userfaultfd-registered guest view, and the VMM never loads or stores through it. A page
//!   that is not resident would fault into the engine's userfaultfd like a guest fault: the
//!   VMM thread (often a vCPU thread handling a PV exit) would sleep until the fault handler
//!   served it — counted and prefetched as if the guest had touched it — and a thread the
//!   engine itself waits on would deadlock. Instead every access is a copy made by the engine
//!   ([`Engine::read_bytes`] / [`Engine::write_bytes`]): it brings the pages in through its own
//!   state machine (deduplicated with guest faults), pins each one against eviction for the
//!   copy, copies through its private alias mapping, and reads a never-written page as zeros
//!   without allocating it. `GuestRam` holds the engine weakly: the engine's lifetime is its
//!   owner's (`RemoteMemory`), and an access after it stopped is an error, never a touch of an
//!   unmapped view.
//!
//! Accesses are all-or-nothing: a range is checked to lie inside one region before anything is
//! copied.
//!
//! Devices are the exception: a virtio device reads its rings and moves data through a
//! vm-memory [`GuestMemory`](vm_memory::GuestMemory), which hands out host pointers, so it gets
//! [`GuestRam::device_view`] — for paged RAM the guest view KVM maps. A device access there is
//! a guest access like any other: a page that is not resident faults into the engine and the
//! thread (a vCPU thread serving the device) waits until it is served; the evictor's dirty
//! check by content sees what devices wrote.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use farvm_ept::{Engine, EngineError};
use vm_memory::{
    AtomicAccess, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestRegionMmap,
    MmapRegion, ReadVolatile, VolatileMemoryError, VolatileSlice, WriteVolatile,
};

use crate::layout;

/// Errors of guest-memory setup and access.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// An access outside guest RAM.
    #[error("guest memory range {gpa:#x}+{len:#x} is outside guest RAM (or spans two regions)")]
    OutOfRange {
        /// First guest-physical address.
        gpa: u64,
        /// Length in bytes.
        len: u64,
    },
    /// The RAM layout (sizes, holes) is invalid.
    #[error("guest memory layout is invalid: {0}")]
    Layout(String),
    /// Guest RAM could not be mapped.
    #[error("cannot map {len} bytes of guest RAM: {reason}")]
    Mmap {
        /// Bytes asked for.
        len: u64,
        /// The OS error.
        reason: String,
    },
    /// A guest memory access failed.
    #[error("guest memory access at {gpa:#x}: {reason}")]
    Access {
        /// Guest-physical address.
        gpa: u64,
        /// What failed.
        reason: String,
    },
    /// The paging engine failed a VMM access to paged RAM.
    #[error("the paging engine could not copy {gpa:#x}+{len:#x}: {source}")]
    Engine {
        /// First guest-physical address.
        gpa: u64,
        /// Length in bytes.
        len: u64,
        /// The engine's error.
        source: EngineError,
    },
    /// The paging engine has shut down.
    #[error("the paging engine that owned guest RAM has stopped")]
    EngineStopped,
    /// A direct (vm-memory) view was asked of engine-owned RAM.
    #[error("guest RAM belongs to the paging engine: it has no direct vm-memory view")]
    NotDirect,
}

/// How guest RAM is backed on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Private anonymous memory mapped by the VMM.
    Anonymous,
    /// Owned by the paging engine (remote memory).
    External,
}

/// One contiguous guest-physical RAM region and its host mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RamRegion {
    gpa: u64,
    len: u64,
    host: u64,
}

impl RamRegion {
    /// First guest-physical address.
    pub fn gpa(&self) -> u64 {
        self.gpa
    }
    /// Length in bytes (a multiple of 4 KiB).
    pub fn len(&self) -> u64 {
        self.len
    }
    /// Whether the region is empty (never true for a constructed region).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Host virtual address of the region's first byte (for the KVM memslot).
    pub fn host_addr(&self) -> u64 {
        self.host
    }
}

enum Access {
    Local(GuestMemoryMmap),
    Paged(Weak<Engine>),
}

/// All guest RAM of a VM.
pub struct GuestRam {
    regions: Vec<RamRegion>,
    access: Access,
}

impl std::fmt::Debug for GuestRam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestRam")
            .field("regions", &self.regions)
            .field("backing", &self.backing())
            .finish()
    }
}

/// Checks `(gpa, len)` ranges: non-empty, 4 KiB aligned, sorted, not overlapping.
fn check_layout(ranges: &[(u64, u64)]) -> Result<(), MemError> {
    if ranges.is_empty() {
        return Err(MemError::Layout("guest RAM has no regions".into()));
    }
    let mut prev_end = 0u64;
    for &(gpa, len) in ranges {
        if len == 0 || gpa % 4096 != 0 || len % 4096 != 0 || gpa < prev_end {
            return Err(MemError::Layout(format!(
                "region {gpa:#x}+{len:#x} must be non-empty, 4 KiB aligned and sorted"
            )));
        }
        prev_end = gpa
            .checked_add(len)
            .ok_or_else(|| MemError::Layout("region end overflows".into()))?;
    }
    Ok(())
}

impl GuestRam {
    /// Maps local guest RAM for the given `(gpa, len)` ranges (sorted, non-overlapping, 4 KiB
    /// aligned): private anonymous `MAP_NORESERVE` memory, so untouched RAM costs nothing.
    pub fn local(ranges: &[(u64, u64)]) -> Result<Self, MemError> {
        check_layout(ranges)?;
        let total: u64 = ranges.iter().map(|r| r.1).sum();
        let vm_ranges: Vec<(GuestAddress, usize)> = ranges
            .iter()
            .map(|&(gpa, len)| (GuestAddress(gpa), len as usize))
            .collect();
        let memory = GuestMemoryMmap::from_ranges(&vm_ranges).map_err(|e| MemError::Mmap {
            len: total,
            reason: e.to_string(),
        })?;
        let mut regions = Vec::with_capacity(ranges.len());
        for &(gpa, len) in ranges {
            let host = memory
                .get_host_address(GuestAddress(gpa))
                .map_err(|e| MemError::Mmap {
                    len,
                    reason: e.to_string(),
                })?;
            regions.push(RamRegion {
                gpa,
                len,
                host: host as u64,
            });
        }
        Ok(GuestRam {
            regions,
            access: Access::Local(memory),
        })
    }

    /// Guest RAM owned by the paging engine: one region at guest-physical 0 whose memslot is the
    /// engine's guest view; every access is a copy made by the engine (see the module doc).
    pub fn paged(engine: &Arc<Engine>) -> Result<Self, MemError> {
        let (host, len) = engine.guest_ram();
        if len == 0 || len % 4096 != 0 || host % 4096 != 0 {
            return Err(MemError::Layout(format!(
                "the engine's guest RAM {host:#x}+{len:#x} must be non-empty and 4 KiB aligned"
            )));
        }
        // The engine's range is guest-physical 0..len. Above 3 GiB it spans the MMIO hole,
        // which is no RAM region: the guest never reaches those pages.
        let regions = if len <= layout::LOW_RAM_MAX {
            vec![RamRegion { gpa: 0, len, host }]
        } else if len > layout::HIGH_RAM_BASE {
            vec![
                RamRegion {
                    gpa: 0,
                    len: layout::LOW_RAM_MAX,
                    host,
                },
                RamRegion {
                    gpa: layout::HIGH_RAM_BASE,
                    len: len - layout::HIGH_RAM_BASE,
                    host: host + layout::HIGH_RAM_BASE,
                },
            ]
        } else {
            return Err(MemError::Layout(format!(
                "the engine's guest RAM ends at {len:#x}, inside the MMIO hole ({:#x}..{:#x})",
                layout::LOW_RAM_MAX,
                layout::HIGH_RAM_BASE
            )));
        };
        Ok(GuestRam {
            regions,
            access: Access::Paged(Arc::downgrade(engine)),
        })
    }

    /// The RAM regions, sorted by guest-physical address.
    pub fn regions(&self) -> &[RamRegion] {
        &self.regions
    }

    /// How RAM is backed.
    pub fn backing(&self) -> Backing {
        match self.access {
            Access::Local(_) => Backing::Anonymous,
            Access::Paged(_) => Backing::External,
        }
    }

    /// Total RAM bytes.
    pub fn total_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.len).sum()
    }

    /// One past the highest RAM address.
    pub fn end_gpa(&self) -> u64 {
        self.regions.last().map_or(0, |r| r.gpa + r.len)
    }

    /// Whether `gpa..gpa+len` lies inside one RAM region.
    pub fn contains(&self, gpa: u64, len: u64) -> bool {
        let Some(end) = gpa.checked_add(len) else {
            return false;
        };
        self.regions
            .iter()
            .any(|r| gpa >= r.gpa && end <= r.gpa + r.len)
    }

    /// The vm-memory view of local RAM, for rust-vmm loaders (linux-loader) that take a
    /// [`vm_memory::GuestMemory`]. Paged RAM has none ([`MemError::NotDirect`]).
    pub fn direct(&self) -> Result<&GuestMemoryMmap, MemError> {
        match &self.access {
            Access::Local(m) => Ok(m),
            Access::Paged(_) => Err(MemError::NotDirect),
        }
    }

    /// A vm-memory view of all guest RAM for device DMA (see the module doc): local RAM's own
    /// mapping, or paged RAM's guest view (the KVM memslot).
    ///
    /// # Safety
    /// For paged RAM the view borrows the engine's mapping without keeping it alive: the
    /// caller must use it only while the engine runs — in the VMM, from vCPU threads, which
    /// are joined before the VM's remote memory is shut down.
    pub unsafe fn device_view(&self) -> Result<GuestMemoryMmap, MemError> {
        match &self.access {
            Access::Local(m) => Ok(m.clone()),
            Access::Paged(_) => {
                let mut regions = Vec::with_capacity(self.regions.len());
                for r in &self.regions {
                    let map_err = |reason: String| MemError::Mmap { len: r.len, reason };
                    // SAFETY: `host` is the engine's live, page-aligned guest view of `len`
                    // bytes, readable and writable; vm-memory does not unmap a raw region on
                    // drop, and the caller keeps the engine alive while the view is used.
                    let mapping = unsafe {
                        MmapRegion::build_raw(
                            r.host as *mut u8,
                            r.len as usize,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_SHARED,
                        )
                    }
                    .map_err(|e| map_err(e.to_string()))?;
                    regions.push(
                        GuestRegionMmap::new(mapping, GuestAddress(r.gpa))
                            .ok_or_else(|| map_err("the region end overflows".into()))?,
                    );
                }
                GuestMemoryMmap::from_regions(regions).map_err(|e| MemError::Mmap {
                    len: self.total_bytes(),
                    reason: e.to_string(),
                })
            }
        }
    }

    /// Sets `len` bytes at `addr` to `byte`.
    pub fn fill(&self, addr: GuestAddress, len: u64, byte: u8) -> Result<(), MemError> {
        self.check(addr, len)?;
        let chunk = [byte; 4096];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(chunk.len() as u64);
            self.write_slice(&chunk[..n as usize], GuestAddress(addr.0 + done))?;
            done += n;
        }
        Ok(())
    }

    /// Copies `len` bytes from `src` to `dst` inside guest memory (the ranges must not overlap).
    pub fn copy_within(
        &self,
        dst: GuestAddress,
        src: GuestAddress,
        len: u64,
    ) -> Result<(), MemError> {
        let (d, s) = (dst.0, src.0);
        if len != 0 && d < s.saturating_add(len) && s < d.saturating_add(len) {
            return Err(MemError::OutOfRange { gpa: d, len });
        }
        self.check(src, len)?;
        self.check(dst, len)?;
        let mut chunk = vec![0u8; len.min(1 << 16) as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(chunk.len() as u64) as usize;
            self.read_slice(&mut chunk[..n], GuestAddress(s + done))?;
            self.write_slice(&chunk[..n], GuestAddress(d + done))?;
            done += n as u64;
        }
        Ok(())
    }

    fn check(&self, addr: GuestAddress, len: u64) -> Result<(), MemError> {
        if self.contains(addr.0, len) {
            Ok(())
        } else {
            Err(MemError::OutOfRange { gpa: addr.0, len })
        }
    }

    /// Local RAM's vm-memory view once `count` bytes at `addr` are checked (None: paged RAM).
    fn local_view(
        &self,
        addr: GuestAddress,
        count: u64,
    ) -> Result<Option<&GuestMemoryMmap>, MemError> {
        match &self.access {
            Access::Local(m) => self.check(addr, count).map(|()| Some(m)),
            Access::Paged(_) => Ok(None),
        }
    }

    /// Starts bringing `[gpa, gpa+len)` in from remote memory in one batch without waiting
    /// (paged RAM; local RAM has nothing to fetch): a long copy out of guest RAM that follows
    /// (a snapshot's) then waits on the batch rather than on each page in turn.
    pub fn fetch_ahead(&self, gpa: u64, len: u64) -> Result<(), MemError> {
        match self.engine()? {
            None => Ok(()),
            Some(e) => e
                .fetch_ahead(gpa, len)
                .map_err(engine_err(GuestAddress(gpa), len as usize)),
        }
    }

    /// The engine of paged RAM (None for local RAM).
    fn engine(&self) -> Result<Option<Arc<Engine>>, MemError> {
        match &self.access {
            Access::Local(_) => Ok(None),
            Access::Paged(e) => e.upgrade().map(Some).ok_or(MemError::EngineStopped),
        }
    }

    /// Copies in chunks between guest memory and a volatile reader or writer (paged RAM: the
    /// engine copies each chunk).
    fn bounce(
        &self,
        addr: GuestAddress,
        count: usize,
        exact: bool,
        mut step: impl FnMut(&mut [u8], GuestAddress) -> Result<usize, MemError>,
    ) -> Result<usize, MemError> {
        self.check(addr, count as u64)?;
        let mut buf = [0u8; 4096];
        let mut done = 0usize;
        while done < count {
            let n = (count - done).min(buf.len());
            let got = step(&mut buf[..n], GuestAddress(addr.0 + done as u64))?;
            done += got;
            if got < n {
                break;
            }
        }
        if exact && done < count {
            return Err(MemError::Access {
                gpa: addr.0,
                reason: format!("only {done} of {count} bytes were transferred"),
            });
        }
        Ok(done)
    }
}

fn access_err(addr: GuestAddress) -> impl FnOnce(vm_memory::GuestMemoryError) -> MemError {
    move |e| MemError::Access {
        gpa: addr.0,
        reason: e.to_string(),
    }
}

fn volatile_err(addr: GuestAddress) -> impl FnOnce(VolatileMemoryError) -> MemError {
    move |e| MemError::Access {
        gpa: addr.0,
        reason: e.to_string(),
    }
}

fn engine_err(addr: GuestAddress, len: usize) -> impl FnOnce(EngineError) -> MemError {
    move |source| MemError::Engine {
        gpa: addr.0,
        len: len as u64,
        source,
    }
}

impl Bytes<GuestAddress> for GuestRam {
    type E = MemError;

    /// All or nothing: returns `buf.len()` or an error.
    fn write(&self, buf: &[u8], addr: GuestAddress) -> Result<usize, MemError> {
        self.write_slice(buf, addr).map(|()| buf.len())
    }

    /// All or nothing: returns `buf.len()` or an error.
    fn read(&self, buf: &mut [u8], addr: GuestAddress) -> Result<usize, MemError> {
        self.read_slice(buf, addr).map(|()| buf.len())
    }

    fn write_slice(&self, buf: &[u8], addr: GuestAddress) -> Result<(), MemError> {
        self.check(addr, buf.len() as u64)?;
        match (&self.access, self.engine()?) {
            (_, Some(engine)) => engine
                .write_bytes(addr.0, buf)
                .map_err(engine_err(addr, buf.len())),
            (Access::Local(m), None) => m.write_slice(buf, addr).map_err(access_err(addr)),
            (Access::Paged(_), None) => Err(MemError::EngineStopped),
        }
    }

    fn read_slice(&self, buf: &mut [u8], addr: GuestAddress) -> Result<(), MemError> {
        self.check(addr, buf.len() as u64)?;
        match (&self.access, self.engine()?) {
            (_, Some(engine)) => {
                let len = buf.len();
                engine
                    .read_bytes(addr.0, buf)
                    .map_err(engine_err(addr, len))
            }
            (Access::Local(m), None) => m.read_slice(buf, addr).map_err(access_err(addr)),
            (Access::Paged(_), None) => Err(MemError::EngineStopped),
        }
    }

    fn read_volatile_from<F: ReadVolatile>(
        &self,
        addr: GuestAddress,
        src: &mut F,
        count: usize,
    ) -> Result<usize, MemError> {
        if let Some(m) = self.local_view(addr, count as u64)? {
            return m
                .read_volatile_from(addr, src, count)
                .map_err(access_err(addr));
        }
        self.bounce(addr, count, false, |buf, at| {
            let n = src
                .read_volatile(&mut VolatileSlice::from(&mut *buf))
                .map_err(volatile_err(at))?;
            self.write_slice(&buf[..n], at)?;
            Ok(n)
        })
    }

    fn read_exact_volatile_from<F: ReadVolatile>(
        &self,
        addr: GuestAddress,
        src: &mut F,
        count: usize,
    ) -> Result<(), MemError> {
        if let Some(m) = self.local_view(addr, count as u64)? {
            return m
                .read_exact_volatile_from(addr, src, count)
                .map_err(access_err(addr));
        }
        self.bounce(addr, count, true, |buf, at| {
            src.read_exact_volatile(&mut VolatileSlice::from(&mut *buf))
                .map_err(volatile_err(at))?;
            self.write_slice(buf, at)?;
            Ok(buf.len())
        })
        .map(|_| ())
    }

    fn write_volatile_to<F: WriteVolatile>(
        &self,
        addr: GuestAddress,
        dst: &mut F,
        count: usize,
    ) -> Result<usize, MemError> {
        if let Some(m) = self.local_view(addr, count as u64)? {
            return m
                .write_volatile_to(addr, dst, count)
                .map_err(access_err(addr));
        }
        self.bounce(addr, count, false, |buf, at| {
            self.read_slice(buf, at)?;
            dst.write_volatile(&VolatileSlice::from(&mut *buf))
                .map_err(volatile_err(at))
        })
    }

    fn write_all_volatile_to<F: WriteVolatile>(
        &self,
        addr: GuestAddress,
        dst: &mut F,
        count: usize,
    ) -> Result<(), MemError> {
        if let Some(m) = self.local_view(addr, count as u64)? {
            return m
                .write_all_volatile_to(addr, dst, count)
                .map_err(access_err(addr));
        }
        self.bounce(addr, count, true, |buf, at| {
            self.read_slice(buf, at)?;
            dst.write_all_volatile(&VolatileSlice::from(&mut *buf))
                .map_err(volatile_err(at))?;
            Ok(buf.len())
        })
        .map(|_| ())
    }

    /// An atomic store on local RAM; on paged RAM the engine's pinned copy of the (aligned,
    /// single-page) value.
    fn store<T: AtomicAccess>(
        &self,
        val: T,
        addr: GuestAddress,
        order: Ordering,
    ) -> Result<(), MemError> {
        match self.local_view(addr, check_atomic::<T>(addr)?)? {
            Some(m) => m.store(val, addr, order).map_err(access_err(addr)),
            None => self.write_obj(val, addr),
        }
    }

    /// An atomic load on local RAM; on paged RAM the engine's pinned copy of the (aligned,
    /// single-page) value.
    fn load<T: AtomicAccess>(&self, addr: GuestAddress, order: Ordering) -> Result<T, MemError> {
        match self.local_view(addr, check_atomic::<T>(addr)?)? {
            Some(m) => m.load(addr, order).map_err(access_err(addr)),
            None => self.read_obj(addr),
        }
    }
}

/// The size of `T` if `addr` is aligned to it (an atomic access must be).
fn check_atomic<T>(addr: GuestAddress) -> Result<u64, MemError> {
    let size = std::mem::size_of::<T>() as u64;
    if addr.0.is_multiple_of(size) {
        Ok(size)
    } else {
        Err(MemError::Access {
            gpa: addr.0,
            reason: format!("an atomic access of {size} bytes must be aligned"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farvm_ept::memstore::{MemStore, MemStoreConfig};
    use farvm_ept::{Budget, EngineConfig, EngineParts};

    fn ga(a: u64) -> GuestAddress {
        GuestAddress(a)
    }

    #[test]
    fn read_write_fill_copy_roundtrip() {
        let ram = GuestRam::local(&[(0, 1 << 20), (4 << 20, 1 << 20)]).unwrap();
        assert_eq!(ram.total_bytes(), 2 << 20);
        assert_eq!(ram.backing(), Backing::Anonymous);
        ram.write_slice(b"hello", ga(0x1000)).unwrap();
        let mut b = [0u8; 5];
        ram.read_slice(&mut b, ga(0x1000)).unwrap();
        assert_eq!(&b, b"hello");
        ram.fill(ga((4 << 20) + 8), 16, 0xab).unwrap();
        ram.copy_within(ga(0x2000), ga((4 << 20) + 8), 16).unwrap();
        assert_eq!(
            ram.read_obj::<u64>(ga(0x2008)).unwrap(),
            0xabab_abab_abab_abab
        );
        ram.write_obj(0x1122_3344_5566_7788u64, ga(0x3000)).unwrap();
        assert_eq!(
            ram.load::<u64>(ga(0x3000), Ordering::Acquire).unwrap(),
            0x1122_3344_5566_7788
        );
        assert_eq!(ram.regions()[1].gpa(), 4 << 20);
        let host = ram.regions()[1].host_addr();
        assert_ne!(host, 0);
        assert!(ram.direct().is_ok());
    }

    #[test]
    fn out_of_range_and_spanning_are_refused() {
        let ram = GuestRam::local(&[(0, 1 << 20), (4 << 20, 1 << 20)]).unwrap();
        assert!(ram.write_slice(b"abcd", ga((1 << 20) - 2)).is_err());
        assert!(ram.read_obj::<u64>(ga(2 << 20)).is_err());
        assert!(ram.fill(ga(u64::MAX - 3), 8, 0).is_err());
        assert!(
            ram.copy_within(ga(0x1000), ga(0x1008), 64).is_err(),
            "overlap refused"
        );
        assert!(
            ram.load::<u64>(ga(0x1004), Ordering::Relaxed).is_err(),
            "misaligned"
        );
        assert!(GuestRam::local(&[(0, 100)]).is_err());
        assert!(GuestRam::local(&[]).is_err());
    }

    /// Paged RAM: every access is a copy made by the engine (which counts it), never-written
    /// pages read as zeros, and once the engine is gone an access fails instead of touching the
    /// unmapped guest view.
    #[test]
    fn paged_ram_goes_through_the_engine() {
        let store = MemStore::new(MemStoreConfig::default());
        let mut cfg = EngineConfig::new(8 << 20);
        cfg.budget = Budget::Bytes(2 << 20);
        cfg.probe_every = 0;
        let prefetcher =
            farvm_prefetch::registry::build("none", &farvm_prefetch::registry::Config::default())
                .unwrap();
        let engine = Arc::new(Engine::start(cfg, EngineParts::new(store, prefetcher)).unwrap());
        let ram = GuestRam::paged(&engine).unwrap();
        assert_eq!(ram.backing(), Backing::External);
        assert_eq!(ram.regions()[0].host_addr(), engine.guest_ram().0);
        assert!(matches!(ram.direct(), Err(MemError::NotDirect)));
        let before = engine.counters().vmm_accesses;
        assert_eq!(ram.read_obj::<u64>(ga(0x5000)).unwrap(), 0, "never written");
        ram.write_obj(0xfeedu64, ga(0x7ff8)).unwrap();
        ram.fill(ga(0x10000), 0x3000, 0x5a).unwrap();
        ram.copy_within(ga(0x20000), ga(0x10ff0), 32).unwrap();
        assert_eq!(
            ram.load::<u64>(ga(0x7ff8), Ordering::Acquire).unwrap(),
            0xfeed
        );
        assert_eq!(ram.read_obj::<u8>(ga(0x2001f)).unwrap(), 0x5a);
        let mut src: &[u8] = b"0123456789";
        assert_eq!(
            ram.read_volatile_from(ga(0x30000), &mut src, 10).unwrap(),
            10
        );
        let mut out = Vec::new();
        ram.write_all_volatile_to(ga(0x30000), &mut out, 10)
            .unwrap();
        assert_eq!(out, b"0123456789");
        assert!(engine.counters().vmm_accesses > before + 5);
        assert!(ram.write_slice(b"x", ga(8 << 20)).is_err(), "past the end");
        // The device view is the guest view: a device write faults the page in through the
        // engine like a guest write, and the engine's copies see it (and the other way round).
        // SAFETY: the view is dropped before the engine shuts down.
        let view = unsafe { ram.device_view() }.unwrap();
        let faults = engine.counters().zero_fills;
        view.write_obj(0xabcd_ef01u64, ga(0x50008)).unwrap();
        assert_eq!(ram.read_obj::<u64>(ga(0x50008)).unwrap(), 0xabcd_ef01);
        assert_eq!(view.read_obj::<u64>(ga(0x7ff8)).unwrap(), 0xfeed);
        assert!(
            engine.counters().zero_fills > faults,
            "the device write was a fault"
        );
        assert!(view.write_obj(0u8, ga(8 << 20)).is_err(), "past the end");
        drop(view);
        let engine = Arc::into_inner(engine).expect("GuestRam holds the engine weakly");
        engine.shutdown();
        assert!(matches!(
            ram.read_obj::<u64>(ga(0)),
            Err(MemError::EngineStopped)
        ));
    }
}
