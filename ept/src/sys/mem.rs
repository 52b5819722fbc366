//! Guest RAM backing: one memfd mapped twice — the *guest view* (handed to KVM, registered with
//! userfaultfd) and the engine's private *alias* (never registered, so the engine's own loads and
//! stores never fault into its own uffd) — and the batched zap / free operations on them.
//!
//! Why memfd: a page's data can be written into the page cache through the alias and then mapped
//! into the guest view with UFFDIO_CONTINUE (6–7x cheaper than UFFDIO_COPY here, and the network
//! reply can land in place); unmapping the guest view alone (MADV_DONTNEED) keeps the data, which
//! makes eviction race-free (see `evict.rs`); MADV_REMOVE frees it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::PAGE_SIZE;

/// The two mappings of guest RAM.
#[derive(Debug)]
pub struct GuestRam {
    /// Held for as long as the mappings (they alone would keep the file alive).
    _memfd: OwnedFd,
    guest: *mut u8,
    alias: *mut u8,
    len: usize,
    advisor: Advisor,
}

/// madvise() over many runs of pages of one mapping: one vectored `process_madvise` on this
/// process where the kernel allows it (one TLB flush for all the runs), else one call per run.
#[derive(Debug)]
pub(crate) struct Advisor {
    pidfd: Option<OwnedFd>,
    /// process_madvise() on self works (Linux >= 6.13); otherwise fall back to one call per run.
    vectored: AtomicBool,
}

// SAFETY: the raw pointers denote process-wide mappings owned by this struct; all access to the
// bytes behind them is coordinated by the page-state table, not by this type.
unsafe impl Send for GuestRam {}
// SAFETY: as above; methods take `&self` and only issue syscalls or hand out addresses.
unsafe impl Sync for GuestRam {}

/// What a source of page runs calls for each run `(first page, pages)`.
type RunVisitor<'a> = &'a mut dyn FnMut(u64, u64) -> io::Result<()>;

/// Upper bound of iovecs per process_madvise call (UIO_MAXIOV).
const MAX_IOV: usize = 1024;

