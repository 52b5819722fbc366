//! One RDMA link to one server (feature `rdma`): the protocol's frames as SEND/RECV messages
//! over a reliable-connected queue pair (PROTOCOL.md, "RDMA transport").
//!
//! Set-up: a TCP connection to the server's RDMA listener carries the usual handshake, then the
//! bootstrap (queue-pair endpoints, receive slots); it stays open as the session's liveness
//! signal (the server closing it, or dying, ends the link at once). The RDMA device is the one
//! with a RoCE GID for that connection's local address.
//!
//! Data path: each request is encoded straight into a registered send buffer and posted as one
//! SEND; each response arrives as one RECV in a registered receive slot (one per request the
//! link may have in flight), where a read's pages are checked (crc32c) and copied once into the
//! request's buffer — the engine's page — and the slot is posted again. Posting never blocks,
//! so any thread may send (no sender thread), and a request waiting for the window is sent by
//! whoever completes the one before it. Completions are polled by the thread waiting inline for
//! its response, else by the link's poller thread, which also enforces timeouts.
//!
//! As on TCP, a slot whose response is being landed is *receiving*: only the thread landing it
//! finishes it, so a failure elsewhere never hands the buffer back while pages are copied in.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use farvm_memproto::frame::{decode_body, decode_header, Body, Opcode, HEADER_LEN};
use farvm_memproto::rdma::bootstrap::{ClientHello, SLOT_BYTES};
use farvm_memproto::rdma::endpoint::{QpEndpoint, ENDPOINT_WIRE_LEN};
use farvm_memproto::{page_crc, Status, PAGE_SIZE};
use sideway::ibverbs::memory_region::MemoryRegion;

use super::handshake::{handshake, io_err};
use super::wire::{apply_response, encode_request};
use super::{ConnLimits, Link, LinkSpec, ReceivingGuard, SendMode, Sink};
use crate::rdma::wc::map_status;
use crate::rdma::{Completion, RcQueuePair, RdmaDevice, RdmaError, POLL_BATCH};
use crate::tickets::{TicketOp, Tickets};
use crate::{ClientError, Priority};

/// Requests in flight per RDMA link at most: each needs a registered receive slot of 1 MiB
/// (the largest frame), pinned while the link lives.
pub(crate) const MAX_RDMA_WINDOW: usize = 16;
/// Send buffers beyond the window: a buffer comes back when its send completes, which may be
/// polled after the response that frees the window slot.
const SPARE_SEND_BUFFERS: usize = 2;
/// `wr_id` bit of a send (else a receive slot).
const SEND_BIT: u64 = 1 << 63;

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
    /// Send buffers not in use.
    send_free: Vec<u16>,
    inflight: usize,
    generation: u64,
    broken: bool,
}

/// A registered send buffer. The vector never grows past the capacity it was registered with
/// (a frame is at most [`SLOT_BYTES`]), so its memory stays the registered memory.
struct SendBuf {
    buf: Mutex<Vec<u8>>,
    mr: Arc<MemoryRegion>,
}

/// The receive slots: one registered region, slot `i` at `i × SLOT_BYTES`.
struct RecvSlots {
    mr: Arc<MemoryRegion>,
    base: *mut u8,
    count: usize,
    _mem: Box<[u8]>,
}

/// A landed response: its slot, its ticket and the request's outcome.
type Landed = (usize, u32, Result<u32, ClientError>);

/// An RDMA link (see module docs).
pub(crate) struct RdmaLink {
    // Drop order matters: the queue pair goes before the memory registered for it, and that
    // before the memory itself and the device (protection domain).
    qp: RcQueuePair,
    send: Vec<SendBuf>,
    recv: RecvSlots,
    _dev: RdmaDevice,
    server: u16,
    limits: ConnLimits,
    sched: Mutex<Sched>,
    tickets: Arc<Tickets>,
    sink: Arc<dyn Sink>,
    broken: AtomicBool,
    inflight_hint: AtomicUsize,
    /// Held by whoever polls the completion queue.
    poll: Mutex<()>,
    inline_active: AtomicUsize,
    park: Mutex<()>,
    park_cv: Condvar,
    parked: AtomicBool,
    /// The TCP control connection: open while the session lives.
    ctl: TcpStream,
    landed_copied: AtomicU64,
}

