//! A memory server's membership in a memory pool (`farvm-memserver --pool ENDPOINTS --rack R`):
//! its record in the etcd directory (address, rack, capacity, used bytes, instance id, wire
//! version) under a lease kept alive in the background, refreshed as its usage changes, and
//! the garbage collector for its own namespaces: when a VM's lease expired or the VM released
//! its placement, this server drops the VM's namespace from its store.
//!
//! Everything runs on one thread of its own; serving pages never waits on etcd. While etcd is
//! unreachable the server keeps serving and retries; its record disappears from the pool when
//! its lease runs out there, and is written again when etcd answers.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use farvm_memproto::{PAGE_SIZE, PROTOCOL_VERSION};
use farvm_pool::gc::sweep;
use farvm_pool::{
    Directory, DirectoryConfig, NamespaceReclaimer, PoolError, RackId, ServerHealth, ServerId,
    ServerRecord, ServerRegistration,
};

use crate::server::ServerHandle;

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
        let pages = self.server.drop_namespace(namespace);
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
    /// Connects to the directory and starts the membership thread (registration is retried
    /// there until etcd answers). Fails only on a configuration error (no endpoint).
    pub fn start(server: Arc<ServerHandle>, cfg: PoolMemberConfig) -> Result<Self, PoolError> {
        let mut dcfg = DirectoryConfig::new(cfg.endpoints.clone());
        dcfg.prefix = cfg.prefix.clone();
        let dir = Directory::connect(dcfg)?;
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name("memserver-pool".into())
            .spawn(move || run(&dir, &server, &cfg, &st))
            .map_err(PoolError::Runtime)?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }
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
        rack: cfg.rack.clone(),
        capacity_bytes: occ.capacity_pages * PAGE_SIZE as u64,
        used_bytes: occ.used_pages * PAGE_SIZE as u64,
        instance: occ.instance,
        wire_version: PROTOCOL_VERSION,
        health: ServerHealth::Up,
    }
}

/// Registers (retrying while etcd does not answer) or returns None when asked to stop.
fn register(
    dir: &Directory,
    server: &ServerHandle,
    cfg: &PoolMemberConfig,
    stop: &AtomicBool,
) -> Option<ServerRegistration> {
    let mut warned = false;
    while !stop.load(Ordering::Acquire) {
        match dir.register_server(record(server, cfg), cfg.ttl) {
            Ok(r) => {
                tracing::info!(id = %cfg.id, rack = %cfg.rack, address = %cfg.advertise, "registered in the memory pool");
                return Some(r);
            }
            Err(e) => {
                if !warned {
                    tracing::warn!("cannot register in the memory pool yet: {e}; retrying");
                    warned = true;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
    None
}

fn run(dir: &Directory, server: &ServerHandle, cfg: &PoolMemberConfig, stop: &AtomicBool) {
    let Some(reg) = register(dir, server, cfg, stop) else {
        return;
    };
    let mut watch = dir.watch();
    let mut last_update = Instant::now();
    let mut gc_due = true;
    while !stop.load(Ordering::Acquire) {
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
    }
    reg.deregister();
}
