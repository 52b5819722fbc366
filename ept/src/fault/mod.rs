//! The fault-handler thread (`ept-fault`): drains userfaultfd events (non-blocking; epoll on
//! the uffd and the doorbell), resolves each by its page's state, serves the round's demand
//! reads *before* consulting the prefetcher (the vCPU is waiting) — synchronously on this
//! thread where the store offers `read_now`, else as one batch — then turns the prefetcher's
//! candidates into low-priority reads.
//!
//! Owns: the prefetcher, the page space and the deferred candidates (`prefetch.rs`), the
//! round's read batches (`reads.rs`), faults parked for want of a frame, the back-off schedule
//! of failed demand reads, the probe sampler. Nothing here allocates per fault (buffers
//! allocated once) or takes a lock (page state changes by CAS).
//!
//! # Transitions
//!
//! Every decision this thread makes about a page is one row here and one arm of the `match`
//! in [`Handler::step`], which calls the named action. Events: a guest *fault* (read from the
//! uffd, or parked earlier); a prefetch *candidate*; a failed demand read's back-off is over
//! (*retry due*). In the next state, `+F` is a flag set and `−F` one cleared; a claim (any row
//! leaving `NEVER`, `REMOTE` or `STAGED`) keeps only the word's pin count besides, and every
//! `LOCAL` also gets `REF` (CLOCK's second chance).
//!
//! | state | event | guard | action | next state |
//! |---|---|---|---|---|
//! | `NEVER` | fault | a frame is free | `zero_fill`: zero page mapped, vCPU woken | `LOCAL` (through `INFLIGHT+DEMAND`) |
//! | `REMOTE` | fault | a frame is free | `demand_read` | `INFLIGHT+DEMAND` (`+HOT` if a refault within the working set) |
//! | `NEVER`, `REMOTE` | fault | no frame free | parked, run again next round | unchanged |
//! | `INFLIGHT` | fault | `PREFETCHED` (a prefetch nobody faulted on yet) | `late_hit`: store told to hurry, prefetcher told of the hit (it may answer with pages further ahead) | `+DEMAND+WAITERS −PREFETCHED−MARKER−PROBE`: installed and woken on arrival, not staged |
//! | `INFLIGHT` | fault | otherwise (a demand read) | `join_read`: waits for the same read | `+WAITERS` |
//! | `STAGED` | fault | | `marker_hit`: prefetcher told, mapped, vCPU woken | `LOCAL` (through `INFLIGHT+DEMAND`) |
//! | `LOCAL` | fault | | `remap`: mapped again under a pin (raced with an install or an eviction that gave it back) | `LOCAL` |
//! | `EVICTING` | fault | | `wait_eviction`: the evictor rescues it or reads it again | `+WAITERS` |
//! | `LOST` | fault | | `report_lost` to the VMM | `LOST` |
//! | `REMOTE` | candidate | a frame below low water (markers: the reserve too) | `prefetch_read` | `INFLIGHT+PREFETCHED+PF_READ` (`+MARKER` for markers and sampled probes, `+PROBE` for probes) |
//! | `REMOTE` | candidate | no frame | deferred | unchanged |
//! | any other | candidate | | `skip_candidate` | unchanged |
//! | `INFLIGHT` | retry due | | `resubmit` the demand read | unchanged |
//! | any other | retry due | | `stale_retry`: logged (cannot happen: the retry owns the page) | unchanged |
//!
//! An action whose compare-and-swap loses a race returns [`Step::Raced`], and the word is
//! loaded and matched again — except a candidate's, which is skipped (whoever won now owns the
//! page). Before any of this, a candidate that is not a marker is deferred while the prefetch
//! reads in flight are at their cap.
//!
//! # Protocol at the seam
//!
//! A page this thread moves to `INFLIGHT` holds a frame and belongs to exactly one read until
//! that read's completion (a fault on it only adds flags: `F_WAITERS`, and `F_DEMAND` for a
//! late hit). Reads go out through the store port (`port`: what the store must do); their
//! completions are applied by the completion path (`complete`: what happens on `Ok`, `Absent`
//! and `Failed`), on the store's thread, or on this one for reads served with `read_now` and
//! for batches the store refused. A failed read that a fault waits on comes back here through
//! the retry queue, still `INFLIGHT` and still owned by its retry, and is read again after
//! `EngineConfig::retry_backoff_ms`.

