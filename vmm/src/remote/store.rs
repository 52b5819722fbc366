//! The engine's page store over the memserver client: [`MemserverStore`] implements
//! `farvm_ept::store::RemoteStore` with `farvm_memserver::client::Client`.
//!
//! Hot path, per submitted batch: requests are grouped by (priority, slab) into at most
//! [`PAGES_PER_SLOT`] pages per memserver request (a contiguous group goes as a run, anything
//! else as a scatter list), each group takes a preallocated slot (its `IoBuf` and the engine's
//! destination buffers) from a lock-free free list, and is submitted. Nothing is allocated per
//! request and no global lock is taken.
//!
//! Completions are received by one thread, `ept-store-rx`, which copies read data from the
//! slot's `IoBuf` into the engine's page buffers (the memfd alias) and hands the batch to the
//! engine's completion sink on the same thread, so a demand read costs one thread wake-up at
//! most. Requests are submitted with `submit_polled` and received with `wait_completion`, so
//! that thread reads the response off the socket itself (a hand-off from the client's own
//! receiver thread would cost another wake-up, 5–50 µs on this host).
//!
//! `wait_completion` sleeps on the channel (1 ms slices) while nothing is in flight, and a
//! `submit_polled` does not wake it: so the receiver announces when it goes idle, and the next
//! submitter *nudges* it with a sentinel completion (one channel send, one preallocated buffer),
//! after which it polls the connection the new request is on.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use crossbeam_queue::ArrayQueue;
use farvm_ept::store::{
    Completion, CompletionSink, GuestPage, Op, PageBuf, Priority, ReadReq, RemoteStore, Status,
    StoreError, WriteReq,
};
use farvm_memserver::client::{self, Client, ClientError, IoBuf, OpKind};

/// Most pages grouped into one memserver request.
pub const PAGES_PER_SLOT: usize = 32;
/// `user_data` of the sentinel completion that stops the receiver thread.
const STOP: u64 = u64::MAX;
/// `user_data` of the sentinel completion that wakes an idle receiver thread.
const NUDGE: u64 = u64::MAX - 1;
/// How long a submitter waits for a free slot before answering `Busy` (the engine then treats
/// the batch as failed: demand reads are retried, prefetches forgotten).
const SLOT_WAIT: Duration = Duration::from_millis(500);

thread_local! {
    /// Set on the receiver thread: it must never wait for a slot (only it frees them).
    static ON_RX_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// Tunables of the adapter.
#[derive(Clone, Copy, Debug)]
pub struct StoreConfig {
    /// Memserver namespace of this VM.
    pub namespace: u64,
    /// Requests that may be outstanding at once (each up to [`PAGES_PER_SLOT`] pages).
    pub slots: usize,
}

/// Request bookkeeping of one slot: what the engine asked for, in `IoBuf` order.
struct SlotMeta {
    op: Op,
    n: usize,
    pages: [GuestPage; PAGES_PER_SLOT],
    bufs: [Option<PageBuf>; PAGES_PER_SLOT],
}

struct Slot {
    /// The slot's `IoBuf` while it is not on the wire.
    io: Mutex<Option<IoBuf>>,
    meta: Mutex<SlotMeta>,
}

/// Counters of the adapter itself (the engine counts pages; these count wire requests).
#[derive(Debug, Default)]
pub struct StoreCounters {
    pub requests: AtomicU64,
    pub slot_waits: AtomicU64,
    pub busy: AtomicU64,
    pub failed_requests: AtomicU64,
}

struct Shared {
    client: Arc<Client>,
    ns: u64,
    slots: Box<[Slot]>,
    free: ArrayQueue<u32>,
    done_tx: Sender<client::Completion>,
    sink: OnceLock<Arc<dyn CompletionSink>>,
    stop: AtomicBool,
    counters: StoreCounters,
    /// Requests submitted and not yet received.
    inflight: AtomicU64,
    /// The receiver saw nothing in flight and may be sleeping on the channel.
    idle: AtomicBool,
    /// The one nudge buffer (None while a nudge is in the channel).
    nudge: Mutex<Option<IoBuf>>,
    /// One-page buffers of synchronous demand reads (`read_now`), lock-free; a caller finding
    /// it empty (more concurrent demand readers than buffers) allocates one.
    demand_bufs: ArrayQueue<IoBuf>,
}

/// Buffers kept for synchronous demand reads (one per concurrent fault-handler thread).
const DEMAND_BUFS: usize = 4;

/// `RemoteStore` over a memserver client (see the module docs).
pub struct MemserverStore {
    shared: Arc<Shared>,
    rx_thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for MemserverStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemserverStore")
            .field("namespace", &self.shared.ns)
            .field("slots", &self.shared.slots.len())
            .finish()
    }
}

