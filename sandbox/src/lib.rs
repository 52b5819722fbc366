//! farvm-sandbox: seccomp filters per thread class, for the VMM and the memory server
//! (docs/security.md).
//!
//! It owns the thread classes ([`ThreadClass`]), each class's list of system calls
//! (`syscalls.rs`, compiled to BPF with rust-vmm's `seccompiler`), the `--seccomp` modes
//! ([`Mode`]) and the SIGSYS handler that names a forbidden call (`sigsys.rs`).
//!
//! A process calls [`start`] on its main thread before it spawns any thread: that installs
//! the process's filter (a list of calls nobody in it may make), which every later thread
//! inherits, and compiles every thread class's filter. The code that names a thread calls
//! [`enter`] first thing on it: that adds the class's filter (the calls it needs, nothing
//! else); filters stack and the strictest answer wins. Before [`start`], or with
//! [`Mode::Off`], [`enter`] does nothing: a library's threads in tests and benchmarks run
//! unfiltered unless their process asked for filters.
//!
//! Filters are built for x86-64 (the host and the labs); elsewhere [`start`] refuses any mode
//! but `off`.

mod class;
mod mode;
mod sigsys;
#[cfg(target_arch = "x86_64")]
mod syscall_names;
#[cfg(target_arch = "x86_64")]
mod syscalls;

pub use class::ThreadClass;
pub use mode::{BadMode, Mode};

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// The exit status of a process ended by a forbidden call, or by a thread that could not
/// install its filter: 128 + SIGSYS (31), what a shell reports for a process SIGSYS killed.
pub const EXIT_STATUS: i32 = 159;

/// The environment variable of the self-test: a thread entering the class it names
/// ([`ThreadClass::name`]) calls `execve` right after its filter is installed, which no
/// thread class allows. The tests use it to prove a forbidden call ends the process with the
/// message; with `--seccomp off` the call fails harmlessly (null arguments, EFAULT).
pub const SELFTEST_ENV: &str = "FARVM_SANDBOX_SELFTEST";

/// Why filters could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// This architecture has no filters.
    #[error("seccomp filters exist for x86-64 only, not {0} (use --seccomp off)")]
    Unsupported(&'static str),
    /// A filter did not compile (a bug in the lists).
    #[cfg(target_arch = "x86_64")]
    #[error("building the {class} seccomp filter: {source}")]
    Build {
        /// The class whose filter failed.
        class: &'static str,
        /// seccompiler's error.
        source: seccompiler::BackendError,
    },
    /// The kernel refused the filter.
    #[cfg(target_arch = "x86_64")]
    #[error("installing the {class} seccomp filter: {source}")]
    Install {
        /// The class whose filter failed.
        class: &'static str,
        /// seccompiler's error.
        source: seccompiler::Error,
    },
    /// The SIGSYS handler could not be installed.
    #[error("installing the SIGSYS handler: {0}")]
    Handler(std::io::Error),
    /// [`start_from_env`] failed (the mode's variable or [`start`]'s error, as text).
    #[error("seccomp: {0}")]
    FromEnv(String),
    /// [`start`] ran twice in one process.
    #[error("the seccomp filters of this process are already started")]
    AlreadyStarted,
}

/// The process's mode, `Mode as u8 + 1`; 0: not started (same as off).
static MODE: AtomicU8 = AtomicU8::new(0);
/// The class [`SELFTEST_ENV`] names, `class as u8 + 1`; 0: none.
static SELFTEST: AtomicU8 = AtomicU8::new(0);

/// The compiled filter of every thread class, indexed by `ThreadClass as usize`.
#[cfg(target_arch = "x86_64")]
static PROGRAMS: OnceLock<Vec<seccompiler::BpfProgram>> = OnceLock::new();
#[cfg(not(target_arch = "x86_64"))]
static PROGRAMS: OnceLock<()> = OnceLock::new();

/// The mode [`start`] set ([`Mode::Off`] before it).
pub fn mode() -> Mode {
    match MODE.load(Ordering::Relaxed) {
        2 => Mode::Log,
        3 => Mode::On,
        _ => Mode::Off,
    }
}