// SAFETY: `recv.base` points into `recv._mem`, owned by the link; the slot memory is written by
// the device and read only by the thread holding `poll` for a slot it just polled.
unsafe impl Send for RdmaLink {}
// SAFETY: as above; all other state is behind locks or atomics.
unsafe impl Sync for RdmaLink {}

fn rdma_err(addr: SocketAddr) -> impl Fn(RdmaError) -> ClientError {
    move |e| {
        tracing::warn!(%addr, "RDMA set-up: {e}");
        ClientError::Rdma {
            addr,
            reason: match e {
                RdmaError::NoDevice => "no RDMA device (ibv_get_device_list is empty)",
                RdmaError::NoGid { .. } => {
                    "no RDMA device has a RoCE GID for the local address of the route"
                }
                RdmaError::Verbs { .. } => "a verbs call failed (see the log)",
            },
        }
    }
}

impl RdmaLink {
    /// Connects, authenticates, sets up the queue pair and starts the poller thread.
    pub fn connect(
        spec: &LinkSpec<'_>,
        tickets: Arc<Tickets>,
        sink: Arc<dyn Sink>,
    ) -> Result<Arc<Self>, ClientError> {
        let (addr, server) = (spec.addr, spec.server);
        let err = io_err(addr);
        let rerr = rdma_err(addr);
        let mut ctl = TcpStream::connect_timeout(&addr, spec.connect_timeout).map_err(&err)?;
        ctl.set_nodelay(true).map_err(&err)?;
        handshake(&mut ctl, addr, spec.secret, spec.connect_timeout)?;
        let local_ip = ctl.local_addr().map_err(&err)?.ip();
        let dev = RdmaDevice::for_local_ip(local_ip).map_err(&rerr)?;
        let window = spec.limits.window.clamp(1, MAX_RDMA_WINDOW);
        let depth = spec.limits.depth.clamp(window, u16::MAX as usize);
        let limits = ConnLimits {
            window,
            demand_reserve: spec.limits.demand_reserve.min(window - 1),
            depth,
            timeout: spec.limits.timeout,
        };
        let nsend = window + SPARE_SEND_BUFFERS;
        let mut qp = RcQueuePair::new(&dev, nsend as u32, window as u32).map_err(&rerr)?;
        let mut mem = vec![0u8; window * SLOT_BYTES].into_boxed_slice();
        let base = mem.as_mut_ptr();
        // SAFETY: `mem` is owned by the link next to its registration and outlives it (field
        // order: `recv.mr` drops before `recv._mem`).
        let mr = unsafe { dev.register(base, mem.len()) }.map_err(&rerr)?;
        let recv = RecvSlots {
            mr,
            base,
            count: window,
            _mem: mem,
        };
        let mut send = Vec::with_capacity(nsend);
        for _ in 0..nsend {
            let mut v: Vec<u8> = Vec::with_capacity(SLOT_BYTES);
            // SAFETY: the vector's allocation (its capacity) is registered; it lives in the
            // same `SendBuf` as the registration, which drops first, and never reallocates
            // (frames are at most SLOT_BYTES, checked before each post).
            let mr = unsafe { dev.register(v.as_mut_ptr(), SLOT_BYTES) }.map_err(&rerr)?;
            send.push(SendBuf {
                buf: Mutex::new(v),
                mr,
            });
        }
        for i in 0..window {
            // SAFETY: slot i lies in the registered receive region and is the device's until
            // its completion is polled.
            let rc = unsafe {
                qp.post_recv(
                    i as u64,
                    recv.mr.lkey(),
                    base.add(i * SLOT_BYTES),
                    SLOT_BYTES as u32,
                )
            };
            if rc != 0 {
                return Err(rerr(RdmaError::Verbs {
                    call: "ibv_post_recv",
                    reason: std::io::Error::from_raw_os_error(rc).to_string(),
                }));
            }
        }
        let hello = ClientHello {
            endpoint: qp.endpoint(),
            slots: window as u16,
        };
        ctl.write_all(&hello.to_bytes()).map_err(&err)?;
        ctl.set_read_timeout(Some(spec.connect_timeout))
            .map_err(&err)?;
        let mut eb = [0u8; ENDPOINT_WIRE_LEN];
        ctl.read_exact(&mut eb).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                tracing::warn!(%addr, "the server closed the RDMA bootstrap (see its log)");
                ClientError::Rdma {
                    addr,
                    reason: "the server could not set up its side (no RDMA device there?)",
                }
            } else {
                err(e)
            }
        })?;
        let remote =
            QpEndpoint::from_bytes(&eb).ok_or(ClientError::Protocol("malformed RDMA endpoint"))?;
        qp.connect(&remote).map_err(&rerr)?;
        tracing::info!(%addr, device = dev.name(), window, "RDMA link up");
        let now = Instant::now();
        let link = Arc::new(Self {
            qp,
            send,
            recv,
            _dev: dev,
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
                send_free: (0..nsend as u16).rev().collect(),
                inflight: 0,
                generation: 1,
                broken: false,
            }),
            tickets,
            sink,
            broken: AtomicBool::new(false),
            inflight_hint: AtomicUsize::new(0),
            poll: Mutex::new(()),
            inline_active: AtomicUsize::new(0),
            park: Mutex::new(()),
            park_cv: Condvar::new(),
            parked: AtomicBool::new(false),
            ctl,
            landed_copied: AtomicU64::new(0),
        });
        let l = link.clone();
        std::thread::Builder::new()
            .name(format!("memclient-rdma-{server}"))
            .spawn(move || l.poller())
            .map_err(&err)?;
        Ok(link)
    }

    fn sched(&self) -> MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Encodes and posts the request of `slot` in send buffer `sb`.
    fn post(&self, req_id: u64, ticket: u32, sb: u16) {
        let b = &self.send[sb as usize];
        let mut buf = b.buf.lock().unwrap_or_else(|e| e.into_inner());
        buf.clear();
        {
            let t = self.tickets.lock(ticket);
            encode_request(&mut buf, req_id, &t);
        }
        let fits = buf.len() <= SLOT_BYTES && buf.capacity() == SLOT_BYTES;
        let rc = if fits {
            // SAFETY: the buffer is registered (`b.mr`) over its whole capacity, has not grown
            // (checked), and stays untouched until the send completes: the buffer index is
            // back in `send_free` only then.
            unsafe {
                self.qp.post_send(
                    SEND_BIT | sb as u64,
                    b.mr.lkey(),
                    buf.as_ptr(),
                    buf.len() as u32,
                )
            }
        } else {
            -1
        };
        drop(buf);
        if rc != 0 {
            tracing::warn!(server = self.server, rc, "posting a send failed");
            self.fail_all();
        }
    }

    /// Sends queued requests while the window and the send buffers allow.
    fn dispatch(&self) {
        loop {
            let mut s = self.sched();
            if s.broken || s.send_free.is_empty() {
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
            let Some(slot) = next else { return };
            let sb = s.send_free.pop().unwrap_or_default();
            let sl = &mut s.slots[slot as usize];
            sl.state = SlotState::InFlight;
            sl.deadline = Instant::now() + self.limits.timeout;
            let (req_id, ticket) = (sl.req_id, sl.ticket);
            s.inflight += 1;
            self.inflight_hint.store(s.inflight, Ordering::SeqCst);
            drop(s);
            self.post(req_id, ticket, sb);
            self.wake_poller();
        }
    }

    /// Marks the link broken and fails every outstanding request except one being landed
    /// (its lander finishes it).
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
            for sl in s.slots.iter_mut() {
                match sl.state {
                    SlotState::Free => {}
                    SlotState::Receiving => receiving += 1,
                    SlotState::Queued | SlotState::InFlight => {
                        failed.push(sl.ticket);
                        sl.state = SlotState::Free;
                    }
                }
            }
            s.demand.clear();
            s.prefetch.clear();
            s.inflight = receiving;
            self.inflight_hint.store(receiving, Ordering::SeqCst);
        }
        let _ = self.ctl.shutdown(std::net::Shutdown::Both);
        self.wake_poller();
        self.sink.connection_failed(self.server);
        for t in failed {
            self.sink
                .complete(t, self.server, Err(ClientError::Disconnected));
        }
    }

    /// Claims the slot of response `req_id` for landing: its ticket, or `None` for a late
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

    /// Frees a landed slot, reports its ticket's outcome, and sends what waited for the window.
    fn finish_slot(&self, slot: usize, ticket: u32, outcome: Result<u32, ClientError>) {
        let owned = {
            let mut s = self.sched();
            let owned = s.slots[slot].state == SlotState::Receiving;
            if owned {
                s.slots[slot].state = SlotState::Free;
                s.free.push(slot as u16);
                s.inflight -= 1;
                self.inflight_hint.store(s.inflight, Ordering::SeqCst);
            }
            owned
        };
        if owned {
            self.dispatch();
            self.sink.complete(ticket, self.server, outcome);
        }
    }

    /// Lands one received frame (`len` bytes in receive slot `i`) and returns the outcome for
    /// its request, if it belongs to one still waiting.
    fn land(&self, i: usize, len: usize) -> Result<Option<Landed>, ()> {
        // SAFETY: slot i's receive completed, so the device is done with it until we post it
        // again; `len` ≤ SLOT_BYTES (the posted length bounds what the device wrote).
        let frame = unsafe {
            std::slice::from_raw_parts(self.recv.base.add(i * SLOT_BYTES), len.min(SLOT_BYTES))
        };
        let Some(hb) = frame.first_chunk::<HEADER_LEN>() else {
            return Err(());
        };
        let h = decode_header(hb).map_err(|_| ())?;
        let body = frame
            .get(HEADER_LEN..HEADER_LEN + h.body_len as usize)
            .ok_or(())?;
        let f = decode_body(&h, body).map_err(|_| ())?;
        let Some((slot, ticket)) = self.claim(h.req_id) else {
            return Ok(None);
        };
        let mut t = self.tickets.lock(ticket);
        let outcome = match f.body {
            Body::ReadResp {
                count,
                bitmap,
                pages,
            } if h.opcode == Opcode::ReadResp && h.status == Status::Ok => {
                let op = t.op;
                match t.io.as_mut() {
                    Some(io) if op == TicketOp::Read && io.len() == count as usize => {
                        let present = (0..io.len()).filter(|k| bitmap[k / 8] & (1 << (k % 8)) != 0);
                        let mut intact = true;
                        for (wire, k) in pages.chunks_exact(4 + PAGE_SIZE).zip(present) {
                            let crc = u32::from_le_bytes([wire[0], wire[1], wire[2], wire[3]]);
                            let data = &wire[4..];
                            intact &= page_crc(data) == crc;
                            // SAFETY: the request's buffer, which nobody else touches while its
                            // slot is receiving; 4 KiB of source and destination.
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    data.as_ptr(),
                                    io.page_ptr(k),
                                    PAGE_SIZE,
                                )
                            };
                        }
                        self.landed_copied
                            .fetch_add(pages.len() as u64, Ordering::Relaxed);
                        if intact {
                            io.set_present_from(bitmap);
                            Ok(pages.len() as u32 / (4 + PAGE_SIZE) as u32)
                        } else {
                            io.clear_present();
                            Err(ClientError::ChecksumMismatch)
                        }
                    }
                    _ => Err(ClientError::Protocol(
                        "READ response does not match the request",
                    )),
                }
            }
            _ => apply_response(&mut t, &f),
        };
        drop(t);
        Ok(Some((slot, ticket, outcome)))
    }

    /// Polls the completion queue once (the caller holds `poll`); returns how many completions
    /// were handled, or `None` when the link failed.
    fn poll_once(&self) -> Option<usize> {
        let _receiving = ReceivingGuard::enter();
        let mut wcs = [Completion {
            wr_id: 0,
            status: 0,
            recv: false,
            byte_len: 0,
        }; POLL_BATCH];
        let n = match self.qp.poll(&mut wcs) {
            Ok(n) => n,
            Err(rc) => {
                tracing::warn!(
                    server = self.server,
                    rc,
                    "polling the completion queue failed"
                );
                self.fail_all();
                return None;
            }
        };
        for wc in &wcs[..n] {
            if let Err(e) = map_status(wc.status) {
                if !self.is_broken() {
                    tracing::warn!(
                        server = self.server,
                        status = wc.status,
                        "RDMA completion failed: {e}"
                    );
                }
                self.fail_all();
                return None;
            }
            if wc.wr_id & SEND_BIT != 0 {
                self.sched().send_free.push((wc.wr_id & !SEND_BIT) as u16);
                self.dispatch();
                continue;
            }
            let i = wc.wr_id as usize;
            if i >= self.recv.count {
                self.fail_all();
                return None;
            }
            let landed = self.land(i, wc.byte_len as usize);
            // The slot is ours again: post it before finishing, so the next response finds it.
            // SAFETY: as in `connect`.
            let rc = unsafe {
                self.qp.post_recv(
                    i as u64,
                    self.recv.mr.lkey(),
                    self.recv.base.add(i * SLOT_BYTES),
                    SLOT_BYTES as u32,
                )
            };
            match landed {
                Ok(Some((slot, ticket, outcome))) => self.finish_slot(slot, ticket, outcome),
                Ok(None) => {}
                Err(()) => {
                    tracing::warn!(server = self.server, "malformed response; closing");
                    self.fail_all();
                    return None;
                }
            }
            if rc != 0 {
                tracing::warn!(server = self.server, rc, "re-posting a receive failed");
                self.fail_all();
                return None;
            }
        }
        Some(n)
    }

    fn wake_poller(&self) {
        if self.parked.load(Ordering::SeqCst) {
            let _g = self.park.lock().unwrap_or_else(|e| e.into_inner());
            self.park_cv.notify_one();
        }
    }

    /// Whether the control connection says the server went away (it never sends after the
    /// bootstrap: readable means closed or broken).
    fn control_closed(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.ctl.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack; the socket is owned by `self.ctl`.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r > 0
    }

    /// Fails requests in flight past their deadline.
    fn expire(&self) {
        let now = Instant::now();
        let mut expired = [0u32; 64];
        let mut n = 0;
        {
            let mut s = self.sched();
            let Sched {
                slots,
                free,
                inflight,
                ..
            } = &mut *s;
            for (i, sl) in slots.iter_mut().enumerate() {
                if sl.state == SlotState::InFlight && sl.deadline <= now && n < expired.len() {
                    *inflight -= 1;
                    sl.state = SlotState::Free;
                    free.push(i as u16);
                    expired[n] = sl.ticket;
                    n += 1;
                }
            }
            self.inflight_hint.store(*inflight, Ordering::SeqCst);
        }
        if n > 0 {
            tracing::warn!(server = self.server, n, "requests timed out");
            self.dispatch();
            for &t in &expired[..n] {
                self.sink
                    .complete(t, self.server, Err(ClientError::Timeout));
            }
        }
    }

    /// The poller thread: completions nobody polls inline, timeouts, and the control
    /// connection. It parks while nothing is in flight or a thread polls inline.
    fn poller(self: Arc<Self>) {
        let idle = Duration::from_millis(5);
        let mut last_check = Instant::now();
        let mut quiet = 0u32;
        loop {
            if self.is_broken() {
                return;
            }
            if last_check.elapsed() >= Duration::from_millis(1) {
                last_check = Instant::now();
                if self.control_closed() {
                    if !self.is_broken() {
                        tracing::warn!(server = self.server, "RDMA session closed by the server");
                    }
                    self.fail_all();
                    return;
                }
                self.expire();
            }
            let busy = self.inflight_hint.load(Ordering::SeqCst) > 0;
            if !busy || self.inline_active.load(Ordering::SeqCst) > 0 {
                let g = self.park.lock().unwrap_or_else(|e| e.into_inner());
                self.parked.store(true, Ordering::SeqCst);
                let still_idle = self.inflight_hint.load(Ordering::SeqCst) == 0
                    || self.inline_active.load(Ordering::SeqCst) > 0;
                if still_idle && !self.is_broken() {
                    let _ = self.park_cv.wait_timeout(g, idle);
                }
                self.parked.store(false, Ordering::SeqCst);
                // Send completions of a finished burst still give buffers back.
                if let Ok(_p) = self.poll.try_lock() {
                    if self.poll_once().is_none() {
                        return;
                    }
                }
                continue;
            }
            let handled = match self.poll.try_lock() {
                Ok(_p) => match self.poll_once() {
                    Some(n) => n,
                    None => return,
                },
                Err(_) => 0,
            };
            if handled > 0 {
                quiet = 0;
            } else {
                quiet += 1;
                if quiet < 64 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(20));
                }
            }
        }
    }
}

