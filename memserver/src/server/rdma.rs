//! One RDMA session (feature `rdma`; PROTOCOL.md, "RDMA transport"): the handshake and the
//! bootstrap on the TCP control connection, then the protocol's frames as SEND/RECV messages
//! over a reliable-connected queue pair, served in order by the same request handler as TCP
//! (`conn::handle`): pages, tenancy, capacity and checksums behave exactly alike.
//!
//! The RDMA device is the one with a RoCE GID for the control connection's local address (the
//! address the client reached). The server posts one receive slot per request the client may
//! have in flight (the client says how many); each response is copied into a registered send
//! buffer and posted as one SEND. The session ends when the client closes the control
//! connection, a completion fails (the client died: retries exhausted), or the server stops.
//!
//! One-sided pages: the client asks on the control connection for the grant of a slab
//! (`farvm_memproto::rdma::grant`); the store moves the slab into a contiguous extent, the
//! session registers it for remote read and write and answers its address and rkey. The
//! client then reads and writes the slab's pages and page table with RDMA READ/WRITE, which
//! this thread never sees. The registrations live as long as the session.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use farvm_memproto::frame::{decode_body, decode_header, Body, HEADER_LEN};
use farvm_memproto::rdma::bootstrap::{ClientHello, CLIENT_HELLO_LEN, SLOT_BYTES};
use farvm_memproto::rdma::grant::{reply_bytes, GrantRequest, GRANT_REQUEST_LEN, GRANT_SLAB_PAGES};
use farvm_memproto::rdma::region::RemoteRegion;
use farvm_memproto::Status;
use farvm_transport::verbs::{Completion, MemoryRegion, RcQueuePair, RdmaDevice, POLL_BATCH};
use rustc_hash::FxHashMap;

use super::conn::{handle, ConnEnd, Session};
use super::store::Extent;
use super::Shared;

/// `wr_id` bit of a send (else a receive slot).
const SEND_BIT: u64 = 1 << 63;
/// Polls finding nothing before the session's thread sleeps on its completion channel.
const SPIN_ROUNDS: u32 = 64;
/// How long it sleeps at most: the server's stop flag is checked this often.
const STOP_EVERY: Duration = Duration::from_millis(100);
/// Send buffers beyond the client's window (a buffer comes back when its send completes).
const SPARE_SEND_BUFFERS: usize = 2;

fn verbs_failed(call: &'static str, rc: i32) -> ConnEnd {
    ConnEnd::Rdma(format!(
        "{call} failed: {}",
        std::io::Error::from_raw_os_error(rc)
    ))
}

/// Authenticates the control connection: CHALLENGE out, HELLO in, its response out.
fn authenticate(ctl: &mut TcpStream, sh: &Shared) -> Result<Session, ConnEnd> {
    let (mut sess, nonce) = Session::challenge();
    ctl.write_all(&sess.out)?;
    sess.out.clear();
    let mut hb = [0u8; HEADER_LEN];
    ctl.read_exact(&mut hb)?;
    let h = decode_header(&hb).inspect_err(|_| sh.metrics.malformed())?;
    let mut body = [0u8; 512];
    let b = body
        .get_mut(..h.body_len as usize)
        .ok_or(ConnEnd::Protocol("handshake frame too long"))?;
    ctl.read_exact(b)?;
    let f = decode_body(&h, b).inspect_err(|_| sh.metrics.malformed())?;
    if !matches!(f.body, Body::Hello { .. }) {
        return Err(ConnEnd::Protocol("RDMA session must start with HELLO"));
    }
    let res = handle(sh, &mut sess, &nonce, h.opcode, h.flags, &f);
    ctl.write_all(&sess.out)?;
    sess.out.clear();
    res?;
    Ok(sess)
}

/// Registered memory of a session: `count` slots of [`SLOT_BYTES`].
struct Slots {
    mr: Arc<MemoryRegion>,
    base: *mut u8,
    _mem: Box<[u8]>,
}

impl Slots {
    fn new(dev: &RdmaDevice, count: usize) -> Result<Self, ConnEnd> {
        let mut mem = vec![0u8; count * SLOT_BYTES].into_boxed_slice();
        let base = mem.as_mut_ptr();
        // SAFETY: `mem` lives in the same struct as the registration, which drops first.
        let mr =
            unsafe { dev.register(base, mem.len()) }.map_err(|e| ConnEnd::Rdma(e.to_string()))?;
        Ok(Self {
            mr,
            base,
            _mem: mem,
        })
    }

    fn ptr(&self, i: usize) -> *mut u8 {
        // SAFETY: callers pass i < count (slot indices come from our own work requests).
        unsafe { self.base.add(i * SLOT_BYTES) }
    }
}

