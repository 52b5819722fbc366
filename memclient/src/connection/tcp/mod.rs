//! One pipelined TCP connection to one server.
//!
//! Up to `window` requests are in flight; more wait in two queues, and a queued demand request
//! always goes before queued prefetches. Prefetches may use only `window - demand_reserve`
//! slots, so a demand read never waits behind a full window of prefetches.
//!
//! Threads: the submitting thread writes its request itself when it may go at once (no
//! thread hop on the fast path); a sender thread drains the queues and enforces timeouts; a
//! receiver thread reads responses nobody receives inline, lands read pages in the ticket's
//! buffer ([`super::recv`]) and reports to the [`Sink`]. The receiver never writes to the
//! socket, so a full socket buffer cannot deadlock it.
//!
//! A slot whose response header has been read is *receiving*: its pages are landing in the
//! request's buffer, so only the receiving thread may finish it (a failure or timeout
//! elsewhere breaks the socket, and the receiver then reports the slot as failed). A read's
//! pages are marked present only once every page of the frame has landed and passed its
//! crc32c check: a request cut short or with a bad page reports no page present.

use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod receive;

use farvm_memproto::frame::{header_bytes, Opcode, FLAG_SCATTER, HEADER_LEN, MAX_BODY, WIRE_PAGE};
use farvm_memproto::{PageSel, Status, MAX_PAGES_PER_FRAME};

use super::handshake::{handshake, io_err};
use super::recv::RecvBuf;
use super::{ConnLimits, Link, LinkSpec, SendMode, Sink};
use crate::tickets::{Ticket, TicketOp, Tickets};
use crate::{ClientError, Priority};

#[derive(Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    Queued,
    InFlight,
    /// Its response header was read; the receiving thread is landing the body.
    Receiving,
}

#[derive(Clone, Copy)]
struct Slot {
    state: SlotState,
    req_id: u64,
    ticket: u32,
    deadline: Instant,
}

struct Sched {
    slots: Vec<Slot>,
    free: Vec<u16>,
    demand: VecDeque<u16>,
    prefetch: VecDeque<u16>,
    inflight: usize,
    generation: u64,
    broken: bool,
}

/// The receive side: the socket's receive buffer and the crc32c values of a landing.
struct Rx {
    buf: RecvBuf,
    crcs: Box<[[u8; 4]; MAX_PAGES_PER_FRAME]>,
}

/// How long one blocking receive on the socket may wait (`SO_RCVTIMEO`) before the inline
/// waiter re-checks whether its request completed elsewhere (fail-over to another server).
pub(crate) const RX_SLICE: Duration = Duration::from_millis(1);