impl Link for RdmaLink {
    fn submit(&self, ticket: u32, prio: Priority, _mode: SendMode) -> Result<(), ClientError> {
        // Posting never blocks, so every mode sends from the calling thread.
        let mut s = self.sched();
        if s.broken {
            return Err(ClientError::Disconnected);
        }
        let Some(slot) = s.free.pop() else {
            return Err(ClientError::QueueFull);
        };
        s.generation += 1;
        let req_id = s.generation << 16 | slot as u64;
        let can_go = !s.send_free.is_empty()
            && match prio {
                Priority::Demand => s.demand.is_empty() && s.inflight < self.limits.window,
                Priority::Prefetch => {
                    s.demand.is_empty()
                        && s.prefetch.is_empty()
                        && s.inflight < self.limits.window - self.limits.demand_reserve
                }
            };
        s.slots[slot as usize] = Slot {
            state: if can_go {
                SlotState::InFlight
            } else {
                SlotState::Queued
            },
            req_id,
            ticket,
            deadline: Instant::now() + self.limits.timeout,
        };
        if can_go {
            let sb = s.send_free.pop().unwrap_or_default();
            s.inflight += 1;
            self.inflight_hint.store(s.inflight, Ordering::SeqCst);
            drop(s);
            self.post(req_id, ticket, sb);
            self.wake_poller();
        } else {
            match prio {
                Priority::Demand => s.demand.push_back(slot),
                Priority::Prefetch => s.prefetch.push_back(slot),
            }
        }
        Ok(())
    }

