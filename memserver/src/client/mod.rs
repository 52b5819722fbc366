//! The client the VMM uses: a pool of pipelined connections to several servers, slab
//! placement by power-of-two choices on free capacity, replication factor R with read
//! fail-over and re-replication after a server dies.
//!
//! # Hot-path API
//! [`Client::submit`] takes a caller-owned [`IoBuf`] (allocated once), a [`Priority`] and a
//! completion channel; the [`Completion`] gives the buffer back. Nothing is heap-allocated per
//! request and no global lock is taken: tickets come from a lock-free queue, placement is
//! sharded, each connection and each ticket has its own lock.
//!
//! # Absent pages
//! A read of a page that was never written (or was discarded) succeeds with the page marked
//! absent: [`IoBuf::is_present`] is false and its bytes are unspecified. The VMM zero-fills it.
//!
//! # Namespaces
//! A namespace is the VM id, a `u64`; [`namespace_for_name`] hashes a name to one.
//!
//! # Durability
//! A write completes when every live replica of its slab acknowledged it. If a replica dies
//! the slab is re-replicated onto another live server (when one exists); until then, or when
//! fewer than R servers are alive, the slab runs degraded (counted in [`ClientStats`]).
//! The client keeps the placement map in memory: it is per VM and lives as long as the VMM.
//!
//! # Servers that come back
//! A server is taken out of service on a timeout or a lost connection, which may be a
//! transient fault (an overloaded host, a network blip). The last live replica of a slab is
//! therefore never dropped from the slab's placement: the slab is *suspended* (its requests
//! fail with [`ClientError::NoLiveReplica`], the caller retries) until that server answers
//! again. The maintenance thread reconnects to servers out of service every second; one that
//! answers with the same instance id ([`StatInfo::instance`]) is put back in service and
//! degraded slabs are re-replicated onto it; one that restarted (another id) lost its pages,
//! so it is removed from every placement first. A slab left with no replica is lost: its reads
//! fail with [`ClientError::Lost`] until a write places it afresh.

mod conn;
mod error;
mod iobuf;
mod ticket;

pub use error::ClientError;
pub use iobuf::IoBuf;
pub use ticket::{OpKind, MAX_REPLICAS};

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use rustc_hash::{FxHashMap, FxHashSet};

use crate::protocol::auth::Secret;
use crate::protocol::{StatInfo, MAX_PAGES_PER_FRAME, PAGE_SIZE};
use conn::{Connection, Sink};
use ticket::{InternalDone, Reply, Ticket, Tickets};

mod recovery;
mod rejoin;

/// Request priority on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// A vCPU is waiting: goes before any queued prefetch.
    Demand,
    /// Speculative: may use only part of the window and waits behind demand reads.
    Prefetch,
}

/// A finished request.
#[derive(Debug)]
pub struct Completion {
    /// The value given to `submit`.
    pub user_data: u64,
    /// The buffer given to `submit` (for reads: filled, with presence bits).
    pub io: IoBuf,
    /// Pages present (read), written (write) or freed (discard); or the error.
    pub result: Result<u32, ClientError>,
}

/// Client settings. [`ClientConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Memory servers.
    pub servers: Vec<SocketAddr>,
    /// Tenant secret (None: the servers must run in open mode).
    pub secret: Option<Secret>,
    /// Replication factor; default 2 with ≥ 2 servers, else 1.
    pub replication: Option<usize>,
    /// Slab size in pages (default 262144 = 1 GiB).
    pub slab_pages: u64,
    /// Bulk connections per server (default 2): writes, prefetch reads, discards.
    pub conns_per_server: usize,
    /// One more connection per server that carries only demand reads (default true), so a
    /// read a vCPU is blocked on never queues behind megabytes of prefetch responses on a
    /// shared TCP stream (the server serves each connection in order, on its own thread).
    pub demand_lane: bool,
    /// One more connection per server that carries only writes (default false): a write-back
    /// an evictor waits on then never queues behind prefetch reads on a bulk connection. (The
    /// server applies each connection's requests in order; across connections there is no
    /// order, so a caller must see a write complete before it reads the page back, as the
    /// paging engine does.)
    pub write_lane: bool,
    /// Requests in flight per connection (default 32).
    pub window: usize,
    /// Part of the window only demand requests may use (default window / 4).
    pub demand_reserve: usize,
    /// Requests queued or in flight per connection (default 256).
    pub depth: usize,
    /// Per-request timeout (default 2 s). A timed-out server is taken out of service.
    pub timeout: Duration,
    /// Connect and handshake timeout (default 2 s).
    pub connect_timeout: Duration,
    /// Outstanding user requests at most (default 1024).
    pub max_requests: usize,
    /// How long blocking calls spin before sleeping (default 50 µs; 0 disables spinning).
    pub spin: Duration,
}

impl ClientConfig {
    /// Defaults for these servers.
    pub fn new(servers: Vec<SocketAddr>) -> Self {
        Self {
            servers,
            secret: None,
            replication: None,
            slab_pages: 1 << 18,
            conns_per_server: 2,
            demand_lane: true,
            write_lane: false,
            window: 32,
            demand_reserve: 8,
            depth: 256,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            max_requests: 1024,
            spin: Duration::from_micros(50),
        }
    }
}

/// Which of a server's connections a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    /// Any bulk connection (reads, discards, recovery traffic).
    Bulk,
    /// The write lane if configured ([`ClientConfig::write_lane`]), else bulk.
    Write,
    /// The demand lane if configured ([`ClientConfig::demand_lane`]), else bulk.
    Demand,
}

