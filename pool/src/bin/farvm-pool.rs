//! `farvm-pool`: the operator's view of the memory pool, and the registration helpers used by
//! tests and demos.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

use farvm_pool::placement::{drain_plan, rebalance_plan, repair_plan, DrainPlan};
use farvm_pool::units::{fmt_bytes, parse_bytes};
use farvm_pool::{
    AdmissionRequest, Directory, DirectoryConfig, PoolError, RackId, RegistrationState,
    ServerHealth, ServerId, ServerRecord, VmId,
};

/// farvm memory pool: memory servers and VMs registered in etcd, rack-aware placement of
/// each VM's remote memory, and the namespaces dead VMs left behind.
///
/// Key layout under the prefix (default /farvm/pool/v1): servers/<id> and vms/<uuid> under
/// their holders' leases; placement/<uuid>/<slab>, gc/<uuid> and drain/<id> without.
///
/// Examples:
///   farvm-pool --etcd http://10.77.0.2:2379 status
///   farvm-pool --etcd http://10.77.0.2:2379 status --json
///   farvm-pool --etcd http://10.77.0.2:2379 drain ms-r1-a && farvm-pool ... plan drain ms-r1-a
///   farvm-pool --etcd http://10.77.0.2:2379 announce-server --id ms-r1-a --address 10.77.1.11:7070 --rack r1 --capacity 8G
///   farvm-pool --etcd http://10.77.0.2:2379 admit --name web1 --host host1 --guest-ram 4G --local-memory 25% --hold
#[derive(Parser, Debug)]
#[command(name = "farvm-pool", version, verbatim_doc_comment)]
struct Cli {
    /// etcd client URL (repeat for several members).
    #[arg(
        long = "etcd",
        value_name = "URL",
        env = "FARVM_ETCD_ENDPOINTS",
        value_delimiter = ',',
        required = true
    )]
    etcd: Vec<String>,
    /// Key prefix of the pool.
    #[arg(long, value_name = "PREFIX", default_value = farvm_pool::keys::DEFAULT_PREFIX)]
    prefix: String,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print racks → servers (capacity, used, reserved, free, VMs, health), hosts → VMs, the
    /// fleet's oversubscription ratio (guest RAM / host-local RAM) and namespaces awaiting
    /// collection.
    Status {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
        /// While etcd is unreachable, keep retrying for up to this many seconds (0: fail at once).
        #[arg(long, value_name = "SECONDS", default_value_t = 0)]
        wait: u64,
    },
    /// Print a plan of slab moves (nothing is changed).
    Plan {
        #[command(subcommand)]
        what: PlanCmd,
        /// Print JSON.
        #[arg(long, global = true)]
        json: bool,
    },
    /// Mark a server as draining (it takes no new slabs), or clear the mark with --undo.
    Drain {
        /// The server id.
        server: ServerId,
        /// Clear the mark.
        #[arg(long)]
        undo: bool,
    },
    /// Register a memory server that does not register itself, and keep it registered while
    /// it accepts TCP connections; deregister and exit when it stops (or on SIGTERM/SIGINT).
    AnnounceServer {
        /// Server id in the pool.
        #[arg(long)]
        id: ServerId,
        /// Address clients connect to.
        #[arg(long, value_name = "ADDR")]
        address: SocketAddr,
        /// Rack (failure domain).
        #[arg(long)]
        rack: RackId,
        /// Arena size (e.g. 8G).
        #[arg(long, value_parser = parse_bytes)]
        capacity: u64,
        /// Lease TTL in seconds.
        #[arg(long, default_value_t = 5)]
        ttl: u64,
        /// Wire-protocol version the server speaks.
        #[arg(long, default_value_t = 2)]
        wire_version: u8,
        /// Seconds between TCP probes of the server; three failures in a row deregister it.
        #[arg(long, default_value_t = 1.0)]
        probe_interval: f64,
        /// Address to probe, when clients reach the server through something else (a proxy
        /// that keeps accepting after the server died) [default: --address].
        #[arg(long, value_name = "ADDR")]
        probe: Option<SocketAddr>,
    },
    /// Admit a VM: place its remote share and register it (prints the placement and the
    /// servers to pass to `farvm run --memserver`). With --hold, keep its lease alive until
    /// killed, like the VMM would; without, deregister at once (the placement stays for the
    /// garbage collector).
    Admit {
        /// VM name.
        #[arg(long)]
        name: String,
        /// Host the VM runs on.
        #[arg(long)]
        host: String,
        /// Guest RAM (e.g. 4G).
        #[arg(long, value_parser = parse_bytes)]
        guest_ram: u64,
        /// Resident budget: a size (1G) or a share of guest RAM (25%).
        #[arg(long, default_value = "25%")]
        local_memory: String,
        /// Replicas per slab, each on its own rack.
        #[arg(long, default_value_t = 2)]
        replication: u8,
        /// Slab size.
        #[arg(long, value_parser = parse_bytes, default_value = "1G")]
        slab: u64,
        /// Lease TTL in seconds.
        #[arg(long, default_value_t = 10)]
        ttl: u64,
        /// Instance id (default: a fresh random UUID).
        #[arg(long)]
        uuid: Option<VmId>,
        /// Keep the registration alive until SIGTERM/SIGINT.
        #[arg(long)]
        hold: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List (server, namespace) pairs of VMs whose lease expired but whose placement remains.
    Orphans {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand, Debug)]
