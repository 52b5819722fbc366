//! Process signals: the vCPU kick signal (sets `kvm_run.immediate_exit` on the receiving vCPU
//! thread so KVM_RUN returns at once), SIGINT/SIGTERM turned into a clean VM shutdown, and
//! SIGPIPE as command-line tools expect it — except in a VMM, whose sockets must fail a write to
//! a peer that went away rather than kill the VM.

use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

use kvm_bindings::kvm_run;

thread_local! {
    /// This thread's `kvm_run` while it runs a vCPU (null otherwise). Const-initialized so the
    /// signal handler's access is a plain TLS load.
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

/// The signal used to kick vCPU threads out of KVM_RUN.
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 1
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let p = KVM_RUN.with(|c| c.get());
    if !p.is_null() {
        // SAFETY: `p` is this thread's live kvm_run mapping (set by `set_thread_kvm_run` and
        // cleared before the vCPU fd is dropped); a volatile byte store is async-signal-safe.
        unsafe { std::ptr::addr_of_mut!((*p).immediate_exit).write_volatile(1) };
    }
}

/// Registers this thread's `kvm_run` (or null) for the kick handler.
pub fn set_thread_kvm_run(p: *mut kvm_run) {
    KVM_RUN.with(|c| c.set(p));
}

fn install(sig: libc::c_int, handler: usize) -> io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid value; we set the handler and flags explicitly,
    // and `sigaction` only reads it. No SA_RESTART so KVM_RUN returns EINTR.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = handler;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Installs the kick handler (idempotent).
pub fn install_kick_handler() -> io::Result<()> {
    install(kick_signal(), on_kick as *const () as usize)
}

/// Sends the kick signal to a thread.
pub fn kick(thread: libc::pthread_t) {
    // SAFETY: `thread` is a joinable (not yet joined) thread of this process, so the id is valid.
    unsafe { libc::pthread_kill(thread, kick_signal()) };
}

static TERMINATION: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_terminate(sig: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    TERMINATION.store(sig, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM request a clean shutdown instead of killing the process.
pub fn install_termination_handlers() -> io::Result<()> {
    install(libc::SIGINT, on_terminate as *const () as usize)?;
    install(libc::SIGTERM, on_terminate as *const () as usize)
}

/// Makes a write to a closed pipe end the process quietly by SIGPIPE, as other command-line
/// tools do (`farvm run | head`), instead of failing the write (Rust ignores SIGPIPE by
/// default) and panicking in `println!`.
pub fn default_sigpipe() {
    // SAFETY: setting a signal disposition to the default has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

/// Makes a write to a closed pipe or socket fail with EPIPE instead of killing the process: for
/// a running VMM (`farvm run`, `farvm api`, farvm as `cloud-hypervisor`), whose connections to
/// memory servers, etcd and API clients can be closed by the other side at any moment and
/// whose vectored socket writes (`writev`) cannot ask for MSG_NOSIGNAL. A console whose reader
/// went away (`farvm run | head`) then gets write errors, and the VM runs on.
pub fn ignore_sigpipe() {
    // SAFETY: setting a signal disposition to "ignore" has no preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// The termination signal received so far, if any.
pub fn termination_requested() -> Option<i32> {
    match TERMINATION.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}
