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
//!
//! One-sided pages: READ and WRITE requests whose pages all lie in slabs the server granted
//! (`farvm_memproto::rdma::grant`, asked for on the control connection the first time a
//! thread that may block touches a slab) become RDMA READ/WRITE work requests on the server's
//! registered slab, and the server's CPU never sees them. A read fetches the pages and their
//! page-table entries (presence, crc32c) into the request's registered send buffer, checks
//! each present page's crc32c and copies it once into the engine's page; a write copies the
//! pages there and writes them, then their entries. Guest memory itself is not registered:
//! registration pins pages, and the engine evicts and refills guest pages one by one (without
//! on-demand paging, which `rdma_rxe` lacks, a registration would go stale). Only the last work
//! request of a batch is signaled; on a reliable-connected queue pair its completion means
//! the whole batch is done. A SEND is only acted on when the server's thread gets to it, while
//! one-sided accesses take effect on arrival, so a one-sided request waits until no two-sided
//! request is in flight (a DISCARD sent first must not be applied after a later WRITE).

mod one_sided;
mod poller;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use farvm_memproto::frame::{
    decode_body, decode_header, Body, Opcode, HEADER_LEN, WIRE_DATA_AT, WIRE_PAGE, WIRE_SEAL_AT,
};
use farvm_memproto::rdma::bootstrap::{ClientHello, SLOT_BYTES};
use farvm_memproto::rdma::endpoint::{QpEndpoint, ENDPOINT_WIRE_LEN};
use farvm_memproto::rdma::grant::{
    meta_addr, parse_reply, GrantRequest, MetaWord, GRANT_REPLY_LEN, GRANT_SLAB_PAGES, META_BYTES,
};
use farvm_memproto::rdma::plan::{plan, WorkRequest};
use farvm_memproto::rdma::region::RegionMap;
use farvm_memproto::{page_crc, Status, MAX_PAGES_PER_FRAME, PAGE_SIZE};
use farvm_transport::verbs::{
    Completion, MemoryRegion, OneSided, RcQueuePair, RdmaDevice, RdmaError, POLL_BATCH,
};
use rustc_hash::FxHashSet;

use super::handshake::{handshake, io_err};
use super::sched::Sched;
use super::wc::map_status;
use super::wire::{apply_response, encode_request};
use super::{ConnLimits, Link, LinkSpec, ReceivingGuard, SendMode, Sink};
use crate::tickets::{TicketOp, Tickets};
use crate::{ClientError, Priority};

/// Requests in flight per RDMA link at most: each needs a registered receive slot of 1 MiB
/// (the largest frame), pinned while the link lives.
pub(crate) const MAX_RDMA_WINDOW: usize = 16;
/// How long the client waits for the server to set up its side of a new RDMA session (queue
/// pair, registered buffers) after the control connection is authenticated.
const RDMA_SETUP_TIMEOUT: Duration = Duration::from_secs(20);
/// Send buffers beyond the window: a buffer comes back when its send completes, which may be
/// polled after the response that frees the window slot.
const SPARE_SEND_BUFFERS: usize = 2;
/// `wr_id` bit of a send (else a receive slot).
const SEND_BIT: u64 = 1 << 63;
/// `wr_id` bit of a one-sided batch's last work request (with [`SEND_BIT`]): bits 16..62 hold
/// the request id's low 46 bits, bits 0..16 the send buffer.
const ONE_BIT: u64 = 1 << 62;
const REQ_MASK: u64 = (1 << 46) - 1;
/// Where a one-sided batch's page-table entries sit in its send buffer (pages come first).
const META_OFF: usize = MAX_PAGES_PER_FRAME * PAGE_SIZE;
/// Send-queue work requests one one-sided batch may post: a page and its entry per page.
const WRS_PER_BATCH: usize = 2 * MAX_PAGES_PER_FRAME;
/// Bytes one RDMA READ/WRITE moves at most: a READ's response is a train of path-MTU packets,
/// and a short train is retried cheaply if a packet of it is lost.
const MAX_WR_BYTES: u32 = 64 * 1024;
/// Slabs one submission may ask grants for before it falls back to SEND/RECV.
const GRANTS_PER_SUBMIT: usize = 4;
/// Polls finding nothing before the poller sleeps on the completion channel.
const SPIN_ROUNDS: u32 = 64;
/// How long the poller sleeps at most with requests in flight (their timeouts need it), and
/// on an idle link.
const BUSY_WAIT: Duration = Duration::from_millis(20);
const IDLE_WAIT: Duration = Duration::from_millis(500);
/// How often the poller checks timeouts and the control connection while busy.
const EXPIRE_EVERY: Duration = Duration::from_millis(10);
/// With requests in flight, how long the link waits without a post or a completion before it
/// kicks the send queue ([`RcQueuePair::post_kick`]; docs/rdma.md, "Why one-sided requests
/// stalled"). A kick costs one packet and its acknowledgement.
const KICK_AFTER: Duration = Duration::from_millis(50);

