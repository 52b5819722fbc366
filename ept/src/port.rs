//! The store port: the engine's side of the page-store seam ([`RemoteStore`] out,
//! [`CompletionSink`] back). Every request the engine makes of the store goes through it, so it
//! owns the store handle, the count of requests the store holds (their buffers are guest RAM:
//! shutdown waits for them), the per-priority request counters, and the routing of
//! completions to the completion path (`complete`).
//!
//! # The protocol at the seam
//!
//! What the store must do:
//! - A read names a page the engine owns (`INFLIGHT`) and that page's memfd page (through the
//!   engine's alias) as its buffer; a write-back names an `EVICTING` page and its memfd page.
//!   The buffer is the store's from submission until the request's completion is delivered,
//!   and never after.
//! - Every request of an accepted batch completes exactly once, through the sink the port
//!   attached, in any order, on any thread, possibly inline inside `read`/`write` (the engine
//!   holds no lock while submitting).
//! - A read of a page the servers do not hold completes `Absent`, distinct from `Failed`.
//! - `read_now`, where offered, serves one demand read on the calling thread (the fault
//!   handler's), with no hand-off to another thread.
//!
//! What the port does:
//! - A refused read batch (`Err` from `read`) completes here, every read of it as
//!   `Status::Failed`, through the same completion path: a read has one way to fail.
//! - A `read_now` status is delivered through the same path before `read_now` returns.
//! - A refused write batch goes back to the evictor, which keeps the pages.
//!
//! What the engine does on each status is the completion path's (see `complete`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use crate::error::EngineError;
use crate::stats::{Counter, Counters};
use crate::store::{
    Completion, CompletionSink, GuestPage, Op, Priority, ReadReq, RemoteStore, Replica, Status,
    StoreError, Version, WriteReq,
};

/// Port-made completions delivered per call (a stack array, no allocation).
const FAILED_BATCH: usize = 64;

pub(crate) struct StorePort {
    store: Arc<dyn RemoteStore>,
    /// The completion path, set once by [`StorePort::connect`].
    sink: OnceLock<Arc<dyn CompletionSink>>,
    /// Requests the store holds (shared with [`Returns`], which counts their completions).
    outstanding: Arc<AtomicU64>,
    counters: Arc<Counters>,
    pages: u64,
}

impl StorePort {
    pub fn new(store: Arc<dyn RemoteStore>, counters: Arc<Counters>, pages: u64) -> Self {
        Self {
            store,
            sink: OnceLock::new(),
            outstanding: Arc::new(AtomicU64::new(0)),
            counters,
            pages,
        }
    }

    /// Connects the completion path: attaches the store (which gets only a weak reference to
    /// it, so the store never keeps the engine alive) and routes port-made completions to it.
    pub fn connect(&self, sink: Arc<dyn CompletionSink>) -> Result<(), EngineError> {
        let returns = Returns {
            to: Arc::downgrade(&sink),
            outstanding: self.outstanding.clone(),
            pages: self.pages,
        };
        let _ = self.sink.set(sink);
        self.store
            .attach(Arc::new(returns))
            .map_err(|error| EngineError::Store {
                op: "attach",
                gpa: 0,
                error,
            })
    }

    /// Submits reads (one priority per call is usual, not required). A refused batch
    /// completes as failed before this returns.
    pub fn read(&self, reqs: &[ReadReq]) {
        if reqs.is_empty() {
            return;
        }
        for r in reqs {
            self.counters.inc(match r.priority {
                Priority::Demand => Counter::RemoteReadsDemand,
                Priority::Prefetch => Counter::RemoteReadsPrefetch,
            });
        }
        let n = reqs.len() as u64;
        self.outstanding.fetch_add(n, Ordering::AcqRel);
        if let Err(e) = self.store.read(reqs) {
            self.outstanding.fetch_sub(n, Ordering::AcqRel);
            self.fail_reads(reqs, e);
        }
    }

    /// Serves demand read `r` on this thread if the store can ([`RemoteStore::read_now`]); its
    /// completion has been delivered when this returns true. False: submit it with
    /// [`StorePort::read`].
    #[inline]
    pub fn read_now(&self, r: &ReadReq) -> bool {
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        let served = match self.store.read_now(r) {
            Some((status, replica)) => {
                self.counters.inc(Counter::RemoteReadsDemand);
                self.counters.inc(Counter::SyncDemandReads);
                self.deliver(&[Completion {
                    op: Op::Read,
                    page: r.page,
                    status,
                    replica,
                }]);
                true
            }
            None => false,
        };
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
        served
    }

    /// Submits write-backs; a refused batch is returned (no completion will come).
    pub fn write(&self, reqs: &[WriteReq]) -> Result<(), StoreError> {
        let n = reqs.len() as u64;
        self.outstanding.fetch_add(n, Ordering::AcqRel);
        self.store.write(reqs).inspect_err(|_| {
            self.outstanding.fetch_sub(n, Ordering::AcqRel);
        })
    }

    /// The content `replica` returned for `page` is stale: whether another copy may hold the
    /// page ([`RemoteStore::reject`]).
    pub fn reject(&self, page: GuestPage, replica: Replica) -> bool {
        self.store.reject(page, replica)
    }

    /// A vCPU now waits on the outstanding prefetch read of `page`.
    #[inline]
    pub fn promote(&self, page: GuestPage) {
        self.store.promote(page);
    }

    /// Whether the store wants its pages re-sealed ([`RemoteStore::reseal_wanted`]).
    #[inline]
    pub fn reseal_wanted(&self) -> bool {
        self.store.reseal_wanted()
    }

    /// Re-seals `page`'s stored copy on the calling thread ([`RemoteStore::reseal`]).
    pub fn reseal(&self, page: GuestPage, version: Version) -> Result<bool, StoreError> {
        self.store.reseal(page, version)
    }

    /// Every stored page was re-sealed ([`RemoteStore::reseal_finished`]).
    pub fn reseal_finished(&self) {
        self.store.reseal_finished();
    }

    /// Requests the store still holds.
    pub fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::Acquire)
    }

    fn fail_reads(&self, reqs: &[ReadReq], error: StoreError) {
        let mut done = [Completion {
            op: Op::Read,
            page: 0,
            status: Status::Failed(error),
            replica: Replica::NONE,
        }; FAILED_BATCH];
        for chunk in reqs.chunks(FAILED_BATCH) {
            for (c, r) in done.iter_mut().zip(chunk) {
                c.page = r.page;
            }
            self.deliver(&done[..chunk.len()]);
        }
    }

    fn deliver(&self, batch: &[Completion]) {
        match self.sink.get() {
            Some(sink) => sink.complete(batch),
            None => tracing::error!("store completions before the completion path was connected"),
        }
    }
}

/// The sink the store is attached to: forwards to the completion path while the engine lives,
/// then counts the requests as returned.
struct Returns {
    to: Weak<dyn CompletionSink>,
    outstanding: Arc<AtomicU64>,
    pages: u64,
}

impl CompletionSink for Returns {
    fn complete(&self, batch: &[Completion]) {
        if let Some(sink) = self.to.upgrade() {
            sink.complete(batch);
        }
        // A read of a page outside guest RAM is none the engine asked for (the completion
        // path logs it): it must not make a request still out look returned.
        let returned = batch
            .iter()
            .filter(|c| c.op == Op::Write || c.page < self.pages)
            .count();
        self.outstanding
            .fetch_sub(returned as u64, Ordering::AcqRel);
    }
}
