//! The source of a live migration (module doc of [`super`]): pre-copy rounds while the guest
//! runs, then the paused VM's last changes, remote-page list, key, state and fence, and the
//! destination's answer, which decides between stopping here and running on.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use farvm_ept::SavedPage;
use farvm_seal::PageKey;
use twox_hash::{XxHash3_128, XxHash3_64};

use super::precopy::Precopy;
use super::wire::{Channel, Kind};
use super::MigrationError;
use crate::snapshot::machine::check_saveable;
use crate::snapshot::manifest::{Manifest, FORMAT, PAGES, POOL_VERSION};
use crate::snapshot::pages::MemoryRecord;
use crate::snapshot::remote::{file_offset, RemoteRecord, KEY, RECORD, REMOTE_PAGES};
use crate::snapshot::{listed_page, SnapshotError};
use crate::spec::VmSpec;
use crate::vm::{VmOutcome, VmShared, VmState, PAUSE_TIMEOUT};

const PAGE: usize = 4096;
/// Pages per frame.
const BATCH: usize = 64;
/// How long the destination may take from the last frame to its answer (it builds and loads
/// the VM).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the source waits for etcd to settle a failed handover before it gives up (the
/// VM stays paused: which host owns it is not known).
const CANCEL_PATIENCE: Duration = Duration::from_secs(300);

/// What a migration did.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Migrated {
    /// The destination.
    pub to: String,
    /// Pre-copy rounds run while the guest ran.
    pub rounds: u32,
    /// Pages sent in each round (the last entry: while paused).
    pub pages_per_round: Vec<u64>,
    /// The downtime limit the pre-copy aimed for (the source's part of the pause), seconds.
    pub downtime_limit_secs: f64,
    /// What the pre-copy estimated, when it paused the guest, the source's part of the pause
    /// would take, seconds.
    pub pause_estimate_secs: f64,
    /// Resident pages at the pause (the local memory that had to move).
    pub resident_pages: u64,
    /// Pages left in the pool (not sent).
    pub remote_pages: u64,
    /// Bytes sent to the destination in all.
    pub bytes_sent: u64,
    /// How long the guest was paused, from the pause to the destination's answer, seconds.
    pub paused_secs: f64,
    /// Of which: reading the paused VM's state and last pages and sending them, seconds.
    pub final_phase_secs: f64,
    /// Of which: the destination's build and load of the VM, from its last frame received to
    /// its answer (the namespace taken over), seconds.
    pub destination_secs: f64,
    /// The whole migration, seconds.
    pub total_secs: f64,
    /// The destination answered (false: its answer was lost, and etcd says it took the VM).
    pub confirmed: bool,
}

/// The source's record of what the destination holds: per guest page, the 64-bit hash of
/// the content sent (0: nothing, or zeros).
struct Sent {
    hash: Vec<u64>,
    zero: u64,
}

impl Sent {
    fn new(pages: u64) -> Self {
        Self {
            hash: vec![0; pages as usize],
            zero: XxHash3_64::oneshot(&[0u8; PAGE]),
        }
    }

    /// The hash of `data` if the destination does not hold it for `page` (None: it does).
    fn changed(&self, page: u64, data: &[u8]) -> Option<u64> {
        let h = XxHash3_64::oneshot(data);
        let held = match self.hash[page as usize] {
            0 => self.zero,
            h => h,
        };
        (h != held).then_some(h)
    }
}

/// Pages batched into frames.
struct Batch {
    buf: Vec<u8>,
    pages: usize,
    /// Pages sent through it.
    total: u64,
}

impl Batch {
    fn new() -> Self {
        Self {
            buf: Vec::with_capacity(BATCH * (8 + PAGE) + 64),
            pages: 0,
            total: 0,
        }
    }

    /// Adds a page; true when that filled a frame and it went out.
    fn push(&mut self, ch: &mut Channel, page: u64, data: &[u8]) -> Result<bool, MigrationError> {
        self.buf.extend_from_slice(&page.to_le_bytes());
        self.buf.extend_from_slice(data);
        self.pages += 1;
        self.total += 1;
        if self.pages == BATCH {
            self.flush(ch)?;
            return Ok(true);
        }
        Ok(false)
    }