struct Writer {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// A TCP connection (see module docs).
pub(crate) struct TcpLink {
    server: u16,
    limits: ConnLimits,
    sched: Mutex<Sched>,
    cv: Condvar,
    writer: Mutex<Writer>,
    tickets: Arc<Tickets>,
    sink: Arc<dyn Sink>,
    broken: AtomicBool,
    /// Requests in flight (mirror of `Sched::inflight`, read without the lock).
    inflight_hint: AtomicUsize,
    /// The receive side; held by whoever is reading (background receiver or inline waiter).
    rx: Mutex<Rx>,
    /// Threads receiving inline right now.
    inline_active: AtomicUsize,
    rx_park: Mutex<()>,
    rx_cv: Condvar,
    rx_parked: AtomicBool,
    fd: RawFd,
    /// Owns the socket `fd` refers to; also shuts it down.
    stream: TcpStream,
    /// Read pages' bytes (with their crc32c) copied from the receive buffer / received in
    /// place, since the connection opened.
    landed_copied: AtomicU64,
    landed_in_place: AtomicU64,
}

impl TcpLink {
    /// Connects, authenticates and starts the sender and receiver threads.
    pub fn connect(
        spec: &LinkSpec<'_>,
        tickets: Arc<Tickets>,
        sink: Arc<dyn Sink>,
    ) -> Result<Arc<Self>, ClientError> {
        let (addr, server) = (spec.addr, spec.server);
        let err = io_err(addr);
        let mut stream = TcpStream::connect_timeout(&addr, spec.connect_timeout).map_err(&err)?;
        stream.set_nodelay(true).map_err(&err)?;
        handshake(&mut stream, addr, spec.secret, spec.connect_timeout)?;
        let limits = spec.limits;
        let depth = limits.depth.clamp(1, u16::MAX as usize);
        let limits = ConnLimits {
            window: limits.window.clamp(1, depth),
            demand_reserve: limits.demand_reserve.min(limits.window.saturating_sub(1)),
            depth,
            timeout: limits.timeout,
        };
        let now = Instant::now();
        stream.set_read_timeout(Some(RX_SLICE)).map_err(&err)?;
        let fd = stream.as_raw_fd();
        let conn = Arc::new(Self {
            server,
            limits,
            sched: Mutex::new(Sched {
                slots: vec![
                    Slot {
                        state: SlotState::Free,
                        req_id: 0,
                        ticket: 0,
                        deadline: now,
                    };
                    depth
                ],
                free: (0..depth as u16).rev().collect(),
                demand: VecDeque::with_capacity(depth),
                prefetch: VecDeque::with_capacity(depth),
                inflight: 0,
                generation: 1,
                broken: false,
            }),
            cv: Condvar::new(),
            writer: Mutex::new(Writer {
                stream: stream.try_clone().map_err(&err)?,
                buf: Vec::with_capacity(HEADER_LEN + MAX_BODY),
            }),
            tickets,
            sink,
            broken: AtomicBool::new(false),
            inflight_hint: AtomicUsize::new(0),
            rx: Mutex::new(Rx {
                buf: RecvBuf::new(fd, 2 * MAX_PAGES_PER_FRAME),
                crcs: Box::new([[0; 4]; MAX_PAGES_PER_FRAME]),
            }),
            inline_active: AtomicUsize::new(0),
            rx_park: Mutex::new(()),
            rx_cv: Condvar::new(),
            rx_parked: AtomicBool::new(false),
            fd,
            stream,
            landed_copied: AtomicU64::new(0),
            landed_in_place: AtomicU64::new(0),
        });
        let c = conn.clone();
        std::thread::Builder::new()
            .name(format!("memclient-rx-{server}"))
            .spawn(move || c.receive_loop())
            .map_err(&err)?;
        let c = conn.clone();
        std::thread::Builder::new()
            .name(format!("memclient-tx-{server}"))
            .spawn(move || c.send_loop())
            .map_err(&err)?;
        Ok(conn)
    }

    fn sched(&self) -> MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn encode_request(buf: &mut Vec<u8>, req_id: u64, t: &Ticket) {
        let ns = t.ns;
        let Some(io) = t.io.as_ref() else {
            // Stat carries no buffer.
            let h = header_bytes(Opcode::Stat, 0, Status::Ok, req_id, ns, 0, 0);
            buf.extend_from_slice(&h);
            return;
        };
        let sel = io.sel();
        let n = sel.len();
        let (sel_len, flags) = match sel {
            PageSel::Run { .. } => (8, 0),
            PageSel::Scatter(b) => (b.len(), FLAG_SCATTER),
        };
        let (op, body_len) = match t.op {
            TicketOp::Read => (Opcode::Read, sel_len),
            TicketOp::Discard => (Opcode::Discard, sel_len),
            TicketOp::Write => (Opcode::Write, sel_len + n * WIRE_PAGE),
            TicketOp::Stat => {
                let h = header_bytes(Opcode::Stat, 0, Status::Ok, req_id, ns, 0, 0);
                buf.extend_from_slice(&h);
                return;
            }
        };
        buf.extend_from_slice(&header_bytes(
            op,
            flags,
            Status::Ok,
            req_id,
            ns,
            n as u32,
            body_len,
        ));
        match sel {
            PageSel::Run { start, .. } => buf.extend_from_slice(&start.to_le_bytes()),
            PageSel::Scatter(b) => buf.extend_from_slice(b),
        }
        if t.op == TicketOp::Write {
            for i in 0..n {
                buf.extend_from_slice(&io.crc(i).to_le_bytes());
                buf.extend_from_slice(io.page(i));
            }
        }
    }