impl GuestRam {
    /// Maps `len` bytes of guest RAM (a page multiple): a memfd, its guest view and its engine alias.
    pub fn new(len: usize) -> io::Result<Self> {
        if len == 0 || !len.is_multiple_of(PAGE_SIZE) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "guest RAM size must be a non-zero multiple of 4 KiB",
            ));
        }
        let name = c"farvm-guest-ram";
        // SAFETY: valid NUL-terminated name; flags are constants.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh fd owned by nobody else.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: ftruncate on our memfd.
        if unsafe { libc::ftruncate(memfd.as_raw_fd(), len as libc::off_t) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let map = |what: &str| -> io::Result<*mut u8> {
            // SAFETY: a fresh shared mapping of our memfd; the kernel picks the address.
            let p = unsafe {
                libc::mmap(
                    core::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_NORESERVE,
                    memfd.as_raw_fd(),
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                let e = io::Error::last_os_error();
                return Err(io::Error::new(e.kind(), format!("mmap {what}: {e}")));
            }
            // SAFETY: advisory call on the mapping we just created; keep 4 KiB pages so every
            // fault, install and zap is one guest page (failure is harmless).
            unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
            Ok(p.cast())
        };
        let guest = map("guest view")?;
        let alias = match map("alias") {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: unmapping the mapping created above, which nobody else knows.
                unsafe { libc::munmap(guest.cast(), len) };
                return Err(e);
            }
        };
        Ok(Self {
            _memfd: memfd,
            guest,
            alias,
            len,
            advisor: Advisor::new(),
        })
    }

    /// Bytes of guest RAM.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: `new` refuses 0).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Guest RAM in pages.
    pub fn pages(&self) -> u64 {
        (self.len / PAGE_SIZE) as u64
    }

    /// Host address of the guest view (for KVM memslots and uffd ranges).
    pub fn guest_base(&self) -> u64 {
        self.guest as u64
    }

    /// Engine-private address of page `p` (caller guarantees `p < pages()`).
    pub fn alias_page(&self, p: u64) -> *mut u8 {
        debug_assert!(p < self.pages());
        // SAFETY: in bounds of the alias mapping by the caller's guarantee.
        unsafe { self.alias.add(p as usize * PAGE_SIZE) }
    }

    /// Host address of page `p` in the guest view.
    pub fn guest_page_addr(&self, p: u64) -> u64 {
        self.guest as u64 + p * PAGE_SIZE as u64
    }

    /// Makes the page-cache page of `p` exist (zero-filled) without touching the guest view.
    pub fn allocate_zero(&self, p: u64) {
        // SAFETY: `p` is in bounds; the alias is never uffd-registered, so this store allocates
        // a zeroed shmem page (or hits an existing one, whose first byte the caller owns).
        unsafe { core::ptr::write_volatile(self.alias_page(p), 0u8) };
    }

    /// Unmaps `pages` from the guest view only (the data stays in the memfd).
    pub fn zap_guest(&self, pages: &[u64]) -> io::Result<()> {
        self.advisor
            .advise(self.guest, self.pages(), libc::MADV_DONTNEED, |f| {
                for_runs(pages, f)
            })
    }

    /// Unmaps the page ranges `spans` (`(first page, pages)`) from the guest view only, with
    /// one vectored `MADV_DONTNEED` (the data stays in the memfd). The kernel flushes the TLB
    /// once per range it unmapped dirty shared entries from (every entry UFFDIO_CONTINUE
    /// installs is dirty), so fewer, longer ranges mean fewer TLB-shootdown IPIs.
    pub fn zap_guest_spans(&self, spans: &[(u64, u64)]) -> io::Result<()> {
        self.advisor
            .advise(self.guest, self.pages(), libc::MADV_DONTNEED, |f| {
                spans.iter().try_for_each(|&(s, n)| f(s, n))
            })
    }

    /// Unmaps the page ranges `spans` from the engine's alias only (the data stays in the
    /// memfd; the engine's next access maps it again).
    pub fn unmap_alias_spans(&self, spans: &[(u64, u64)]) -> io::Result<()> {
        self.advisor
            .advise(self.alias, self.pages(), libc::MADV_DONTNEED, |f| {
                spans.iter().try_for_each(|&(s, n)| f(s, n))
            })
    }

    /// Frees the memfd pages behind `pages` (both views lose them).
    pub fn free(&self, pages: &[u64]) -> io::Result<()> {
        self.advisor
            .advise(self.alias, self.pages(), libc::MADV_REMOVE, |f| {
                for_runs(pages, f)
            })
    }

    /// How many pages have memfd backing present (mincore on the alias).
    pub fn resident_count(&self) -> io::Result<u64> {
        let mut vec = vec![0u8; self.pages() as usize];
        // SAFETY: `vec` has one byte per page of the alias mapping, as mincore requires.
        let r = unsafe { libc::mincore(self.alias.cast(), self.len, vec.as_mut_ptr()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.iter().filter(|&&b| b & 1 != 0).count() as u64)
    }
}

impl Drop for GuestRam {
    fn drop(&mut self) {
        // SAFETY: unmapping the two mappings this struct created; no references outlive it
        // (the engine joins its threads before dropping).
        unsafe {
            libc::munmap(self.guest.cast(), self.len);
            libc::munmap(self.alias.cast(), self.len);
        }
    }
}

impl Default for Advisor {
    fn default() -> Self {
        Self::new()
    }
}

impl Advisor {
    /// Opens a pidfd of this process for `process_madvise` (without one: a call per run).
    pub fn new() -> Self {
        // SAFETY: pidfd_open on our own pid; the result is checked.
        let pfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
        let pidfd = (pfd >= 0).then(|| {
            // SAFETY: fresh fd from the kernel.
            unsafe { OwnedFd::from_raw_fd(pfd as i32) }
        });
        Self {
            vectored: AtomicBool::new(pidfd.is_some()),
            pidfd,
        }
    }