    fn flush(&mut self, ch: &mut Channel) -> Result<(), MigrationError> {
        if self.pages > 0 {
            ch.send(Kind::Pages, &mut self.buf)?;
            self.pages = 0;
        }
        Ok(())
    }
}

/// Migrates `vm` (made from `spec`, on a memory pool) to the farvm waiting at `to`
/// (`farvm run --incoming`), over a stream sealed with `key`, its pre-copy aiming for a pause
/// of `downtime_limit` on the source's side ([`super::precopy`]). On success the VM stops here
/// ([`VmOutcome::Migrated`]); on failure it runs on here (resumed unless it was paused
/// before) and the error says why.
pub fn migrate(
    vm: &VmShared,
    spec: &VmSpec,
    to: &str,
    key: &PageKey,
    downtime_limit: Duration,
) -> Result<Migrated, MigrationError> {
    let started = Instant::now();
    check_saveable(spec, vm.board.agent().is_some())?;
    let was_paused = match vm.state() {
        VmState::Running => false,
        VmState::Paused => true,
        other => return Err(MigrationError::Refused(format!("the VM is {other}"))),
    };
    let saving = vm.remote_saving().ok_or_else(|| {
        MigrationError::Refused(
            "live migration moves a VM on a memory pool (farvm run --pool): this VM's memory \
             is not remote"
                .into(),
        )
    })?;
    let pool_vm = saving.pool.vm().ok_or_else(|| {
        MigrationError::Refused(
            "live migration needs a memory pool (farvm run --pool): this VM's remote memory \
             is not in one"
                .into(),
        )
    })?;
    let page_key = saving
        .keys
        .as_ref()
        .map(|k| k.settled_key())
        .transpose()
        .map_err(|e| MigrationError::Refused(e.to_string()))?;
    let addr = to
        .to_socket_addrs()
        .map_err(|source| MigrationError::Io {
            what: "resolving the destination",
            source,
        })?
        .next()
        .ok_or_else(|| MigrationError::Refused(format!("`{to}` has no address")))?;
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10)).map_err(|source| {
        MigrationError::Io {
            what: "connecting to the destination",
            source,
        }
    })?;
    let _ = stream.set_nodelay(true);
    let mut ch = Channel::open(stream, key)?;
    ch.read_timeout(Some(Duration::from_secs(30)))?;
    let regions: Vec<(u64, u64)> = vm
        .ram
        .regions()
        .iter()
        .map(|r| (r.gpa(), r.len()))
        .collect();
    let bytes: u64 = regions.iter().map(|r| r.1).sum();
    let mut start = serde_json::to_vec(&Start {
        spec: spec.clone(),
        regions: regions.clone(),
        bytes,
        pool_vm: pool_vm.to_string(),
        sealed: page_key.is_some(),
    })
    .map_err(|e| MigrationError::Protocol(e.to_string()))?;
    ch.send(Kind::Start, &mut start)?;
    // The key next: the destination builds the VM (its memory client opens the pool's pages
    // with it) while the pre-copy runs.
    if let Some(k) = &page_key {
        let mut b = k.export().to_vec();
        ch.send(Kind::Key, &mut b)?;
    }

    let engine = &saving.engine;
    let mut sent = Sent::new(span_pages(&regions));
    let mut batch = Batch::new();
    let mut out = Migrated {
        to: to.to_string(),
        ..Migrated::default()
    };
    // Pre-copy: the guest runs, until what is left fits the downtime limit.
    let mut precopy = Precopy::new(downtime_limit);
    loop {
        precopy.begin_round(engine.resident_pages());
        let before = batch.total;
        let round = engine.copy_resident_pages(|p, data| -> Result<(), RoundEnd> {
            if (p as usize) < sent.hash.len() {
                if let Some(h) = sent.changed(p, data) {
                    let frame_out = batch.push(&mut ch, p, data)?;
                    sent.hash[p as usize] = h;
                    if frame_out && precopy.sent(BATCH as u64, || engine.resident_pages()) {
                        return Err(RoundEnd::Fits);
                    }
                }
            }
            Ok(())
        });
        let cut_short = match round {
            Ok(()) => false,
            Err(RoundEnd::Fits) => true,
            Err(RoundEnd::Failed(e)) => return Err(e),
        };
        batch.flush(&mut ch)?;
        let n = batch.total - before;
        out.rounds += 1;
        out.pages_per_round.push(n);
        tracing::info!(
            round = out.rounds,
            pages = n,
            cut_short,
            "migration: pre-copy round"
        );
        if cut_short {
            break;
        }
        // The last frame of a round counts too.
        precopy.sent(n % BATCH as u64, || engine.resident_pages());
        if !precopy.another_round(n) {
            break;
        }
    }
    let pending = precopy.pending();
    let estimate = precopy.pause_estimate(pending);
    out.downtime_limit_secs = precopy.limit().as_secs_f64();
    out.pause_estimate_secs = estimate.as_secs_f64();
    if estimate > precopy.limit() {
        tracing::warn!(
            pending,
            estimate_ms = estimate.as_secs_f64() * 1e3,
            limit_ms = precopy.limit().as_secs_f64() * 1e3,
            "migration: the pre-copy stopped converging; the pause will exceed the downtime limit"
        );
    }

    if std::env::var("FARVM_MIGRATION_FAULT").as_deref() == Ok("source-crash-before-pause") {
        // A failure injected on purpose, for the tests: the source dies mid-stream.
        tracing::warn!("FARVM_MIGRATION_FAULT=source-crash-before-pause: exiting as a crash would");
        std::process::exit(crate::exit_code::HOST_ERROR);
    }
    // Stop and copy: the guest is paused from here.
    vm.pause(PAUSE_TIMEOUT)
        .map_err(|e| MigrationError::Refused(e.to_string()))?;
    let paused_at = Instant::now();
    let resume = |e: MigrationError| {
        if !was_paused {
            if let Err(r) = vm.resume() {
                tracing::error!("the migration failed and the VM could not be resumed: {r}");
            }
        }
        e
    };
    let fence = saving
        .pool
        .handover_fence()
        .map_err(|e| resume(MigrationError::Pool(e.to_string())))?;
    let last = final_phase(
        vm,
        spec,
        &mut ch,
        &mut sent,
        &mut batch,
        &regions,
        bytes,
        fence,
        page_key.as_ref(),
        &pool_vm.to_string(),
        saving.namespace,
    )
    .map_err(resume)?;
    out.final_phase_secs = paused_at.elapsed().as_secs_f64();
    out.pages_per_round.push(last.sent);
    out.resident_pages = last.resident;
    out.remote_pages = last.remote;

    // The destination's answer decides.
    let answer = ch
        .read_timeout(Some(ANSWER_TIMEOUT))
        .and_then(|()| receive_outcome(&mut ch))
        .map(|secs| out.destination_secs = secs);
    out.bytes_sent = ch.sent;
    match answer {
        Ok(()) => {
            out.confirmed = true;
            saving.pool.handed_over();
        }
        Err(e) => {
            tracing::warn!(
                "migration: no answer from the destination ({e}); settling the handover in etcd"
            );
            if keep_after_failure(saving, fence)? {
                return Err(resume(match e {
                    MigrationError::Destination(_) => e,
                    e => MigrationError::Destination(e.to_string()),
                }));
            }
            tracing::warn!("migration: the destination took the VM over, but its answer was lost");
            saving.pool.handed_over();
        }
    }
    out.paused_secs = paused_at.elapsed().as_secs_f64();
    out.total_secs = started.elapsed().as_secs_f64();
    tracing::info!(
        to = %out.to,
        rounds = out.rounds,
        resident_pages = out.resident_pages,
        remote_pages = out.remote_pages,
        bytes_sent = out.bytes_sent,
        paused_ms = out.paused_secs * 1e3,
        "VM migrated; stopping it here"
    );
    vm.request_stop(VmOutcome::Migrated { to: to.to_string() });
    Ok(out)
}