/// Who receives a request's response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Receive {
    /// The connection's background receiver (woken on submit).
    Background,
    /// The submitter's poller ([`Client::wait_completion`]); the background receiver is not
    /// woken.
    Polled,
    /// The submitting thread, right away ([`Client::submit_wait`]): a demand read, sent on
    /// the demand lane.
    Inline,
}

/// Counters about replication health.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Servers taken out of service.
    pub dead_servers: u64,
    /// Reads retried on another replica.
    pub read_failovers: u64,
    /// Slabs copied onto a new replica.
    pub slabs_rereplicated: u64,
    /// Slabs currently with fewer than R live replicas.
    pub degraded_slabs: u64,
    /// Slabs whose every replica is out of service right now: their requests fail until a
    /// replica comes back.
    pub suspended_slabs: u64,
    /// Servers put back in service after answering again.
    pub rejoined_servers: u64,
}

/// Hashes a VM name to a namespace id (FNV-1a 64; stable across versions).
pub fn namespace_for_name(name: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in name.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

#[derive(Clone, Copy, Debug)]
struct Placement {
    replicas: [u16; MAX_REPLICAS],
    n: u8,
    /// Bit i: replicas[i] is still being filled (not read from; receives no client writes).
    filling: u8,
    /// Every replica of this slab was lost once (`forget_server`). Placed afresh by a later
    /// write, its replicas hold only what was written since: a page absent there is lost,
    /// not never written, and reads of it fail with [`ClientError::Lost`].
    lost: bool,
}

impl Placement {
    fn servers(&self) -> &[u16] {
        &self.replicas[..self.n as usize]
    }
    fn is_filling(&self, i: usize) -> bool {
        self.filling & (1 << i) != 0
    }
}

#[derive(Default)]
struct FillState {
    dirty: FxHashSet<u64>,
    inflight: u32,
}

struct ServerState {
    addr: SocketAddr,
    /// Replaced as a whole when the server rejoins (the read lock is held only to pick and
    /// clone one connection).
    conns: RwLock<Arc<[Arc<Connection>]>>,
    /// Bumped for every set of connections; failures reported by connections of an older
    /// set are stale and do not take the server out of service again.
    generation: AtomicU32,
    /// The server's instance id from its last STAT answer (0: not known yet).
    instance: AtomicU64,
    dead: AtomicBool,
    free_pages: AtomicU64,
    rr: AtomicUsize,
}

enum Event {
    Dead(u16),
    Stop,
}

const SHARDS: usize = 64;
type SlabKey = (u64, u64);

struct Inner {
    cfg: ClientConfig,
    r: usize,
    servers: Vec<ServerState>,
    tickets: Arc<Tickets>,
    placement: Box<[RwLock<FxHashMap<SlabKey, Placement>>]>,
    /// Only for slabs being re-replicated (recovery path, not the steady-state hot path).
    fills: Mutex<FxHashMap<SlabKey, FillState>>,
    events: Sender<Event>,
    rng: AtomicU64,
    /// Set by `close`: connections going down are not server failures then.
    closing: AtomicBool,
    dead_servers: AtomicU64,
    read_failovers: AtomicU64,
    slabs_rereplicated: AtomicU64,
    rejoined_servers: AtomicU64,
}

/// The sink of one connection: the client, and the connection set it belongs to.
struct SinkRef(Weak<Inner>, u32);

impl Sink for SinkRef {
    fn complete(&self, ticket: u32, server: u16, outcome: Result<u32, ClientError>) {
        if let Some(i) = self.0.upgrade() {
            i.on_complete_from(ticket, server, Some(self.1), Some(outcome));
        }
    }
    fn connection_failed(&self, server: u16) {
        if let Some(i) = self.0.upgrade() {
            i.mark_dead_from(server, Some(self.1));
        }
    }
}

/// The client (cheap to share behind an `Arc`; all methods take `&self`).
pub struct Client {
    inner: Arc<Inner>,
    maint: Option<JoinHandle<()>>,
}

impl Client {
    /// Connects to every server (a server that cannot be reached is taken out of service;
    /// at least one must answer) and starts the maintenance thread.
    pub fn connect(cfg: ClientConfig) -> Result<Self, ClientError> {
        if cfg.servers.is_empty() || cfg.servers.len() > u16::MAX as usize {
            return Err(ClientError::InvalidRequest("need 1..=65535 servers"));
        }
        if cfg.slab_pages == 0 || !cfg.slab_pages.is_multiple_of(MAX_PAGES_PER_FRAME as u64) {
            return Err(ClientError::InvalidRequest(
                "slab_pages must be a non-zero multiple of 256",
            ));
        }
        let default_r = if cfg.servers.len() >= 2 { 2 } else { 1 };
        let r = cfg.replication.unwrap_or(default_r);
        if r == 0 || r > MAX_REPLICAS || r > cfg.servers.len() {
            return Err(ClientError::InvalidRequest(
                "replication must be within 1..=min(4, servers)",
            ));
        }
        let (tx, rx) = crossbeam_channel::unbounded();
        let inner = Arc::new(Inner {
            r,
            servers: cfg
                .servers
                .iter()
                .map(|&addr| ServerState {
                    addr,
                    conns: RwLock::new(Arc::from(Vec::new())),
                    generation: AtomicU32::new(0),
                    instance: AtomicU64::new(0),
                    dead: AtomicBool::new(false),
                    free_pages: AtomicU64::new(0),
                    rr: AtomicUsize::new(0),
                })
                .collect(),
            tickets: Arc::new(Tickets::new(cfg.max_requests)),
            placement: (0..SHARDS)
                .map(|_| RwLock::new(FxHashMap::default()))
                .collect(),
            fills: Mutex::new(FxHashMap::default()),
            events: tx,
            rng: AtomicU64::new(
                0x9e3779b97f4a7c15 ^ u64::from_le_bytes(crate::protocol::auth::random_bytes::<8>()),
            ),
            closing: AtomicBool::new(false),
            dead_servers: AtomicU64::new(0),
            read_failovers: AtomicU64::new(0),
            slabs_rereplicated: AtomicU64::new(0),
            rejoined_servers: AtomicU64::new(0),
            cfg,
        });
        let mut first_err = None;
        let mut live = 0;
        for (i, s) in inner.servers.iter().enumerate() {
            match inner.connect_server(i as u16, 0) {
                Ok(conns) => {
                    *s.conns.write().unwrap_or_else(|e| e.into_inner()) = conns;
                    live += 1;
                }
                Err(e) => {
                    tracing::warn!(server = %s.addr, "cannot connect: {e}");
                    first_err.get_or_insert(e);
                    s.dead.store(true, Ordering::Release);
                    inner.dead_servers.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Authentication and permission failures are configuration errors: report them.
        if let Some(e @ (ClientError::Auth { .. } | ClientError::Denied)) = first_err {
            inner.close_all();
            return Err(e);
        }
        if live == 0 {
            return Err(first_err.unwrap_or(ClientError::NoLiveReplica));
        }
        for i in 0..inner.servers.len() {
            inner.refresh_free(i as u16);
        }
        let weak = Arc::downgrade(&inner);
        let maint = std::thread::Builder::new()
            .name("memclient-maint".into())
            .spawn(move || maintenance(weak, rx))
            .map_err(|_| ClientError::InvalidRequest("cannot spawn maintenance thread"))?;
        Ok(Self {
            inner,
            maint: Some(maint),
        })
    }

    /// Slab size in pages.
    pub fn slab_pages(&self) -> u64 {
        self.inner.cfg.slab_pages
    }

    /// Spin time of blocking waits.
    pub fn spin(&self) -> Duration {
        self.inner.cfg.spin
    }

    /// Replication factor in use.
    pub fn replication(&self) -> usize {
        self.inner.r
    }

    /// Health counters.
    pub fn stats(&self) -> ClientStats {
        let i = &self.inner;
        let (mut degraded, mut suspended) = (0, 0);
        for sh in i.placement.iter() {
            let m = sh.read().unwrap_or_else(|e| e.into_inner());
            for p in m.values() {
                let live = p.servers().iter().filter(|&&s| !i.is_dead(s)).count();
                if live < i.r || p.filling != 0 {
                    degraded += 1;
                }
                if i.live_source(p, None).is_none() {
                    suspended += 1;
                }
            }
        }
        ClientStats {
            dead_servers: i.dead_servers.load(Ordering::Relaxed),
            read_failovers: i.read_failovers.load(Ordering::Relaxed),
            slabs_rereplicated: i.slabs_rereplicated.load(Ordering::Relaxed),
            degraded_slabs: degraded,
            suspended_slabs: suspended,
            rejoined_servers: i.rejoined_servers.load(Ordering::Relaxed),
        }
    }

    /// Submits a read, write or discard of the pages selected in `io` (all within one slab).
    /// The completion arrives on `done`; its channel must have room for every request the
    /// caller keeps outstanding (a bounded channel is preallocated; sending never allocates).
    /// On `Err` the buffer is handed back and nothing was sent.
    // Handing the buffer back by value (not boxed) is the point: no allocation per request.
    #[allow(clippy::result_large_err)]
    pub fn submit(
        &self,
        op: OpKind,
        ns: u64,
        prio: Priority,
        io: IoBuf,
        user_data: u64,
        done: &Sender<Completion>,
    ) -> Result<(), (ClientError, IoBuf)> {
        self.inner
            .submit(
                op,
                ns,
                prio,
                io,
                user_data,
                Reply::User(done.clone()),
                false,
                Receive::Background,
            )
            .map(|_| ())
    }

    /// Like [`Client::submit`], for a caller that collects its completions with
    /// [`Client::wait_completion`]: the background receiver is not woken, so the polling
    /// thread receives the responses itself (no thread hand-off). If the caller stops
    /// polling, the background receiver still delivers within a few milliseconds.
    #[allow(clippy::result_large_err)]
    pub fn submit_polled(
        &self,
        op: OpKind,
        ns: u64,
        prio: Priority,
        io: IoBuf,
        user_data: u64,
        done: &Sender<Completion>,
    ) -> Result<(), (ClientError, IoBuf)> {
        self.inner
            .submit(
                op,
                ns,
                prio,
                io,
                user_data,
                Reply::User(done.clone()),
                false,
                Receive::Polled,
            )
            .map(|_| ())
    }

    /// Submits a demand request and waits for it, receiving the response on the calling
    /// thread (the lowest-latency path: no hand-off between threads). Use it for the read a
    /// vCPU is blocked on. Allocation-free after the first call on a thread.
    pub fn submit_wait(&self, op: OpKind, ns: u64, io: IoBuf) -> Completion {
        thread_local! {
            static CHAN: (Sender<Completion>, Receiver<Completion>) = crossbeam_channel::bounded(1);
        }
        CHAN.with(|(tx, rx)| {
            let sent = self.inner.submit(
                op,
                ns,
                Priority::Demand,
                io,
                0,
                Reply::User(tx.clone()),
                false,
                Receive::Inline,
            );
            match sent {
                Err((e, io)) => Completion {
                    user_data: 0,
                    io,
                    result: Err(e),
                },
                Ok(conn) => {
                    if let Some(c) = conn.as_ref() {
                        c.receive_inline(|| !rx.is_empty(), true);
                    }
                    self.wait_completion(rx)
                }
            }
        })
    }

    /// Waits for the next completion on `rx`, receiving inline on a busy connection while
    /// waiting (see [`Client::submit_wait`]); falls back to sleeping on the channel.
    pub fn wait_completion(&self, rx: &Receiver<Completion>) -> Completion {
        loop {
            if let Ok(c) = rx.try_recv() {
                return c;
            }
            match self.inner.busy_conn() {
                Some(c) => c.receive_inline(|| !rx.is_empty(), false),
                None => {
                    if let Ok(c) = rx.recv_timeout(Duration::from_millis(1)) {
                        return c;
                    }
                }
            }
        }
    }

    /// Blocking read of `out.len() / 4096` consecutive pages from `first`. Returns one flag per
    /// page: true if present, false if absent (never written: its bytes in `out` are zeroed).
    pub fn read(&self, ns: u64, first: u64, out: &mut [u8]) -> Result<Vec<bool>, ClientError> {
        let pages = check_len(out.len())?;
        let mut present = Vec::with_capacity(pages);
        let mut io = IoBuf::new(MAX_PAGES_PER_FRAME);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut done = 0;
        while done < pages {
            let start = first + done as u64;
            let n = self.chunk(start, pages - done);
            io.set_run(start, n)?;
            let c = self.run_blocking(OpKind::Read, ns, io, &tx, &rx)?;
            io = c.io;
            c.result?;
            for i in 0..n {
                let dst = &mut out[(done + i) * PAGE_SIZE..(done + i + 1) * PAGE_SIZE];
                if io.is_present(i) {
                    dst.copy_from_slice(io.page(i));
                    present.push(true);
                } else {
                    dst.fill(0);
                    present.push(false);
                }
            }
            done += n;
        }
        Ok(present)
    }

    /// Blocking write of `data.len() / 4096` consecutive pages from `first`; returns when
    /// every live replica stored them.
    pub fn write(&self, ns: u64, first: u64, data: &[u8]) -> Result<(), ClientError> {
        let pages = check_len(data.len())?;
        let mut io = IoBuf::new(MAX_PAGES_PER_FRAME);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut done = 0;
        while done < pages {
            let start = first + done as u64;
            let n = self.chunk(start, pages - done);
            io.set_run(start, n)?;
            io.data_mut()
                .copy_from_slice(&data[done * PAGE_SIZE..(done + n) * PAGE_SIZE]);
            let c = self.run_blocking(OpKind::Write, ns, io, &tx, &rx)?;
            io = c.io;
            c.result?;
            done += n;
        }
        Ok(())
    }

    /// Blocking discard of `count` pages from `first`; returns how many existed (on the
    /// replica that answered with the most).
    pub fn discard(&self, ns: u64, first: u64, count: usize) -> Result<u64, ClientError> {
        let mut io = IoBuf::new(MAX_PAGES_PER_FRAME);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let (mut done, mut freed) = (0, 0u64);
        while done < count {
            let start = first + done as u64;
            let n = self.chunk(start, count - done);
            io.set_run(start, n)?;
            let c = self.run_blocking(OpKind::Discard, ns, io, &tx, &rx)?;
            io = c.io;
            freed += c.result? as u64;
            done += n;
        }
        Ok(freed)
    }

    /// STAT of `ns` on every live server, in server order (None for a dead server).
    pub fn stat(&self, ns: u64) -> Vec<Option<Result<StatInfo, ClientError>>> {
        (0..self.inner.servers.len())
            .map(|s| {
                if self.inner.servers[s].dead.load(Ordering::Acquire) {
                    None
                } else {
                    Some(self.inner.blocking_stat(s as u16, ns))
                }
            })
            .collect()
    }

    fn chunk(&self, start: u64, left: usize) -> usize {
        let slab = self.inner.cfg.slab_pages;
        let to_slab_end = (slab - start % slab) as usize;
        left.min(MAX_PAGES_PER_FRAME).min(to_slab_end)
    }

    fn run_blocking(
        &self,
        op: OpKind,
        ns: u64,
        io: IoBuf,
        tx: &Sender<Completion>,
        rx: &Receiver<Completion>,
    ) -> Result<Completion, ClientError> {
        self.submit(op, ns, Priority::Demand, io, 0, tx)
            .map_err(|(e, _)| e)?;
        Ok(self.wait_completion(rx))
    }

    /// Takes every server out of service and stops the maintenance thread.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        let _ = self.inner.events.send(Event::Stop);
        if let Some(t) = self.maint.take() {
            let _ = t.join();
        }
        self.inner.close_all();
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Waits for a completion, spinning for `spin` first (a sleeping waiter costs a wake-up,
/// which on a loaded 2-core host is a large part of a 20 µs round trip).
pub fn wait<T>(rx: &Receiver<T>, spin: Duration) -> T {
    if !spin.is_zero() {
        let t0 = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(v) => return v,
                Err(crossbeam_channel::TryRecvError::Disconnected) => break,
                Err(crossbeam_channel::TryRecvError::Empty) => {}
            }
            if t0.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
    }
    // The sender side lives in the caller (it passed `tx`), so recv cannot disconnect.
    rx.recv().expect("completion sender alive")
}

fn check_len(bytes: usize) -> Result<usize, ClientError> {
    if bytes == 0 || !bytes.is_multiple_of(PAGE_SIZE) {
        return Err(ClientError::InvalidRequest(
            "buffer length must be a non-zero multiple of 4096",
        ));
    }
    Ok(bytes / PAGE_SIZE)
}

impl Inner {
    fn shard(&self, key: SlabKey) -> &RwLock<FxHashMap<SlabKey, Placement>> {
        let h = key.0.wrapping_mul(0x9e3779b97f4a7c15) ^ key.1.wrapping_mul(0xc2b2ae3d27d4eb4f);
        &self.placement[(h >> 58) as usize % SHARDS]
    }

    fn lookup(&self, key: SlabKey) -> Option<Placement> {
        self.shard(key)
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .copied()
    }

    fn is_dead(&self, s: u16) -> bool {
        self.servers[s as usize].dead.load(Ordering::Acquire)
    }

    /// The first replica of `p` that can serve reads — in service and not being filled —
    /// other than `except`.
    fn live_source(&self, p: &Placement, except: Option<u16>) -> Option<u16> {
        p.servers()
            .iter()
            .enumerate()
            .find(|&(i, &s)| Some(s) != except && !p.is_filling(i) && !self.is_dead(s))
            .map(|(_, &s)| s)
    }

    fn rand(&self) -> u64 {
        // xorshift on a shared atomic: a lost update only repeats a number, harmless here.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }

    /// Power of two choices among `cands`: two at random, keep the one with more free space.
    fn two_choices(&self, cands: &[u16]) -> u16 {
        if cands.len() == 1 {
            return cands[0];
        }
        let a = cands[(self.rand() % cands.len() as u64) as usize];
        let mut b = cands[(self.rand() % (cands.len() as u64 - 1)) as usize];
        if b == a {
            b = cands[cands.len() - 1];
        }
        let fa = self.servers[a as usize].free_pages.load(Ordering::Relaxed);
        let fb = self.servers[b as usize].free_pages.load(Ordering::Relaxed);
        if fb > fa {
            b
        } else {
            a
        }
    }

    fn choose(&self, exclude: &[u16], n: usize) -> ([u16; MAX_REPLICAS], usize) {
        let mut out = [0u16; MAX_REPLICAS];
        let mut k = 0;
        let mut cands: [u16; 64] = [0; 64];
        while k < n {
            let mut m = 0;
            for s in 0..self.servers.len().min(64) as u16 {
                if !self.is_dead(s) && !exclude.contains(&s) && !out[..k].contains(&s) {
                    cands[m] = s;
                    m += 1;
                }
            }
            if m == 0 {
                break;
            }
            let s = self.two_choices(&cands[..m]);
            // Account the slab against the server until the next STAT refresh.
            let f = &self.servers[s as usize].free_pages;
            let _ = f.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(self.cfg.slab_pages))
            });
            out[k] = s;
            k += 1;
        }
        (out, k)
    }

    fn place(&self, key: SlabKey) -> Result<Placement, ClientError> {
        let mut m = self.shard(key).write().unwrap_or_else(|e| e.into_inner());
        // A slab whose every replica was lost (`forget_server`) is placed afresh by its next
        // write: that page lives again, the others still read as absent (lost to the engine).
        let prev = m.get(&key).copied();
        if let Some(p) = prev.filter(|p| p.n > 0) {
            return Ok(p);
        }
        let (replicas, n) = self.choose(&[], self.r);
        if n == 0 {
            return Err(ClientError::NoLiveReplica);
        }
        let p = Placement {
            replicas,
            n: n as u8,
            filling: 0,
            lost: prev.is_some_and(|p| p.lost),
        };
        m.insert(key, p);
        Ok(p)
    }

    /// A connection to server `s` for `lane`: the demand or write lane when configured, else
    /// the less loaded of two bulk connections. A server's connections are laid out as
    /// `[bulk..., write lane?, demand lane?]`.
    fn pick_conn(&self, s: u16, lane: Lane) -> Option<Arc<Connection>> {
        let st = &self.servers[s as usize];
        let conns = st.conns.read().unwrap_or_else(|e| e.into_inner());
        let (n_write, n_demand) = (
            usize::from(self.cfg.write_lane),
            usize::from(self.cfg.demand_lane),
        );
        let bulk = match conns.len().checked_sub(n_write + n_demand) {
            Some(nb) if nb > 0 => {
                match lane {
                    Lane::Demand if n_demand == 1 => return conns.last().cloned(),
                    Lane::Write if n_write == 1 => return conns.get(nb).cloned(),
                    _ => {}
                }
                &conns[..nb]
            }
            _ => &conns[..],
        };
        match bulk.len() {
            0 => return None,
            1 => return bulk.first().cloned(),
            _ => {}
        }
        // Least outstanding of two (round-robin start) keeps connections evenly loaded.
        let i = st.rr.fetch_add(1, Ordering::Relaxed) % bulk.len();
        let j = (i + 1) % bulk.len();
        let (a, b) = (&bulk[i], &bulk[j]);
        Some(if b.outstanding() < a.outstanding() {
            b.clone()
        } else {
            a.clone()
        })
    }

    /// Sends ticket `ticket` to server `s` on a connection of `lane`.
    fn send_to(
        &self,
        s: u16,
        ticket: u32,
        prio: Priority,
        lane: Lane,
        direct: bool,
        wake: bool,
    ) -> Result<Arc<Connection>, ClientError> {
        if self.is_dead(s) {
            return Err(ClientError::Disconnected);
        }
        let c = self.pick_conn(s, lane).ok_or(ClientError::Disconnected)?;
        c.submit(ticket, prio, direct, wake)?;
        Ok(c)
    }

    /// A live connection with requests in flight, if any, that a poller may receive on.
    /// (Never a demand lane: its requests are received by their own inline waiters, and a
    /// poller camping on it would hold its receive side while they wait.)
    fn busy_conn(&self) -> Option<Arc<Connection>> {
        let n_demand = usize::from(self.cfg.demand_lane);
        self.servers
            .iter()
            .filter(|s| !s.dead.load(Ordering::Acquire))
            .find_map(|s| {
                let v = s.conns.read().unwrap_or_else(|e| e.into_inner());
                v[..v.len().saturating_sub(n_demand)]
                    .iter()
                    .find(|c| c.inflight() > 0 && !c.is_broken())
                    .cloned()
            })
    }

    /// Returns the connection a read went to when the caller receives inline
    /// ([`Receive::Inline`]).
    #[allow(clippy::too_many_arguments, clippy::result_large_err)]
    fn submit(
        &self,
        op: OpKind,
        ns: u64,
        prio: Priority,
        mut io: IoBuf,
        user_data: u64,
        reply: Reply,
        if_absent: bool,
        recv: Receive,
    ) -> Result<Option<Arc<Connection>>, (ClientError, IoBuf)> {
        let wake = recv == Receive::Background;
        if io.is_empty() || op == OpKind::Stat {
            return Err((ClientError::InvalidRequest("empty page selection"), io));
        }
        let slab_pages = self.cfg.slab_pages;
        let slab = io.page_index(0) / slab_pages;
        let same_slab = match io.shape() {
            iobuf::Shape::Run { start } => (start + io.len() as u64 - 1) / slab_pages == slab,
            iobuf::Shape::Scatter => io.indices().iter().all(|p| p / slab_pages == slab),
        };
        if !same_slab {
            return Err((ClientError::InvalidRequest("request spans two slabs"), io));
        }
        let key = (ns, slab);
        // Take the ticket (and mark it active) before reading the placement, so recovery's
        // quiesce step sees every write that may have read an older placement.
        let Some(tn) = self.tickets.alloc() else {
            return Err((ClientError::QueueFull, io));
        };
        let mut t = self.tickets.lock(tn);
        t.reset();
        t.active = true;
        t.op = op;
        t.ns = ns;
        t.slab = slab;
        drop(t);
        // A slab whose every replica was lost reads as lost, and is unplaced for writes (the
        // next one places it afresh) and discards (nothing left to drop).
        let placed = self.lookup(key).filter(|p| p.n > 0 || op == OpKind::Read);
        let placement = match (op, placed) {
            (OpKind::Write, None) => match self.place(key) {
                Ok(p) => p,
                Err(e) => {
                    self.abandon(tn);
                    return Err((e, io));
                }
            },
            (_, Some(p)) => p,
            // Never written: every page absent / nothing to discard, no server involved.
            (_, None) => {
                self.abandon(tn);
                io.clear_present();
                deliver(reply, user_data, io, Ok(0));
                return Ok(None);
            }
        };
        if op == OpKind::Write {
            io.compute_crcs();
        }
        let mut t = self.tickets.lock(tn);
        t.prio = prio;
        t.user_data = user_data;
        t.if_absent = if_absent;
        t.io = Some(io);
        t.reply = reply;
        if op == OpKind::Read {
            let mut n = 0;
            for (i, &s) in placement.servers().iter().enumerate() {
                if !placement.is_filling(i) {
                    t.replicas[n] = s;
                    n += 1;
                }
            }
            t.nrep = n as u8;
            t.attempt = 0;
            t.lost_slab = placement.lost;
            if n == 0 {
                // Nothing delivered; no replica left at all (`forget_server`) is lost, not
                // merely unreachable.
                if let Some(io) = t.io.as_mut() {
                    io.clear_present();
                }
                drop(t);
                let e = if placement.n == 0 {
                    ClientError::Lost
                } else {
                    ClientError::NoLiveReplica
                };
                self.on_complete(tn, u16::MAX, Some(Err(e)));
                return Ok(None);
            }
            drop(t);
            let first = self.tickets.lock(tn).replicas[0];
            let inline = recv == Receive::Inline;
            let lane = if inline { Lane::Demand } else { Lane::Bulk };
            return match self.send_to(first, tn, prio, lane, true, wake) {
                Ok(c) => Ok(inline.then_some(c)),
                Err(e) => {
                    self.on_complete(tn, first, Some(Err(e)));
                    Ok(None)
                }
            };
        }
        // Write or discard: every live replica (a filling replica gets the page later from
        // the copier, see `Inner::fill_slab`).
        let targets = if placement.filling != 0 {
            match self.register_fill(key, &mut t) {
                Some(p) => p,
                None => placement,
            }
        } else {
            placement
        };
        let mut n = 0;
        for (i, &s) in targets.servers().iter().enumerate() {
            if !targets.is_filling(i) {
                t.replicas[n] = s;
                n += 1;
            }
        }
        t.nrep = n as u8;
        // One extra count guards against completions arriving before every send is issued.
        t.pending = n as u8 + 1;
        drop(t);
        for k in 0..n {
            let s = self.tickets.lock(tn).replicas[k];
            let lane = if op == OpKind::Write {
                Lane::Write
            } else {
                Lane::Bulk
            };
            if let Err(e) = self.send_to(s, tn, prio, lane, true, wake) {
                self.on_complete(tn, s, Some(Err(e)));
            }
        }
        self.on_complete(tn, u16::MAX, None);
        Ok(None)
    }

    fn abandon(&self, tn: u32) {
        let mut t = self.tickets.lock(tn);
        t.reset();
        t.seq += 1;
        drop(t);
        self.tickets.release(tn);
    }

    /// For a write/discard to a slab being filled: records the pages as dirty for the copier
    /// and returns the current placement (re-read under the fill lock).
    fn register_fill(&self, key: SlabKey, t: &mut Ticket) -> Option<Placement> {
        let mut fills = self.fills.lock().unwrap_or_else(|e| e.into_inner());
        let p = self.lookup(key)?;
        if p.filling == 0 {
            return Some(p);
        }
        let fs = fills.entry(key).or_default();
        if let Some(io) = t.io.as_ref() {
            fs.dirty.extend(io.indices().iter().copied());
        }
        fs.inflight += 1;
        t.count = u32::MAX; // marker: this ticket counts in the fill's inflight
        Some(p)
    }

    fn mark_dead(&self, s: u16) {
        self.mark_dead_from(s, None);
    }

    /// Takes server `s` out of service. `generation`: the connection set that saw the failure
    /// (`None`: the current one); a failure seen by an older set is stale (the server has
    /// rejoined since) and ignored.
    fn mark_dead_from(&self, s: u16, generation: Option<u32>) {
        let Some(st) = self.servers.get(s as usize) else {
            return;
        };
        if generation.is_some_and(|g| g != st.generation.load(Ordering::Acquire)) {
            return;
        }
        if self.closing.load(Ordering::Acquire) || st.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(server = %st.addr, "memserver taken out of service");
        self.dead_servers.fetch_add(1, Ordering::Relaxed);
        self.close_conns(s);
        let _ = self.events.send(Event::Dead(s));
    }

    /// Logs every connection with a request unanswered for 5 s (or half the timeout).
    fn report_stalls(&self) {
        let stale = (self.cfg.timeout / 2).min(Duration::from_secs(5));
        for (s, st) in self.servers.iter().enumerate() {
            if self.is_dead(s as u16) {
                continue;
            }
            let conns = st.conns.read().unwrap_or_else(|e| e.into_inner()).clone();
            for (k, c) in conns.iter().enumerate() {
                if let Some(r) = c.stall_report(stale) {
                    tracing::warn!(server = %st.addr, connection = k, "stalled: {r}");
                }
            }
        }
    }

    fn close_conns(&self, s: u16) {
        let conns = self.servers[s as usize]
            .conns
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for c in conns.iter() {
            c.close();
        }
    }

    fn close_all(&self) {
        self.closing.store(true, Ordering::Release);
        for s in 0..self.servers.len() {
            self.close_conns(s as u16);
        }
    }

    /// One replica answered (`Some(outcome)`), or the submission guard is released (`None`).
    fn on_complete(&self, tn: u32, server: u16, outcome: Option<Result<u32, ClientError>>) {
        self.on_complete_from(tn, server, None, outcome);
    }

    /// [`Inner::on_complete`] for an answer that came on connection set `generation`.
    fn on_complete_from(
        &self,
        tn: u32,
        server: u16,
        generation: Option<u32>,
        outcome: Option<Result<u32, ClientError>>,
    ) {
        if let Some(Err(e)) = outcome {
            if e.is_server_failure() {
                self.mark_dead_from(server, generation);
            }
        }
        let mut t = self.tickets.lock(tn);
        match t.op {
            OpKind::Stat => {
                let r = outcome.unwrap_or(Err(ClientError::NoLiveReplica));
                self.finish(tn, t, r);
            }
            OpKind::Read => match outcome {
                Some(Ok(n)) => {
                    let gone =
                        t.lost_slab && t.io.as_ref().is_some_and(|io| (n as usize) < io.len());
                    self.finish(tn, t, if gone { Err(ClientError::Lost) } else { Ok(n) });
                }
                Some(Err(e)) if e.is_server_failure() || e == ClientError::ChecksumMismatch => {
                    let prio = t.prio;
                    loop {
                        t.attempt += 1;
                        if t.attempt >= t.nrep {
                            let err = if e == ClientError::ChecksumMismatch {
                                e
                            } else {
                                ClientError::NoLiveReplica
                            };
                            self.finish(tn, t, Err(err));
                            return;
                        }
                        let s = t.replicas[t.attempt as usize];
                        // Not direct: we may be on a receiver thread, which must never block
                        // on a socket write.
                        if self.send_to(s, tn, prio, Lane::Bulk, false, true).is_ok() {
                            self.read_failovers.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                }
                Some(Err(e)) => self.finish(tn, t, Err(e)),
                None => {}
            },
            OpKind::Write | OpKind::Discard => {
                t.pending = t.pending.saturating_sub(1);
                match outcome {
                    Some(Ok(n)) => {
                        t.acked += 1;
                        if t.count != u32::MAX {
                            t.count = t.count.max(n);
                        }
                    }
                    Some(Err(e)) if e.is_server_failure() => {}
                    Some(Err(e)) => {
                        t.err.get_or_insert(e);
                    }
                    None => {}
                }
                if t.pending == 0 {
                    let r = if let Some(e) = t.err {
                        Err(e)
                    } else if t.acked == 0 {
                        Err(ClientError::NoLiveReplica)
                    } else if t.count == u32::MAX {
                        Ok(0)
                    } else {
                        Ok(t.count)
                    };
                    if t.count == u32::MAX {
                        let key = (t.ns, t.slab);
                        let mut fills = self.fills.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(fs) = fills.get_mut(&key) {
                            fs.inflight -= 1;
                        }
                    }
                    self.finish(tn, t, r);
                }
            }
        }
    }

    fn finish(
        &self,
        tn: u32,
        mut t: std::sync::MutexGuard<'_, Ticket>,
        r: Result<u32, ClientError>,
    ) {
        let reply = std::mem::replace(&mut t.reply, Reply::None);
        let io = t.io.take();
        let (user_data, stat) = (t.user_data, t.stat);
        t.reset();
        t.seq += 1;
        drop(t);
        self.tickets.release(tn);
        match (reply, io) {
            (Reply::Internal(tx), io) => {
                let _ = tx.send(InternalDone {
                    result: r,
                    stat,
                    io,
                });
            }
            (reply, Some(io)) => deliver(reply, user_data, io, r),
            _ => {}
        }
    }

    fn blocking_stat(&self, s: u16, ns: u64) -> Result<StatInfo, ClientError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let tn = self.tickets.alloc().ok_or(ClientError::QueueFull)?;
        {
            let mut t = self.tickets.lock(tn);
            t.reset();
            t.op = OpKind::Stat;
            t.ns = ns;
            t.reply = Reply::Internal(tx);
        }
        if let Err(e) = self.send_to(s, tn, Priority::Prefetch, Lane::Bulk, true, true) {
            self.on_complete(tn, s, Some(Err(e)));
        }
        let d = wait(&rx, Duration::ZERO);
        d.result.map(|_| d.stat)
    }

    fn refresh_free(&self, s: u16) {
        if self.is_dead(s) {
            return;
        }
        if let Ok(st) = self.blocking_stat(s, 0) {
            let free = st.capacity_pages.saturating_sub(st.used_pages);
            let server = &self.servers[s as usize];
            server.free_pages.store(free, Ordering::Relaxed);
            let known = server.instance.swap(st.instance, Ordering::AcqRel);
            if known != 0 && known != st.instance {
                // Restarted between two of our requests without us seeing a connection drop
                // (it cannot keep a TCP connection across a restart, but be sure): the
                // rejoin path sorts out what it lost.
                server.instance.store(known, Ordering::Release);
                tracing::error!(server = %server.addr, "memserver restarted under us");
                self.mark_dead(s);
            }
        }
    }

    /// Blocking internal request on one server (re-replication), not replicated.
    pub(super) fn direct_io(
        &self,
        s: u16,
        op: OpKind,
        ns: u64,
        io: IoBuf,
        if_absent: bool,
    ) -> (IoBuf, Result<u32, ClientError>) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let Some(tn) = self.tickets.alloc() else {
            return (io, Err(ClientError::QueueFull));
        };
        let mut io = io;
        if op == OpKind::Write {
            io.compute_crcs();
        }
        {
            let mut t = self.tickets.lock(tn);
            t.reset();
            t.op = op;
            t.ns = ns;
            t.if_absent = if_absent;
            t.io = Some(io);
            t.reply = Reply::Internal(tx);
            t.replicas[0] = s;
            t.nrep = 1;
            t.pending = 1;
        }
        if let Err(e) = self.send_to(s, tn, Priority::Prefetch, Lane::Bulk, true, true) {
            self.on_complete(tn, s, Some(Err(e)));
        }
        let d = wait(&rx, Duration::ZERO);
        (
            d.io.unwrap_or_else(|| IoBuf::new(MAX_PAGES_PER_FRAME)),
            d.result,
        )
    }
}

fn deliver(reply: Reply, user_data: u64, io: IoBuf, result: Result<u32, ClientError>) {
    match reply {
        Reply::User(tx) => {
            // The caller owns the receiver; if it dropped it, it no longer wants the result.
            let _ = tx.send(Completion {
                user_data,
                io,
                result,
            });
        }
        Reply::Internal(tx) => {
            let _ = tx.send(InternalDone {
                result,
                stat: StatInfo::default(),
                io: Some(io),
            });
        }
        Reply::None => {}
    }
}

fn maintenance(inner: Weak<Inner>, rx: Receiver<Event>) {
    loop {
        match rx.recv_timeout(Duration::from_secs(1)) {
            Ok(Event::Stop) | Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return,
            Ok(Event::Dead(s)) => {
                let Some(i) = inner.upgrade() else { return };
                i.handle_dead(s);
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                let Some(i) = inner.upgrade() else { return };
                for s in 0..i.servers.len() {
                    i.refresh_free(s as u16);
                }
                i.report_stalls();
                for s in 0..i.servers.len() as u16 {
                    if i.is_dead(s) && !i.closing.load(Ordering::Acquire) {
                        i.try_rejoin(s);
                    }
                }
            }
        }
    }
}
