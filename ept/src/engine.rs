//! The public handle the VMM keeps for the VM's lifetime: [`Engine::start`] builds the parts
//! (`parts`), connects the completion path (`complete`) to the store and starts the threads
//! (the fault handler, `fault`; the evictor, `evict`); the methods answer the VMM from the
//! parts, VMM reads and writes of guest memory going through `access`. Dropping the engine
//! stops the threads: the store holds only a weak reference to the completion path.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use farvm_prefetch::Prefetcher;

use crate::access::Access;
use crate::complete::Completer;
use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::evict::Evictor;
use crate::fault::Handler;
use crate::lost::LostPage;
use crate::parts::Parts;
use crate::procstats::{ProcessCounterValues, ProcessSnapshot};
use crate::snapshot::{SavedPage, SnapshotPages};
use crate::stage2::StageTwo;
use crate::state::PageState;
use crate::stats::{CounterValues, Stats};
use crate::store::RemoteStore;
use crate::translate::{Identity, PageSpace};
use crate::vcpu::MAX_VCPUS;
use crate::PAGE_SIZE;

/// The running paging engine of one VM.
pub struct Engine {
    parts: Parts,
    access: Access,
    snapshot: SnapshotPages,
    prefetcher: &'static str,
    threads: Vec<JoinHandle<()>>,
    /// Kernel thread id of the fault-handler thread.
    fault_tid: i32,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("pages", &self.parts.table().len())
            .field("budget", &self.parts.frames().budget())
            .finish()
    }
}

/// What the engine is built from.
pub struct EngineParts {
    /// Where non-resident pages live.
    pub store: Arc<dyn RemoteStore>,
    /// Proposes pages to fetch ahead of the guest.
    pub prefetcher: Box<dyn Prefetcher>,
    /// Builds stage-2 entries for injected pages (KVM_PRE_FAULT_MEMORY), where KVM can.
    pub stage2: Box<dyn StageTwo>,
    /// The page numbers the prefetcher learns from (guest-physical or per-process virtual).
    pub page_space: Box<dyn PageSpace>,
}

