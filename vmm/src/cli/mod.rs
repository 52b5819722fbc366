//! One module per `farvm` subcommand.

pub mod api;
pub mod cloud_hypervisor;
pub mod control;
pub mod domain;
pub mod image;
pub mod incoming;
pub mod migrate;
pub mod paging;
pub mod restore;
pub mod run;
pub mod snapshot;

/// A failure with the exit status it maps to (see `farvm_vmm::exit_code`).
#[derive(Debug)]
pub struct Failure {
    pub code: i32,
    pub message: String,
}

impl Failure {
    pub fn new(code: i32, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// The `--seccomp` flag's help, shared by `run` and `api`.
pub const SECCOMP_HELP: &str = "Seccomp filters (docs/security.md). `on`: before the guest runs, \
every thread is confined to the system calls its class needs (vCPU, fault handler, evictor, \
store connections, devices, metrics; the main, API and control threads to everything but what \
farvm never does: ptrace, mount, module loading, …); a call outside its filter ends the VMM \
with one line on stderr naming the thread, its class and the call, exit status 159. The local \
memory server filters itself the same way. `log`: such a call is allowed and logged by the \
kernel (audit log or dmesg, type=1326), for finding a missing entry. `off`: no filter.";

/// The `--seccomp` flag of the VMM commands (`run`, `api`).
#[derive(clap::Args, Debug, Clone)]
pub struct SeccompArgs {
    /// Seccomp filters per thread class: on (a forbidden call ends the VMM, status 159), log, off.
    #[arg(
        long,
        value_name = "off|log|on",
        env = "FARVM_SECCOMP",
        default_value = "on",
        long_help = SECCOMP_HELP
    )]
    pub seccomp: farvm_sandbox::Mode,
}

/// Starts this process's seccomp filters (`--seccomp`): called first thing by a VMM command,
/// before any thread exists, so that every thread inherits the process filter.
pub fn start_sandbox(mode: farvm_sandbox::Mode) -> Result<(), Failure> {
    farvm_sandbox::start("farvm", mode, farvm_sandbox::ThreadClass::Vmm).map_err(|e| {
        Failure::new(
            farvm_vmm::exit_code::HOST_ERROR,
            format!("--seccomp {mode}: {e}"),
        )
    })
}
