//! The completion path: what the engine does when the store completes a request. It runs on
//! whatever thread delivers the completion (the store's, or the fault handler's for reads the
//! store serves synchronously; no hop to another thread: on this host a thread wake-up costs
//! 5–50 µs) and owns no state: it acts on the parts.
//!
//! On a read completion (the page is `INFLIGHT`, owned by the read):
//! - `Ok`: fingerprint the data (the clean copy, for the dirty check at eviction). If the
//!   engine knows the page's remote content (it wrote the page back or read it before) and
//!   this is not it, a server returned an older or damaged copy (a stale replica passes the
//!   wire checksums). It is never installed: the store is told which copy it was
//!   (`RemoteStore::reject`); if another copy may hold the page, the read is made again as
//!   after a failure (below), else the page is `LOST`, as for `Absent`. Otherwise
//!   - a marker or probe nobody waits for → `STAGED`, left unmapped so the first touch reveals
//!     the hit;
//!   - a prefetch nobody waits for → `LOCAL|PREFETCHED`, *injected*: mapped without a wake,
//!     together with its neighbours of the same batch, then stage 2 pre-faulted;
//!   - a demand read, or any read a fault or VMM access waits on → `LOCAL`, mapped, waiters
//!     woken.
//! - `Absent`: the copy that answered lacks the page (pages become `REMOTE` only when written
//!   back): as for stale content, another copy is tried if the store has one; else the
//!   servers lost the page → `LOST` for good, frame released, an error logged; a waiting
//!   fault or access is reported to the VMM.
//! - `Failed`: with a waiter it stays `INFLIGHT` with its frame (waiters keep waiting, no
//!   second read can start) and is queued for the fault handler to read again after a
//!   back-off: one retry chain per page however long the store is down. Without one (a
//!   prefetch) → back to `REMOTE`, frame released.
//!
//! In every case a read issued as a prefetch gives its in-flight slot back.
//!
//! A write-back completion goes to the evictor (its write-back queue), which is woken.

use std::sync::Arc;

use crate::clock::Clock;
use crate::errlog::ErrorLog;
use crate::error::EngineError;
use crate::frames::Frames;
use crate::installer::Installer;
use crate::lost::LostPages;
use crate::pagemeta::{PageMeta, UNKNOWN_FP};
use crate::parts::Parts;
use crate::port::StorePort;
use crate::prefetch_slots::PrefetchSlots;
use crate::procstats::{ProcessCounter, ProcessTable};
use crate::queues::Queues;
use crate::state::{self as st, state_of, PageTable};
use crate::stats::{Counter, Counters, Hist, Histograms};
use crate::store::{Completion, CompletionSink, Op, Replica, Status};
use crate::PAGE_SIZE;

/// Injected pages mapped per batch of completions (a stack array, no allocation).
const INJECT_BATCH: usize = 64;

pub(crate) struct Completer {
    table: Arc<PageTable>,
    meta: Arc<PageMeta>,
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
    clock: Clock,
}

impl CompletionSink for Completer {
    fn complete(&self, batch: &[Completion]) {
        // Injected prefetches of this batch are mapped together at the end, one
        // UFFDIO_CONTINUE per run of neighbours; demand pages are mapped and woken at once.
        let mut inject = [0u64; INJECT_BATCH];
        let mut n = 0;
        for c in batch {
            match c.op {
                Op::Read => {
                    if c.page >= self.table.len() {
                        tracing::error!("store completed a read of unknown page {:#x}", c.page);
                        continue;
                    }
                    if let Some(p) = self.read_done(c.page, c.status, c.replica) {
                        inject[n] = p;
                        n += 1;
                        if n == INJECT_BATCH {
                            self.installer.inject(&mut inject[..n]);
                            n = 0;
                        }
                    }
                }
                Op::Write => {
                    if !self.queues.written(*c) {
                        tracing::error!("write-back completion queue overflow");
                    }
                    self.frames.wake_evictor();
                }
            }
        }
        if n > 0 {
            self.installer.inject(&mut inject[..n]);
        }
    }
}

impl Completer {
    pub fn new(parts: &Parts) -> Self {
        Self {
            table: parts.table().clone(),
            meta: parts.meta().clone(),
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
            clock: parts.clock(),
        }
    }

