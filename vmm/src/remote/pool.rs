//! A VM's membership in a memory pool (`farvm run --pool ENDPOINTS`): admission through the
//! pool's rack-aware placement, the VM's record and placement under its own lease, the
//! follower thread that carries out the moves the operator asks for (drain, rebalance) while
//! the VM runs, and the release at exit that has the memory servers drop the VM's pages.
//!
//! The data path never waits on etcd: admission happens before the guest starts; afterwards
//! the lease is kept alive by the pool library's own runtime and moves are made by the
//! follower thread, which copies slabs through the memserver client like a re-replication.
//!
//! When a memory server leaves the pool (its lease expired: the server or its rack is gone),
//! the follower repairs this VM's slabs that had a replica there: the pool's repair plan
//! picks, per slab, a server in a rack holding none of the slab's other replicas; the
//! follower makes that server part of the slab's home in the client, the client fills it
//! from a surviving replica (it never picks a server of its own with a pool:
//! `ClientConfig::pool_placement`; a copy still on the lost server is moved) and the
//! follower then commits the new replica to the pool, so `farvm pool status` shows no
//! degraded slab. A server that restarted empty under the same pool id keeps its place in
//! the home, and the client refills it there: the pool's record of it comes true again.
//! A slab whose only live copy was on the lost server cannot be repaired: the follower waits
//! [`SERVER_GONE_PATIENCE`] for the server to come back, then retires it in the client, and
//! the slab is lost (the guest needing one of its pages stops with exit 74) instead of
//! waiting forever.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use farvm_memclient::{Client, Endpoint, RelocateError, Transport};
use farvm_memproto::PROTOCOL_VERSION;
use farvm_pool::{
    AdmissionRequest, Directory, DirectoryConfig, Move, PoolError, PoolView, RegistrationState,
    ServerHealth, ServerId, ServerRecord, SlabRef, VmId, VmRegistration,
};

use super::setup::RemoteError;

/// Where the pool is and how a VM joins it.
#[derive(Clone, Debug)]
pub struct PoolSpec {
    /// etcd client URLs.
    pub endpoints: Vec<String>,
    /// Key prefix of the pool.
    pub prefix: String,
    /// This host's name in the pool (informative: `farvm pool status` groups VMs by it).
    pub host: String,
    /// Slab size: the unit of placement (and of the client's replica sets) [`None`: fitted
    /// to the VM's remote share, `farvm_pool::placement::fitted_slab_bytes`].
    pub slab_bytes: Option<u64>,
    /// The VM's lease TTL: its namespaces are collected this long (plus the servers' grace)
    /// after the VMM dies.
    pub lease_ttl: Duration,
    /// How long to wait for etcd at start before giving up.
    pub wait: Duration,
    /// The transport the VM's links use where a server offers it (a server's record lists
    /// its endpoints); a server without it is reached over TCP.
    pub transport: Transport,
}

impl PoolSpec {
    /// Defaults for these endpoints: slabs fitted to the VM, a 10 s lease, waiting up to 5
    /// minutes for etcd, TCP, the host name from the kernel.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            prefix: farvm_pool::keys::DEFAULT_PREFIX.to_owned(),
            host: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_owned())
                .unwrap_or_else(|_| "localhost".to_owned()),
            slab_bytes: None,
            lease_ttl: Duration::from_secs(10),
            wait: Duration::from_secs(300),
            transport: Transport::Tcp,
        }
    }
}

/// What admission gave the VM.
#[derive(Clone, Debug)]
pub struct PoolAdmission {
    /// The VM instance's id in the pool.
    pub vm: VmId,
    /// Its namespace on the memory servers.
    pub namespace: u64,
    /// The servers the client connects to: those of the placement first, then every other
    /// server in service (targets of moves and of writes that find a server full).
    pub servers: Vec<Endpoint>,
    /// Per pool slab, its replica servers as indices into `servers`.
    pub homes: Vec<Vec<u16>>,
    /// Replicas per slab.
    pub replication: usize,
    /// Bytes per slab (the spec's, or fitted to the VM's remote share).
    pub slab_bytes: u64,
}

/// The VM's membership. Dropping it without [`PoolVm::release`] revokes the lease and leaves
/// the namespaces to the servers' garbage collectors.
pub struct PoolVm {
    dir: Directory,
    /// Taken by a snapshot that the namespace is handed to ([`PoolVm::snapshot_handle`]):
    /// then the release at exit leaves the namespace alone.
    reg: Arc<Mutex<Option<VmRegistration>>>,
    /// This host's name in the pool.
    host: String,
    /// The snapshot this VM was restored from, until the snapshot is loaded
    /// ([`PoolHandoff::restore_done`]; see [`PoolVm::abandon_start`]).
    restored_from: Arc<Mutex<Option<farvm_pool::SnapshotHolding>>>,
    /// A live migration's destination: the handover it commits once the VM is loaded
    /// ([`PoolHandoff::restore_done`]); until then the VM does not own its namespace.
    takeover: Arc<Mutex<Option<PendingTakeover>>>,
    vm: VmId,
    servers: Vec<(ServerId, Endpoint)>,
    transport: Transport,
    slabs: u32,
    stop: Arc<AtomicBool>,
    follower: Option<JoinHandle<()>>,
    /// Called once if the follower finds the VM's placement reclaimed ([`PoolVm::on_reclaimed`]).
    reclaimed: Arc<OnceLock<ReclaimedHook>>,
}

