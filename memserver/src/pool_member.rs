//! A memory server's membership in a memory pool (`farvm-memserver --pool ENDPOINTS --rack R`):
//! its record in the etcd directory (address, rack, capacity, used bytes, instance id, wire
//! version) under a lease kept alive in the background, refreshed as its usage changes, and
//! the garbage collector for its own namespaces: when a VM's lease expired or the VM released
//! its placement, this server drops the VM's namespace from its store. Besides, every
//! [`RECONCILE_EVERY`] it checks each namespace it holds against a fresh view of the pool
//! and drops those nothing there has owned for the grace period ([`crate::orphans`]): what
//! it missed while it was away when the collector claimed a VM, or a copy no record lists.
//! So a pool member's store holds pool VMs' namespaces only.
//!
//! Everything runs on one thread of its own; serving pages never waits on etcd. While etcd is
//! unreachable the server keeps serving and retries; its record disappears from the pool when
//! its lease runs out there, and is written again when etcd answers.
//!
//! The pool refuses a server whose rack is not declared ([`PoolError::UnknownRack`]): at
//! [`PoolMember::start`] when etcd answers then, or later (etcd was down at start, or the rack
//! was removed while the server's lease had expired in an outage), through
//! [`PoolMember::wait_refused`]. Either way the server must stop: it is outside the pool's
//! view of its failure domains.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use farvm_memproto::{PAGE_SIZE, PROTOCOL_VERSION};
use farvm_pool::gc::sweep;
use farvm_pool::{
    Directory, DirectoryConfig, NamespaceReclaimer, PoolError, RackId, RegistrationState,
    ServerHealth, ServerId, ServerRecord, ServerRegistration,
};
use farvm_transport::{Endpoint, Transport};

use crate::orphans::OrphanNamespaces;
use crate::server::ServerHandle;

/// How often a member checks its namespaces against the pool ([`crate::orphans`]): each check
/// reads the whole pool from etcd.
pub const RECONCILE_EVERY: Duration = Duration::from_secs(5);

/// How a server joins a pool.
#[derive(Debug, Clone)]
pub struct PoolMemberConfig {
    /// etcd client URLs.
    pub endpoints: Vec<String>,
    /// Key prefix of the pool.
    pub prefix: String,
    /// The server's id in the pool (stable across restarts).
    pub id: ServerId,
    /// Its rack (failure domain).
    pub rack: RackId,
    /// The address clients connect to.
    pub advertise: SocketAddr,
    /// Lease TTL: the record disappears this long after the server stops renewing it.
    pub ttl: Duration,
    /// How often usage is checked (and written when it changed).
    pub update_every: Duration,
    /// How long a VM must have been gone before its namespace is dropped (a VMM that lost
    /// etcd for longer than its lease TTL registers again within this time and keeps its
    /// pages). A VM that released its placement is collected at once.
    pub gc_grace: Duration,
}

/// The membership's thread. Dropping it deregisters the server (revokes its lease).
pub struct PoolMember {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    refused: Receiver<PoolError>,
}

impl std::fmt::Debug for PoolMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolMember").finish_non_exhaustive()
    }
}

/// Drops this server's namespaces of dead VMs; other servers' are left to their collectors.
struct LocalReclaimer<'a> {
    id: &'a ServerId,
    server: &'a ServerHandle,
}

impl NamespaceReclaimer for LocalReclaimer<'_> {
    fn discard(
        &mut self,
        server: &ServerId,
        _address: SocketAddr,
        namespace: u64,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        if server != self.id {
            return Err(format!("{server} is not this server ({})", self.id).into());
        }
        let pages = self.server.reclaim_namespace(namespace);
        tracing::info!(
            namespace = format_args!("{namespace:#018x}"),
            pages,
            "pool garbage collector: namespace dropped"
        );
        Ok(())
    }

    fn handles(&self, server: &ServerId) -> bool {
        server == self.id
    }
}