    /// Writes one request; on failure the connection is torn down.
    fn send(&self, req_id: u64, ticket: u32) {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let w = &mut *w;
        w.buf.clear();
        {
            let t = self.tickets.lock(ticket);
            Self::encode_request(&mut w.buf, req_id, &t);
        }
        if let Err(e) = w.stream.write_all(&w.buf) {
            tracing::warn!(server = self.server, "send failed: {e}");
            self.fail_all();
        }
    }

    /// Marks the connection broken and fails every outstanding request, except one being
    /// received: its receiver finishes it (the socket is shut down, so that is at once).
    fn fail_all(&self) {
        let mut failed: Vec<u32> = Vec::new();
        {
            let mut s = self.sched();
            if s.broken {
                return;
            }
            s.broken = true;
            self.broken.store(true, Ordering::Release);
            let mut receiving = 0;
            for i in 0..s.slots.len() {
                match s.slots[i].state {
                    SlotState::Free => {}
                    SlotState::Receiving => receiving += 1,
                    SlotState::Queued | SlotState::InFlight => {
                        failed.push(s.slots[i].ticket);
                        s.slots[i].state = SlotState::Free;
                    }
                }
            }
            s.demand.clear();
            s.prefetch.clear();
            s.inflight = receiving;
            self.inflight_hint.store(receiving, Ordering::SeqCst);
        }
        self.cv.notify_all();
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.wake_rx();
        self.sink.connection_failed(self.server);
        for t in failed {
            self.sink
                .complete(t, self.server, Err(ClientError::Disconnected));
        }
    }

    fn send_loop(self: Arc<Self>) {
        let tick =
            (self.limits.timeout / 4).clamp(Duration::from_millis(1), Duration::from_millis(50));
        let mut expired: Vec<u32> = Vec::with_capacity(self.limits.depth);
        loop {
            let mut s = self.sched();
            if s.broken {
                return;
            }
            let next = if !s.demand.is_empty() && s.inflight < self.limits.window {
                s.demand.pop_front()
            } else if !s.prefetch.is_empty()
                && s.inflight < self.limits.window - self.limits.demand_reserve
            {
                s.prefetch.pop_front()
            } else {
                None
            };
            if let Some(slot) = next {
                let sl = &mut s.slots[slot as usize];
                sl.state = SlotState::InFlight;
                // The timeout runs from when the request is sent: time spent queued behind
                // other requests says nothing about the server's health.
                sl.deadline = Instant::now() + self.limits.timeout;
                let (req_id, ticket) = (sl.req_id, sl.ticket);
                s.inflight += 1;
                self.inflight_hint.store(s.inflight, Ordering::SeqCst);
                drop(s);
                self.send(req_id, ticket);
                self.wake_rx();
                continue;
            }
            let (mut s, _) = self
                .cv
                .wait_timeout(s, tick)
                .unwrap_or_else(|e| e.into_inner());
            // Timeouts: sent requests not answered within the deadline. Queued ones wait for
            // the window; if the server hangs, the in-flight ones time out first, the server
            // is taken out of service and the queued ones fail with the connection.
            let now = Instant::now();
            let Sched {
                slots,
                free,
                inflight,
                ..
            } = &mut *s;
            let mut stuck_receiving = false;
            for (i, sl) in slots.iter_mut().enumerate() {
                if sl.deadline > now {
                    continue;
                }
                match sl.state {
                    SlotState::InFlight => {
                        *inflight -= 1;
                        sl.state = SlotState::Free;
                        free.push(i as u16);
                        expired.push(sl.ticket);
                    }
                    // Its body stopped arriving: only breaking the socket ends the receive.
                    SlotState::Receiving => stuck_receiving = true,
                    SlotState::Free | SlotState::Queued => {}
                }
            }
            self.inflight_hint.store(*inflight, Ordering::SeqCst);
            drop(s);
            if !expired.is_empty() {
                tracing::warn!(
                    server = self.server,
                    n = expired.len(),
                    "requests timed out"
                );
                for t in expired.drain(..) {
                    self.sink
                        .complete(t, self.server, Err(ClientError::Timeout));
                }
            }
            if stuck_receiving {
                tracing::warn!(
                    server = self.server,
                    "a response stopped arriving mid-frame; closing"
                );
                self.fail_all();
            }
        }
    }
}

impl Link for TcpLink {
    fn submit(&self, ticket: u32, prio: Priority, mode: SendMode) -> Result<(), ClientError> {
        let mut s = self.sched();
        if s.broken {
            return Err(ClientError::Disconnected);
        }
        let Some(slot) = s.free.pop() else {
            return Err(ClientError::QueueFull);
        };
        s.generation += 1;
        let req_id = s.generation << 16 | slot as u64;
        let can_go = match prio {
            Priority::Demand => s.demand.is_empty() && s.inflight < self.limits.window,
            Priority::Prefetch => {
                s.demand.is_empty()
                    && s.prefetch.is_empty()
                    && s.inflight < self.limits.window - self.limits.demand_reserve
            }
        };
        let go = mode != SendMode::Deferred && can_go;
        s.slots[slot as usize] = Slot {
            state: if go {
                SlotState::InFlight
            } else {
                SlotState::Queued
            },
            req_id,
            ticket,
            deadline: Instant::now() + self.limits.timeout,
        };
        if go {
            s.inflight += 1;
            self.inflight_hint.store(s.inflight, Ordering::SeqCst);
            drop(s);
            self.send(req_id, ticket);
            if mode == SendMode::Caller {
                self.wake_rx();
            }
        } else {
            match prio {
                Priority::Demand => s.demand.push_back(slot),
                Priority::Prefetch => s.prefetch.push_back(slot),
            }
            drop(s);
            self.cv.notify_one();
        }
        Ok(())
    }

