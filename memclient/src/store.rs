//! The paging engine's page store over the memserver client: [`PageStore`] implements
//! `farvm_pageio::RemoteStore`.
//!
//! Per submitted batch, requests are grouped by (priority, slab) into at most
//! [`PAGES_PER_REQUEST`] pages per memserver request (a contiguous group goes as a run,
//! anything else as a scatter list). Each group takes a preallocated *external* [`IoBuf`] from
//! a lock-free pool, pointed at the engine's own pages: a read response is received straight
//! into them and checked there, a write is sent from them. Nothing is allocated per request,
//! no page is copied through a client buffer, and no global lock is taken. Every request
//! carries its pages' versions, so a client with a page key seals and opens them
//! (docs/sealing.md).
//!
//! Finished requests come back through [`FinishedSink`] on the thread that received the
//! response (a connection's receiver), which turns them into per-page completions for the
//! engine's `CompletionSink` right there: no hand-off to another thread. The demand read a
//! vCPU waits on ([`RemoteStore::read_now`]) is received by the fault handler itself on the
//! client's demand lane.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crossbeam_queue::ArrayQueue;
use farvm_pageio::{
    Completion, CompletionSink, GuestPage, Op, PageBuf, Priority, ReadReq, RemoteStore, Replica,
    Status, StoreError, Version, WriteReq,
};

use crate::{Client, ClientError, Finished, FinishedSink, IoBuf, ReplyTo, Request};

/// Most pages grouped into one memserver request.
pub const PAGES_PER_REQUEST: usize = 32;
/// How long a submitter waits for a free request buffer before answering `Busy` (the engine
/// then treats the batch as failed: demand reads are retried, prefetches forgotten).
const SLOT_WAIT: Duration = Duration::from_millis(500);
/// Buffers kept for synchronous demand reads (one per concurrent fault-handler thread).
const DEMAND_BUFS: usize = 4;
/// `user_data` of a request: which engine operation it serves.
const READ: u64 = 0;
const WRITE: u64 = 1;

thread_local! {
    /// Set while this thread delivers completions to the engine: it must never wait for a
    /// request buffer (buffers come back through completions it may be the one to deliver).
    static DELIVERING: Cell<bool> = const { Cell::new(false) };
}

/// Settings of a [`PageStore`].
#[derive(Clone, Copy, Debug)]
pub struct StoreConfig {
    /// Memserver namespace of this VM.
    pub namespace: u64,
    /// Requests that may be outstanding at once (each up to [`PAGES_PER_REQUEST`] pages).
    pub slots: usize,
}

/// Counters of the store itself (the engine counts pages; these count wire requests).
#[derive(Debug, Default)]
pub struct StoreCounters {
    /// Requests submitted.
    pub requests: AtomicU64,
    /// Submissions that waited for a free request buffer.
    pub slot_waits: AtomicU64,
    /// Submissions refused as `Busy` (no buffer freed in time).
    pub busy: AtomicU64,
    /// Requests that failed.
    pub failed_requests: AtomicU64,
}

/// The receiving half: where finished requests go (shared with the client's tickets).
struct Deliver {
    /// Free request buffers (external, [`PAGES_PER_REQUEST`] pages each).
    free: ArrayQueue<IoBuf>,
    sink: OnceLock<Arc<dyn CompletionSink>>,
    counters: StoreCounters,
    /// A server answered that the pool reclaimed the namespace ([`PageStore::reclaimed`]).
    reclaimed: AtomicBool,
}

impl Deliver {
    /// Notes a request the pool's reclaim of the namespace refused (logged once).
    fn note(&self, done: &Finished) {
        if done.result == Err(ClientError::Reclaimed)
            && !self.reclaimed.swap(true, Ordering::AcqRel)
        {
            tracing::error!("{}", ClientError::Reclaimed);
        }
    }
}

/// `RemoteStore` over a memserver client (see the module docs).
pub struct PageStore {
    client: Arc<Client>,
    pub(crate) ns: u64,
    deliver: Arc<Deliver>,
    /// `deliver` as the client's reply target (one reference count per request, no
    /// allocation).
    reply: Arc<dyn FinishedSink>,
    /// One-page buffers of synchronous demand reads (`read_now`), lock-free; a caller finding
    /// it empty (more concurrent demand readers than buffers) allocates one.
    demand_bufs: ArrayQueue<IoBuf>,
    stopped: AtomicBool,
}

