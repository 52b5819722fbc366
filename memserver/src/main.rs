//! `farvm-memserver`: the memory server daemon and a token generator.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use farvm_memproto::auth::{load_token_file, Secret};
use farvm_memserver::pool_member::{is_refusal, PoolMember, PoolMemberConfig};
use farvm_memserver::server::{Server, ServerConfig};
use farvm_pool::{PoolError, RackId, ServerId};

/// farvm memory server: stores the remote part of VMs' RAM as 4 KiB pages per namespace
/// (VM id), served over a pipelined binary protocol (see memproto/PROTOCOL.md).
///
/// Without a subcommand it serves until killed. Pages live in one anonymous MAP_NORESERVE
/// arena of --capacity bytes; a write that would exceed it is refused with
/// CapacityExhausted (the server is never OOM-killed for it). Nothing is persisted.
///
/// Examples:
///   farvm-memserver --listen 0.0.0.0:7070 --capacity 64G --token-file /etc/farvm/tokens --metrics 127.0.0.1:9370
///   farvm-memserver --listen 0.0.0.0:7070 --advertise 10.77.1.11:7070 --capacity 64G \
///                   --pool http://10.77.0.2:2379 --rack r1 --pool-id ms-r1-a
///   farvm-memserver --listen 0.0.0.0:7070 --rdma 10.0.0.5:7071 --capacity 64G
///   farvm-memserver gen-token >> /etc/farvm/tokens
///
/// Exit status: 0 after a subcommand; 78 when the memory pool refuses the server (its --rack
/// is not declared: `farvm pool racks add RACK`); 159 when a thread made a system call its
/// seccomp filter forbids (--seccomp); 1 on any other error.
#[derive(Parser, Debug)]
#[command(
    name = "farvm-memserver",
    version,
    verbatim_doc_comment,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Address to listen on, e.g. 0.0.0.0:7070 (port 0 picks a free port; the bound address is logged).
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Also serve over RDMA: clients (`farvm run --memserver rdma://HOST:PORT`) open a TCP
    /// control connection to this address (handshake, queue-pair exchange), then send their
    /// requests over an RDMA reliable connection on the device that has a RoCE GID for it —
    /// so ADDR must be a specific address of the RDMA interface, not 0.0.0.0. Needs a build
    /// with the `rdma` feature and an RDMA device (Soft-RoCE: `modprobe rdma_rxe; rdma link
    /// add rxe0 type rxe netdev IFACE`). A connection whose local address has no RDMA device
    /// is refused and logged ("no RDMA device ...").
    #[arg(long, value_name = "ADDR")]
    rdma: Option<SocketAddr>,
    /// Arena size: bytes, or with a suffix K, M, G, T (powers of 1024), e.g. 64G.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    capacity: Option<u64>,
    /// Token file: one hex secret (≥ 16 bytes) per line, `#` comments. Each secret is a
    /// tenant; a namespace belongs to the tenant that first wrote it. Without this option
    /// the server runs in open mode: no authentication, one anonymous tenant.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Serve Prometheus metrics (OpenMetrics text) at `GET /metrics` on this address.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Pin every thread that serves a client connection to this host CPU (the server's half
    /// of a VMM's fault path; `farvm run --fault-path-cpu N` passes it to the memory server it
    /// starts). Other threads stay unpinned.
    #[arg(long, value_name = "CPU")]
    connection_cpu: Option<usize>,
    /// Join a memory pool: register this server in the etcd directory at these client URLs
    /// (comma-separated or repeated, e.g. http://10.77.0.2:2379) under a lease kept alive,
    /// keep its used bytes current there, and drop the namespaces of VMs that left the pool
    /// (lease expired, or released at exit). Needs --rack. Serving never waits on etcd; while
    /// etcd does not answer, registration is retried.
    #[arg(
        long,
        value_name = "URLS",
        value_delimiter = ',',
        env = "FARVM_POOL",
        requires = "rack"
    )]
    pool: Vec<String>,
    /// The rack (failure domain) of this server in the pool: a slab's replicas go to distinct
    /// racks. It must be one the pool declares (`farvm pool racks add RACK`): the pool refuses
    /// a server of any other rack, and the server then exits with status 78 naming the
    /// declared racks (at start, or when etcd first answers).
    #[arg(long, value_name = "RACK")]
    rack: Option<RackId>,
    /// The server's id in the pool, stable across restarts [default: HOSTNAME-PORT].
    #[arg(long, value_name = "ID")]
    pool_id: Option<ServerId>,
    /// The address clients reach this server at, as registered in the pool [default: the
    /// --listen address; required when listening on 0.0.0.0 or ::].
    #[arg(long, value_name = "ADDR")]
    advertise: Option<SocketAddr>,
    /// Lease TTL in seconds: the pool forgets this server this long after it stops renewing.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pool_ttl: u64,
    /// Seconds a VM must have been gone before its namespace is dropped (a VMM that lost etcd
    /// for a while registers again meanwhile and keeps its pages). A VM that exits cleanly is
    /// collected at once. A namespace that no VM, placement or collector mark of the pool
    /// owns (checked every 5 s against a fresh read of the pool) is dropped after the same
    /// grace: a pool member stores pool VMs' pages only.
    #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
    pool_gc_grace: f64,
    /// Key prefix of the pool in etcd.
    #[arg(long, value_name = "PREFIX", default_value = farvm_pool::keys::DEFAULT_PREFIX)]
    pool_prefix: String,
    /// Seccomp filters (docs/security.md). `on`: before it serves, the server installs a
    /// filter of the system calls each of its thread classes needs (connection threads: socket
    /// I/O and memory only) under a process filter forbidding what it never does (ptrace,
    /// mount, module loading, …); a call outside them ends the server with one line naming
    /// the thread, its class and the call, and exit status 159. `log`: such a call is allowed
    /// and logged by the kernel (audit log or dmesg, type=1326). `off`: no filter.
    #[arg(
        long,
        value_name = "off|log|on",
        env = "FARVM_SECCOMP",
        default_value = "on"
    )]
    seccomp: farvm_sandbox::Mode,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print a fresh random secret (hex) for a token file.
    GenToken,
}