    fn receive_inline(&self, done: &dyn Fn() -> bool, handoff: bool) {
        self.receive_on_this_thread(done, handoff);
    }

    fn inflight(&self) -> usize {
        self.inflight_hint.load(Ordering::SeqCst)
    }

    fn landed(&self) -> (u64, u64) {
        (
            self.landed_copied.load(Ordering::Relaxed),
            self.landed_in_place.load(Ordering::Relaxed),
        )
    }

    fn outstanding(&self) -> usize {
        let s = self.sched();
        self.limits.depth - s.free.len()
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    fn close(&self) {
        self.fail_all();
    }

    /// A one-line account of this connection if a request has been in flight for `stale` or
    /// longer, else `None`: what each side is doing and how many bytes sit unread in the
    /// socket (the client is not receiving) or unsent (the server is not reading). Logged by
    /// the maintenance thread, so a stall says where it is before the timeout ends it.
    fn stall_report(&self, stale: Duration) -> Option<String> {
        let s = self.sched();
        let now = Instant::now();
        let oldest = s
            .slots
            .iter()
            .filter(|sl| matches!(sl.state, SlotState::InFlight | SlotState::Receiving))
            .map(|sl| {
                self.limits
                    .timeout
                    .saturating_sub(sl.deadline.saturating_duration_since(now))
            })
            .max()?;
        if oldest < stale {
            return None;
        }
        let (inflight, demand, prefetch) = (s.inflight, s.demand.len(), s.prefetch.len());
        drop(s);
        let (mut unread, mut unsent): (libc::c_int, libc::c_int) = (-1, -1);
        // SAFETY: FIONREAD / TIOCOUTQ on our own open socket write one c_int each into the
        // locals passed; failures leave -1.
        unsafe {
            libc::ioctl(self.fd, libc::FIONREAD, &mut unread);
            libc::ioctl(self.fd, libc::TIOCOUTQ, &mut unsent);
        }
        Some(format!(
            "oldest request in flight for {oldest:.1?}; {inflight} in flight, {demand} demand + \
             {prefetch} prefetch queued; socket: {unread} B unread, {unsent} B unsent; send side \
             {}, receive side {} ({} receiving inline, background receiver {})",
            if self.writer.try_lock().is_ok() {
                "idle"
            } else {
                "busy"
            },
            if self.rx.try_lock().is_ok() {
                "idle"
            } else {
                "held"
            },
            self.inline_active.load(Ordering::SeqCst),
            if self.rx_parked.load(Ordering::SeqCst) {
                "parked"
            } else {
                "running"
            },
        ))
    }
}