enum PlanCmd {
    /// Move every slab off SERVER, keeping each slab's replicas on distinct racks.
    Drain {
        /// The server id.
        server: ServerId,
    },
    /// Even load relative to capacity across up servers, with few moves.
    Rebalance,
    /// Re-place replicas on servers that are gone or overfull.
    Repair,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("farvm-pool: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Set by SIGTERM/SIGINT.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_signal as *const () as libc::sighandler_t);
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let mut cfg = DirectoryConfig::new(cli.etcd.clone());
    cfg.prefix = cli.prefix.clone();
    let dir = Directory::connect(cfg)?;
    match cli.cmd {
        Cmd::Status { json, wait } => {
            let deadline = Instant::now() + Duration::from_secs(wait);
            let status = loop {
                match dir.status() {
                    Err(e @ PoolError::Unreachable { .. }) if Instant::now() < deadline => {
                        eprintln!("farvm-pool: {e}");
                        std::thread::sleep(Duration::from_secs(1));
                    }
                    other => break other?,
                }
            };
            if json {
                println!("{}", status.to_json());
            } else {
                print!("{}", status.render_table());
            }
        }
        Cmd::Plan { what, json } => {
            let view = dir.view()?;
            let plan = match what {
                PlanCmd::Drain { server } => drain_plan(&view, &server, 0)?,
                PlanCmd::Rebalance => DrainPlan {
                    moves: rebalance_plan(&view, 0),
                    unmovable: Vec::new(),
                },
                PlanCmd::Repair => repair_plan(&view, 0),
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&plan)?);
            } else {
                if plan.moves.is_empty() && plan.unmovable.is_empty() {
                    println!("nothing to move");
                }
                for m in &plan.moves {
                    println!("move {m}");
                }
                for u in &plan.unmovable {
                    println!("stuck slab {} on {}: {}", u.slab, u.from, u.reason);
                }
            }
        }
        Cmd::Drain { server, undo } => {
            dir.set_draining(&server, !undo)?;
            println!(
                "{server}: {}",
                if undo {
                    "takes new slabs again"
                } else {
                    "draining"
                }
            );
        }
        Cmd::AnnounceServer {
            id,
            address,
            rack,
            capacity,
            ttl,
            wire_version,
            probe_interval,
            probe,
        } => announce_server(
            &dir,
            ServerRecord {
                id,
                address,
                rack,
                capacity_bytes: capacity,
                used_bytes: 0,
                instance: rand_u64(),
                wire_version,
                health: ServerHealth::Up,
            },
            Duration::from_secs(ttl),
            probe.unwrap_or(address),
            Duration::from_secs_f64(probe_interval.max(0.05)),
        )?,
        Cmd::Admit {
            name,
            host,
            guest_ram,
            local_memory,
            replication,
            slab,
            ttl,
            uuid,
            hold,
            json,
        } => {
            let local = parse_share(&local_memory, guest_ram)?;
            let req = AdmissionRequest {
                vm: uuid.unwrap_or_else(VmId::random),
                name,
                host,
                guest_ram_bytes: guest_ram,
                local_budget_bytes: local,
                replication,
                slab_bytes: slab,
                min_wire_version: 0,
            };
            install_signal_handlers();
            let reg = dir.admit_vm(&req, Duration::from_secs(ttl))?;
            let view = dir.view()?;
            let addrs: Vec<String> = reg
                .placement()
                .servers()
                .iter()
                .filter_map(|s| view.servers.get(s))
                .map(|s| s.address.to_string())
                .collect();
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "record": reg.record(),
                        "placement": reg.placement(),
                        "memservers": addrs,
                    })
                );
            } else {
                println!(
                    "admitted VM {} (namespace {:#018x}): {} remote in {} slab(s) × replication {}",
                    req.vm,
                    req.vm.namespace(),
                    fmt_bytes(req.remote_bytes()),
                    reg.placement().slabs.len(),
                    replication
                );
                for (i, s) in reg.placement().slabs.iter().enumerate() {
                    let names: Vec<&str> = s.replicas.iter().map(|r| r.as_str()).collect();
                    println!("  slab {i}: {}", names.join(", "));
                }
                println!("memservers: {}", addrs.join(" "));
            }
            if hold {
                while !STOP.load(Ordering::SeqCst) {
                    if let RegistrationState::Lost { reason } = reg.state() {
                        bail!("registration lost: {reason}");
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            reg.deregister();
        }
        Cmd::Orphans { json } => {
            let orphans = farvm_pool::gc::sweep(&dir.view()?);
            if json {
                println!("{}", serde_json::to_string_pretty(&orphans)?);
            } else if orphans.is_empty() {
                println!("no namespace awaits collection");
            } else {
                for o in orphans {
                    let at = o.address.map_or("gone".to_owned(), |a| a.to_string());
                    println!(
                        "VM {} namespace {:#018x} on {} ({at}): {} slab(s)",
                        o.vm,
                        o.namespace,
                        o.server,
                        o.slabs.len()
                    );
                }
            }
        }
    }
    Ok(())
}

