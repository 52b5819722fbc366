//! The client's public face: [`Client::connect`], one asynchronous [`Client::submit`] whose
//! result goes where [`ReplyTo`] says, the inline demand path ([`Client::submit_wait`]), and
//! blocking conveniences (`read`, `write`, `discard`, `stat`).

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use farvm_memproto::{StatInfo, MAX_PAGES_PER_FRAME, PAGE_SIZE};
use farvm_pageio::PageBuf;
use farvm_seal::KeyRing;
use farvm_transport::Endpoint;

use crate::core::{Core, Job, Receive};
use crate::health::{self, ClientStats, Health, RelocateError};
use crate::tickets::{Reply, TicketOp};
use crate::{ClientConfig, ClientError, IoBuf, Op, Priority};

/// A request: read or write the pages selected in `io`, all within one slab.
#[derive(Debug)]
pub struct Request {
    /// Read or write.
    pub op: Op,
    /// Namespace (VM id).
    pub ns: u64,
    /// Demand requests overtake prefetches (and take the demand lane).
    pub priority: Priority,
    /// The pages, and where their bytes live; handed back in [`Finished`].
    pub io: IoBuf,
    /// Returned as is in [`Finished`].
    pub user_data: u64,
}

/// A finished request.
#[derive(Debug)]
pub struct Finished {
    /// The request's `user_data`.
    pub user_data: u64,
    /// The request's buffer (for reads: filled, with presence bits).
    pub io: IoBuf,
    /// Pages present (read) or written (write), or the error.
    pub result: Result<u32, ClientError>,
    /// The server (index into the configured servers) whose answer a read's pages are;
    /// `u16::MAX` for writes and for reads answered by no server. Handed back to
    /// [`Client::reject_replica`] when the pages turn out stale.
    pub server: u16,
}

/// Receives finished requests. Called on the thread that finished the request — usually a
/// connection's receiver, sometimes the submitting thread itself (a request answered without
/// asking a server, or one that failed at once) — so it must not block for long.
pub trait FinishedSink: Send + Sync {
    /// Takes one finished request.
    fn finished(&self, done: Finished);
}