/// What the VMM does when the pool reclaimed the VM's remote memory (it ends the VM).
type ReclaimedHook = Box<dyn Fn() + Send + Sync>;

impl std::fmt::Debug for PoolVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolVm").field("vm", &self.vm).finish()
    }
}

fn pool_err(e: PoolError) -> RemoteError {
    RemoteError::Pool(e.to_string())
}

/// Why admission failed: the pool cannot take the VM (no room, or etcd still silent after
/// `--pool-wait`: exit 69), or something else failed.
fn admission_err(e: PoolError, wait: Duration) -> RemoteError {
    match e {
        PoolError::Unreachable { .. } => RemoteError::PoolUnavailable(format!(
            "gave up after waiting {} s (--pool-wait): {e}",
            wait.as_secs()
        )),
        PoolError::Placement(_) => RemoteError::PoolUnavailable(e.to_string()),
        e => pool_err(e),
    }
}

/// Tells the operator why a start waits: in the log and on stderr, once, then every 30 s.
struct WaitNote {
    next: Instant,
}

impl WaitNote {
    fn new() -> Self {
        Self {
            next: Instant::now(),
        }
    }

    /// Says `why` (waiting up to `limit`) if it is time to say it again.
    fn say(&mut self, why: &str, limit: Duration) {
        if Instant::now() >= self.next {
            tracing::warn!("memory pool: {why}");
            eprintln!(
                "farvm: memory pool: {why} (waiting up to {} s)",
                limit.as_secs()
            );
            self.next = Instant::now() + Duration::from_secs(30);
        }
    }
}

