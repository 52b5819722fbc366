//! A pseudo-terminal as the serial console's backend (`console`/`serial` mode `Pty` of the
//! API, what libvirt asks for): the board's COM1 console writes guest output into the master
//! side ([`Pty::writer`]) and reads typed input from it ([`Pty::reader`]); whoever opens the
//! slave path (`virsh console`, a test) reads the output there and types into it. One pty
//! serves every boot of a created VM: each boot takes a new reader, which retires the previous
//! boot's (its input thread sees end of file).
//!
//! The slave is put in raw mode (no echo, no line editing, no newline translation) and kept
//! open by the VMM, so the terminal lives as long as the VM even when no client is attached,
//! and output waits in the terminal's buffer for the next client. The master is non-blocking:
//! when that buffer is full (nobody reads), further output is dropped rather than stalling a
//! vCPU.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a [`PtyReader`] waits for input before checking whether it was retired.
const READ_TICK: Duration = Duration::from_millis(200);

/// An open pseudo-terminal pair.
#[derive(Debug)]
pub struct Pty {
    master: File,
    _slave: OwnedFd,
    path: PathBuf,
    /// The generation of the current reader; older readers report end of file.
    reader_generation: AtomicU64,
}

impl PartialEq for Pty {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

impl Eq for Pty {}

fn check(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

impl Pty {
    /// Opens a new pty pair (raw mode, close-on-exec, non-blocking master).
    pub fn open() -> io::Result<Pty> {
        let (mut m, mut s): (libc::c_int, libc::c_int) = (-1, -1);
        // SAFETY: openpty writes two fds into the given ints; the name, termios and winsize
        // pointers may be null.
        check(unsafe {
            libc::openpty(
                &mut m,
                &mut s,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        })?;
        // SAFETY: openpty succeeded, so both are fresh fds owned by nobody else.
        let (master, slave) = unsafe { (File::from_raw_fd(m), OwnedFd::from_raw_fd(s)) };
        for fd in [master.as_raw_fd(), slave.as_raw_fd()] {
            // SAFETY: fcntl on fds this function owns.
            check(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) })?;
        }
        // SAFETY: a zeroed termios is a valid buffer for tcgetattr to fill; cfmakeraw and
        // tcsetattr only read and write that struct and the slave fd.
        unsafe {
            let mut t: libc::termios = std::mem::zeroed();
            check(libc::tcgetattr(slave.as_raw_fd(), &mut t))?;
            libc::cfmakeraw(&mut t);
            check(libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &t))?;
        }
        // SAFETY: fcntl on the master fd this function owns.
        unsafe {
            let flags = check(libc::fcntl(master.as_raw_fd(), libc::F_GETFL))?;
            check(libc::fcntl(
                master.as_raw_fd(),
                libc::F_SETFL,
                flags | libc::O_NONBLOCK,
            ))?;
        }
        let path = std::fs::read_link(format!("/proc/self/fd/{}", slave.as_raw_fd()))?;
        Ok(Pty {
            master,
            _slave: slave,
            path,
            reader_generation: AtomicU64::new(0),
        })
    }

    /// The slave's path (`/dev/pts/N`): what clients open.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A writer into the terminal that drops output nobody has room for.
    pub fn writer(self: &Arc<Self>) -> PtyWriter {
        PtyWriter(self.clone())
    }

    /// The console input of a new boot: typed input until [`Pty::retire_readers`] or the next
    /// call (then end of file, which ends the console's input thread).
    pub fn reader(self: &Arc<Self>) -> PtyReader {
        let generation = self.reader_generation.fetch_add(1, Ordering::SeqCst) + 1;
        PtyReader {
            pty: self.clone(),
            generation,
        }
    }

    /// Ends the input of every reader handed out so far (the VM using them stopped).
    pub fn retire_readers(&self) {
        self.reader_generation.fetch_add(1, Ordering::SeqCst);
    }

    /// Waits up to `timeout` for input typed into the terminal and reads it into `buf`;
    /// `Ok(0)` when none came.
    pub fn read_input(&self, buf: &mut [u8], timeout: Duration) -> io::Result<usize> {
        let mut pfd = libc::pollfd {
            fd: self.master.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n <= 0 {
            return match io::Error::last_os_error() {
                e if n < 0 && e.kind() != io::ErrorKind::Interrupted => Err(e),
                _ => Ok(0),
            };
        }
        match (&self.master).read(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(e),
        }
    }
}

/// Reads what is typed into a [`Pty`] for one boot's console (see [`Pty::reader`]).
pub struct PtyReader {
    pty: Arc<Pty>,
    generation: u64,
}

impl Read for PtyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.pty.reader_generation.load(Ordering::SeqCst) != self.generation {
                return Ok(0);
            }
            match self.pty.read_input(buf, READ_TICK)? {
                0 => continue,
                n => return Ok(n),
            }
        }
    }
}

/// Writes into a [`Pty`]; output that does not fit (no reader for a while) is dropped.
pub struct PtyWriter(Arc<Pty>);

impl Write for PtyWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match (&self.0.master).write(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(buf.len()),
            Err(e) => Err(e),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_reaches_the_slave_unchanged_and_input_comes_back() {
        let pty = Arc::new(Pty::open().unwrap());
        assert!(
            pty.path().starts_with("/dev/pts"),
            "{}",
            pty.path().display()
        );
        let mut client = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(pty.path())
            .unwrap();
        let mut w = pty.writer();
        // Raw mode: \n stays \n (no \r\n), nothing is echoed back to the master.
        w.write_all(b"line one\nline two\n").unwrap();
        let mut got = vec![0u8; 18];
        client.read_exact(&mut got).unwrap();
        assert_eq!(got, b"line one\nline two\n");
        client.write_all(b"typed").unwrap();
        let mut buf = [0u8; 16];
        let mut n = 0;
        for _ in 0..50 {
            n += pty
                .read_input(&mut buf[n..], Duration::from_millis(100))
                .unwrap();
            if n >= 5 {
                break;
            }
        }
        assert_eq!(&buf[..n], b"typed");
    }

    #[test]
    fn a_new_reader_retires_the_previous_one() {
        let pty = Arc::new(Pty::open().unwrap());
        let mut first = pty.reader();
        let mut second = pty.reader();
        let mut buf = [0u8; 8];
        assert_eq!(first.read(&mut buf).unwrap(), 0, "retired: end of file");
        let mut client = std::fs::OpenOptions::new()
            .write(true)
            .open(pty.path())
            .unwrap();
        client.write_all(b"k").unwrap();
        assert_eq!(second.read(&mut buf).unwrap(), 1);
        assert_eq!(buf[0], b'k');
        pty.retire_readers();
        assert_eq!(second.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn a_full_terminal_drops_output_instead_of_blocking() {
        let pty = Arc::new(Pty::open().unwrap());
        let mut w = pty.writer();
        let chunk = [b'x'; 4096];
        for _ in 0..64 {
            w.write_all(&chunk).unwrap();
        }
    }
}