/// Starts filtering this process in `mode`: on the calling thread (the main thread, before
/// any other exists) installs the process filter `class` ([`ThreadClass::Vmm`] or
/// [`ThreadClass::MemServer`]) and, in [`Mode::On`], the SIGSYS handler that names a
/// forbidden call in messages beginning with `program`. With [`Mode::Off`] it only records
/// the mode.
pub fn start(program: &'static str, mode: Mode, class: ThreadClass) -> Result<(), SandboxError> {
    if mode == Mode::Off {
        MODE.store(Mode::Off as u8 + 1, Ordering::Relaxed);
        return Ok(());
    }
    if !cfg!(target_arch = "x86_64") {
        return Err(SandboxError::Unsupported(std::env::consts::ARCH));
    }
    let programs = compile(mode)?;
    if PROGRAMS.set(programs).is_err() {
        return Err(SandboxError::AlreadyStarted);
    }
    if let Some(c) = std::env::var(SELFTEST_ENV)
        .ok()
        .and_then(|n| ThreadClass::from_name(&n))
    {
        SELFTEST.store(c as u8 + 1, Ordering::Relaxed);
    }
    if mode == Mode::On {
        sigsys::install(program, class).map_err(SandboxError::Handler)?;
    }
    MODE.store(mode as u8 + 1, Ordering::Relaxed);
    apply(class)
}

/// The environment variable a test process reads its mode from ([`start_from_env`]).
pub const MODE_ENV: &str = "FARVM_SECCOMP";

/// [`start`] for a process that runs VMs or servers in-process (the integration tests): the
/// mode from [`MODE_ENV`] (default on; a bad value is an error naming it), the process filter
/// on the calling thread only (others already run), every thread class's filter on the
/// threads that enter one afterwards. A second call does nothing.
pub fn start_from_env(program: &'static str, class: ThreadClass) -> Result<Mode, SandboxError> {
    static STARTED: OnceLock<Result<Mode, String>> = OnceLock::new();
    let r = STARTED.get_or_init(|| {
        let mode = match std::env::var(MODE_ENV) {
            Ok(v) => v.parse::<Mode>().map_err(|e| format!("{MODE_ENV}: {e}"))?,
            Err(_) => Mode::On,
        };
        start(program, mode, class).map_err(|e| e.to_string())?;
        Ok(mode)
    });
    r.clone().map_err(SandboxError::FromEnv)
}

/// [`start_from_env`] for a test harness: the process filter goes on a helper thread that
/// ends at once, so the harness's own threads, and what they run (`ip netns exec`, etcd), stay
/// unfiltered, while the VMs' threads started afterwards enter their classes. Idempotent; a
/// bad [`MODE_ENV`] or a filter that cannot be built is a panic naming it (a test's failure).
pub fn start_for_tests(program: &'static str) {
    let started = std::thread::spawn(move || start_from_env(program, ThreadClass::Vmm))
        .join()
        .expect("the sandbox's helper thread");
    if let Err(e) = started {
        panic!("{e}");
    }
}

/// Puts the calling thread in `class`: adds the class's filter to the process's (nothing
/// before [`start`] or with [`Mode::Off`]). Called first thing on a thread, by the code that
/// names it; threads it spawns afterwards inherit the filter. A thread that cannot install
/// its filter ends the process (status [`EXIT_STATUS`]) rather than run unfiltered.
pub fn enter(class: ThreadClass) {
    if mode() == Mode::Off {
        return;
    }
    if let Err(e) = apply(class) {
        eprintln!("seccomp: thread class {}: {e}", class.name());
        std::process::exit(EXIT_STATUS);
    }
    if SELFTEST.load(Ordering::Relaxed) == class as u8 + 1 {
        // SAFETY: execve with null arguments reads nothing: the filter traps it, or without
        // one the kernel fails it with EFAULT.
        unsafe {
            libc::syscall(
                libc::SYS_execve,
                std::ptr::null::<libc::c_char>(),
                std::ptr::null::<*const libc::c_char>(),
                std::ptr::null::<*const libc::c_char>(),
            )
        };
    }
}