impl std::fmt::Debug for PageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageStore")
            .field("namespace", &self.ns)
            .field("slots", &self.deliver.free.capacity())
            .finish()
    }
}

impl PageStore {
    /// Whether a memory server answered that the pool reclaimed this store's namespace (its
    /// VM's lease expired and the collector claimed it): every remote page is gone, and the
    /// pages the engine reports lost are lost for that reason.
    pub fn reclaimed(&self) -> bool {
        self.deliver.reclaimed.load(Ordering::Acquire)
    }

    /// Wraps `client`; allocates every request buffer now.
    pub fn new(client: Arc<Client>, cfg: StoreConfig) -> Arc<Self> {
        let n = cfg.slots.clamp(1, 4096);
        let free = ArrayQueue::new(n);
        for _ in 0..n {
            let _ = free.push(IoBuf::external(PAGES_PER_REQUEST));
        }
        let demand_bufs = ArrayQueue::new(DEMAND_BUFS);
        for _ in 0..DEMAND_BUFS {
            let _ = demand_bufs.push(IoBuf::external(1));
        }
        let deliver = Arc::new(Deliver {
            free,
            sink: OnceLock::new(),
            counters: StoreCounters::default(),
            reclaimed: AtomicBool::new(false),
        });
        Arc::new(Self {
            client,
            ns: cfg.namespace,
            reply: deliver.clone(),
            deliver,
            demand_bufs,
            stopped: AtomicBool::new(false),
        })
    }

    /// The store's own counters.
    pub fn counters(&self) -> &StoreCounters {
        &self.deliver.counters
    }

    /// The client (replication health, stats).
    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// Refuses requests from now on (outstanding ones still complete: call after the engine
    /// shut down, which waits for them).
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
    }

    /// Takes a free request buffer, waiting (not while delivering) up to [`SLOT_WAIT`].
    fn take_buf(&self) -> Option<IoBuf> {
        if let Some(io) = self.deliver.free.pop() {
            return Some(io);
        }
        if DELIVERING.with(|f| f.get()) {
            return None;
        }
        let counters = &self.deliver.counters;
        counters.slot_waits.fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + SLOT_WAIT;
        let mut spins = 0u32;
        while Instant::now() < deadline {
            if let Some(io) = self.deliver.free.pop() {
                return Some(io);
            }
            spins += 1;
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        None
    }

    /// Submits one group (`pages[i]` living at `bufs[i]`, at `versions[i]`).
    fn submit_group(
        &self,
        op: Op,
        prio: Priority,
        pages: &[GuestPage],
        bufs: &[PageBuf],
        versions: &[Version],
    ) -> Result<(), StoreError> {
        let counters = &self.deliver.counters;
        let Some(mut io) = self.take_buf() else {
            counters.busy.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Busy);
        };
        // SAFETY: the engine keeps every request's page valid and leaves it to us until the
        // request's completion is delivered (the `RemoteStore` contract); the buffer selects
        // them only until then (it is re-pointed before its next use).
        let selected =
            unsafe { io.set_external(pages, bufs) }.and_then(|()| io.set_versions(versions));
        if let Err(e) = selected {
            let _ = self.deliver.free.push(io);
            return Err(map_err(e));
        }
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let req = Request {
            op,
            ns: self.ns,
            priority: prio,
            io,
            user_data: if op == Op::Read { READ } else { WRITE },
        };
        match self.client.submit(req, ReplyTo::Sink(&self.reply)) {
            Ok(()) => Ok(()),
            Err((e, io)) => {
                let _ = self.deliver.free.push(io);
                Err(map_err(e))
            }
        }
    }

    /// Groups `items` (page, buffer, priority) by priority and slab, in order, and submits
    /// each group. Groups that fail after an earlier one was accepted complete as failed
    /// through the sink; if the first fails, nothing was accepted and its error is returned.
    fn submit_all(
        &self,
        op: Op,
        n: usize,
        item: impl Fn(usize) -> (GuestPage, PageBuf, Priority, Version),
    ) -> Result<(), StoreError> {
        if n == 0 {
            return Ok(());
        }
        let slab = self.client.slab_pages().max(1);
        let first_buf = item(0).1;
        let mut pages = [0u64; PAGES_PER_REQUEST];
        let mut bufs = [first_buf; PAGES_PER_REQUEST];
        let mut versions = [Version::UNKNOWN; PAGES_PER_REQUEST];
        let mut accepted = false;
        let mut flush = |k: usize,
                         pages: &[u64; PAGES_PER_REQUEST],
                         bufs: &[PageBuf; PAGES_PER_REQUEST],
                         versions: &[Version; PAGES_PER_REQUEST],
                         prio: Priority|
         -> Result<(), StoreError> {
            if k == 0 {
                return Ok(());
            }
            match self.submit_group(op, prio, &pages[..k], &bufs[..k], &versions[..k]) {
                Ok(()) => accepted = true,
                Err(e) if !accepted => return Err(e),
                Err(e) => self.fail_inline(op, &pages[..k], e),
            }
            Ok(())
        };
        // Requests of one priority go out before the other's: demand first.
        for want in [Priority::Demand, Priority::Prefetch] {
            let mut k = 0usize;
            let mut group_slab = u64::MAX;
            for i in 0..n {
                let (p, b, prio, v) = item(i);
                if prio != want {
                    continue;
                }
                let s = p / slab;
                if k == PAGES_PER_REQUEST || (k > 0 && s != group_slab) {
                    flush(k, &pages, &bufs, &versions, want)?;
                    k = 0;
                }
                group_slab = s;
                pages[k] = p;
                bufs[k] = b;
                versions[k] = v;
                k += 1;
            }
            flush(k, &pages, &bufs, &versions, want)?;
        }
        Ok(())
    }

    /// Delivers `Failed(e)` for pages of a group that could not be submitted.
    fn fail_inline(&self, op: Op, pages: &[GuestPage], e: StoreError) {
        self.deliver
            .counters
            .failed_requests
            .fetch_add(1, Ordering::Relaxed);
        let mut out = [Completion {
            op,
            page: 0,
            status: Status::Failed(e),
            replica: Replica::NONE,
        }; PAGES_PER_REQUEST];
        for (o, p) in out.iter_mut().zip(pages) {
            o.page = *p;
        }
        self.deliver.to_engine(&out[..pages.len()]);
    }
}