mod prefetch;
mod reads;

use std::collections::VecDeque;
use std::sync::Arc;

use prefetch::{Deferred, Learner};
use reads::Reads;

use farvm_prefetch::Prefetcher;

use crate::clock::Clock;
use crate::errlog::ErrorLog;
use crate::error::EngineError;
use crate::faultlog::{FaultKind, FaultLog};
use crate::frames::Frames;
use crate::installer::Installer;
use crate::lost::LostPages;
use crate::pagemeta::PageMeta;
use crate::parts::Parts;
use crate::port::StorePort;
use crate::prefetch_slots::PrefetchSlots;
use crate::procstats::{ProcRef, ProcessCounter, ProcessIndex, ProcessTable, Unattributed};
use crate::queues::Queues;
use crate::refault::RefaultClock;
use crate::state::{self as st, state_of, PageTable};
use crate::stats::{Counter, Counters, Hist, Histograms};
use crate::store::Priority;
use crate::sys::poll::Epoll;
use crate::sys::uffd::{Fault, RawMsg, MAX_EVENTS};
use crate::translate::PageSpace;

const TOKEN_UFFD: u64 = 0;
const TOKEN_KICK: u64 = 1;
/// Probes sampled at the configured `probe_every` before the sample turns sparser: enough for
/// a hit-rate estimate within about ±1.2 points (two standard errors) at 99% accuracy.
const YOUNG_PROBES: u32 = 256;
/// How much sparser the probe sample is once [`YOUNG_PROBES`] were taken.
const SETTLED_PROBE_FACTOR: u32 = 4;

/// What happened to a page (one row of the module's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// A guest fault (by the `Handler::faulter`).
    GuestFault,
    /// A prefetch candidate (`marker`: carries the prefetcher's learning signal), for the
    /// process `owner` (its outcome is counted for it).
    Candidate { marker: bool, owner: ProcRef },
    /// The back-off of a failed demand read is over.
    RetryDue,
}

/// How an action ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Done,
    /// Its CAS lost a race: load the word and match again.
    Raced,
    /// No frame free: the fault is parked, the candidate deferred.
    NoFrame,
    /// A candidate not issued (not remote, or lost to a concurrent claim).
    Skipped,
}

/// Who made the fault being resolved (per-process statistics).
#[derive(Clone, Copy, Debug)]
struct Faulter {
    /// The prefetcher's process key (CR3; 0 = unknown).
    key: u64,
    /// Its entry in the per-process table.
    entry: ProcRef,
    /// Why there is no entry, if there is none.
    why: Option<Unattributed>,
    /// The pid the agent slot named (0: the kernel, or none).
    pid: u64,
}

impl Faulter {
    const UNKNOWN: Faulter = Faulter {
        key: 0,
        entry: ProcRef::NONE,
        why: None,
        pid: 0,
    };
}

/// A fault that could not be served yet (no free frame).
#[derive(Clone, Copy)]
struct Parked {
    fault: Fault,
    due_ns: u64,
}

