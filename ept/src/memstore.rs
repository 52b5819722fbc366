//! An in-process [`RemoteStore`] for tests and benchmarks: pages in sharded hash maps, optional
//! injected latency per priority (served by one worker thread in due order, so demand reads with
//! a shorter latency overtake queued prefetches) and injected failures, including a second
//! copy of a page that answers its reads with stale content until the engine rejects it (a
//! replica that missed a write).
//!
//! With zero latency, requests complete inline inside `read`/`write` (the engine allows that).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::store::{
    Completion, CompletionSink, GuestPage, Op, Priority, ReadReq, RemoteStore, Replica, Status,
    StoreError, WriteReq,
};
use crate::PAGE_SIZE;

const SHARDS: usize = 16;
/// The replica index of a stale second copy ([`MemStore::stale_copy`]); the stored copy is 0.
const STALE_COPY: Replica = Replica(1);

#[derive(Clone, Copy, Debug, Default)]
/// Injected latencies of a [`MemStore`] (zero: requests complete inline).
pub struct MemStoreConfig {
    /// Delay of a demand read.
    pub demand_latency: Duration,
    /// Delay of a prefetch read.
    pub prefetch_latency: Duration,
    /// Delay of a write-back.
    pub write_latency: Duration,
}

/// Request counters (what the tests assert on).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemStoreCounts {
    /// Demand reads served.
    pub reads_demand: u64,
    /// Prefetch reads served.
    pub reads_prefetch: u64,
    /// Writes served.
    pub writes: u64,
    /// Pages discarded.
    pub discards: u64,
    /// Reads of pages the store never held.
    pub absent: u64,
    /// Requests failed on purpose (injected failures).
    pub failed: u64,
}

#[derive(Clone, Copy)]
enum Req {
    Read(ReadReq),
    Write(WriteReq),
}