/// Serves one RDMA session until it ends.
pub(crate) fn serve(mut ctl: TcpStream, sh: Arc<Shared>) -> Result<(), ConnEnd> {
    ctl.set_nodelay(true)?;
    ctl.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut sess = authenticate(&mut ctl, &sh)?;
    let mut hb = [0u8; CLIENT_HELLO_LEN];
    ctl.read_exact(&mut hb)?;
    let hello =
        ClientHello::from_bytes(&hb).ok_or(ConnEnd::Protocol("malformed RDMA bootstrap"))?;
    let local_ip = ctl.local_addr()?.ip();
    let dev = RdmaDevice::for_local_ip(local_ip).map_err(|e| ConnEnd::Rdma(e.to_string()))?;
    let window = hello.slots as usize;
    let nsend = window + SPARE_SEND_BUFFERS;
    let mut rig = Rig {
        qp: RcQueuePair::new(&dev, nsend as u32, window as u32, true)
            .map_err(|e| ConnEnd::Rdma(e.to_string()))?,
        recv: Slots::new(&dev, window)?,
        send: Slots::new(&dev, nsend)?,
        _dev: dev,
    };
    for i in 0..window {
        // SAFETY: slot i of the registered receive memory, the device's until polled.
        let rc = unsafe {
            rig.qp.post_recv(
                i as u64,
                rig.recv.mr.lkey(),
                rig.recv.ptr(i),
                SLOT_BYTES as u32,
            )
        };
        if rc != 0 {
            return Err(verbs_failed("ibv_post_recv", rc));
        }
    }
    rig.qp
        .connect(&hello.endpoint)
        .map_err(|e| ConnEnd::Rdma(e.to_string()))?;
    ctl.write_all(&rig.qp.endpoint().to_bytes())?;
    tracing::info!(device = rig._dev.name(), window, "RDMA session up");
    serve_queue_pair(&ctl, &sh, &mut sess, &rig, window, nsend)
}

/// A session's verbs resources. Field order is drop order: the queue pair before the memory
/// registered for it, the device (protection domain) last.
struct Rig {
    qp: RcQueuePair,
    recv: Slots,
    send: Slots,
    _dev: RdmaDevice,
}