/// How a request travels.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// As a SEND, answered by a SEND.
    TwoSided,
    /// As RDMA READ/WRITE on granted slabs: *ordered* in the scheduler's sense, it waits for
    /// the SENDs in flight.
    OneSided,
}

impl Kind {
    fn of(ordered: bool) -> Self {
        if ordered {
            Kind::OneSided
        } else {
            Kind::TwoSided
        }
    }
}

/// The link's scheduler and its free send buffers (one per request being sent).
struct LinkSched {
    q: Sched,
    send_free: Vec<u16>,
}

/// The slabs granted on this link, and those the server refused (never asked again).
struct Grants {
    map: RegionMap,
    refused: FxHashSet<(u64, u64)>,
}

/// A registered send buffer. The vector never grows past the capacity it was registered with
/// (a frame is at most [`SLOT_BYTES`]), so its memory stays the registered memory. A one-sided
/// batch uses it as its bounce buffer: pages from offset 0, page-table entries from
/// [`META_OFF`].
struct SendBuf {
    buf: Mutex<SendState>,
    mr: Arc<MemoryRegion>,
}

struct SendState {
    bytes: Vec<u8>,
    /// A one-sided batch's planned work requests (capacity for a whole batch: no allocation).
    plan: Vec<WorkRequest>,
    /// When the buffer's last request was posted.
    posted: Instant,
}