/// Installs `class`'s compiled filter on the calling thread.
#[cfg(target_arch = "x86_64")]
fn apply(class: ThreadClass) -> Result<(), SandboxError> {
    let Some(programs) = PROGRAMS.get() else {
        return Ok(());
    };
    seccompiler::apply_filter(&programs[class as usize]).map_err(|source| {
        SandboxError::Install {
            class: class.name(),
            source,
        }
    })?;
    sigsys::set_thread_class(class);
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn apply(_class: ThreadClass) -> Result<(), SandboxError> {
    Err(SandboxError::Unsupported(std::env::consts::ARCH))
}

#[cfg(not(target_arch = "x86_64"))]
fn compile(_mode: Mode) -> Result<(), SandboxError> {
    Err(SandboxError::Unsupported(std::env::consts::ARCH))
}

/// Every class's filter for `mode`, indexed by class.
#[cfg(target_arch = "x86_64")]
fn compile(mode: Mode) -> Result<Vec<seccompiler::BpfProgram>, SandboxError> {
    ThreadClass::ALL
        .into_iter()
        .map(|class| program(class, mode))
        .collect()
}

/// `class`'s filter for `mode` ([`Mode::Log`] or [`Mode::On`]) as BPF.
#[cfg(target_arch = "x86_64")]
pub(crate) fn program(
    class: ThreadClass,
    mode: Mode,
) -> Result<seccompiler::BpfProgram, SandboxError> {
    use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
    let build = |source| SandboxError::Build {
        class: class.name(),
        source,
    };
    let denied = match mode {
        Mode::Log => SeccompAction::Log,
        _ => SeccompAction::Trap,
    };
    let (rules, mismatch, matched) = match syscalls::list(class).map_err(build)? {
        syscalls::List::Allowed(rules) => (rules, denied, SeccompAction::Allow),
        syscalls::List::Denied(rules) => (rules, SeccompAction::Allow, denied),
    };
    let filter = SeccompFilter::new(rules, mismatch, matched, TargetArch::x86_64).map_err(build)?;
    filter.try_into().map_err(build)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn every_class_compiles_in_both_modes() {
        for class in ThreadClass::ALL {
            for mode in [Mode::Log, Mode::On] {
                let p = program(class, mode).unwrap();
                assert!(!p.is_empty(), "{class:?}");
            }
        }
    }

    #[test]
    fn a_thread_started_by_a_filtered_thread_enters_its_own_class() {
        // The store connections' maintenance thread starts the threads of a server it
        // reconnects; they inherit its filter and must still install their own. (A denied
        // call here would kill the test process: nothing handles SIGSYS in it.)
        let outer = std::thread::spawn(|| {
            let p = program(ThreadClass::StoreConnection, Mode::On).unwrap();
            seccompiler::apply_filter(&p).unwrap();
            std::thread::spawn(|| {
                let p = program(ThreadClass::StoreConnection, Mode::On).unwrap();
                seccompiler::apply_filter(&p).is_ok()
            })
            .join()
            .unwrap()
        });
        assert!(
            outer.join().unwrap(),
            "the inner thread installed its filter"
        );
    }

    #[test]
    fn classes_are_indexed_by_their_value_and_named_uniquely() {
        for (i, c) in ThreadClass::ALL.into_iter().enumerate() {
            assert_eq!(c as usize, i);
            assert_eq!(ThreadClass::from_name(c.name()), Some(c));
        }
    }

    #[test]
    fn modes_parse_and_print() {
        for m in [Mode::Off, Mode::Log, Mode::On] {
            assert_eq!(m.as_str().parse::<Mode>(), Ok(m));
        }
        assert!("yes".parse::<Mode>().is_err());
    }

    #[test]
    fn the_name_table_knows_the_calls_in_messages() {
        assert_eq!(syscall_names::NAMES[libc::SYS_execve as usize], "execve");
        assert_eq!(syscall_names::NAMES[libc::SYS_ptrace as usize], "ptrace");
    }
}
