//! The engine's state, as parts with one owner each (one file each), built once per VM:
//!
//! | part | file | owns |
//! |---|---|---|
//! | [`PageTable`] | `state.rs` | one state word per page (CAS only): who owns each page |
//! | [`PageMeta`] | `pagemeta.rs` | per page: clean fingerprint, fault and I/O timestamps |
//! | [`RefaultClock`] | `refault.rs` | the eviction clock and each page's last eviction |
//! | [`Frames`] | `frames.rs` | resident count vs budget, reserve and eviction marks; the evictor's wake-up |
//! | [`PrefetchSlots`] | `prefetch_slots.rs` | prefetch reads in flight vs their cap |
//! | [`Installer`] | `installer.rs` | guest RAM (memfd, guest view, alias), the userfaultfd, the stage-2 gate, the touch log (`touchlog.rs`: the order pages first became resident) |
//! | [`StorePort`] | `port.rs` | the store handle, requests outstanding, completion routing |
//! | [`ResealProgress`] | `reseal.rs` | a key rotation's re-seal sweep: running, its cursor |
//! | [`Queues`] | `queues.rs` | retry / consumed / write-back queues, the fault thread's doorbell, stop |
//! | [`ErrorLog`] | `errlog.rs` | errors kept for the VMM, rate-limited logging |
//! | [`LostPages`] | `lost.rs` | the VMM's lost-page handler |
//! | [`VcpuTable`] | `vcpu.rs` | vCPU thread ids and agent slots |
//! | [`Counters`], [`Histograms`] | `stats.rs` | counters and latency histograms |
//! | [`ProcessTable`] | `procstats.rs` | per-process counters (entries created by the fault thread only) |
//! | [`FaultLog`] | `faultlog.rs` | the opt-in record of each resolved fault and its process |
//! | global history | (a flag) | one prefetch history for the guest instead of one per process |
//!
//! The threads and paths that act on them — fault handler (`fault`), completion path
//! (`complete`), evictor (`evict`), VMM accesses (`access`), snapshots (`snapshot`) — each
//! keep handles to the parts they use, taken from here, and never reach one another.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::clock::Clock;
use crate::config::EngineConfig;
use crate::errlog::ErrorLog;
use crate::error::EngineError;
use crate::faultlog::FaultLog;
use crate::frames::Frames;
use crate::installer::Installer;
use crate::lost::LostPages;
use crate::pagemeta::PageMeta;
use crate::port::StorePort;
use crate::prefetch_slots::PrefetchSlots;
use crate::procstats::ProcessTable;
use crate::queues::Queues;
use crate::refault::RefaultClock;
use crate::reseal::ResealProgress;
use crate::stage2::StageTwo;
use crate::state::PageTable;
use crate::stats::{Counters, Histograms};
use crate::store::RemoteStore;
use crate::vcpu::VcpuTable;

pub(crate) struct Parts {
    cfg: EngineConfig,
    clock: Clock,
    table: Arc<PageTable>,
    meta: Arc<PageMeta>,
    refault: Arc<RefaultClock>,
    frames: Arc<Frames>,
    slots: Arc<PrefetchSlots>,
    installer: Arc<Installer>,
    port: Arc<StorePort>,
    reseal: Arc<ResealProgress>,
    queues: Arc<Queues>,
    errors: Arc<ErrorLog>,
    lost: Arc<LostPages>,
    vcpus: Arc<VcpuTable>,
    counters: Arc<Counters>,
    hist: Arc<Histograms>,
    procs: Arc<ProcessTable>,
    fault_log: Arc<FaultLog>,
    global_history: Arc<AtomicBool>,
}

impl Parts {
    /// Validates `cfg` and builds every part: guest RAM (all pages "never written") registered
    /// with a new userfaultfd. The port is not connected to a completion path yet.
    pub fn new(
        cfg: EngineConfig,
        store: Arc<dyn RemoteStore>,
        stage2: Box<dyn StageTwo>,
    ) -> Result<Self, EngineError> {
        let frames = Frames::new(&cfg)?;
        let pages = cfg.total_pages();
        let len = usize::try_from(cfg.mem_bytes)
            .map_err(|_| crate::config::ConfigError::MemoryOverflowsUsize)?;
        let clock = Clock::start();
        let table = Arc::new(PageTable::new(pages));
        let meta = Arc::new(PageMeta::new(pages));
        let counters = Arc::new(Counters::default());
        // The anon backing's pool of free frames: the free reserve the evictor keeps below
        // the budget, so that frames kept for reuse stay within the budget.
        let pool_pages = cfg.resolve()?.1.max(1);
        let installer = Arc::new(Installer::new(
            len,
            cfg.guest_memory,
            pool_pages,
            stage2,
            table.clone(),
            meta.clone(),
            counters.clone(),
        )?);
        Ok(Self {
            refault: Arc::new(RefaultClock::new(
                pages,
                frames.budget(),
                cfg.refault_protect,
            )),
            frames: Arc::new(frames),
            slots: Arc::new(PrefetchSlots::new(cfg.max_prefetch_inflight as u64)),
            port: Arc::new(StorePort::new(store, counters.clone(), pages)),
            reseal: Arc::new(ResealProgress::default()),
            queues: Arc::new(Queues::new()?),
            errors: Arc::new(ErrorLog::new(clock)),
            lost: Arc::new(LostPages::new(installer.clone(), counters.clone())),
            vcpus: Arc::new(VcpuTable::new()),
            hist: Arc::new(Histograms::default()),
            procs: Arc::new(ProcessTable::new()),
            fault_log: Arc::new(FaultLog::new(cfg.fault_log_records)),
            global_history: Arc::new(AtomicBool::new(cfg.global_history)),
            cfg,
            clock,
            table,
            meta,
            installer,
            counters,
        })
    }

    pub fn cfg(&self) -> &EngineConfig {
        &self.cfg
    }

    pub fn clock(&self) -> Clock {
        self.clock
    }

    pub fn table(&self) -> &Arc<PageTable> {
        &self.table
    }

    pub fn meta(&self) -> &Arc<PageMeta> {
        &self.meta
    }

    pub fn refault(&self) -> &Arc<RefaultClock> {
        &self.refault
    }

    pub fn frames(&self) -> &Arc<Frames> {
        &self.frames
    }

    pub fn slots(&self) -> &Arc<PrefetchSlots> {
        &self.slots
    }

    pub fn installer(&self) -> &Arc<Installer> {
        &self.installer
    }

    pub fn reseal(&self) -> &Arc<ResealProgress> {
        &self.reseal
    }

    pub fn port(&self) -> &Arc<StorePort> {
        &self.port
    }

    pub fn queues(&self) -> &Arc<Queues> {
        &self.queues
    }

    pub fn errors(&self) -> &Arc<ErrorLog> {
        &self.errors
    }

    pub fn lost(&self) -> &Arc<LostPages> {
        &self.lost
    }

    pub fn vcpus(&self) -> &Arc<VcpuTable> {
        &self.vcpus
    }

    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }

    pub fn hist(&self) -> &Arc<Histograms> {
        &self.hist
    }

    pub fn procs(&self) -> &Arc<ProcessTable> {
        &self.procs
    }

    pub fn fault_log(&self) -> &Arc<FaultLog> {
        &self.fault_log
    }

    /// One global prefetch history instead of one per process (`EngineConfig::global_history`,
    /// switchable while the engine runs).
    pub fn global_history(&self) -> &Arc<AtomicBool> {
        &self.global_history
    }
}