/// Where a submitted request's result goes (and who receives its response off the socket).
pub enum ReplyTo<'a> {
    /// This channel; the connection's receiver thread receives the response. The channel
    /// must have room for every request the caller keeps outstanding (a bounded channel is
    /// preallocated; sending never allocates).
    Channel(&'a Sender<Finished>),
    /// This channel; the caller receives the responses itself with
    /// [`Client::wait_completion`] (no thread hand-off). If it stops polling, the connection's
    /// receiver still delivers within a few milliseconds.
    Polled(&'a Sender<Finished>),
    /// This sink, called by whichever thread receives the response.
    Sink(&'a Arc<dyn FinishedSink>),
}

/// The client (cheap to share behind an `Arc`; all methods take `&self`).
pub struct Client {
    core: Arc<Core>,
    maint: Option<JoinHandle<()>>,
}

impl Client {
    /// Connects to every server (a server that cannot be reached is taken out of service;
    /// at least one must answer) and starts the maintenance thread.
    pub fn connect(cfg: ClientConfig) -> Result<Self, ClientError> {
        let (health, events) = Health::new();
        let core = Arc::new(Core::new(cfg, health)?);
        let mut first_err = None;
        let mut live = 0;
        for (i, s) in core.servers.iter().enumerate() {
            match core.connect_server(i as u16, 0) {
                Ok(conns) => {
                    *s.conns.write().unwrap_or_else(|e| e.into_inner()) = conns;
                    live += 1;
                }
                Err(e) => {
                    tracing::warn!(server = %s.addr(), "cannot connect: {e}");
                    first_err.get_or_insert(e);
                    s.dead.store(true, Ordering::Release);
                    core.health.dead_servers.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        // Authentication and permission failures are configuration errors: report them.
        if let Some(
            e @ (ClientError::Auth { .. }
            | ClientError::Denied
            | ClientError::Rdma { .. }
            | ClientError::NoLink { .. }),
        ) = first_err
        {
            core.close_all();
            return Err(e);
        }
        if live == 0 {
            return Err(first_err.unwrap_or(ClientError::NoLiveReplica));
        }
        for i in 0..core.servers.len() {
            core.refresh_free(i as u16);
        }
        let weak = Arc::downgrade(&core);
        let maint = std::thread::Builder::new()
            .name("memclient-maint".into())
            .spawn(move || {
                farvm_sandbox::enter(farvm_sandbox::ThreadClass::StoreConnection);
                health::maintenance(weak, events)
            })
            .map_err(|_| ClientError::InvalidRequest("cannot spawn maintenance thread"))?;
        Ok(Self {
            core,
            maint: Some(maint),
        })
    }

    /// Slab size in pages.
    pub fn slab_pages(&self) -> u64 {
        self.core.cfg.slab_pages
    }

    /// Replication factor in use.
    pub fn replication(&self) -> usize {
        self.core.r
    }

    /// Replication health counters.
    pub fn stats(&self) -> ClientStats {
        self.core.stats()
    }

    /// Read responses whose sealed pages failed authentication (`ClientError::Unauthentic`):
    /// each dropped the replica that sent it from its slab where another was left.
    pub fn unauthentic_reads(&self) -> u64 {
        self.core
            .unauthentic
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether this client seals pages (`ClientConfig::page_key`).
    pub fn seals_pages(&self) -> bool {
        self.core.keys.is_some()
    }

    /// The page keys (docs/sealing.md, "Rotation"), `None` if pages are not sealed: after
    /// [`KeyRing::rotate`] every connection seals under the new key from its next write on
    /// and opens pages of both; [`KeyRing::drop_previous`] ends the rotation once no page is
    /// left under the previous key (the caller re-seals them, e.g. with
    /// [`crate::PageStore::reseal`]).
    pub fn keys(&self) -> Option<&Arc<KeyRing>> {
        self.core.keys.as_ref()
    }

    /// Submits a read or write of the pages selected in `req.io` (all within one slab); the
    /// result goes to `to`. Nothing is allocated per request. On `Err` the buffer is handed
    /// back and nothing was sent.
    // Handing the buffer back by value (not boxed) is the point: no allocation per request.
    #[allow(clippy::result_large_err)]
    pub fn submit(&self, req: Request, to: ReplyTo<'_>) -> Result<(), (ClientError, IoBuf)> {
        let (reply, receive) = match to {
            ReplyTo::Channel(tx) => (Reply::Channel(tx.clone()), Receive::Background),
            ReplyTo::Polled(tx) => (Reply::Channel(tx.clone()), Receive::Polled),
            ReplyTo::Sink(s) => (Reply::Sink(s.clone()), Receive::Background),
        };
        self.core
            .submit(
                job(req.op, req.ns, req.priority, req.io, req.user_data),
                reply,
                receive,
            )
            .map(|_| ())
    }

    /// Submits a demand request and waits for it, receiving the response on the calling
    /// thread (the lowest-latency path: no hand-off between threads). Use it for the read a
    /// vCPU is blocked on. Allocation-free after the first call on a thread.
    pub fn submit_wait(&self, op: Op, ns: u64, io: IoBuf) -> Finished {
        self.run_inline(job(op, ns, Priority::Demand, io, 0))
    }

    fn run_inline(&self, job: Job) -> Finished {
        thread_local! {
            static CHAN: (Sender<Finished>, Receiver<Finished>) = crossbeam_channel::bounded(1);
        }
        CHAN.with(|(tx, rx)| {
            match self
                .core
                .submit(job, Reply::Channel(tx.clone()), Receive::Inline)
            {
                Err((e, io)) => Finished {
                    user_data: 0,
                    io,
                    result: Err(e),
                    server: u16::MAX,
                },
                Ok(conn) => {
                    if let Some(c) = conn.as_ref() {
                        c.receive_inline(&|| !rx.is_empty(), true);
                    }
                    self.wait_completion(rx)
                }
            }
        })
    }

    /// Waits for the next completion on `rx`, receiving inline on a busy connection while
    /// waiting (see [`ReplyTo::Polled`]); falls back to sleeping on the channel.
    pub fn wait_completion(&self, rx: &Receiver<Finished>) -> Finished {
        loop {
            if let Ok(c) = rx.try_recv() {
                return c;
            }
            match self.core.servers.busy_conn() {
                Some(c) => c.receive_inline(&|| !rx.is_empty(), false),
                None => {
                    if let Ok(c) = rx.recv_timeout(Duration::from_millis(1)) {
                        return c;
                    }
                }
            }
        }
    }

    /// Blocking read of `out.len() / 4096` consecutive pages from `first`, received straight
    /// into `out`. Returns one flag per page: true if present, false if absent (never
    /// written: its bytes in `out` are zeroed).
    pub fn read(&self, ns: u64, first: u64, out: &mut [u8]) -> Result<Vec<bool>, ClientError> {
        let pages = check_len(out.len())?;
        let mut present = Vec::with_capacity(pages);
        let mut io = IoBuf::external(MAX_PAGES_PER_FRAME);
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut done = 0;
        while done < pages {
            let start = first + done as u64;
            let n = self.chunk(start, pages - done);
            let chunk = &mut out[done * PAGE_SIZE..(done + n) * PAGE_SIZE];
            set_external_run(&mut io, start, chunk)?;
            let c = self.run_blocking(TicketOp::Read, ns, io, &tx, &rx)?;
            io = c.io;
            c.result?;
            for (i, dst) in chunk.chunks_exact_mut(PAGE_SIZE).enumerate() {
                present.push(io.is_present(i));
                if !io.is_present(i) {
                    dst.fill(0);
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
            let c = self.run_blocking(TicketOp::Write, ns, io, &tx, &rx)?;
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
            let c = self.run_blocking(TicketOp::Discard, ns, io, &tx, &rx)?;
            io = c.io;
            freed += c.result? as u64;
            done += n;
        }
        Ok(freed)
    }

    /// The server at `endpoint` becomes one of the client's servers if it is not yet (a pool
    /// server that joined after this client started, the target of a move or a repair):
    /// connected now, or kept trying by the maintenance thread if it does not answer yet.
    /// Returns whether it was new; fails when the client holds [`MAX_SERVERS`] already.
    ///
    /// [`MAX_SERVERS`]: crate::MAX_SERVERS
    pub fn add_server(&self, endpoint: Endpoint) -> Result<bool, ClientError> {
        Ok(self.server_index(endpoint)?.1)
    }

    /// The index of the server at `endpoint`, added first if the client does not know it, and
    /// whether it was new.
    fn server_index(&self, endpoint: Endpoint) -> Result<(u16, bool), ClientError> {
        let core = &self.core;
        core.servers
            .add(endpoint, |s| core.bring_in(s))
            .ok_or(ClientError::InvalidRequest(
                "the client knows 64 memory servers already",
            ))
    }

    /// Slabs `k` with `k % pool slabs == j` are placed on `servers` from now on, when first
    /// written (a pool moved pool slab `j`'s replicas there). Servers the client does not know
    /// are added first ([`Client::add_server`]). Fails if `j` is not one of the pool's slabs.
    pub fn set_slab_home(&self, j: usize, servers: &[Endpoint]) -> Result<(), ClientError> {
        let home = servers
            .iter()
            .map(|&a| Ok(self.server_index(a)?.0))
            .collect::<Result<Vec<u16>, ClientError>>()?;
        if self.core.placements.set_home(j, home) {
            Ok(())
        } else {
            Err(ClientError::InvalidRequest("no such pool slab"))
        }
    }

    /// The server at `addr` left the memory pool for good while this client had it out of
    /// service (its lease expired and it did not come back: the pool's follower decides when).
    /// The slabs it was the last replica of are lost from now on — their reads fail with
    /// [`ClientError::Lost`], so the guest needing one of their pages stops with a clear error
    /// — instead of waiting forever for it to answer. Returns the slabs lost, or `None` when
    /// the server is in service (it still answers this client; nothing is dropped).
    pub fn retire_server(&self, addr: SocketAddr) -> Result<Option<u64>, RelocateError> {
        let s = self
            .core
            .servers
            .index_of(addr)
            .ok_or(RelocateError::UnknownServer(addr))?;
        Ok(self.core.retire_server(s))
    }

    /// Marks the server at `addr` as draining (it takes no new slab) or takes the mark off.
    pub fn set_draining(&self, addr: SocketAddr, draining: bool) -> Result<(), RelocateError> {
        let s = self
            .core
            .servers
            .index_of(addr)
            .ok_or(RelocateError::UnknownServer(addr))?;
        if let Some(st) = self.core.servers.get(s) {
            st.draining.store(draining, Ordering::Release);
        }
        Ok(())
    }

    /// Moves the replica on `from` of every slab of namespace `ns` for which `which(slab)`
    /// holds to `to`, while the slabs stay in use (no request waits on the copy; see
    /// `health::relocate`). Runs on the calling thread; returns the slabs moved.
    pub fn move_replicas(
        &self,
        ns: u64,
        from: SocketAddr,
        to: SocketAddr,
        which: &dyn Fn(u64) -> bool,
    ) -> Result<u64, RelocateError> {
        let idx = |a| {
            self.core
                .servers
                .index_of(a)
                .ok_or(RelocateError::UnknownServer(a))
        };
        let (f, t) = (idx(from)?, idx(to)?);
        let mut moved = 0;
        for slab in self.core.slabs_on(ns, f) {
            if which(slab) {
                self.core.move_replica((ns, slab), f, t)?;
                moved += 1;
            }
        }
        Ok(moved)
    }

    /// A read of `page` (namespace `ns`) answered by server `server` (its index, as in
    /// [`Finished::server`]) returned content older than the page's last write: that
    /// replica lacks a write and leaves the slab if another replica remains, and the slab is
    /// re-replicated. Returns whether another replica may hold the page (read it again);
    /// false: none does.
    pub fn reject_replica(&self, ns: u64, page: u64, server: u16) -> bool {
        if server as usize >= self.core.servers.len() {
            return false;
        }
        self.core
            .reject_replica((ns, page / self.core.cfg.slab_pages), server)
    }

    /// Takes namespace `ns`'s first `pages` pages as written by an earlier client (a restored
    /// snapshot's VM): each of their slabs is placed on its pool home
    /// ([`ClientConfig::slab_homes`]) as it is now, so that a read asks those servers instead
    /// of answering "never written". Returns the slabs placed (none without homes).
    pub fn adopt_home_placements(&self, ns: u64, pages: u64) -> u64 {
        let slabs = pages.div_ceil(self.core.cfg.slab_pages.max(1));
        self.core.placements.adopt_homes(ns, slabs)
    }

    /// Slabs of namespace `ns` with a replica on the server at `addr`.
    pub fn slabs_on(&self, ns: u64, addr: SocketAddr) -> Vec<u64> {
        match self.core.servers.index_of(addr) {
            Some(s) => self.core.slabs_on(ns, s),
            None => Vec::new(),
        }
    }

    /// STAT of `ns` on every live server, in server order (None for a dead server).
    pub fn stat(&self, ns: u64) -> Vec<Option<Result<StatInfo, ClientError>>> {
        (0..self.core.servers.len() as u16)
            .map(|s| {
                if self.core.servers.is_dead(s) {
                    None
                } else {
                    Some(self.core.blocking_stat(s, ns, None))
                }
            })
            .collect()
    }

    fn chunk(&self, start: u64, left: usize) -> usize {
        let slab = self.core.cfg.slab_pages;
        let to_slab_end = (slab - start % slab) as usize;
        left.min(MAX_PAGES_PER_FRAME).min(to_slab_end)
    }

    fn run_blocking(
        &self,
        op: TicketOp,
        ns: u64,
        io: IoBuf,
        tx: &Sender<Finished>,
        rx: &Receiver<Finished>,
    ) -> Result<Finished, ClientError> {
        self.core
            .submit(
                job(op, ns, Priority::Demand, io, 0),
                Reply::Channel(tx.clone()),
                Receive::Background,
            )
            .map_err(|(e, _)| e)?;
        Ok(self.wait_completion(rx))
    }

    /// Closes every connection now, as dropping the last handle does, while other holders
    /// may still read the client's statistics: a server that goes away after this is not
    /// taken for a failure (a VM's embedded memserver stopped at its teardown).
    pub fn close_connections(&self) {
        self.core.close_all();
    }

    /// Takes every server out of service and stops the maintenance thread.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.core.health.stop();
        if let Some(t) = self.maint.take() {
            let _ = t.join();
        }
        self.core.close_all();
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn job(op: impl Into<TicketOp>, ns: u64, priority: Priority, io: IoBuf, user_data: u64) -> Job {
    Job {
        op: op.into(),
        ns,
        priority,
        io,
        user_data,
    }
}

impl From<Op> for TicketOp {
    fn from(op: Op) -> Self {
        match op {
            Op::Read => TicketOp::Read,
            Op::Write => TicketOp::Write,
        }
    }
}

/// Points the external buffer `io` at the consecutive pages `start..` in `chunk`.
fn set_external_run(io: &mut IoBuf, start: u64, chunk: &mut [u8]) -> Result<(), ClientError> {
    let n = chunk.len() / PAGE_SIZE;
    let base = chunk.as_mut_ptr();
    // SAFETY: a pointer into `chunk`; only a null pointer is refused.
    let first = unsafe { PageBuf::new(base) }.ok_or(ClientError::InvalidRequest("null buffer"))?;
    let mut pages = [0u64; MAX_PAGES_PER_FRAME];
    let mut bufs = [first; MAX_PAGES_PER_FRAME];
    for i in 0..n {
        pages[i] = start + i as u64;
        // SAFETY: page `i` of `chunk` (i < n), not null since `base` is not.
        bufs[i] = unsafe { PageBuf::new(base.add(i * PAGE_SIZE)) }.unwrap_or(first);
    }
    // SAFETY: `chunk` is borrowed mutably by the caller across the whole blocking request,
    // which finishes before the caller touches it again.
    unsafe { io.set_external(&pages[..n], &bufs[..n]) }
}

fn check_len(bytes: usize) -> Result<usize, ClientError> {
    if bytes == 0 || !bytes.is_multiple_of(PAGE_SIZE) {
        return Err(ClientError::InvalidRequest(
            "buffer length must be a non-zero multiple of 4096",
        ));
    }
    Ok(bytes / PAGE_SIZE)
}
