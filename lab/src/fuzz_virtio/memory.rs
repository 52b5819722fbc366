//! The fuzzed guest's RAM: two ranges with a hole between them, each mapped between
//! inaccessible (PROT_NONE) guard pages, so a device access that strays past guest RAM through
//! anything but vm-memory's checked accessors faults the fuzzer (SIGSEGV, a non-zero exit)
//! instead of silently reading or writing host memory.

use std::sync::Arc;

use anyhow::{bail, Context, Result};
use farvm_devices::virtio::mmio::VirtioMmio;
use vm_memory::mmap::MmapRegion;
use vm_memory::{GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// Guest RAM: [0, 2 MiB) and [3 MiB, 4 MiB); [2 MiB, 3 MiB) is a hole.
pub const RANGES: [(u64, usize); 2] = [(0, 2 << 20), (3 << 20, 1 << 20)];
/// The first address past the first range (the hole starts here).
pub const HOLE: u64 = 2 << 20;
/// The first address past guest RAM.
pub const RAM_END: u64 = 4 << 20;
const PAGE: usize = 4096;

/// Guest memory as the devices see it.
pub type Mem = Arc<GuestMemoryMmap>;
/// A device on the virtio-mmio transport over [`Mem`].
pub type Dev<D> = VirtioMmio<D, Mem>;

/// Maps guest RAM between guard pages. The mappings live as long as the process (the fuzzer
/// makes one per run).
pub fn guarded() -> Result<Mem> {
    let mut regions = Vec::with_capacity(RANGES.len());
    for &(base, len) in &RANGES {
        // SAFETY: a fresh anonymous reservation of `len` plus two guard pages, owned by nothing
        // else; the result is checked before use.
        let reservation = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len + 2 * PAGE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reservation == libc::MAP_FAILED {
            bail!("mmap guest RAM: {}", std::io::Error::last_os_error());
        }
        // SAFETY: `reservation` spans `len + 2 * PAGE` bytes, so one page in stays inside it.
        let ram = unsafe { reservation.cast::<u8>().add(PAGE) };
        // SAFETY: makes the middle `len` bytes of the reservation above accessible; the pages
        // before and after stay PROT_NONE.
        let rc = unsafe { libc::mprotect(ram.cast(), len, libc::PROT_READ | libc::PROT_WRITE) };
        if rc != 0 {
            bail!("mprotect guest RAM: {}", std::io::Error::last_os_error());
        }
        // SAFETY: `ram` is a live read-write mapping of `len` bytes that is never unmapped.
        let region = unsafe {
            MmapRegion::build_raw(
                ram,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            )
        }
        .context("guest RAM region")?;
        regions.push(GuestRegionMmap::new(region, GuestAddress(base)).context("guest region")?);
    }
    Ok(Arc::new(
        GuestMemoryMmap::from_regions(regions).context("guest memory")?,
    ))
}