/// Whether the control connection has something to read: a grant request, or the client's
/// close.
fn control_readable(ctl: &TcpStream) -> bool {
    let mut p = libc::pollfd {
        fd: ctl.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd on the stack; the socket is open (borrowed).
    unsafe { libc::poll(&mut p, 1, 0) > 0 }
}

/// A session's granted slabs: their registration (dropped first) and their memory.
type Grants = FxHashMap<(u64, u64), (Arc<MemoryRegion>, Arc<Extent>)>;

/// Answers one grant request from the control connection. `Ok(false)`: the client closed it.
fn serve_grant(
    mut ctl: &TcpStream,
    sh: &Shared,
    sess: &Session,
    dev: &RdmaDevice,
    grants: &mut Grants,
) -> Result<bool, ConnEnd> {
    let mut b = [0u8; GRANT_REQUEST_LEN];
    match ctl.read_exact(&mut b) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    let q = GrantRequest::from_bytes(&b).ok_or(ConnEnd::Protocol("malformed grant request"))?;
    let tenant = sess.tenant.ok_or(ConnEnd::Protocol("grant before HELLO"))?;
    let granted = match grants.get(&(q.ns, q.slab)) {
        Some((mr, x)) => Ok((mr.rkey(), x.ptr())),
        None => sh
            .store
            .namespace(q.ns, tenant, true)
            .and_then(|ns| ns.ok_or(Status::Denied))
            .and_then(|ns| sh.store.grant(&ns, q.slab))
            .and_then(|x| {
                // SAFETY: the extent stays mapped while `grants` holds it next to its
                // registration (dropped first); the client may access it at any time,
                // which is what a granted slab is for (its page table carries crc32c).
                let mr = unsafe { dev.register_remote(x.ptr(), x.len()) }.map_err(|e| {
                    tracing::warn!("registering a granted slab: {e}");
                    Status::CapacityExhausted
                })?;
                let r = (mr.rkey(), x.ptr());
                grants.insert((q.ns, q.slab), (mr, x));
                sh.metrics.grant();
                Ok(r)
            }),
    };
    let reply = match granted {
        Ok((rkey, ptr)) => reply_bytes(
            0,
            &RemoteRegion {
                server: 0,
                addr: ptr as u64,
                rkey,
                pages: GRANT_SLAB_PAGES,
            },
        ),
        Err(st) => {
            tracing::debug!(ns = q.ns, slab = q.slab, ?st, "grant refused");
            reply_bytes(
                st as u8,
                &RemoteRegion {
                    server: 0,
                    addr: 0,
                    rkey: 0,
                    pages: 0,
                },
            )
        }
    };
    ctl.write_all(&reply)?;
    Ok(true)
}

fn serve_queue_pair(
    ctl: &TcpStream,
    sh: &Shared,
    sess: &mut Session,
    rig: &Rig,
    window: usize,
    nsend: usize,
) -> Result<(), ConnEnd> {
    let (qp, recv, send) = (&rig.qp, &rig.recv, &rig.send);
    let nonce = [0u8; 32];
    let mut send_free: Vec<usize> = (0..nsend).rev().collect();
    let mut pending: VecDeque<(usize, usize)> = VecDeque::with_capacity(window);
    let mut wcs = [Completion::EMPTY; POLL_BATCH];
    let mut last_check = Instant::now();
    let mut quiet = 0u32;
    let mut armed = false;
    let mut grants = Grants::default();
    loop {
        let n = qp
            .poll(&mut wcs)
            .map_err(|rc| verbs_failed("ibv_poll_cq", rc))?;
        for wc in &wcs[..n] {
            if wc.status != 0 {
                return Err(ConnEnd::Rdma(format!(
                    "completion status {} (the client is gone)",
                    wc.status
                )));
            }
            if wc.wr_id & SEND_BIT != 0 {
                send_free.push((wc.wr_id & !SEND_BIT) as usize);
            } else if (wc.wr_id as usize) < window {
                pending.push_back((wc.wr_id as usize, wc.byte_len as usize));
            } else {
                return Err(ConnEnd::Rdma("completion for an unknown slot".into()));
            }
        }
        let mut worked = n > 0;
        while !pending.is_empty() && !send_free.is_empty() {
            let Some((i, len)) = pending.pop_front() else {
                break;
            };
            // SAFETY: slot i's receive completed: the device wrote `len` ≤ SLOT_BYTES bytes and
            // leaves the slot alone until it is posted again below.
            let frame = unsafe { std::slice::from_raw_parts(recv.ptr(i), len.min(SLOT_BYTES)) };
            let hb = frame
                .first_chunk::<HEADER_LEN>()
                .ok_or(ConnEnd::Protocol("short frame"))?;
            let h = decode_header(hb).inspect_err(|_| sh.metrics.malformed())?;
            let body = frame
                .get(HEADER_LEN..HEADER_LEN + h.body_len as usize)
                .ok_or(ConnEnd::Protocol("frame shorter than its header says"))?;
            let f = decode_body(&h, body).inspect_err(|_| sh.metrics.malformed())?;
            if matches!(f.body, Body::Hello { .. }) {
                return Err(ConnEnd::Protocol("HELLO on an authenticated RDMA session"));
            }
            let res = handle(sh, sess, &nonce, h.opcode, h.flags, &f);
            // SAFETY: as in `serve`: slot i is ours again once its frame is handled.
            let rc =
                unsafe { qp.post_recv(i as u64, recv.mr.lkey(), recv.ptr(i), SLOT_BYTES as u32) };
            if rc != 0 {
                return Err(verbs_failed("ibv_post_recv", rc));
            }
            if !sess.out.is_empty() {
                let sb = send_free.pop().unwrap_or_default();
                let len = sess.out.len().min(SLOT_BYTES);
                // SAFETY: send slot `sb` is free (its last send completed) and registered;
                // a response is at most one frame (SLOT_BYTES).
                let rc = unsafe {
                    std::ptr::copy_nonoverlapping(sess.out.as_ptr(), send.ptr(sb), len);
                    qp.post_send(
                        SEND_BIT | sb as u64,
                        send.mr.lkey(),
                        send.ptr(sb),
                        len as u32,
                    )
                };
                sess.out.clear();
                if rc != 0 {
                    return Err(verbs_failed("ibv_post_send", rc));
                }
            }
            res?;
            worked = true;
        }
        if last_check.elapsed() >= Duration::from_millis(2) {
            last_check = Instant::now();
            if sh.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            while control_readable(ctl) {
                if !serve_grant(ctl, sh, sess, &rig._dev, &mut grants)? {
                    return Ok(());
                }
            }
        }
        if worked {
            quiet = 0;
            armed = false;
            continue;
        }
        if armed {
            // Armed, and the poll since found nothing: the next completion raises an event.
            // Sleep until it does, or the control connection (a grant, the client's close)
            // wakes us; a one-sided client's pages need no thread here at all.
            if qp.wait(Some(ctl.as_raw_fd()), STOP_EVERY) {
                last_check = Instant::now() - Duration::from_millis(2);
            }
            armed = false;
            quiet = SPIN_ROUNDS - 4;
            continue;
        }
        // Nothing arrived: spin briefly (a pipelined client sends again within microseconds),
        // then arm the completion queue and poll once more before sleeping (a completion that
        // arrived before arming raises no event).
        quiet += 1;
        if quiet < SPIN_ROUNDS {
            std::thread::yield_now();
            continue;
        }
        qp.arm()
            .map_err(|rc| verbs_failed("ibv_req_notify_cq", rc))?;
        armed = true;
    }
}
