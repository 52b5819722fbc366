//! Guest RAM: the VMM-owned host mappings and the single access layer through which every VMM
//! read or write of guest memory goes.
//!
//! Why one layer: when the remote-memory engine (`farvm-ept`) registers guest RAM with
//! userfaultfd, a plain host load of a non-resident page would fault into the VMM's own uffd and
//! (from the thread that must resolve it) deadlock. So the VMM never dereferences guest memory
//! except here, and every access first calls the registered [`AccessHook`], which makes the
//! range resident. The engine gets the host mapping of each region from [`GuestRam::regions`] to
//! register it before the guest runs.
//!
//! Backing: anonymous private `MAP_NORESERVE` memory by default (UFFDIO_COPY is cheapest on it:
//! 2.5 µs/page against 3.0 for memfd, host-kvm-uffd.md §2; MADV_DONTNEED evicts), or a memfd
//! mapped shared (needed later for MINOR + UFFDIO_CONTINUE and PUNCH_HOLE eviction).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::sync::{Arc, OnceLock};

use farvm_guest_agent::boot::{BootInfo, MemRange, ProcessSpec};
use farvm_guest_agent::pv::{BulkOp, LogRecord, Mailbox};
use farvm_guest_agent::slot::AgentSlot;

/// Errors of guest-memory setup and access.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    #[error("guest memory range {gpa:#x}+{len:#x} is outside guest RAM (or spans two regions)")]
    OutOfRange { gpa: u64, len: u64 },
    #[error("cannot map {len} bytes of guest RAM: {source}")]
    Mmap { len: u64, source: io::Error },
    #[error("cannot create the guest RAM memfd: {0}")]
    Memfd(io::Error),
    #[error("guest memory layout is invalid: {0}")]
    Layout(String),
    #[error("the memory engine could not make {gpa:#x}+{len:#x} resident: {reason}")]
    Hook { gpa: u64, len: u64, reason: String },
    #[error("an access hook is already installed")]
    HookAlreadySet,
}

/// How guest RAM is backed on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Backing {
    /// `MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE`.
    #[default]
    Anonymous,
    /// A memfd mapped `MAP_SHARED` (the fd is kept for an alias mapping / hole punching).
    Memfd,
    /// Owned by the remote-memory engine ([`GuestRam::external`]); not selectable by name.
    External,
}

impl std::str::FromStr for Backing {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "anon" | "anonymous" => Ok(Backing::Anonymous),
            "memfd" => Ok(Backing::Memfd),
            other => Err(format!(
                "unknown memory backing `{other}` (expected anon or memfd)"
            )),
        }
    }
}

/// Guest RAM owned by another component (the remote-memory engine, `farvm-ept`): one region
/// at guest-physical 0. The VMM gives [`ExternalRam::guest_view`] to KVM as the memslot and
/// never dereferences it; every VMM access is one of these copies, which the owner makes
/// through its own private mapping after pinning the page (so the VMM never loads or stores
/// through the uffd-registered guest view, where an absent page would fault).
pub trait ExternalRam: Send + Sync + std::fmt::Debug {
    /// Host address and length of the mapping KVM uses (guest-physical `0..len`).
    fn guest_view(&self) -> (u64, u64);
    /// Copies guest memory at `gpa` into `buf`.
    fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), String>;
    /// Copies `data` into guest memory at `gpa`.
    fn write(&self, gpa: u64, data: &[u8]) -> Result<(), String>;
}

/// Called before every VMM access to guest memory. The remote-memory engine implements it to
/// fetch non-resident pages (and to note that the VMM, not the guest, touched them).
pub trait AccessHook: Send + Sync {
    /// Make `gpa..gpa+len` resident. `write` tells whether the VMM is about to write.
    fn make_resident(&self, gpa: u64, len: u64, write: bool) -> Result<(), String>;
}

/// Plain-old-data types that may be copied to and from guest memory byte for byte.
///
/// # Safety
/// Implementors must be `repr(C)` (or primitive) with no padding-dependent invariants, and every
/// bit pattern must be a valid value.
pub unsafe trait Pod: Copy + 'static {}

