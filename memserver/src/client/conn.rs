//! One pipelined TCP connection to one server.
//!
//! Up to `window` requests are in flight; more wait in two queues, and a queued demand request
//! always goes before queued prefetches. Prefetches may use only `window - demand_reserve`
//! slots, so a demand read never waits behind a full window of prefetches.
//!
//! Threads: the submitting thread writes its request itself when it may go at once (no
//! thread hop on the fast path); a sender thread drains the queues and enforces timeouts; a
//! receiver thread reads responses, fills the ticket's buffer and reports to the [`Sink`].
//! The receiver never writes to the socket, so a full socket buffer cannot deadlock it.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::ticket::{OpKind, Ticket, Tickets};
use super::{ClientError, Priority};
use crate::protocol::auth::{proofs_equal, random_bytes, Secret};
use crate::protocol::frame::{
    decode_body, decode_header, encode, header_bytes, Body, Frame, FrameError, Opcode,
    FLAG_IF_ABSENT, FLAG_SCATTER, HEADER_LEN, MAX_BODY, WIRE_PAGE,
};
use crate::protocol::{PageSel, Status, PAGE_SIZE, PROTOCOL_VERSION};

/// Where a connection reports finished requests (implemented by the cluster client).
pub(crate) trait Sink: Send + Sync {
    /// `ticket` finished on `server` with `outcome` (count of pages on success).
    fn complete(&self, ticket: u32, server: u16, outcome: Result<u32, ClientError>);
    /// The connection to `server` failed.
    fn connection_failed(&self, server: u16);
}

/// Per-connection limits.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    /// Requests in flight at most.
    pub window: usize,
    /// Window slots only demand requests may use.
    pub demand_reserve: usize,
    /// Requests queued or in flight at most.
    pub depth: usize,
    /// Per-request timeout (from submission).
    pub timeout: Duration,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SlotState {
    Free,
    Queued,
    InFlight,
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

struct Rx {
    reader: BufReader<RxStream>,
    buf: Vec<u8>,
}

/// How long one blocking receive on the socket may wait (`SO_RCVTIMEO`) before the inline
/// waiter re-checks whether its request completed elsewhere (fail-over to another server).
const RX_SLICE: Duration = Duration::from_millis(1);

/// The receive socket. It has an `RX_SLICE` receive timeout so that an inline waiter can block
/// in `recv` itself (one syscall per response, like a plain blocking read) instead of `poll`
/// followed by `recv` (two syscalls; ~0.7 µs more per 4 KiB read on this host, see README "Bench").
///
/// `patient`: a timeout is retried instead of returned. It is set except while an inline
/// waiter fills an empty buffer, so a frame that arrives in pieces is never cut by a timeout
/// (a partly read frame cannot be resumed by `read_exact`).
struct RxStream {
    stream: TcpStream,
    patient: bool,
}

impl Read for RxStream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.stream.read(buf) {
                Err(e)
                    if self.patient
                        && matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                {
                    continue
                }
                r => return r,
            }
        }
    }
}

struct Writer {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// A connection (see module docs).
pub(crate) struct Connection {
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
    fd: std::os::fd::RawFd,
    shutdown_stream: TcpStream,
}

fn io_err(addr: SocketAddr) -> impl Fn(std::io::Error) -> ClientError {
    move |e| ClientError::Connect {
        addr,
        kind: e.kind(),
    }
}

/// Reads one frame into `buf`; a body longer than `buf` is refused as `TooLarge`.
fn read_frame<'b>(r: &mut impl Read, buf: &'b mut [u8]) -> Result<Frame<'b>, ReadErr> {
    let mut hb = [0u8; HEADER_LEN];
    r.read_exact(&mut hb).map_err(ReadErr::Io)?;
    let h = decode_header(&hb).map_err(ReadErr::Malformed)?;
    let body = buf
        .get_mut(..h.body_len as usize)
        .ok_or(ReadErr::Malformed(FrameError::TooLarge(h.body_len)))?;
    r.read_exact(body).map_err(ReadErr::Io)?;
    decode_body(&h, body).map_err(ReadErr::Malformed)
}

