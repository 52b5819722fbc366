//! The operator's commands on the pool — racks, status, gc, drain, rebalance, plans, orphans, and
//! the registration helpers for tests and demos — shared by `farvm pool` and the standalone
//! `farvm-pool` binary (one implementation; both parse [`PoolArgs`] and call [`run`]).

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use crate::gc::{GcReport, NamespaceReclaimer};
use crate::placement::{drain_plan, rebalance_plan, repair_plan, DrainPlan, Move};
use crate::units::{fmt_bytes, parse_bytes};
use crate::{
    AdmissionRequest, Directory, DirectoryConfig, PoolError, PoolView, RackId, RegistrationState,
    ServerHealth, ServerId, ServerRecord, VmId,
};

/// Where the pool is, and what to do with it.
#[derive(Args, Debug)]
pub struct PoolArgs {
    /// etcd client URL (comma-separated or repeated for several members).
    #[arg(
        long = "etcd",
        value_name = "URL",
        env = "FARVM_POOL",
        value_delimiter = ',',
        required = true
    )]
    pub etcd: Vec<String>,
    /// Key prefix of the pool.
    #[arg(long, value_name = "PREFIX", default_value = crate::keys::DEFAULT_PREFIX)]
    pub prefix: String,
    /// The command to run.
    #[command(subcommand)]
    pub cmd: PoolCommand,
}

/// The long help of the pool commands.
pub const POOL_ABOUT: &str = "\
The memory pool: memory servers and VMs registered in etcd, rack-aware placement of each VM's
remote memory, and the namespaces dead VMs left behind.

Key layout under the prefix (default /farvm/pool/v1): servers/<id> and vms/<uuid> under their
holders' leases; racks/<rack>, placement/<uuid>/<slab>, gc/<uuid>, drain/<id>,
moves/<uuid>/<slab> and snapshots/<uuid> without. The operator declares the racks first (`racks add`); memory
servers join with `farvm-memserver --pool URLS --rack R`, R one of them (a server of an
undeclared rack is refused and exits); VMs with `farvm run --pool URLS`.

Examples:
  farvm pool --etcd http://10.77.0.2:2379 racks add r1 r2 r3
  farvm pool --etcd http://10.77.0.2:2379 racks
  farvm pool --etcd http://10.77.0.2:2379 status
  farvm pool --etcd http://10.77.0.2:2379 status --json
  farvm pool --etcd http://10.77.0.2:2379 drain r1-ms1
  farvm pool --etcd http://10.77.0.2:2379 rebalance
  farvm pool --etcd http://10.77.0.2:2379 gc
  farvm pool --etcd http://10.77.0.2:2379 snapshot-delete 0b9e4c1e-6d0a-4f43-9a55-3c1f3e0a7d21

EXIT STATUS
  0   done
  1   the command failed (the message says why: a refused plan, an unknown server or rack, ...)
  64  bad command-line arguments
  69  etcd did not answer (status --wait SECONDS keeps retrying that long)";

/// What `farvm pool status` reports, column by column (its --help).
const STATUS_COLUMNS: &str = "\
COLUMNS (per server; a rack's and the fleet's are sums over their servers)
  CAPACITY  bytes the server's arena holds (farvm-memserver --capacity)
  USED      bytes of pages it stores now, by its own count (JSON used_bytes)
  RESERVED  bytes of slab replicas the pool placed there: each replica reserves its whole slab,
            sized to its VM's remote share (JSON reserved_bytes)
  FREE      CAPACITY - max(USED, RESERVED): what placement may still give out; 0 while the
            server drains, since it takes no new slab (JSON free_bytes)
  VMS       VMs with a replica there, live or awaiting collection
  HEALTH    up, draining (farvm pool drain) or degraded
SNAPSHOTS (one row per saved pool VM; `farvm pool snapshot-delete ID` frees one)
  SNAPSHOT  its id: the saved VM's uuid, which the restored VM keeps
  REMOTE    bytes its namespace holds on the memory servers (one copy; JSON remote_bytes)
  LOCAL     bytes of resident pages its directory holds (JSON local_bytes)
  DIRECTORY where it was saved, on HOST
The JSON form (--json) carries the same fields with _bytes names; docs/pool.md lists them all.";

/// `farvm pool`'s exit status when etcd did not answer (EX_UNAVAILABLE).
pub const EXIT_ETCD_UNREACHABLE: i32 = 69;

/// The exit status for a failed command (see EXIT STATUS in [`POOL_ABOUT`]).
pub fn exit_status(err: &anyhow::Error) -> i32 {
    match err.downcast_ref::<PoolError>() {
        Some(e) if e.is_unreachable() => EXIT_ETCD_UNREACHABLE,
        _ => 1,
    }
}