/// What the link's data path did since it opened: the timeout warning and stall reports
/// print it, so a request that timed out shows whether its work requests were posted, and
/// whether they completed late or not at all.
#[derive(Default)]
struct Counters {
    /// One-sided batches posted, and their work requests.
    os_batches: AtomicU64,
    os_wrs: AtomicU64,
    /// One-sided batches whose signaled completion was polled.
    os_done: AtomicU64,
    /// Of those, batches whose request had already timed out.
    os_late: AtomicU64,
    /// The longest one-sided batch from post to completion, µs.
    os_max_us: AtomicU64,
    /// SENDs posted and completed, RECVs completed.
    sends: AtomicU64,
    sends_done: AtomicU64,
    recvs: AtomicU64,
    /// Times the poller slept on the completion channel.
    sleeps: AtomicU64,
    /// Kicks of the send queue, and those a completion followed before the next one.
    kicks: AtomicU64,
    kicks_answered: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    fn summary(&self) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "one-sided: {} batches ({} work requests) posted, {} completed ({} late), longest \
             {} µs; SENDs {} posted, {} completed; RECVs {}; poller slept {} times; send \
             queue kicked {} times, {} of them followed by a completion",
            g(&self.os_batches),
            g(&self.os_wrs),
            g(&self.os_done),
            g(&self.os_late),
            g(&self.os_max_us),
            g(&self.sends),
            g(&self.sends_done),
            g(&self.recvs),
            g(&self.sleeps),
            g(&self.kicks),
            g(&self.kicks_answered),
        )
    }
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
    sched: Mutex<LinkSched>,
    tickets: Arc<Tickets>,
    sink: Arc<dyn Sink>,
    broken: AtomicBool,
    inflight_hint: AtomicUsize,
    /// Held by whoever polls the completion queue.
    poll: Mutex<()>,
    inline_active: AtomicUsize,
    /// The poller sleeps on the completion channel.
    sleeping: AtomicBool,
    /// When the link opened; the last post or completion and the last kick, as nanoseconds
    /// since then.
    opened: Instant,
    last_activity: AtomicU64,
    last_kick: AtomicU64,
    /// A kick is waiting for the next completion (to count whether one followed).
    kick_pending: AtomicBool,
    /// The TCP control connection: open while the session lives.
    ctl: TcpStream,
    /// Held while a grant is asked for on `ctl` (its reply is not a close).
    grant_lock: Mutex<()>,
    grants: RwLock<Grants>,
    /// Pages may travel one-sided (else every request is a SEND).
    one_sided: bool,
    landed_copied: AtomicU64,
    one_sided_reads: AtomicU64,
    one_sided_writes: AtomicU64,
    counters: Counters,
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
        one_sided: bool,
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
        let mut qp = RcQueuePair::new(&dev, (nsend * WRS_PER_BATCH) as u32, window as u32, false)
            .map_err(&rerr)?;
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
            // Zero-filled, then emptied: every byte of the capacity is initialised.
            let mut v: Vec<u8> = vec![0u8; SLOT_BYTES];
            v.clear();
            // SAFETY: the vector's allocation (its capacity) is registered; it lives in the
            // same `SendBuf` as the registration, which drops first, and never reallocates
            // (frames are at most SLOT_BYTES, checked before each post).
            let mr = unsafe { dev.register(v.as_mut_ptr(), SLOT_BYTES) }.map_err(&rerr)?;
            send.push(SendBuf {
                buf: Mutex::new(SendState {
                    bytes: v,
                    plan: Vec::with_capacity(MAX_PAGES_PER_FRAME),
                    posted: Instant::now(),
                }),
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
        // The server answers once it has registered the session's buffers, which under
        // emulation (Soft-RoCE in a TCG lab) can take longer than a network connect: the
        // server is known to be up (it authenticated us), so its set-up gets its own bound.
        ctl.set_read_timeout(Some(spec.connect_timeout.max(RDMA_SETUP_TIMEOUT)))
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
        let link = Arc::new(Self {
            qp,
            send,
            recv,
            _dev: dev,
            server,
            limits,
            sched: Mutex::new(LinkSched {
                q: Sched::new(limits),
                send_free: (0..nsend as u16).rev().collect(),
            }),
            tickets,
            sink,
            broken: AtomicBool::new(false),
            inflight_hint: AtomicUsize::new(0),
            poll: Mutex::new(()),
            inline_active: AtomicUsize::new(0),
            sleeping: AtomicBool::new(false),
            opened: Instant::now(),
            last_activity: AtomicU64::new(0),
            last_kick: AtomicU64::new(0),
            kick_pending: AtomicBool::new(false),
            ctl,
            grant_lock: Mutex::new(()),
            grants: RwLock::new(Grants {
                map: RegionMap::new(GRANT_SLAB_PAGES)
                    .map_err(|_| ClientError::Protocol("grant slab size"))?,
                refused: FxHashSet::default(),
            }),
            one_sided,
            landed_copied: AtomicU64::new(0),
            one_sided_reads: AtomicU64::new(0),
            one_sided_writes: AtomicU64::new(0),
            counters: Counters::default(),
        });
        let l = link.clone();
        std::thread::Builder::new()
            .name(format!("memclient-rdma-{server}"))
            .spawn(move || {
                farvm_sandbox::enter(farvm_sandbox::ThreadClass::StoreConnection);
                l.poller()
            })
            .map_err(&err)?;
        Ok(link)
    }

    fn sched(&self) -> MutexGuard<'_, LinkSched> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Posts request `req_id` of `ticket` from send buffer `sb`: encoded as one SEND, or as a
    /// one-sided batch.
    fn post(&self, req_id: u64, ticket: u32, sb: u16, kind: Kind) {
        let b = &self.send[sb as usize];
        let mut st = b.buf.lock().unwrap_or_else(|e| e.into_inner());
        st.posted = Instant::now();
        self.touch();
        let rc = match kind {
            Kind::TwoSided => {
                let buf = &mut st.bytes;
                buf.clear();
                // No sealer: an RDMA link is refused when the client has a page key
                // (`connection::connect`), so encoding cannot fail.
                let encoded = encode_request(buf, req_id, &self.tickets.lock(ticket), None);
                let fits =
                    encoded.is_ok() && buf.len() <= SLOT_BYTES && buf.capacity() == SLOT_BYTES;
                if fits {
                    Counters::add(&self.counters.sends, 1);
                    // SAFETY: the buffer is registered (`b.mr`) over its whole capacity, has
                    // not grown (checked), and stays untouched until the send completes: the
                    // buffer index is back in `send_free` only then.
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
                }
            }
            Kind::OneSided => {
                let wr_id = SEND_BIT | ONE_BIT | (req_id & REQ_MASK) << 16 | sb as u64;
                self.post_one_sided(&mut st, b.mr.lkey(), ticket, wr_id)
            }
        };
        drop(st);
        if rc != 0 {
            tracing::warn!(server = self.server, rc, "posting a send failed");
            self.fail_all();
        }
    }

    /// Sends queued requests while the window and the send buffers allow.
    fn dispatch(&self) {
        loop {
            let mut s = self.sched();
            if s.send_free.is_empty() {
                return;
            }
            let Some(go) = s.q.next() else { return };
            let sb = s.send_free.pop().unwrap_or_default();
            self.inflight_hint.store(s.q.inflight, Ordering::SeqCst);
            drop(s);
            self.post(go.req_id, go.ticket, sb, Kind::of(go.ordered));
        }
    }

    /// Marks the link broken and fails every outstanding request except one being landed
    /// (its lander finishes it).
    fn fail_all(&self) {
        let mut failed: Vec<u32> = Vec::new();
        {
            let mut s = self.sched();
            if s.q.fail_all(&mut failed).already {
                return;
            }
            self.broken.store(true, Ordering::Release);
            self.inflight_hint.store(s.q.inflight, Ordering::SeqCst);
        }
        let _ = self.ctl.shutdown(std::net::Shutdown::Both);
        self.sink.connection_failed(self.server);
        for t in failed {
            self.sink
                .complete(t, self.server, Err(ClientError::Disconnected));
        }
    }

    /// Claims the slot of response `req_id` for landing: its ticket, or `None` for a late
    /// answer to a request that already timed out (dropped).
    fn claim(&self, req_id: u64) -> Option<(usize, u32)> {
        self.sched().q.claim(req_id, u64::MAX)
    }

    /// Frees a landed slot, reports its ticket's outcome, and sends what waited for the window.
    fn finish_slot(&self, slot: usize, ticket: u32, outcome: Result<u32, ClientError>) {
        let owned = {
            let mut s = self.sched();
            let owned = s.q.finish(slot);
            if owned {
                self.inflight_hint.store(s.q.inflight, Ordering::SeqCst);
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
                        for (wire, k) in pages.chunks_exact(WIRE_PAGE).zip(present) {
                            let crc = u32::from_le_bytes([wire[0], wire[1], wire[2], wire[3]]);
                            intact &= page_crc(&wire[WIRE_SEAL_AT..]) == crc;
                            let data = &wire[WIRE_DATA_AT..];
                            if let Ok(seal) = wire[WIRE_SEAL_AT..WIRE_DATA_AT].try_into() {
                                io.set_seal(k, seal);
                            }
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
                            Ok((pages.len() / WIRE_PAGE) as u32)
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
        let mut wcs = [Completion::EMPTY; POLL_BATCH];
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
        if n > 0 {
            self.touch();
            if self.kick_pending.swap(false, Ordering::Relaxed) {
                Counters::add(&self.counters.kicks_answered, 1);
            }
        }
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
            if wc.wr_id & (SEND_BIT | ONE_BIT) == SEND_BIT | ONE_BIT {
                let sb = (wc.wr_id & 0xffff) as u16;
                let req = (wc.wr_id >> 16) & REQ_MASK;
                self.note_one_sided_done(sb);
                let claimed = self.sched().q.claim(req, REQ_MASK);
                if claimed.is_none() {
                    Counters::add(&self.counters.os_late, 1);
                }
                let landed =
                    claimed.map(|(slot, ticket)| (slot, ticket, self.land_one_sided(sb, ticket)));
                // The batch is done with the buffer once landed.
                self.sched().send_free.push(sb);
                match landed {
                    Some((slot, ticket, outcome)) => self.finish_slot(slot, ticket, outcome),
                    None => self.dispatch(),
                }
                continue;
            }
            if wc.wr_id & SEND_BIT != 0 {
                Counters::add(&self.counters.sends_done, 1);
                self.sched().send_free.push((wc.wr_id & !SEND_BIT) as u16);
                self.dispatch();
                continue;
            }
            let i = wc.wr_id as usize;
            if i >= self.recv.count {
                self.fail_all();
                return None;
            }
            Counters::add(&self.counters.recvs, 1);
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
}

impl Drop for RdmaLink {
    fn drop(&mut self) {
        tracing::info!(
            server = self.server,
            "RDMA link closed; {}",
            self.counters.summary()
        );
    }
}

impl Link for RdmaLink {
    fn submit(&self, ticket: u32, prio: Priority, mode: SendMode) -> Result<(), ClientError> {
        // Posting never blocks, so every mode sends from the calling thread. Asking for a
        // grant does (one round trip on the control connection): only a thread that may wait
        // does it, never a receiving one.
        let may_block = mode != SendMode::Deferred && !super::on_receive_side();
        let kind = self.kind_of(ticket, may_block);
        let mut s = self.sched();
        let may_go = !s.send_free.is_empty();
        if let Some(go) = s.q.admit(ticket, prio, kind == Kind::OneSided, may_go)? {
            let sb = s.send_free.pop().unwrap_or_default();
            self.inflight_hint.store(s.q.inflight, Ordering::SeqCst);
            drop(s);
            self.post(go.req_id, go.ticket, sb, kind);
        }
        Ok(())
    }

    fn receive_inline(&self, done: &dyn Fn() -> bool, _handoff: bool) {
        // The poller needs no hand-off: it sleeps on the completion channel, which the next
        // completion wakes.
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
    }

    fn inflight(&self) -> usize {
        self.inflight_hint.load(Ordering::SeqCst)
    }

    fn landed(&self) -> (u64, u64) {
        (self.landed_copied.load(Ordering::Relaxed), 0)
    }

    fn outstanding(&self) -> usize {
        self.sched().q.outstanding()
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::Acquire)
    }

    fn close(&self) {
        self.fail_all();
    }

    fn stall_report(&self, stale: Duration) -> Option<String> {
        let s = self.sched();
        let oldest = s.q.oldest(Instant::now())?;
        if oldest < stale {
            return None;
        }
        Some(format!(
            "RDMA link: oldest request in flight for {oldest:.1?}; {}, {} send buffers free; \
             completion queue {} ({} polling inline, poller {}); {}",
            s.q.summary(),
            s.send_free.len(),
            if self.poll.try_lock().is_ok() {
                "idle"
            } else {
                "being polled"
            },
            self.inline_active.load(Ordering::SeqCst),
            if self.sleeping.load(Ordering::SeqCst) {
                "asleep on the completion channel"
            } else {
                "running"
            },
            self.diagnosis(),
        ))
    }
}
