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

use farvm_memproto::frame::{
    decode_body, decode_header, header_bytes, read_resp_bitmap_len, read_resp_present, Body, Frame,
    Header, Opcode, FLAG_SCATTER, HEADER_LEN, MAX_BODY, WIRE_PAGE,
};
use farvm_memproto::{page_crc, PageSel, Status, MAX_PAGES_PER_FRAME, PAGE_SIZE};

use super::handshake::{handshake, io_err};
use super::recv::{whole_frame_in, RecvBuf, Wait};
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

/// How reading a frame ended for the connection.
enum FrameEnd {
    /// Read whole; the connection goes on.
    Next,
    /// The stream failed or carried a malformed frame: the connection is done.
    Failed,
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

    /// Claims the slot of response `req_id` for receiving: its ticket, or `None` for a late
    /// answer to a request that already timed out (dropped).
    fn claim(&self, req_id: u64) -> Option<(usize, u32)> {
        let slot = (req_id & 0xffff) as usize;
        let mut s = self.sched();
        match s.slots.get_mut(slot) {
            Some(sl) if sl.req_id == req_id && sl.state == SlotState::InFlight => {
                sl.state = SlotState::Receiving;
                Some((slot, sl.ticket))
            }
            _ => None,
        }
    }

    /// Frees a receiving slot and reports its ticket's outcome (once: only the thread that
    /// claimed the slot finishes it).
    fn finish_slot(&self, slot: usize, ticket: u32, outcome: Result<u32, ClientError>) {
        let (owned, queued) = {
            let mut s = self.sched();
            let owned = s.slots[slot].state == SlotState::Receiving;
            if owned {
                s.slots[slot].state = SlotState::Free;
                s.free.push(slot as u16);
                s.inflight -= 1;
                self.inflight_hint.store(s.inflight, Ordering::SeqCst);
            }
            (
                owned,
                !s.broken && (!s.demand.is_empty() || !s.prefetch.is_empty()),
            )
        };
        // Wake the sender only when a freed window slot lets a queued request go.
        if queued {
            self.cv.notify_one();
        }
        if owned {
            self.sink.complete(ticket, self.server, outcome);
        }
    }

    /// Reads one frame (the caller holds the receive side): lands a read's pages in its
    /// ticket's buffer, applies any other response, and reports the outcome.
    fn read_one(&self, rx: &mut Rx) -> bool {
        if rx.buf.buffered().is_empty() {
            match rx.buf.fill(Wait::Patient) {
                Ok(0) => {
                    self.stream_failed(Some("connection closed by the server".into()));
                    return false;
                }
                Ok(_) => {}
                Err(e) => {
                    self.stream_failed(Some(e.to_string()));
                    return false;
                }
            }
        }
        if let Err(e) = rx.buf.ensure(HEADER_LEN) {
            self.stream_failed(Some(e.to_string()));
            return false;
        }
        let header = rx
            .buf
            .buffered()
            .first_chunk::<HEADER_LEN>()
            .map(decode_header);
        let Some(Ok(h)) = header else {
            self.stream_failed(None);
            return false;
        };
        rx.buf.consume(HEADER_LEN);
        let Some((slot, ticket)) = self.claim(h.req_id) else {
            // A late answer to a request that already timed out: drop it.
            if let Err(e) = rx.buf.skip(h.body_len as usize) {
                self.stream_failed(Some(e.to_string()));
                return false;
            }
            return true;
        };
        let (outcome, end) = if h.opcode == Opcode::ReadResp && h.status == Status::Ok {
            self.receive_pages(rx, &h, ticket)
        } else {
            self.receive_small(rx, &h, ticket)
        };
        match end {
            FrameEnd::Next => {
                self.finish_slot(slot, ticket, outcome);
                true
            }
            FrameEnd::Failed => {
                self.finish_slot(slot, ticket, Err(ClientError::Disconnected));
                self.fail_all();
                false
            }
        }
    }

    /// The stream broke or carried garbage outside a claimed frame: fail the connection.
    fn stream_failed(&self, why: Option<String>) {
        if !self.is_broken() {
            match why {
                Some(e) => tracing::warn!(server = self.server, "connection lost: {e}"),
                None => tracing::warn!(server = self.server, "malformed response; closing"),
            }
        }
        self.fail_all();
    }

