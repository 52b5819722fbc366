//! Raw userfaultfd: open, API handshake, register, and the ioctls that resolve faults on a
//! shmem range registered MISSING|MINOR (CONTINUE maps page-cache pages the engine filled
//! through its alias; WAKE), plus non-blocking event reads into a caller-owned buffer.
//!
//! Hand-written instead of the `userfaultfd` crate: that crate runs bindgen (libclang) at build
//! time, does not name MINOR_SHMEM, and its event reader is per-message; here one `read(2)` drains
//! up to [`MAX_EVENTS`] messages into a stack buffer with no allocation.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xC018_AA3F;
const UFFDIO_REGISTER: libc::c_ulong = 0xC020_AA00;
const UFFDIO_WAKE: libc::c_ulong = 0x8010_AA02;
const UFFDIO_CONTINUE: libc::c_ulong = 0xC020_AA07;
/// `_IOWR(0xAA, 0x03, struct uffdio_copy)` (40 bytes).
const UFFDIO_COPY: libc::c_ulong = 0xC028_AA03;
/// `_IOWR(0xAA, 0x05, struct uffdio_move)` (40 bytes).
const UFFDIO_MOVE: libc::c_ulong = 0xC028_AA05;
/// `_IO(0xAA, 0)` on /dev/userfaultfd.
const USERFAULTFD_IOC_NEW: libc::c_ulong = 0xAA00;

/// `UFFD_FEATURE_*` bits this engine asks for.
pub mod feature {
    /// Shared-memory (memfd) regions may be registered in MISSING mode.
    pub const MISSING_SHMEM: u64 = 1 << 5;
    /// Fault messages carry the faulting thread's id.
    pub const THREAD_ID: u64 = 1 << 8;
    /// Shared-memory regions may be registered in MINOR mode (installs by UFFDIO_CONTINUE).
    pub const MINOR_SHMEM: u64 = 1 << 10;
    /// UFFDIO_MOVE: move anonymous pages between two addresses of this process (Linux >= 6.8).
    pub const MOVE: u64 = 1 << 16;
}

/// `UFFDIO_REGISTER_MODE_*`
pub mod mode {
    /// Report faults on pages with no page cache page (never written).
    pub const MISSING: u64 = 1 << 0;
    /// Write-protect tracking; registering a range in this mode alone makes it a valid
    /// UFFDIO_MOVE destination while its missing faults stay the kernel's (zero-filled pages).
    pub const WP: u64 = 1 << 1;
    /// Report faults on pages present in the memfd but not mapped (installed by UFFDIO_CONTINUE).
    pub const MINOR: u64 = 1 << 2;
}

/// Bit of `_UFFDIO_CONTINUE` in the register reply's `ioctls`.
const IOCTL_CONTINUE_BIT: u64 = 1 << 7;
const MODE_DONTWAKE: u64 = 1;

const UFFD_EVENT_PAGEFAULT: u8 = 0x12;

const PAGE: u64 = 4096;

/// Messages drained per `read(2)`.
pub const MAX_EVENTS: usize = 64;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    mapped: i64,
}

/// `struct uffdio_move`, and `struct uffdio_copy`, whose layout is the same (`copy` for
/// `moved`).
#[repr(C)]
struct UffdioMove {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}
const _: () = assert!(core::mem::size_of::<UffdioMove>() == 40);

/// `struct uffd_msg` (32 bytes), pagefault view.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct RawMsg {
    event: u8,
    _r1: u8,
    _r2: u16,
    _r3: u32,
    _flags: u64,
    address: u64,
    ptid: u32,
    _pad: u32,
}
const _: () = assert!(core::mem::size_of::<RawMsg>() == 32);

/// One page fault as read from the uffd.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fault {
    /// Faulting host address (the guest view's).
    pub address: u64,
    /// Faulting thread (UFFD_FEATURE_THREAD_ID).
    pub tid: u32,
}

/// Outcome of an install ioctl.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Installed {
    /// The whole range was installed.
    Done,
    /// The page was already mapped (EEXIST): someone else installed it.
    AlreadyMapped,
}

