//! The fault-handler thread: drains userfaultfd events (non-blocking, epoll), resolves each by
//! page state, serves the round's demand reads *before* consulting the prefetcher (the vCPU is
//! waiting) — synchronously on this thread where the store offers `read_now`, else as one
//! batch — then turns the prefetcher's candidates into low-priority reads.
//!
//! Nothing here allocates per fault: events, read batches and candidates live in buffers owned
//! by the thread, and page state is changed by CAS on the lock-free table.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use farvm_prefetch::{Candidates, Prefetcher};

use crate::engine::Inner;
use crate::error::EngineError;
use crate::state::{self as st, state_of};
use crate::stats::Hist;
use crate::store::{Completion, Op, PageBuf, Priority, ReadReq, Status};
use crate::sys::poll::Epoll;
use crate::sys::uffd::{Fault, RawMsg, MAX_EVENTS};
use crate::translate::PageSpace;
use crate::PAGE_SIZE;

const TOKEN_UFFD: u64 = 0;
const TOKEN_KICK: u64 = 1;
/// Reads per store call.
const BATCH: usize = 64;
/// Deferred prefetch candidates kept at most.
const DEFERRED: usize = 512;

/// A fault that could not be served yet (no free frame).
#[derive(Clone, Copy)]
struct Parked {
    fault: Fault,
    due_ns: u64,
}

pub(crate) struct Handler {
    inner: Arc<Inner>,
    prefetcher: Box<dyn Prefetcher>,
    space: Box<dyn PageSpace>,
    epoll: Epoll,
    raw: [RawMsg; MAX_EVENTS],
    faults: [Fault; MAX_EVENTS],
    /// Demand faults of this round, for the prefetcher: (process key, guest page).
    learn: [(u64, u64); MAX_EVENTS],
    nlearn: usize,
    demand: Batch,
    prefetch: Batch,
    cands: Candidates,
    parked: VecDeque<Parked>,
    /// Demand reads that failed, to submit again once due: (page, due ns). Each page stays
    /// INFLIGHT meanwhile, owned by its retry.
    retries: VecDeque<(u64, u64)>,
    /// Prefetch candidates waiting for a frame or an in-flight slot: (page, marker, since ns).
    /// Bounded; the oldest are dropped, and so are stale ones (the guest has likely passed).
    deferred: VecDeque<(u64, bool, u64)>,
    probe_ctr: u32,
}

/// A fixed-capacity read batch.
struct Batch {
    reqs: [Option<ReadReq>; BATCH],
    n: usize,
}

impl Batch {
    fn new() -> Self {
        Self {
            reqs: [None; BATCH],
            n: 0,
        }
    }
}

impl Handler {
    pub fn new(
        inner: Arc<Inner>,
        prefetcher: Box<dyn Prefetcher>,
        space: Box<dyn PageSpace>,
    ) -> Result<Self, EngineError> {
        let epoll = Epoll::new().map_err(|e| EngineError::os("epoll_create", e))?;
        epoll
            .add(inner.uffd.raw_fd(), TOKEN_UFFD)
            .map_err(|e| EngineError::os("epoll add uffd", e))?;
        epoll
            .add(inner.kick.raw_fd(), TOKEN_KICK)
            .map_err(|e| EngineError::os("epoll add eventfd", e))?;
        Ok(Self {
            inner,
            prefetcher,
            space,
            epoll,
            raw: [RawMsg::default(); MAX_EVENTS],
            faults: [Fault::default(); MAX_EVENTS],
            learn: [(0, 0); MAX_EVENTS],
            nlearn: 0,
            demand: Batch::new(),
            prefetch: Batch::new(),
            cands: Candidates::new(),
            parked: VecDeque::with_capacity(1024),
            retries: VecDeque::with_capacity(1024),
            deferred: VecDeque::with_capacity(DEFERRED),
            probe_ctr: 0,
        })
    }