// SAFETY: primitive integers: every bit pattern is valid.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for u16 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}
// SAFETY: the guest-agent records are `repr(C)` structs of integers and integer arrays (their
// layouts are pinned by const assertions in farvm-guest-agent); any bit pattern is valid.
unsafe impl Pod for BootInfo {}
// SAFETY: as above.
unsafe impl Pod for ProcessSpec {}
// SAFETY: as above.
unsafe impl Pod for MemRange {}
// SAFETY: as above.
unsafe impl Pod for Mailbox {}
// SAFETY: as above.
unsafe impl Pod for BulkOp {}
// SAFETY: as above.
unsafe impl Pod for LogRecord {}
// SAFETY: as above.
unsafe impl Pod for AgentSlot {}

/// An all-zero value of a plain-old-data type (e.g. a guest-agent record to fill field by field,
/// which keeps working when the ABI appends fields).
pub fn zeroed<T: Pod>() -> T {
    // SAFETY: `T: Pod` accepts every bit pattern, including all zeros.
    unsafe { std::mem::zeroed() }
}

/// One contiguous guest-physical RAM region and its host mapping.
#[derive(Debug)]
pub struct RamRegion {
    gpa: u64,
    len: u64,
    host: *mut u8,
    memfd: Option<File>,
    /// Whether `GuestRam` created (and must unmap) the mapping.
    owned: bool,
}

// SAFETY: the region is a raw mapping owned by `GuestRam`; concurrent access to guest memory is
// inherent (the guest writes it too) and all VMM accesses go through copies, never references.
unsafe impl Send for RamRegion {}
// SAFETY: as above.
unsafe impl Sync for RamRegion {}

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
    /// Host virtual address of the region's first byte (for KVM memslots and userfaultfd).
    pub fn host_addr(&self) -> u64 {
        self.host as u64
    }
    /// The memfd backing this region, if [`Backing::Memfd`]; its offset 0 is `gpa()`.
    pub fn memfd(&self) -> Option<RawFd> {
        self.memfd.as_ref().map(|f| f.as_raw_fd())
    }
}

/// All guest RAM of a VM.
pub struct GuestRam {
    regions: Vec<RamRegion>,
    backing: Backing,
    hook: OnceLock<Arc<dyn AccessHook>>,
    /// Keeps an external owner of the mapping (e.g. the paging engine) alive.
    _owner: Option<Arc<dyn std::any::Any + Send + Sync>>,
    /// Set for [`Backing::External`]: the owner of the mapping, which does every access.
    external: Option<Arc<dyn ExternalRam>>,
}

impl std::fmt::Debug for GuestRam {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GuestRam")
            .field("regions", &self.regions)
            .field("backing", &self.backing)
            .field("hook", &self.hook.get().is_some())
            .finish()
    }
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        for r in self.regions.iter().filter(|r| r.owned) {
            // SAFETY: `host`/`len` are exactly a mapping created in `GuestRam::new` and never
            // unmapped elsewhere; nothing references guest memory once `GuestRam` is dropped
            // (vCPU threads hold an `Arc<GuestRam>`).
            unsafe { libc::munmap(r.host.cast(), r.len as usize) };
        }
    }
}