/// A userfaultfd file descriptor (non-blocking, close-on-exec).
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
}

impl Uffd {
    /// Opens a uffd (via /dev/userfaultfd, else the syscall) and negotiates `features`.
    pub fn open(features: u64) -> io::Result<Self> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let fd = Self::open_dev(flags).or_else(|_| {
            // SAFETY: plain syscall with integer flags; the result is checked below.
            let r = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
            if r < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(r as RawFd)
            }
        })?;
        // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API takes a pointer to a live `uffdio_api` of the right layout.
        let r = unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd })
    }

    fn open_dev(flags: i32) -> io::Result<RawFd> {
        let path = c"/dev/userfaultfd";
        // SAFETY: `path` is a valid NUL-terminated string.
        let dev = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        if dev < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `dev` is our fd; USERFAULTFD_IOC_NEW takes the flags as its integer argument.
        let r = unsafe { libc::ioctl(dev, USERFAULTFD_IOC_NEW, flags) };
        let err = io::Error::last_os_error();
        // SAFETY: closing the fd we opened above, exactly once.
        unsafe { libc::close(dev) };
        if r < 0 {
            Err(err)
        } else {
            Ok(r)
        }
    }

    /// Registers `[start, start+len)` in `modes`; fails if CONTINUE is wanted but not offered.
    pub fn register(&self, start: u64, len: u64, modes: u64) -> io::Result<()> {
        let mut reg = UffdioRegister {
            range: UffdioRange { start, len },
            mode: modes,
            ioctls: 0,
        };
        // SAFETY: pointer to a live `uffdio_register`; the kernel validates the range.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER, &mut reg) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        if modes & mode::MINOR != 0 && reg.ioctls & IOCTL_CONTINUE_BIT == 0 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "UFFDIO_CONTINUE not offered for this range",
            ));
        }
        Ok(())
    }

    /// Maps the page-cache pages already present under `[start, start+len)` (MINOR mode),
    /// waking the threads that fault on them if `wake`.
    ///
    /// The kernel stops at the first page that is mapped already: with nothing installed
    /// before it that is EEXIST, else EAGAIN with `mapped` = the bytes it did install (EAGAIN
    /// with a negative `mapped`: the mm changed under it, nothing done). Either way this
    /// resumes right after, as a range: a guest fault that mapped one page of an injected run
    /// (a race the fault handler wins often on a sequential scan) costs one extra call, not
    /// one call per remaining page.
    pub fn continue_range(&self, start: u64, len: u64, wake: bool) -> io::Result<Installed> {
        let mut done = 0;
        let mut outcome = Installed::Done;
        while done < len {
            let mut c = UffdioContinue {
                range: UffdioRange {
                    start: start + done,
                    len: len - done,
                },
                mode: if wake { 0 } else { MODE_DONTWAKE },
                mapped: 0,
            };
            // SAFETY: pointer to a live `uffdio_continue`; the range lies in a registered VMA
            // (checked by the kernel, which returns an error otherwise).
            let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_CONTINUE, &mut c) };
            if r == 0 {
                break;
            }
            // Read right after the ioctl.
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => done += u64::try_from(c.mapped).unwrap_or(0),
                Some(libc::EEXIST) => {
                    if wake {
                        self.wake(start + done, PAGE)?;
                    }
                    outcome = Installed::AlreadyMapped;
                    done += PAGE;
                }
                _ => return Err(e),
            }
        }
        Ok(outcome)
    }

    /// Copies the 4 KiB at `src` (any readable memory) into a new page at `dst` (UFFDIO_COPY),
    /// waking the threads that fault on it if `wake`. `dst` must lie in a range registered
    /// with this uffd and hold no page (else EEXIST). Unlike a move, nothing is unmapped at
    /// the source: no TLB flush, so no shootdown of other CPUs.
    pub fn copy_page(&self, dst: u64, src: u64, wake: bool) -> io::Result<()> {
        self.fill_some(UFFDIO_COPY, dst, src, PAGE, wake)
            .map(|_| ())
    }

    /// One `UFFDIO_COPY` call of a run: copies what it can of the `len` bytes at `src` (any
    /// readable memory) into new pages at `[dst, dst+len)` and returns the bytes copied (all of
    /// `len`, or the part before the page the kernel stopped at, e.g. one mapped meanwhile).
    /// An error means nothing was copied at `dst`: EEXIST (the destination page is present)
    /// or others. As [`Uffd::copy_page`], nothing is unmapped at the source: no TLB flush.
    pub fn copy_some(&self, dst: u64, src: u64, len: u64, wake: bool) -> io::Result<u64> {
        self.fill_some(UFFDIO_COPY, dst, src, len, wake)
    }

    /// One `UFFDIO_COPY` or `UFFDIO_MOVE` call (the two structs share their layout): the
    /// bytes done, all of `len` or the part before the page the kernel stopped at (EAGAIN with
    /// progress; EAGAIN without any is retried); any other error means nothing was done.
    fn fill_some(
        &self,
        req: libc::c_ulong,
        dst: u64,
        src: u64,
        len: u64,
        wake: bool,
    ) -> io::Result<u64> {
        loop {
            let mut m = UffdioMove {
                dst,
                src,
                len,
                mode: if wake { 0 } else { MODE_DONTWAKE },
                moved: 0,
            };
            // SAFETY: pointer to a live `uffdio_copy` / `uffdio_move` (same layout), as `req`
            // expects; the kernel validates both ranges (destination registered with this
            // uffd; a move's source anonymous in this mm, a copy's readable) and fails
            // otherwise.
            let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), req, &mut m) };
            if r == 0 {
                return Ok(len);
            }
            let e = io::Error::last_os_error();
            match (e.raw_os_error(), u64::try_from(m.moved)) {
                (Some(libc::EAGAIN), Ok(n)) if n > 0 => return Ok(n),
                (Some(libc::EAGAIN), _) => continue,
                _ => return Err(e),
            }
        }
    }

    /// Moves the anonymous pages under `[src, src+len)` to `[dst, dst+len)` (UFFDIO_MOVE: the
    /// page-table entries move, the pages are neither copied nor allocated), waking the threads
    /// that fault on the destination if `wake`. `dst` must lie in a range registered with this
    /// uffd and hold no pages; both ranges must be private anonymous mappings.
    ///
    /// Returns the bytes moved. The kernel may stop early (EAGAIN with partial progress: this
    /// resumes after it); any other error, e.g. EEXIST (a destination page present), ENOENT (a
    /// source hole) or EBUSY (a source page pinned or shared), is returned with nothing moved
    /// after the pages already done, whose count the error does not carry: callers move runs
    /// whose every page they own.
    pub fn move_range(&self, dst: u64, src: u64, len: u64, wake: bool) -> io::Result<u64> {
        let mut done = 0;
        while done < len {
            done += self.move_some(dst + done, src + done, len - done, wake)?;
        }
        Ok(done)
    }

    /// One `UFFDIO_MOVE` call: moves what it can of `[src, src+len)` to `[dst, dst+len)` and
    /// returns the bytes moved (all of `len`, or the part before the page the kernel stopped
    /// at). An error means nothing was moved at `dst`: EEXIST (the destination page is
    /// present), ENOENT (the source page is not), EBUSY (pinned or shared), or others.
    pub fn move_some(&self, dst: u64, src: u64, len: u64, wake: bool) -> io::Result<u64> {
        self.fill_some(UFFDIO_MOVE, dst, src, len, wake)
    }

    /// Wakes threads waiting on faults in the range without installing anything.
    pub fn wake(&self, start: u64, len: u64) -> io::Result<()> {
        let range = UffdioRange { start, len };
        // SAFETY: pointer to a live `uffdio_range`.
        let r = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WAKE, &range) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads pending page faults into `out`; returns how many (0 = none pending).
    pub fn read_faults(
        &self,
        raw: &mut [RawMsg; MAX_EVENTS],
        out: &mut [Fault; MAX_EVENTS],
    ) -> io::Result<usize> {
        // SAFETY: `raw` is a writable buffer of exactly MAX_EVENTS * 32 bytes; the kernel writes
        // whole `uffd_msg` records into it.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                raw.as_mut_ptr().cast(),
                core::mem::size_of_val(raw),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        let msgs = n as usize / core::mem::size_of::<RawMsg>();
        let mut k = 0;
        for m in &raw[..msgs] {
            if m.event == UFFD_EVENT_PAGEFAULT {
                out[k] = Fault {
                    address: m.address,
                    tid: m.ptid,
                };
                k += 1;
            }
        }
        Ok(k)
    }

    /// The userfaultfd, for an epoll set.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::mem::GuestRam;

    /// Whether the page at `addr` of this process is mapped (pagemap's present bit): a look
    /// at the page tables that never touches the page, which here would fault into our own
    /// userfaultfd with nobody to serve it.
    fn mapped(addr: u64) -> bool {
        use std::io::{Read, Seek, SeekFrom};
        let mut f = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
        f.seek(SeekFrom::Start(addr / PAGE * 8)).expect("seek");
        let mut e = [0u8; 8];
        f.read_exact(&mut e).expect("read");
        u64::from_ne_bytes(e) >> 63 == 1
    }

    #[test]
    fn a_range_with_pages_mapped_already_is_mapped_whole() {
        let ram = GuestRam::new(8 * PAGE as usize).expect("memfd");
        let uffd = Uffd::open(feature::MINOR_SHMEM).expect("userfaultfd (root?)");
        uffd.register(
            ram.guest_base(),
            ram.len() as u64,
            mode::MISSING | mode::MINOR,
        )
        .expect("register");
        for p in 0..8 {
            ram.allocate_zero(p);
        }
        let at = |p: u64| ram.guest_page_addr(p);
        // Pages 0 and 3 are mapped first, as a racing guest fault would have.
        for p in [0, 3] {
            assert_eq!(
                uffd.continue_range(at(p), PAGE, false).unwrap(),
                Installed::Done
            );
        }
        assert!(
            mapped(at(3)) && !mapped(at(1)),
            "pagemap tells mapped pages apart"
        );
        // The kernel stops at page 0 (EEXIST), then after pages 1-2 at page 3 (EAGAIN with
        // partial progress): both are skipped and the rest is mapped.
        assert_eq!(
            uffd.continue_range(at(0), 8 * PAGE, false).unwrap(),
            Installed::AlreadyMapped
        );
        assert!((0..8).all(|p| mapped(at(p))), "every page mapped");
        assert_eq!(
            uffd.continue_range(at(2), 2 * PAGE, true).unwrap(),
            Installed::AlreadyMapped
        );
    }

    fn anon(pages: usize) -> u64 {
        // SAFETY: a fresh private anonymous mapping, unmapped by the test.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                pages * PAGE as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        // SAFETY: advisory call on our own mapping.
        unsafe { libc::madvise(p, pages * PAGE as usize, libc::MADV_NOHUGEPAGE) };
        p as u64
    }

    #[test]
    fn pages_move_between_anonymous_ranges_without_copying() {
        let (a, b) = (anon(4), anon(4));
        let uffd = Uffd::open(feature::MOVE).expect("userfaultfd with UFFD_FEATURE_MOVE");
        uffd.register(a, 4 * PAGE, mode::MISSING)
            .expect("register a");
        uffd.register(b, 4 * PAGE, mode::WP).expect("register b");
        for p in 0..4 {
            // SAFETY: b is ours and registered in WP mode only: this write allocates a page.
            unsafe { core::ptr::write_volatile((b + p * PAGE) as *mut u64, 100 + p) };
        }
        let frame = |addr: u64| {
            use std::io::{Read, Seek, SeekFrom};
            let mut f = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
            f.seek(SeekFrom::Start(addr / PAGE * 8)).expect("seek");
            let mut e = [0u8; 8];
            f.read_exact(&mut e).expect("read");
            u64::from_ne_bytes(e) & ((1 << 55) - 1)
        };
        let pfn = frame(b + PAGE);
        // A run of 3 pages in one call, then one back.
        assert_eq!(uffd.move_range(a, b, 3 * PAGE, false).unwrap(), 3 * PAGE);
        assert!(mapped(a + 2 * PAGE) && !mapped(b) && !mapped(a + 3 * PAGE));
        for p in 0..3 {
            // SAFETY: page p of a was just moved in.
            let v = unsafe { core::ptr::read_volatile((a + p * PAGE) as *const u64) };
            assert_eq!(v, 100 + p);
        }
        // Frame numbers read 0 without CAP_SYS_ADMIN; as root they show the page itself moved.
        assert_eq!(frame(a + PAGE), pfn, "the same physical page, not a copy");
        // A destination that holds a page is refused; so is a hole in the source.
        let busy = uffd.move_range(a, b + 3 * PAGE, PAGE, false).unwrap_err();
        assert_eq!(busy.raw_os_error(), Some(libc::EEXIST));
        let hole = uffd.move_range(a + 3 * PAGE, b, PAGE, false).unwrap_err();
        assert_eq!(hole.raw_os_error(), Some(libc::ENOENT));
        assert_eq!(uffd.move_range(b, a, PAGE, false).unwrap(), PAGE);
        // SAFETY: page 0 of b holds the page moved back.
        assert_eq!(unsafe { core::ptr::read_volatile(b as *const u64) }, 100);
        // SAFETY: unmapping the two mappings created above.
        unsafe {
            libc::munmap(a as *mut libc::c_void, 4 * PAGE as usize);
            libc::munmap(b as *mut libc::c_void, 4 * PAGE as usize);
        }
    }

    #[test]
    fn a_run_is_copied_in_one_call_and_stops_before_a_mapped_page() {
        let (a, src) = (anon(8), anon(8));
        let uffd = Uffd::open(feature::MOVE).expect("userfaultfd with UFFD_FEATURE_MOVE");
        uffd.register(a, 8 * PAGE, mode::MISSING)
            .expect("register a");
        for p in 0..8 {
            // SAFETY: `src` is ours and not registered: this write allocates a page.
            unsafe { core::ptr::write_volatile((src + p * PAGE) as *mut u64, 200 + p) };
        }
        // A run of 4 pages in one call: new pages at `a`, the source stays mapped and intact.
        assert_eq!(uffd.copy_some(a, src, 4 * PAGE, false).unwrap(), 4 * PAGE);
        assert!((0..4).all(|p| mapped(a + p * PAGE)) && !mapped(a + 4 * PAGE));
        for p in 0..4 {
            // SAFETY: page p of a was just copied in; page p of src is still mapped.
            let (v, s) = unsafe {
                (
                    core::ptr::read_volatile((a + p * PAGE) as *const u64),
                    core::ptr::read_volatile((src + p * PAGE) as *const u64),
                )
            };
            assert_eq!((v, s), (200 + p, 200 + p));
        }
        // Page 6 mapped meanwhile (a racing fault): the run from 5 stops before it...
        assert_eq!(
            uffd.copy_some(a + 6 * PAGE, src, PAGE, false).unwrap(),
            PAGE
        );
        assert_eq!(
            uffd.copy_some(a + 5 * PAGE, src + 5 * PAGE, 3 * PAGE, false)
                .unwrap(),
            PAGE
        );
        // ... and a run starting at a mapped page copies nothing.
        let busy = uffd
            .copy_some(a + 6 * PAGE, src + 6 * PAGE, 2 * PAGE, false)
            .unwrap_err();
        assert_eq!(busy.raw_os_error(), Some(libc::EEXIST));
        // SAFETY: page 6 of a holds the copy of src's page 0, made above.
        let six = unsafe { core::ptr::read_volatile((a + 6 * PAGE) as *const u64) };
        assert_eq!(six, 200);
        // SAFETY: unmapping the two mappings created above.
        unsafe {
            libc::munmap(a as *mut libc::c_void, 8 * PAGE as usize);
            libc::munmap(src as *mut libc::c_void, 8 * PAGE as usize);
        }
    }
}