    fn receive_inline(&self, done: &dyn Fn() -> bool, handoff: bool) {
        self.inline_active.fetch_add(1, Ordering::SeqCst);
        let mut quiet = 0u32;
        while !done() && !self.is_broken() {
            let handled = match self.poll.try_lock() {
                Ok(_p) => self.poll_once().unwrap_or(0),
                Err(_) => 0,
            };
            if handled > 0 {
                quiet = 0;
                continue;
            }
            quiet += 1;
            if quiet < 256 {
                std::hint::spin_loop();
            } else if quiet < 512 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
        self.inline_active.fetch_sub(1, Ordering::SeqCst);
        if handoff {
            self.wake_poller();
        }
    }

    fn inflight(&self) -> usize {
        self.inflight_hint.load(Ordering::SeqCst)
    }

    fn landed(&self) -> (u64, u64) {
        (self.landed_copied.load(Ordering::Relaxed), 0)
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
        Some(format!(
            "RDMA link: oldest request in flight for {oldest:.1?}; {} in flight, {} demand + {} \
             prefetch queued, {} send buffers free; completion queue {} ({} polling inline, \
             poller {})",
            s.inflight,
            s.demand.len(),
            s.prefetch.len(),
            s.send_free.len(),
            if self.poll.try_lock().is_ok() {
                "idle"
            } else {
                "being polled"
            },
            self.inline_active.load(Ordering::SeqCst),
            if self.parked.load(Ordering::SeqCst) {
                "parked"
            } else {
                "running"
            },
        ))
    }
}