impl GuestRam {
    /// Maps guest RAM for the given `(gpa, len)` ranges (sorted, non-overlapping, 4 KiB aligned).
    pub fn new(ranges: &[(u64, u64)], backing: Backing) -> Result<Self, MemError> {
        let mut regions = Vec::with_capacity(ranges.len());
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
            regions.push(map_region(gpa, len, backing)?);
        }
        if regions.is_empty() {
            return Err(MemError::Layout("guest RAM has no regions".into()));
        }
        Ok(GuestRam {
            regions,
            backing,
            hook: OnceLock::new(),
            _owner: None,
            external: None,
        })
    }

    /// Guest RAM owned by `owner` (one region at guest-physical 0, see [`ExternalRam`]).
    pub fn external(owner: Arc<dyn ExternalRam>) -> Result<Self, MemError> {
        let (host, len) = owner.guest_view();
        if len == 0 || len % 4096 != 0 || host % 4096 != 0 {
            return Err(MemError::Layout(format!(
                "external guest RAM {host:#x}+{len:#x} must be non-empty and 4 KiB aligned"
            )));
        }
        if len > crate::layout::LOW_RAM_MAX {
            return Err(MemError::Layout(format!(
                "remote guest memory is limited to {} GiB (one region below the MMIO hole)",
                crate::layout::LOW_RAM_MAX >> 30
            )));
        }
        Ok(GuestRam {
            regions: vec![RamRegion {
                gpa: 0,
                len,
                host: host as *mut u8,
                memfd: None,
                owned: false,
            }],
            backing: Backing::External,
            hook: OnceLock::new(),
            _owner: None,
            external: Some(owner),
        })
    }

    /// The owner of external RAM, if any (after checking the range).
    fn ext(&self, gpa: u64, len: u64) -> Result<Option<&Arc<dyn ExternalRam>>, MemError> {
        match &self.external {
            None => Ok(None),
            Some(x) => {
                if self.find(gpa, len).is_none() {
                    return Err(MemError::OutOfRange { gpa, len });
                }
                Ok(Some(x))
            }
        }
    }

    fn ext_err(gpa: u64, len: u64, reason: String) -> MemError {
        MemError::Hook { gpa, len, reason }
    }

    /// Guest RAM on a host mapping owned by someone else (the remote-memory engine allocates
    /// and registers its own): the `ranges` (sorted, 4 KiB aligned) are laid out back to back
    /// from `host_base`, so a contiguous `total`-byte mapping serves the split layout of
    /// [`crate::layout::ram_ranges`]. `owner` is kept alive as long as this `GuestRam`.
    ///
    /// # Safety
    /// `host_base` must point to a readable and writable mapping of at least the sum of the
    /// range lengths, page aligned, that stays mapped while `owner` is alive.
    pub unsafe fn from_external(
        ranges: &[(u64, u64)],
        host_base: *mut u8,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<Self, MemError> {
        if host_base.is_null() || !(host_base as usize).is_multiple_of(4096) {
            return Err(MemError::Layout(
                "external mapping must be page aligned".into(),
            ));
        }
        let mut regions = Vec::with_capacity(ranges.len());
        let mut prev_end = 0u64;
        let mut offset = 0usize;
        for &(gpa, len) in ranges {
            if len == 0 || gpa % 4096 != 0 || len % 4096 != 0 || gpa < prev_end {
                return Err(MemError::Layout(format!(
                    "region {gpa:#x}+{len:#x} must be non-empty, 4 KiB aligned and sorted"
                )));
            }
            prev_end = gpa + len;
            regions.push(RamRegion {
                gpa,
                len,
                // SAFETY: the caller guarantees the mapping covers the sum of the lengths.
                host: unsafe { host_base.add(offset) },
                memfd: None,
                owned: false,
            });
            offset += len as usize;
        }
        if regions.is_empty() {
            return Err(MemError::Layout("guest RAM has no regions".into()));
        }
        Ok(GuestRam {
            regions,
            backing: Backing::Anonymous,
            hook: OnceLock::new(),
            _owner: Some(owner),
            external: None,
        })
    }

    /// The RAM regions, sorted by guest-physical address.
    pub fn regions(&self) -> &[RamRegion] {
        &self.regions
    }

    /// How RAM is backed.
    pub fn backing(&self) -> Backing {
        self.backing
    }

    /// Total RAM bytes.
    pub fn total_bytes(&self) -> u64 {
        self.regions.iter().map(|r| r.len).sum()
    }

    /// One past the highest RAM address.
    pub fn end_gpa(&self) -> u64 {
        self.regions.last().map_or(0, |r| r.gpa + r.len)
    }

    /// Installs the hook called before every VMM access (once, before the guest runs).
    pub fn set_access_hook(&self, hook: Arc<dyn AccessHook>) -> Result<(), MemError> {
        self.hook.set(hook).map_err(|_| MemError::HookAlreadySet)
    }

    /// Whether an access hook is installed (some paths, e.g. the Linux loader, write RAM
    /// through vm-memory and must run before one is).
    pub fn has_access_hook(&self) -> bool {
        self.hook.get().is_some()
    }

    /// Whether `gpa..gpa+len` lies inside one RAM region.
    pub fn contains(&self, gpa: u64, len: u64) -> bool {
        self.find(gpa, len).is_some()
    }

    fn find(&self, gpa: u64, len: u64) -> Option<&RamRegion> {
        let end = gpa.checked_add(len)?;
        self.regions
            .iter()
            .find(|r| gpa >= r.gpa && end <= r.gpa + r.len)
    }

    /// Validates the range, runs the hook, and returns the host pointer of `gpa`.
    fn prepare(&self, gpa: u64, len: u64, write: bool) -> Result<*mut u8, MemError> {
        let r = self
            .find(gpa, len)
            .ok_or(MemError::OutOfRange { gpa, len })?;
        if let Some(hook) = self.hook.get() {
            hook.make_resident(gpa, len, write)
                .map_err(|reason| MemError::Hook { gpa, len, reason })?;
        }
        // SAFETY: `gpa - r.gpa < r.len`, so the offset stays inside the mapping.
        Ok(unsafe { r.host.add((gpa - r.gpa) as usize) })
    }

    /// Copies guest memory at `gpa` into `buf`.
    pub fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        if let Some(x) = self.ext(gpa, buf.len() as u64)? {
            let len = buf.len() as u64;
            return x.read(gpa, buf).map_err(|r| Self::ext_err(gpa, len, r));
        }
        let p = self.prepare(gpa, buf.len() as u64, false)?;
        // SAFETY: `prepare` checked that `buf.len()` bytes at `p` are inside the mapping; guest
        // memory never aliases a Rust object, so the regions do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), buf.len()) };
        Ok(())
    }

    /// Copies `buf` into guest memory at `gpa`.
    pub fn write(&self, gpa: u64, buf: &[u8]) -> Result<(), MemError> {
        if let Some(x) = self.ext(gpa, buf.len() as u64)? {
            let len = buf.len() as u64;
            return x.write(gpa, buf).map_err(|r| Self::ext_err(gpa, len, r));
        }
        let p = self.prepare(gpa, buf.len() as u64, true)?;
        // SAFETY: as in `read`, with the direction reversed.
        unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), p, buf.len()) };
        Ok(())
    }

    /// Sets `len` bytes at `gpa` to `byte`.
    pub fn fill(&self, gpa: u64, len: u64, byte: u8) -> Result<(), MemError> {
        if let Some(x) = self.ext(gpa, len)? {
            let chunk = [byte; 4096];
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(4096);
                x.write(gpa + done, &chunk[..n as usize])
                    .map_err(|r| Self::ext_err(gpa, len, r))?;
                done += n;
            }
            return Ok(());
        }
        let p = self.prepare(gpa, len, true)?;
        // SAFETY: `prepare` checked the range lies inside the mapping.
        unsafe { std::ptr::write_bytes(p, byte, len as usize) };
        Ok(())
    }

    /// Copies `len` bytes from `src` to `dst` inside guest memory (ranges must not overlap).
    pub fn copy_within(&self, dst: u64, src: u64, len: u64) -> Result<(), MemError> {
        let overlap = dst < src.saturating_add(len) && src < dst.saturating_add(len);
        if overlap && len != 0 {
            return Err(MemError::OutOfRange { gpa: dst, len });
        }
        if let Some(x) = self.ext(src, len)? {
            self.ext(dst, len)?;
            let mut chunk = vec![0u8; len.min(1 << 16) as usize];
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(chunk.len() as u64) as usize;
                x.read(src + done, &mut chunk[..n])
                    .map_err(|r| Self::ext_err(src, len, r))?;
                x.write(dst + done, &chunk[..n])
                    .map_err(|r| Self::ext_err(dst, len, r))?;
                done += n as u64;
            }
            return Ok(());
        }
        let s = self.prepare(src, len, false)?;
        let d = self.prepare(dst, len, true)?;
        // SAFETY: both ranges were checked to be inside the mapping and not to overlap.
        unsafe { std::ptr::copy_nonoverlapping(s, d, len as usize) };
        Ok(())
    }

    /// Reads a plain-old-data value at `gpa`.
    pub fn read_obj<T: Pod>(&self, gpa: u64) -> Result<T, MemError> {
        if self.external.is_some() {
            let mut v: T = zeroed();
            // SAFETY: `T: Pod` is plain data that accepts any bit pattern; the slice covers
            // exactly `v` and lives no longer than it.
            let bytes = unsafe {
                std::slice::from_raw_parts_mut(
                    (&mut v as *mut T).cast::<u8>(),
                    std::mem::size_of::<T>(),
                )
            };
            self.read(gpa, bytes)?;
            return Ok(v);
        }
        let p = self.prepare(gpa, std::mem::size_of::<T>() as u64, false)?;
        // SAFETY: the range is inside the mapping; `T: Pod` accepts any bit pattern and
        // `read_unaligned` copes with any alignment.
        Ok(unsafe { std::ptr::read_unaligned(p.cast::<T>()) })
    }

    /// Writes a plain-old-data value at `gpa`.
    pub fn write_obj<T: Pod>(&self, gpa: u64, val: &T) -> Result<(), MemError> {
        if self.external.is_some() {
            // SAFETY: `T: Pod` has no padding-dependent invariants; the slice covers exactly
            // `*val` and lives no longer than the borrow.
            let bytes = unsafe {
                std::slice::from_raw_parts((val as *const T).cast::<u8>(), std::mem::size_of::<T>())
            };
            return self.write(gpa, bytes);
        }
        let p = self.prepare(gpa, std::mem::size_of::<T>() as u64, true)?;
        // SAFETY: the range is inside the mapping; `write_unaligned` copes with any alignment.
        unsafe { std::ptr::write_unaligned(p.cast::<T>(), *val) };
        Ok(())
    }

    /// Reads an aligned u64 with a single volatile load (for fields the guest updates
    /// concurrently, e.g. the agent-slot seqlock).
    pub fn read_u64_volatile(&self, gpa: u64) -> Result<u64, MemError> {
        if !gpa.is_multiple_of(8) {
            return Err(MemError::OutOfRange { gpa, len: 8 });
        }
        if self.external.is_some() {
            // The owner copies the 8 aligned bytes from its alias mapping in one piece.
            let mut b = [0u8; 8];
            self.read(gpa, &mut b)?;
            return Ok(u64::from_ne_bytes(b));
        }
        let p = self.prepare(gpa, 8, false)?;
        // SAFETY: in range and 8-byte aligned (host mappings are page aligned and gpa % 8 == 0).
        Ok(unsafe { std::ptr::read_volatile(p.cast::<u64>()) })
    }

    /// A vm-memory view of guest RAM for rust-vmm loaders (linux-loader). It bypasses the
    /// access hook, so it is refused once a hook is installed.
    pub fn vm_memory_view(&self) -> Result<vm_memory::GuestMemoryMmap, MemError> {
        use vm_memory::mmap::MmapRegionBuilder;
        use vm_memory::{GuestAddress, GuestRegionMmap};
        if self.has_access_hook() || self.external.is_some() {
            return Err(MemError::Layout(
                "the vm-memory view bypasses the access hook; use it before installing one".into(),
            ));
        }
        let mut regions = Vec::with_capacity(self.regions.len());
        for r in self.regions.iter().filter(|r| r.owned) {
            // SAFETY: `host`/`len` describe a live mapping owned by `self`, page aligned; the
            // view is built with `owned = false` so it never unmaps it, and the caller keeps
            // `self` alive while using the view.
            let mmap =
                unsafe { MmapRegionBuilder::new(r.len as usize).with_raw_mmap_pointer(r.host) }
                    .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
                    .build()
                    .map_err(|e| MemError::Layout(format!("vm-memory view: {e}")))?;
            let region = GuestRegionMmap::new(mmap, GuestAddress(r.gpa))
                .ok_or_else(|| MemError::Layout("vm-memory region overflows".into()))?;
            regions.push(region);
        }
        vm_memory::GuestMemoryMmap::from_regions(regions)
            .map_err(|e| MemError::Layout(format!("vm-memory view: {e}")))
    }
}

