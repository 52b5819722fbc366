//! The operator's terminal as the guest's console input: raw mode while the VM runs (every
//! key, Ctrl-C included, goes to the guest unechoed; the mode is restored when [`RawMode`] is
//! dropped), and an escape sequence the VMM keeps for itself, as QEMU's does: **Ctrl-A x**
//! stops the VM, **Ctrl-A Ctrl-A** sends one Ctrl-A to the guest; Ctrl-A followed by anything
//! else sends both keys.

use std::io::{self, IsTerminal, Read};
use std::os::fd::AsRawFd;

/// The escape key (Ctrl-A).
pub const ESCAPE: u8 = 0x01;
/// The key that, after [`ESCAPE`], stops the VM.
pub const ESCAPE_STOP: u8 = b'x';
/// One line for the operator.
pub const ESCAPE_HELP: &str = "console input from this terminal: Ctrl-A x stops the VM, \
                               Ctrl-A Ctrl-A sends Ctrl-A";

/// Whether the VMM's stdin is a terminal (then console input from stdin is interactive: raw
/// mode and the escape sequence apply).
pub fn stdin_is_terminal() -> bool {
    io::stdin().is_terminal()
}

/// A terminal in raw input mode; the previous mode is restored on drop. Output processing
/// stays on, so the VMM's own messages still start at the left margin.
pub struct RawMode {
    fd: i32,
    saved: libc::termios,
}

impl RawMode {
    /// Puts stdin in raw mode if it is a terminal (`None` if it is not).
    pub fn stdin() -> io::Result<Option<Self>> {
        if !stdin_is_terminal() {
            return Ok(None);
        }
        let fd = io::stdin().as_raw_fd();
        // SAFETY: termios is plain data; tcgetattr fills it for a terminal fd we checked.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is stdin, open for the process's lifetime; `saved` is a valid termios.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let mut raw = saved;
        // SAFETY: cfmakeraw only rewrites the flags of the termios it is given.
        unsafe { libc::cfmakeraw(&mut raw) };
        raw.c_oflag |= libc::OPOST | libc::ONLCR;
        // SAFETY: as for tcgetattr; `raw` is a valid termios.
        if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Some(RawMode { fd, saved }))
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        // SAFETY: restores the attributes read from the same terminal fd in `stdin()`.
        unsafe { libc::tcsetattr(self.fd, libc::TCSANOW, &self.saved) };
    }
}

/// Console input with the escape sequence taken out: [`ESCAPE`] [`ESCAPE_STOP`] calls
/// `on_stop` and ends the input (end of file); the other bytes pass through.
pub struct EscapeFilter<R> {
    inner: R,
    on_stop: Box<dyn FnMut() + Send>,
    /// The last byte read was an escape, not yet passed on.
    pending_escape: bool,
    /// A byte that did not fit the caller's buffer (an escape passed on with the key after it
    /// makes one more byte than was read).
    held: Option<u8>,
    stopped: bool,
}

impl<R: Read> EscapeFilter<R> {
    /// Filters `inner`, calling `on_stop` when the operator types the escape sequence.
    pub fn new(inner: R, on_stop: impl FnMut() + Send + 'static) -> Self {
        EscapeFilter {
            inner,
            on_stop: Box::new(on_stop),
            pending_escape: false,
            held: None,
            stopped: false,
        }
    }
}

impl<R: Read> Read for EscapeFilter<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        if let Some(b) = self.held.take() {
            buf[0] = b;
            return Ok(1);
        }
        let mut raw = [0u8; 64];
        let want = buf.len().min(raw.len());
        loop {
            if self.stopped {
                return Ok(0);
            }
            let n = self.inner.read(&mut raw[..want])?;
            if n == 0 {
                if std::mem::take(&mut self.pending_escape) {
                    buf[0] = ESCAPE;
                    return Ok(1);
                }
                return Ok(0);
            }
            let mut out = 0;
            let mut emit = |b: u8, held: &mut Option<u8>| {
                if out < buf.len() {
                    buf[out] = b;
                    out += 1;
                } else {
                    *held = Some(b);
                }
            };
            for &b in &raw[..n] {
                if std::mem::take(&mut self.pending_escape) {
                    match b {
                        ESCAPE_STOP => {
                            self.stopped = true;
                            (self.on_stop)();
                            break;
                        }
                        ESCAPE => emit(ESCAPE, &mut self.held),
                        other => {
                            emit(ESCAPE, &mut self.held);
                            emit(other, &mut self.held);
                        }
                    }
                } else if b == ESCAPE {
                    self.pending_escape = true;
                } else {
                    emit(b, &mut self.held);
                }
            }
            if out > 0 {
                return Ok(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    /// Reads everything through the filter with reads of `chunk` bytes from the source.
    fn run(input: &[u8], chunk: usize, buf_len: usize) -> (Vec<u8>, u32) {
        struct Chunks<'a>(&'a [u8], usize);
        impl Read for Chunks<'_> {
            fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                let n = self.0.len().min(self.1).min(b.len());
                b[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let stops = Arc::new(AtomicU32::new(0));
        let s = stops.clone();
        let mut f = EscapeFilter::new(Chunks(input, chunk), move || {
            s.fetch_add(1, Ordering::SeqCst);
        });
        let mut out = Vec::new();
        let mut buf = vec![0u8; buf_len];
        loop {
            let n = f.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        (out, stops.load(Ordering::SeqCst))
    }

    #[test]
    fn plain_input_passes_through() {
        for (chunk, buf) in [(1, 64), (3, 64), (64, 64), (5, 2), (1, 1)] {
            assert_eq!(run(b"ls -l\r", chunk, buf), (b"ls -l\r".to_vec(), 0));
        }
    }

    #[test]
    fn ctrl_a_x_stops_and_ends_the_input() {
        for (chunk, buf) in [(1, 64), (2, 64), (64, 64), (64, 3), (1, 1)] {
            let (out, stops) = run(b"echo\x01xignored", chunk, buf);
            assert_eq!((out.as_slice(), stops), (&b"echo"[..], 1), "chunk {chunk}");
        }
    }

    #[test]
    fn doubled_escape_sends_one_and_other_keys_pass() {
        for (chunk, buf) in [(1, 64), (2, 64), (64, 64), (64, 2), (1, 1)] {
            let (out, stops) = run(b"a\x01\x01b\x01cd\x01", chunk, buf);
            assert_eq!(out, b"a\x01b\x01cd\x01", "chunk {chunk} buf {buf}");
            assert_eq!(stops, 0);
        }
    }
}
