//! The engine: owns guest RAM, the uffd, the page-state table and the threads (fault handler,
//! evictor); the public [`Engine`] handle the VMM keeps for the VM's lifetime.
//!
//! Shared state lives in [`Inner`]; each thread module (`fault`, `complete`, `evict`, `access`)
//! adds its methods to it. The store holds only a `Weak` to it (through the completion sink), so
//! dropping the [`Engine`] tears everything down.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use farvm_prefetch::Prefetcher;

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::hash::{self, Fingerprint};
use crate::stage2::{StageTwo, StageTwoGate};
use crate::state::{self as st, PageTable};
use crate::stats::{CounterValues, Counters, Histograms, Stats};
use crate::store::{Completion, CompletionSink, GuestPage, RemoteStore};
use crate::sys::mem::GuestRam;
use crate::sys::poll::EventFd;
use crate::sys::uffd::{self, Uffd};
use crate::translate::{Identity, PageSpace};
use crate::vcpu::{VcpuTable, MAX_VCPUS};
use crate::PAGE_SIZE;

/// Errors kept for [`Engine::take_errors`] (oldest first; later ones are counted, not kept).
const MAX_KEPT_ERRORS: usize = 256;

pub(crate) struct Inner {
    pub cfg: EngineConfig,
    pub ram: GuestRam,
    pub uffd: Uffd,
    pub table: PageTable,
    /// Fingerprint of each resident page's remote (clean) content, two words per page.
    clean: Box<[AtomicU64]>,
    /// Per page: when the demand fault was read (ns since `epoch`).
    pub t_fault: Box<[AtomicU64]>,
    /// Per page: when its read was submitted, then (staged pages) when it arrived.
    pub t_io: Box<[AtomicU64]>,
    /// Per page: the eviction sequence number at its last eviction + 1 (0 = never evicted),
    /// for refault-distance detection (as Linux's workingset does for page cache).
    pub evicted_at: Box<[AtomicU32]>,
    /// Pages evicted so far (the refault-distance clock).
    pub evict_seq: AtomicU64,
    pub zero_fp: Fingerprint,
    pub store: Arc<dyn RemoteStore>,
    pub stage2: StageTwoGate,
    pub vcpus: VcpuTable,
    pub counters: Counters,
    pub hist: Histograms,
    pub resident: AtomicU64,
    pub budget: u64,
    pub reserve: u64,
    /// Prefetches may fill up to here.
    pub low_water: u64,
    /// The evictor starts above this and evicts down to `evict_target`, keeping headroom
    /// below `low_water` so prefetches keep finding frames while demand runs.
    pub evict_start: u64,
    pub evict_target: u64,
    pub prefetch_inflight: AtomicU64,
    /// Reads and writes handed to the store and not yet completed.
    pub outstanding: AtomicU64,
    /// Wakes the fault handler: frames freed, a retry queued, stop.
    pub kick: EventFd,
    pub evictor: OnceLock<Thread>,
    /// Pages whose failed demand read must be retried (failure path only).
    pub retry_tx: crossbeam_channel::Sender<GuestPage>,
    pub retry_rx: crossbeam_channel::Receiver<GuestPage>,
    /// Consumed prefetches, offered to the evictor first (Leap's eager eviction).
    pub consumed_tx: crossbeam_channel::Sender<GuestPage>,
    pub consumed_rx: crossbeam_channel::Receiver<GuestPage>,
    /// Write-back completions, for the evictor.
    pub wb_tx: crossbeam_channel::Sender<Completion>,
    pub wb_rx: crossbeam_channel::Receiver<Completion>,
    errors: Mutex<VecDeque<EngineError>>,
    pub errors_total: AtomicU64,
    /// When an error was last logged (ns, [`Inner::now`]); see [`Inner::push_error`].
    errors_logged_at: AtomicU64,
    /// Errors not logged since then.
    errors_unlogged: AtomicU64,
    pub stop: AtomicBool,
    /// Told when the guest or a VMM access needs a `LOST` page ([`Engine::on_page_lost`]).
    on_lost: OnceLock<Box<dyn Fn(u64) -> LostPage + Send + Sync>>,
    epoch: Instant,
    pub prefetcher_name: &'static str,
}