impl MemserverStore {
    /// Wraps `client`; allocates every slot now (`slots * PAGES_PER_SLOT` pages of buffers).
    pub fn new(client: Arc<Client>, cfg: StoreConfig) -> Result<Arc<Self>, StoreError> {
        let n = cfg.slots.clamp(1, 4096);
        let (done_tx, done_rx) = crossbeam_channel::bounded(n + 2);
        let free = ArrayQueue::new(n);
        let slots: Box<[Slot]> = (0..n)
            .map(|_| Slot {
                io: Mutex::new(Some(IoBuf::new(PAGES_PER_SLOT))),
                meta: Mutex::new(SlotMeta {
                    op: Op::Read,
                    n: 0,
                    pages: [0; PAGES_PER_SLOT],
                    bufs: [None; PAGES_PER_SLOT],
                }),
            })
            .collect();
        for i in 0..n as u32 {
            let _ = free.push(i);
        }
        let shared = Arc::new(Shared {
            client,
            ns: cfg.namespace,
            slots,
            free,
            done_tx,
            sink: OnceLock::new(),
            stop: AtomicBool::new(false),
            counters: StoreCounters::default(),
            inflight: AtomicU64::new(0),
            idle: AtomicBool::new(false),
            nudge: Mutex::new(Some(IoBuf::new(1))),
            demand_bufs: {
                let q = ArrayQueue::new(DEMAND_BUFS);
                for _ in 0..DEMAND_BUFS {
                    let _ = q.push(IoBuf::new(1));
                }
                q
            },
        });
        let s = shared.clone();
        let h = std::thread::Builder::new()
            .name("ept-store-rx".into())
            .spawn(move || receive_loop(s, done_rx))
            .map_err(|e| StoreError::Io(e.raw_os_error().unwrap_or(libc::EAGAIN)))?;
        Ok(Arc::new(Self {
            shared,
            rx_thread: Mutex::new(Some(h)),
        }))
    }

    /// The adapter's own counters.
    pub fn counters(&self) -> &StoreCounters {
        &self.shared.counters
    }

    /// The client (replication health, stats).
    pub fn client(&self) -> &Arc<Client> {
        &self.shared.client
    }

    /// Stops the receiver thread (outstanding requests are not waited for: call after the
    /// engine shut down, which waits for them).
    pub fn stop(&self) {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        let _ = self.shared.done_tx.send(client::Completion {
            user_data: STOP,
            io: IoBuf::new(1),
            result: Ok(0),
        });
        // The last reference may be dropped on the receiver thread itself (inside a
        // completion): it then exits on the sentinel and must not join itself.
        if ON_RX_THREAD.with(|f| f.get()) {
            return;
        }
        if let Some(h) = self.rx_thread.lock().ok().and_then(|mut g| g.take()) {
            let _ = h.join();
        }
    }

