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