/// The pool commands.
#[derive(Subcommand, Debug)]
pub enum PoolCommand {
    /// The pool's racks (failure domains). A memory server registers only in a declared rack,
    /// so a misspelt --rack is refused instead of silently creating a rack. Without a
    /// subcommand, list them: every declared rack with its live servers (also with none), and
    /// any rack a live server is in that is not declared (its servers take no slabs).
    Racks {
        /// Declare or remove racks.
        #[command(subcommand)]
        cmd: Option<RacksCmd>,
        /// Print the list as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print racks → servers (capacity, used, reserved, free, VMs, health), hosts → VMs, the
    /// fleet's oversubscription ratio (guest RAM / host-local RAM), the snapshots of pool VMs
    /// (each owns its VM's namespace: what the servers hold for it, what its directory holds)
    /// and namespaces awaiting collection.
    #[command(after_long_help = STATUS_COLUMNS)]
    Status {
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
        /// While etcd is unreachable, keep retrying for up to this many seconds (0: fail at once).
        #[arg(long, value_name = "SECONDS", default_value_t = 0)]
        wait: u64,
    },
    /// Sweep now: every VM whose lease expired is claimed at once (no grace period) and its
    /// namespaces handed to the memory servers' collectors, which drop them; waits until they
    /// did (--wait seconds) and prints what was reclaimed and what is still pending.
    Gc {
        /// Seconds to wait for the memory servers to drop the namespaces.
        #[arg(long, value_name = "SECONDS", default_value_t = 30)]
        wait: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Drain a server: mark it draining (it takes no new slabs), ask the VMs holding slabs
    /// there to move them to other servers (rack-aware, while they run), and wait until it
    /// holds no slab of a live VM. With --undo, take the mark off (it takes new slabs again).
    /// A server that leaves the pool before its slabs are moved (stopped, killed) fails the
    /// drain (exit 1) once its VMs have repaired its slabs elsewhere (up to --timeout). The
    /// mark stays until --undo, across restarts: a server registering again under the id
    /// takes no new slabs, and its room is not counted as free.
    Drain {
        /// The server id.
        server: ServerId,
        /// Clear the draining mark.
        #[arg(long)]
        undo: bool,
        /// Only mark it and ask for the moves; do not wait.
        #[arg(long)]
        no_wait: bool,
        /// Give up waiting after this many seconds (the moves go on).
        #[arg(long, value_name = "SECONDS", default_value_t = 600)]
        timeout: u64,
    },
    /// Even used capacity across servers: plan moves from servers above their fair share to
    /// servers below it, ask the VMs to make them while they run, and wait until they did.
    /// The moves go in rounds of at most one per slab, planned again after each round. A move
    /// that a VM declined or failed (its log says why) fails the command (exit 1): a move counts
    /// as done only once the slab's placement shows it.
    Rebalance {
        /// Print the plan only.
        #[arg(long)]
        dry_run: bool,
        /// Give up waiting after this many seconds (the moves go on).
        #[arg(long, value_name = "SECONDS", default_value_t = 600)]
        timeout: u64,
    },
    /// Serve the pool's status as Prometheus metrics on ADDR (HOST:PORT, unix:PATH or fd:N)
    /// until killed: per server capacity, used, reserved, free, VMs and health, per rack and
    /// for the fleet, with the oversubscription ratio. Kept current by an etcd watch.
    Metrics {
        /// Where to listen.
        #[arg(long, value_name = "ADDR")]
        listen: String,
    },
    /// Print a plan of slab moves (nothing is changed).
    Plan {
        /// What to plan.
        #[command(subcommand)]
        what: PlanCmd,
        /// Print JSON.
        #[arg(long, global = true)]
        json: bool,
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
        /// Rack (failure domain); must be declared (`racks add`).
        #[arg(long)]
        rack: RackId,
        /// Arena size (e.g. 8G).
        #[arg(long, value_parser = parse_bytes)]
        capacity: u64,
        /// Lease TTL in seconds.
        #[arg(long, default_value_t = 5)]
        ttl: u64,
        /// Wire-protocol version the server speaks (this build speaks the default).
        #[arg(long, default_value_t = farvm_memproto::PROTOCOL_VERSION)]
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
    /// Delete a pool VM's snapshot and free its pages. A snapshot saved by `farvm snapshot`
    /// (or the API's vm.snapshot, `virsh save`) of a VM on the pool owns the VM's namespace on
    /// the memory servers until it is restored (`farvm run --restore DIR`) or deleted here: in
    /// one etcd transaction its record and placement go and its servers are handed to the
    /// collectors, which drop the namespace; the command waits until they did (--wait
    /// seconds). The snapshot's directory is left as it is (remove it yourself): it can no
    /// longer be restored. ID is the SNAPSHOT column of `farvm pool status` (the saved VM's
    /// uuid). Exit 1 if the pool holds no such snapshot (deleted or restored already).
    #[command(name = "snapshot-delete")]
    SnapshotDelete {
        /// The snapshot's id (the saved VM's uuid).
        #[arg(value_name = "ID")]
        id: VmId,
        /// Seconds to wait for the memory servers to drop the namespace (0: do not wait).
        #[arg(long, default_value_t = 30, value_name = "SECONDS")]
        wait: u64,
    },
    /// List (server, namespace) pairs of VMs whose lease expired but whose placement remains.
    Orphans {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `farvm pool racks` subcommands.
#[derive(Subcommand, Debug)]
pub enum RacksCmd {
    /// Declare racks (declaring a declared rack again changes nothing).
    Add {
        /// Rack names (1-64 characters of A-Z a-z 0-9 . _ : -).
        #[arg(value_name = "RACK", required = true)]
        racks: Vec<RackId>,
    },
    /// Remove a declared rack. Refused while a live memory server is registered in it: drain
    /// and stop its servers first.
    Remove {
        /// The rack.
        #[arg(value_name = "RACK")]
        rack: RackId,
    },
}

/// The plans `farvm pool plan` prints.
#[derive(Subcommand, Debug)]
pub enum PlanCmd {
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

/// Runs one operator command.
pub fn run(args: PoolArgs) -> Result<()> {
    let mut cfg = DirectoryConfig::new(args.etcd.clone());
    cfg.prefix = args.prefix.clone();
    let dir = Directory::connect(cfg)?;
    match args.cmd {
        PoolCommand::Status { json, wait } => {
            let deadline = Instant::now() + Duration::from_secs(wait);
            let status = loop {
                match dir.status() {
                    Err(e @ PoolError::Unreachable { .. }) if Instant::now() < deadline => {
                        let left = deadline.saturating_duration_since(Instant::now());
                        eprintln!("farvm-pool: {e}; retrying for up to {} s", left.as_secs());
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
        PoolCommand::Racks { cmd, json } => racks(&dir, cmd, json)?,
        PoolCommand::SnapshotDelete { id, wait } => {
            let snap = dir.delete_snapshot(id)?;
            println!(
                "snapshot {id} ({}, saved in {} on {}) deleted",
                snap.vm.name, snap.dir, snap.host
            );
            if wait > 0 {
                if dir.wait_reclaimed(id, Duration::from_secs(wait))? {
                    println!("its namespace is dropped on every server");
                } else {
                    anyhow::bail!(
                        "some memory servers have not dropped the namespace of {id} after {wait} s \
                         (they will when they collect: `farvm pool status` lists what remains)"
                    );
                }
            }
        }
        PoolCommand::Plan { what, json } => {
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
        PoolCommand::Metrics { listen } => {
            let listen: farvm_httpd::Listen = listen.parse()?;
            install_signal_handlers();
            let server = crate::metrics::serve(&listen, &dir)?;
            eprintln!("serving pool metrics on {}", server.addr());
            while !STOP.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        PoolCommand::Gc { wait, json } => gc(&dir, Duration::from_secs(wait), json)?,
        PoolCommand::Drain {
            server,
            undo,
            no_wait,
            timeout,
        } => drain(&dir, &server, undo, no_wait, Duration::from_secs(timeout))?,
        PoolCommand::Rebalance { dry_run, timeout } => {
            rebalance(&dir, dry_run, Duration::from_secs(timeout))?
        }
        PoolCommand::AnnounceServer {
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
                endpoints: Vec::new(),
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
        PoolCommand::Admit {
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
        PoolCommand::Orphans { json } => {
            let orphans = crate::gc::sweep(&dir.view()?);
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

fn racks(dir: &Directory, cmd: Option<RacksCmd>, json: bool) -> Result<()> {
    match cmd {
        Some(RacksCmd::Add { racks }) => {
            let new = dir.declare_racks(&racks)?;
            for r in &racks {
                if new.contains(r) {
                    println!("rack {r}: declared");
                } else {
                    println!("rack {r}: declared already");
                }
            }
        }
        Some(RacksCmd::Remove { rack }) => {
            dir.remove_rack(&rack)?;
            println!("rack {rack}: removed");
        }
        None => {
            let status = dir.status()?;
            if json {
                let list: Vec<_> = status
                    .racks
                    .iter()
                    .map(|r| {
                        serde_json::json!({
                            "rack": r.rack,
                            "declared": r.declared,
                            "servers": r.servers.iter().map(|s| &s.id).collect::<Vec<_>>(),
                            "capacity_bytes": r.capacity_bytes,
                            "free_bytes": r.free_bytes,
                        })
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else if status.racks.is_empty() {
                println!("no rack is declared: farvm pool racks add RACK...");
            } else {
                println!(
                    "{:<12} {:<9} {:>7} {:>10} {:>10}",
                    "RACK", "DECLARED", "SERVERS", "CAPACITY", "FREE"
                );
                for r in &status.racks {
                    println!(
                        "{:<12} {:<9} {:>7} {:>10} {:>10}",
                        r.rack.as_str(),
                        if r.declared { "yes" } else { "NO" },
                        r.servers.len(),
                        fmt_bytes(r.capacity_bytes),
                        fmt_bytes(r.free_bytes)
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

/// Hands every namespace to the memory servers' own collectors (they can drop a namespace
/// whoever owns it; this command holds no tenant secret).
struct ServersCollect;

impl NamespaceReclaimer for ServersCollect {
    fn discard(
        &mut self,
        server: &ServerId,
        _: SocketAddr,
        _: u64,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        Err(format!("{server} collects its own namespaces").into())
    }

    fn handles(&self, _: &ServerId) -> bool {
        false
    }
}

fn gc(dir: &Directory, wait: Duration, json: bool) -> Result<()> {
    let report: GcReport = dir.collect_garbage(&mut ServersCollect, Duration::ZERO)?;
    let vms: Vec<VmId> = {
        let mut v: Vec<VmId> = report
            .deferred
            .iter()
            .chain(report.reclaimed.iter())
            .map(|o| o.vm)
            .collect();
        v.sort();
        v.dedup();
        v
    };
    let deadline = Instant::now() + wait;
    let mut pending: Vec<VmId> = vms.clone();
    while !pending.is_empty() && Instant::now() < deadline {
        let view = dir.view()?;
        pending.retain(|vm| view.gc_marks.contains_key(vm) || view.vm_slabs(*vm).next().is_some());
        if !pending.is_empty() {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let reclaimed: Vec<VmId> = vms
        .iter()
        .filter(|v| !pending.contains(v))
        .copied()
        .collect();
    if json {
        println!(
            "{}",
            serde_json::json!({ "reclaimed": reclaimed, "pending": pending })
        );
    } else if vms.is_empty() {
        println!("no namespace awaits collection");
    } else {
        for vm in &reclaimed {
            println!(
                "VM {vm}: namespace {:#018x} dropped on every server",
                vm.namespace()
            );
        }
        for vm in &pending {
            println!(
                "VM {vm}: namespace {:#018x} still held by a server that does not collect \
                 (not started with --pool, or down); it is dropped when that server collects",
                vm.namespace()
            );
        }
    }
    Ok(())
}

/// Slabs of live VMs with a replica on `server`.
fn live_slabs_on(view: &PoolView, server: &ServerId) -> usize {
    view.slabs
        .iter()
        .filter(|(s, r)| view.vms.contains_key(&s.vm) && r.replicas.contains(server))
        .count()
}

/// The server being drained left the pool (its lease expired: stopped, killed or cut off)
/// before its slabs were moved: its VMs repair them instead, from their other replicas. Waits
/// until no live slab lists it (or `deadline`), and fails either way: the drain did not move
/// them, and they ran with a replica fewer meanwhile. The drain mark stays (the operator's
/// intent): a server registering again under this id takes no slab until `--undo`.
fn drain_lost(dir: &Directory, server: &ServerId, deadline: Instant) -> Result<()> {
    eprintln!(
        "{server} left the pool during the drain (its lease expired: stopped, killed or cut \
         off); its VMs re-replicate its slabs from their other replicas"
    );
    loop {
        let view = dir.view()?;
        let left = live_slabs_on(&view, server);
        if left == 0 {
            bail!(
                "{server}: not drained, but every slab it held was repaired elsewhere; it stays \
                 marked draining (`farvm pool drain {server} --undo` takes the mark off)"
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "{server}: not drained; {left} slab(s) still list it, awaiting repair by their VMs"
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Requests `moves` and waits until none is open (or `timeout`). Returns the moves still open
/// and those that closed without being made: a VM declines or fails a move it cannot make
/// (its log says why) by dropping the request, so a closed request alone does not mean the
/// replica moved; the slab's placement says.
fn carry_out(dir: &Directory, moves: &[Move], timeout: Duration) -> Result<(usize, usize)> {
    dir.request_moves(moves)?;
    let deadline = Instant::now() + timeout;
    loop {
        let view = dir.view()?;
        let live: Vec<&Move> = moves
            .iter()
            .filter(|m| view.vms.contains_key(&m.slab.vm))
            .collect();
        let open = live
            .iter()
            .filter(|m| view.move_requests.contains_key(&m.slab))
            .count();
        if open == 0 || Instant::now() >= deadline {
            let not_made = live
                .iter()
                .filter(|m| !view.move_requests.contains_key(&m.slab))
                .filter(|m| {
                    view.slabs
                        .get(&m.slab)
                        .is_none_or(|r| !r.replicas.contains(&m.to) || r.replicas.contains(&m.from))
                })
                .count();
            return Ok((open, not_made));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn drain(
    dir: &Directory,
    server: &ServerId,
    undo: bool,
    no_wait: bool,
    timeout: Duration,
) -> Result<()> {
    if undo {
        dir.set_draining(server, false)?;
        println!("{server}: takes new slabs again");
        return Ok(());
    }
    let view = dir.view()?;
    if !view.servers.contains_key(server) {
        bail!("{server} is not registered in the pool");
    }
    dir.set_draining(server, true)?;
    println!("{server}: draining (takes no new slabs)");
    let deadline = Instant::now() + timeout;
    loop {
        let view = dir.view()?;
        if !view.servers.contains_key(server) {
            return drain_lost(dir, server, deadline);
        }
        let left = live_slabs_on(&view, server);
        if left == 0 {
            println!("{server}: holds no slab of a running VM; it can be stopped");
            return Ok(());
        }
        let plan = drain_plan(&view, server, 0)?;
        for u in &plan.unmovable {
            eprintln!("slab {} cannot leave {}: {}", u.slab, u.from, u.reason);
        }
        if plan.moves.is_empty() {
            bail!(
                "{server}: {left} slab(s) cannot be moved (see above); the server stays draining"
            );
        }
        for m in &plan.moves {
            println!("move {m}");
        }
        if no_wait {
            dir.request_moves(&plan.moves)?;
            println!(
                "{} move(s) requested; `farvm pool status` shows progress",
                plan.moves.len()
            );
            return Ok(());
        }
        let left_time = deadline.saturating_duration_since(Instant::now());
        let (open, not_made) = carry_out(dir, &plan.moves, left_time)?;
        if not_made > 0 {
            eprintln!(
                "{not_made} move(s) declined or failed by their VMs (their logs say why); \
                 planning again"
            );
        }
        if open > 0 && Instant::now() >= deadline {
            bail!(
                "{server}: {open} move(s) still open after {}s; they go on",
                timeout.as_secs()
            );
        }
    }
}

fn rebalance(dir: &Directory, dry_run: bool, timeout: Duration) -> Result<()> {
    let view = dir.view()?;
    let moves = rebalance_plan(&view, 0);
    if moves.is_empty() {
        println!("balanced: nothing to move");
        return Ok(());
    }
    for m in &moves {
        println!("move {m}");
    }
    if dry_run {
        return Ok(());
    }
    // A VM takes one move request per slab at a time, and a plan may move two replicas of one
    // slab: the moves go in rounds, at most one per slab each, planned again from the pool as
    // it is after the last round (each plan lowers the distance from the fair shares).
    const ROUNDS: usize = 8;
    let deadline = Instant::now() + timeout;
    let mut done = 0;
    let mut round = first_per_slab(moves);
    for r in 0..ROUNDS {
        if r > 0 {
            for m in &round {
                println!("move {m}");
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let (open, not_made) = carry_out(dir, &round, left)?;
        if open > 0 {
            bail!(
                "{open} move(s) still open after {}s ({done} done before); they go on",
                timeout.as_secs()
            );
        }
        if not_made > 0 {
            bail!(
                "{} of {} move(s) done; {not_made} declined or failed by their VMs (their logs \
                 say why)",
                done + round.len() - not_made,
                done + round.len()
            );
        }
        done += round.len();
        round = first_per_slab(rebalance_plan(&dir.view()?, 0));
        if round.is_empty() {
            break;
        }
    }
    println!("{done} move(s) done");
    if !round.is_empty() {
        println!("still unbalanced after {ROUNDS} rounds: run rebalance again");
    }
    Ok(())
}

/// The first move of each slab in `moves`.
fn first_per_slab(moves: Vec<Move>) -> Vec<Move> {
    let mut seen = std::collections::BTreeSet::new();
    moves.into_iter().filter(|m| seen.insert(m.slab)).collect()
}
