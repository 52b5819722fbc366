//! The event monitor (`--event-monitor path=P|fd=N`): lifecycle events written as Cloud
//! Hypervisor writes them (`farvm_chapi::event`), for managers that follow a VM through them
//! rather than by polling (libvirt releases that pass `--event-monitor` mark a domain shut off
//! on `vm`/`shutdown`). Writes never block the VMM: the file is non-blocking and a record that
//! does not fit is dropped.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, RawFd};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

pub use farvm_chapi::event::Source;

/// Where events go.
pub struct EventMonitor {
    file: Mutex<File>,
    start: Instant,
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
        Ok(EventMonitor {
            file: Mutex::new(f),
            start: Instant::now(),
        })
    }

    /// Writes one event.
    pub fn emit(&self, source: Source, event: &str) {
        tracing::info!(?source, event, "event");
        let record = farvm_chapi::event::record(self.start.elapsed(), source, event);
        let mut f = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f.write_all(record.as_bytes()) {
            tracing::debug!("event monitor: {event} not written: {e}");
        }
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
        let _ = std::fs::remove_dir_all(&dir);
    }
}