    pub fn run(mut self) {
        let backoff_ns = self.inner.cfg.retry_backoff_ms.max(1) * 1_000_000;
        while !self.inner.stop.load(Ordering::Acquire) {
            let idle = self.parked.is_empty() && self.deferred.is_empty();
            let timeout = if idle && self.retries.is_empty() {
                100
            } else {
                1
            };
            let ready = match self.epoll.wait(timeout) {
                Ok(r) => r,
                Err(e) => {
                    self.inner.push_error(EngineError::os("epoll_wait", e));
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            };
            if ready & (1 << TOKEN_KICK) != 0 {
                self.inner.kick.drain();
            }
            let now = self.inner.now();
            while let Ok(p) = self.inner.retry_rx.try_recv() {
                self.retries.push_back((p, now + backoff_ns));
            }
            self.retry_reads(now);
            self.retry_parked(now);
            self.drain_deferred(now);
            loop {
                let n = match self.inner.uffd.read_faults(&mut self.raw, &mut self.faults) {
                    Ok(n) => n,
                    Err(e) => {
                        self.inner
                            .push_error(EngineError::os("reading userfaultfd", e));
                        0
                    }
                };
                if n == 0 {
                    break;
                }
                let now = self.inner.now();
                for i in 0..n {
                    let f = self.faults[i];
                    self.handle(f, now);
                }
                self.flush_demand();
                self.run_prefetcher(now);
            }
            self.flush_demand();
            self.run_prefetcher(self.inner.now());
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
            self.handle(p.fault, now);
        }
        self.flush_demand();
    }

    /// Submits again the failed demand reads whose back-off is over (in order: they were
    /// queued with the same back-off).
    fn retry_reads(&mut self, now: u64) {
        while let Some(&(p, due)) = self.retries.front() {
            if due > now {
                break;
            }
            self.retries.pop_front();
            if state_of(self.inner.table.load(p)) != st::INFLIGHT {
                tracing::error!("guest page {p:#x} queued for a read retry is not in flight");
                continue;
            }
            self.inner
                .counters
                .read_retries
                .fetch_add(1, Ordering::Relaxed);
            self.push_read(p, Priority::Demand, now);
        }
        self.flush_demand();
    }

    fn park(&mut self, fault: Fault, now: u64) {
        self.parked.push_back(Parked { fault, due_ns: now });
    }

    /// Resolves one fault according to its page's state.
    fn handle(&mut self, f: Fault, now: u64) {
        let inner = &*self.inner;
        let base = inner.ram.guest_base();
        let Some(p) = f
            .address
            .checked_sub(base)
            .map(|off| off / PAGE_SIZE as u64)
            .filter(|&p| p < inner.pages())
        else {
            tracing::error!("fault at {:#x} outside guest RAM", f.address);
            return;
        };
        let c = &inner.counters;
        loop {
            let w = inner.table.load(p);
            match state_of(w) {
                st::NEVER => {
                    if !inner.try_reserve(true) {
                        c.frame_waits.fetch_add(1, Ordering::Relaxed);
                        self.park(f, now);
                        return;
                    }
                    let inflight = st::pins_only(w) | st::INFLIGHT | st::F_DEMAND;
                    if inner.table.cas(p, w, inflight).is_err() {
                        inner.release_frame();
                        continue;
                    }
                    inner.install_zero(p, true);
                    inner
                        .hist
                        .record(Hist::ZeroFill, inner.now().saturating_sub(now));
                    // Every fault goes to the prefetcher (its history is the access stream);
                    // candidates that are never-written pages are then skipped.
                    self.learn_fault(f.tid, p);
                    return;
                }
                st::REMOTE => {
                    if !inner.try_reserve(true) {
                        c.frame_waits.fetch_add(1, Ordering::Relaxed);
                        self.park(f, now);
                        return;
                    }
                    let mut inflight = st::pins_only(w) | st::INFLIGHT | st::F_DEMAND;
                    if inner.is_hot_refault(p) {
                        inflight |= st::F_HOT;
                    }
                    if inner.table.cas(p, w, inflight).is_err() {
                        inner.release_frame();
                        continue;
                    }
                    if inflight & st::F_HOT != 0 {
                        c.hot_refaults.fetch_add(1, Ordering::Relaxed);
                    }
                    inner.t_fault[p as usize].store(now, Ordering::Relaxed);
                    c.demand_faults.fetch_add(1, Ordering::Relaxed);
                    self.learn_fault(f.tid, p);
                    self.push_read(p, Priority::Demand, now);
                    return;
                }
                st::INFLIGHT => {
                    let late = w & st::F_PREFETCHED != 0;
                    let new = if late {
                        // A prefetch not yet arrived: install on arrival (not stage) and wake us.
                        (w & !(st::F_MARKER | st::F_PREFETCHED | st::F_PROBE))
                            | st::F_WAITERS
                            | st::F_DEMAND
                            | st::F_CONSUMED
                    } else {
                        w | st::F_WAITERS
                    };
                    if w != new && inner.table.cas(p, w, new).is_err() {
                        continue;
                    }
                    if late {
                        // The vCPU now waits on this read: its fault-service time starts here
                        // (t_fault may hold a fault of an earlier residency of the page).
                        inner.t_fault[p as usize].store(now, Ordering::Relaxed);
                        inner.store.promote(p);
                        c.prefetch_late_hits.fetch_add(1, Ordering::Relaxed);
                        if w & st::F_PROBE != 0 {
                            c.probe_hits.fetch_add(1, Ordering::Relaxed);
                        }
                        let key = self.key_of(f.tid);
                        let pf = self.space.to_prefetch(&*self.inner, key, p);
                        if w & st::F_MARKER != 0 {
                            // A marker (or probe) still in flight: the guest reached it, the
                            // very signal a prefetcher's continuation waits for. Answer it now:
                            // otherwise a stream the guest caught up with issues nothing more
                            // and restarts small at the next miss, and the guest keeps
                            // catching up.
                            self.prefetcher.on_marker_hit(key, pf, now, &mut self.cands);
                            self.issue_candidates(key, now);
                        } else {
                            self.prefetcher.on_hit(key, pf, now);
                        }
                    } else {
                        c.dedup_waits.fetch_add(1, Ordering::Relaxed);
                    }
                    return;
                }
                st::STAGED => {
                    // The hit signal of a staged marker/probe: map it now, no network.
                    let staged_at = inner.t_io[p as usize].load(Ordering::Relaxed);
                    if inner
                        .table
                        .cas(p, w, st::pins_only(w) | st::INFLIGHT | st::F_DEMAND)
                        .is_err()
                    {
                        continue;
                    }
                    // Account and tell the prefetcher before the wake, so a woken vCPU never
                    // observes a hit that is not counted yet.
                    c.prefetch_marker_hits.fetch_add(1, Ordering::Relaxed);
                    if w & st::F_PROBE != 0 {
                        c.probe_hits.fetch_add(1, Ordering::Relaxed);
                    }
                    inner
                        .hist
                        .record(Hist::Timeliness, now.saturating_sub(staged_at));
                    let key = self.key_of(f.tid);
                    let pf = self.space.to_prefetch(&*self.inner, key, p);
                    // A marker hit may answer with the prefetcher's next window (like Linux's
                    // async read-ahead marker); those candidates go out with this round's
                    // prefetch batch.
                    self.prefetcher.on_marker_hit(key, pf, now, &mut self.cands);
                    inner.publish_local(p, |_| st::F_CONSUMED, true);
                    let _ = inner.consumed_tx.try_send(p);
                    self.issue_candidates(key, now);
                    return;
                }
                st::LOCAL => {
                    // Raced with an install, or unmapped after a failed write-back: (re)map
                    // under a pin so the evictor cannot zap it meanwhile.
                    if !inner.table.try_pin(p) {
                        continue;
                    }
                    let r = inner.uffd.continue_range(
                        inner.ram.guest_page_addr(p),
                        PAGE_SIZE as u64,
                        true,
                    );
                    inner.table.unpin(p);
                    if let Err(e) = r {
                        tracing::error!("re-mapping guest page {p:#x}: {e}");
                    }
                    c.spurious_faults.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                st::EVICTING => {
                    if w & st::F_WAITERS == 0 && inner.table.cas(p, w, w | st::F_WAITERS).is_err() {
                        continue;
                    }
                    inner.t_fault[p as usize].store(now, Ordering::Relaxed);
                    c.evicting_waits.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                st::LOST => {
                    // No data to install: the VMM stops the VM (and may let the vCPU go).
                    inner.lost_page_accessed(p);
                    return;
                }
                other => {
                    tracing::error!("guest page {p:#x} in impossible state {other}");
                    return;
                }
            }
        }
    }

    /// Remembers a fault of this round for the prefetcher (consulted after the demand batch
    /// is on its way).
    fn learn_fault(&mut self, tid: u32, p: u64) {
        if self.inner.vcpus.vcpu_of(tid).is_none() {
            self.inner
                .counters
                .unattributed_faults
                .fetch_add(1, Ordering::Relaxed);
        }
        let key = self.key_of(tid);
        if self.nlearn < self.learn.len() {
            self.learn[self.nlearn] = (key, p);
            self.nlearn += 1;
        }
    }

    fn key_of(&self, tid: u32) -> u64 {
        let inner = &*self.inner;
        // SAFETY: registered slot pages are pinned resident (set_agent_slot) and in bounds of
        // the alias mapping, which lives as long as `inner`.
        unsafe {
            inner
                .vcpus
                .attribute(tid, |page| inner.ram.alias_page(page) as *const u8)
        }
        .key()
    }

    fn push_read(&mut self, p: u64, priority: Priority, now: u64) {
        let inner = &*self.inner;
        inner.t_io[p as usize].store(now, Ordering::Relaxed);
        // SAFETY: the alias page of `p` is 4 KiB of engine memory, owned by this read until its
        // completion (the page is INFLIGHT).
        let dst = unsafe { PageBuf::new(inner.ram.alias_page(p)) }.expect("alias is non-null");
        let batch = match priority {
            Priority::Demand => &mut self.demand,
            Priority::Prefetch => &mut self.prefetch,
        };
        batch.reqs[batch.n] = Some(ReadReq {
            page: p,
            priority,
            dst,
        });
        batch.n += 1;
        if batch.n == BATCH {
            match priority {
                Priority::Demand => self.flush_demand(),
                Priority::Prefetch => self.flush_prefetch(),
            }
        }
    }

    fn flush_demand(&mut self) {
        flush(&self.inner, &mut self.demand);
    }

    fn flush_prefetch(&mut self) {
        flush(&self.inner, &mut self.prefetch);
    }

    /// Feeds this round's demand faults to the prefetcher and issues its candidates.
    fn run_prefetcher(&mut self, now: u64) {
        let n = std::mem::take(&mut self.nlearn);
        if !self.inner.cfg.prefetch {
            return;
        }
        for i in 0..n {
            let (key, p) = self.learn[i];
            let pf = self.space.to_prefetch(&*self.inner, key, p);
            self.prefetcher.on_fault(key, pf, now, &mut self.cands);
            for j in 0..self.cands.len() {
                let (cand, marker) = (self.cands.as_slice()[j], self.cands.is_marker(j));
                self.issue_prefetch(key, cand, marker, now);
            }
        }
        self.flush_prefetch();
        self.publish_space_counts();
    }

    /// Copies the page space's counts into the engine's counters (stores, not adds: the space
    /// keeps the totals).
    fn publish_space_counts(&self) {
        let w = self.space.counts();
        let c = &self.inner.counters;
        c.page_table_walks.store(w.walks, Ordering::Relaxed);
        c.faults_seen_virtual.store(w.translated, Ordering::Relaxed);
        c.faults_seen_physical
            .store(w.untranslated, Ordering::Relaxed);
        c.candidates_unmapped
            .store(w.unmapped_candidates, Ordering::Relaxed);
    }

    /// Issues the candidates a marker hit answered with (they go out with this round's
    /// prefetch batch).
    fn issue_candidates(&mut self, key: u64, now: u64) {
        if !self.inner.cfg.prefetch {
            return;
        }
        for j in 0..self.cands.len() {
            let (cand, marker) = (self.cands.as_slice()[j], self.cands.is_marker(j));
            self.issue_prefetch(key, cand, marker, now);
        }
    }

    /// Translates a candidate and issues it, deferring it if the limits say "not now".
    fn issue_prefetch(&mut self, key: u64, cand: u64, marker: bool, now: u64) {
        let Some(p) = self
            .space
            .to_guest(&*self.inner, key, cand)
            .filter(|&p| p < self.inner.pages())
        else {
            self.inner
                .counters
                .prefetch_skipped
                .fetch_add(1, Ordering::Relaxed);
            return;
        };
        if self.try_issue(p, marker, now) == Issue::Defer {
            self.defer(p, marker, now);
        }
    }

    /// Keeps a candidate the limits refused for when frames or in-flight slots free up: a
    /// dropped candidate is one the prefetcher believes was fetched, and a stream pipeline that
    /// lost one window keeps running ahead of the guest (measured with leap+stream).
    fn defer(&mut self, p: u64, marker: bool, now: u64) {
        let c = &self.inner.counters;
        c.prefetch_deferred.fetch_add(1, Ordering::Relaxed);
        if self.deferred.len() == self.deferred.capacity() {
            self.deferred.pop_front();
            c.prefetch_dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.deferred.push_back((p, marker, now));
    }

    /// Issues deferred candidates, oldest first, while the limits allow.
    fn drain_deferred(&mut self, now: u64) {
        let max_age = self.inner.cfg.prefetch_defer_max_us * 1000;
        while let Some(&(p, marker, since)) = self.deferred.front() {
            if now.saturating_sub(since) > max_age {
                // Too late to be ahead of the guest: spend the frame on fresher candidates.
                self.deferred.pop_front();
                self.inner
                    .counters
                    .prefetch_dropped
                    .fetch_add(1, Ordering::Relaxed);
                continue;
            }
            if self.try_issue(p, marker, now) == Issue::Defer {
                break;
            }
            self.deferred.pop_front();
        }
        self.flush_prefetch();
    }

    fn try_issue(&mut self, p: u64, marker: bool, now: u64) -> Issue {
        let inner = self.inner.clone();
        let c = &inner.counters;
        // Markers carry the prefetcher's learning signal (e.g. the end of a Leap/stream
        // window), so they may exceed the in-flight cap and dip into the free reserve.
        if !marker
            && inner.prefetch_inflight.load(Ordering::Relaxed)
                >= inner.cfg.max_prefetch_inflight as u64
        {
            return Issue::Defer;
        }
        let w = inner.table.load(p);
        if state_of(w) != st::REMOTE {
            c.prefetch_skipped.fetch_add(1, Ordering::Relaxed);
            return Issue::Skip;
        }
        if !inner.try_reserve(marker) {
            return Issue::Defer;
        }
        // Systematic sample over every issued prefetch (markers included), so probe hits
        // estimate the hit rate of the whole population, injected pages included.
        let probe = {
            let every = inner.cfg.probe_every;
            self.probe_ctr = self.probe_ctr.wrapping_add(1);
            every > 0 && self.probe_ctr.is_multiple_of(every)
        };
        let mut new = st::pins_only(w) | st::INFLIGHT | st::F_PREFETCHED | st::F_PF_READ;
        if marker || probe {
            new |= st::F_MARKER;
        }
        if probe {
            new |= st::F_PROBE;
        }
        if inner.table.cas(p, w, new).is_err() {
            inner.release_frame();
            c.prefetch_skipped.fetch_add(1, Ordering::Relaxed);
            return Issue::Skip;
        }
        if probe {
            c.probe_staged.fetch_add(1, Ordering::Relaxed);
        }
        inner.prefetch_inflight.fetch_add(1, Ordering::Relaxed);
        c.prefetch_issued.fetch_add(1, Ordering::Relaxed);
        self.push_read(p, Priority::Prefetch, now);
        Issue::Done
    }
}

/// Serves demand reads synchronously where the store can ([`RemoteStore::read_now`]), one by
/// one, installing each as it lands. Returns how many of `reqs` (moved to its front) still
/// need an asynchronous read: all of them if the store has no synchronous path.
///
/// [`RemoteStore::read_now`]: crate::store::RemoteStore::read_now
fn read_demand_now(inner: &Inner, reqs: &mut [ReadReq]) -> usize {
    let c = &inner.counters;
    let mut left = 0;
    for i in 0..reqs.len() {
        let r = reqs[i];
        inner.outstanding.fetch_add(1, Ordering::AcqRel);
        match inner.store.read_now(r.page, r.dst) {
            Some(status) => {
                c.remote_reads_demand.fetch_add(1, Ordering::Relaxed);
                c.sync_demand_reads.fetch_add(1, Ordering::Relaxed);
                inner.on_completions(&[Completion {
                    op: Op::Read,
                    page: r.page,
                    status,
                }]);
            }
            None => {
                inner.outstanding.fetch_sub(1, Ordering::AcqRel);
                reqs[left] = r;
                left += 1;
            }
        }
    }
    left
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Issue {
    Done,
    Skip,
    Defer,
}

/// Submits a batch; if the store refuses it, every request completes as failed.
fn flush(inner: &Inner, b: &mut Batch) {
    if b.n == 0 {
        return;
    }
    let mut reqs = [ReadReq {
        page: 0,
        priority: Priority::Demand,
        dst: b.reqs[0].expect("batch slot 0 is filled").dst,
    }; BATCH];
    for (dst, src) in reqs.iter_mut().zip(b.reqs[..b.n].iter()) {
        *dst = src.expect("filled batch slot");
    }
    let mut n = std::mem::take(&mut b.n);
    let c = &inner.counters;
    if reqs[0].priority == Priority::Demand {
        n = read_demand_now(inner, &mut reqs[..n]);
        if n == 0 {
            return;
        }
    }
    for r in &reqs[..n] {
        match r.priority {
            Priority::Demand => c.remote_reads_demand.fetch_add(1, Ordering::Relaxed),
            Priority::Prefetch => c.remote_reads_prefetch.fetch_add(1, Ordering::Relaxed),
        };
    }
    inner.outstanding.fetch_add(n as u64, Ordering::AcqRel);
    if let Err(e) = inner.store.read(&reqs[..n]) {
        inner.outstanding.fetch_sub(n as u64, Ordering::AcqRel);
        for r in &reqs[..n] {
            inner.on_read_done(r.page, Status::Failed(e));
        }
    }
}
