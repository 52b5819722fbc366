//! The receive side of a TCP connection: a buffer for frame headers and short bodies, and
//! page payloads received straight into their destinations.
//!
//! At a frame boundary a receive takes whatever has arrived, up to [`BOUNDARY_FILL`] bytes: a
//! burst of responses in one `recv`. Once a read response's header and presence bitmap are
//! parsed, its pages go to their destinations: what that receive already took is copied once,
//! the rest is received with one `readv` whose vectors are the destination pages themselves
//! (plus the free buffer last, for whatever follows). (Receiving a large response's header
//! alone first, to land all of its pages in place, measured slower here: the extra receive and
//! the receiver's extra wake-ups cost more than the copy.) Every syscall here uses the socket's
//! `SO_RCVTIMEO` slice: [`Wait::Patient`] retries it (a frame is never cut by a timeout, a
//! half-read frame cannot be resumed), [`Wait::Slice`] returns it so an inline waiter can
//! re-check whether its request finished elsewhere.

use std::io;
use std::os::fd::RawFd;

use farvm_memproto::frame::{decode_header, HEADER_LEN};

/// Most bytes a receive asks for at a frame boundary (see the module docs).
const BOUNDARY_FILL: usize = 256 * 1024;
/// Buffer size: a boundary receive plus room to keep a partly received frame header or
/// short body while the rest arrives.
const CAPACITY: usize = 2 * BOUNDARY_FILL;

/// Whether a receive that times out (`SO_RCVTIMEO`) is retried.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wait {
    /// Retry: used inside a frame.
    Patient,
    /// Return `WouldBlock` after one slice: used by an inline waiter at a frame boundary.
    Slice,
    /// Do not wait (`MSG_DONTWAIT`): return `WouldBlock` if nothing has arrived. Used by a
    /// demand waiter that polls before it blocks.
    Now,
}

/// A destination segment of a landing: `len` bytes at `ptr`.
#[derive(Clone, Copy)]
struct Seg {
    ptr: *mut u8,
    len: usize,
}

/// Received bytes not consumed yet, plus the vectors of a landing.
pub(crate) struct RecvBuf {
    fd: RawFd,
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    segs: Vec<Seg>,
    iov: Vec<libc::iovec>,
}

// SAFETY: the raw pointers in `segs`/`iov` are only set and used within one `land` call, by
// the thread holding the receive side (the destinations belong to the request being received).
unsafe impl Send for RecvBuf {}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

impl RecvBuf {
    /// A buffer for the socket `fd` (owned by the caller, open as long as this buffer is used)
    /// landing up to `max_segs` page segments at once.
    pub fn new(fd: RawFd, max_segs: usize) -> Self {
        Self {
            fd,
            buf: vec![0u8; CAPACITY].into_boxed_slice(),
            start: 0,
            end: 0,
            segs: Vec::with_capacity(max_segs),
            iov: Vec::with_capacity(max_segs + 1),
        }
    }

