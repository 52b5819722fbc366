//! The receive side of a TCP link: frames read off the socket (by the background receiver or
//! a thread receiving inline), a read's pages landed in its request's buffer and checked there,
//! other responses applied to their ticket, and each outcome reported once.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use farvm_memproto::frame::{
    decode_body, decode_header, read_resp_bitmap_len, read_resp_present, Header, Opcode,
    HEADER_LEN, WIRE_PAGE,
};
use farvm_memproto::{Status, MAX_PAGES_PER_FRAME, PAGE_SIZE, SEAL_LEN};

use super::super::recv::{whole_frame_in, Wait};
use super::super::wire::{accept_read_pages, apply_response};
use super::super::Link;
use super::{Rx, TcpLink};
use crate::tickets::TicketOp;
use crate::ClientError;

/// At most this many `sched_yield`s while polling.
const POLL_YIELDS: u32 = 8;

/// Polls the socket for a response without blocking, giving the CPU away between polls with
/// `sched_yield`, for at most `poll_for` and [`POLL_YIELDS`] yields. True once bytes (or the
/// end of the stream, or an error: the caller's frame read sees it again) arrived.
///
/// Why (`ClientConfig::demand_poll`): the thread that waits for a demand read has nothing else
/// to do. With the server's connection thread on the same CPU (`--fault-path-cpu` and the
/// local memserver) the yield lets it run, and its answer finds the waiter awake: its `write`
/// wakes nobody. The vCPU waiting for the page is blocked in its fault meanwhile.
fn poll_response(rx: &mut Rx, poll_for: Duration) -> bool {
    let start = std::time::Instant::now();
    let mut yields = 0u32;
    loop {
        match rx.buf.fill(Wait::Now) {
            Ok(_) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return true,
        }
        if yields >= POLL_YIELDS || start.elapsed() >= poll_for {
            return false;
        }
        std::thread::yield_now();
        yields += 1;
    }
}

/// How reading a frame ended for the connection.
enum FrameEnd {
    /// Read whole; the connection goes on.
    Next,
    /// The stream failed or carried a malformed frame: the connection is done.
    Failed,
}

impl TcpLink {
    /// Claims the slot of response `req_id` for receiving: its ticket, or `None` for a late
    /// answer to a request that already timed out (dropped).
    fn claim(&self, req_id: u64) -> Option<(usize, u32)> {
        self.sched().claim(req_id, u64::MAX)
    }

    /// Frees a receiving slot and reports its ticket's outcome (once: only the thread that
    /// claimed the slot finishes it).
    fn finish_slot(&self, slot: usize, ticket: u32, outcome: Result<u32, ClientError>) {
        let (owned, queued) = {
            let mut s = self.sched();
            let owned = s.finish(slot);
            if owned {
                self.inflight_hint.store(s.inflight, Ordering::SeqCst);
            }
            (owned, !s.broken && s.has_queued())
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
        // What the outcome's sink submits meanwhile goes through the sender thread.
        let _receiving = super::super::ReceivingGuard::enter();
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

    /// A READ response's body: presence bitmap, then each present page's crc32c, seal and
    /// bytes, landed in the ticket's buffer and checked there (crc32c, then the seal).
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
                            rx.buf.push_segment(io.seal_ptr(i), SEAL_LEN);
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
        let ns = t.ns;
        let Some(io) = t.io.as_mut() else {
            return (
                Err(ClientError::Protocol("read without buffer")),
                FrameEnd::Next,
            );
        };
        // A new sealer after a rotation draws a salt: if the OS RNG fails, the pages cannot be
        // checked, so none is delivered.
        let opener = match rx.opener.as_mut().map(|ring| ring.sealer()).transpose() {
            Ok(opener) => opener,
            Err(_) => {
                io.clear_present();
                return (Err(ClientError::Unauthentic), FrameEnd::Next);
            }
        };
        let outcome = accept_read_pages(io, ns, &bitmap[..bl], &rx.crcs[..], opener);
        (outcome, FrameEnd::Next)
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
    pub(super) fn wake_rx(&self) {
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
    pub(super) fn receive_loop(self: Arc<Self>) {
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

    /// Receives on the calling thread until `done()` holds or the connection fails (see
    /// [`Link::receive_inline`]).
    pub(super) fn receive_on_this_thread(&self, done: &dyn Fn() -> bool, handoff: bool) {
        self.inline_active.fetch_add(1, Ordering::SeqCst);
        let mut contended = 0u32;
        // A demand waiter (`handoff`) polls before it blocks if so configured
        // (`poll_response`).
        let mut poll = handoff && !self.demand_poll.is_zero();
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
            // A demand waiter may poll first, once per call (`poll_response`); otherwise, or
            // when that found nothing, block in `recv` itself (no `poll(2)` first: one
            // syscall per response, as in a plain blocking read). Its `RX_SLICE` timeout
            // means a response that arrives on another connection (fail-over) is seen
            // through `done()` within a few ms.
            if rx.buf.buffered().is_empty()
                && !(std::mem::take(&mut poll) && poll_response(&mut rx, self.demand_poll))
            {
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
}