struct Due {
    at: Instant,
    seq: u64,
    req: Req,
}
impl PartialEq for Due {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Due {}
impl PartialOrd for Due {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Due {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct Shared {
    cfg: MemStoreConfig,
    shards: [Mutex<HashMap<GuestPage, Box<[u8; PAGE_SIZE]>>>; SHARDS],
    /// Pages whose reads a stale second copy answers ([`STALE_COPY`]) until rejected.
    stale: Mutex<HashMap<GuestPage, Box<[u8; PAGE_SIZE]>>>,
    /// Stale copies the engine rejected.
    rejected: AtomicU64,
    sink: OnceLock<Arc<dyn CompletionSink>>,
    queue: Mutex<BinaryHeap<Reverse<Due>>>,
    cv: Condvar,
    seq: AtomicU64,
    stop: AtomicBool,
    fail_reads: AtomicU64,
    fail_writes: AtomicU64,
    outage: AtomicBool,
    reads_demand: AtomicU64,
    reads_prefetch: AtomicU64,
    writes: AtomicU64,
    discards: AtomicU64,
    absent: AtomicU64,
    failed: AtomicU64,
}

/// The in-process page store (module docs).
pub struct MemStore {
    shared: Arc<Shared>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl MemStore {
    /// An empty store with `cfg`'s latencies (its worker thread starts only if one is non-zero).
    pub fn new(cfg: MemStoreConfig) -> Arc<Self> {
        Arc::new(Self {
            shared: Arc::new(Shared {
                cfg,
                shards: std::array::from_fn(|_| Mutex::new(HashMap::new())),
                stale: Mutex::new(HashMap::new()),
                rejected: AtomicU64::new(0),
                sink: OnceLock::new(),
                queue: Mutex::new(BinaryHeap::with_capacity(4096)),
                cv: Condvar::new(),
                seq: AtomicU64::new(0),
                stop: AtomicBool::new(false),
                fail_reads: AtomicU64::new(0),
                fail_writes: AtomicU64::new(0),
                outage: AtomicBool::new(false),
                reads_demand: AtomicU64::new(0),
                reads_prefetch: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                discards: AtomicU64::new(0),
                absent: AtomicU64::new(0),
                failed: AtomicU64::new(0),
            }),
            worker: Mutex::new(None),
        })
    }

    /// The next `n` reads complete with `Failed(Unavailable)`.
    pub fn fail_next_reads(&self, n: u64) {
        self.shared.fail_reads.store(n, Ordering::SeqCst);
    }

    /// The next `n` writes complete with `Failed(Unavailable)`.
    pub fn fail_next_writes(&self, n: u64) {
        self.shared.fail_writes.store(n, Ordering::SeqCst);
    }

    /// While set, every submission is refused with `Unavailable`.
    pub fn set_outage(&self, down: bool) {
        self.shared.outage.store(down, Ordering::SeqCst);
    }

    /// The request counters so far.
    pub fn counts(&self) -> MemStoreCounts {
        let s = &self.shared;
        MemStoreCounts {
            reads_demand: s.reads_demand.load(Ordering::SeqCst),
            reads_prefetch: s.reads_prefetch.load(Ordering::SeqCst),
            writes: s.writes.load(Ordering::SeqCst),
            discards: s.discards.load(Ordering::SeqCst),
            absent: s.absent.load(Ordering::SeqCst),
            failed: s.failed.load(Ordering::SeqCst),
        }
    }

    /// A copy of the stored page, if any.
    pub fn get(&self, page: GuestPage) -> Option<Vec<u8>> {
        self.shared
            .shard(page)
            .lock()
            .ok()?
            .get(&page)
            .map(|b| b.to_vec())
    }

    /// Drops the stored copy of `page`, as a memory server that restarted empty would: its next
    /// read completes `Absent`. Returns whether a copy was stored.
    pub fn lose(&self, page: GuestPage) -> bool {
        self.shared
            .shard(page)
            .lock()
            .map(|mut m| m.remove(&page).is_some())
            .unwrap_or(false)
    }

    /// Replaces the stored copy of `page` with `data`, as a memory server holding an older or
    /// damaged copy would (the wire checksums still pass: the server checksums what it holds).
    /// Returns whether a copy was stored.
    pub fn replace(&self, page: GuestPage, data: &[u8]) -> bool {
        self.shared
            .shard(page)
            .lock()
            .map(|mut m| match m.get_mut(&page) {
                Some(b) if b.len() == data.len() => {
                    b.copy_from_slice(data);
                    true
                }
                _ => false,
            })
            .unwrap_or(false)
    }

    /// Gives `page` a second copy holding `data` that answers its reads first (as the first
    /// replica a client reads from, one that missed a write), until the engine rejects it
    /// ([`RemoteStore::reject`]); the stored copy answers after that.
    pub fn stale_copy(&self, page: GuestPage, data: &[u8]) -> bool {
        let Ok(b) = <Box<[u8; PAGE_SIZE]>>::try_from(data.to_vec().into_boxed_slice()) else {
            return false;
        };
        self.shared
            .stale
            .lock()
            .map(|mut m| m.insert(page, b).is_none())
            .unwrap_or(false)
    }

    /// Stale copies the engine rejected so far.
    pub fn rejected(&self) -> u64 {
        self.shared.rejected.load(Ordering::SeqCst)
    }

    /// Number of pages stored.
    pub fn len(&self) -> usize {
        self.shared
            .shards
            .iter()
            .map(|s| s.lock().map(|m| m.len()).unwrap_or(0))
            .sum()
    }

    /// Whether no page is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Shared {
    fn shard(&self, page: GuestPage) -> &Mutex<HashMap<GuestPage, Box<[u8; PAGE_SIZE]>>> {
        &self.shards[(page as usize) % SHARDS]
    }

    fn take_failure(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Performs a request now and returns its completion.
    fn serve(&self, req: Req) -> Completion {
        match req {
            Req::Read(r) => {
                let mut replica = Replica(0);
                let status = if Self::take_failure(&self.fail_reads) {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    Status::Failed(StoreError::Unavailable)
                } else if let Some(data) =
                    self.stale.lock().ok().and_then(|m| m.get(&r.page).cloned())
                {
                    // SAFETY: the engine owns `dst` for this outstanding request.
                    unsafe { r.dst.as_mut_slice() }.copy_from_slice(&data[..]);
                    replica = STALE_COPY;
                    Status::Ok
                } else {
                    match self.shard(r.page).lock() {
                        Ok(m) => match m.get(&r.page) {
                            Some(data) => {
                                // SAFETY: the engine owns `dst` for this outstanding request.
                                unsafe { r.dst.as_mut_slice() }.copy_from_slice(&data[..]);
                                Status::Ok
                            }
                            None => {
                                self.absent.fetch_add(1, Ordering::Relaxed);
                                Status::Absent
                            }
                        },
                        Err(_) => Status::Failed(StoreError::Io(libc::EIO)),
                    }
                };
                Completion {
                    op: Op::Read,
                    page: r.page,
                    status,
                    replica,
                }
            }
            Req::Write(w) => {
                let status = if Self::take_failure(&self.fail_writes) {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    Status::Failed(StoreError::Unavailable)
                } else {
                    let mut page = Box::new([0u8; PAGE_SIZE]);
                    // SAFETY: the engine owns `src` for this outstanding request.
                    page.copy_from_slice(unsafe { w.src.as_slice() });
                    match self.shard(w.page).lock() {
                        Ok(mut m) => {
                            m.insert(w.page, page);
                            Status::Ok
                        }
                        Err(_) => Status::Failed(StoreError::Io(libc::EIO)),
                    }
                };
                Completion {
                    op: Op::Write,
                    page: w.page,
                    status,
                    replica: Replica::NONE,
                }
            }
        }
    }

    fn latency(&self, req: &Req) -> Duration {
        match req {
            Req::Read(r) if r.priority == Priority::Demand => self.cfg.demand_latency,
            Req::Read(_) => self.cfg.prefetch_latency,
            Req::Write(_) => self.cfg.write_latency,
        }
    }

    fn submit(&self, reqs: impl Iterator<Item = Req>) -> Result<(), StoreError> {
        if self.outage.load(Ordering::SeqCst) {
            return Err(StoreError::Unavailable);
        }
        let sink = self.sink.get().ok_or(StoreError::Closed)?;
        let now = Instant::now();
        let mut queued = false;
        let mut inline = [Completion {
            op: Op::Read,
            page: 0,
            status: Status::Ok,
            replica: Replica::NONE,
        }; 64];
        let mut n = 0;
        for req in reqs {
            match req {
                Req::Read(r) if r.priority == Priority::Demand => {
                    self.reads_demand.fetch_add(1, Ordering::Relaxed)
                }
                Req::Read(_) => self.reads_prefetch.fetch_add(1, Ordering::Relaxed),
                Req::Write(_) => self.writes.fetch_add(1, Ordering::Relaxed),
            };
            let lat = self.latency(&req);
            if lat.is_zero() {
                inline[n] = self.serve(req);
                n += 1;
                if n == inline.len() {
                    sink.complete(&inline[..n]);
                    n = 0;
                }
            } else {
                let due = Due {
                    at: now + lat,
                    seq: self.seq.fetch_add(1, Ordering::Relaxed),
                    req,
                };
                self.queue
                    .lock()
                    .map_err(|_| StoreError::Closed)?
                    .push(Reverse(due));
                queued = true;
            }
        }
        if n > 0 {
            sink.complete(&inline[..n]);
        }
        if queued {
            self.cv.notify_one();
        }
        Ok(())
    }

    fn worker(self: Arc<Self>) {
        let Some(sink) = self.sink.get().cloned() else {
            return;
        };
        let Ok(mut q) = self.queue.lock() else {
            return;
        };
        while !self.stop.load(Ordering::SeqCst) {
            let now = Instant::now();
            match q.peek() {
                Some(Reverse(d)) if d.at <= now => {
                    let Some(Reverse(d)) = q.pop() else { continue };
                    drop(q);
                    let c = self.serve(d.req);
                    sink.complete(&[c]);
                    q = match self.queue.lock() {
                        Ok(q) => q,
                        Err(_) => return,
                    };
                }
                Some(Reverse(d)) => {
                    let wait = d.at - now;
                    if wait < Duration::from_micros(100) {
                        // Sleeping overshoots by ~60 µs; spin briefly for short latencies.
                        drop(q);
                        std::thread::yield_now();
                        q = match self.queue.lock() {
                            Ok(q) => q,
                            Err(_) => return,
                        };
                    } else {
                        q = match self.cv.wait_timeout(q, wait) {
                            Ok((q, _)) => q,
                            Err(_) => return,
                        };
                    }
                }
                None => {
                    q = match self.cv.wait_timeout(q, Duration::from_millis(50)) {
                        Ok((q, _)) => q,
                        Err(_) => return,
                    };
                }
            }
        }
    }
}

impl RemoteStore for MemStore {
    fn attach(&self, sink: Arc<dyn CompletionSink>) -> Result<(), StoreError> {
        self.shared
            .sink
            .set(sink)
            .map_err(|_| StoreError::Protocol)?;
        let s = self.shared.clone();
        let h = std::thread::Builder::new()
            .name("memstore".into())
            .spawn(move || s.worker())
            .map_err(|e| StoreError::Io(e.raw_os_error().unwrap_or(libc::EAGAIN)))?;
        if let Ok(mut w) = self.worker.lock() {
            *w = Some(h);
        }
        Ok(())
    }

    fn read(&self, reqs: &[ReadReq]) -> Result<(), StoreError> {
        self.shared.submit(reqs.iter().map(|r| Req::Read(*r)))
    }

    fn write(&self, reqs: &[WriteReq]) -> Result<(), StoreError> {
        self.shared.submit(reqs.iter().map(|w| Req::Write(*w)))
    }

    fn reject(&self, page: GuestPage, replica: Replica) -> bool {
        if replica != STALE_COPY {
            return false; // the stored copy is the last one
        }
        let s = &self.shared;
        if s.stale.lock().is_ok_and(|mut m| m.remove(&page).is_some()) {
            s.rejected.fetch_add(1, Ordering::SeqCst);
        }
        true
    }

    fn discard(&self, pages: &[GuestPage]) -> Result<(), StoreError> {
        for &p in pages {
            if let Ok(mut m) = self.shared.shard(p).lock() {
                m.remove(&p);
            }
        }
        self.shared
            .discards
            .fetch_add(pages.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

impl Drop for MemStore {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.cv.notify_all();
        if let Some(h) = self.worker.lock().ok().and_then(|mut w| w.take()) {
            let _ = h.join();
        }
    }
}
