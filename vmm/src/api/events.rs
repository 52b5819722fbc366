//! The event monitor (`--event-monitor path=P|fd=N`): lifecycle events written as Cloud
//! Hypervisor writes them (`farvm_chapi::event`), for managers that follow a VM through them
//! rather than by polling (libvirt releases that pass `--event-monitor` mark a domain shut off
//! on `vm`/`shutdown`). Writes never block the VMM: the file is non-blocking and a record that
//! does not fit is dropped.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

pub use farvm_chapi::event::Source;

/// Where events go.
pub struct EventMonitor {
    file: Mutex<File>,
    start: Instant,
    /// Whether the file is a FIFO or pipe (it has a reader to lose).
    pipe: bool,
}

impl EventMonitor {
    /// Opens (creates, truncates) `path`; a FIFO's open waits for its reader, as Cloud
    /// Hypervisor's does.
    pub fn open(path: &Path) -> io::Result<Self> {
        let f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        Self::from_file(f)
    }

    /// Takes over an inherited, writable `fd`.
    ///
    /// # Safety
    /// `fd` must be an open file descriptor that nothing else in this process owns.
    pub unsafe fn from_fd(fd: RawFd) -> io::Result<Self> {
        // SAFETY: the caller hands the fd over.
        Self::from_file(unsafe { File::from_raw_fd(fd) })
    }

    fn from_file(f: File) -> io::Result<Self> {
        // SAFETY: fcntl on an fd `f` owns.
        unsafe {
            let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
            if flags < 0 || libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) < 0
            {
                return Err(io::Error::last_os_error());
            }
        }
        let pipe = f.metadata()?.file_type().is_fifo();
        Ok(EventMonitor {
            file: Mutex::new(f),
            start: Instant::now(),
            pipe,
        })
    }

    /// Whether the monitor is a pipe or FIFO whose reader has closed it (`poll` reports an
    /// error on the write end of a pipe without readers; never on a regular file). libvirt
    /// closes its end whenever it stops watching the domain — shut off, destroyed — and that is
    /// the VMM's cue to end: the driver daemonizes its VMM and cannot signal it itself.
    pub fn reader_gone(&self) -> bool {
        let f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        let mut p = libc::pollfd {
            fd: f.as_raw_fd(),
            events: 0,
            revents: 0,
        };
        // SAFETY: poll(2) on one pollfd naming an fd `f` owns, without waiting.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLERR | libc::POLLHUP) != 0
    }

    /// Writes a newline (whitespace between records, which JSON readers skip) on a FIFO or
    /// pipe. A reader that closed its end while a thread of its own was blocked reading it (as
    /// libvirt does when it destroys a domain) keeps the pipe open until that read returns;
    /// this makes it return, so that [`EventMonitor::reader_gone`] can see the reader go.
    pub fn keepalive(&self) {
        if !self.pipe {
            return;
        }
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        // A full pipe (EAGAIN) or a gone reader (EPIPE): nothing to do.
        let _ = write_without_sigpipe(&mut f, b"\n");
    }

    /// Writes one event.
    pub fn emit(&self, source: Source, event: &str) {
        tracing::info!(?source, event, "event");
        let record = farvm_chapi::event::record(self.start.elapsed(), source, event);
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = write_without_sigpipe(&mut f, record.as_bytes()) {
            tracing::debug!("event monitor: {event} not written: {e}");
        }
    }
}

/// Writes `bytes` to `f`; a pipe without a reader fails the write with EPIPE instead of ending
/// the process (farvm restores SIGPIPE's default action for its command-line output): SIGPIPE
/// is blocked in this thread for the write and the one it raised is taken back before the
/// thread's mask is restored.
fn write_without_sigpipe(f: &mut File, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: sigset_t is plain data that sigemptyset initialises; pthread_sigmask,
    // sigpending and sigtimedwait only read and write the sets given, for this thread.
    unsafe {
        let mut pipe: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pipe);
        libc::sigaddset(&mut pipe, libc::SIGPIPE);
        let mut old: libc::sigset_t = std::mem::zeroed();
        if libc::pthread_sigmask(libc::SIG_BLOCK, &pipe, &mut old) != 0 {
            return f.write_all(bytes);
        }
        let mut pending: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut pending);
        libc::sigpending(&mut pending);
        let already = libc::sigismember(&pending, libc::SIGPIPE) == 1;
        let result = f.write_all(bytes);
        if !already && matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EPIPE)) {
            let now = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            libc::sigtimedwait(&pipe, std::ptr::null_mut(), &now);
        }
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_appended_as_json_records() {
        let dir = std::env::temp_dir().join(format!("farvm-events-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("events");
        let m = EventMonitor::open(&path).unwrap();
        m.emit(Source::Vm, "booted");
        m.emit(Source::Vm, "shutdown");
        let text = std::fs::read_to_string(&path).unwrap();
        let events: Vec<serde_json::Value> = text
            .split("\n\n")
            .filter(|r| !r.trim().is_empty())
            .map(|r| serde_json::from_str(r).unwrap())
            .collect();
        assert_eq!(events.len(), 2, "{text}");
        assert_eq!(events[0]["event"], "booted");
        assert_eq!(events[1]["source"], "vm");
        assert!(!m.reader_gone(), "a regular file has no reader to lose");
        m.keepalive();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            text,
            "no keepalive in a regular file"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_pipe_whose_reader_closed_it_is_noticed() {
        let mut fds = [0; 2];
        // SAFETY: pipe(2) fills the two-element array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: fds[1] is the new pipe's write end, owned by nothing else.
        let m = unsafe { EventMonitor::from_fd(fds[1]) }.unwrap();
        m.emit(Source::Vmm, "starting");
        m.keepalive();
        assert!(!m.reader_gone(), "the reader is still there");
        let mut buf = [0u8; 512];
        // SAFETY: read(2) into a buffer of the given length from the read end this test owns.
        let n = unsafe { libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len()) };
        assert!(n > 0);
        let text = std::str::from_utf8(&buf[..n as usize]).unwrap();
        assert!(
            text.ends_with("}\n\n\n"),
            "a record, then the keepalive: {text:?}"
        );
        // SAFETY: closing the read end this test owns.
        unsafe { libc::close(fds[0]) };
        assert!(m.reader_gone());
        // Writing without a reader fails quietly (EPIPE), even with SIGPIPE's default action
        // (farvm's; this test process would die of it otherwise).
        // SAFETY: signal(2) with SIG_DFL, as farvm's main does.
        let before = unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        m.emit(Source::Vm, "shutdown");
        // SAFETY: restores the disposition read above.
        unsafe { libc::signal(libc::SIGPIPE, before) };
    }
}