pub(crate) struct Handler {
    table: Arc<PageTable>,
    meta: Arc<PageMeta>,
    refault: Arc<RefaultClock>,
    frames: Arc<Frames>,
    slots: Arc<PrefetchSlots>,
    installer: Arc<Installer>,
    port: Arc<StorePort>,
    queues: Arc<Queues>,
    errors: Arc<ErrorLog>,
    lost: Arc<LostPages>,
    counters: Arc<Counters>,
    hist: Arc<Histograms>,
    procs: Arc<ProcessTable>,
    fault_log: Arc<FaultLog>,
    /// Finds or creates the entry of a faulting process (this thread alone creates entries).
    proc_index: ProcessIndex,
    /// The fault being resolved.
    faulter: Faulter,
    clock: Clock,
    /// `EngineConfig::prefetch`.
    prefetch: bool,
    /// `EngineConfig::probe_every`.
    probe_every: u32,
    retry_backoff_ns: u64,
    epoll: Epoll,
    raw: [RawMsg; MAX_EVENTS],
    faults: [Fault; MAX_EVENTS],
    learner: Learner,
    reads: Reads,
    deferred: Deferred,
    parked: VecDeque<Parked>,
    /// Demand reads that failed, to submit again once due: (page, due ns). Each page stays
    /// INFLIGHT meanwhile, owned by its retry.
    retries: VecDeque<(u64, u64)>,
    /// Prefetches issued, for the 1-in-`probe_every` probe sample.
    probe_ctr: u32,
    /// Probes sampled so far (saturating): the sample is sparser after the first
    /// [`YOUNG_PROBES`].
    probes: u32,
}

impl Handler {
    pub fn new(
        parts: &Parts,
        prefetcher: Box<dyn Prefetcher>,
        space: Box<dyn PageSpace>,
    ) -> Result<Self, EngineError> {
        let epoll = Epoll::new().map_err(|e| EngineError::os("epoll_create", e))?;
        epoll
            .add(parts.installer().uffd_fd(), TOKEN_UFFD)
            .map_err(|e| EngineError::os("epoll add uffd", e))?;
        epoll
            .add(parts.queues().kick_fd(), TOKEN_KICK)
            .map_err(|e| EngineError::os("epoll add eventfd", e))?;
        let cfg = parts.cfg();
        Ok(Self {
            table: parts.table().clone(),
            meta: parts.meta().clone(),
            refault: parts.refault().clone(),
            frames: parts.frames().clone(),
            slots: parts.slots().clone(),
            installer: parts.installer().clone(),
            port: parts.port().clone(),
            queues: parts.queues().clone(),
            errors: parts.errors().clone(),
            lost: parts.lost().clone(),
            counters: parts.counters().clone(),
            hist: parts.hist().clone(),
            procs: parts.procs().clone(),
            fault_log: parts.fault_log().clone(),
            proc_index: ProcessIndex::new(),
            faulter: Faulter::UNKNOWN,
            clock: parts.clock(),
            prefetch: cfg.prefetch,
            probe_every: cfg.probe_every,
            retry_backoff_ns: cfg.retry_backoff_ms.max(1) * 1_000_000,
            epoll,
            raw: [RawMsg::default(); MAX_EVENTS],
            faults: [Fault::default(); MAX_EVENTS],
            learner: Learner::new(
                prefetcher,
                space,
                parts.installer().clone(),
                parts.vcpus().clone(),
                parts.counters().clone(),
                parts.global_history().clone(),
            ),
            reads: Reads::new(
                parts.port().clone(),
                parts.meta().clone(),
                parts.installer().clone(),
            ),
            deferred: Deferred::new(cfg.prefetch_defer_max_us * 1000, parts.counters().clone()),
            parked: VecDeque::with_capacity(1024),
            retries: VecDeque::with_capacity(1024),
            probe_ctr: 0,
            probes: 0,
        })
    }