/// Guest pages spanned by `regions`.
fn span_pages(regions: &[(u64, u64)]) -> u64 {
    regions
        .iter()
        .map(|&(g, l)| (g + l).div_ceil(PAGE as u64))
        .max()
        .unwrap_or(0)
}

/// The source's first frame.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Start {
    /// The VM's description.
    pub spec: VmSpec,
    /// Guest RAM's regions, `(gpa, len)`, in page-file order.
    pub regions: Vec<(u64, u64)>,
    /// The page file's length.
    pub bytes: u64,
    /// The VM's id in the pool.
    pub pool_vm: String,
    /// Whether its pages are sealed: a [`Kind::Key`] frame follows.
    pub sealed: bool,
}

/// The source's last frame.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Finish {
    /// The snapshot manifest the destination restores.
    pub manifest: Manifest,
    /// The handover fence.
    pub fence: i64,
    /// The source's wall clock when it read the paused VM's state, in ns since the Unix epoch
    /// (`snapshot::clock`): the destination moves the guest's clocks forward by the time
    /// since.
    #[serde(default)]
    pub state_read_at_ns: Option<u64>,
}

/// The destination's answer.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Outcome {
    /// None: loaded, namespace taken over, the guest runs there.
    pub error: Option<String>,
    /// From the last frame received to this answer, seconds.
    #[serde(default)]
    pub secs: f64,
}