impl Inner {
    #[inline]
    pub fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    pub fn pages(&self) -> u64 {
        self.table.len()
    }

    #[inline]
    pub fn clean_fp(&self, p: u64) -> Fingerprint {
        let lo = self.clean[2 * p as usize].load(Ordering::Relaxed) as u128;
        let hi = self.clean[2 * p as usize + 1].load(Ordering::Relaxed) as u128;
        lo | (hi << 64)
    }

    /// Set by the page's current owner (INFLIGHT / EVICTING) before it publishes a new state.
    #[inline]
    pub fn set_clean_fp(&self, p: u64, fp: Fingerprint) {
        self.clean[2 * p as usize].store(fp as u64, Ordering::Relaxed);
        self.clean[2 * p as usize + 1].store((fp >> 64) as u64, Ordering::Relaxed);
    }

    /// Fingerprint of the memfd page behind `p`.
    ///
    /// Caller owns the page (INFLIGHT with data landed, or EVICTING after the zap).
    #[inline]
    pub fn fingerprint(&self, p: u64) -> Fingerprint {
        // SAFETY: `p` is in range and the caller owns the page, so nobody writes it now.
        unsafe { hash::of_page(self.ram.alias_page(p)) }
    }

    /// Takes one resident frame: demand may use the reserve, prefetch may not.
    pub fn try_reserve(&self, demand: bool) -> bool {
        let limit = if demand { self.budget } else { self.low_water };
        let ok = self
            .resident
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                (r < limit).then_some(r + 1)
            })
            .is_ok();
        if self.resident.load(Ordering::Relaxed) > self.evict_start {
            self.wake_evictor();
        }
        ok
    }

    /// Something needs page `p`, whose data the memory servers lost: counted, and reported to
    /// the VMM's handler (which stops the VM) or, without one, logged.
    pub fn lost_page_accessed(&self, p: u64) {
        self.counters.lost_accesses.fetch_add(1, Ordering::Relaxed);
        let gpa = p * PAGE_SIZE as u64;
        let action = match self.on_lost.get() {
            Some(f) => f(gpa),
            None => {
                tracing::error!(
                    "guest page {gpa:#x} is needed but its data is lost; nothing can serve it"
                );
                LostPage::Hold
            }
        };
        if action == LostPage::Release {
            self.release_lost(p);
        }
    }

    /// Lets vCPUs blocked on lost page `p` leave the fault, so their threads can return from
    /// KVM_RUN once the VM is stopping: maps a page of zeros at `p` and wakes them. The page
    /// stays `LOST` (VMM accesses fail, nothing is written back). The guest never runs on
    /// those zeros: the VMM kicked its vCPUs before saying `Release`, and KVM checks for the
    /// pending signal before entering the guest again. (Without this, the shadow-MMU fault
    /// path here retries the fault forever and KVM_RUN never returns.)
    fn release_lost(&self, p: u64) {
        // SAFETY: `p` is in range; a LOST page has no owner, nothing else writes its memfd
        // page, and the alias mapping is never uffd-registered (no fault into our own uffd).
        unsafe { core::ptr::write_bytes(self.ram.alias_page(p), 0, PAGE_SIZE) };
        if let Err(e) =
            self.uffd
                .continue_range(self.ram.guest_page_addr(p), PAGE_SIZE as u64, true)
        {
            tracing::error!("releasing vCPUs from lost guest page {p:#x}: {e}");
        }
    }

    pub fn release_frame(&self) {
        self.resident.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn wake_evictor(&self) {
        if let Some(t) = self.evictor.get() {
            t.unpark();
        }
    }

    /// Records an error: counted, kept (the first [`MAX_KEPT_ERRORS`]) and logged — the first
    /// ten, then at most one line a second with the number left unlogged, because a store that
    /// is unavailable fails every retry of every waiting page.
    pub fn push_error(&self, e: EngineError) {
        let n = self.errors_total.fetch_add(1, Ordering::Relaxed) + 1;
        let now = self.now();
        let last = self.errors_logged_at.load(Ordering::Relaxed);
        if n <= 10
            || (now.saturating_sub(last) >= 1_000_000_000
                && self
                    .errors_logged_at
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok())
        {
            self.errors_logged_at.store(now, Ordering::Relaxed);
            match self.errors_unlogged.swap(0, Ordering::Relaxed) {
                0 => tracing::warn!("{e}"),
                quiet => tracing::warn!("{e} ({quiet} more errors since the last one logged)"),
            }
        } else {
            self.errors_unlogged.fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(mut q) = self.errors.lock() {
            if q.len() < MAX_KEPT_ERRORS {
                q.push_back(e);
            }
        }
    }

    /// Publishes `p` as `LOCAL | flags(word)` (from INFLIGHT / STAGED / EVICTING, which the
    /// caller owns) and maps it into the guest view, waking waiters if `wake` or if the replaced
    /// word says a fault waits. The page is pinned across the UFFDIO_CONTINUE so the evictor
    /// cannot claim and zap it in between. Returns the replaced word.
    pub fn publish_local(&self, p: u64, flags: impl Fn(u32) -> u32, wake: bool) -> u32 {
        let old = self.claim_local(p, flags);
        let wake = wake || old & (st::F_WAITERS | st::F_DEMAND) != 0;
        self.map_pinned(p, 1, wake);
        old
    }

    /// First half of [`Inner::publish_local`]: the page becomes `LOCAL` with one pin held for
    /// the caller, not yet mapped. Returns the replaced word.
    pub fn claim_local(&self, p: u64, flags: impl Fn(u32) -> u32) -> u32 {
        self.table
            .update(p, |w| {
                Some(st::pins_only(w) + st::PIN_ONE + (st::LOCAL | flags(w) | st::F_REF))
            })
            .map(|(old, _)| old)
            .unwrap_or(0)
    }

    /// Second half: maps `n` claimed pages from `p` with one UFFDIO_CONTINUE and drops the pins.
    pub fn map_pinned(&self, p: u64, n: u64, wake: bool) {
        if let Err(e) =
            self.uffd
                .continue_range(self.ram.guest_page_addr(p), n * PAGE_SIZE as u64, wake)
        {
            // The pages stay LOCAL: the next guest fault on one retries its mapping.
            tracing::error!("UFFDIO_CONTINUE of guest pages {p:#x}+{n}: {e}");
        }
        for q in p..p + n {
            self.table.unpin(q);
        }
    }

    /// Zero-fills never-written page `p` (caller moved it to INFLIGHT and holds a frame).
    pub fn install_zero(&self, p: u64, wake: bool) {
        self.ram.allocate_zero(p);
        self.set_clean_fp(p, self.zero_fp);
        // Counted before the wake, so a woken vCPU never observes a stale count.
        self.counters.zero_fills.fetch_add(1, Ordering::Relaxed);
        self.publish_local(p, |_| 0, wake);
    }

    /// Whether faulting page `p` back now is a refault within the working set: it was evicted
    /// fewer than `budget` evictions ago, so a little more memory would have kept it.
    pub fn is_hot_refault(&self, p: u64) -> bool {
        if !self.cfg.refault_protect {
            return false;
        }
        let at = self.evicted_at[p as usize].load(Ordering::Relaxed);
        if at == 0 {
            return false;
        }
        let now = (self.evict_seq.load(Ordering::Relaxed) as u32).wrapping_add(1);
        (now.wrapping_sub(at) as u64) < self.budget
    }

    pub fn stats(&self) -> Stats {
        let mut s = Stats {
            counters: self.counters.snapshot(),
            total_pages: self.pages(),
            budget_pages: self.budget,
            reserve_pages: self.reserve,
            evict_target_pages: self.evict_target,
            resident_pages: self.resident.load(Ordering::Relaxed),
            prefetch_inflight: self.prefetch_inflight.load(Ordering::Relaxed),
            states: self.table.census(),
            prefetcher: self.prefetcher_name.to_string(),
            stage2_prefault: self.stage2.enabled(),
            ..Default::default()
        };
        s.fill_derived(&self.hist);
        s
    }
}

/// Completion sink handed to the store: a weak reference, so the store never keeps the engine
/// alive.
struct Sink(Weak<Inner>);

impl CompletionSink for Sink {
    fn complete(&self, batch: &[Completion]) {
        if let Some(inner) = self.0.upgrade() {
            inner.on_completions(batch);
        }
    }
}

/// A page's paging state, as reported to the VMM and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PageState {
    Never,
    Remote,
    InFlight,
    Local {
        pinned: bool,
        prefetched: bool,
    },
    Staged,
    Evicting,
    /// Its data is gone from every memory server (see `state::LOST`).
    Lost,
}

