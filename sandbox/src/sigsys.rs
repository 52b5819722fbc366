//! The SIGSYS handler: a call a filter traps (`--seccomp on`) ends the process with one line
//! on stderr naming the program, the thread, its class and the call, and exit status
//! [`crate::EXIT_STATUS`]. Everything here is async-signal-safe: no allocation, no lock, raw
//! `write(2)` and `_exit(2)` (both allowed by every filter, as is `prctl(PR_GET_NAME)`).

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

use crate::{ThreadClass, EXIT_STATUS};

/// No class entered on this thread: it runs under its process's filter only.
const NO_CLASS: u8 = u8::MAX;

thread_local! {
    /// The class this thread entered (a const-initialized TLS cell without destructor: reading
    /// it is a plain load, safe in a signal handler).
    static THREAD_CLASS: Cell<u8> = const { Cell::new(NO_CLASS) };
}

/// The class of the process's own filter, for threads that entered none.
static PROCESS_CLASS: AtomicU8 = AtomicU8::new(NO_CLASS);
/// The program's name at the start of the message (`farvm`, `farvm-memserver`).
static PROGRAM: OnceLock<&'static str> = OnceLock::new();

/// Records the class the calling thread entered.
pub(crate) fn set_thread_class(class: ThreadClass) {
    THREAD_CLASS.with(|c| c.set(class as u8));
}

/// Installs the handler for a process whose filter is `class`, named `program` in messages.
pub(crate) fn install(program: &'static str, class: ThreadClass) -> std::io::Result<()> {
    let _ = PROGRAM.set(program);
    PROCESS_CLASS.store(class as u8, Ordering::Relaxed);
    // SAFETY: an all-zero sigaction is a valid value (no flags, empty mask) before the fields
    // below are set.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = on_sigsys as *const () as libc::sighandler_t;
    action.sa_flags = libc::SA_SIGINFO;
    // SAFETY: `action` is initialized; the handler is async-signal-safe (module doc) and has
    // the SA_SIGINFO signature; the old action is not wanted (null).
    let rc = unsafe { libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Offset of `si_syscall` in a SIGSYS `siginfo_t` on 64-bit Linux: signo, errno, code, the
/// union's padding to 8, then `_sigsys { void *_call_addr; int _syscall; unsigned _arch; }`.
const SI_SYSCALL_OFFSET: usize = 16 + 8;

extern "C" fn on_sigsys(_signal: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands a SIGSYS handler installed with SA_SIGINFO a valid siginfo_t
    // whose `_sigsys` member is filled for SECCOMP_RET_TRAP; the field is read unaligned-safe.
    let nr = unsafe {
        std::ptr::read_unaligned(
            info.cast::<u8>()
                .add(SI_SYSCALL_OFFSET)
                .cast::<libc::c_int>(),
        )
    };
    let mut thread = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes (NUL included) into the 17-byte buffer.
    unsafe { libc::prctl(libc::PR_GET_NAME, thread.as_mut_ptr()) };
    let thread_len = thread.iter().position(|&b| b == 0).unwrap_or(16);
    let class = match THREAD_CLASS.with(|c| c.get()) {
        NO_CLASS => PROCESS_CLASS.load(Ordering::Relaxed),
        c => c,
    };
    let mut m = Message::new();
    m.push(PROGRAM.get().copied().unwrap_or("farvm").as_bytes());
    m.push(b": seccomp: thread ");
    m.push(&thread[..thread_len]);
    m.push(b" (class ");
    let class_name = ThreadClass::ALL
        .get(usize::from(class))
        .map_or("none", |c| c.name());
    m.push(class_name.as_bytes());
    m.push(b") made the forbidden system call ");
    let name = usize::try_from(nr)
        .ok()
        .and_then(|n| crate::syscall_names::NAMES.get(n))
        .copied()
        .unwrap_or("");
    if name.is_empty() {
        m.push(b"number ");
    } else {
        m.push(name.as_bytes());
        m.push(b" (");
    }
    m.push_number(i64::from(nr));
    if !name.is_empty() {
        m.push(b")");
    }
    m.push(b"; exiting with status ");
    m.push_number(i64::from(EXIT_STATUS));
    m.push(b"\n");
    // SAFETY: writes the message's initialized bytes to stderr; `_exit` ends the process
    // without running anything else of it (the filter allows both calls on every thread).
    unsafe {
        libc::write(2, m.buf.as_ptr().cast(), m.len);
        libc::_exit(EXIT_STATUS);
    }
}

/// A fixed-size message built without allocating (longer text is cut).
struct Message {
    buf: [u8; 256],
    len: usize,
}

impl Message {
    fn new() -> Self {
        Message {
            buf: [0; 256],
            len: 0,
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
        self.len += n;
    }

    fn push_number(&mut self, v: i64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        let mut u = v.unsigned_abs();
        loop {
            i -= 1;
            digits[i] = b'0' + (u % 10) as u8;
            u /= 10;
            if u == 0 {
                break;
            }
        }
        if v < 0 {
            self.push(b"-");
        }
        self.push(&digits[i..]);
    }
}

#[cfg(test)]
mod tests {
    use super::Message;

    #[test]
    fn numbers_are_written_in_decimal() {
        let mut m = Message::new();
        m.push_number(0);
        m.push(b" ");
        m.push_number(159);
        m.push(b" ");
        m.push_number(-1);
        assert_eq!(&m.buf[..m.len], b"0 159 -1");
    }

    #[test]
    fn a_long_message_is_cut_not_overflowed() {
        let mut m = Message::new();
        for _ in 0..100 {
            m.push(b"abcdefgh");
        }
        assert_eq!(m.len, 256);
    }
}