impl EngineParts {
    /// `store` and `prefetcher`, no stage-2 pre-fault, guest-physical page numbers.
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
        let EngineParts {
            store,
            prefetcher,
            stage2,
            page_space,
        } = parts;
        let parts = Parts::new(cfg, store, stage2)?;
        parts.port().connect(Arc::new(Completer::new(&parts)))?;
        let prefetcher_name = prefetcher.name();
        let handler = Handler::new(&parts, prefetcher, page_space)?;
        let mut engine = Self {
            access: Access::new(&parts),
            snapshot: SnapshotPages::new(&parts),
            parts,
            prefetcher: prefetcher_name,
            threads: Vec::new(),
            fault_tid: 0,
        };
        let (tid_tx, tid_rx) = std::sync::mpsc::sync_channel(1);
        engine.threads.push(
            std::thread::Builder::new()
                .name("ept-fault".into())
                .spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    let _ = tid_tx.send(unsafe { libc::gettid() });
                    farvm_sandbox::enter(farvm_sandbox::ThreadClass::FaultHandler);
                    handler.run()
                })
                .map_err(|e| EngineError::os("spawning the fault thread", e))?,
        );
        // The thread sends its id first thing; it only fails to if it could not start.
        engine.fault_tid = tid_rx.recv().unwrap_or(0);
        let frames = engine.parts.frames().clone();
        if !frames.unlimited() {
            let evictor = Evictor::new(&engine.parts);
            let h = std::thread::Builder::new()
                .name("ept-evict".into())
                .spawn(move || {
                    farvm_sandbox::enter(farvm_sandbox::ThreadClass::Evictor);
                    evictor.run()
                })
                .map_err(|e| EngineError::os("spawning the evictor thread", e))?;
            frames.set_evictor(h.thread().clone());
            engine.threads.push(h);
        }
        tracing::info!(
            pages = engine.parts.table().len(),
            budget = frames.budget(),
            reserve = frames.reserve(),
            prefetcher = prefetcher_name,
            "paging engine started"
        );
        Ok(engine)
    }

    /// Host address and length of guest RAM (guest-physical 0..len) for KVM memslots. The VMM
    /// must never load or store through it itself: use [`Engine::read_bytes`] and friends.
    pub fn guest_ram(&self) -> (u64, u64) {
        self.parts.installer().guest_range()
    }

    /// Kernel thread id of the fault-handler thread (0 if it did not start), for a VMM that
    /// places the fault path on CPUs: every demand fault is a hand-off between a vCPU thread
    /// and this one.
    pub fn fault_thread_id(&self) -> i32 {
        self.fault_tid
    }

    /// The thread registered as vCPU `vcpu` ([`Engine::register_vcpu`]), if any.
    pub fn vcpu_thread_id(&self, vcpu: u32) -> Option<u32> {
        self.parts.vcpus().tid(vcpu as usize)
    }

    /// Declares that thread `tid` runs vCPU `vcpu` (its faults are attributed to that vCPU).
    pub fn register_vcpu(&self, vcpu: u32, tid: u32) -> Result<(), EngineError> {
        if vcpu as usize >= MAX_VCPUS {
            return Err(EngineError::BadVcpu(vcpu));
        }
        self.parts.vcpus().set_tid(vcpu as usize, tid);
        Ok(())
    }

    /// Registers the agent slot page of `vcpu` at guest-physical `slot_gpa` (4 KiB aligned).
    /// The page is made resident and pinned: fault attribution reads it with no I/O.
    pub fn set_agent_slot(&self, vcpu: u32, slot_gpa: u64) -> Result<(), EngineError> {
        if vcpu as usize >= MAX_VCPUS {
            return Err(EngineError::BadVcpu(vcpu));
        }
        if !slot_gpa.is_multiple_of(PAGE_SIZE as u64) {
            return Err(EngineError::MisalignedSlot(slot_gpa));
        }
        let page = self.access.check_range(slot_gpa, PAGE_SIZE as u64)?.0;
        self.access.pin_page(page)?;
        // The old page is unpinned only once no fault reads it (`vcpu.rs`).
        if let Some(old) = self
            .parts
            .vcpus()
            .replace_slot_page(vcpu as usize, Some(page))
        {
            self.parts.table().unpin(old);
        }
        Ok(())
    }

    /// Forgets `vcpu`'s agent slot (the guest agent unregistered it: its page may be reused):
    /// its faults go unattributed until a slot is registered again. The page is unpinned.
    pub fn clear_agent_slot(&self, vcpu: u32) -> Result<(), EngineError> {
        if vcpu as usize >= MAX_VCPUS {
            return Err(EngineError::BadVcpu(vcpu));
        }
        if let Some(old) = self.parts.vcpus().replace_slot_page(vcpu as usize, None) {
            self.parts.table().unpin(old);
        }
        Ok(())
    }

    /// Copies guest memory out, resolving absent pages through the engine (never a plain load
    /// of an absent page). Never-written pages read as zeros without being allocated.
    pub fn read_bytes(&self, gpa: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.access.read_bytes(gpa, buf)
    }

    /// Copies into guest memory, making the pages resident first.
    pub fn write_bytes(&self, gpa: u64, data: &[u8]) -> Result<(), EngineError> {
        self.access.write_bytes(gpa, data)
    }

    /// Starts the reads of the remote pages of `[gpa, gpa+len)` in one batch, as far as free
    /// frames allow, without waiting: a long copy (a snapshot's) that follows waits on them
    /// together.
    pub fn fetch_ahead(&self, gpa: u64, len: u64) -> Result<(), EngineError> {
        self.access.fetch_ahead(gpa, len)
    }

    /// Starts the reads of the remote pages among `pages` (guest page numbers) in one batch,
    /// in that order, as far as free frames allow, without waiting (a restore fetching its
    /// recorded working set). A page outside guest RAM is [`EngineError::OutOfRange`].
    pub fn fetch_pages(&self, pages: &[u64]) -> Result<(), EngineError> {
        self.access.fetch_pages(pages)
    }

    /// The pages that became resident since the engine started (or since
    /// [`Engine::restart_touch_log`]), each once, in the order they first did: the guest's
    /// first touches, and the prefetches and VMM accesses that came before them.
    pub fn touch_order(&self) -> Vec<u64> {
        self.parts.installer().touch_log().pages()
    }

    /// Restarts the log of [`Engine::touch_order`] (a restore does, just before the guest
    /// runs, so that what it loaded is not taken for the guest's touches).
    pub fn restart_touch_log(&self) {
        self.parts.installer().touch_log().restart()
    }

    /// Makes `[gpa, gpa+len)` resident (returns once every page is installed).
    pub fn ensure_resident(&self, gpa: u64, len: u64) -> Result<(), EngineError> {
        self.access.ensure_resident(gpa, len)
    }

    /// Pages resident now (one atomic load: cheap enough to ask per batch of a pre-copy).
    pub fn resident_pages(&self) -> u64 {
        self.parts.frames().resident()
    }

    /// A snapshot of the counters, latency summaries and page states.
    pub fn stats(&self) -> Stats {
        let p = &self.parts;
        let frames = p.frames();
        let mut s = Stats {
            counters: p.counters().snapshot(),
            total_pages: p.table().len(),
            budget_pages: frames.budget(),
            reserve_pages: frames.reserve(),
            evict_target_pages: frames.evict_target(),
            resident_pages: frames.resident(),
            prefetch_inflight: p.slots().in_flight(),
            states: p.table().census(),
            prefetcher: self.prefetcher.to_string(),
            stage2_prefault: p.installer().stage2_enabled(),
            reseal_left: p.reseal().left(p.table(), p.meta()),
            ..Default::default()
        };
        s.fill_derived(p.hist());
        s
    }

    /// Per-process statistics: every process the engine has seen a fault or prefetch outcome
    /// of (at most `procstats::MAX_PROCESSES`, least recently seen recycled first), and the
    /// faults it could give to no process.
    pub fn process_stats(&self) -> ProcessSnapshot {
        self.parts.procs().snapshot()
    }

    /// Switches between one global prefetch history (`true`) and one per guest process
    /// (`EngineConfig::global_history`), from the next fault on. Per-process histories learned
    /// so far are kept for when they are switched back on.
    pub fn set_global_history(&self, on: bool) {
        self.parts
            .global_history()
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether one global prefetch history is kept (see [`Engine::set_global_history`]).
    pub fn global_history(&self) -> bool {
        self.parts
            .global_history()
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The fault log (`EngineConfig::fault_log_records`; empty and disabled when 0).
    pub fn fault_log(&self) -> &crate::faultlog::FaultLog {
        self.parts.fault_log()
    }

    /// The counters of process (`cr3`, `pid`) now, if the engine tracks it (cheap: relaxed
    /// loads of a fixed table, for every guest phase change).
    pub fn process_counters(&self, cr3: u64, pid: u64) -> Option<ProcessCounterValues> {
        self.parts.procs().counters_of(cr3, pid)
    }

    /// The counters alone (relaxed loads, no histogram merge: cheap enough for every guest
    /// phase change).
    pub fn counters(&self) -> CounterValues {
        self.parts.counters().snapshot()
    }

    /// Lists guest RAM for a snapshot that leaves remote pages on the memory servers:
    /// `each(page, what)` for every page ever written, in page order, with a resident page's
    /// bytes or a remote page's fingerprint (nothing is read back). The guest must be paused.
    pub fn save_pages<E: From<EngineError>>(
        &self,
        each: impl FnMut(u64, SavedPage<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.snapshot.save(each)
    }

    /// Copies every page resident now, while the guest runs (a live migration's pre-copy
    /// round): `each(page, bytes)` in page order; pages in flight are skipped. Racing guest
    /// writes may tear a copy: the final [`Engine::save_pages`], with the guest paused, is
    /// what a migration compares against.
    pub fn copy_resident_pages<E>(
        &self,
        each: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        self.snapshot.copy_resident(each)
    }

    /// Takes page `page` back as remote, the memory servers holding content of fingerprint
    /// `fp` (from [`Engine::save_pages`]): its first touch reads it from them. Only before the
    /// guest runs ([`EngineError::NotFresh`] otherwise); a page the VM's build wrote is taken
    /// out of guest RAM first.
    pub fn adopt_remote(&self, page: u64, fp: crate::hash::Fingerprint) -> Result<(), EngineError> {
        self.snapshot.adopt_remote(page, fp)
    }

    /// The paging state of the page holding `gpa` (None if outside guest RAM).
    pub fn page_state(&self, gpa: u64) -> Option<PageState> {
        let p = gpa / PAGE_SIZE as u64;
        let table = self.parts.table();
        (p < table.len()).then(|| PageState::from_word(table.load(p)))
    }

    /// Sets what to do when the guest (or a VMM access) needs a page whose data the memory
    /// servers lost: `f(gpa)` runs on an engine thread, possibly more than once per page.
    /// There is no data to give a vCPU that faulted on it, so the VMM's handler should stop
    /// the VM: kick every vCPU, then return [`LostPage::Release`] to let the blocked ones
    /// leave the fault (see [`LostPage`]). Without a handler the loss is logged and counted
    /// (`Stats::lost_accesses`) and the vCPU stays blocked. Returns false if a handler was
    /// already set.
    pub fn on_page_lost(&self, f: impl Fn(u64) -> LostPage + Send + Sync + 'static) -> bool {
        self.parts.lost().set_handler(Box::new(f))
    }

    /// Errors since the last call (store failures, lost pages), oldest first.
    pub fn take_errors(&self) -> Vec<EngineError> {
        self.parts.errors().take()
    }

    /// Total errors ever reported (including ones not kept).
    pub fn errors_total(&self) -> u64 {
        self.parts.errors().total()
    }

    /// Pages whose memfd backing is present (mincore), for checking the budget from outside.
    pub fn resident_by_mincore(&self) -> Result<u64, EngineError> {
        self.parts
            .installer()
            .resident_by_mincore()
            .map_err(|e| EngineError::os("mincore", e))
    }

    /// Stops the threads and waits (up to 5 s) for store requests still in flight.
    pub fn shutdown(mut self) {
        self.stop_threads();
    }

    fn stop_threads(&mut self) {
        self.parts.queues().stop();
        self.parts.frames().wake_evictor();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.parts.port().outstanding() > 0 {
            if Instant::now() > deadline {
                // The store still owns buffers inside guest RAM: keep the mapping alive rather
                // than let it write into freed memory.
                tracing::error!("store requests still outstanding at shutdown; leaking guest RAM");
                std::mem::forget(self.parts.installer().clone());
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