impl PageState {
    fn from_word(w: u32) -> Self {
        match st::state_of(w) {
            st::NEVER => Self::Never,
            st::REMOTE => Self::Remote,
            st::INFLIGHT => Self::InFlight,
            st::LOCAL => Self::Local {
                pinned: st::pins_of(w) > 0,
                prefetched: w & st::F_PREFETCHED != 0,
            },
            st::STAGED => Self::Staged,
            st::LOST => Self::Lost,
            _ => Self::Evicting,
        }
    }
}

/// What the engine does with vCPUs blocked on a lost page, as decided by the VMM's
/// [`Engine::on_page_lost`] handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LostPage {
    /// Keep them blocked in the fault.
    Hold,
    /// The VM is stopping and every vCPU has been kicked: map a page of zeros and wake them so
    /// their threads can return from KVM_RUN. Only safe when the guest cannot run again.
    Release,
}

/// The running paging engine of one VM.
pub struct Engine {
    inner: Arc<Inner>,
    threads: Vec<JoinHandle<()>>,
    /// Kernel thread id of the fault-handler thread.
    fault_tid: i32,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("pages", &self.inner.pages())
            .field("budget", &self.inner.budget)
            .finish()
    }
}

/// What the engine is built from.
pub struct EngineParts {
    pub store: Arc<dyn RemoteStore>,
    pub prefetcher: Box<dyn Prefetcher>,
    pub stage2: Box<dyn StageTwo>,
    pub page_space: Box<dyn PageSpace>,
}