    /// Applies one read completion. Returns `Some(p)` for a page claimed for injection (LOCAL,
    /// pinned) that the caller must map ([`Installer::inject`]).
    fn read_done(&self, p: u64, status: Status, replica: Replica) -> Option<u64> {
        let now = self.clock.now();
        let w0 = self.table.load(p);
        if state_of(w0) != st::INFLIGHT {
            tracing::error!(
                "read completion for guest page {p:#x} that is not in flight ({w0:#x})"
            );
            return None;
        }
        if w0 & st::F_PF_READ != 0 {
            self.slots.give_back();
        }
        match status {
            Status::Ok => {
                self.counters.add(Counter::BytesRead, PAGE_SIZE as u64);
                let fp = self.installer.fingerprint(p);
                let known = self.meta.clean_fp(p);
                if known != UNKNOWN_FP && fp != known {
                    // Not what this VM wrote back or read last: a server's older or damaged
                    // copy. Never installed (the guest would compute with it silently): read
                    // from another copy if there is one, else lost.
                    self.counters.inc(Counter::RemoteStale);
                    let gpa = p * PAGE_SIZE as u64;
                    if self.port.reject(p, replica) {
                        self.errors.push(EngineError::StaleCopyRejected { gpa });
                        self.read_again(p);
                    } else {
                        self.lose(p, EngineError::PageStale { gpa });
                    }
                    return None;
                }
                self.meta.set_clean_fp(p, fp);
                self.hist
                    .record(Hist::StoreRead, now.saturating_sub(self.meta.io_at(p)));
                return self.install_arrived(p, now);
            }
            Status::Absent => {
                // Pages are remote only once written back: a copy without it missed a write.
                // Read from another copy if there is one, else lost.
                self.counters.inc(Counter::RemoteAbsent);
                let gpa = p * PAGE_SIZE as u64;
                if replica != Replica::NONE && self.port.reject(p, replica) {
                    self.errors.push(EngineError::StaleCopyRejected { gpa });
                    self.read_again(p);
                } else {
                    self.lose(p, EngineError::PageLost { gpa });
                }
            }
            Status::Failed(error) => self.failed(p, error),
        }
        None
    }

    /// `Absent`, or stale content: LOST for good (another read would say the same); whoever
    /// waits on it is reported, a prefetch that found it is not (the guest may never need it).
    fn lose(&self, p: u64, why: EngineError) {
        // The read owns the page (INFLIGHT): nothing of its landing frame is kept.
        self.installer.drop_landing(p);
        self.errors.push(why);
        let r = self.table.update(p, |w| {
            (state_of(w) == st::INFLIGHT).then_some(st::pins_only(w) | st::LOST)
        });
        if let Ok((old, _)) = r {
            self.frames.release();
            if old & (st::F_DEMAND | st::F_WAITERS) != 0 {
                self.lost.accessed(p);
            }
        }
    }

    /// `Failed`: retried while somebody waits, dropped otherwise (module docs).
    fn failed(&self, p: u64, error: crate::store::StoreError) {
        self.counters.inc(Counter::StoreErrors);
        self.errors.push(EngineError::Store {
            op: "read",
            gpa: p * PAGE_SIZE as u64,
            error,
        });
        self.read_again(p);
    }

    /// A read of `p` delivered nothing to keep but may succeed again (failed, or a stale copy
    /// the store dropped): retried while somebody waits, dropped otherwise (module docs).
    fn read_again(&self, p: u64) {
        // The read owns the page (INFLIGHT): its landing frame holds nothing worth keeping, and
        // a retry assigns a new one.
        self.installer.drop_landing(p);
        let r = self.table.update(p, |w| {
            if state_of(w) != st::INFLIGHT {
                None
            } else if w & (st::F_DEMAND | st::F_WAITERS) != 0 {
                Some(w & !st::F_PF_READ)
            } else {
                Some(st::pins_only(w) | st::REMOTE)
            }
        });
        match r {
            Ok((_, new)) if state_of(new) == st::INFLIGHT => self.queues.retry_later(p),
            Ok(_) => self.frames.release(),
            Err(_) => {}
        }
    }

    /// Stages or installs a page whose data just landed in the memfd. Returns `Some(p)` when
    /// the page was claimed for injection (LOCAL, pinned) and still has to be mapped.
    fn install_arrived(&self, p: u64, now: u64) -> Option<u64> {
        loop {
            let w = self.table.load(p);
            let waiters = w & (st::F_WAITERS | st::F_DEMAND) != 0;
            if w & st::F_MARKER != 0 && !waiters {
                let staged = st::pins_only(w)
                    | st::STAGED
                    | st::F_PREFETCHED
                    | st::F_REF
                    | (w & st::F_PROBE);
                self.meta.set_io_at(p, now);
                // Off the landing frame: a staged page may stay unmapped for long.
                self.installer.settle(p);
                if self.table.cas(p, w, staged).is_err() {
                    continue;
                }
                self.counters.inc(Counter::PrefetchStaged);
                self.procs
                    .add(self.meta.owner(p), ProcessCounter::PrefetchStaged, 1);
                return None;
            }
            let old = self.installer.claim_local(p, |w| {
                if w & (st::F_WAITERS | st::F_DEMAND) != 0 {
                    w & st::F_HOT
                } else {
                    st::F_PREFETCHED
                }
            });
            if old & (st::F_WAITERS | st::F_DEMAND) == 0 {
                // Injection: mapped with its neighbours by the caller, nobody to wake.
                self.procs
                    .add(self.meta.owner(p), ProcessCounter::PrefetchInjected, 1);
                return Some(p);
            }
            // Map without waking, then wake, timing each apart: the woken vCPU often takes
            // this CPU before the wake call returns (2 cores), which is neither install cost
            // nor time the vCPU spent waiting.
            self.installer.map_pinned(p, 1, false);
            let mapped = self.clock.now();
            self.hist.record(Hist::Install, mapped.saturating_sub(now));
            let t0 = self.meta.fault_at(p);
            if old & st::F_DEMAND != 0 && t0 != 0 {
                self.hist
                    .record(Hist::FaultService, mapped.saturating_sub(t0));
            }
            self.installer.wake(p);
            self.hist
                .record(Hist::Wake, self.clock.now().saturating_sub(mapped));
            return None;
        }
    }
}