fn parse_size(s: &str) -> Result<u64, String> {
    farvm_units::parse_size(s).map_err(|e| format!("`{s}`: {e}"))
}

/// Exit status when the memory pool refuses the server (sysexits' EX_CONFIG; the systemd unit
/// does not restart on it).
const EXIT_REFUSED_BY_POOL: u8 = 78;

/// `err` and its causes joined by ": ", each once: a cause whose text ends the line so far (an
/// error that writes its source into its own message) is left out. The same rule as
/// `farvm_vmm::exit_code::error_chain`, which the server does not link.
fn error_chain(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain().map(ToString::to_string) {
        if !line.ends_with(&cause) {
            line = if line.is_empty() {
                cause
            } else {
                format!("{line}: {cause}")
            };
        }
    }
    line
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("farvm-memserver: error: {}", error_chain(&e));
            if e.downcast_ref::<PoolError>().is_some_and(is_refusal) {
                std::process::ExitCode::from(EXIT_REFUSED_BY_POOL)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

fn run() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.cmd {
        Some(Cmd::GenToken) => {
            println!("{}", Secret::generate().to_hex());
            Ok(())
        }
        None => {
            let (Some(listen), Some(capacity)) = (cli.listen, cli.capacity) else {
                bail!("--listen ADDR and --capacity SIZE are required to serve (see --help)");
            };
            // Before the first thread: every thread inherits the process filter.
            farvm_sandbox::start(
                "farvm-memserver",
                cli.seccomp,
                farvm_sandbox::ThreadClass::MemServer,
            )
            .context("--seccomp")?;
            let tokens = match &cli.token_file {
                Some(p) => load_token_file(p).with_context(|| "loading --token-file")?,
                None => {
                    tracing::warn!("no --token-file: open mode, clients are not authenticated");
                    Vec::new()
                }
            };
            let h = Server::start(ServerConfig {
                listen,
                rdma: cli.rdma,
                capacity_bytes: capacity,
                tokens,
                metrics: cli.metrics,
                connection_cpu: cli.connection_cpu,
            })?;
            // Machine-readable line for tools that start the server on port 0.
            println!("listening {}", h.addr());
            if let Some(a) = h.rdma_addr() {
                println!("rdma {a}");
            }
            if let Some(m) = h.metrics_addr() {
                println!("metrics {m}");
            }
            let h = Arc::new(h);
            if let Some(cfg) = pool_config(&cli, h.addr())? {
                let member = PoolMember::start(h.clone(), cfg)?;
                return Err(member.wait_refused().into());
            }
            loop {
                std::thread::park();
            }
        }
    }
}

/// The pool membership asked for with --pool, checked before anything is registered.
fn pool_config(cli: &Cli, bound: SocketAddr) -> Result<Option<PoolMemberConfig>> {
    if cli.pool.is_empty() {
        return Ok(None);
    }
    let Some(rack) = cli.rack.clone() else {
        bail!("--pool needs --rack RACK (the failure domain of this server)");
    };
    let advertise = match cli.advertise {
        Some(a) => a,
        None if bound.ip().is_unspecified() => bail!(
            "--pool with --listen {bound}: give --advertise ADDR, the address clients reach \
             this server at"
        ),
        None => bound,
    };
    if advertise.port() == 0 {
        bail!("--advertise {advertise}: the port must not be 0");
    }
    let id = match &cli.pool_id {
        Some(id) => id.clone(),
        None => ServerId::new(format!("{}-{}", hostname(), advertise.port()))
            .map_err(|e| anyhow::anyhow!("{e}; give --pool-id ID"))?,
    };
    if !(cli.pool_gc_grace >= 0.0 && cli.pool_gc_grace.is_finite()) {
        bail!("--pool-gc-grace must be a number of seconds ≥ 0");
    }
    Ok(Some(PoolMemberConfig {
        endpoints: cli.pool.clone(),
        prefix: cli.pool_prefix.clone(),
        id,
        rack,
        advertise,
        ttl: Duration::from_secs(cli.pool_ttl.max(1)),
        update_every: Duration::from_secs(1),
        gc_grace: Duration::from_secs_f64(cli.pool_gc_grace),
    }))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "memserver".to_owned())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("512M").unwrap(), 512 << 20);
        assert_eq!(parse_size("64GiB").unwrap(), 64 << 30);
        assert_eq!(parse_size("1t").unwrap(), 1 << 40);
        assert!(parse_size("lots").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
