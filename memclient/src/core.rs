//! The client core: one submit path from a request to its replicas' connections, and the
//! completion logic that turns the replicas' answers into one result (read fail-over, write
//! acknowledgement by every live replica) and hands it to where the request's reply goes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, MutexGuard, Weak};

use crossbeam_channel::Receiver;
use farvm_memproto::{StatInfo, MAX_PAGES_PER_FRAME};
use farvm_seal::KeyRing;
use farvm_transport::Endpoint;

use crate::config::{ClientConfig, Lane};
use crate::connection::{self, ConnLimits, Link, LinkSpec, SendMode, Sink};
use crate::health::Health;
use crate::iobuf::Shape;
use crate::placement::{Placement, Placements, SlabKey};
use crate::servers::Servers;
use crate::tickets::{deliver, InternalDone, Reply, Ticket, TicketOp, Tickets, MAX_REPLICAS};
use crate::{ClientError, IoBuf, Priority};

/// One request as the core handles it.
pub(crate) struct Job {
    pub op: TicketOp,
    pub ns: u64,
    pub priority: Priority,
    pub io: IoBuf,
    pub user_data: u64,
}

/// Who receives a request's response off the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Receive {
    /// The connection's background receiver (woken on submit).
    Background,
    /// The submitter's poller ([`crate::Client::wait_completion`]); the background receiver is
    /// not woken.
    Polled,
    /// The submitting thread, right away ([`crate::Client::submit_wait`]): a demand read, sent
    /// on the demand lane.
    Inline,
}

pub(crate) struct Core {
    pub cfg: ClientConfig,
    /// Replication factor.
    pub r: usize,
    pub servers: Servers,
    pub tickets: Arc<Tickets>,
    pub placements: Placements,
    pub health: Health,
    /// Read responses whose sealed pages failed authentication (`ClientError::Unauthentic`).
    pub unauthentic: AtomicU64,
    /// The page keys every connection seals and opens with (`ClientConfig::page_key`, then
    /// rotations); `None`: pages are not sealed.
    pub keys: Option<Arc<KeyRing>>,
}

/// The sink of one connection: the client, and the connection set it belongs to.
struct SinkRef(Weak<Core>, u32);

impl Sink for SinkRef {
    fn complete(&self, ticket: u32, server: u16, outcome: Result<u32, ClientError>) {
        if let Some(c) = self.0.upgrade() {
            c.on_complete_from(ticket, server, Some(self.1), Some(outcome));
        }
    }
    fn connection_failed(&self, server: u16) {
        if let Some(c) = self.0.upgrade() {
            c.mark_dead_from(server, Some(self.1));
        }
    }
}

impl Core {
    /// The core for `cfg` (checked), with no connection open yet.
    pub fn new(cfg: ClientConfig, health: Health) -> Result<Self, ClientError> {
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
        if cfg.pool_placement && cfg.slab_homes.is_empty() {
            return Err(ClientError::InvalidRequest(
                "pool placement needs the pool's slab homes",
            ));
        }
        Ok(Self {
            r,
            unauthentic: AtomicU64::new(0),
            keys: cfg.page_key.clone().map(|k| Arc::new(KeyRing::new(k))),
            servers: Servers::new(&cfg.servers, cfg.write_lane, cfg.demand_lane),
            tickets: Arc::new(Tickets::new(cfg.max_requests)),
            placements: Placements::new(
                u64::from_le_bytes(farvm_memproto::auth::random_bytes::<8>()),
                cfg.slab_homes.clone(),
                cfg.pool_placement,
            ),
            health,
            cfg,
        })
    }

    pub fn addr(&self, s: u16) -> SocketAddr {
        self.endpoint(s).addr
    }

    /// Server `s`'s address and transport (slot `s` whether in use yet or not).
    pub fn endpoint(&self, s: u16) -> Endpoint {
        self.servers
            .slot(s)
            .map_or(Endpoint::tcp(SocketAddr::from(([0, 0, 0, 0], 0))), |st| {
                st.endpoint()
            })
    }

    /// Opens every connection to server `s` (bulk, then the write and demand lanes), as
    /// connection set `generation`.
    pub fn connect_server(
        self: &Arc<Self>,
        s: u16,
        generation: u32,
    ) -> Result<Arc<[Arc<dyn Link>]>, ClientError> {
        let spec = LinkSpec {
            addr: self.endpoint(s).addr,
            server: s,
            secret: self.cfg.secret.as_ref(),
            limits: ConnLimits {
                window: self.cfg.window,
                demand_reserve: self.cfg.demand_reserve,
                depth: self.cfg.depth,
                timeout: self.cfg.timeout,
            },
            connect_timeout: self.cfg.connect_timeout,
            transport: self.endpoint(s).transport,
            demand_poll: self.cfg.demand_poll,
            keys: self.keys.as_ref(),
        };
        let n = self.cfg.conns_total();
        let mut conns = Vec::with_capacity(n);
        for _ in 0..n {
            let sink: Arc<dyn Sink> = Arc::new(SinkRef(Arc::downgrade(self), generation));
            match connection::connect(&spec, self.tickets.clone(), sink) {
                Ok(c) => conns.push(c),
                Err(e) => {
                    for c in conns.drain(..) {
                        c.close();
                    }
                    return Err(e);
                }
            }
        }
        Ok(conns.into())
    }