fn map_region(gpa: u64, len: u64, backing: Backing) -> Result<RamRegion, MemError> {
    let (fd, flags, memfd) = match backing {
        Backing::Anonymous => (
            -1,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            None,
        ),
        Backing::External => {
            return Err(MemError::Layout(
                "external guest RAM is created with GuestRam::external".into(),
            ))
        }
        Backing::Memfd => {
            let name = c"farvm-guest-ram";
            // SAFETY: `name` is a valid NUL-terminated string; the return value is checked.
            let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
            if fd < 0 {
                return Err(MemError::Memfd(io::Error::last_os_error()));
            }
            // SAFETY: `fd` was just returned by memfd_create and is owned by nobody else.
            let file = unsafe { File::from_raw_fd(fd) };
            file.set_len(len).map_err(MemError::Memfd)?;
            (fd, libc::MAP_SHARED | libc::MAP_NORESERVE, Some(file))
        }
    };
    // SAFETY: a fresh mapping (no MAP_FIXED) cannot alias existing Rust objects; the result is
    // checked against MAP_FAILED.
    let host = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            0,
        )
    };
    if host == libc::MAP_FAILED {
        return Err(MemError::Mmap {
            len,
            source: io::Error::last_os_error(),
        });
    }
    Ok(RamRegion {
        gpa,
        len,
        host: host.cast(),
        memfd,
        owned: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn read_write_fill_copy_roundtrip() {
        for backing in [Backing::Anonymous, Backing::Memfd] {
            let ram = GuestRam::new(&[(0, 1 << 20), (4 << 20, 1 << 20)], backing).unwrap();
            assert_eq!(ram.total_bytes(), 2 << 20);
            ram.write(0x1000, b"hello").unwrap();
            let mut b = [0u8; 5];
            ram.read(0x1000, &mut b).unwrap();
            assert_eq!(&b, b"hello");
            ram.fill((4 << 20) + 8, 16, 0xab).unwrap();
            ram.copy_within(0x2000, (4 << 20) + 8, 16).unwrap();
            assert_eq!(ram.read_obj::<u64>(0x2008).unwrap(), 0xabab_abab_abab_abab);
            ram.write_obj(0x3000, &0x1122_3344_5566_7788u64).unwrap();
            assert_eq!(
                ram.read_u64_volatile(0x3000).unwrap(),
                0x1122_3344_5566_7788
            );
        }
    }

    #[test]
    fn out_of_range_and_spanning_are_refused() {
        let ram = GuestRam::new(&[(0, 1 << 20), (4 << 20, 1 << 20)], Backing::Anonymous).unwrap();
        assert!(ram.write((1 << 20) - 2, b"abcd").is_err());
        assert!(ram.read_obj::<u64>(2 << 20).is_err());
        assert!(ram.fill(u64::MAX - 3, 8, 0).is_err());
        assert!(
            ram.copy_within(0x1000, 0x1008, 64).is_err(),
            "overlap refused"
        );
        assert!(GuestRam::new(&[(0, 100)], Backing::Anonymous).is_err());
    }

    #[test]
    fn external_mapping_is_laid_out_back_to_back_and_not_unmapped() {
        let len = 3usize << 20;
        // SAFETY: a fresh anonymous mapping, checked below, unmapped at the end of the test.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(base, libc::MAP_FAILED);
        let owner: Arc<dyn std::any::Any + Send + Sync> = Arc::new(7u32);
        // SAFETY: `base` maps 3 MiB, the sum of the range lengths.
        let ram = unsafe {
            GuestRam::from_external(&[(0, 1 << 20), (4 << 20, 2 << 20)], base.cast(), owner)
        }
        .unwrap();
        assert_eq!(ram.regions()[1].host_addr(), base as u64 + (1 << 20));
        ram.write_obj(4 << 20, &0xfeedu64).unwrap();
        drop(ram);
        // SAFETY: still mapped (GuestRam did not unmap it); offset 1 MiB is inside.
        let v = unsafe { *(base.cast::<u8>().add(1 << 20).cast::<u64>()) };
        assert_eq!(v, 0xfeed);
        // SAFETY: unmapping our own mapping once.
        unsafe { libc::munmap(base, len) };
    }

    struct Counting(AtomicU64);
    impl AccessHook for Counting {
        fn make_resident(&self, _gpa: u64, len: u64, _w: bool) -> Result<(), String> {
            self.0.fetch_add(len, Ordering::Relaxed);
            if len == 3 {
                return Err("refused".into());
            }
            Ok(())
        }
    }

    #[test]
    fn hook_sees_every_access() {
        let ram = GuestRam::new(&[(0, 1 << 20)], Backing::Anonymous).unwrap();
        let hook = Arc::new(Counting(AtomicU64::new(0)));
        ram.set_access_hook(hook.clone()).unwrap();
        assert!(ram.set_access_hook(hook.clone()).is_err());
        ram.write(0, &[1; 10]).unwrap();
        ram.read_obj::<u64>(8).unwrap();
        ram.copy_within(100, 200, 4).unwrap();
        assert_eq!(hook.0.load(Ordering::Relaxed), 10 + 8 + 8);
        assert!(matches!(ram.write(0, &[0; 3]), Err(MemError::Hook { .. })));
        assert!(ram.vm_memory_view().is_err());
    }
}