    /// The thread's body: rounds of events until the engine stops.
    pub fn run(mut self) {
        while !self.queues.stopping() {
            let idle = self.parked.is_empty() && self.deferred.is_empty();
            self.queues.set_waiting_for_frames(!idle);
            // Frames freed since the parked faults were refused, which the evictor may have
            // given back before it could see the flag: run them at once. Otherwise the
            // evictor's doorbell wakes us; the 1 ms poll also covers deferred prefetches
            // waiting for in-flight slots, which completions give back without a doorbell.
            let timeout = if !self.parked.is_empty() && self.frames.demand_frame_free() {
                0
            } else if idle && self.retries.is_empty() {
                100
            } else {
                1
            };
            let ready = match self.epoll.wait(timeout) {
                Ok(r) => r,
                Err(e) => {
                    self.errors.push(EngineError::os("epoll_wait", e));
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            };
            if ready & (1 << TOKEN_KICK) != 0 {
                self.queues.drain_kick();
            }
            let now = self.clock.now();
            while let Some(p) = self.queues.next_retry() {
                self.retries.push_back((p, now + self.retry_backoff_ns));
            }
            self.retry_reads(now);
            self.retry_parked(now);
            self.drain_deferred(now);
            loop {
                let n = match self.installer.read_faults(&mut self.raw, &mut self.faults) {
                    Ok(n) => n,
                    Err(e) => {
                        self.errors.push(EngineError::os("reading userfaultfd", e));
                        0
                    }
                };
                if n == 0 {
                    break;
                }
                let now = self.clock.now();
                for i in 0..n {
                    let f = self.faults[i];
                    self.on_fault(f, now);
                }
                self.reads.flush_demand();
                self.run_prefetcher(now);
            }
            self.reads.flush_demand();
            self.run_prefetcher(self.clock.now());
        }
    }

    /// A guest fault: resolved by its page's state, or parked for want of a frame.
    fn on_fault(&mut self, fault: Fault, now: u64) {
        let Some(p) = self.installer.page_of(fault.address) else {
            tracing::error!("fault at {:#x} outside guest RAM", fault.address);
            return;
        };
        self.faulter = self.attribute(fault.tid, now);
        if self.resolve(p, Event::GuestFault, now) == Step::NoFrame {
            self.parked.push_back(Parked { fault, due_ns: now });
        }
    }

    /// Who faulted: the vCPU's agent slot says which process (module docs of `procstats`).
    fn attribute(&mut self, tid: u32, now: u64) -> Faulter {
        let a = self.learner.attribute(tid);
        if a.vcpu.is_none() {
            self.counters.inc(Counter::UnattributedFaults);
        }
        match a.unattributed() {
            Some(why) => Faulter {
                key: self.learner.process_key(&a),
                entry: ProcRef::NONE,
                why: Some(why),
                pid: 0,
            },
            None => Faulter {
                key: self.learner.process_key(&a),
                entry: self.proc_index.lookup(&self.procs, a.cr3, a.pid, now),
                why: None,
                pid: a.pid,
            },
        }
    }

    /// Counts a fault on page `p` for the process that made it (or as unattributed), and
    /// records it in the fault log when that is on.
    fn count_fault(&self, p: u64, c: ProcessCounter) {
        match self.faulter.why {
            Some(why) => self.procs.unattributed(why),
            None => self.procs.add(self.faulter.entry, c, 1),
        }
        if self.fault_log.enabled() {
            if let Some(kind) = FaultKind::of(c) {
                let f = &self.faulter;
                if self.fault_log.record(p, kind, f.why.is_none(), f.pid) {
                    self.counters.inc(Counter::FaultLogRecords);
                }
            }
        }
    }

    /// Re-runs parked faults whose time has come (frames may have been freed meanwhile).
    fn retry_parked(&mut self, now: u64) {
        for _ in 0..self.parked.len() {
            let Some(p) = self.parked.pop_front() else {
                break;
            };
            if p.due_ns > now {
                self.parked.push_back(p);
                continue;
            }
            self.on_fault(p.fault, now);
        }
        self.reads.flush_demand();
    }

    /// Submits again the failed demand reads whose back-off is over (in order: they were
    /// queued with the same back-off).
    fn retry_reads(&mut self, now: u64) {
        while let Some(&(p, due)) = self.retries.front() {
            if due > now {
                break;
            }
            self.retries.pop_front();
            self.resolve(p, Event::RetryDue, now);
        }
        self.reads.flush_demand();
    }

    /// Feeds this round's demand faults to the prefetcher and issues its candidates.
    fn run_prefetcher(&mut self, now: u64) {
        let n = self.learner.end_round();
        if !self.prefetch {
            return;
        }
        for i in 0..n {
            let (key, owner) = self.learner.consult(i, now);
            self.issue_candidates(key, owner, now);
        }
        self.reads.flush_prefetch();
        self.learner.publish_counts();
    }

    /// Issues the prefetcher's latest candidates for process `key` (entry `owner`; they go
    /// out with this round's prefetch batch), deferring those the limits refuse.
    fn issue_candidates(&mut self, key: u64, owner: ProcRef, now: u64) {
        if !self.prefetch {
            return;
        }
        for j in 0..self.learner.candidates() {
            match self.learner.candidate(key, j) {
                (Some(p), marker) => {
                    if self.issue(p, marker, owner, now) == Step::NoFrame {
                        self.deferred.push(p, marker, owner, now);
                    }
                }
                (None, _) => self.counters.inc(Counter::PrefetchSkipped),
            }
        }
    }

    /// Issues deferred candidates, oldest first, while the limits allow.
    fn drain_deferred(&mut self, now: u64) {
        while let Some((p, marker, owner)) = self.deferred.oldest(now) {
            if self.issue(p, marker, owner, now) == Step::NoFrame {
                break;
            }
            self.deferred.pop();
        }
        self.reads.flush_prefetch();
    }

    /// One candidate: `NoFrame` if the limits say "not now".
    fn issue(&mut self, p: u64, marker: bool, owner: ProcRef, now: u64) -> Step {
        // Markers carry the prefetcher's learning signal (e.g. the end of a Leap/stream
        // window), so they may exceed the in-flight cap and dip into the free reserve.
        if !marker && self.slots.full() {
            return Step::NoFrame;
        }
        self.resolve(p, Event::Candidate { marker, owner }, now)
    }

    /// Applies `ev` to page `p`, again while its CAS loses races.
    fn resolve(&mut self, p: u64, ev: Event, now: u64) -> Step {
        loop {
            let w = self.table.load(p);
            match self.step(p, w, ev, now) {
                Step::Raced => continue,
                done => return done,
            }
        }
    }

    /// The transition table (module docs): one arm per row.
    fn step(&mut self, p: u64, w: u32, ev: Event, now: u64) -> Step {
        use Event::{Candidate, GuestFault, RetryDue};
        match (state_of(w), ev) {
            (st::NEVER, GuestFault) => self.zero_fill(p, w, now),
            (st::REMOTE, GuestFault) => self.demand_read(p, w, now),
            (st::INFLIGHT, GuestFault) if w & st::F_PREFETCHED != 0 => self.late_hit(p, w, now),
            (st::INFLIGHT, GuestFault) => self.join_read(p, w),
            (st::STAGED, GuestFault) => self.marker_hit(p, w, now),
            (st::LOCAL, GuestFault) => self.remap(p),
            (st::EVICTING, GuestFault) => self.wait_eviction(p, w, now),
            (st::LOST, GuestFault) => self.report_lost(p),
            (other, GuestFault) => impossible(p, other),
            (st::REMOTE, Candidate { marker, owner }) => {
                self.prefetch_read(p, w, marker, owner, now)
            }
            (_, Candidate { .. }) => self.skip_candidate(),
            (st::INFLIGHT, RetryDue) => self.resubmit(p, now),
            (_, RetryDue) => stale_retry(p),
        }
    }

    // ---- actions ----

    /// Takes a frame (demand may use the reserve) and claims `p` for a demand fault:
    /// `INFLIGHT|F_DEMAND|extra`, owned by this thread.
    fn claim_for_demand(&self, p: u64, w: u32, extra: u32) -> Step {
        if !self.frames.try_reserve(true) {
            self.counters.inc(Counter::FrameWaits);
            return Step::NoFrame;
        }
        let inflight = st::pins_only(w) | st::INFLIGHT | st::F_DEMAND | extra;
        if self.table.cas(p, w, inflight).is_err() {
            self.frames.release();
            return Step::Raced;
        }
        Step::Done
    }

    fn zero_fill(&mut self, p: u64, w: u32, now: u64) -> Step {
        let claimed = self.claim_for_demand(p, w, 0);
        if claimed != Step::Done {
            return claimed;
        }
        // Counted before the install's wake, so a woken vCPU never sees a stale count.
        self.count_fault(p, ProcessCounter::ZeroFills);
        self.installer.install_zero(p, true);
        self.hist
            .record(Hist::ZeroFill, self.clock.now().saturating_sub(now));
        // Every fault goes to the prefetcher (its history is the access stream); candidates
        // that are never-written pages are then skipped.
        self.learner
            .note_fault(self.faulter.key, self.faulter.entry, p);
        Step::Done
    }

    fn demand_read(&mut self, p: u64, w: u32, now: u64) -> Step {
        let hot = self.refault.is_hot(p);
        let claimed = self.claim_for_demand(p, w, if hot { st::F_HOT } else { 0 });
        if claimed != Step::Done {
            return claimed;
        }
        if hot {
            self.counters.inc(Counter::HotRefaults);
        }
        self.meta.set_fault_at(p, now);
        self.counters.inc(Counter::DemandFaults);
        self.count_fault(p, ProcessCounter::DemandFaults);
        self.learner
            .note_fault(self.faulter.key, self.faulter.entry, p);
        self.reads.push(p, Priority::Demand, now);
        Step::Done
    }

    fn late_hit(&mut self, p: u64, w: u32, now: u64) -> Step {
        // Install on arrival (not stage) and wake us.
        let new =
            (w & !(st::F_MARKER | st::F_PREFETCHED | st::F_PROBE)) | st::F_WAITERS | st::F_DEMAND;
        if self.table.cas(p, w, new).is_err() {
            return Step::Raced;
        }
        // The vCPU now waits on this read: its fault-service time starts here (the stamp may
        // hold a fault of an earlier residency of the page).
        self.meta.set_fault_at(p, now);
        self.port.promote(p);
        self.counters.inc(Counter::PrefetchLateHits);
        self.count_fault(p, ProcessCounter::PrefetchLateHits);
        if w & st::F_PROBE != 0 {
            self.counters.inc(Counter::ProbeHits);
            self.procs
                .add(self.faulter.entry, ProcessCounter::ProbeHits, 1);
        }
        let Faulter { key, entry, .. } = self.faulter;
        let marker = w & st::F_MARKER != 0;
        // A marker (or probe) still in flight: the guest reached it, the very signal a
        // prefetcher's continuation waits for. Answer it now: otherwise a stream the guest
        // caught up with issues nothing more and restarts small at the next miss, and the
        // guest keeps catching up. Any other page in flight says the same of the distance
        // ahead: the prefetcher may answer with pages further ahead.
        let key = self.learner.late_hit(key, p, marker, now);
        self.issue_candidates(key, entry, now);
        Step::Done
    }

    fn join_read(&self, p: u64, w: u32) -> Step {
        if w & st::F_WAITERS == 0 && self.table.cas(p, w, w | st::F_WAITERS).is_err() {
            return Step::Raced;
        }
        self.counters.inc(Counter::DedupWaits);
        self.count_fault(p, ProcessCounter::WaitFaults);
        Step::Done
    }

    fn marker_hit(&mut self, p: u64, w: u32, now: u64) -> Step {
        // The hit signal of a staged marker/probe: map it now, no network.
        let staged_at = self.meta.io_at(p);
        if self
            .table
            .cas(p, w, st::pins_only(w) | st::INFLIGHT | st::F_DEMAND)
            .is_err()
        {
            return Step::Raced;
        }
        // Account and tell the prefetcher before the wake, so a woken vCPU never observes a
        // hit that is not counted yet.
        self.counters.inc(Counter::PrefetchMarkerHits);
        self.count_fault(p, ProcessCounter::PrefetchMarkerHits);
        if w & st::F_PROBE != 0 {
            self.counters.inc(Counter::ProbeHits);
            self.procs
                .add(self.faulter.entry, ProcessCounter::ProbeHits, 1);
        }
        self.hist
            .record(Hist::Timeliness, now.saturating_sub(staged_at));
        let Faulter { key, entry, .. } = self.faulter;
        // A marker hit may answer with the prefetcher's next window (like Linux's async
        // read-ahead marker); those candidates go out with this round's prefetch batch.
        let key = self.learner.hit(key, p, true, now);
        self.installer.publish_local(p, |_| 0, true);
        self.issue_candidates(key, entry, now);
        Step::Done
    }

    fn remap(&self, p: u64) -> Step {
        if !self.installer.remap(p) {
            return Step::Raced;
        }
        self.counters.inc(Counter::SpuriousFaults);
        Step::Done
    }

    fn wait_eviction(&self, p: u64, w: u32, now: u64) -> Step {
        if w & st::F_WAITERS == 0 && self.table.cas(p, w, w | st::F_WAITERS).is_err() {
            return Step::Raced;
        }
        self.meta.set_fault_at(p, now);
        self.counters.inc(Counter::EvictingWaits);
        self.count_fault(p, ProcessCounter::WaitFaults);
        Step::Done
    }

    /// No data to install: the VMM stops the VM (and may let the vCPU go).
    fn report_lost(&self, p: u64) -> Step {
        self.lost.accessed(p);
        Step::Done
    }

    fn prefetch_read(&mut self, p: u64, w: u32, marker: bool, owner: ProcRef, now: u64) -> Step {
        if !self.frames.try_reserve(marker) {
            return Step::NoFrame;
        }
        // Systematic sample over every issued prefetch (markers included), so probe hits
        // estimate the hit rate of the whole population, injected pages included.
        self.probe_ctr = self.probe_ctr.wrapping_add(1);
        let probe = self.probe_every > 0 && self.probe_ctr.is_multiple_of(self.probe_period());
        let mut new = st::pins_only(w) | st::INFLIGHT | st::F_PREFETCHED | st::F_PF_READ;
        if marker || probe {
            new |= st::F_MARKER;
        }
        if probe {
            new |= st::F_PROBE;
        }
        if self.table.cas(p, w, new).is_err() {
            self.frames.release();
            return self.skip_candidate();
        }
        // The read owns the page: its outcome is counted for `owner` from here.
        self.meta.set_owner(p, owner);
        if probe {
            self.probes = self.probes.saturating_add(1);
            self.counters.inc(Counter::ProbeStaged);
            self.procs.add(owner, ProcessCounter::ProbeStaged, 1);
        }
        self.slots.take();
        self.counters.inc(Counter::PrefetchIssued);
        self.procs.add(owner, ProcessCounter::PrefetchIssued, 1);
        self.reads.push(p, Priority::Prefetch, now);
        Step::Done
    }

    /// The probe sample's period: `probe_every` for the first [`YOUNG_PROBES`] probes, then
    /// [`SETTLED_PROBE_FACTOR`] times sparser (each probe costs the vCPU one fault).
    /// `probe_every` = 1 (every prefetch staged, every hit observed) stays 1.
    fn probe_period(&self) -> u32 {
        if self.probes < YOUNG_PROBES || self.probe_every == 1 {
            self.probe_every
        } else {
            self.probe_every.saturating_mul(SETTLED_PROBE_FACTOR)
        }
    }

    fn skip_candidate(&self) -> Step {
        self.counters.inc(Counter::PrefetchSkipped);
        Step::Skipped
    }

    fn resubmit(&mut self, p: u64, now: u64) -> Step {
        self.counters.inc(Counter::ReadRetries);
        self.reads.push(p, Priority::Demand, now);
        Step::Done
    }
}

fn impossible(p: u64, state: u32) -> Step {
    tracing::error!("guest page {p:#x} in impossible state {state}");
    Step::Done
}

fn stale_retry(p: u64) -> Step {
    tracing::error!("guest page {p:#x} queued for a read retry is not in flight");
    Step::Done
}