struct LastRound {
    sent: u64,
    resident: u64,
    remote: u64,
}

/// The paused VM's last changes, remote list, key, state and fence.
#[allow(clippy::too_many_arguments)]
fn final_phase(
    vm: &VmShared,
    spec: &VmSpec,
    ch: &mut Channel,
    sent: &mut Sent,
    batch: &mut Batch,
    regions: &[(u64, u64)],
    bytes: u64,
    fence: i64,
    page_key: Option<&PageKey>,
    pool_vm: &str,
    namespace: u64,
) -> Result<LastRound, MigrationError> {
    let state_read_at_ns = crate::snapshot::clock::realtime_ns();
    let (vcpus, kvm, devices) = crate::snapshot::machine_state(vm)?;
    let saving = vm
        .remote_saving()
        .ok_or_else(|| MigrationError::Refused("the VM's memory is not remote".into()))?;
    let before = batch.total;
    let (mut hasher, mut remote_hasher) = (XxHash3_128::new(), XxHash3_128::new());
    let (mut written, mut remote_pages) = (0u64, 0u64);
    let (mut drops, mut remote) = (Vec::new(), Vec::new());
    let mut resident = 0u64;
    let mut from_old_file = vec![0u8; PAGE];
    saving
        .engine
        .save_pages(|p, what| -> Result<(), ListFailure> {
            let held = sent.hash.get(p as usize).copied().unwrap_or(0) != 0;
            let what = listed_page(
                saving.snapshot_pages.as_deref(),
                p,
                what,
                &mut from_old_file,
            )
            .map_err(|e| ListFailure::Migration(MigrationError::Snapshot(e)))?;
            match what {
                SavedPage::Resident(data) => {
                    resident += 1;
                    let Some(at) = file_offset(regions, p) else {
                        return Ok(());
                    };
                    if data.iter().all(|&b| b == 0) {
                        if held {
                            drops.extend_from_slice(&p.to_le_bytes());
                            sent.hash[p as usize] = 0;
                        }
                        return Ok(());
                    }
                    hasher.write(&(at / PAGE as u64).to_le_bytes());
                    hasher.write(data);
                    written += 1;
                    if (p as usize) < sent.hash.len() {
                        if let Some(h) = sent.changed(p, data) {
                            batch.push(ch, p, data)?;
                            sent.hash[p as usize] = h;
                        }
                    }
                }
                SavedPage::Remote(fp) => {
                    if held {
                        drops.extend_from_slice(&p.to_le_bytes());
                        sent.hash[p as usize] = 0;
                    }
                    let mut rec = [0u8; RECORD];
                    rec[..8].copy_from_slice(&p.to_le_bytes());
                    rec[8..].copy_from_slice(&fp.to_le_bytes());
                    remote_hasher.write(&rec);
                    remote.extend_from_slice(&rec);
                    remote_pages += 1;
                    if remote.len() >= RECORD * 65536 {
                        ch.send(Kind::Remote, &mut remote)?;
                    }
                }
            }
            Ok(())
        })
        .map_err(|e| match e {
            ListFailure::Engine(e) => {
                MigrationError::Snapshot(SnapshotError::Memory(e.to_string()))
            }
            ListFailure::Migration(e) => e,
        })?;
    batch.flush(ch)?;
    if !remote.is_empty() {
        ch.send(Kind::Remote, &mut remote)?;
    }
    if !drops.is_empty() {
        ch.send(Kind::Drop, &mut drops)?;
    }
    let key_file = page_key.map(|_| KEY.to_string());
    let manifest = Manifest {
        format: FORMAT.into(),
        version: POOL_VERSION,
        farvm_version: env!("CARGO_PKG_VERSION").into(),
        vm: spec.clone(),
        memory: MemoryRecord {
            file: PAGES.to_string(),
            regions: regions.to_vec(),
            bytes,
            pages_written: written,
            digest: format!("{:032x}", hasher.finish_128()),
        },
        vcpus,
        kvm,
        devices,
        pool: Some(RemoteRecord {
            pool_vm: pool_vm.to_string(),
            namespace,
            file: REMOTE_PAGES.to_string(),
            pages: remote_pages,
            digest: format!("{:032x}", remote_hasher.finish_128()),
            key_file,
        }),
        sealed: None,
    };
    let mut fin = serde_json::to_vec(&Finish {
        manifest,
        fence,
        state_read_at_ns: Some(state_read_at_ns),
    })
    .map_err(|e| MigrationError::Protocol(e.to_string()))?;
    ch.send(Kind::Finish, &mut fin)?;
    Ok(LastRound {
        sent: batch.total - before,
        resident,
        remote: remote_pages,
    })
}