/// Runs `f` until it does not fail with "etcd unreachable", for up to `wait`, saying why it
/// waits.
fn patiently<T>(
    what: &str,
    wait: Duration,
    mut f: impl FnMut() -> Result<T, PoolError>,
) -> Result<T, PoolError> {
    let deadline = Instant::now() + wait;
    let mut note = WaitNote::new();
    loop {
        match f() {
            Err(e) if e.is_unreachable() && Instant::now() < deadline => {
                note.say(&format!("{what}: {e}"), wait);
                std::thread::sleep(Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// How long a VM the pool cannot place waits for servers that placements name but that are
/// not registered (they register again within their lease TTL once etcd is back; a server
/// gone for good would otherwise hold every refusal for `--pool-wait`).
const REREGISTRATION_WAIT: Duration = Duration::from_secs(30);

/// How long a memory server this VM uses may be gone from the pool (its lease expired and it
/// did not register again) before the VM gives up on what only it held: the client retires it
/// (`Client::retire_server`), and a slab whose last live replica it was is lost — the guest
/// needing one of its pages stops with exit 74 — rather than waiting for a server that will
/// not come back. A server paused or partitioned away for less, or re-registering after an
/// etcd outage (within its lease TTL once etcd answers), is waited for.
pub const SERVER_GONE_PATIENCE: Duration = Duration::from_secs(30);

/// Admits `req`, waiting for etcd while it does not answer (`spec.wait`), and, while the pool
/// cannot place the VM, for memory servers that may still register: none is registered yet
/// (the pool is starting: up to `spec.wait`), or placements name servers that are not (an
/// etcd outage expired their leases: up to [`REREGISTRATION_WAIT`]). A pool that is simply
/// short of room refuses at once.
fn admit_when_servers_register(
    dir: &Directory,
    spec: &PoolSpec,
    req: &AdmissionRequest,
) -> Result<VmRegistration, RemoteError> {
    let started = Instant::now();
    let mut note = WaitNote::new();
    loop {
        let e = match patiently("admitting the VM", spec.wait, || {
            dir.admit_vm(req, spec.lease_ttl)
        }) {
            Ok(reg) => return Ok(reg),
            Err(e @ PoolError::Placement(_)) => e,
            Err(e) => return Err(admission_err(e, spec.wait)),
        };
        let Ok(view) = dir.view() else {
            return Err(admission_err(e, spec.wait));
        };
        let awaited = view.unregistered_replica_servers();
        let (why, limit) = if view.servers.is_empty() {
            ("no memory server is registered yet".to_owned(), spec.wait)
        } else if !awaited.is_empty() {
            let names: Vec<String> = awaited.iter().map(|s| s.to_string()).collect();
            (
                format!(
                    "placements name {} server(s) not registered now ({}); after an etcd \
                     outage servers register again within their lease TTL",
                    names.len(),
                    names.join(", ")
                ),
                REREGISTRATION_WAIT.min(spec.wait),
            )
        } else {
            return Err(admission_err(e, spec.wait));
        };
        if started.elapsed() >= limit {
            return Err(RemoteError::PoolUnavailable(format!(
                "{e} (waited {} s: {why})",
                started.elapsed().as_secs()
            )));
        }
        note.say(&format!("cannot place the VM yet: {e}; {why}"), limit);
        std::thread::sleep(Duration::from_millis(500));
    }
}

impl PoolVm {
    /// Admits a VM of `guest_ram` bytes keeping `local_budget` resident, with `replication`
    /// replicas per slab (default 2), waiting for etcd while it does not answer and for memory
    /// servers that may still register (see `admit_when_servers_register`).
    pub fn admit(
        spec: &PoolSpec,
        name: &str,
        guest_ram: u64,
        local_budget: u64,
        replication: Option<usize>,
    ) -> Result<(Self, PoolAdmission), RemoteError> {
        let r = replication.unwrap_or(2);
        if r == 0 || r > farvm_memclient::MAX_REPLICAS {
            return Err(RemoteError::Config(format!(
                "--replicas {r}: between 1 and {} with a pool",
                farvm_memclient::MAX_REPLICAS
            )));
        }
        let mut cfg = DirectoryConfig::new(spec.endpoints.clone());
        cfg.prefix = spec.prefix.clone();
        let dir = Directory::connect(cfg).map_err(pool_err)?;
        let req = AdmissionRequest {
            vm: VmId::random(),
            name: name.to_owned(),
            host: spec.host.clone(),
            guest_ram_bytes: guest_ram,
            local_budget_bytes: local_budget.min(guest_ram),
            replication: r as u8,
            slab_bytes: spec.slab_bytes.unwrap_or_else(|| {
                farvm_pool::placement::fitted_slab_bytes(guest_ram.saturating_sub(local_budget))
            }),
            min_wire_version: PROTOCOL_VERSION,
        };
        let reg = admit_when_servers_register(&dir, spec, &req)?;
        let (record, placement) = (reg.record().clone(), reg.placement().clone());
        Self::joined(dir, spec, record, placement, Some(reg), r)
    }

    /// Restores the pool VM `vm` saved in a snapshot: its snapshot record's ownership of the
    /// namespace passes to a new leased record under the same id (one etcd transaction,
    /// refused with [`PoolError::NoSnapshot`] if the record is gone: restored already or
    /// deleted), and the VM's client reaches its slabs where the placement records say.
    pub fn restore(spec: &PoolSpec, vm: VmId) -> Result<(Self, PoolAdmission), RemoteError> {
        let mut cfg = DirectoryConfig::new(spec.endpoints.clone());
        cfg.prefix = spec.prefix.clone();
        let dir = Directory::connect(cfg).map_err(pool_err)?;
        let (reg, snap) = patiently("restoring the snapshot's namespace", spec.wait, || {
            dir.restore_snapshot(vm, &spec.host, spec.lease_ttl)
        })
        .map_err(|e| match e {
            PoolError::NoSnapshot(_) => RemoteError::SnapshotGone(e.to_string()),
            e => admission_err(e, spec.wait),
        })?;
        let r = reg.record().replication.max(1) as usize;
        let back = farvm_pool::SnapshotHolding {
            dir: snap.dir,
            host: snap.host,
            remote_pages: snap.remote_pages,
            local_pages: snap.local_pages,
        };
        let (record, placement) = (reg.record().clone(), reg.placement().clone());
        let (member, admission) = Self::joined(dir, spec, record, placement, Some(reg), r)?;
        *lock(&member.restored_from) = Some(back);
        Ok((member, admission))
    }

    /// The destination of a live migration of pool VM `vm`: joins the VM's placement (its
    /// client reaches the slabs where the pool placed them) without owning it yet; the
    /// namespace is taken over, in one etcd transaction on `fence` (`farvm_pool`'s
    /// handover), only once the VM is loaded ([`PoolHandoff::restore_done`]).
    pub fn incoming(
        spec: &PoolSpec,
        vm: VmId,
        fence: i64,
    ) -> Result<(Self, PoolAdmission), RemoteError> {
        let mut cfg = DirectoryConfig::new(spec.endpoints.clone());
        cfg.prefix = spec.prefix.clone();
        let dir = Directory::connect(cfg).map_err(pool_err)?;
        let view = patiently("reading the migrating VM's record", spec.wait, || {
            dir.view()
        })
        .map_err(|e| admission_err(e, spec.wait))?;
        let record = view.vms.get(&vm).cloned().ok_or_else(|| {
            RemoteError::Pool(format!(
                "VM {vm} is not registered in the pool (its source no longer owns it)"
            ))
        })?;
        let placement = farvm_pool::VmPlacement {
            vm,
            slabs: view.vm_slabs(vm).map(|(_, r)| r.clone()).collect(),
        };
        let r = record.replication.max(1) as usize;
        let (member, admission) = Self::joined(dir, spec, record, placement, None, r)?;
        *lock(&member.takeover) = Some(PendingTakeover {
            fence,
            ttl: spec.lease_ttl,
        });
        Ok((member, admission))
    }

    /// The exit of the VM: one restored from a snapshot that was not loaded (the start
    /// failed) hands its namespace back to its snapshot, which can be restored again; any
    /// other is released ([`PoolVm::release`]).
    pub fn exit(self, wait: Duration) {
        let back = lock(&self.restored_from).take();
        let Some(back) = back else {
            self.release(wait);
            return;
        };
        let handoff = self.snapshot_handle();
        match handoff.hand_to_snapshot(
            std::path::Path::new(&back.dir),
            back.remote_pages,
            back.local_pages,
        ) {
            Ok(_) => {
                tracing::info!(vm = %self.vm, "memory pool: the restore failed; the namespace is its snapshot's again")
            }
            Err(e) => {
                tracing::error!(vm = %self.vm, "memory pool: the restore failed and the namespace could not be handed back to the snapshot: {e}");
                self.release(wait);
            }
        }
    }

    /// The membership of a registered VM: the servers its client connects to and each pool
    /// slab's home among them.
    fn joined(
        dir: Directory,
        spec: &PoolSpec,
        record: farvm_pool::VmRecord,
        placement: farvm_pool::VmPlacement,
        reg: Option<VmRegistration>,
        r: usize,
    ) -> Result<(Self, PoolAdmission), RemoteError> {
        let vm = record.uuid;
        let slab_bytes = record.slab_bytes;
        let view = match patiently("reading the pool", spec.wait, || dir.view()) {
            Ok(v) => v,
            Err(e) => {
                if let Some(reg) = reg {
                    reg.deregister();
                }
                return Err(admission_err(e, spec.wait));
            }
        };
        let mut servers: Vec<(ServerId, Endpoint)> = Vec::new();
        let mut add = |id: &ServerId| {
            if let Some(rec) = view.servers.get(id) {
                if !servers.iter().any(|(s, _)| s == id) {
                    servers.push((id.clone(), endpoint_of(id, rec, spec.transport)));
                }
            }
        };
        for id in placement.servers() {
            add(&id);
        }
        for (id, rec) in &view.servers {
            if view.takes_new_slabs(rec, PROTOCOL_VERSION) {
                add(id);
            }
        }
        if servers.len() > 64 {
            servers.truncate(64.max(placement.servers().len()));
        }
        let homes = placement
            .slabs
            .iter()
            .map(|s| {
                s.replicas
                    .iter()
                    .filter_map(|id| servers.iter().position(|(x, _)| x == id))
                    .map(|i| i as u16)
                    .collect()
            })
            .collect();
        let admission = PoolAdmission {
            vm,
            namespace: vm.namespace(),
            servers: servers.iter().map(|(_, e)| *e).collect(),
            homes,
            replication: r.min(servers.len().max(1)),
            slab_bytes,
        };
        tracing::info!(%vm, name = %record.name, servers = servers.len(), slabs = placement.slabs.len(), slab_bytes = slab_bytes, "admitted to the memory pool");
        let slabs = record.slabs;
        Ok((
            Self {
                dir,
                reg: Arc::new(Mutex::new(reg)),
                host: spec.host.clone(),
                restored_from: Arc::new(Mutex::new(None)),
                takeover: Arc::new(Mutex::new(None)),
                vm,
                servers,
                transport: spec.transport,
                slabs,
                stop: Arc::new(AtomicBool::new(false)),
                follower: None,
                reclaimed: Arc::new(OnceLock::new()),
            },
            admission,
        ))
    }

    /// The VM instance's id.
    pub fn vm(&self) -> VmId {
        self.vm
    }

    /// Whether the lease is alive (see [`RegistrationState`]).
    pub fn state(&self) -> RegistrationState {
        lock(&self.reg)
            .as_ref()
            .map_or(RegistrationState::Stopped, |r| r.state())
    }

    /// What a snapshot of this VM hands its namespace through.
    pub fn snapshot_handle(&self) -> PoolHandoff {
        PoolHandoff {
            reg: self.reg.clone(),
            host: self.host.clone(),
            restored_from: self.restored_from.clone(),
            takeover: self.takeover.clone(),
            dir: self.dir.clone(),
            vm: self.vm,
        }
    }

    /// Has the follower call `f` (once) if it finds this VM's placement reclaimed: its lease
    /// expired and the pool's collector claimed its pages, so its remote memory is gone and
    /// the memory servers refuse its namespace. The VMM ends the VM saying so.
    pub fn on_reclaimed(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.reclaimed.set(Box::new(f));
    }

    /// Starts the follower thread: it marks draining servers in the client (they take no new
    /// slab) and carries out the moves requested for this VM, while the VM runs.
    pub fn follow(&mut self, client: Weak<Client>) {
        let follower = Follower {
            dir: self.dir.clone(),
            vm: self.vm,
            ns: self.vm.namespace(),
            slabs: self.slabs.max(1) as u64,
            servers: self.servers.iter().cloned().collect(),
            transport: self.transport,
            client,
            stop: self.stop.clone(),
            repairs: BTreeMap::new(),
            homes: BTreeMap::new(),
            reclaimed: self.reclaimed.clone(),
            absent_since: BTreeMap::new(),
            retired: BTreeSet::new(),
        };
        match std::thread::Builder::new()
            .name("farvm-pool".into())
            .spawn(move || follower.run())
        {
            Ok(h) => self.follower = Some(h),
            Err(e) => tracing::warn!("cannot start the pool follower thread: {e}"),
        }
    }

    fn stop_follower(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.follower.take() {
            let _ = h.join();
        }
    }

    /// The clean exit (call once the VM's client is closed): releases the placement, so the
    /// memory servers drop the VM's namespace at once, and waits up to `wait` for them.
    /// Returns whether every server dropped it. If etcd does not answer, the lease expires
    /// and the servers collect the namespace then.
    pub fn release(mut self, wait: Duration) -> bool {
        self.stop_follower();
        let Some(reg) = lock(&self.reg).take() else {
            tracing::info!(vm = %self.vm, "memory pool: the VM does not own its namespace (it belongs to a snapshot, or to the host the VM migrated to, or a migration here was not committed); left on the servers");
            return false;
        };
        let vm = self.vm;
        if let Err(e) = reg.release() {
            tracing::warn!(%vm, "memory pool: cannot release the VM ({e}); its namespace is collected when its lease expires");
            return false;
        }
        match self.dir.wait_reclaimed(vm, wait) {
            Ok(true) => {
                tracing::info!(%vm, "memory pool: namespace dropped on every server");
                true
            }
            Ok(false) => {
                tracing::warn!(%vm, "memory pool: some servers have not dropped the namespace yet (they will when they collect)");
                false
            }
            Err(e) => {
                tracing::warn!(%vm, "memory pool: {e}");
                false
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Hands a pool VM's namespace to its snapshot (`crate::snapshot`): the registration leaves
/// the VM, so that its release at exit leaves the namespace on the servers.
#[derive(Clone)]
pub struct PoolHandoff {
    reg: Arc<Mutex<Option<VmRegistration>>>,
    host: String,
    restored_from: Arc<Mutex<Option<farvm_pool::SnapshotHolding>>>,
    takeover: Arc<Mutex<Option<PendingTakeover>>>,
    dir: Directory,
    vm: VmId,
}

/// The handover a live migration's destination commits once its VM is loaded.
#[derive(Clone, Copy, Debug)]
struct PendingTakeover {
    fence: i64,
    ttl: Duration,
}

impl PoolHandoff {
    /// The snapshot (or live migration) this VM was restored from is loaded: from now on
    /// the VM owns the namespace for good (its guest will overwrite the remote pages), and
    /// its exit releases it. A migration's destination takes the namespace over here, in one
    /// etcd transaction; [`PoolError::Conflict`] if its source kept it (cancelled).
    pub fn restore_done(&self) -> Result<(), PoolError> {
        lock(&self.restored_from).take();
        let Some(t) = lock(&self.takeover).take() else {
            return Ok(());
        };
        let reg = self.dir.take_over_vm(self.vm, &self.host, t.ttl, t.fence)?;
        *lock(&self.reg) = Some(reg);
        Ok(())
    }

    /// A live migration's destination built before the source's last frame: the fence its
    /// takeover commits on, now known.
    pub fn set_takeover_fence(&self, fence: i64) {
        if let Some(t) = lock(&self.takeover).as_mut() {
            t.fence = fence;
        }
    }

    /// A live migration's source, guest paused: the fence its destination's takeover
    /// commits on (`farvm_pool`'s handover).
    pub fn handover_fence(&self) -> Result<i64, PoolError> {
        match lock(&self.reg).as_ref() {
            Some(reg) => reg.handover_fence(),
            None => Err(PoolError::Lost(
                "the VM does not own its namespace in the pool".into(),
            )),
        }
    }

    /// A live migration's source gives up: `Ok(true)` if it keeps the namespace (the
    /// destination's takeover will fail), `Ok(false)` if the destination took it first.
    pub fn cancel_handover(&self, fence: i64) -> Result<bool, PoolError> {
        match lock(&self.reg).as_ref() {
            Some(reg) => reg.cancel_handover(fence),
            None => Ok(false),
        }
    }

    /// A live migration's source after the destination took the namespace over: the VM's
    /// registration ends without releasing anything (its exit leaves the namespace alone).
    pub fn handed_over(&self) {
        if let Some(reg) = lock(&self.reg).take() {
            reg.handed_over();
        }
    }

    /// The VM's id in the pool, while it owns its namespace.
    pub fn vm(&self) -> Option<VmId> {
        lock(&self.reg).as_ref().map(|r| r.record().uuid)
    }

    /// In one etcd transaction, the VM's leased record gives way to a snapshot record naming
    /// `dir` and what it holds (see `farvm_pool::VmRegistration::hand_to_snapshot`). On
    /// failure the VM keeps its registration and its namespace.
    pub fn hand_to_snapshot(
        &self,
        dir: &std::path::Path,
        remote_pages: u64,
        local_pages: u64,
    ) -> Result<farvm_pool::SnapshotRecord, PoolError> {
        let mut slot = lock(&self.reg);
        let Some(reg) = slot.take() else {
            return Err(PoolError::Lost(
                "the VM's namespace was handed to a snapshot already".into(),
            ));
        };
        let holding = farvm_pool::SnapshotHolding {
            dir: dir.display().to_string(),
            host: self.host.clone(),
            remote_pages,
            local_pages,
        };
        match reg.hand_to_snapshot(holding) {
            Ok(rec) => Ok(rec),
            Err((reg, e)) => {
                *slot = Some(*reg);
                Err(e)
            }
        }
    }
}

impl Drop for PoolVm {
    fn drop(&mut self) {
        self.stop_follower();
    }
}

/// How this VM reaches server `id`: by `want` where its record lists a listener for it, else
/// over TCP, which the log says (an operator who asked for RDMA learns which server lacks it).
fn endpoint_of(id: &ServerId, rec: &ServerRecord, want: Transport) -> Endpoint {
    let e = rec.endpoint(want);
    if !e.transport.same_kind(want) {
        tracing::warn!(server = %id, endpoint = %e, "memory pool: the server has no {} listener; reached over {}", want.scheme(), e.transport);
    }
    e
}

/// Carries out the moves the pool asks of this VM.
struct Follower {
    dir: Directory,
    vm: VmId,
    ns: u64,
    slabs: u64,
    servers: BTreeMap<ServerId, Endpoint>,
    /// How the VM reaches a server that joins later ([`PoolSpec::transport`]).
    transport: Transport,
    client: Weak<Client>,
    stop: Arc<AtomicBool>,
    /// The server chosen for each lost replica being repaired ((slab, lost server) → new),
    /// kept so that a repair in progress does not change its target.
    repairs: BTreeMap<(SlabRef, ServerId), ServerId>,
    /// The servers the client places each pool slab's new client slabs on, as last set.
    homes: BTreeMap<u32, Vec<ServerId>>,
    /// The VMM's [`PoolVm::on_reclaimed`] hook.
    reclaimed: Arc<OnceLock<ReclaimedHook>>,
    /// Since when each server this VM uses has been missing from the pool's view.
    absent_since: BTreeMap<ServerId, Instant>,
    /// Servers retired in the client while gone from the pool (until they register again).
    retired: BTreeSet<ServerId>,
}

impl Follower {
    fn run(mut self) {
        let mut watch = self.dir.watch();
        let mut lost_noted = false;
        while !self.stop.load(Ordering::Acquire) {
            let view = watch
                .wait_newer(Duration::from_millis(500))
                .unwrap_or_else(|| watch.latest());
            if view.revision == 0 {
                continue; // no view yet (etcd not answering)
            }
            let Some(client) = self.client.upgrade() else {
                return;
            };
            for (id, e) in &self.servers {
                let draining = view
                    .servers
                    .get(id)
                    .is_some_and(|s| s.health == ServerHealth::Draining);
                let _ = client.set_draining(e.addr, draining);
            }
            if !lost_noted
                && !view.vms.contains_key(&self.vm)
                && view.vm_slabs(self.vm).next().is_none()
            {
                // Reclaimed: the lease expired (a VMM paused, or an etcd outage, longer than
                // the lease and the grace) and the collector claimed the VM, which can never
                // register again; the servers refuse its namespace from then on.
                lost_noted = true;
                tracing::error!(vm = %self.vm, "memory pool: this VM's placement was reclaimed; its remote pages are gone");
                if let Some(f) = self.reclaimed.get() {
                    f();
                }
            }
            self.retire_gone(&view, &client);
            self.repair(&view, &client);
            self.sync_homes(&view, &client);
            let vm = self.vm;
            for m in view.move_requests.values().filter(|m| m.slab.vm == vm) {
                if self.stop.load(Ordering::Acquire) {
                    return;
                }
                let Some(from) = self.servers.get(&m.from).map(|e| e.addr) else {
                    // The VM never had a replica there: the request is stale.
                    tracing::warn!(%m, "memory pool: a move from a server this VM holds nothing on; declined");
                    let _ = self.dir.drop_move_request(m);
                    continue;
                };
                let Some(to) = self.connect(&view, &client, &m.to) else {
                    tracing::warn!(%m, "memory pool: the move's target cannot be reached; declined");
                    let _ = self.dir.drop_move_request(m);
                    continue;
                };
                // Slabs of this pool slab that are first written from now on go to the
                // moved placement, not to `from` (they would stay there, unknown to the pool).
                self.set_home_after(&view, &client, m);
                match self.move_all(&client, from, to.addr, m.slab.index) {
                    Ok(moved) => {
                        tracing::info!(%m, client_slabs = moved, "memory pool: replica moved");
                        if let Err(e) = self.dir.complete_move(m) {
                            tracing::warn!(%m, "memory pool: committing the move: {e}");
                        }
                    }
                    Err(RelocateError::Busy { .. }) => {} // next round
                    Err(e) => {
                        tracing::warn!(%m, "memory pool: move failed: {e}");
                        let _ = self.dir.drop_move_request(m);
                    }
                }
            }
        }
    }

    /// Retires, in the client, each server gone from the pool for [`SERVER_GONE_PATIENCE`]
    /// that the client has out of service (see there), once; a server that registers again
    /// is watched afresh.
    fn retire_gone(&mut self, view: &PoolView, client: &Client) {
        let now = Instant::now();
        for (id, e) in &self.servers {
            if view.servers.contains_key(id) {
                self.absent_since.remove(id);
                self.retired.remove(id);
                continue;
            }
            if self.retired.contains(id) {
                continue;
            }
            let since = *self.absent_since.entry(id.clone()).or_insert(now);
            if now.duration_since(since) < SERVER_GONE_PATIENCE {
                continue;
            }
            match client.retire_server(e.addr) {
                Ok(Some(lost)) => {
                    self.retired.insert(id.clone());
                    tracing::warn!(
                        server = %id,
                        lost_slabs = lost,
                        "memory pool: a memory server gone from the pool for {}s is given up",
                        SERVER_GONE_PATIENCE.as_secs()
                    );
                }
                Ok(None) => {} // it still answers this VM: keep using it
                Err(e) => {
                    tracing::warn!(server = %id, "memory pool: retiring a server gone from the pool: {e}")
                }
            }
        }
    }

    /// Moves every client slab of pool slab `j` on `from` to `to`, again if one was placed on
    /// `from` meanwhile (placed with the old home just before it changed).
    fn move_all(
        &self,
        client: &Client,
        from: SocketAddr,
        to: SocketAddr,
        j: u32,
    ) -> Result<u64, RelocateError> {
        let (n, j) = (self.slabs, j as u64);
        let ours = |k: u64| k % n == j;
        let mut moved = 0;
        for _ in 0..3 {
            moved += client.move_replicas(self.ns, from, to, &ours)?;
            if !client.slabs_on(self.ns, from).into_iter().any(ours) {
                break;
            }
        }
        Ok(moved)
    }

    /// Keeps the client's home of every pool slab of this VM at its placement in the pool
    /// (live servers only), so that client slabs first written later land where the pool
    /// says the slab is: after a move, a repair or a drain.
    fn sync_homes(&mut self, view: &PoolView, client: &Client) {
        // A slab being repaired keeps the home its repair set (its new server included).
        let slabs: Vec<(u32, Vec<ServerId>)> = view
            .vm_slabs(self.vm)
            .filter(|(r, _)| !self.repairs.keys().any(|(s, _)| s == *r))
            .map(|(r, rec)| (r.index, rec.replicas.clone()))
            .collect();
        for (j, replicas) in slabs {
            self.set_home(view, client, j, replicas);
        }
    }

    /// Sets the home of `m`'s pool slab to its placement once `m` is made: `m.to` where
    /// `m.from` is, as [`Directory::commit_move`] will record it.
    fn set_home_after(&mut self, view: &PoolView, client: &Client, m: &Move) {
        let Some(rec) = view.slabs.get(&m.slab) else {
            return;
        };
        let after = rec
            .replicas
            .iter()
            .map(|id| if *id == m.from { &m.to } else { id }.clone())
            .collect();
        self.set_home(view, client, m.slab.index, after);
    }

    /// Sets pool slab `j`'s home in the client to `replicas` (those live in `view`), if it
    /// changed.
    fn set_home(&mut self, view: &PoolView, client: &Client, j: u32, replicas: Vec<ServerId>) {
        let live: Vec<ServerId> = replicas
            .into_iter()
            .filter(|id| view.servers.contains_key(id))
            .collect();
        if self.homes.get(&j) == Some(&live) {
            return;
        }
        let endpoints: Vec<Endpoint> = live
            .iter()
            .filter_map(|id| self.connect(view, client, id))
            .collect();
        match client.set_slab_home(j as usize, &endpoints) {
            Ok(()) => {
                self.homes.insert(j, live);
            }
            Err(e) => tracing::warn!(slab = j, "memory pool: cannot update the slab's home: {e}"),
        }
    }

    /// The endpoint of server `id`, connecting the client to it first if it joined the pool
    /// after this VM started (or was draining then): the target of a move or a repair.
    fn connect(&mut self, view: &PoolView, client: &Client, id: &ServerId) -> Option<Endpoint> {
        if let Some(&e) = self.servers.get(id) {
            return Some(e);
        }
        let endpoint = endpoint_of(id, view.servers.get(id)?, self.transport);
        match client.add_server(endpoint) {
            Ok(_) => {
                tracing::info!(server = %id, %endpoint, "memory pool: connected to a server that joined after this VM started");
                self.servers.insert(id.clone(), endpoint);
                Some(endpoint)
            }
            Err(e) => {
                tracing::warn!(server = %id, %endpoint, "memory pool: cannot add the server: {e}");
                None
            }
        }
    }

    /// Re-replicates this VM's slabs that had a replica on a server gone from the pool (see
    /// the module doc). Each round makes what progress it can; a slab is committed only once
    /// the client holds it on its surviving replicas and the new server and nowhere else.
    fn repair(&mut self, view: &PoolView, client: &Client) {
        let lost = |m: &Move| m.slab.vm == self.vm && !view.servers.contains_key(&m.from);
        if !view
            .vm_slabs(self.vm)
            .any(|(_, r)| r.replicas.iter().any(|id| !view.servers.contains_key(id)))
        {
            self.repairs.clear();
            return;
        }
        let plan = farvm_pool::placement::repair_plan(view, PROTOCOL_VERSION);
        let moves: Vec<Move> = plan.moves.into_iter().filter(lost).collect();
        for mut m in moves {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let key = (m.slab, m.from.clone());
            match self.repairs.get(&key) {
                Some(to) if view.servers.contains_key(to) => m.to = to.clone(),
                _ => {
                    self.repairs.insert(key.clone(), m.to.clone());
                }
            }
            let Some(to) = self.connect(view, client, &m.to) else {
                tracing::warn!(%m, "memory pool: repair: the target cannot be reached");
                continue;
            };
            self.set_home_after(view, client, &m);
            match self.repair_slab(view, client, &m, to.addr) {
                Ok(true) => match self.dir.commit_move(&m) {
                    Ok(()) => {
                        self.repairs.remove(&key);
                        tracing::info!(%m, "memory pool: lost replica re-replicated");
                    }
                    Err(e) => tracing::warn!(%m, "memory pool: committing the repair: {e}"),
                },
                Ok(false) => {} // the client's copy is not there yet: next round
                Err(e) => tracing::warn!(%m, "memory pool: repair: {e}"),
            }
        }
    }

    /// Brings the client's replicas of pool slab `m.slab` to its surviving replicas plus
    /// `m.to` (at `to`); whether they are there now.
    fn repair_slab(
        &self,
        view: &PoolView,
        client: &Client,
        m: &Move,
        to: SocketAddr,
    ) -> Result<bool, String> {
        let Some(rec) = view.slabs.get(&m.slab) else {
            return Ok(false);
        };
        let keep: Vec<SocketAddr> = rec
            .replicas
            .iter()
            .filter(|id| **id != m.from)
            .filter_map(|id| self.servers.get(id).map(|e| e.addr))
            .chain([to])
            .collect();
        let j = m.slab.index as u64;
        let n = self.slabs;
        let ours = |k: &u64| k % n == j;
        // A copy on a server outside the slab's new replica set (the dead one, if the client
        // has not noticed yet) moves to `to`; once the client has dropped the dead replica,
        // it fills `to` itself, `to` being in the slab's home.
        for addr in self
            .servers
            .values()
            .map(|e| e.addr)
            .filter(|a| !keep.contains(a))
        {
            if client.slabs_on(self.ns, addr).iter().any(ours) {
                match client.move_replicas(self.ns, addr, to, &|k| k % n == j) {
                    Ok(_)
                    | Err(RelocateError::Busy { .. })
                    | Err(RelocateError::Changed { .. }) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
        let on_to = client.slabs_on(self.ns, to);
        let elsewhere = self
            .servers
            .values()
            .map(|e| e.addr)
            .filter(|a| !keep.contains(a))
            .any(|a| client.slabs_on(self.ns, a).iter().any(ours));
        let missing = keep
            .iter()
            .flat_map(|a| client.slabs_on(self.ns, *a))
            .filter(ours)
            .any(|k| on_to.binary_search(&k).is_err());
        Ok(!elsewhere && !missing)
    }
}