impl Deliver {
    fn to_engine(&self, batch: &[Completion]) {
        if let Some(sink) = self.sink.get() {
            let was = DELIVERING.with(|f| f.replace(true));
            sink.complete(batch);
            DELIVERING.with(|f| f.set(was));
        }
    }
}

impl FinishedSink for Deliver {
    /// Turns a finished request into one completion per page (no allocation), frees its
    /// buffer, then hands the completions to the engine.
    fn finished(&self, done: Finished) {
        self.note(&done);
        let op = if done.user_data == WRITE {
            Op::Write
        } else {
            Op::Read
        };
        let mut out = [Completion {
            op,
            page: 0,
            status: Status::Ok,
            replica: answered_by(&done),
        }; PAGES_PER_REQUEST];
        let n = done.io.len().min(PAGES_PER_REQUEST);
        for (i, o) in out.iter_mut().enumerate().take(n) {
            o.page = done.io.page_index(i);
            o.status = page_status(op, &done.result, done.io.is_present(i));
        }
        if done.result.is_err() {
            self.counters
                .failed_requests
                .fetch_add(1, Ordering::Relaxed);
        }
        let _ = self.free.push(done.io);
        self.to_engine(&out[..n]);
    }
}

/// The copy a read's pages came from, for the engine to reject if they are stale or absent;
/// none for a slab whose every replica was lost (`Lost`) or a namespace the pool reclaimed
/// (`Reclaimed`): its absent pages are lost, not missing from one copy.
fn answered_by(done: &Finished) -> Replica {
    match done.result {
        Err(ClientError::Lost | ClientError::Reclaimed) => Replica::NONE,
        _ => Replica(done.server),
    }
}

/// A page's status from its request's outcome. `Lost`: the pages delivered are good, the
/// others are gone for good (Absent to the engine, which reads only pages it wrote back and
/// reports those as lost); `Reclaimed`: every page is gone so. A read that failed otherwise
/// reports no page present, whatever landed.
fn page_status(op: Op, result: &Result<u32, ClientError>, present: bool) -> Status {
    match (result, op) {
        (Ok(_) | Err(ClientError::Lost), Op::Read) if present => Status::Ok,
        (Ok(_) | Err(ClientError::Lost | ClientError::Reclaimed), Op::Read) => Status::Absent,
        (Err(e), _) => Status::Failed(map_err(*e)),
        (Ok(_), Op::Write) => Status::Ok,
    }
}