impl PoolMember {
    /// Connects to the directory, registers the server and starts the membership thread. If
    /// etcd does not answer yet, registration is retried on that thread. Fails on a
    /// configuration error (no endpoint) and when the pool refuses the server (its rack is
    /// not declared).
    pub fn start(server: Arc<ServerHandle>, cfg: PoolMemberConfig) -> Result<Self, PoolError> {
        let mut dcfg = DirectoryConfig::new(cfg.endpoints.clone());
        dcfg.prefix = cfg.prefix.clone();
        let dir = Directory::connect(dcfg)?;
        let first = try_register(&dir, &server, &cfg, true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (refuse, refused) = channel();
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("memserver-pool".into())
            .spawn(move || run(&dir, &server, &cfg, first, &st, &refuse))
            .map_err(PoolError::Runtime)?;
        Ok(Self {
            stop,
            thread: Some(thread),
            refused,
        })
    }

    /// Blocks until the pool refuses this server after it started (its rack is not declared:
    /// see the module doc) and returns why; the server must then stop serving.
    pub fn wait_refused(&self) -> PoolError {
        self.refused
            .recv()
            .unwrap_or_else(|_| PoolError::Lost("the pool membership thread ended".to_owned()))
    }
}

/// Whether `e` means the pool refuses this server for good (retrying cannot help).
pub fn is_refusal(e: &PoolError) -> bool {
    matches!(e, PoolError::UnknownRack { .. } | PoolError::Lost(_))
}

impl Drop for PoolMember {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn record(server: &ServerHandle, cfg: &PoolMemberConfig) -> ServerRecord {
    let occ = server.occupancy();
    ServerRecord {
        id: cfg.id.clone(),
        address: cfg.advertise,
        // Its RDMA listener, if it has one: a VM that asks for RDMA uses it.
        endpoints: server
            .rdma_addr()
            .map(|addr| Endpoint {
                addr,
                transport: Transport::RDMA,
            })
            .into_iter()
            .collect(),
        rack: cfg.rack.clone(),
        capacity_bytes: occ.capacity_pages * PAGE_SIZE as u64,
        used_bytes: occ.used_pages * PAGE_SIZE as u64,
        instance: occ.instance,
        wire_version: PROTOCOL_VERSION,
        health: ServerHealth::Up,
    }
}

/// One registration attempt: `Ok(None)` when it may succeed later (etcd does not answer;
/// logged as a warning if `warn`), `Err` when the pool refuses the server.
fn try_register(
    dir: &Directory,
    server: &ServerHandle,
    cfg: &PoolMemberConfig,
    warn: bool,
) -> Result<Option<ServerRegistration>, PoolError> {
    match dir.register_server(record(server, cfg), cfg.ttl) {
        Ok(r) => {
            tracing::info!(id = %cfg.id, rack = %cfg.rack, address = %cfg.advertise, "registered in the memory pool");
            Ok(Some(r))
        }
        Err(e) if is_refusal(&e) => Err(e),
        Err(e) if warn => {
            tracing::warn!("cannot register in the memory pool yet: {e}; retrying");
            Ok(None)
        }
        Err(e) => {
            tracing::debug!("cannot register in the memory pool yet: {e}");
            Ok(None)
        }
    }
}

/// Registers, retrying while etcd does not answer; `Ok(None)` when asked to stop.
fn register(
    dir: &Directory,
    server: &ServerHandle,
    cfg: &PoolMemberConfig,
    stop: &AtomicBool,
) -> Result<Option<ServerRegistration>, PoolError> {
    while !stop.load(Ordering::Acquire) {
        if let Some(r) = try_register(dir, server, cfg, false)? {
            return Ok(Some(r));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(None)
}

fn run(
    dir: &Directory,
    server: &ServerHandle,
    cfg: &PoolMemberConfig,
    first: Option<ServerRegistration>,
    stop: &AtomicBool,
    refuse: &Sender<PoolError>,
) {
    let reg = match first.map_or_else(|| register(dir, server, cfg, stop), |r| Ok(Some(r))) {
        Ok(Some(reg)) => reg,
        Ok(None) => return,
        Err(e) => {
            tracing::error!("the memory pool refuses this server: {e}");
            let _ = refuse.send(e);
            return;
        }
    };
    let mut watch = dir.watch();
    let mut last_update = Instant::now();
    let mut gc_due = true;
    let mut orphans = OrphanNamespaces::default();
    let mut last_reconcile = Instant::now();
    while !stop.load(Ordering::Acquire) {
        if let RegistrationState::Lost { reason } = reg.state() {
            tracing::error!("the memory pool refuses this server: {reason}");
            let _ = refuse.send(PoolError::Lost(reason));
            return;
        }
        let changed = watch.wait_newer(cfg.update_every.min(Duration::from_millis(500)));
        if last_update.elapsed() >= cfg.update_every {
            let used = server.occupancy().used_pages * PAGE_SIZE as u64;
            if reg.record().used_bytes != used {
                reg.update(|r| r.used_bytes = used);
            }
            last_update = Instant::now();
        }
        // Collect when the pool shows a namespace of a dead VM on this server (or on a server
        // that is gone, which any collector may settle); keep collecting while one waits out
        // the grace period.
        let view = changed.unwrap_or_else(|| watch.latest());
        let mine = sweep(&view)
            .iter()
            .any(|o| o.server == cfg.id || o.address.is_none());
        if mine || gc_due {
            let mut rec = LocalReclaimer {
                id: &cfg.id,
                server,
            };
            match dir.collect_garbage(&mut rec, cfg.gc_grace) {
                Ok(report) => gc_due = !report.waiting.is_empty(),
                Err(e) => {
                    tracing::debug!("pool garbage collection: {e}");
                    gc_due = true;
                }
            }
        }
        if last_reconcile.elapsed() >= RECONCILE_EVERY {
            last_reconcile = Instant::now();
            reconcile(dir, server, cfg.gc_grace, &mut orphans);
        }
    }
    reg.deregister();
}

/// Drops the namespaces nothing in the pool has owned for `grace` (see [`crate::orphans`]).
fn reconcile(
    dir: &Directory,
    server: &ServerHandle,
    grace: Duration,
    orphans: &mut OrphanNamespaces,
) {
    // Listed before the view is read: see the module doc of `orphans`.
    let held = server.namespace_ids();
    if held.is_empty() {
        return;
    }
    let view = match dir.view() {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!("checking namespaces against the pool: {e}");
            return;
        }
    };
    for ns in orphans.check(&held, &view, Instant::now(), grace) {
        let pages = server.reclaim_namespace(ns);
        tracing::warn!(
            namespace = format_args!("{ns:#018x}"),
            pages,
            "namespace dropped: no VM, placement or collector mark of the pool has owned it \
             for the grace period"
        );
    }
}