    /// A READ response's body: presence bitmap, then each present page's crc32c and bytes,
    /// landed in the ticket's buffer and checked there.
    fn receive_pages(
        &self,
        rx: &mut Rx,
        h: &Header,
        ticket: u32,
    ) -> (Result<u32, ClientError>, FrameEnd) {
        let count = h.count as usize;
        let mut bitmap = [0u8; MAX_PAGES_PER_FRAME / 8];
        let checked = read_resp_bitmap_len(h).and_then(|bl| match rx.buf.ensure(bl) {
            Ok(()) => {
                bitmap[..bl].copy_from_slice(&rx.buf.buffered()[..bl]);
                rx.buf.consume(bl);
                read_resp_present(h, &bitmap[..bl]).map(|k| Ok((bl, k)))
            }
            Err(e) => Ok(Err(e)),
        });
        let (bl, present) = match checked {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                tracing::warn!(server = self.server, "connection lost: {e}");
                return (Err(ClientError::Disconnected), FrameEnd::Failed);
            }
            Err(e) => {
                tracing::warn!(server = self.server, "malformed response ({e}); closing");
                return (Err(ClientError::Disconnected), FrameEnd::Failed);
            }
        };
        let payload = present * WIRE_PAGE;
        // Where the pages go: the ticket's buffer, if the response fits the request.
        let fits = {
            let mut t = self.tickets.lock(ticket);
            let op = t.op;
            match t.io.as_mut() {
                Some(io) if op == TicketOp::Read && io.len() == count => {
                    rx.buf.begin_landing();
                    let present_pages = (0..count).filter(|i| bitmap[i / 8] & (1 << (i % 8)) != 0);
                    for (crc, i) in rx.crcs.iter_mut().zip(present_pages) {
                        // SAFETY: the crc slot is ours (we hold the receive side) and the page
                        // is the request's buffer, which nobody else touches while its slot is
                        // receiving: the request cannot finish before we report it.
                        unsafe {
                            rx.buf.push_segment(crc.as_mut_ptr(), 4);
                            rx.buf.push_segment(io.page_ptr(i), PAGE_SIZE);
                        }
                    }
                    true
                }
                _ => false,
            }
        };
        if !fits {
            return match rx.buf.skip(payload) {
                Ok(()) => (
                    Err(ClientError::Protocol(
                        "READ response does not match the request",
                    )),
                    FrameEnd::Next,
                ),
                Err(_) => (Err(ClientError::Disconnected), FrameEnd::Failed),
            };
        }
        match rx.buf.land() {
            Ok(l) => {
                self.landed_copied.fetch_add(l.copied, Ordering::Relaxed);
                self.landed_in_place
                    .fetch_add(l.in_place, Ordering::Relaxed);
            }
            Err(e) => {
                if !self.is_broken() {
                    tracing::warn!(server = self.server, "connection lost mid-response: {e}");
                }
                if let Some(io) = self.tickets.lock(ticket).io.as_mut() {
                    io.clear_present();
                }
                return (Err(ClientError::Disconnected), FrameEnd::Failed);
            }
        }
        let mut t = self.tickets.lock(ticket);
        let Some(io) = t.io.as_mut() else {
            return (
                Err(ClientError::Protocol("read without buffer")),
                FrameEnd::Next,
            );
        };
        let intact = (0..count)
            .filter(|i| bitmap[i / 8] & (1 << (i % 8)) != 0)
            .zip(rx.crcs.iter())
            .all(|(i, crc)| page_crc(io.page(i)) == u32::from_le_bytes(*crc));
        if !intact {
            io.clear_present();
            return (Err(ClientError::ChecksumMismatch), FrameEnd::Next);
        }
        io.set_present_from(&bitmap[..bl]);
        (Ok(present as u32), FrameEnd::Next)
    }

    /// Any response but a successful READ: a short body, decoded from the buffer.
    fn receive_small(
        &self,
        rx: &mut Rx,
        h: &Header,
        ticket: u32,
    ) -> (Result<u32, ClientError>, FrameEnd) {
        let n = h.body_len as usize;
        if let Err(e) = rx.buf.ensure(n) {
            tracing::warn!(
                server = self.server,
                "connection lost or oversized response: {e}"
            );
            return (Err(ClientError::Disconnected), FrameEnd::Failed);
        }
        let outcome = match decode_body(h, &rx.buf.buffered()[..n]) {
            Ok(f) => apply_response(&mut self.tickets.lock(ticket), &f),
            Err(e) => {
                tracing::warn!(server = self.server, "malformed response ({e}); closing");
                return (Err(ClientError::Disconnected), FrameEnd::Failed);
            }
        };
        rx.buf.consume(n);
        (outcome, FrameEnd::Next)
    }

    /// Waits up to `timeout` for the socket to become readable (or fail); no lock needed.
    fn poll_readable(&self, timeout: Duration) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd on the stack for the duration of the call; the fd stays
        // open as long as `self` (it is owned by `stream`).
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        r > 0
    }

    /// Buffered data or a readable socket.
    fn readable(&self, rx: &Rx, timeout: Duration) -> bool {
        !rx.buf.buffered().is_empty() || self.poll_readable(timeout)
    }

    /// Wakes the background receiver if it is parked.
    fn wake_rx(&self) {
        if self.rx_parked.load(Ordering::SeqCst) {
            let _g = self.rx_park.lock().unwrap_or_else(|e| e.into_inner());
            self.rx_cv.notify_one();
        }
    }

    fn rx_should_park(&self) -> bool {
        self.inline_active.load(Ordering::SeqCst) > 0
            || self.inflight_hint.load(Ordering::SeqCst) == 0
    }

    /// Whether response bytes already read off the socket wait in the receive buffer (false
    /// if someone is receiving right now: they will get to them).
    fn rx_buffered(&self) -> bool {
        self.rx
            .try_lock()
            .is_ok_and(|rx| !rx.buf.buffered().is_empty())
    }

    /// The background receiver: delivers responses nobody is waiting for inline. It parks
    /// while nothing is in flight or a thread receives inline, and never holds the receive
    /// side while merely waiting for data.
    fn receive_loop(self: Arc<Self>) {
        let idle = Duration::from_millis(5);
        loop {
            if self.is_broken() {
                return;
            }
            if self.rx_should_park() {
                let g = self.rx_park.lock().unwrap_or_else(|e| e.into_inner());
                self.rx_parked.store(true, Ordering::SeqCst);
                // Re-check after announcing: a submit that raced with us either sees the
                // flag and notifies, or its in-flight count is visible here.
                if self.rx_should_park() && !self.is_broken() {
                    let _ = self.rx_cv.wait_timeout(g, idle);
                }
                self.rx_parked.store(false, Ordering::SeqCst);
                continue;
            }
            // Check the receive buffer before the socket: an inline receiver stops at its own
            // response and may leave the next ones, already read off the socket, in the
            // buffer. Polling only the socket then never sees them, and if nothing else
            // arrives on this connection their requests sit until they time out (seen: seven
            // write-backs stuck for the whole 60 s timeout, 0 bytes unread in the socket).
            if !self.rx_buffered() && !self.poll_readable(idle) {
                continue;
            }
            // `try_lock`: if an inline waiter holds the receive side it delivers this data
            // itself; blocking on the mutex here would cost it a futex wake-up per response.
            let mut rx = match self.rx.try_lock() {
                Ok(rx) => rx,
                Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => continue,
            };
            // Drain what has arrived (an inline waiter may have taken it already).
            while self.readable(&rx, Duration::ZERO) {
                if !self.read_one(&mut rx) {
                    return;
                }
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
        self.inline_active.fetch_add(1, Ordering::SeqCst);
        let mut contended = 0u32;
        while !done() && !self.is_broken() {
            let Ok(mut rx) = self.rx.try_lock() else {
                // Someone else is receiving on this connection and will deliver; back off
                // instead of burning the other core.
                contended += 1;
                if contended < 4 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
                continue;
            };
            contended = 0;
            if done() {
                break;
            }
            // Block in `recv` itself (no `poll` first: one syscall per response, as in a
            // plain blocking read). Its `RX_SLICE` timeout means a response that arrives on
            // another connection (fail-over) is seen through `done()` within a few ms.
            if rx.buf.buffered().is_empty() {
                if let Err(e) = rx.buf.fill(Wait::Slice) {
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) {
                        continue;
                    }
                }
                // Data, end of stream or a hard error: `read_one` delivers the frame or
                // sees the same end/error again and fails the connection.
            }
            if !self.read_one(&mut rx) {
                break;
            }
            if done() {
                // Responses to other requests that came in the same `recv` are already in
                // memory: deliver them now (no socket read, no wait) rather than leave them
                // to a thread wake-up.
                while whole_frame_in(rx.buf.buffered()) {
                    if !self.read_one(&mut rx) {
                        break;
                    }
                }
            }
        }
        self.inline_active.fetch_sub(1, Ordering::SeqCst);
        // Part of a response may still sit in the receive buffer (the rest is on its way, but
        // the socket will not signal the part already read): the background receiver must be
        // told (see `receive_loop`).
        if (handoff && self.inflight_hint.load(Ordering::SeqCst) > 0) || self.rx_buffered() {
            self.wake_rx();
        }
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

/// Applies a response without pages to the ticket (stat) and returns its outcome.
fn apply_response(t: &mut Ticket, f: &Frame<'_>) -> Result<u32, ClientError> {
    match (t.op, f.body) {
        (_, Body::Error { status, .. }) => Err(ClientError::from_status(status)),
        (TicketOp::Write, Body::WriteResp { written }) => Ok(written),
        (TicketOp::Discard, Body::DiscardResp { freed }) => Ok(freed),
        (TicketOp::Stat, Body::StatResp(info)) => {
            t.stat = info;
            Ok(0)
        }
        _ => Err(ClientError::Protocol("response does not match the request")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farvm_memproto::frame::encode;
    use std::net::TcpListener;

    #[test]
    fn whole_frame_in_needs_header_and_body() {
        let mut two = Vec::new();
        for id in [1, 2] {
            let f = Frame {
                req_id: id,
                namespace: 3,
                body: Body::WriteResp { written: 1 },
            };
            encode(&mut two, &f, false);
        }
        let one = two.len() / 2;
        assert!(whole_frame_in(&two));
        assert!(whole_frame_in(&two[one..]));
        assert!(!whole_frame_in(&two[..one - 1]));
        assert!(!whole_frame_in(&[]));
        // A read response: its header promises a body that has not arrived yet.
        let mut read = Vec::new();
        let f = Frame {
            req_id: 4,
            namespace: 3,
            body: Body::ReadResp {
                count: 1,
                bitmap: &[0],
                pages: &[],
            },
        };
        encode(&mut read, &f, false);
        assert!(whole_frame_in(&read));
        assert!(!whole_frame_in(&read[..read.len() - 1]));
        // Garbage is "ready": reading it fails the connection at once instead of waiting.
        assert!(whole_frame_in(&[0xde; HEADER_LEN]));
    }

    /// A frame that arrives in two pieces with a gap longer than `RX_SLICE` is still read
    /// whole (a receive inside a frame retries the timeout), while a receive at a frame
    /// boundary returns the timeout so the inline waiter can re-check `done()`.
    #[test]
    fn receives_time_out_only_between_frames() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = l.local_addr().expect("local addr");
        let mut frame = Vec::new();
        encode(
            &mut frame,
            &Frame {
                req_id: 9,
                namespace: 3,
                body: Body::DiscardResp { freed: 7 },
            },
            false,
        );
        // The server sends only once the client has seen its timeout (no timing race).
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            go_rx.recv().expect("client signals");
            s.write_all(&frame[..HEADER_LEN / 2]).expect("first piece");
            s.flush().expect("flush");
            // Well past the timeout, which the kernel rounds up to whole jiffies (a few ms).
            std::thread::sleep(RX_SLICE * 50);
            s.write_all(&frame[HEADER_LEN / 2..]).expect("second piece");
        });
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(RX_SLICE)).expect("timeout");
        let mut buf = RecvBuf::new(stream.as_raw_fd(), 2);
        // Nothing has been sent yet: the boundary receive times out instead of blocking.
        let e = match buf.fill(Wait::Slice) {
            Ok(n) => panic!("no data was sent yet, got {n} bytes"),
            Err(e) => e,
        };
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "unexpected error kind {e:?}"
        );
        go_tx.send(()).expect("server thread alive");
        let hb = match buf.ensure(HEADER_LEN) {
            Ok(()) => *buf.buffered().first_chunk::<HEADER_LEN>().expect("header"),
            Err(e) => panic!("split frame not reassembled: {e}"),
        };
        let h = decode_header(&hb).expect("header decodes");
        buf.consume(HEADER_LEN);
        buf.ensure(h.body_len as usize).expect("body");
        let f = decode_body(&h, &buf.buffered()[..h.body_len as usize]).expect("body decodes");
        assert_eq!((f.req_id, f.namespace), (9, 3));
        assert!(matches!(f.body, Body::DiscardResp { freed: 7 }));
        server.join().expect("server thread");
    }
}
