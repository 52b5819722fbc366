//! eventfd and epoll: how the fault-handler thread sleeps on "uffd readable or kicked".

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// A non-blocking eventfd used as a doorbell.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A new doorbell, not rung.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Rings the doorbell (never blocks; a saturated counter is still "rung").
    pub fn kick(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Clears the doorbell; returns whether it had been rung.
    pub fn drain(&self) -> bool {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our eventfd.
        let r = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        r == 8
    }

    /// The fd, for an epoll set.
    pub fn raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// An epoll set of a few fds, identified by the `u64` token given at `add`.
#[derive(Debug)]
pub struct Epoll(OwnedFd);

impl Epoll {
    /// An empty epoll set.
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fd owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Watches `fd` for input; its events come back tagged with `token`.
    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: valid epoll fd, target fd and a live event struct.
        let r = unsafe { libc::epoll_ctl(self.0.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `timeout_ms` (-1 = forever); returns a bitmask of ready tokens (< 64).
    pub fn wait(&self, timeout_ms: i32) -> io::Result<u64> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 8];
        // SAFETY: `evs` is a writable array of 8 events.
        let n = unsafe { libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), 8, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.raw_os_error() == Some(libc::EINTR) {
                Ok(0)
            } else {
                Err(e)
            };
        }
        Ok(evs[..n as usize]
            .iter()
            .fold(0u64, |m, e| m | (1u64 << (e.u64 & 63))))
    }
}