    /// The first replica of `p` that can serve reads — in service and not being filled —
    /// other than `except`.
    pub fn live_source(&self, p: &Placement, except: Option<u16>) -> Option<u16> {
        p.servers()
            .iter()
            .enumerate()
            .find(|&(i, &s)| Some(s) != except && !p.is_filling(i) && !self.servers.is_dead(s))
            .map(|(_, &s)| s)
    }

    /// Sends ticket `ticket` to server `s` on a connection of `lane`.
    fn send_to(
        &self,
        s: u16,
        ticket: u32,
        prio: Priority,
        lane: Lane,
        mode: SendMode,
    ) -> Result<Arc<dyn Link>, ClientError> {
        if self.servers.is_dead(s) {
            return Err(ClientError::Disconnected);
        }
        let c = self
            .servers
            .pick_conn(s, lane)
            .ok_or(ClientError::Disconnected)?;
        c.submit(ticket, prio, mode)?;
        Ok(c)
    }

    /// The one submit path: places `job`'s slab (a write to a slab never written places it),
    /// sends a read to its first readable replica and a write or discard to every established
    /// one; the result goes to `reply`. Returns the connection a read went to when the
    /// caller receives inline ([`Receive::Inline`]). On `Err` nothing was sent and the buffer
    /// is handed back.
    #[allow(clippy::result_large_err)]
    pub fn submit(
        &self,
        job: Job,
        reply: Reply,
        receive: Receive,
    ) -> Result<Option<Arc<dyn Link>>, (ClientError, IoBuf)> {
        let Job {
            op,
            ns,
            priority: prio,
            mut io,
            user_data,
        } = job;
        let mode = match receive {
            _ if connection::on_receive_side() => SendMode::Deferred,
            Receive::Background => SendMode::Caller,
            Receive::Polled | Receive::Inline => SendMode::CallerReceives,
        };
        if io.is_empty() || op == TicketOp::Stat {
            return Err((ClientError::InvalidRequest("empty page selection"), io));
        }
        let slab_pages = self.cfg.slab_pages;
        let slab = io.page_index(0) / slab_pages;
        let same_slab = match io.shape() {
            Shape::Run { start } => (start + io.len() as u64 - 1) / slab_pages == slab,
            Shape::Scatter => io.indices().iter().all(|p| p / slab_pages == slab),
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
        let placed = self
            .placements
            .lookup(key)
            .filter(|p| p.n > 0 || op == TicketOp::Read);
        let placement = match (op, placed) {
            (TicketOp::Write, None) => {
                match self
                    .placements
                    .place(&self.servers, key, self.r, slab_pages)
                {
                    Some(p) => p,
                    None => {
                        self.abandon(tn);
                        return Err((ClientError::NoLiveReplica, io));
                    }
                }
            }
            (_, Some(p)) => p,
            // Never written: every page absent / nothing to discard, no server involved.
            (_, None) => {
                self.abandon(tn);
                io.clear_present();
                deliver(reply, user_data, io, Ok(0), u16::MAX);
                return Ok(None);
            }
        };
        let mut t = self.tickets.lock(tn);
        t.prio = prio;
        t.user_data = user_data;
        t.io = Some(io);
        t.reply = reply;
        if op == TicketOp::Read {
            let n = placement.established(&mut t.replicas);
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
            let first = t.replicas[0];
            drop(t);
            let inline = receive == Receive::Inline;
            let lane = if inline { Lane::Demand } else { Lane::Bulk };
            return match self.send_to(first, tn, prio, lane, mode) {
                Ok(c) => Ok(inline.then_some(c)),
                Err(e) => {
                    self.on_complete(tn, first, Some(Err(e)));
                    Ok(None)
                }
            };
        }
        // Write or discard: every established replica (a filling replica gets the page later
        // from the copier, see `health::recovery`).
        let targets = if placement.filling != 0 {
            self.register_fill(key, &mut t).unwrap_or(placement)
        } else {
            placement
        };
        let mut n = targets.established(&mut t.replicas);
        if self.cfg.fault.is_some() {
            n = self.skip_deaf(key, &mut t.replicas, n);
        }
        t.nrep = n as u8;
        // One extra count guards against completions arriving before every send is issued.
        t.pending = n as u8 + 1;
        let replicas = t.replicas;
        drop(t);
        let lane = if op == TicketOp::Write {
            Lane::Write
        } else {
            Lane::Bulk
        };
        for &s in &replicas[..n] {
            if let Err(e) = self.send_to(s, tn, prio, lane, mode) {
                self.on_complete(tn, s, Some(Err(e)));
            }
        }
        self.on_complete(tn, u16::MAX, None);
        Ok(None)
    }

    /// `Fault::StaleCopy` (tests only): leaves the deaf replica of slab `key` out of a write's
    /// `n` replicas, without counting it as missed, while another remains; returns how many
    /// remain.
    fn skip_deaf(&self, key: SlabKey, replicas: &mut [u16; MAX_REPLICAS], n: usize) -> usize {
        let deaf = *self
            .health
            .fault_deaf
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match deaf {
            Some((k, s)) if k == key && n > 1 => match replicas[..n].iter().position(|&x| x == s) {
                Some(i) => {
                    replicas.copy_within(i + 1..n, i);
                    n - 1
                }
                None => n,
            },
            _ => n,
        }
    }

    fn abandon(&self, tn: u32) {
        let mut t = self.tickets.lock(tn);
        t.reset();
        t.seq += 1;
        drop(t);
        self.tickets.release(tn);
    }

    /// For a write/discard to a slab being filled: records the pages as dirty for the copier
    /// and returns the current placement (re-read under the fill lock, which every change of
    /// a filling replica takes: see `fills`).
    fn register_fill(&self, key: SlabKey, t: &mut Ticket) -> Option<Placement> {
        let mut fills = self.placements.lock_fills();
        let p = self.placements.lookup(key)?;
        if p.filling == 0 {
            return Some(p);
        }
        if let Some(fs) = fills.current_mut(key) {
            if let Some(io) = t.io.as_ref() {
                fs.dirty.extend(io.indices().iter().copied());
            }
            fs.inflight += 1;
            t.in_fill = true;
            t.fill_id = fs.id;
        }
        Some(p)
    }

    /// One replica answered (`Some(outcome)`), or the submission guard is released (`None`).
    pub fn on_complete(&self, tn: u32, server: u16, outcome: Option<Result<u32, ClientError>>) {
        self.on_complete_from(tn, server, None, outcome);
    }

    /// [`Core::on_complete`] for an answer that came on connection set `generation`.
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
            TicketOp::Stat => {
                let r = outcome.unwrap_or(Err(ClientError::NoLiveReplica));
                self.finish(tn, t, r);
            }
            TicketOp::Read => match outcome {
                Some(Ok(n)) => {
                    let gone =
                        t.lost_slab && t.io.as_ref().is_some_and(|io| (n as usize) < io.len());
                    self.finish(tn, t, if gone { Err(ClientError::Lost) } else { Ok(n) });
                }
                Some(Err(e))
                    if e.is_server_failure()
                        || matches!(
                            e,
                            ClientError::ChecksumMismatch | ClientError::Unauthentic
                        ) =>
                {
                    if e == ClientError::Unauthentic {
                        // Not transient, unlike a checksum: the copy is forged, misplaced or
                        // stale. It leaves the slab (re-replicated from a good one), as a copy
                        // the engine finds stale does (docs/sealing.md).
                        self.unauthentic.fetch_add(1, Ordering::Relaxed);
                        let key = (t.ns, t.slab);
                        tracing::error!(
                            server = %self.endpoint(server).addr,
                            ns = key.0,
                            first_page = t.io.as_ref().map_or(0, |io| io.page_index(0)),
                            "a sealed page failed authentication (altered, misplaced or stale on \
                             the memory server): not delivered; its replica leaves the slab"
                        );
                        drop(t);
                        self.reject_replica(key, server);
                        t = self.tickets.lock(tn);
                    }
                    let prio = t.prio;
                    loop {
                        t.attempt += 1;
                        if t.attempt >= t.nrep {
                            let err = match e {
                                ClientError::ChecksumMismatch => e,
                                // No authentic copy: the page is gone for good.
                                ClientError::Unauthentic => ClientError::Lost,
                                _ => ClientError::NoLiveReplica,
                            };
                            self.finish(tn, t, Err(err));
                            return;
                        }
                        let s = t.replicas[t.attempt as usize];
                        // Deferred: we may be on a receiver thread, which must never block on
                        // a socket write.
                        if self
                            .send_to(s, tn, prio, Lane::Bulk, SendMode::Deferred)
                            .is_ok()
                        {
                            self.health.read_failovers.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    }
                }
                Some(Err(e)) => self.finish(tn, t, Err(e)),
                None => {}
            },
            TicketOp::Write | TicketOp::Discard => {
                t.pending = t.pending.saturating_sub(1);
                match outcome {
                    Some(Ok(n)) => {
                        t.acked += 1;
                        t.count = t.count.max(n);
                    }
                    Some(Err(e)) if e.is_server_failure() => t.mark_missed(server),
                    Some(Err(e)) => {
                        if e == ClientError::CapacityExhausted {
                            // Re-placed off the full server; the caller's retry lands there.
                            self.report_full((t.ns, t.slab), server);
                        }
                        t.err.get_or_insert(e);
                    }
                    None => {}
                }
                if t.pending == 0 {
                    let r = if let Some(e) = t.err {
                        Err(e)
                    } else if t.acked == 0 {
                        Err(ClientError::NoLiveReplica)
                    } else if t.in_fill {
                        Ok(0)
                    } else {
                        Ok(t.count)
                    };
                    let key = (t.ns, t.slab);
                    if t.in_fill {
                        if let Some(fs) = self.placements.lock_fills().by_id_mut(key, t.fill_id) {
                            fs.inflight = fs.inflight.saturating_sub(1);
                        }
                    }
                    if t.acked > 0 && t.missed != 0 {
                        // Before anyone hears of the write: no later read may go to a replica
                        // that lacks it.
                        let mut missed = [0u16; MAX_REPLICAS];
                        let n = t.missed_servers(&mut missed);
                        self.drop_missed(key, &missed[..n]);
                    }
                    self.finish(tn, t, r);
                }
            }
        }
    }