/// Why a pre-copy round ended before its last page.
enum RoundEnd {
    /// What is left fits the downtime limit: pause now.
    Fits,
    /// Sending failed.
    Failed(MigrationError),
}

impl From<MigrationError> for RoundEnd {
    fn from(e: MigrationError) -> Self {
        RoundEnd::Failed(e)
    }
}

/// An error of the engine's listing, or of sending what it lists.
enum ListFailure {
    Engine(farvm_ept::EngineError),
    Migration(MigrationError),
}

impl From<farvm_ept::EngineError> for ListFailure {
    fn from(e: farvm_ept::EngineError) -> Self {
        ListFailure::Engine(e)
    }
}

impl From<MigrationError> for ListFailure {
    fn from(e: MigrationError) -> Self {
        ListFailure::Migration(e)
    }
}

/// Reads the destination's answer: Ok (with the seconds it took) if it runs the VM.
fn receive_outcome(ch: &mut Channel) -> Result<f64, MigrationError> {
    let mut buf = Vec::new();
    match ch.recv(&mut buf)? {
        Kind::Outcome => {}
        k => {
            return Err(MigrationError::Protocol(format!(
                "expected the destination's answer, got {k:?}"
            )))
        }
    }
    let o: Outcome =
        serde_json::from_slice(&buf).map_err(|e| MigrationError::Protocol(e.to_string()))?;
    match o.error {
        None => Ok(o.secs),
        Some(e) => Err(MigrationError::Destination(e)),
    }
}

/// After a failed or unanswered final phase: cancels the handover on `fence` (retrying
/// while etcd does not answer). Ok(true): the VM stays here; Ok(false): the destination
/// took it first.
fn keep_after_failure(
    saving: &crate::remote::RemoteSaving,
    fence: i64,
) -> Result<bool, MigrationError> {
    let deadline = Instant::now() + CANCEL_PATIENCE;
    loop {
        match saving.pool.cancel_handover(fence) {
            Ok(kept) => return Ok(kept),
            Err(e) if Instant::now() < deadline => {
                tracing::warn!("migration: cannot settle the handover yet ({e}); the VM stays paused until etcd answers");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => {
                return Err(MigrationError::Pool(format!(
                    "the destination did not answer and etcd did not settle the handover \
                     within {} s ({e}); the VM stays paused here: `farvm pool status` shows \
                     which host owns it",
                    CANCEL_PATIENCE.as_secs()
                )))
            }
        }
    }
}
