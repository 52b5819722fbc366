//! Anonymous guest RAM whose pages move instead of being copied, allocated or freed: a private
//! anonymous *guest view* (registered MISSING with a userfaultfd), a *staging* area that mirrors
//! it page for page, and a *pool* of free pages, all three registered with the same uffd so that
//! `UFFDIO_MOVE` may move pages into any of them (the kernel moves only into ranges registered
//! with the uffd the ioctl is issued on). Staging and pool are registered in WP mode alone: valid
//! MOVE destinations whose own missing faults stay the kernel's (a zero-filled page), never a
//! uffd message nobody serves.
//!
//! A page's frame goes pool slot (its data lands there) → guest view (the install) → pool slot
//! (the eviction; the fingerprint reads it there); staging slots take a frame whose data must
//! wait outside the pool (a staged prefetch, a victim being written back).
//! Page `p` of guest RAM always uses staging slot `p`, so a run of guest pages has a run of
//! slots and moves in one call either way. Which pool slots hold free frames is the caller's
//! bookkeeping. See `docs/data-path.md` for what the cycle costs against the memfd one.

use std::io;

use crate::sys::mem::Advisor;
use crate::sys::uffd::{self, Uffd};
use crate::PAGE_SIZE;

const PG: u64 = PAGE_SIZE as u64;

/// The three mappings and their userfaultfd.
#[derive(Debug)]
pub struct AnonRam {
    guest: *mut u8,
    staging: *mut u8,
    pool: *mut u8,
    len: usize,
    pool_len: usize,
    /// Bounce pages: plain memory single pages land in and are copied from (UFFDIO_COPY),
    /// never moved; mapped on demand by [`AnonRam::with_bounce`].
    bounce: *mut u8,
    bounce_len: usize,
    uffd: Uffd,
    advisor: Advisor,
}

// SAFETY: the raw pointers denote process-wide mappings owned by this struct; access to the
// bytes behind them is the caller's protocol, not this type's.
unsafe impl Send for AnonRam {}
// SAFETY: as above; methods take `&self` and only issue syscalls or hand out addresses.
unsafe impl Sync for AnonRam {}

fn map(len: usize, what: &str) -> io::Result<*mut u8> {
    // SAFETY: a fresh private anonymous mapping; the kernel picks the address.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(e.kind(), format!("mmap {what}: {e}")));
    }
    // SAFETY: advisory call on the mapping just created: 4 KiB pages only, so a move never
    // has to split a huge page and every move is whole guest pages (failure is harmless).
    unsafe { libc::madvise(p, len, libc::MADV_NOHUGEPAGE) };
    // A fork (a child process started with fork + exec) would share every page copy-on-write
    // and leave it no longer exclusive to this process, which UFFDIO_MOVE refuses (EBUSY)
    // until the page is written again: children never get these mappings.
    // SAFETY: advisory call on the mapping just created.
    if unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) } < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: unmapping the mapping just created, which nobody else knows.
        unsafe { libc::munmap(p, len) };
        return Err(io::Error::new(
            e.kind(),
            format!("madvise {what} DONTFORK: {e}"),
        ));
    }
    Ok(p.cast())
}

