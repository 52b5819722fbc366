//! One pipelined TCP connection to one server.
//!
//! Its requests are scheduled by [`super::sched`]: up to `window` in flight, demand before
//! prefetch, a reserve of the window for demand.
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
//! crc32c check (and, on a sealing link, opened): a request cut short or with a bad page
//! reports no page present.
//!
//! Sealing (`ClientConfig::page_key`): the writer seals a write's pages in place in its send
//! buffer, the receive side opens a read's pages in place where they landed, each with its
//! own [`RingSealer`], under the lock it already holds (no allocation, no other lock; after
//! a key rotation it rebuilds its sealer once, at its next use).

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod receive;

use farvm_memproto::frame::{HEADER_LEN, MAX_BODY};
use farvm_memproto::MAX_PAGES_PER_FRAME;
use farvm_seal::RingSealer;

use super::handshake::{handshake, io_err};
use super::recv::RecvBuf;
use super::sched::Sched;
use super::wire::encode_request;
use super::{ConnLimits, Link, LinkSpec, SendMode, Sink};
use crate::tickets::Tickets;
use crate::{ClientError, Priority};

/// The receive side: the socket's receive buffer, the crc32c values of a landing, and the
/// opener of sealed pages.
struct Rx {
    buf: RecvBuf,
    crcs: Box<[[u8; 4]; MAX_PAGES_PER_FRAME]>,
    opener: Option<RingSealer>,
}

/// How long one blocking receive on the socket may wait (`SO_RCVTIMEO`) before the inline
/// waiter re-checks whether its request completed elsewhere (fail-over to another server).
pub(crate) const RX_SLICE: Duration = Duration::from_millis(1);

struct Writer {
    stream: TcpStream,
    buf: Vec<u8>,
    sealer: Option<RingSealer>,
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
    /// How long a demand waiter polls before it blocks (`ClientConfig::demand_poll`).
    demand_poll: Duration,
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
        stream.set_read_timeout(Some(RX_SLICE)).map_err(&err)?;
        let fd = stream.as_raw_fd();
        let sealer = || {
            spec.keys
                .map(|ring| RingSealer::new(ring.clone()))
                .transpose()
                .map_err(|_| ClientError::InvalidRequest("the OS RNG failed to salt a page sealer"))
        };
        let conn = Arc::new(Self {
            server,
            limits,
            sched: Mutex::new(Sched::new(limits)),
            cv: Condvar::new(),
            writer: Mutex::new(Writer {
                stream: stream.try_clone().map_err(&err)?,
                buf: Vec::with_capacity(HEADER_LEN + MAX_BODY),
                sealer: sealer()?,
            }),
            tickets,
            sink,
            broken: AtomicBool::new(false),
            inflight_hint: AtomicUsize::new(0),
            rx: Mutex::new(Rx {
                // Per page: its crc32c, its seal, its data.
                buf: RecvBuf::new(fd, 3 * MAX_PAGES_PER_FRAME),
                crcs: Box::new([[0; 4]; MAX_PAGES_PER_FRAME]),
                opener: sealer()?,
            }),
            inline_active: AtomicUsize::new(0),
            rx_park: Mutex::new(()),
            rx_cv: Condvar::new(),
            rx_parked: AtomicBool::new(false),
            fd,
            stream,
            landed_copied: AtomicU64::new(0),
            landed_in_place: AtomicU64::new(0),
            demand_poll: spec.demand_poll,
        });
        let c = conn.clone();
        std::thread::Builder::new()
            .name(format!("memclient-rx-{server}"))
            .spawn(move || {
                farvm_sandbox::enter(farvm_sandbox::ThreadClass::StoreConnection);
                c.receive_loop()
            })
            .map_err(&err)?;
        let c = conn.clone();
        std::thread::Builder::new()
            .name(format!("memclient-tx-{server}"))
            .spawn(move || {
                farvm_sandbox::enter(farvm_sandbox::ThreadClass::StoreConnection);
                c.send_loop()
            })
            .map_err(&err)?;
        Ok(conn)
    }

    fn sched(&self) -> MutexGuard<'_, Sched> {
        self.sched.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes one request; on failure the connection is torn down.
    fn send(&self, req_id: u64, ticket: u32) {
        let mut w = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        let w = &mut *w;
        w.buf.clear();
        let sealer = match w.sealer.as_mut().map(RingSealer::sealer).transpose() {
            Ok(sealer) => sealer,
            Err(e) => {
                tracing::error!(server = self.server, "cannot make a page sealer: {e}");
                self.fail_all();
                return;
            }
        };
        let encoded = {
            let t = self.tickets.lock(ticket);
            encode_request(&mut w.buf, req_id, &t, sealer)
        };
        if let Err(e) = encoded {
            tracing::error!(server = self.server, "cannot seal a write: {e}");
            self.fail_all();
            return;
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
            if s.fail_all(&mut failed).already {
                return;
            }
            self.broken.store(true, Ordering::Release);
            self.inflight_hint.store(s.inflight, Ordering::SeqCst);
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
            if let Some(go) = s.next() {
                self.inflight_hint.store(s.inflight, Ordering::SeqCst);
                drop(s);
                self.send(go.req_id, go.ticket);
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
            let f = s.expire(Instant::now(), &mut expired);
            self.inflight_hint.store(s.inflight, Ordering::SeqCst);
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
            if f.stuck_receiving {
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
        match s.admit(ticket, prio, false, mode != SendMode::Deferred)? {
            Some(go) => {
                self.inflight_hint.store(s.inflight, Ordering::SeqCst);
                drop(s);
                self.send(go.req_id, go.ticket);
                if mode == SendMode::Caller {
                    self.wake_rx();
                }
            }
            None => {
                drop(s);
                self.cv.notify_one();
            }
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
        self.sched().outstanding()
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
        let oldest = s.oldest(Instant::now())?;
        if oldest < stale {
            return None;
        }
        let queues = s.summary();
        drop(s);
        let (mut unread, mut unsent): (libc::c_int, libc::c_int) = (-1, -1);
        // SAFETY: FIONREAD / TIOCOUTQ on our own open socket write one c_int each into the
        // locals passed; failures leave -1.
        unsafe {
            libc::ioctl(self.fd, libc::FIONREAD, &mut unread);
            libc::ioctl(self.fd, libc::TIOCOUTQ, &mut unsent);
        }
        Some(format!(
            "oldest request in flight for {oldest:.1?}; {queues}; socket: {unread} B unread, \
             {unsent} B unsent; send side {}, receive side {} ({} receiving inline, background \
             receiver {})",
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
