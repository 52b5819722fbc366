//! Assembling a VM's remote memory: the memserver client (and a local `farvm-memserver` child
//! process when no server is given, see [`super::local_server`]), its page store
//! ([`PageStore`]), the prefetcher, and the paging engine (`farvm-ept`) that owns guest RAM. Also the glue that tells the engine which host thread runs which vCPU and where
//! each vCPU's agent slot is, and the late binding of stage-2 injection to the KVM VM.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use farvm_ept::stage2::{PreFaultError, StageTwo};
use farvm_ept::translate::{GuestPaging, VirtualPages};
use farvm_ept::{
    Budget, Engine, EngineConfig, EngineError, EngineParts, LostPage, Stats, DEFAULT_PROBE_EVERY,
};
use farvm_memclient::{
    namespace_for_name, Client, ClientConfig, ClientStats, Endpoint, PageKey, PageStore,
    StoreConfig, Transport,
};
use farvm_memproto::auth::load_token_file;
use serde::Serialize;

use super::local_server::LocalServer;
use super::page_file::{PageFileStore, SnapshotPageFile};
use super::pool::{PoolSpec, PoolVm};
use super::stage2::KvmPreFault;
use crate::devices::pvctl::PvCtl;
use crate::vstate::memory::{GuestRam, MemError};
use crate::vstate::outcome::{OutcomeLatch, VmOutcome};