    /// Takes a free slot, waiting (not on the receiver thread) up to [`SLOT_WAIT`].
    fn take_slot(&self) -> Option<u32> {
        if let Some(i) = self.shared.free.pop() {
            return Some(i);
        }
        if ON_RX_THREAD.with(|f| f.get()) {
            return None;
        }
        self.shared
            .counters
            .slot_waits
            .fetch_add(1, Ordering::Relaxed);
        let deadline = Instant::now() + SLOT_WAIT;
        let mut spins = 0u32;
        while Instant::now() < deadline {
            if let Some(i) = self.shared.free.pop() {
                return Some(i);
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

    /// Submits one group (`pages[i]` with `bufs[i]`). On error the slot is freed again.
    fn submit_group(
        &self,
        op: Op,
        prio: Priority,
        pages: &[GuestPage],
        bufs: &[PageBuf],
    ) -> Result<(), StoreError> {
        let sh = &self.shared;
        let Some(slot_ix) = self.take_slot() else {
            sh.counters.busy.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Busy);
        };
        let slot = &sh.slots[slot_ix as usize];
        let mut io = match slot.io.lock().ok().and_then(|mut g| g.take()) {
            Some(io) => io,
            None => {
                // Cannot happen: a free slot always holds its buffer. Recover with a new one
                // rather than lose the slot.
                tracing::error!("memserver store slot {slot_ix} had no buffer");
                IoBuf::new(PAGES_PER_SLOT)
            }
        };
        let contiguous = pages.windows(2).all(|w| w[1] == w[0] + 1);
        let set = if contiguous {
            io.set_run(pages[0], pages.len())
        } else {
            io.set_scatter(pages)
        };
        if let Err(e) = set {
            self.release(slot_ix, io);
            return Err(map_err(e));
        }
        if op == Op::Write {
            for (i, b) in bufs.iter().enumerate() {
                // SAFETY: the engine keeps a write's source page valid and unmodified until
                // its completion is delivered (store contract), and we are before that.
                io.page_mut(i).copy_from_slice(unsafe { b.as_slice() });
            }
        }
        if let Ok(mut m) = slot.meta.lock() {
            m.op = op;
            m.n = pages.len();
            m.pages[..pages.len()].copy_from_slice(pages);
            for (d, b) in m.bufs.iter_mut().zip(bufs) {
                *d = Some(*b);
            }
        }
        let kind = match op {
            Op::Read => OpKind::Read,
            Op::Write => OpKind::Write,
        };
        let prio = match prio {
            Priority::Demand => client::Priority::Demand,
            Priority::Prefetch => client::Priority::Prefetch,
        };
        sh.counters.requests.fetch_add(1, Ordering::Relaxed);
        sh.inflight.fetch_add(1, Ordering::SeqCst);
        match sh
            .client
            .submit_polled(kind, sh.ns, prio, io, slot_ix as u64, &sh.done_tx)
        {
            Ok(()) => {
                if sh.idle.swap(false, Ordering::SeqCst) {
                    nudge(sh);
                }
                Ok(())
            }
            Err((e, io)) => {
                sh.inflight.fetch_sub(1, Ordering::SeqCst);
                self.release(slot_ix, io);
                Err(map_err(e))
            }
        }
    }

    fn release(&self, slot_ix: u32, io: IoBuf) {
        release_slot(&self.shared, slot_ix, io);
    }

    /// Groups `items` (page, buffer, priority) by priority and slab, in order, and submits
    /// each group. Groups that fail after an earlier one was accepted complete as failed
    /// through the sink; if the first fails, nothing was accepted and its error is returned.
    fn submit_all(
        &self,
        op: Op,
        n: usize,
        item: impl Fn(usize) -> (GuestPage, PageBuf, Priority),
    ) -> Result<(), StoreError> {
        if n == 0 {
            return Ok(());
        }
        let slab = self.shared.client.slab_pages().max(1);
        let mut pages = [0u64; PAGES_PER_SLOT];
        let mut bufs = [None::<PageBuf>; PAGES_PER_SLOT];
        // Requests of one priority go out before the other's: demand first.
        let mut accepted = false;
        for want in [Priority::Demand, Priority::Prefetch] {
            let mut k = 0usize;
            let mut group_prio = want;
            let mut group_slab = u64::MAX;
            let mut flush = |k: &mut usize,
                             pages: &[u64; PAGES_PER_SLOT],
                             bufs: &[Option<PageBuf>; PAGES_PER_SLOT],
                             prio: Priority|
             -> Result<(), StoreError> {
                if *k == 0 {
                    return Ok(());
                }
                let mut b = [bufs[0].expect("group has a buffer"); PAGES_PER_SLOT];
                for (d, s) in b.iter_mut().zip(bufs[..*k].iter()) {
                    *d = s.expect("group buffer");
                }
                let r = self.submit_group(op, prio, &pages[..*k], &b[..*k]);
                match r {
                    Ok(()) => accepted = true,
                    Err(e) if !accepted => {
                        *k = 0;
                        return Err(e);
                    }
                    Err(e) => self.fail_inline(op, &pages[..*k], e),
                }
                *k = 0;
                Ok(())
            };
            for i in 0..n {
                let (p, b, prio) = item(i);
                if prio != want {
                    continue;
                }
                let s = p / slab;
                if k == PAGES_PER_SLOT || (k > 0 && s != group_slab) {
                    flush(&mut k, &pages, &bufs, group_prio)?;
                }
                group_slab = s;
                group_prio = prio;
                pages[k] = p;
                bufs[k] = Some(b);
                k += 1;
            }
            flush(&mut k, &pages, &bufs, group_prio)?;
        }
        Ok(())
    }

    /// Delivers `Failed(e)` for pages of a group that could not be submitted.
    fn fail_inline(&self, op: Op, pages: &[GuestPage], e: StoreError) {
        self.shared
            .counters
            .failed_requests
            .fetch_add(1, Ordering::Relaxed);
        let mut out = [Completion {
            op,
            page: 0,
            status: Status::Failed(e),
        }; PAGES_PER_SLOT];
        for (o, p) in out.iter_mut().zip(pages) {
            o.page = *p;
        }
        if let Some(sink) = self.shared.sink.get() {
            sink.complete(&out[..pages.len()]);
        }
    }
}

impl Drop for MemserverStore {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Wakes the receiver thread out of its channel sleep (no allocation: one reusable buffer).
fn nudge(sh: &Shared) {
    let io = sh.nudge.lock().ok().and_then(|mut g| g.take());
    if let Some(io) = io {
        if let Err(e) = sh.done_tx.try_send(client::Completion {
            user_data: NUDGE,
            io,
            result: Ok(0),
        }) {
            // Channel full: the receiver has work anyway. Keep the buffer.
            if let Ok(mut g) = sh.nudge.lock() {
                *g = Some(e.into_inner().io);
            }
        }
    }
}

fn release_slot(sh: &Shared, slot_ix: u32, io: IoBuf) {
    if let Ok(mut g) = sh.slots[slot_ix as usize].io.lock() {
        *g = Some(io);
    }
    let _ = sh.free.push(slot_ix);
}

/// Maps a client error to the engine's error vocabulary.
pub fn map_err(e: ClientError) -> StoreError {
    match e {
        ClientError::Timeout => StoreError::Timeout,
        // Lost: reads turn it into `Status::Absent` first; writes and discards never see it.
        ClientError::Disconnected
        | ClientError::NoLiveReplica
        | ClientError::Lost
        | ClientError::Connect { .. } => StoreError::Unavailable,
        ClientError::QueueFull => StoreError::Busy,
        ClientError::Protocol(_)
        | ClientError::Version { .. }
        | ClientError::ChecksumMismatch
        | ClientError::Server(_) => StoreError::Protocol,
        ClientError::CapacityExhausted => StoreError::Io(libc::ENOSPC),
        ClientError::Denied | ClientError::Auth { .. } => StoreError::Io(libc::EACCES),
        ClientError::InvalidRequest(_) => StoreError::Io(libc::EINVAL),
    }
}

impl RemoteStore for MemserverStore {
    fn attach(&self, sink: Arc<dyn CompletionSink>) -> Result<(), StoreError> {
        self.shared.sink.set(sink).map_err(|_| StoreError::Closed)
    }

    fn read(&self, reqs: &[ReadReq]) -> Result<(), StoreError> {
        if self.shared.stop.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        self.submit_all(Op::Read, reqs.len(), |i| {
            (reqs[i].page, reqs[i].dst, reqs[i].priority)
        })
    }

    fn write(&self, reqs: &[WriteReq]) -> Result<(), StoreError> {
        if self.shared.stop.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        // Write-backs go at demand priority: the evictor frees frames a vCPU may wait for.
        self.submit_all(Op::Write, reqs.len(), |i| {
            (reqs[i].page, reqs[i].src, Priority::Demand)
        })
    }

    /// The demand read a vCPU is blocked on, sent on the client's demand lane and received
    /// on the calling thread (`Client::submit_wait`): no queueing behind prefetch responses
    /// and no hand-off to `ept-store-rx`.
    fn read_now(&self, page: GuestPage, dst: PageBuf) -> Option<Status> {
        let sh = &self.shared;
        if sh.stop.load(Ordering::Acquire) {
            return Some(Status::Failed(StoreError::Closed));
        }
        let mut io = sh.demand_bufs.pop().unwrap_or_else(|| IoBuf::new(1));
        if let Err(e) = io.set_run(page, 1) {
            let _ = sh.demand_bufs.push(io);
            return Some(Status::Failed(map_err(e)));
        }
        sh.counters.requests.fetch_add(1, Ordering::Relaxed);
        let c = sh.client.submit_wait(OpKind::Read, sh.ns, io);
        let status = match c.result {
            Err(ClientError::Lost) => Status::Absent,
            Err(e) => {
                sh.counters.failed_requests.fetch_add(1, Ordering::Relaxed);
                Status::Failed(map_err(e))
            }
            Ok(_) if c.io.is_present(0) => {
                // SAFETY: the engine hands us `dst` for this read only and does not touch it
                // until we return; both sides are 4 KiB.
                unsafe { dst.as_mut_slice() }.copy_from_slice(c.io.page(0));
                Status::Ok
            }
            Ok(_) => Status::Absent,
        };
        let _ = sh.demand_bufs.push(c.io);
        Some(status)
    }

    fn discard(&self, pages: &[GuestPage]) -> Result<(), StoreError> {
        let mut i = 0;
        while i < pages.len() {
            let mut j = i + 1;
            while j < pages.len() && pages[j] == pages[j - 1] + 1 {
                j += 1;
            }
            self.shared
                .client
                .discard(self.shared.ns, pages[i], j - i)
                .map_err(map_err)?;
            i = j;
        }
        Ok(())
    }
}

/// The receiver thread: takes each finished request, copies read data into the engine's
/// buffers, frees the slot, then delivers the completions (no allocation).
fn receive_loop(sh: Arc<Shared>, rx: Receiver<client::Completion>) {
    ON_RX_THREAD.with(|f| f.set(true));
    let mut out = [Completion {
        op: Op::Read,
        page: 0,
        status: Status::Ok,
    }; PAGES_PER_SLOT];
    loop {
        if sh.inflight.load(Ordering::SeqCst) == 0 {
            sh.idle.store(true, Ordering::SeqCst);
            // A submit between the load and the store would not have seen `idle`: re-check.
            if sh.inflight.load(Ordering::SeqCst) != 0 {
                sh.idle.store(false, Ordering::SeqCst);
            }
        }
        let c = sh.client.wait_completion(&rx);
        if c.user_data == STOP {
            return;
        }
        if c.user_data == NUDGE {
            if let Ok(mut g) = sh.nudge.lock() {
                *g = Some(c.io);
            }
            continue;
        }
        sh.inflight.fetch_sub(1, Ordering::SeqCst);
        let Some(slot) = sh.slots.get(c.user_data as usize) else {
            tracing::error!("memserver completion for unknown slot {}", c.user_data);
            continue;
        };
        let n = {
            let Ok(meta) = slot.meta.lock() else {
                continue;
            };
            let n = meta.n;
            for (i, o) in out.iter_mut().enumerate().take(n) {
                // `Lost`: the pages delivered are good, the others are gone for good
                // (Absent to the engine, which reads only pages it wrote back).
                let status = match (&c.result, meta.op) {
                    (Ok(_) | Err(ClientError::Lost), Op::Read) if c.io.is_present(i) => {
                        if let Some(b) = meta.bufs[i] {
                            // SAFETY: the engine owns `b` and does not touch it until this
                            // request's completion is delivered (below); `c.io.page(i)` is
                            // 4 KiB, as is the destination.
                            unsafe { b.as_mut_slice() }.copy_from_slice(c.io.page(i));
                        }
                        Status::Ok
                    }
                    (Ok(_) | Err(ClientError::Lost), Op::Read) => Status::Absent,
                    (Err(e), _) => Status::Failed(map_err(*e)),
                    (Ok(_), Op::Write) => Status::Ok,
                };
                *o = Completion {
                    op: meta.op,
                    page: meta.pages[i],
                    status,
                };
            }
            n
        };
        if c.result.is_err() {
            sh.counters.failed_requests.fetch_add(1, Ordering::Relaxed);
        }
        release_slot(&sh, c.user_data as u32, c.io);
        if let Some(sink) = sh.sink.get() {
            sink.complete(&out[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farvm_ept::PAGE_SIZE;
    use farvm_memserver::client::ClientConfig;
    use farvm_memserver::server::{Server, ServerConfig};
    use std::sync::Mutex as StdMutex;

    struct Collect(StdMutex<Vec<Completion>>);
    impl CompletionSink for Collect {
        fn complete(&self, batch: &[Completion]) {
            self.0.lock().unwrap().extend_from_slice(batch);
        }
    }

    #[repr(C, align(4096))]
    struct Pages([[u8; PAGE_SIZE]; 80]);

    fn wait_for(sink: &Collect, n: usize) -> Vec<Completion> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            {
                let g = sink.0.lock().unwrap();
                if g.len() >= n {
                    return g.clone();
                }
            }
            assert!(Instant::now() < deadline, "completions did not arrive");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn writes_then_reads_scatter_and_runs_with_absent_pages() {
        let server = Server::start(ServerConfig::loopback(64 << 20)).unwrap();
        let client = Arc::new(Client::connect(ClientConfig::new(vec![server.addr()])).unwrap());
        let store = MemserverStore::new(
            client,
            StoreConfig {
                namespace: 7,
                slots: 4,
            },
        )
        .unwrap();
        let sink = Arc::new(Collect(StdMutex::new(Vec::new())));
        store.attach(sink.clone()).unwrap();
        let mut src = Box::new(Pages([[0; PAGE_SIZE]; 80]));
        for (i, p) in src.0.iter_mut().enumerate() {
            p.fill(i as u8 + 1);
        }
        // 40 contiguous pages (two groups) + 20 scattered ones.
        let pages: Vec<u64> = (100..140).chain((0..20).map(|i| 1000 + 3 * i)).collect();
        let writes: Vec<WriteReq> = pages
            .iter()
            .enumerate()
            .map(|(i, &p)| WriteReq {
                page: p,
                // SAFETY: `src` outlives the requests (we wait for every completion).
                src: unsafe { PageBuf::new(src.0[i].as_mut_ptr()) }.unwrap(),
            })
            .collect();
        store.write(&writes).unwrap();
        let done = wait_for(&sink, pages.len());
        assert!(done
            .iter()
            .all(|c| c.op == Op::Write && c.status == Status::Ok));
        sink.0.lock().unwrap().clear();
        let mut dst = Box::new(Pages([[0; PAGE_SIZE]; 80]));
        let mut reads: Vec<ReadReq> = pages
            .iter()
            .enumerate()
            .map(|(i, &p)| ReadReq {
                page: p,
                priority: if i % 2 == 0 {
                    Priority::Demand
                } else {
                    Priority::Prefetch
                },
                // SAFETY: `dst` outlives the requests.
                dst: unsafe { PageBuf::new(dst.0[i].as_mut_ptr()) }.unwrap(),
            })
            .collect();
        reads.push(ReadReq {
            page: 5000,
            priority: Priority::Demand,
            // SAFETY: as above.
            dst: unsafe { PageBuf::new(dst.0[79].as_mut_ptr()) }.unwrap(),
        });
        store.read(&reads).unwrap();
        let done = wait_for(&sink, reads.len());
        for c in &done {
            if c.page == 5000 {
                assert_eq!(c.status, Status::Absent);
            } else {
                assert_eq!(c.status, Status::Ok, "page {}", c.page);
            }
        }
        for i in 0..pages.len() {
            assert!(dst.0[i].iter().all(|&b| b == i as u8 + 1), "page {i}");
        }
        // Synchronous demand reads (the fault handler's path) see the same data, and their
        // completion comes back as the return value, not through the sink.
        sink.0.lock().unwrap().clear();
        let mut one = Box::new(Pages([[0; PAGE_SIZE]; 80]));
        for (i, &p) in pages.iter().enumerate().step_by(7) {
            // SAFETY: `one` outlives the call, which returns only once the data has landed.
            let b = unsafe { PageBuf::new(one.0[0].as_mut_ptr()) }.unwrap();
            assert_eq!(store.read_now(p, b), Some(Status::Ok), "page {p}");
            assert!(one.0[0].iter().all(|&x| x == i as u8 + 1), "page {p}");
        }
        // SAFETY: as above.
        let b = unsafe { PageBuf::new(one.0[1].as_mut_ptr()) }.unwrap();
        assert_eq!(store.read_now(5000, b), Some(Status::Absent));
        assert!(sink.0.lock().unwrap().is_empty());
        store.discard(&[100, 101, 102, 1000]).unwrap();
        store.stop();
        // SAFETY: as above.
        let b = unsafe { PageBuf::new(one.0[2].as_mut_ptr()) }.unwrap();
        assert_eq!(
            store.read_now(120, b),
            Some(Status::Failed(StoreError::Closed)),
            "a stopped store refuses"
        );
    }

    #[test]
    fn a_dead_server_fails_requests_cleanly() {
        let server = Server::start(ServerConfig::loopback(16 << 20)).unwrap();
        let mut cfg = ClientConfig::new(vec![server.addr()]);
        cfg.timeout = Duration::from_millis(300);
        let client = Arc::new(Client::connect(cfg).unwrap());
        let store = MemserverStore::new(
            client,
            StoreConfig {
                namespace: 1,
                slots: 2,
            },
        )
        .unwrap();
        let sink = Arc::new(Collect(StdMutex::new(Vec::new())));
        store.attach(sink.clone()).unwrap();
        server.shutdown();
        let mut page = Box::new(Pages([[7; PAGE_SIZE]; 80]));
        let w = [WriteReq {
            page: 3,
            // SAFETY: `page` outlives the request.
            src: unsafe { PageBuf::new(page.0[0].as_mut_ptr()) }.unwrap(),
        }];
        match store.write(&w) {
            Err(_) => {}
            Ok(()) => {
                let done = wait_for(&sink, 1);
                assert!(matches!(done[0].status, Status::Failed(_)));
            }
        }
        store.stop();
    }
}