    fn finish(&self, tn: u32, mut t: MutexGuard<'_, Ticket>, r: Result<u32, ClientError>) {
        let reply = std::mem::replace(&mut t.reply, Reply::None);
        let io = t.io.take();
        let (user_data, stat) = (t.user_data, t.stat);
        let server = if t.op == TicketOp::Read && t.attempt < t.nrep {
            t.replicas[t.attempt as usize]
        } else {
            u16::MAX
        };
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
            (reply, Some(io)) => deliver(reply, user_data, io, r, server),
            _ => {}
        }
    }

    /// STAT of namespace `ns` on server `s`, or on the connection `on` (a server not in
    /// service yet, see `health::rejoin`).
    pub fn blocking_stat(
        &self,
        s: u16,
        ns: u64,
        on: Option<&dyn Link>,
    ) -> Result<StatInfo, ClientError> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let tn = self.tickets.alloc().ok_or(ClientError::QueueFull)?;
        {
            let mut t = self.tickets.lock(tn);
            t.reset();
            t.op = TicketOp::Stat;
            t.ns = ns;
            t.reply = Reply::Internal(tx);
        }
        let sent = match on {
            Some(c) => c.submit(tn, Priority::Demand, SendMode::Caller),
            None => self
                .send_to(s, tn, Priority::Prefetch, Lane::Bulk, SendMode::Caller)
                .map(|_| ()),
        };
        if let Err(e) = sent {
            self.on_complete(tn, s, Some(Err(e)));
        }
        let d = wait_internal(&rx);
        d.result.map(|_| d.stat)
    }

    /// Blocking request on one server only (re-replication), not replicated.
    pub fn direct_io(
        &self,
        s: u16,
        op: TicketOp,
        ns: u64,
        io: IoBuf,
    ) -> (IoBuf, Result<u32, ClientError>) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let Some(tn) = self.tickets.alloc() else {
            return (io, Err(ClientError::QueueFull));
        };
        {
            let mut t = self.tickets.lock(tn);
            t.reset();
            t.op = op;
            t.ns = ns;
            t.io = Some(io);
            t.reply = Reply::Internal(tx);
            t.replicas[0] = s;
            t.nrep = 1;
            t.pending = 1;
        }
        if let Err(e) = self.send_to(s, tn, Priority::Prefetch, Lane::Bulk, SendMode::Caller) {
            self.on_complete(tn, s, Some(Err(e)));
        }
        let d = wait_internal(&rx);
        (
            d.io.unwrap_or_else(|| IoBuf::new(MAX_PAGES_PER_FRAME)),
            d.result,
        )
    }
}

/// Waits for an internal request's result. The sender lives in the request's ticket, which
/// always answers (a result, or the failure that ended the request).
fn wait_internal(rx: &Receiver<InternalDone>) -> InternalDone {
    rx.recv().unwrap_or(InternalDone {
        result: Err(ClientError::Disconnected),
        stat: StatInfo::default(),
        io: None,
    })
}
