//! `farvm api` (and farvm started as `cloud-hypervisor --api-socket ...`, as libvirt's ch driver
//! starts it): serve the Cloud-Hypervisor-compatible API for one VM until `vmm.shutdown` or
//! SIGTERM.
//!
//! The VM's name comes from the socket: libvirt binds `<stateDir>/<name>-socket` and passes the
//! listening fd, so the name is read back from the fd's address. Each `vm.create` loads the host
//! config (`/etc/farvm/farvm.toml` or `$FARVM_CONFIG`) and applies the domain's
//! `[domain."NAME"]` section or `[defaults]`: that is how VMs started by libvirt get their
//! remote-memory settings, since libvirt's ch driver passes no `<metadata>`.

use std::os::fd::RawFd;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{ArgAction, Args, Parser};
use farvm_httpd::{HttpError, Listen};
use farvm_vmm::api::factory::HostFactory;
use farvm_vmm::api::{ApiServer, EventMonitor};
use farvm_vmm::{exit_code, signals};

use super::Failure;

pub const API_ABOUT: &str = "\
Serve Cloud Hypervisor's REST API (the part libvirt uses) for one VM.

libvirt's Cloud Hypervisor driver (virtchd) starts its VMM as `cloud-hypervisor --api-socket
fd=N`: put farvm on its PATH under that name (or name it in the domain's <emulator>) and
libvirt runs farvm VMs. `farvm api` is the same server under farvm's own name.

The API (HTTP/1.1, base /api/v1/): PUT vm.create (Cloud Hypervisor's VmConfig JSON: cpus,
memory, kernel, cmdline, initramfs, console, serial; devices farvm does not have are refused
with 400), PUT vm.boot, GET vm.info, GET vm.counters (exits, paging, guest processes), PUT
vm.pause, vm.resume, vm.shutdown, vm.reboot, vm.delete, GET vmm.ping, PUT vmm.shutdown (stops
the VM and exits). Errors are Cloud Hypervisor's: 400 bad request or configuration, 404 no VM
created, 405 wrong state, 500 host failure, with a JSON array of messages.

A console or serial port in mode Pty is a pseudo-terminal connected to the VM's 16550 UART;
vm.info reports its path as `file`.

REMOTE MEMORY
The VM's name is taken from the socket (libvirt binds <stateDir>/<name>-socket; a path ending
in .sock works too) unless --name is given. Each vm.create reads the host config
(/etc/farvm/farvm.toml, or the file $FARVM_CONFIG names) and applies its [domain.\"NAME\"]
section, else its [defaults], else farvm's defaults (embedded memory server, 50% local).

LIVE MIGRATION
PUT vm.send-migration {\"destination_url\": \"tcp:HOST:PORT\"} live-migrates the running pool VM
to the farvm API server that got PUT vm.receive-migration {\"receiver_url\":
\"tcp:ADDRESS:PORT\"} (with no VM created there) on that address: resident pages are copied
while the guest runs, remote pages stay in the pool, the destination takes the VM's namespace
over and runs it, and the VM stops here. Both requests are answered once the VM runs at the
destination (or failed: the source keeps the VM). The stream is sealed with the key in the
host config's migration_key_file (32 bytes or 64 hex digits, mode 0600 or 0400, the same key
on both hosts); without one both endpoints answer 500. TCP only: unix: URLs answer 400.

EXAMPLES
  farvm api --api-socket path=/run/farvm/web-1.sock
  curl --unix-socket /run/farvm/web-1.sock -X PUT http://localhost/api/v1/vm.create \\
       -d '{\"cpus\":{\"boot_vcpus\":1,\"max_vcpus\":1},\"memory\":{\"size\":268435456},
            \"kernel\":{\"path\":\"/var/lib/farvm/farvm-testguest.elf\"},
            \"cmdline\":{\"args\":\"farvm.workload=seq:ws=64M\"}}'
  curl --unix-socket /run/farvm/web-1.sock -X PUT http://localhost/api/v1/vm.boot
  ch-remote --api-socket /run/farvm/web-1.sock receive-migration tcp:0.0.0.0:6000  (host B)
  ch-remote --api-socket /run/farvm/web-1.sock send-migration tcp:host-b:6000      (host A)

EXIT STATUS
  0        vmm.shutdown
  64       bad arguments
  71       the socket cannot be served
  130/143  SIGINT/SIGTERM (the VM was stopped first)
  159      a thread made a system call its seccomp filter forbids (--seccomp on); stderr names
           the thread, its class and the call";

/// Where events go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventTarget {
    Path(PathBuf),
    Fd(RawFd),
}

#[derive(Args, Debug)]
pub struct ApiArgs {
    /// The API socket: fd=N (a listening Unix socket handed over, as libvirt does) or
    /// path=PATH (farvm binds it; a bare PATH works too).
    #[arg(long, value_name = "fd=N|path=PATH", value_parser = parse_api_socket)]
    pub api_socket: Listen,

    /// Write lifecycle events (booted, paused, shutdown ...) here as JSON records, as Cloud
    /// Hypervisor does: path=PATH (a file or FIFO) or fd=N.
    #[arg(long, value_name = "path=PATH|fd=N", value_parser = parse_event_monitor)]
    pub event_monitor: Option<EventTarget>,

    /// The VM's name [default: from the socket's file name].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,

    /// More log output on stderr (-v info, -vv debug, -vvv trace; FARVM_LOG overrides).
    #[arg(short = 'v', action = ArgAction::Count)]
    pub verbose: u8,

    #[command(flatten)]
    pub sandbox: super::SeccompArgs,
}

/// farvm's command line under the name `cloud-hypervisor`.
#[derive(Parser, Debug)]
#[command(name = "cloud-hypervisor", about = "farvm answering as Cloud Hypervisor (the API server of `farvm api`)", long_about = API_ABOUT)]
struct CloudHypervisorCli {
    #[command(flatten)]
    api: ApiArgs,
}

fn parse_api_socket(s: &str) -> Result<Listen, String> {
    if let Some(fd) = s.strip_prefix("fd=") {
        return fd
            .parse::<RawFd>()
            .ok()
            .filter(|&fd| fd >= 0)
            .map(Listen::Fd)
            .ok_or_else(|| format!("`{s}`: fd= takes a file descriptor number"));
    }
    let path = s.strip_prefix("path=").unwrap_or(s);
    if path.is_empty() || path.contains(',') || path.contains('=') {
        return Err(format!("`{s}`: expected fd=N or path=PATH"));
    }
    Ok(Listen::Unix(PathBuf::from(path)))
}

fn parse_event_monitor(s: &str) -> Result<EventTarget, String> {
    if let Some(fd) = s.strip_prefix("fd=") {
        return fd
            .parse::<RawFd>()
            .ok()
            .filter(|&fd| fd >= 0)
            .map(EventTarget::Fd)
            .ok_or_else(|| format!("`{s}`: fd= takes a file descriptor number"));
    }
    match s.strip_prefix("path=") {
        Some(p) if !p.is_empty() => Ok(EventTarget::Path(PathBuf::from(p))),
        _ => Err(format!("`{s}`: expected path=PATH or fd=N")),
    }
}

/// The VM name a socket path stands for: `NAME-socket` (libvirt's), `NAME.sock`, `NAME.socket`.
pub fn name_from_socket(path: &Path) -> Option<String> {
    let file = path.file_name()?.to_str()?;
    let name = ["-socket", ".socket", ".sock"]
        .iter()
        .find_map(|suffix| file.strip_suffix(suffix))?;
    (!name.is_empty()).then(|| name.to_string())
}

fn init_logging(verbose: u8) {
    let filter = std::env::var("FARVM_LOG").unwrap_or_else(|_| {
        match verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
        .into()
    });
    // Colours only on a terminal: libvirt sends the VMM's output to the domain's log file.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Runs the API server until `vmm.shutdown` or a termination signal; returns the exit status.
pub fn run(a: ApiArgs) -> Result<i32> {
    let usage = |m: String| Failure::new(exit_code::USAGE, m);
    let host = |m: String| Failure::new(exit_code::HOST_ERROR, m);
    super::start_sandbox(a.sandbox.seccomp)?;
    signals::install_termination_handlers().map_err(|e| host(format!("signal handlers: {e}")))?;
    let name = match &a.name {
        Some(n) => n.clone(),
        None => a
            .api_socket
            .unix_path()
            .as_deref()
            .and_then(name_from_socket)
            .unwrap_or_else(|| format!("farvm-{}", std::process::id())),
    };
    if name.is_empty() || name.contains('/') {
        return Err(usage(format!(
            "invalid VM name `{name}`: must be non-empty and contain no `/`"
        ))
        .into());
    }
    let events = match &a.event_monitor {
        None => None,
        Some(EventTarget::Path(p)) => Some(EventMonitor::open(p).map_err(|e| {
            host(format!(
                "cannot open the event monitor {}: {e}",
                p.display()
            ))
        })?),
        // SAFETY: the fd was handed to this process on its command line for this purpose;
        // nothing else in the process uses it.
        Some(EventTarget::Fd(fd)) => Some(
            unsafe { EventMonitor::from_fd(*fd) }
                .map_err(|e| host(format!("cannot use event monitor fd {fd}: {e}")))?,
        ),
    };
    let server = ApiServer::start(&a.api_socket, name.clone(), Box::new(HostFactory), events)
        .map_err(|e| match e {
            HttpError::NotAListener { .. } | HttpError::BadListen(_) => usage(e.to_string()),
            other => host(other.to_string()),
        })?;
    tracing::info!(
        vm = name,
        "API server on {}",
        server.addr().map(|a| a.to_string()).unwrap_or_default()
    );
    let by_request = server.wait(true);
    server.shutdown();
    Ok(match (by_request, signals::termination_requested()) {
        (true, _) | (false, None) => exit_code::OK,
        (false, Some(sig)) => 128 + sig,
    })
}

/// `cloud-hypervisor ARGS` (not `--version`, which `cloud_hypervisor::answer` handles): parses
/// them as the API server's options and runs it.
pub fn run_as_cloud_hypervisor(args: &[std::ffi::OsString]) -> i32 {
    let cli: CloudHypervisorCli = exit_code::parse_args_from(args.iter().cloned());
    init_logging(cli.api.verbose);
    match run(cli.api) {
        Ok(code) => code,
        Err(err) => {
            eprintln!(
                "cloud-hypervisor (farvm): error: {}",
                exit_code::error_chain(&*err)
            );
            err.downcast_ref::<Failure>().map_or(1, |f| f.code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_and_event_monitor_syntax() {
        assert_eq!(parse_api_socket("fd=15"), Ok(Listen::Fd(15)));
        assert_eq!(
            parse_api_socket("path=/run/x.sock"),
            Ok(Listen::Unix("/run/x.sock".into()))
        );
        assert_eq!(
            parse_api_socket("/run/x.sock"),
            Ok(Listen::Unix("/run/x.sock".into()))
        );
        for bad in ["fd=", "fd=x", "fd=-1", "path=", "", "path=/a,fd=3"] {
            assert!(parse_api_socket(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_event_monitor("path=/run/ev"),
            Ok(EventTarget::Path("/run/ev".into()))
        );
        assert_eq!(parse_event_monitor("fd=4"), Ok(EventTarget::Fd(4)));
        assert!(parse_event_monitor("/run/ev").is_err());
    }

    #[test]
    fn names_come_from_libvirts_socket_names() {
        let n = |p: &str| name_from_socket(Path::new(p));
        assert_eq!(
            n("/run/user/0/libvirt/ch/run/web-1-socket").as_deref(),
            Some("web-1")
        );
        assert_eq!(n("/run/farvm/db.sock").as_deref(), Some("db"));
        assert_eq!(n("/run/farvm/-socket"), None);
        assert_eq!(n("/run/farvm/api"), None);
    }
}