impl AnonRam {
    /// Maps `len` bytes of guest RAM and of staging (a non-zero page multiple) and
    /// `pool_pages` pool slots, registered with a new uffd (`features` | `UFFD_FEATURE_MOVE`).
    pub fn new(len: usize, pool_pages: u64, features: u64) -> io::Result<Self> {
        if len == 0 || !len.is_multiple_of(PAGE_SIZE) || pool_pages == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "guest RAM size must be a non-zero multiple of 4 KiB, the pool non-empty",
            ));
        }
        let pool_len = pool_pages as usize * PAGE_SIZE;
        let mut made: Vec<(*mut u8, usize)> = Vec::with_capacity(3);
        let r = (|| {
            for (l, what) in [(len, "guest view"), (len, "staging"), (pool_len, "pool")] {
                made.push((map(l, what)?, l));
            }
            let uffd = Uffd::open(features | uffd::feature::MOVE)?;
            uffd.register(made[0].0 as u64, len as u64, uffd::mode::MISSING)?;
            uffd.register(made[1].0 as u64, len as u64, uffd::mode::WP)?;
            uffd.register(made[2].0 as u64, pool_len as u64, uffd::mode::WP)?;
            Ok(uffd)
        })();
        match r {
            Ok(uffd) => Ok(Self {
                guest: made[0].0,
                staging: made[1].0,
                pool: made[2].0,
                len,
                pool_len,
                bounce: core::ptr::null_mut(),
                bounce_len: 0,
                uffd,
                advisor: Advisor::new(),
            }),
            Err(e) => {
                for (p, l) in made {
                    // SAFETY: unmapping mappings created above that nobody else knows.
                    unsafe { libc::munmap(p.cast(), l) };
                }
                Err(e)
            }
        }
    }

    /// Adds `pages` bounce pages (a private anonymous mapping, not registered with the uffd).
    pub fn with_bounce(mut self, pages: u64) -> io::Result<Self> {
        let len = pages as usize * PAGE_SIZE;
        if len > 0 {
            self.bounce = map(len, "bounce pages")?;
            self.bounce_len = len;
        }
        Ok(self)
    }

    /// Bounce pages.
    pub fn bounce_pages(&self) -> u64 {
        (self.bounce_len / PAGE_SIZE) as u64
    }

    /// Bounce page `b` (caller guarantees `b < bounce_pages()`).
    pub fn bounce_page(&self, b: u64) -> *mut u8 {
        debug_assert!(b < self.bounce_pages());
        // SAFETY: in bounds of the bounce mapping by the caller's guarantee.
        unsafe { self.bounce.add(b as usize * PAGE_SIZE) }
    }

    /// The userfaultfd the guest view is registered with (its faults, wakes, moves).
    pub fn uffd(&self) -> &Uffd {
        &self.uffd
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

    /// Pool slots.
    pub fn pool_pages(&self) -> u64 {
        (self.pool_len / PAGE_SIZE) as u64
    }

    /// Host address of the guest view (for KVM memslots).
    pub fn guest_base(&self) -> u64 {
        self.guest as u64
    }

    /// Host address of page `p` in the guest view.
    pub fn guest_page_addr(&self, p: u64) -> u64 {
        self.guest as u64 + p * PG
    }

    /// Staging slot of guest page `p` (caller guarantees `p < pages()`). Touching an empty
    /// slot allocates a zeroed page there (its faults are the kernel's).
    pub fn staging_page(&self, p: u64) -> *mut u8 {
        debug_assert!(p < self.pages());
        // SAFETY: in bounds of the staging mapping by the caller's guarantee.
        unsafe { self.staging.add(p as usize * PAGE_SIZE) }
    }

    /// Pool slot `s` (caller guarantees `s < pool_pages()`).
    pub fn pool_page(&self, s: u64) -> *mut u8 {
        debug_assert!(s < self.pool_pages());
        // SAFETY: in bounds of the pool mapping by the caller's guarantee.
        unsafe { self.pool.add(s as usize * PAGE_SIZE) }
    }

    /// Allocates pool slots `[s, s+n)` (MADV_POPULATE_WRITE: an empty slot gets a zeroed
    /// frame; a slot holding a frame keeps it, content and all, whoever put it there
    /// meanwhile — writing a byte to allocate would change that frame's data).
    pub fn fill_pool(&self, s: u64, n: u64) -> io::Result<()> {
        self.check(s, n, self.pool_pages())?;
        // SAFETY: the range lies inside the pool mapping (checked); populating changes no data.
        let r = unsafe {
            libc::madvise(
                self.pool_page(s).cast(),
                n as usize * PAGE_SIZE,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    fn check(&self, s: u64, n: u64, max: u64) -> io::Result<()> {
        match s.checked_add(n) {
            Some(e) if e <= max && n > 0 => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("pages {s}+{n} outside 0..{max}"),
            )),
        }
    }

    fn mv(&self, dst: u64, src: u64, n: u64, wake: bool) -> io::Result<()> {
        let moved = self.uffd.move_range(dst, src, n * PG, wake)?;
        if moved != n * PG {
            return Err(io::Error::other(format!(
                "UFFDIO_MOVE moved {moved} of {} bytes",
                n * PG
            )));
        }
        Ok(())
    }

    /// Frames of pool slots `[s, s+n)` → staging slots `[p, p+n)` (which must be empty).
    pub fn take(&self, s: u64, p: u64, n: u64) -> io::Result<()> {
        self.check(s, n, self.pool_pages())?;
        self.check(p, n, self.pages())?;
        self.mv(
            self.staging_page(p) as u64,
            self.pool_page(s) as u64,
            n,
            false,
        )
    }

    /// Staging slots `[p, p+n)` → guest pages `[p, p+n)` (the install), waking threads that
    /// fault on them if `wake`. The guest pages must have none.
    pub fn move_in(&self, p: u64, n: u64, wake: bool) -> io::Result<()> {
        self.check(p, n, self.pages())?;
        self.mv(
            self.guest_page_addr(p),
            self.staging_page(p) as u64,
            n,
            wake,
        )
    }

    /// Guest pages `[p, p+n)` → staging slots `[p, p+n)` (the eviction: the guest's next
    /// access faults into the uffd). The slots must be empty.
    pub fn move_out(&self, p: u64, n: u64) -> io::Result<()> {
        self.check(p, n, self.pages())?;
        self.mv(
            self.staging_page(p) as u64,
            self.guest_page_addr(p),
            n,
            false,
        )
    }

    /// Staging slots `[p, p+n)` → pool slots `[s, s+n)` (which must be empty).
    pub fn give(&self, p: u64, s: u64, n: u64) -> io::Result<()> {
        self.check(p, n, self.pages())?;
        self.check(s, n, self.pool_pages())?;
        self.mv(
            self.pool_page(s) as u64,
            self.staging_page(p) as u64,
            n,
            false,
        )
    }
}

impl AnonRam {
    /// Frees the frames in staging slots `[p, p+n)` (MADV_DONTNEED; empty slots stay empty).
    pub fn drop_staging(&self, p: u64, n: u64) -> io::Result<()> {
        self.check(p, n, self.pages())?;
        Self::dontneed(self.staging_page(p), n)
    }

    /// Frees the frames in the staging slots of `runs` (`(first page, pages)`; empty slots stay
    /// empty), with one vectored MADV_DONTNEED where the kernel allows it.
    pub fn drop_staging_runs(&self, runs: &[(u64, u64)]) -> io::Result<()> {
        self.advisor
            .advise(self.staging, self.pages(), libc::MADV_DONTNEED, |f| {
                runs.iter().try_for_each(|&(s, n)| f(s, n))
            })
    }

    /// Frees the frames in pool slots `[s, s+n)` (MADV_DONTNEED; empty slots stay empty).
    pub fn drop_pool(&self, s: u64, n: u64) -> io::Result<()> {
        self.check(s, n, self.pool_pages())?;
        Self::dontneed(self.pool_page(s), n)
    }

    /// MADV_DONTNEED of `n` pages from `start`, which the caller checked lie inside one of
    /// the mappings.
    fn dontneed(start: *mut u8, n: u64) -> io::Result<()> {
        // SAFETY: the range lies inside a mapping of `self` (the caller checked it).
        let r = unsafe { libc::madvise(start.cast(), n as usize * PAGE_SIZE, libc::MADV_DONTNEED) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Whether the page at `addr` (inside one of the mappings) holds a frame (mincore).
    pub fn present(&self, addr: u64) -> bool {
        let mut v = 0u8;
        // SAFETY: one page-aligned page inside a mapping of `self`; `v` takes its one byte.
        let r =
            unsafe { libc::mincore((addr & !(PG - 1)) as *mut libc::c_void, PAGE_SIZE, &mut v) };
        r == 0 && v & 1 != 0
    }

    /// One byte per page of the `n` pages from `addr` (page-aligned, inside one mapping of
    /// `self`): bit 0 set where the page holds a frame (mincore).
    fn residency(addr: *mut u8, n: u64) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; n as usize];
        // SAFETY: `n` page-aligned pages inside a mapping of `self` (the caller's guarantee);
        // `v` takes one byte each.
        let r = unsafe { libc::mincore(addr.cast(), n as usize * PAGE_SIZE, v.as_mut_ptr()) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(v)
    }

    /// The first of the `n` pages from `addr` (inside one mapping of `self`) that holds no
    /// frame (mincore), if any.
    pub fn first_absent(&self, addr: u64, n: u64) -> Option<u64> {
        let v = Self::residency((addr & !(PG - 1)) as *mut u8, n).ok()?;
        v.iter().position(|b| b & 1 == 0).map(|i| i as u64)
    }

    /// Per guest page, whether the guest view holds a frame (mincore over the whole view;
    /// all false if the call fails, e.g. part of the view is no longer mapped).
    pub fn guest_present(&self) -> Vec<bool> {
        match Self::residency(self.guest, self.pages()) {
            Ok(v) => v.iter().map(|b| b & 1 != 0).collect(),
            Err(_) => vec![false; self.pages() as usize],
        }
    }

    /// Where the three mappings are, for an error report.
    pub fn layout(&self) -> String {
        let two_mib = 2u64 << 20;
        let at = |p: *mut u8, len: usize| {
            let a = p as u64;
            format!("{a:#x}+{len:#x} (2 MiB offset {:#x})", a % two_mib)
        };
        format!(
            "guest view {}, staging {}, pool {}",
            at(self.guest, self.len),
            at(self.staging, self.len),
            at(self.pool, self.pool_len)
        )
    }

    /// Pages with a frame in the guest view or a staging slot (mincore of both).
    pub fn resident_count(&self) -> io::Result<u64> {
        let mut total = 0;
        for base in [self.guest, self.staging] {
            let v = Self::residency(base, self.pages())?;
            total += v.iter().filter(|&&b| b & 1 != 0).count() as u64;
        }
        Ok(total)
    }
}

impl Drop for AnonRam {
    fn drop(&mut self) {
        // SAFETY: unmapping the mappings `new` created; no references outlive `self`.
        unsafe {
            libc::munmap(self.guest.cast(), self.len);
            libc::munmap(self.staging.cast(), self.len);
            libc::munmap(self.pool.cast(), self.pool_len);
            if self.bounce_len > 0 {
                libc::munmap(self.bounce.cast(), self.bounce_len);
            }
        }
    }
}

/// Forks a child that exits at once and reaps it (tests: the process's private pages are
/// shared with the child meanwhile, and stay non-exclusive until written again).
#[cfg(test)]
pub(crate) fn fork_a_child_that_exits() {
    // SAFETY: the child calls only _exit, which is async-signal-safe.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: leaving the forked child at once.
        unsafe { libc::_exit(0) };
    }
    assert!(pid > 0, "fork");
    let mut status = 0;
    // SAFETY: reaping the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(ptr: *const u8) -> u64 {
        // SAFETY: callers pass a resident page of a mapping the test owns.
        unsafe { core::ptr::read_volatile(ptr as *const u64) }
    }

    #[test]
    fn a_frame_cycles_pool_staging_guest_staging_pool() {
        let ram = AnonRam::new(8 * PAGE_SIZE, 8, 0).expect("anonymous RAM with UFFDIO_MOVE");
        ram.fill_pool(0, 8).unwrap();
        // Land data in two frames taken from the pool, install them as a run.
        ram.take(6, 2, 2).unwrap();
        for p in 2..4 {
            // SAFETY: staging slot p holds a frame just taken.
            unsafe { core::ptr::write_volatile(ram.staging_page(p) as *mut u64, 40 + p) };
        }
        ram.move_in(2, 2, false).unwrap();
        assert_eq!(word(ram.guest_page_addr(3) as *const u8), 43);
        // SAFETY: guest page 2 is mapped; this is the guest writing its page.
        unsafe { core::ptr::write_volatile(ram.guest_page_addr(2) as *mut u64, 99) };
        // A slot that is not empty refuses a move in; so does a guest page holding one.
        ram.take(0, 4, 1).unwrap();
        assert!(ram.move_out(4, 1).is_err(), "guest page 4 has no frame");
        ram.move_in(4, 1, false).unwrap();
        assert!(ram.take(1, 4, 1).is_ok(), "slot 4 is empty again");
        assert_eq!(
            ram.move_in(4, 1, false).unwrap_err().raw_os_error(),
            Some(libc::EEXIST)
        );
        ram.give(4, 1, 1).unwrap();
        // Evict the run: the guest's write moved out with its frame; back to the pool.
        ram.move_out(2, 2).unwrap();
        assert_eq!(word(ram.staging_page(2)), 99);
        assert_eq!(word(ram.staging_page(3)), 43);
        ram.give(2, 6, 2).unwrap();
        assert_eq!(word(ram.pool_page(7)), 43);
        assert!(ram.take(0, 8, 1).is_err(), "out of range");
        assert!(ram.take(8, 0, 1).is_err(), "out of range");
    }

    #[test]
    fn a_fork_does_not_stop_pages_from_moving() {
        let ram = AnonRam::new(4 * PAGE_SIZE, 4, 0).expect("anonymous RAM with UFFDIO_MOVE");
        ram.fill_pool(0, 2).unwrap();
        ram.take(0, 1, 1).unwrap();
        ram.move_in(1, 1, false).unwrap();
        assert_eq!(word(ram.guest_page_addr(1) as *const u8), 0);
        // As a child started with fork + exec does (the local memserver, with its pre_exec).
        fork_a_child_that_exits();
        // Without MADV_DONTFORK the pages are no longer exclusive and this is EBUSY.
        ram.move_out(1, 1).expect("move out after a fork");
        ram.give(1, 2, 1).expect("give after a fork");
        ram.take(1, 3, 1).expect("take after a fork");
    }
}