impl EngineParts {
    pub fn new(store: Arc<dyn RemoteStore>, prefetcher: Box<dyn Prefetcher>) -> Self {
        Self {
            store,
            prefetcher,
            stage2: Box::new(crate::stage2::NoStageTwo),
            page_space: Box::new(Identity),
        }
    }
}

impl Engine {
    /// Creates guest RAM (all pages "never written"), registers it with userfaultfd and starts
    /// the fault-handler and evictor threads.
    pub fn start(cfg: EngineConfig, parts: EngineParts) -> Result<Self, EngineError> {
        let (budget, reserve) = cfg.resolve()?;
        let unlimited = budget >= cfg.total_pages();
        let (reserve, low_water) = if unlimited {
            (0, budget)
        } else {
            (reserve, budget - reserve)
        };
        // Prefetch headroom below the low-water mark: the larger of the in-flight cap, two
        // eviction batches and 1/8 of the budget, at most a quarter of it (small budgets). The
        // evictor then works in batches while prefetches keep finding frames.
        let headroom = (cfg.max_prefetch_inflight as u64)
            .max(cfg.evict_batch as u64 * 2)
            .max(low_water / 8)
            .min(low_water / 4);
        let len = usize::try_from(cfg.mem_bytes)
            .map_err(|_| EngineError::Config("guest memory size overflows usize".into()))?;
        let ram = GuestRam::new(len).map_err(|e| EngineError::os("creating guest RAM", e))?;
        let uffd = Uffd::open(
            uffd::feature::THREAD_ID | uffd::feature::MISSING_SHMEM | uffd::feature::MINOR_SHMEM,
        )
        .map_err(|e| {
            EngineError::os(
                "opening userfaultfd (needs root or vm.unprivileged_userfaultfd=1)",
                e,
            )
        })?;
        uffd.register(
            ram.guest_base(),
            ram.len() as u64,
            uffd::mode::MISSING | uffd::mode::MINOR,
        )
        .map_err(|e| EngineError::os("registering guest RAM with userfaultfd", e))?;
        let pages = ram.pages();
        let atomics = |n: u64| -> Box<[AtomicU64]> { (0..n).map(|_| AtomicU64::new(0)).collect() };
        let (retry_tx, retry_rx) = crossbeam_channel::unbounded();
        let (consumed_tx, consumed_rx) = crossbeam_channel::bounded(4096);
        let (wb_tx, wb_rx) = crossbeam_channel::bounded(4096);
        let EngineParts {
            store,
            prefetcher,
            stage2,
            page_space,
        } = parts;
        let inner = Arc::new(Inner {
            table: PageTable::new(pages),
            clean: atomics(2 * pages),
            t_fault: atomics(pages),
            t_io: atomics(pages),
            evicted_at: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            evict_seq: AtomicU64::new(0),
            zero_fp: hash::zero(),
            store: store.clone(),
            stage2: StageTwoGate::new(stage2),
            vcpus: VcpuTable::new(),
            counters: Counters::default(),
            hist: Histograms::default(),
            resident: AtomicU64::new(0),
            budget,
            reserve,
            low_water,
            evict_start: low_water.saturating_sub(headroom / 2),
            evict_target: low_water.saturating_sub(headroom),
            prefetch_inflight: AtomicU64::new(0),
            outstanding: AtomicU64::new(0),
            kick: EventFd::new().map_err(|e| EngineError::os("eventfd", e))?,
            evictor: OnceLock::new(),
            retry_tx,
            retry_rx,
            consumed_tx,
            consumed_rx,
            wb_tx,
            wb_rx,
            errors: Mutex::new(VecDeque::new()),
            errors_total: AtomicU64::new(0),
            errors_logged_at: AtomicU64::new(0),
            errors_unlogged: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            on_lost: OnceLock::new(),
            epoch: Instant::now(),
            prefetcher_name: prefetcher.name(),
            cfg,
            ram,
            uffd,
        });
        store
            .attach(Arc::new(Sink(Arc::downgrade(&inner))))
            .map_err(|error| EngineError::Store {
                op: "attach",
                gpa: 0,
                error,
            })?;
        let mut engine = Self {
            inner: inner.clone(),
            threads: Vec::new(),
            fault_tid: 0,
        };
        let handler = crate::fault::Handler::new(inner.clone(), prefetcher, page_space)?;
        let (tid_tx, tid_rx) = std::sync::mpsc::sync_channel(1);
        engine.threads.push(
            std::thread::Builder::new()
                .name("ept-fault".into())
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    let _ = tid_tx.send(unsafe { libc::gettid() });
                    handler.run()
                })
                .map_err(|e| EngineError::os("spawning the fault thread", e))?,
        );
        // The thread sends its id first thing; it only fails to if it could not start.
        engine.fault_tid = tid_rx.recv().unwrap_or(0);
        if !unlimited {
            let ev = inner.clone();
            let h = std::thread::Builder::new()
                .name("ept-evict".into())
                .spawn(move || crate::evict::run(ev))
                .map_err(|e| EngineError::os("spawning the evictor thread", e))?;
            let _ = inner.evictor.set(h.thread().clone());
            engine.threads.push(h);
        }
        tracing::info!(
            pages,
            budget,
            reserve,
            prefetcher = inner.prefetcher_name,
            "paging engine started"
        );
        Ok(engine)
    }

    /// Host address and length of guest RAM (guest-physical 0..len) for KVM memslots. The VMM
    /// must never load or store through it itself: use [`Engine::read_bytes`] and friends.
    pub fn guest_ram(&self) -> (u64, u64) {
        (self.inner.ram.guest_base(), self.inner.ram.len() as u64)
    }

    /// Kernel thread id of the fault-handler thread (0 if it did not start), for a VMM that
    /// places the fault path on CPUs: every demand fault is a hand-off between a vCPU thread
    /// and this one.
    pub fn fault_thread_id(&self) -> i32 {
        self.fault_tid
    }

    /// The thread registered as vCPU `vcpu` ([`Engine::register_vcpu`]), if any.
    pub fn vcpu_thread_id(&self, vcpu: u32) -> Option<u32> {
        self.inner.vcpus.tid(vcpu as usize)
    }

    /// Declares that thread `tid` runs vCPU `vcpu` (its faults are attributed to that vCPU).
    pub fn register_vcpu(&self, vcpu: u32, tid: u32) -> Result<(), EngineError> {
        if vcpu as usize >= MAX_VCPUS {
            return Err(EngineError::BadVcpu(vcpu));
        }
        self.inner.vcpus.set_tid(vcpu as usize, tid);
        Ok(())
    }

    /// Registers the agent slot page of `vcpu` at guest-physical `slot_gpa` (4 KiB aligned).
    /// The page is made resident and pinned: fault attribution reads it with no I/O.
    pub fn set_agent_slot(&self, vcpu: u32, slot_gpa: u64) -> Result<(), EngineError> {
        if vcpu as usize >= MAX_VCPUS {
            return Err(EngineError::BadVcpu(vcpu));
        }
        if !slot_gpa.is_multiple_of(PAGE_SIZE as u64) {
            return Err(EngineError::Config(format!(
                "agent slot GPA {slot_gpa:#x} is not 4 KiB aligned"
            )));
        }
        let page = self.inner.check_range(slot_gpa, PAGE_SIZE as u64)?.0;
        self.inner.pin_page(page)?;
        if let Some(old) = self.inner.vcpus.slot_page(vcpu as usize) {
            self.inner.table.unpin(old);
        }
        self.inner.vcpus.set_slot_page(vcpu as usize, page);
        Ok(())
    }

    /// Copies guest memory out, resolving absent pages through the engine (never a plain load
    /// of an absent page). Never-written pages read as zeros without being allocated.
    pub fn read_bytes(&self, gpa: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.inner.read_bytes(gpa, buf)
    }

    /// Copies into guest memory, making the pages resident first.
    pub fn write_bytes(&self, gpa: u64, data: &[u8]) -> Result<(), EngineError> {
        self.inner.write_bytes(gpa, data)
    }

    /// Makes `[gpa, gpa+len)` resident (returns once every page is installed).
    pub fn ensure_resident(&self, gpa: u64, len: u64) -> Result<(), EngineError> {
        self.inner.ensure_resident(gpa, len)
    }

    pub fn stats(&self) -> Stats {
        self.inner.stats()
    }

    /// The counters alone (relaxed loads, no histogram merge: cheap enough for every guest
    /// phase change).
    pub fn counters(&self) -> CounterValues {
        self.inner.counters.snapshot()
    }

    /// The paging state of the page holding `gpa` (None if outside guest RAM).
    pub fn page_state(&self, gpa: u64) -> Option<PageState> {
        let p = gpa / PAGE_SIZE as u64;
        (p < self.inner.pages()).then(|| PageState::from_word(self.inner.table.load(p)))
    }

    /// Sets what to do when the guest (or a VMM access) needs a page whose data the memory
    /// servers lost: `f(gpa)` runs on an engine thread, possibly more than once per page.
    /// There is no data to give a vCPU that faulted on it, so the VMM's handler should stop
    /// the VM: kick every vCPU, then return [`LostPage::Release`] to let the blocked ones
    /// leave the fault (see [`LostPage`]). Without a handler the loss is logged and counted
    /// (`Stats::lost_accesses`) and the vCPU stays blocked. Returns false if a handler was
    /// already set.
    pub fn on_page_lost(&self, f: impl Fn(u64) -> LostPage + Send + Sync + 'static) -> bool {
        self.inner.on_lost.set(Box::new(f)).is_ok()
    }

    /// Errors since the last call (store failures, lost pages), oldest first.
    pub fn take_errors(&self) -> Vec<EngineError> {
        self.inner
            .errors
            .lock()
            .map(|mut q| q.drain(..).collect())
            .unwrap_or_default()
    }

    /// Total errors ever reported (including ones not kept).
    pub fn errors_total(&self) -> u64 {
        self.inner.errors_total.load(Ordering::Relaxed)
    }

    /// Pages whose memfd backing is present (mincore), for checking the budget from outside.
    pub fn resident_by_mincore(&self) -> Result<u64, EngineError> {
        self.inner
            .ram
            .resident_count()
            .map_err(|e| EngineError::os("mincore", e))
    }

    /// Stops the threads and waits (up to 5 s) for store requests still in flight.
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.kick.kick();
        self.inner.wake_evictor();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.inner.outstanding.load(Ordering::Acquire) > 0 {
            if Instant::now() > deadline {
                // The store still owns buffers inside guest RAM: keep the mapping alive rather
                // than let it write into freed memory.
                tracing::error!("store requests still outstanding at shutdown; leaking guest RAM");
                std::mem::forget(self.inner.clone());
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            self.stop_threads();
        }
    }
}