/// Errors setting up remote memory.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// A remote-memory setting out of range or inconsistent.
    #[error("invalid remote-memory setting: {0}")]
    Config(String),
    /// The `farvm-memserver` child could not be started.
    #[error("cannot start the local memory server: {0}")]
    LocalServer(#[from] super::local_server::LocalServerError),
    /// No memory server answered (or the handshake failed).
    #[error("cannot reach the memory servers: {0}")]
    Connect(String),
    /// The page key file cannot be read, is readable by others, or holds no valid key
    /// (`--memory-key-file`, or `memory_key_file` in the host config).
    #[error("page key (--memory-key-file, or memory_key_file in the host config): {msg}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The token file cannot be read or holds no valid secret.
    #[error("cannot read --memserver-token-file {path}: {msg}")]
    Token {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// The memory pool failed (`--pool`).
    #[error("memory pool: {0}")]
    Pool(String),
    /// The snapshot being restored no longer owns its namespace in the pool (restored already,
    /// or deleted).
    #[error("memory pool: {0}")]
    SnapshotGone(String),
    /// The memory pool cannot take the VM: no room for its replicas, or etcd did not answer
    /// within `--pool-wait`.
    #[error("memory pool: {0}")]
    PoolUnavailable(String),
    /// `--fault-path-cpu` names a CPU this process may not run on.
    #[error("cannot pin the fault path to CPU {cpu}: {source}")]
    Placement {
        /// The CPU.
        cpu: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// The paging engine refused its configuration or could not start.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What `farvm run` was asked for.
#[derive(Clone, Debug)]
pub struct RemoteSpec {
    /// VM name (the memserver namespace is derived from it).
    pub vm_name: String,
    /// Memory servers, each with its transport (`farvm run --memserver [rdma://]HOST:PORT`;
    /// RDMA's page mode is `--rdma-pages`); empty (and no pool) = start a local
    /// `farvm-memserver` child on loopback.
    pub servers: Vec<Endpoint>,
    /// A memory pool to be admitted to instead of a server list (`farvm run --pool`).
    pub pool: Option<PoolSpec>,
    /// Replication factor (default: 2 with ≥ 2 servers, else 1).
    pub replicas: Option<usize>,
    /// Tenant secret file (one hex secret; the first line is used).
    pub token_file: Option<PathBuf>,
    /// Local-memory budget.
    pub budget: Budget,
    /// Prefetcher name (`farvm_prefetch::registry::names()`).
    pub prefetcher: String,
    /// Every N-th injected prefetch stays staged as a probe (0 = off).
    pub probe_every: u32,
    /// Request timeout of the client.
    pub timeout: Duration,
    /// Page numbers the prefetcher learns from.
    pub page_space: PageSpace,
    /// Host CPU for the fault path (vCPU 0, the fault handler and the local memserver's
    /// connection threads; see [`crate::affinity`]); `None` leaves placement to the scheduler.
    pub fault_path_cpu: Option<usize>,
    /// The guest is Linux: the CR3 values its agent publishes follow Linux's conventions
    /// (`farvm_ept::translate::GuestPaging::root_of`).
    pub linux_guest: bool,
    /// Build the stage-2 entries of injected pages with KVM_PRE_FAULT_MEMORY where KVM supports
    /// it (`farvm run --stage2-prefault on|off`); off leaves them to the guest's first touch.
    pub stage2_prefault: bool,
    /// One prefetch history for the whole guest even with a guest agent attached
    /// (`farvm run --history global`): the baseline of per-process histories.
    pub global_history: bool,
    /// Keep a log of this many resolved faults with the process each was attributed to
    /// (`farvm run --fault-log`); 0 = off.
    pub fault_log_records: usize,
    /// Guest RAM's backing (`farvm run --guest-memory memfd|anon`); `None`: the engine's
    /// default (`FARVM_GUEST_MEMORY`, else memfd).
    pub guest_memory: Option<farvm_ept::GuestMemory>,
    /// Seal every page sent to a memory server (`farvm run --page-encryption on|off`,
    /// default on; docs/sealing.md): AES-256-GCM under the VM's page key, bound to the
    /// namespace, page number and write version, so that the servers can neither read guest
    /// memory nor serve a forged, misplaced or stale page. TCP servers only.
    pub page_encryption: bool,
    /// The page key (`--memory-key-file`: 32 raw bytes or 64 hex digits); `None`: a key drawn
    /// from the OS RNG for this run only.
    pub memory_key_file: Option<PathBuf>,
    /// Restoring a pool VM's snapshot: take its namespace back instead of being admitted.
    pub pool_restore: Option<super::PoolRestore>,
    /// A lazy restore (`farvm run --restore-pages`): the snapshot's page file, which serves
    /// the resident pages on the guest's first touch.
    pub snapshot_pages: Option<Arc<SnapshotPageFile>>,
}

impl RemoteSpec {
    /// Defaults: a local memserver, 50% local, the default prefetcher learning from virtual
    /// page numbers.
    pub fn new(vm_name: &str) -> Self {
        Self {
            vm_name: vm_name.to_string(),
            servers: Vec::new(),
            pool: None,
            replicas: None,
            token_file: None,
            budget: Budget::Percent(50.0),
            prefetcher: farvm_prefetch::registry::DEFAULT.to_string(),
            probe_every: DEFAULT_PROBE_EVERY,
            timeout: Duration::from_secs(2),
            fault_path_cpu: None,
            page_space: PageSpace::Virtual,
            linux_guest: false,
            stage2_prefault: true,
            global_history: false,
            fault_log_records: 0,
            guest_memory: None,
            page_encryption: true,
            memory_key_file: None,
            pool_restore: None,
            snapshot_pages: None,
        }
    }
}

/// Which page numbers the prefetcher learns from (`farvm run --page-space`).
pub use farvm_vmconfig::PageSpace;

/// Request timeout towards the local loopback memserver (see `RemoteMemory::start`).
const EMBEDDED_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a demand read's waiter polls the local memserver under `--fault-path-cpu`
/// (`ClientConfig::demand_poll`; measured: a demand round trip on one CPU is ~25 µs).
const DEMAND_POLL: Duration = Duration::from_micros(50);

/// A stage-2 injector bound to the KVM VM once it exists (the engine, which owns guest RAM,
/// must start before the VM is created). Until then a call fails softly (`Failed`, which keeps
/// the engine trying) — in practice nothing is injected before the guest runs.
#[derive(Default)]
pub struct LateStageTwo(OnceLock<KvmPreFault>);

impl StageTwo for LateStageTwo {
    fn pre_fault(&self, gpa: u64, len: u64) -> Result<(), PreFaultError> {
        match self.0.get() {
            Some(s) => s.pre_fault(gpa, len),
            None => Err(PreFaultError::Failed(libc::EAGAIN)),
        }
    }
}

/// Whether injected pages get their stage-2 entries ahead of the guest's touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage2Prefault {
    /// KVM_PRE_FAULT_MEMORY is used.
    On,
    /// Turned off (`RemoteSpec::stage2_prefault`).
    Off,
    /// Asked for, but this KVM refused it (e.g. shadow paging): host-PTE injection only.
    Unsupported,
}

/// Health of the memserver side, for stats.
#[derive(Clone, Debug, Serialize)]
pub struct RemoteHealth {
    /// The memory servers in use.
    pub servers: Vec<String>,
    /// The memory server is the one farvm started itself (no `--memserver` given).
    pub embedded: bool,
    /// The VM instance's id in the memory pool (`--pool`), if admitted to one.
    pub pool_vm: Option<String>,
    /// Slab replicas moved to another server (a drain, a rebalance, a full server).
    pub replicas_moved: u64,
    /// Replicas dropped from their slab because they missed a write (their server failed
    /// or was out of service while it was made); the slab is re-replicated.
    pub replicas_dropped: u64,
    /// Replicas dropped because a read from them returned an older copy of a page than its
    /// last write (the paging engine's fingerprint check); the page was read elsewhere.
    pub replicas_rejected: u64,
    /// Pages are sealed before they leave the VMM (`--page-encryption on`).
    pub page_encryption: bool,
    /// Read responses whose sealed pages failed authentication (forged, misplaced or stale on
    /// the server): never installed; their replica left the slab, or the page was lost.
    pub remote_unauthentic: u64,
    /// The id of the page key new pages are sealed under (`None`: pages are not sealed).
    pub key_id: Option<String>,
    /// While a key rotation runs (`farvm rotate-key`): the id of the key being rotated out.
    pub previous_key_id: Option<String>,
    /// While a key rotation runs: pages that may still be sealed under the previous key (the
    /// stored pages the re-seal sweep has not reached yet); 0 once it dropped the key.
    pub pages_to_reseal: u64,
    /// Pages re-sealed under a new key by rotations so far.
    pub resealed_pages: u64,
    /// Key rotations finished: the previous key was dropped.
    pub key_rotations: u64,
    /// Copies of each page.
    pub replication: usize,
    /// Times a memserver was taken out of service (timeout, lost connection).
    pub dead_servers: u64,
    /// Times a memserver answered again and was put back in service.
    pub rejoined_servers: u64,
    /// Reads served by another replica after one failed.
    pub read_failovers: u64,
    /// Slabs copied to a new replica after one was lost.
    pub slabs_rereplicated: u64,
    /// Slabs with fewer live replicas than asked for.
    pub degraded_slabs: u64,
    /// Slabs with no replica in service: the guest waits on their pages until one returns.
    pub suspended_slabs: u64,
    /// Wire requests sent.
    pub wire_requests: u64,
    /// Submissions that waited for a free request buffer.
    pub slot_waits: u64,
    /// Submissions refused as busy.
    pub busy: u64,
    /// Requests that failed.
    pub failed_requests: u64,
}

/// A key rotation started (the reply to `farvm rotate-key`).
#[derive(Clone, Debug, Serialize)]
pub struct KeyRotation {
    /// The id of the key being rotated out (dropped once no page is left under it).
    pub previous: String,
    /// The id of the key every page is now sealed under.
    pub current: String,
}

/// Why a key rotation was not started.
#[derive(Debug, thiserror::Error)]
pub enum RotateKeyError {
    /// The key ring refused it (one is under way).
    #[error(transparent)]
    Refused(#[from] farvm_memclient::RotateError),
    /// The VM's pages are not sealed.
    #[error("the VM's pages are not sealed (--page-encryption off): there is no key to rotate")]
    NotSealed,
    /// The VM's paging engine has stopped.
    #[error("the VM's remote memory has stopped")]
    Stopped,
    /// No key could be drawn.
    #[error("cannot draw a new page key: {0}")]
    Key(farvm_memclient::KeyError),
}

/// Everything `farvm stats` shows about paging.
#[derive(Clone, Debug, Serialize)]
pub struct RemoteStats {
    /// The paging engine's counters, latencies and page states.
    pub engine: Stats,
    /// The memory servers' side.
    pub remote: RemoteHealth,
    /// Whether stage-2 pre-fault is on, off or unsupported.
    pub stage2_prefault: Stage2Prefault,
    /// A lazy restore's reads from its snapshot's page file (absent for any other VM).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lazy_restore: Option<super::page_file::LazyRestoreStats>,
}

/// Where stats come from, without keeping the engine alive (for the control socket and the
/// metrics endpoint, which may outlive a run by a moment).
#[derive(Clone)]
pub struct StatsSource {
    engine: Weak<Engine>,
    store: Weak<PageStore>,
    servers: Vec<Endpoint>,
    embedded: bool,
    pool_vm: Option<String>,
    stage2_prefault: bool,
    snapshot_pages: Option<Arc<SnapshotPageFile>>,
}

impl StatsSource {
    /// Current statistics, or `None` once the engine is gone.
    pub fn stats(&self) -> Option<RemoteStats> {
        let engine = self.engine.upgrade()?;
        let store = self.store.upgrade()?;
        let mut stats = collect(
            &engine,
            &store,
            &self.servers,
            self.embedded,
            self.pool_vm.clone(),
            self.stage2_prefault,
        );
        stats.lazy_restore = self.snapshot_pages.as_ref().map(|f| f.stats());
        Some(stats)
    }

    /// The engine, while it runs (per-process statistics, agent-slot changes).
    pub fn engine(&self) -> Option<Arc<Engine>> {
        self.engine.upgrade()
    }

    /// Starts a key rotation (`farvm rotate-key`, docs/sealing.md "Rotation"): a key drawn
    /// from the OS RNG becomes current at once; the engine's evictor re-seals the stored
    /// pages under it and then the previous key is dropped. Refused while one runs, when
    /// pages are not sealed, or once the VM's paging has stopped.
    pub fn rotate_key(&self) -> Result<KeyRotation, RotateKeyError> {
        let engine = self.engine.upgrade().ok_or(RotateKeyError::Stopped)?;
        let store = self.store.upgrade().ok_or(RotateKeyError::Stopped)?;
        let keys = store.client().keys().ok_or(RotateKeyError::NotSealed)?;
        let key = PageKey::generate().map_err(RotateKeyError::Key)?;
        let current = key.id();
        let previous = keys.rotate(key)?;
        tracing::info!(%previous, %current, "page key rotated; re-sealing the stored pages");
        let stats = engine.stats();
        if stats.budget_pages >= stats.total_pages {
            // All of guest RAM may stay local: no evictor runs, nothing was ever written back
            // to be re-sealed.
            keys.drop_previous();
        }
        Ok(KeyRotation {
            previous: previous.to_string(),
            current: current.to_string(),
        })
    }
}

fn collect(
    engine: &Engine,
    store: &PageStore,
    servers: &[Endpoint],
    embedded: bool,
    pool_vm: Option<String>,
    stage2_prefault: bool,
) -> RemoteStats {
    let client = store.client();
    let ClientStats {
        dead_servers,
        read_failovers,
        slabs_rereplicated,
        degraded_slabs,
        suspended_slabs,
        rejoined_servers,
        replicas_moved,
        replicas_dropped,
        replicas_rejected,
        ..
    } = client.stats();
    let c = store.counters();
    let keys = client.keys().map(|k| k.state());
    let keys = keys.as_ref();
    let engine = engine.stats();
    let pages_to_reseal = match (keys.and_then(|k| k.previous), engine.reseal_left) {
        (None, _) => 0,
        (Some(_), Some(left)) => left,
        // Rotated, the sweep not started yet: every page ever stored may be under it.
        (Some(_), None) => engine.total_pages - engine.states[0],
    };
    let (resealed_pages, key_rotations) = (
        engine.counters.resealed_pages,
        engine.counters.reseal_sweeps,
    );
    RemoteStats {
        stage2_prefault: match (stage2_prefault, engine.stage2_prefault) {
            (false, _) => Stage2Prefault::Off,
            (true, true) => Stage2Prefault::On,
            (true, false) => Stage2Prefault::Unsupported,
        },
        engine,
        lazy_restore: None,
        remote: RemoteHealth {
            servers: servers.iter().map(|s| s.to_string()).collect(),
            embedded,
            pool_vm,
            replicas_moved,
            replicas_dropped,
            replicas_rejected,
            page_encryption: client.seals_pages(),
            remote_unauthentic: client.unauthentic_reads(),
            key_id: keys.map(|k| k.current.to_string()),
            previous_key_id: keys.and_then(|k| k.previous).map(|id| id.to_string()),
            pages_to_reseal,
            resealed_pages,
            key_rotations,
            replication: client.replication(),
            dead_servers,
            rejoined_servers,
            read_failovers,
            slabs_rereplicated,
            degraded_slabs,
            suspended_slabs,
            wire_requests: c.requests.load(Ordering::Relaxed),
            slot_waits: c.slot_waits.load(Ordering::Relaxed),
            busy: c.busy.load(Ordering::Relaxed),
            failed_requests: c.failed_requests.load(Ordering::Relaxed),
        },
    }
}

/// The VM's page key if pages are sealed (`RemoteSpec::page_encryption`): loaded from
/// `--memory-key-file`, else drawn for this run; `given` (a restored VM's) wins. Sealing is
/// implemented on TCP links only, so an RDMA server is refused with the way out named.
fn page_key(
    spec: &RemoteSpec,
    servers: &[Endpoint],
    given: Option<PageKey>,
) -> Result<Option<PageKey>, RemoteError> {
    if !spec.page_encryption {
        if spec.memory_key_file.is_some() {
            return Err(RemoteError::Config(
                "--memory-key-file needs --page-encryption on".into(),
            ));
        }
        tracing::warn!(
            "--page-encryption off: guest pages travel to and rest on the memory servers in \
             the clear, and a forged, misplaced or stale page is caught only if it fails the \
             engine's fingerprint check"
        );
        return Ok(None);
    }
    if let Some(rdma) = servers.iter().find(|e| e.transport != Transport::Tcp) {
        return Err(RemoteError::Config(format!(
            "memory server {rdma}: --page-encryption on (the default) seals pages on TCP links \
             only; run with --page-encryption off to use RDMA (pages then travel and rest in \
             the clear)"
        )));
    }
    let key = match (given, &spec.memory_key_file) {
        (Some(key), _) => key,
        (None, Some(path)) => PageKey::from_file(path).map_err(|e| RemoteError::Key {
            path: path.clone(),
            msg: e.to_string(),
        })?,
        (None, None) => PageKey::generate().map_err(|e| RemoteError::Config(e.to_string()))?,
    };
    tracing::info!(key = %key.id(), "guest pages are sealed (AES-256-GCM) before they leave the VMM");
    Ok(Some(key))
}

/// A VM's remote memory: the engine owning guest RAM plus its store.
pub struct RemoteMemory {
    engine: Arc<Engine>,
    store: Arc<PageStore>,
    stage2: Arc<LateStageTwo>,
    servers: Vec<Endpoint>,
    local: Option<LocalServer>,
    pool: Option<PoolVm>,
    /// The VM's namespace on the memory servers.
    namespace: u64,
    fault_path_cpu: Option<usize>,
    guest_paging: Arc<GuestPaging>,
    stage2_prefault: bool,
    watcher_stop: Arc<AtomicBool>,
    watcher: Option<JoinHandle<()>>,
    /// A lazy restore's page file (its pages not yet written back are served from it).
    snapshot_pages: Option<Arc<SnapshotPageFile>>,
    /// A working set fetched behind the running guest (`restore-ws`), stopped by
    /// `watcher_stop` and joined before the engine stops.
    background_fetch: std::sync::Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for RemoteMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteMemory")
            .field("servers", &self.servers)
            .field("local_server", &self.local.is_some())
            .finish()
    }
}

/// Forwards to a shared [`LateStageTwo`] (the engine takes a `Box<dyn StageTwo>`).
struct SharedStageTwo(Arc<LateStageTwo>);

impl StageTwo for SharedStageTwo {
    fn pre_fault(&self, gpa: u64, len: u64) -> Result<(), PreFaultError> {
        self.0.pre_fault(gpa, len)
    }
}

impl RemoteMemory {
    /// Connects (or starts a local memserver), builds the prefetcher and starts the engine
    /// with `mem_bytes` of guest RAM, laid out as [`crate::layout::ram_ranges`] says: above
    /// 3 GiB the engine's range also spans the 3..4 GiB MMIO hole, whose pages the guest never
    /// touches (they are in no KVM memslot) and so cost nothing.
    pub fn start(spec: &RemoteSpec, mem_bytes: u64) -> Result<Self, RemoteError> {
        let prefetcher = farvm_prefetch::registry::build(
            &spec.prefetcher,
            &farvm_prefetch::registry::Config::default(),
        )
        .map_err(|e| RemoteError::Config(e.to_string()))?;
        if spec.pool.is_some() && !spec.servers.is_empty() {
            return Err(RemoteError::Config(
                "give memory servers either as --memserver or as --pool, not both".into(),
            ));
        }
        let mut pool = None;
        let (servers, local) = if let Some(ps) = &spec.pool {
            let local_budget = match spec.budget {
                Budget::Unlimited => mem_bytes,
                Budget::Bytes(b) => b,
                Budget::Percent(p) => (mem_bytes as f64 * p / 100.0) as u64 & !4095,
            };
            let (member, admission) = match &spec.pool_restore {
                Some(r) => match r.takeover_fence {
                    Some(fence) => PoolVm::incoming(ps, r.vm, fence)?,
                    None => PoolVm::restore(ps, r.vm)?,
                },
                None => PoolVm::admit(ps, &spec.vm_name, mem_bytes, local_budget, spec.replicas)?,
            };
            pool = Some((member, admission.clone()));
            (admission.servers, None)
        } else if spec.servers.is_empty() {
            // Room for every guest page plus slack; the arena is MAP_NORESERVE, so only pages
            // actually written back cost host memory. Its connection threads are the server's
            // half of the fault path: pinned with it.
            let h = LocalServer::start(mem_bytes + (64 << 20), spec.fault_path_cpu)?;
            (vec![Endpoint::tcp(h.addr())], Some(h))
        } else {
            (spec.servers.clone(), None)
        };
        let mut ccfg = ClientConfig::new(servers.clone());
        // Write-backs the evictor waits on get their own connection (measured: behind a
        // prefetch stream on a shared one, an eviction round took ~750 µs and bounded a
        // write-heavy scan at ~15 µs per page).
        ccfg.write_lane = true;
        ccfg.replication = spec.replicas;
        // A request to the local memserver can only be slow because this host is overloaded
        // (measured: under `perf record -a -g` a 2 s timeout took the local server out of
        // service, and with it the only copy of the guest's pages). Remote servers keep the
        // configured timeout: there a timeout means a failed server.
        ccfg.timeout = if local.is_some() {
            spec.timeout.max(EMBEDDED_TIMEOUT)
        } else {
            spec.timeout
        };
        // One bulk connection per server: its receiver delivers straight to the engine.
        ccfg.conns_per_server = 1;
        // A fault injected on purpose, for the tests of the integrity checks (docs/pool.md).
        if let Ok(f) = std::env::var("FARVM_FAULT_INJECT") {
            match f.as_str() {
                "stale-copy" => {
                    tracing::warn!(
                        "FARVM_FAULT_INJECT=stale-copy: the first slab copy will lack the writes \
                         made during it (a test of the integrity checks)"
                    );
                    ccfg.fault = Some(farvm_memclient::Fault::StaleCopy);
                }
                other => {
                    return Err(RemoteError::Config(format!(
                        "FARVM_FAULT_INJECT={other}: unknown fault (known: stale-copy)"
                    )))
                }
            }
        }
        // The local memserver's connection threads share the fault handler's CPU: a demand
        // read's waiter yields it to them and polls, so their answer wakes nobody
        // (docs/data-path-journal.md, "The demand path"). Elsewhere the poll would only spin.
        if local.is_some() && spec.fault_path_cpu.is_some() {
            ccfg.demand_poll = DEMAND_POLL;
        }
        let key_spec;
        let spec = match spec.pool_restore.as_ref().filter(|_| spec.pool.is_some()) {
            // A restored pool VM opens its remote pages with the snapshot's key.
            Some(r) => {
                key_spec = RemoteSpec {
                    memory_key_file: r.key_file.clone(),
                    ..spec.clone()
                };
                &key_spec
            }
            None => spec,
        };
        // A key at hand (unwrapped from a sealed snapshot, received by a migration) is the
        // one the pool's pages are sealed under; the checks of `page_key` still apply.
        let restored_key = spec.pool_restore.as_ref().and_then(|r| r.key.clone());
        ccfg.page_key = match page_key(spec, &servers, restored_key) {
            Ok(k) => k,
            Err(e) => {
                if let Some((member, _)) = pool {
                    member.exit(Duration::from_secs(5));
                }
                return Err(e);
            }
        };
        if let Some(path) = &spec.token_file {
            let tokens = load_token_file(path).map_err(|e| RemoteError::Token {
                path: path.clone(),
                msg: e.to_string(),
            })?;
            let first = tokens
                .into_iter()
                .next()
                .ok_or_else(|| RemoteError::Token {
                    path: path.clone(),
                    msg: "the file holds no secret".into(),
                })?;
            ccfg.secret = Some(first);
        }
        if let Some((_, admission)) = &pool {
            ccfg.slab_homes = admission.homes.clone();
            // The pool's placement module decides every replica's server (rack-aware, with
            // its room reserved); the follower hands its decisions to the client as homes.
            ccfg.pool_placement = true;
            ccfg.replication = Some(admission.replication);
            ccfg.slab_pages = (admission.slab_bytes / 4096).max(1);
        } else if let Some(r) = spec.replicas {
            if r == 0 || r > servers.len() {
                return Err(RemoteError::Config(format!(
                    "--replicas {r} needs between 1 and {} (the number of --memserver)",
                    servers.len()
                )));
            }
        }
        let client = match Client::connect(ccfg) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                if let Some((member, _)) = pool {
                    member.exit(Duration::from_secs(5));
                }
                return Err(RemoteError::Connect(e.to_string()));
            }
        };
        let span = crate::layout::ram_ranges(mem_bytes)
            .last()
            .map_or(mem_bytes, |&(gpa, len)| gpa + len);
        if let (Some(_), Some((_, admission))) = (&spec.pool_restore, &pool) {
            // The saved VM's client wrote these slabs: reads go to their servers.
            let slabs = client.adopt_home_placements(admission.namespace, span / 4096);
            tracing::info!(
                slabs,
                "restored pool VM: its slabs are where the pool placed them"
            );
        }
        let (pool, namespace) = match pool {
            Some((mut member, admission)) => {
                member.follow(Arc::downgrade(&client));
                (Some(member), admission.namespace)
            }
            None => (None, namespace_for_name(&spec.vm_name)),
        };
        let store = PageStore::new(
            client,
            StoreConfig {
                namespace,
                slots: 256,
            },
        );
        let mut cfg = EngineConfig::new(span);
        // A share is of guest RAM, not of the span with the hole in it.
        cfg.budget = match spec.budget {
            Budget::Percent(p) if span != mem_bytes => {
                Budget::Bytes(((mem_bytes as f64 * p / 100.0) as u64 & !4095).max(4096))
            }
            b => b,
        };
        cfg.probe_every = spec.probe_every;
        cfg.prefetch = spec.prefetcher != "none";
        cfg.global_history = spec.global_history;
        cfg.fault_log_records = spec.fault_log_records;
        if let Some(g) = spec.guest_memory {
            cfg.guest_memory = g;
        }
        let stage2 = Arc::new(LateStageTwo::default());
        // A lazy restore serves the snapshot's resident pages from its page file.
        let engine_store: Arc<dyn farvm_ept::store::RemoteStore> = match &spec.snapshot_pages {
            Some(file) => Arc::new(PageFileStore::new(file.clone(), store.clone())),
            None => store.clone(),
        };
        let mut parts = EngineParts::new(engine_store, prefetcher);
        parts.stage2 = Box::new(SharedStageTwo(stage2.clone()));
        let guest_paging = Arc::new(GuestPaging::new(spec.linux_guest));
        if spec.page_space == PageSpace::Virtual {
            parts.page_space = Box::new(VirtualPages::with_paging(guest_paging.clone()));
        }
        let engine = match Engine::start(cfg, parts) {
            Ok(e) => Arc::new(e),
            Err(e) => {
                store.stop();
                if let Some(member) = pool {
                    member.exit(Duration::from_secs(5));
                }
                return Err(e.into());
            }
        };
        let remote = Self {
            engine,
            store,
            stage2,
            servers,
            local,
            pool,
            namespace,
            fault_path_cpu: spec.fault_path_cpu,
            guest_paging,
            stage2_prefault: spec.stage2_prefault,
            watcher_stop: Arc::new(AtomicBool::new(false)),
            watcher: None,
            snapshot_pages: spec.snapshot_pages.clone(),
            background_fetch: std::sync::Mutex::new(None),
        };
        if let Some(cpu) = spec.fault_path_cpu {
            // The fault handler now; the local server pinned its connection threads itself
            // (`--connection-cpu`), before answering their handshakes. vCPU 0 has not started
            // yet: `watch_vcpus` pins it when it registers.
            crate::affinity::pin_thread(remote.engine.fault_thread_id(), cpu)
                .map_err(|source| RemoteError::Placement { cpu, source })?;
            tracing::info!(cpu, "fault path pinned (vCPU 0 follows when it starts)");
        }
        Ok(remote)
    }

    /// What a snapshot needs to leave this VM's remote pages on its pool's servers (None
    /// without a pool: a snapshot then writes every page).
    pub fn saving(&self) -> Option<super::RemoteSaving> {
        let pool = self.pool.as_ref()?;
        Some(super::RemoteSaving {
            engine: self.engine.clone(),
            namespace: self.namespace,
            keys: self.store.client().keys().cloned(),
            pool: pool.snapshot_handle(),
            snapshot_pages: self.snapshot_pages.clone(),
        })
    }

    /// Fetches `pages` (a restored snapshot's working set) in their order on a thread of its
    /// own while the guest runs; [`RemoteMemory::shutdown`] stops and joins it.
    pub fn fetch_in_background(&self, pages: Vec<u64>) -> std::io::Result<()> {
        let h = super::working_set::fetch_in_background(
            self.engine.clone(),
            pages,
            self.snapshot_pages.clone(),
            self.watcher_stop.clone(),
        )?;
        *self
            .background_fetch
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(h);
        Ok(())
    }

    /// The engine (guest RAM, stats).
    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// How the guest's page tables look, as the engine's page space reads them (the VMM
    /// sets the paging depth once it learns it).
    pub fn guest_paging(&self) -> &Arc<GuestPaging> {
        &self.guest_paging
    }

    /// The threads [`RemoteSpec::fault_path_cpu`] pins: the fault handler, the local
    /// memserver's connection threads (in its process) and vCPU 0 (once registered).
    pub fn fault_path_thread_ids(&self) -> Vec<i32> {
        let mut tids = vec![self.engine.fault_thread_id()];
        tids.extend(self.local.iter().flat_map(|h| h.connection_thread_ids()));
        tids.extend(self.engine.vcpu_thread_id(0).map(|t| t as i32));
        tids
    }

    /// The memory servers in use.
    pub fn servers(&self) -> &[Endpoint] {
        &self.servers
    }

    /// Wires the engine to a VM created on [`RemoteMemory::guest_ram`], before it starts:
    /// stage-2 injection on KVM VM `vm_fd` ([`RemoteMemory::bind_kvm`]), vCPU thread
    /// (`vcpu_tids`) and agent-slot (`pv`) attribution ([`RemoteMemory::watch_vcpus`]), and a
    /// guest need of a lost page ends the VM through `latch` with [`VmOutcome::MemoryLost`] (no
    /// data can ever be given to that vCPU), and so does the pool reclaiming the VM's remote
    /// memory, with [`VmOutcome::MemoryReclaimed`].
    pub fn attach_vm(
        &mut self,
        vm_fd: std::os::fd::RawFd,
        pv: &Arc<PvCtl>,
        latch: &Arc<OutcomeLatch>,
        vcpu_tids: impl Fn() -> Vec<i32> + Send + 'static,
    ) {
        let ncpus = pv.ncpus();
        self.bind_kvm(vm_fd, ncpus);
        let engine = Arc::downgrade(&self.engine);
        pv.set_paging_counters(Box::new(move || engine.upgrade().map(|e| e.counters())));
        let engine = Arc::downgrade(&self.engine);
        pv.set_process_counters(Box::new(move |cr3, pid| {
            engine.upgrade()?.process_counters(cr3, pid)
        }));
        // A guest agent unregistering its slots may free their pages as soon as its write
        // returns: the engine stops reading them first (registrations the watcher picks up).
        let engine = Arc::downgrade(&self.engine);
        pv.set_slot_listener(Box::new(move |cpu, gpa| {
            if let (None, Some(e)) = (gpa, engine.upgrade()) {
                if let Err(err) = e.clear_agent_slot(cpu) {
                    tracing::warn!("clearing the agent slot of vCPU {cpu}: {err}");
                }
            }
        }));
        let slots = Arc::downgrade(pv);
        self.watch_vcpus(ncpus, vcpu_tids, move |cpu| {
            slots.upgrade().and_then(|pv| pv.agent_slot_gpa(cpu))
        });
        if let Some(pool) = &self.pool {
            let latch = Arc::downgrade(latch);
            pool.on_reclaimed(move || {
                if let Some(l) = latch.upgrade() {
                    l.decide(VmOutcome::MemoryReclaimed);
                }
            });
        }
        let latch = Arc::downgrade(latch);
        let store = Arc::downgrade(&self.store);
        self.engine.on_page_lost(move |gpa| match latch.upgrade() {
            // Deciding kicks every vCPU: KVM returns before the guest runs again.
            Some(l) => {
                // Lost because the pool reclaimed the namespace: say so (the pool follower
                // says it too once it sees etcd; whichever comes first decides).
                if store.upgrade().is_some_and(|s| s.reclaimed()) {
                    l.decide(VmOutcome::MemoryReclaimed);
                } else {
                    l.decide(VmOutcome::MemoryLost { gpa });
                }
                LostPage::Release
            }
            None => LostPage::Hold,
        });
    }

    /// Binds stage-2 injection to the KVM VM (`guest_vcpus` = the guest's vCPU count; the
    /// pre-fault vCPU, if supported and not turned off, gets the next id).
    pub fn bind_kvm(&self, vm_fd: std::os::fd::RawFd, guest_vcpus: u32) {
        let s = if self.stage2_prefault {
            KvmPreFault::new(vm_fd, guest_vcpus)
        } else {
            KvmPreFault::disabled()
        };
        let _ = self.stage2.0.set(s);
    }

    /// Starts a thread that registers each vCPU thread id (`tids()`, 0 = not started yet) and
    /// each vCPU's agent slot (`slot(cpu)`) with the engine as they appear, and pins vCPU 0 to
    /// the fault-path CPU if one was asked for ([`RemoteSpec::fault_path_cpu`]).
    pub fn watch_vcpus(
        &mut self,
        ncpus: u32,
        tids: impl Fn() -> Vec<i32> + Send + 'static,
        slot: impl Fn(u32) -> Option<u64> + Send + 'static,
    ) {
        let engine = self.engine.clone();
        let stop = self.watcher_stop.clone();
        let fault_path_cpu = self.fault_path_cpu;
        let h = std::thread::Builder::new()
            .name("ept-attach".into())
            .spawn(move || {
                let mut tid_done = vec![0i32; ncpus as usize];
                let mut slot_done = vec![None; ncpus as usize];
                let mut round = 0u32;
                while !stop.load(Ordering::Acquire) {
                    for (cpu, t) in tids().into_iter().enumerate().take(ncpus as usize) {
                        if t > 0 && tid_done[cpu] != t {
                            if let Err(e) = engine.register_vcpu(cpu as u32, t as u32) {
                                tracing::warn!("registering vCPU {cpu}: {e}");
                            }
                            if let (0, Some(host_cpu)) = (cpu, fault_path_cpu) {
                                if let Err(e) = crate::affinity::pin_thread(t, host_cpu) {
                                    tracing::warn!("pinning vCPU 0 to CPU {host_cpu}: {e}");
                                }
                            }
                            tid_done[cpu] = t;
                        }
                    }
                    for cpu in 0..ncpus {
                        let s = slot(cpu);
                        if s != slot_done[cpu as usize] {
                            // None after Some: the guest agent unregistered its slots.
                            let r = match s {
                                Some(gpa) => engine.set_agent_slot(cpu, gpa),
                                None => engine.clear_agent_slot(cpu),
                            };
                            if let Err(e) = r {
                                tracing::warn!("agent slot of vCPU {cpu}: {e}");
                            }
                            slot_done[cpu as usize] = s;
                        }
                    }
                    // Fast at boot (faults before registration are unattributed), slow after.
                    round += 1;
                    let all =
                        tid_done.iter().all(|&t| t > 0) && slot_done.iter().all(|s| s.is_some());
                    std::thread::sleep(if all || round > 2000 {
                        Duration::from_millis(50)
                    } else {
                        Duration::from_micros(500)
                    });
                }
            });
        match h {
            Ok(h) => self.watcher = Some(h),
            Err(e) => tracing::warn!("cannot start the vCPU attach thread: {e}"),
        }
    }

    /// Engine and memserver statistics.
    pub fn stats(&self) -> RemoteStats {
        let mut stats = collect(
            &self.engine,
            &self.store,
            &self.servers,
            self.local.is_some(),
            self.pool.as_ref().map(|p| p.vm().to_string()),
            self.stage2_prefault,
        );
        stats.lazy_restore = self.snapshot_pages.as_ref().map(|f| f.stats());
        stats
    }

    /// A handle for reading stats later without keeping the engine alive.
    pub fn stats_source(&self) -> StatsSource {
        StatsSource {
            engine: Arc::downgrade(&self.engine),
            store: Arc::downgrade(&self.store),
            servers: self.servers.clone(),
            embedded: self.local.is_some(),
            pool_vm: self.pool.as_ref().map(|p| p.vm().to_string()),
            stage2_prefault: self.stage2_prefault,
            snapshot_pages: self.snapshot_pages.clone(),
        }
    }

    /// Guest RAM paged by the engine: its guest view as the KVM memslot, every VMM access a
    /// copy made by the engine ([`GuestRam::paged`]).
    pub fn guest_ram(&self) -> Result<Arc<GuestRam>, MemError> {
        Ok(Arc::new(GuestRam::paged(&self.engine)?))
    }

    /// Stops the watcher, then the engine (waiting for its outstanding I/O), then the store
    /// and the local server. Call once nothing else holds the engine (the VM is dropped);
    /// if something still does, the local server is left running rather than pulled from
    /// under a live engine.
    pub fn shutdown(mut self) {
        self.watcher_stop.store(true, Ordering::Release);
        if let Some(h) = self.watcher.take() {
            let _ = h.join();
        }
        let fetch = self
            .background_fetch
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = fetch {
            let _ = h.join();
        }
        let Self {
            engine,
            local,
            store,
            pool,
            ..
        } = self;
        match Arc::into_inner(engine) {
            Some(e) => e.shutdown(),
            None => {
                tracing::warn!("paging engine still referenced at shutdown; leaving it running");
                std::mem::forget(local);
                std::mem::forget(pool);
                return;
            }
        }
        // Close the client first so the server going away is not seen as a failure. Its
        // connections are closed here, not when its last handle goes: a handle on the store
        // may outlive this teardown (seen: a long-lived process logged the local server's
        // stop as a server failure at every VM's end).
        store.stop();
        store.client().close_connections();
        drop(store);
        if let Some(h) = local {
            h.shutdown();
        }
        // The VM is gone and its client closed: the servers may drop its pages now.
        if let Some(member) = pool {
            member.exit(Duration::from_secs(10));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sealing is on by default with a key per run; a key file is loaded (and must be a key);
    /// an RDMA server is refused with the way out named; off takes no key.
    #[test]
    fn the_page_key_follows_the_options_and_rdma_is_refused_while_sealing() {
        let tcp = [Endpoint::tcp(([127, 0, 0, 1], 7070).into())];
        let mut spec = RemoteSpec::new("t");
        assert!(spec.page_encryption);
        let drawn = page_key(&spec, &tcp, None).unwrap().expect("a key per run");
        let again = page_key(&spec, &tcp, None).unwrap().expect("a key per run");
        assert_ne!(drawn.id(), again.id(), "each run draws its own key");

        let dir = std::env::temp_dir().join(format!("farvm-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("key");
        std::fs::write(&file, "42".repeat(32)).unwrap();
        spec.memory_key_file = Some(file.clone());
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = page_key(&spec, &tcp, None).unwrap_err().to_string();
        assert!(e.contains("must be readable by its owner only"), "{e}");
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        let loaded = page_key(&spec, &tcp, None)
            .unwrap()
            .expect("the file's key");
        assert_eq!(loaded.id(), PageKey::from_bytes([0x42; 32]).id());
        std::fs::write(&file, "not a key").unwrap();
        let e = page_key(&spec, &tcp, None).unwrap_err();
        assert!(
            matches!(&e, RemoteError::Key { path, .. } if *path == file),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();

        spec.memory_key_file = None;
        let rdma = [Endpoint {
            addr: ([10, 0, 0, 5], 7071).into(),
            transport: Transport::Rdma { one_sided: true },
        }];
        let e = page_key(&spec, &rdma, None).unwrap_err().to_string();
        assert!(e.contains("--page-encryption off"), "{e}");

        spec.page_encryption = false;
        assert!(page_key(&spec, &rdma, None).unwrap().is_none());
        spec.memory_key_file = Some(file);
        let e = page_key(&spec, &tcp, None).unwrap_err().to_string();
        assert!(
            e.contains("--memory-key-file needs --page-encryption on"),
            "{e}"
        );
    }
}