    /// Refuses a run that does not lie inside a mapping of `pages` pages.
    fn check_run(pages: u64, start: u64, n: u64) -> io::Result<()> {
        match start.checked_add(n) {
            Some(end) if end <= pages => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("pages {start}+{n} outside a mapping of {pages} pages"),
            )),
        }
    }

    /// Applies `advice` to the runs `runs` produces (`(first page, pages)`, each inside the
    /// mapping of `pages` pages at `base`): one vectored call where the kernel allows it, else
    /// one per run.
    pub(crate) fn advise(
        &self,
        base: *mut u8,
        pages: u64,
        advice: i32,
        runs: impl Fn(RunVisitor<'_>) -> io::Result<()>,
    ) -> io::Result<()> {
        if self.vectored.load(Ordering::Relaxed) {
            match self.advise_vectored(base, pages, advice, &runs) {
                Ok(()) => return Ok(()),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS)) => {
                    tracing::info!("process_madvise on self unsupported ({e}); one call per run");
                    self.vectored.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        runs(&mut |start, n| {
            Self::check_run(pages, start, n)?;
            // SAFETY: the run lies inside the mapping at `base` (checked above; the caller
            // gives its size).
            let r = unsafe {
                libc::madvise(
                    base.add(start as usize * PAGE_SIZE).cast(),
                    n as usize * PAGE_SIZE,
                    advice,
                )
            };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        })
    }

    fn advise_vectored(
        &self,
        base: *mut u8,
        pages: u64,
        advice: i32,
        runs: &dyn Fn(RunVisitor<'_>) -> io::Result<()>,
    ) -> io::Result<()> {
        let Some(pidfd) = &self.pidfd else {
            return Err(io::Error::from_raw_os_error(libc::ENOSYS));
        };
        let mut iov = [libc::iovec {
            iov_base: core::ptr::null_mut(),
            iov_len: 0,
        }; 64];
        let mut n = 0usize;
        let flush = |iov: &[libc::iovec]| -> io::Result<()> {
            let want: usize = iov.iter().map(|v| v.iov_len).sum();
            // SAFETY: `iov` points at valid iovecs describing ranges of our own mapping.
            let r = unsafe {
                libc::syscall(
                    libc::SYS_process_madvise,
                    pidfd.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len(),
                    advice,
                    0,
                )
            };
            if r < 0 {
                return Err(io::Error::last_os_error());
            }
            if r as usize != want {
                return Err(io::Error::other(format!(
                    "process_madvise advised {r} of {want} bytes"
                )));
            }
            Ok(())
        };
        const _: () = assert!(64 <= MAX_IOV);
        runs(&mut |start, len| {
            Self::check_run(pages, start, len)?;
            iov[n] = libc::iovec {
                // SAFETY: in bounds of the mapping (checked above).
                iov_base: unsafe { base.add(start as usize * PAGE_SIZE).cast() },
                iov_len: len as usize * PAGE_SIZE,
            };
            n += 1;
            if n == iov.len() {
                flush(&iov[..n])?;
                n = 0;
            }
            Ok(())
        })?;
        if n > 0 {
            flush(&iov[..n])?;
        }
        Ok(())
    }
}

/// Calls `f(start, len)` for each run of consecutive page numbers in `pages` (any order; runs
/// are detected between neighbours only).
pub fn for_runs(pages: &[u64], mut f: impl FnMut(u64, u64) -> io::Result<()>) -> io::Result<()> {
    let mut i = 0;
    while i < pages.len() {
        let start = pages[i];
        let mut n = 1;
        while i + (n as usize) < pages.len() && pages[i + n as usize] == start + n {
            n += 1;
        }
        f(start, n)?;
        i += n as usize;
    }
    Ok(())
}