fn announce_server(
    dir: &Directory,
    record: ServerRecord,
    ttl: Duration,
    probed: SocketAddr,
    probe: Duration,
) -> Result<()> {
    let address = record.address;
    let id = record.id.clone();
    install_signal_handlers();
    let reg = dir
        .register_server(record, ttl)
        .with_context(|| format!("registering {id}"))?;
    eprintln!("farvm-pool: {id} ({address}) registered; probing {probed} every {probe:?}");
    let mut failures = 0u32;
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(probe);
        if TcpStream::connect_timeout(&probed, probe.max(Duration::from_millis(200))).is_ok() {
            failures = 0;
        } else {
            failures += 1;
        }
        if failures >= 3 {
            reg.deregister();
            bail!("{id}: {probed} stopped accepting connections; deregistered");
        }
    }
    reg.deregister();
    eprintln!("farvm-pool: {id} deregistered");
    Ok(())
}

fn parse_share(s: &str, guest: u64) -> Result<u64> {
    if let Some(p) = s.trim().strip_suffix('%') {
        let p: f64 = p
            .trim()
            .parse()
            .with_context(|| format!("`{s}` is not a percentage"))?;
        if !(0.0..=100.0).contains(&p) {
            bail!("`{s}`: a percentage must be within 0-100%");
        }
        return Ok(((guest as f64 * p / 100.0) as u64) & !4095);
    }
    parse_bytes(s).map_err(anyhow::Error::msg)
}

fn rand_u64() -> u64 {
    VmId::random().namespace()
}