    /// The bytes received and not consumed.
    pub fn buffered(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Drops `n` buffered bytes.
    pub fn consume(&mut self, n: usize) {
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// One `recv` into the free space, at most `max` bytes. `Ok(0)`: the peer closed.
    fn recv_some(&mut self, max: usize, wait: Wait) -> io::Result<usize> {
        if self.start > 0 && self.buf.len() - self.end < max {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let room = (self.buf.len() - self.end).min(max);
        loop {
            let dst = &mut self.buf[self.end..self.end + room];
            let flags = if wait == Wait::Now {
                libc::MSG_DONTWAIT
            } else {
                0
            };
            // SAFETY: `dst` is writable memory of `room` bytes; `fd` is an open socket.
            let n = unsafe { libc::recv(self.fd, dst.as_mut_ptr().cast(), room, flags) };
            if n >= 0 {
                self.end += n as usize;
                return Ok(n as usize);
            }
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted || (wait == Wait::Patient && is_timeout(&e)) {
                continue;
            }
            return Err(e);
        }
    }

    /// One boundary receive (see the module docs); `Ok(0)`: the peer closed.
    pub fn fill(&mut self, wait: Wait) -> io::Result<usize> {
        self.recv_some(BOUNDARY_FILL, wait)
    }

    /// Waits until at least `n` bytes (≤ the buffer size) are buffered.
    pub fn ensure(&mut self, n: usize) -> io::Result<()> {
        if n > self.buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "frame part larger than the receive buffer",
            ));
        }
        while self.end - self.start < n {
            let want = n - (self.end - self.start);
            if self.recv_some(want.max(BOUNDARY_FILL), Wait::Patient)? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(())
    }

    /// Drops the next `n` bytes of the stream (a frame nobody waits for).
    pub fn skip(&mut self, mut n: usize) -> io::Result<()> {
        loop {
            let have = (self.end - self.start).min(n);
            self.consume(have);
            n -= have;
            if n == 0 {
                return Ok(());
            }
            if self.recv_some(n.min(CAPACITY), Wait::Patient)? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// Starts a landing: the segments pushed next receive the following bytes of the stream.
    pub fn begin_landing(&mut self) {
        self.segs.clear();
    }

    /// Adds `len` bytes at `ptr` to the landing.
    ///
    /// # Safety
    /// `ptr..ptr+len` must stay writable and untouched by anyone else until `land` returns.
    pub unsafe fn push_segment(&mut self, ptr: *mut u8, len: usize) {
        self.segs.push(Seg { ptr, len });
    }

    /// Fills the pushed segments with the next bytes of the stream, in order: first from the
    /// buffer (a copy), the rest straight from the socket with `readv`, whose last vector is
    /// the free buffer so that whatever follows the segments is kept for the next frame.
    /// Returns how many bytes were copied from the buffer and how many received in place.
    pub fn land(&mut self) -> io::Result<Landed> {
        let mut k = 0;
        let mut landed = Landed::default();
        while k < self.segs.len() && self.start < self.end {
            let s = &mut self.segs[k];
            let n = s.len.min(self.end - self.start);
            // SAFETY: `s.ptr..+n` is writable per `push_segment`'s contract; the source is our
            // buffer, which cannot overlap the caller's destination.
            unsafe {
                std::ptr::copy_nonoverlapping(self.buf[self.start..].as_ptr(), s.ptr, n);
                s.ptr = s.ptr.add(n);
            }
            s.len -= n;
            if s.len == 0 {
                k += 1;
            }
            landed.copied += n as u64;
            self.consume(n);
        }
        while k < self.segs.len() {
            // The buffer is empty here (else the loop above would have gone on).
            self.start = 0;
            self.end = 0;
            self.iov.clear();
            for s in &self.segs[k..] {
                self.iov.push(libc::iovec {
                    iov_base: s.ptr.cast(),
                    iov_len: s.len,
                });
            }
            self.iov.push(libc::iovec {
                iov_base: self.buf.as_mut_ptr().cast(),
                iov_len: BOUNDARY_FILL,
            });
            // SAFETY: every vector is writable memory (the segments per `push_segment`, the
            // last our own buffer); at most 2 × 256 + 1 vectors, under IOV_MAX.
            let r = unsafe { libc::readv(self.fd, self.iov.as_ptr(), self.iov.len() as i32) };
            if r < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted || is_timeout(&e) {
                    continue;
                }
                return Err(e);
            }
            if r == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let mut n = r as usize;
            let total = n;
            while n > 0 && k < self.segs.len() {
                let s = &mut self.segs[k];
                let m = s.len.min(n);
                // SAFETY: stays within the segment (m ≤ s.len).
                s.ptr = unsafe { s.ptr.add(m) };
                s.len -= m;
                n -= m;
                if s.len == 0 {
                    k += 1;
                }
            }
            // Bytes past the segments landed in the buffer.
            landed.in_place += (total - n) as u64;
            self.end = n;
        }
        self.segs.clear();
        Ok(landed)
    }
}

/// Bytes of one landing: copied from the receive buffer, and received in place.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Landed {
    pub copied: u64,
    pub in_place: u64,
}

/// Whether `buffered` starts with a whole frame (so reading it never touches the socket).
/// A malformed header counts as ready: reading it fails the connection at once.
pub(crate) fn whole_frame_in(buffered: &[u8]) -> bool {
    let Some(hb) = buffered.first_chunk::<HEADER_LEN>() else {
        return false;
    };
    match decode_header(hb) {
        Ok(h) => buffered.len() >= HEADER_LEN + h.body_len as usize,
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;

    use farvm_memproto::frame::{decode_body, encode, Body, Frame};

    use crate::connection::tcp::RX_SLICE;

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let a = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (b, _) = l.accept().expect("accept");
        (a, b)
    }

    /// Segments are filled from the buffered bytes first, then straight from the socket; the
    /// bytes after them stay buffered for the next frame.
    #[test]
    fn landing_fills_segments_in_order_and_keeps_what_follows() {
        let (mut tx, rx) = pair();
        let stream: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
        let mut r = RecvBuf::new(rx.as_raw_fd(), 8);
        // 20 bytes arrive first: a receive takes them all, 10 are consumed.
        tx.write_all(&stream[..20]).expect("send");
        r.ensure(20).expect("first bytes");
        r.consume(10);
        tx.write_all(&stream[20..]).expect("send");
        let mut a = vec![0u8; 4];
        let mut b = vec![0u8; 60_000];
        r.begin_landing();
        // SAFETY: `a` and `b` outlive the landing and are not touched meanwhile.
        unsafe {
            r.push_segment(a.as_mut_ptr(), a.len());
            r.push_segment(b.as_mut_ptr(), b.len());
        }
        let landed = r.land().expect("land");
        // The 10 buffered bytes were copied; the rest came straight from the socket.
        assert_eq!(
            landed,
            Landed {
                copied: 10,
                in_place: 59_994
            }
        );
        assert_eq!(a, stream[10..14]);
        assert_eq!(b, stream[14..60_014]);
        r.ensure(100).expect("what follows");
        assert_eq!(&r.buffered()[..100], &stream[60_014..60_114]);
        r.skip(70_000 - 60_014 - 1).expect("skip");
        r.ensure(1).expect("last byte");
        assert_eq!(r.buffered(), &stream[69_999..]);
        drop(tx);
        r.consume(1);
        assert_eq!(r.fill(Wait::Patient).expect("end of stream"), 0);
    }

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