enum ReadErr {
    Io(std::io::Error),
    /// Why the frame was refused (a peer of another version: `BadVersion`).
    Malformed(FrameError),
}

/// Whether `buffered` starts with a whole frame (so reading it never touches the socket).
/// A malformed header counts as ready: reading it fails the connection at once.
fn whole_frame_in(buffered: &[u8]) -> bool {
    let Some(hb) = buffered.first_chunk::<HEADER_LEN>() else {
        return false;
    };
    match decode_header(hb) {
        Ok(h) => buffered.len() >= HEADER_LEN + h.body_len as usize,
        Err(_) => true,
    }
}

/// Performs the handshake on a fresh stream.
fn handshake(
    stream: &mut TcpStream,
    addr: SocketAddr,
    secret: Option<&Secret>,
    timeout: Duration,
) -> Result<(), ClientError> {
    let err = io_err(addr);
    stream.set_read_timeout(Some(timeout)).map_err(&err)?;
    let version_err = |server| ClientError::Version {
        addr,
        server,
        client: PROTOCOL_VERSION,
    };
    // A server of another version fails the decoder's version check on its CHALLENGE: the
    // operator should read "version N", not "malformed frame".
    let refused = |e| match e {
        FrameError::BadVersion(v) => version_err(v),
        _ => ClientError::Protocol("malformed handshake frame"),
    };
    let mut buf = vec![0u8; 512];
    let f = read_frame(stream, &mut buf).map_err(|e| match e {
        ReadErr::Io(e) => err(e),
        ReadErr::Malformed(e) => refused(e),
    })?;
    let Body::Challenge {
        server_nonce,
        max_version,
    } = f.body
    else {
        return Err(ClientError::Protocol("expected CHALLENGE"));
    };
    if max_version < PROTOCOL_VERSION {
        return Err(version_err(max_version));
    }
    let client_nonce = random_bytes::<32>();
    let (key_id, mac) = match secret {
        Some(s) => (s.key_id(), s.client_proof(&server_nonce, &client_nonce)),
        None => ([0; 8], [0; 32]),
    };
    let hello = Frame {
        req_id: 0,
        namespace: 0,
        body: Body::Hello {
            key_id,
            client_nonce,
            mac,
        },
    };
    let mut out = Vec::with_capacity(128);
    encode(&mut out, &hello, false);
    stream.write_all(&out).map_err(&err)?;
    let f = read_frame(stream, &mut buf).map_err(|e| match e {
        ReadErr::Io(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => ClientError::Auth {
            addr,
            reason: "server closed the connection during the handshake",
        },
        ReadErr::Io(e) => err(e),
        ReadErr::Malformed(e) => refused(e),
    })?;
    match f.body {
        Body::HelloResp { server_mac } => {
            if let Some(s) = secret {
                if !proofs_equal(&server_mac, &s.server_proof(&server_nonce, &client_nonce)) {
                    return Err(ClientError::Auth {
                        addr,
                        reason: "server could not prove it knows the secret",
                    });
                }
            }
        }
        Body::Error {
            status: Status::AuthFailed,
            ..
        } => {
            return Err(ClientError::Auth {
                addr,
                reason: "server rejected our key or proof",
            })
        }
        Body::Error { status, .. } => return Err(ClientError::from_status(status)),
        _ => return Err(ClientError::Protocol("expected HELLO response")),
    }
    stream.set_read_timeout(None).map_err(&err)?;
    Ok(())
}

impl Connection {
    /// Connects, authenticates and starts the sender and receiver threads.
    pub fn connect(
        addr: SocketAddr,
        server: u16,
        secret: Option<&Secret>,
        limits: ConnLimits,
        connect_timeout: Duration,
        tickets: Arc<Tickets>,
        sink: Arc<dyn Sink>,
    ) -> Result<Arc<Self>, ClientError> {
        let err = io_err(addr);
        let mut stream = TcpStream::connect_timeout(&addr, connect_timeout).map_err(&err)?;
        stream.set_nodelay(true).map_err(&err)?;
        handshake(&mut stream, addr, secret, connect_timeout)?;
        let depth = limits.depth.clamp(1, u16::MAX as usize);
        let limits = ConnLimits {
            window: limits.window.clamp(1, depth),
            demand_reserve: limits.demand_reserve.min(limits.window.saturating_sub(1)),
            depth,
            timeout: limits.timeout,
        };
        let now = Instant::now();
        stream.set_read_timeout(Some(RX_SLICE)).map_err(&err)?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
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
            shutdown_stream: stream.try_clone().map_err(&err)?,
            rx: Mutex::new(Rx {
                reader: BufReader::with_capacity(
                    256 * 1024,
                    RxStream {
                        stream,
                        patient: true,
                    },
                ),
                buf: vec![0u8; MAX_BODY],
            }),
            inline_active: AtomicUsize::new(0),
            rx_park: Mutex::new(()),
            rx_cv: Condvar::new(),
            rx_parked: AtomicBool::new(false),
            fd,
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

    /// True once the connection failed or was closed.
    pub fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    /// Requests in flight (lock-free snapshot).
    pub fn inflight(&self) -> usize {
        self.inflight_hint.load(Ordering::SeqCst)
    }

    /// A one-line account of this connection if a request has been in flight for `stale` or
    /// longer, else `None`: what each side is doing and how many bytes sit unread in the
    /// socket (the client is not receiving) or unsent (the server is not reading). Logged by
    /// the maintenance thread, so a stall says where it is before the timeout ends it.
    pub fn stall_report(&self, stale: Duration) -> Option<String> {
        let s = self.sched();
        let now = Instant::now();
        let oldest = s
            .slots
            .iter()
            .filter(|sl| sl.state == SlotState::InFlight)
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

    /// Requests queued or in flight.
    pub fn outstanding(&self) -> usize {
        let s = self.sched();
        self.limits.depth - s.free.len()
    }

    /// Submits `ticket`. On `Err` nothing was sent and the sink will not be called for it.
    /// `wake`: wake the background receiver for it (false only when the caller will
    /// receive inline, see [`Connection::receive_inline`]).
    pub fn submit(
        &self,
        ticket: u32,
        prio: Priority,
        direct: bool,
        wake: bool,
    ) -> Result<(), ClientError> {
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
        let go = direct && can_go;
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
            if wake {
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
        let (sel_len, mut flags) = match sel {
            PageSel::Run { .. } => (8, 0),
            PageSel::Scatter(b) => (b.len(), FLAG_SCATTER),
        };
        let (op, body_len) = match t.op {
            OpKind::Read => (Opcode::Read, sel_len),
            OpKind::Discard => (Opcode::Discard, sel_len),
            OpKind::Write => (Opcode::Write, sel_len + n * WIRE_PAGE),
            OpKind::Stat => (Opcode::Stat, 0),
        };
        if t.op == OpKind::Write && t.if_absent {
            flags |= FLAG_IF_ABSENT;
        }
        if op == Opcode::Stat {
            flags = 0;
        }
        let count = if op == Opcode::Stat { 0 } else { n as u32 };
        buf.extend_from_slice(&header_bytes(
            op,
            flags,
            Status::Ok,
            req_id,
            ns,
            count,
            body_len,
        ));
        if op == Opcode::Stat {
            return;
        }
        match sel {
            PageSel::Run { start, .. } => buf.extend_from_slice(&start.to_le_bytes()),
            PageSel::Scatter(b) => buf.extend_from_slice(b),
        }
        if t.op == OpKind::Write {
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

    /// Marks the connection broken and fails every outstanding request.
    fn fail_all(&self) {
        let mut failed: Vec<u32> = Vec::new();
        {
            let mut s = self.sched();
            if s.broken {
                return;
            }
            s.broken = true;
            self.broken.store(true, Ordering::Release);
            for i in 0..s.slots.len() {
                if s.slots[i].state != SlotState::Free {
                    failed.push(s.slots[i].ticket);
                    s.slots[i].state = SlotState::Free;
                }
            }
            s.demand.clear();
            s.prefetch.clear();
            s.inflight = 0;
            self.inflight_hint.store(0, Ordering::SeqCst);
        }
        self.cv.notify_all();
        let _ = self.shutdown_stream.shutdown(std::net::Shutdown::Both);
        self.wake_rx();
        self.sink.connection_failed(self.server);
        for t in failed {
            self.sink
                .complete(t, self.server, Err(ClientError::Disconnected));
        }
    }

    /// Closes the connection; outstanding requests fail with `Disconnected`.
    pub fn close(&self) {
        self.fail_all();
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
            for (i, sl) in slots.iter_mut().enumerate() {
                if sl.state == SlotState::InFlight && sl.deadline <= now {
                    *inflight -= 1;
                    sl.state = SlotState::Free;
                    free.push(i as u16);
                    expired.push(sl.ticket);
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
        }
    }

    /// Handles one response frame: fills the ticket, frees the slot, reports to the sink.
    fn handle_frame(&self, f: &Frame<'_>) {
        let slot = (f.req_id & 0xffff) as usize;
        let ticket = {
            let mut s = self.sched();
            match s.slots.get_mut(slot) {
                Some(sl) if sl.req_id == f.req_id && sl.state == SlotState::InFlight => {
                    sl.state = SlotState::Receiving;
                    sl.ticket
                }
                // A late answer to a request that already timed out: drop it.
                _ => return,
            }
        };
        let outcome = {
            let mut t = self.tickets.lock(ticket);
            apply_response(&mut t, f)
        };
        let queued = {
            let mut s = self.sched();
            if s.slots[slot].state == SlotState::Receiving {
                s.slots[slot].state = SlotState::Free;
                s.free.push(slot as u16);
                s.inflight -= 1;
                self.inflight_hint.store(s.inflight, Ordering::SeqCst);
            }
            !s.demand.is_empty() || !s.prefetch.is_empty()
        };
        // Wake the sender only when a freed window slot lets a queued request go.
        if queued {
            self.cv.notify_one();
        }
        self.sink.complete(ticket, self.server, outcome);
    }

    /// Reads and handles one frame (the caller holds the receive side). False if the
    /// connection failed.
    fn read_one(&self, rx: &mut Rx) -> bool {
        let f = match read_frame(&mut rx.reader, &mut rx.buf) {
            Ok(f) => f,
            Err(ReadErr::Io(e)) => {
                if !self.is_broken() {
                    tracing::warn!(server = self.server, "connection lost: {e}");
                }
                self.fail_all();
                return false;
            }
            Err(ReadErr::Malformed(e)) => {
                tracing::warn!(server = self.server, "malformed response ({e}); closing");
                self.fail_all();
                return false;
            }
        };
        self.handle_frame(&f);
        true
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
        // open as long as `self` (it is owned by `rx`).
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        r > 0
    }

    /// Buffered data or a readable socket.
    fn readable(&self, rx: &Rx, timeout: Duration) -> bool {
        !rx.reader.buffer().is_empty() || self.poll_readable(timeout)
    }

    /// Wakes the background receiver if it is parked.
    pub fn wake_rx(&self) {
        if self.rx_parked.load(Ordering::SeqCst) {
            let _g = self.rx_park.lock().unwrap_or_else(|e| e.into_inner());
            self.rx_cv.notify_one();
        }
    }

    fn rx_should_park(&self) -> bool {
        self.inline_active.load(Ordering::SeqCst) > 0
            || self.inflight_hint.load(Ordering::SeqCst) == 0
    }

    /// Receives on the calling thread until `done()` holds or the connection fails, so the
    /// waiting thread itself picks its response up (no hand-off to the receiver thread, which
    /// on a busy 2-core host costs a scheduler wake-up per request).
    ///
    /// `handoff`: when done, wake the background receiver for requests still in flight.
    /// False when the caller keeps polling (it receives them itself; the background receiver
    /// still takes over within its park interval if it stops).
    pub fn receive_inline(&self, done: impl Fn() -> bool, handoff: bool) {
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
            if rx.reader.buffer().is_empty() {
                rx.reader.get_mut().patient = false;
                let filled = rx.reader.fill_buf().map(|b| b.len());
                rx.reader.get_mut().patient = true;
                if let Err(e) = &filled {
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
                while whole_frame_in(rx.reader.buffer()) {
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

    /// Whether response bytes already read off the socket wait in the receive buffer (false
    /// if someone is receiving right now: they will get to them).
    fn rx_buffered(&self) -> bool {
        self.rx
            .try_lock()
            .is_ok_and(|rx| !rx.reader.buffer().is_empty())
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

/// Copies a response into the ticket (pages, presence, stat) and returns its outcome.
fn apply_response(t: &mut Ticket, f: &Frame<'_>) -> Result<u32, ClientError> {
    match (t.op, f.body) {
        (_, Body::Error { status, .. }) => Err(ClientError::from_status(status)),
        (
            OpKind::Read,
            Body::ReadResp {
                count,
                bitmap,
                pages,
            },
        ) => {
            let io =
                t.io.as_mut()
                    .ok_or(ClientError::Protocol("read without buffer"))?;
            if count as usize != io.len() {
                return Err(ClientError::Protocol("READ response page count differs"));
            }
            io.clear_present();
            let mut k = 0;
            for i in 0..io.len() {
                if bitmap[i / 8] & (1 << (i % 8)) == 0 {
                    continue;
                }
                let wp = &pages[k * WIRE_PAGE..(k + 1) * WIRE_PAGE];
                k += 1;
                let crc = u32::from_le_bytes([wp[0], wp[1], wp[2], wp[3]]);
                let data = &wp[4..4 + PAGE_SIZE];
                if crate::protocol::page_crc(data) != crc {
                    return Err(ClientError::ChecksumMismatch);
                }
                io.page_mut(i).copy_from_slice(data);
                io.set_present(i);
            }
            Ok(k as u32)
        }
        (OpKind::Write, Body::WriteResp { written }) => Ok(written),
        (OpKind::Discard, Body::DiscardResp { freed }) => Ok(freed),
        (OpKind::Stat, Body::StatResp(info)) => {
            t.stat = info;
            Ok(0)
        }
        _ => Err(ClientError::Protocol("response does not match the request")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
    /// whole (the patient stream retries the timeout mid-frame), while an unpatient fill of
    /// an empty buffer returns the timeout so the inline waiter can re-check `done()`.
    #[test]
    fn rx_stream_times_out_only_between_frames() {
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
        let mut reader = BufReader::new(RxStream {
            stream,
            patient: false,
        });
        // Nothing has been sent yet: the unpatient fill times out instead of blocking.
        let e = match reader.fill_buf() {
            Ok(b) => panic!("no data was sent yet, got {} bytes", b.len()),
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
        reader.get_mut().patient = true;
        let mut buf = vec![0u8; MAX_BODY];
        let f = match read_frame(&mut reader, &mut buf) {
            Ok(f) => f,
            Err(ReadErr::Io(e)) => panic!("split frame not reassembled: {e}"),
            Err(ReadErr::Malformed(e)) => panic!("split frame decoded as malformed: {e}"),
        };
        assert_eq!((f.req_id, f.namespace), (9, 3));
        assert!(matches!(f.body, Body::DiscardResp { freed: 7 }));
        server.join().expect("server thread");
    }
}
