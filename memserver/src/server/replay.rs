//! A memory server without sockets, fed request frames from memory: the connection's own
//! request path ([`conn::serve_one`]: frame decoding, the handler, the store and its tenancy
//! checks) behind a byte slice instead of a `TcpStream`. It exists for the fuzzer
//! (`farvm-lab fuzz`), which needs millions of connections' worth of frames per minute; a
//! deployment serves through [`super::Server::start`].

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use farvm_memproto::auth::Secret;
use farvm_memproto::frame::MAX_BODY;
use farvm_memproto::PAGE_SIZE;

use super::arena::Arena;
use super::conn::{self, ConnEnd, Session, Step};
use super::store::Store;
use super::{ServerError, Shared};

/// An in-process server: a real store (arena, namespaces, tenants) served by
/// [`ReplayConn`]s.
pub struct ReplayServer {
    shared: Arc<Shared>,
}

impl ReplayServer {
    /// A server of `capacity_bytes` (whole pages) for the tenants of `tokens` (empty: open
    /// mode, as `farvm-memserver` without `--token-file`).
    pub fn new(capacity_bytes: u64, tokens: &[Secret]) -> Result<Self, ServerError> {
        let pages = capacity_bytes / PAGE_SIZE as u64;
        if pages == 0 {
            return Err(ServerError::CapacityTooSmall(capacity_bytes));
        }
        let store = Arc::new(Store::new(Arena::new(pages)?));
        let stop = Arc::new(AtomicBool::new(false));
        Ok(Self {
            shared: Arc::new(Shared::new(store, tokens, stop, None)),
        })
    }

    /// The store, to look at what it holds.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// A new connection whose CHALLENGE (in [`ReplayConn::responses`]) carries
    /// `server_nonce`: a real connection draws it from the OS, a fuzzer from its seed, so
    /// that a run replays.
    pub fn connect(&self, server_nonce: [u8; 32]) -> ReplayConn {
        let session = Session::challenge_with(server_nonce);
        ReplayConn {
            shared: self.shared.clone(),
            session,
            server_nonce,
            body: vec![0u8; MAX_BODY],
        }
    }
}

/// How serving one frame ended.
#[derive(Debug)]
pub enum Served {
    /// Handled; the connection goes on.
    Next,
    /// No bytes were left before a frame: the peer closed the connection.
    Closed,
    /// The connection ends: the frame could not be read whole or decoded (no response), its
    /// version is another one (the caller of a real connection answers), or the handler
    /// ended the session (its error response is in `responses`).
    Ended(ConnEnd),
}

/// One connection's session (before or after HELLO) and its receive buffer.
pub struct ReplayConn {
    shared: Arc<Shared>,
    session: Session,
    server_nonce: [u8; 32],
    body: Vec<u8>,
}

impl ReplayConn {
    /// The nonce of this connection's CHALLENGE (what a HELLO's proof covers).
    pub fn server_nonce(&self) -> &[u8; 32] {
        &self.server_nonce
    }

    /// Reads one frame from the front of `input` (advancing it past what was read) and serves
    /// it, as the connection's thread does with the bytes off its socket.
    pub fn serve_frame(&mut self, input: &mut &[u8]) -> Served {
        let step = conn::serve_one(
            input,
            &mut self.body,
            &self.shared,
            &mut self.session,
            &self.server_nonce,
        );
        match step {
            Ok(Step::Handled(Ok(()))) => Served::Next,
            Ok(Step::Handled(Err(e))) | Err(e) => Served::Ended(e),
            Ok(Step::Closed) => Served::Closed,
            Ok(Step::OtherVersion(client)) => Served::Ended(ConnEnd::Version {
                client,
                server: farvm_memproto::PROTOCOL_VERSION,
            }),
        }
    }

    /// The responses written since the last [`ReplayConn::take_responses`] (what the
    /// connection flushes to its socket).
    pub fn responses(&self) -> &[u8] {
        &self.session.out
    }

    /// Forgets the responses read (the connection flushed them).
    pub fn take_responses(&mut self) {
        self.session.out.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farvm_memproto::frame::{decode, encode, Body, Frame, PageSel, WIRE_PAGE};
    use farvm_memproto::{wire_crc, SEAL_LEN};

    fn request(body: Body<'_>, req_id: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let f = Frame {
            req_id,
            namespace: 9,
            body,
        };
        encode(&mut out, &f, false);
        out
    }

    /// A replayed connection serves frames as a socket's would: one answer per request, the
    /// page written read back, and a frame cut short ends it without an answer.
    #[test]
    fn a_replayed_connection_answers_each_frame_and_ends_on_a_cut_one() {
        let server = ReplayServer::new(16 * PAGE_SIZE as u64, &[]).unwrap();
        let mut conn = server.connect([3; 32]);
        let (f, _) = decode(conn.responses()).unwrap();
        assert!(matches!(f.body, Body::Challenge { server_nonce, .. } if server_nonce == [3; 32]));
        conn.take_responses();

        let mut page = vec![0u8; WIRE_PAGE];
        page[4 + SEAL_LEN..].fill(0x5a);
        let crc = wire_crc(&[0; SEAL_LEN], &page[4 + SEAL_LEN..]);
        page[..4].copy_from_slice(&crc.to_le_bytes());
        let sel = PageSel::Run { start: 4, count: 1 };
        let hello = Body::Hello {
            key_id: [0; 8],
            client_nonce: [1; 32],
            mac: [0; 32],
        };
        let mut stream = request(hello, 1);
        stream.extend(request(Body::Write { sel, pages: &page }, 2));
        stream.extend(request(Body::Read(sel), 3));
        let cut = request(Body::Read(sel), 4);
        stream.extend_from_slice(&cut[..cut.len() - 1]);

        let mut input: &[u8] = &stream;
        let mut answers = Vec::new();
        for _ in 0..3 {
            assert!(matches!(conn.serve_frame(&mut input), Served::Next));
            let (f, n) = decode(conn.responses()).unwrap();
            assert_eq!(n, conn.responses().len(), "one answer per request");
            answers.push(format!("{:?}", f.body));
            if let Body::ReadResp { bitmap, pages, .. } = f.body {
                assert_eq!((bitmap, pages), (&[1u8][..], &page[..]));
            }
            conn.take_responses();
        }
        assert!(answers[0].starts_with("HelloResp"), "{answers:?}");
        assert_eq!(answers[1], "WriteResp { written: 1 }");
        assert!(answers[2].starts_with("ReadResp"), "{answers:?}");
        assert!(matches!(
            conn.serve_frame(&mut input),
            Served::Ended(ConnEnd::Io(_))
        ));
        assert!(conn.responses().is_empty());
        assert!(matches!(conn.serve_frame(&mut &[][..]), Served::Closed));
        assert_eq!(server.store().occupancy().used_pages, 1);
    }
}