/// Maps a client error to the engine's error vocabulary.
pub fn map_err(e: ClientError) -> StoreError {
    match e {
        ClientError::Timeout => StoreError::Timeout,
        // Lost: reads turn it into `Status::Absent` first; writes and discards never see it.
        // Reclaimed: the VMM's pool follower sees the VM's placement gone and stops the VM
        // with that cause; until then the engine retries, never installing anything.
        ClientError::Disconnected
        | ClientError::NoLiveReplica
        | ClientError::Reclaimed
        | ClientError::Lost
        | ClientError::Connect { .. }
        | ClientError::Rdma { .. }
        | ClientError::NoLink { .. } => StoreError::Unavailable,
        ClientError::QueueFull => StoreError::Busy,
        ClientError::Protocol(_)
        | ClientError::Version { .. }
        | ClientError::ChecksumMismatch
        | ClientError::Unauthentic
        | ClientError::Server(_) => StoreError::Protocol,
        ClientError::CapacityExhausted => StoreError::Io(libc::ENOSPC),
        ClientError::Denied | ClientError::Auth { .. } => StoreError::Io(libc::EACCES),
        ClientError::InvalidRequest(_) => StoreError::Io(libc::EINVAL),
    }
}

impl RemoteStore for PageStore {
    fn attach(&self, sink: Arc<dyn CompletionSink>) -> Result<(), StoreError> {
        self.deliver.sink.set(sink).map_err(|_| StoreError::Closed)
    }

    fn read(&self, reqs: &[ReadReq]) -> Result<(), StoreError> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        self.submit_all(Op::Read, reqs.len(), |i| {
            let r = &reqs[i];
            (r.page, r.dst, r.priority, r.version)
        })
    }

    fn write(&self, reqs: &[WriteReq]) -> Result<(), StoreError> {
        if self.stopped.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        // Write-backs go at demand priority: the evictor frees frames a vCPU may wait for.
        self.submit_all(Op::Write, reqs.len(), |i| {
            let w = &reqs[i];
            (w.page, w.src, Priority::Demand, w.version)
        })
    }

    /// The demand read a vCPU is blocked on, sent on the client's demand lane and received
    /// straight into `dst` on the calling thread (`Client::submit_wait`): no queueing behind
    /// prefetch responses, no hand-off to another thread, no copy.
    fn read_now(&self, req: &ReadReq) -> Option<(Status, Replica)> {
        let (page, dst) = (req.page, req.dst);
        if self.stopped.load(Ordering::Acquire) {
            return Some((Status::Failed(StoreError::Closed), Replica::NONE));
        }
        let counters = &self.deliver.counters;
        let mut io = self.demand_bufs.pop().unwrap_or_else(|| IoBuf::external(1));
        // SAFETY: the engine hands us `dst` for this read only and does not touch it until we
        // return, after the request finished.
        let selected = unsafe { io.set_external(&[page], &[dst]) }
            .and_then(|()| io.set_versions(&[req.version]));
        if let Err(e) = selected {
            let _ = self.demand_bufs.push(io);
            return Some((Status::Failed(map_err(e)), Replica::NONE));
        }
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let done = self.client.submit_wait(Op::Read, self.ns, io);
        self.deliver.note(&done);
        if matches!(done.result, Err(e) if e != ClientError::Lost) {
            counters.failed_requests.fetch_add(1, Ordering::Relaxed);
        }
        let status = page_status(Op::Read, &done.result, done.io.is_present(0));
        let replica = answered_by(&done);
        let _ = self.demand_bufs.push(done.io);
        Some((status, replica))
    }

    fn reject(&self, page: GuestPage, replica: Replica) -> bool {
        self.client.reject_replica(self.ns, page, replica.0)
    }

    fn reseal_wanted(&self) -> bool {
        self.client.keys().is_some_and(|k| k.rotating())
    }

    fn reseal(&self, page: GuestPage, version: Version) -> Result<bool, StoreError> {
        match PageStore::reseal(self, page, version) {
            Ok(r) => Ok(r == crate::Resealed::Written),
            Err(e) => Err(map_err(e)),
        }
    }

    fn reseal_finished(&self) {
        if let Some(dropped) = self.client.keys().and_then(|k| k.drop_previous()) {
            tracing::info!(key = %dropped, "previous page key dropped: no page is left under it");
        }
    }

    fn discard(&self, pages: &[GuestPage]) -> Result<(), StoreError> {
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j] == pages[j - 1] + 1 {
                j += 1;
            }
            self.client
                .discard(self.ns, pages[i], j - i)
                .map_err(map_err)?;
            i = j;
        }
        Ok(())
    }
}
