//! `farvm run` exit statuses (documented in `farvm run --help`, EXIT STATUS), and the error
//! line a failed command prints.

/// The guest shut down with status 0 (or the VM was shut down through its control socket, or
/// saved to a snapshot).
pub const OK: i32 = 0;
/// Guest statuses 1..=63 are passed through; larger ones are reported as this.
pub const GUEST_STATUS_MAX: i32 = 63;
/// Bad command-line arguments (EX_USAGE).
pub const USAGE: i32 = 64;
/// The kernel image (or initrd) is malformed or does not fit, or a snapshot is corrupt or from
/// another format version (EX_DATAERR).
pub const BAD_KERNEL: i32 = 65;
/// The kernel, initrd, a disk image or a snapshot cannot be read (EX_NOINPUT).
pub const NO_INPUT: i32 = 66;
/// The guest crashed: KVM internal error, triple fault, failed entry, bad MMIO, guest kernel
/// panic (EX_SOFTWARE).
pub const GUEST_CRASH: i32 = 70;
/// The memory pool cannot take the VM: no room for its replicas on distinct racks, or etcd did
/// not answer within `--pool-wait` (EX_UNAVAILABLE: a service the VM needs is not there).
pub const POOL_UNAVAILABLE: i32 = 69;
/// A host-side failure: /dev/kvm unusable, an ioctl failed, out of memory (EX_OSERR).
pub const HOST_ERROR: i32 = 71;
/// The guest needed a page whose data every memory server holding it lost, or the memory
/// pool reclaimed the VM's remote memory after its lease expired (EX_IOERR).
pub const MEMORY_LOST: i32 = 74;
/// The guest rebooted (the ACPI reset register); farvm stopped the VM rather than restart it
/// (EX_TEMPFAIL: run it again).
pub const GUEST_REBOOT: i32 = 75;
/// `--timeout` expired (as timeout(1)).
pub const TIMEOUT: i32 = 124;
/// A thread made a system call its seccomp filter forbids (`--seccomp on`); the message names
/// the thread, its class and the call (written by `farvm-sandbox`'s SIGSYS handler).
pub const SECCOMP_DENIED: i32 = farvm_sandbox::EXIT_STATUS;
/// SIGINT (128 + 2) and SIGTERM (128 + 15): the VM was shut down cleanly.
pub const SIGINT: i32 = 130;
/// See [`SIGINT`].
pub const SIGTERM: i32 = 143;

/// Parses the command line as `C`. `--help` and `--version` print and exit 0; bad arguments
/// print clap's message and exit [`USAGE`] (shared by the `farvm` and `farvm-lab` binaries).
pub fn parse_args<C: clap::Parser>() -> C {
    parse_args_from(std::env::args_os())
}

/// [`parse_args`] over the given arguments (the first is the program name).
pub fn parse_args_from<C: clap::Parser, I, T>(args: I) -> C
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    C::try_parse_from(args).unwrap_or_else(|e| {
        let code = match e.kind() {
            clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion => OK,
            _ => USAGE,
        };
        let _ = e.print();
        std::process::exit(code);
    })
}

/// The exit status for a finished VM.
pub fn for_outcome(o: &crate::vm::VmOutcome) -> i32 {
    use crate::vm::VmOutcome::*;
    match o {
        GuestShutdown { status } => (*status).min(GUEST_STATUS_MAX as u32) as i32,
        GuestReboot => GUEST_REBOOT,
        ConsoleEscape => SIGINT,
        ControlShutdown | Snapshotted { .. } | Migrated { .. } => OK,
        GuestPanic { .. } | Crash { .. } => GUEST_CRASH,
        HostError { .. } => HOST_ERROR,
        MemoryLost { .. } | MemoryReclaimed => MEMORY_LOST,
        Timeout { .. } => TIMEOUT,
        Signal { signal } => 128 + signal,
    }
}

/// The exit status for an error building the VM.
pub fn for_build_error(e: &crate::builder::BuildError) -> i32 {
    use crate::boot::BootError;
    use crate::builder::BuildError;
    use crate::devices::board::DeviceError;
    use crate::remote::RemoteError;
    match e {
        BuildError::Config(_)
        | BuildError::Remote(RemoteError::Config(_) | RemoteError::Token { .. }) => USAGE,
        BuildError::Remote(RemoteError::PoolUnavailable(_)) => POOL_UNAVAILABLE,
        // A pool snapshot whose namespace the pool no longer holds for it: as a missing one.
        BuildError::Remote(RemoteError::SnapshotGone(_)) => NO_INPUT,
        BuildError::Boot(BootError::Mem(_))
        | BuildError::Memory(_)
        | BuildError::Kvm(_)
        | BuildError::Io(_)
        | BuildError::Remote(_) => HOST_ERROR,
        BuildError::Boot(_) => BAD_KERNEL,
        BuildError::Devices(DeviceError::Disk(_)) => NO_INPUT,
        BuildError::Devices(_) => HOST_ERROR,
    }
}

/// The exit status for a snapshot that cannot be restored (`farvm run --restore`).
pub fn for_snapshot_error(e: &crate::snapshot::SnapshotError) -> i32 {
    use crate::snapshot::SnapshotError::*;
    match e {
        NotFound { .. } | Read { .. } => NO_INPUT,
        Corrupt { .. } | Version { .. } => BAD_KERNEL,
        Unsupported(_) | NoDescription | Exists { .. } | RestoreMode { .. } => USAGE,
        Key(_) | KeyMissing { .. } | KeyWrong { .. } => USAGE,
        Write { .. } | State(_) | Kvm(_) | Memory(_) | Device(_) | Pool(_) => HOST_ERROR,
    }
}

/// `err` and its causes, joined by ": " (what `{:#}` prints for an `anyhow::Error`), leaving out
/// a cause whose text ends the message already printed: an error that writes its source into
/// its own message would otherwise print it twice.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(Some(err), |e| e.source())
        .map(ToString::to_string)
        .fold(String::new(), |out, cause| match out {
            o if o.ends_with(&cause) => o,
            o if o.is_empty() => cause,
            o => o + ": " + &cause,
        })
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot start the local memory server: {0}")]
    struct Outer(#[from] Inner);

    #[derive(Debug, thiserror::Error)]
    #[error("the memory server binary /x does not exist")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    #[error("building the VM")]
    struct Context(#[source] Outer);

    #[test]
    fn a_cause_its_error_already_printed_is_printed_once() {
        let e = Context(Outer(Inner));
        assert_eq!(
            error_chain(&e),
            "building the VM: cannot start the local memory server: the memory server binary \
             /x does not exist"
        );
    }
}
