//! The connection layer under the client: how a ticket reaches one server and how its outcome
//! comes back.
//!
//! The client sees each connection as a [`Link`]: it submits tickets (at a priority) and is
//! told through a [`Sink`] when each finished, or when the link failed. A link reads a ticket's
//! request from the ticket table and writes a read's pages straight into the ticket's buffer.
//! [`tcp`] is the pipelined TCP link; `rdma` (feature `rdma`) moves pages by one-sided RDMA and
//! carries the other frames as SEND/RECV messages over an RDMA queue pair (its verbs layer is
//! `farvm_transport::verbs`; [`wc`] maps its completion statuses). Both schedule their
//! requests with [`sched`]. Which link a server gets is its endpoint's
//! [`farvm_transport::Transport`].

pub(crate) mod handshake;
#[cfg(feature = "rdma")]
pub(crate) mod rdma;
pub(crate) mod recv;
pub(crate) mod sched;
pub(crate) mod tcp;
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(crate) mod wc;
pub(crate) mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use farvm_memproto::auth::Secret;
use farvm_transport::Transport;

use crate::tickets::Tickets;
use crate::{ClientError, Priority};

/// Where a link reports finished tickets (implemented by the client core).
pub(crate) trait Sink: Send + Sync {
    /// `ticket` finished on `server` with `outcome` (count of pages on success).
    fn complete(&self, ticket: u32, server: u16, outcome: Result<u32, ClientError>);
    /// The link to `server` failed.
    fn connection_failed(&self, server: u16);
}

/// Per-connection limits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    /// Requests in flight at most.
    pub window: usize,
    /// Window slots only demand requests may use.
    pub demand_reserve: usize,
    /// Requests queued or in flight at most.
    pub depth: usize,
    /// Per-request timeout (from when it is sent).
    pub timeout: Duration,
}

/// Who sends a submitted ticket, and who receives its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendMode {
    /// The submitting thread writes the request itself if the window allows (no thread hop);
    /// the link's background receiver is woken for the response.
    Caller,
    /// As `Caller`, but the submitting thread receives the response itself
    /// ([`Link::receive_inline`]): the background receiver is not woken.
    CallerReceives,
    /// The link's sender thread writes it: the submitter may be a receiving thread, which
    /// must never block on a socket write.
    Deferred,
}

/// One connection to one server, as the client uses it.
pub(crate) trait Link: Send + Sync {
    /// Queues or sends `ticket`. On `Err` nothing was sent and the sink will not be called
    /// for it.
    fn submit(&self, ticket: u32, prio: Priority, mode: SendMode) -> Result<(), ClientError>;
    /// Receives on the calling thread until `done()` holds or the link fails (the waiting
    /// thread picks its own response up: no hand-off). `handoff`: when done, wake the
    /// background receiver for requests still in flight.
    fn receive_inline(&self, done: &dyn Fn() -> bool, handoff: bool);
    /// Requests in flight (lock-free snapshot).
    fn inflight(&self) -> usize;
    /// Bytes of read responses' pages (with their crc32c) since the link opened: copied
    /// through a receive buffer, and received straight into their destinations.
    fn landed(&self) -> (u64, u64);
    /// Requests queued or in flight.
    fn outstanding(&self) -> usize;
    /// True once the link failed or was closed.
    fn is_broken(&self) -> bool;
    /// Closes the link; outstanding requests fail with `Disconnected`.
    fn close(&self);
    /// A one-line account of the link if a request has been in flight for `stale` or longer.
    fn stall_report(&self, stale: Duration) -> Option<String>;
}

/// What opening a link needs.
pub(crate) struct LinkSpec<'a> {
    pub addr: SocketAddr,
    /// The server's index in the client's list (reported back to the sink).
    pub server: u16,
    pub secret: Option<&'a Secret>,
    pub limits: ConnLimits,
    pub connect_timeout: Duration,
    /// The link to open (for RDMA, `addr` is the server's RDMA bootstrap listener).
    pub transport: Transport,
    /// `ClientConfig::demand_poll`.
    pub demand_poll: Duration,
    /// The client's page keys (`ClientConfig::page_key` and its rotations): the link seals
    /// what it sends and opens what it receives.
    pub keys: Option<&'a Arc<farvm_seal::KeyRing>>,
}

thread_local! {
    /// Set while this thread handles a received frame (and so runs the sinks of the requests
    /// it finishes).
    static RECEIVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Marks the calling thread as receiving until dropped.
pub(crate) struct ReceivingGuard(bool);

impl ReceivingGuard {
    pub fn enter() -> Self {
        Self(RECEIVING.with(|r| r.replace(true)))
    }
}

impl Drop for ReceivingGuard {
    fn drop(&mut self) {
        RECEIVING.with(|r| r.set(self.0));
    }
}

/// Whether the calling thread is handling a received frame: a request it submits must not be
/// written to a socket from here (a receiver blocked on a full send buffer could deadlock with
/// a server blocked on ours), so it goes through the link's sender thread.
pub(crate) fn on_receive_side() -> bool {
    RECEIVING.with(|r| r.get())
}

/// Opens the link its transport names and starts its threads.
pub(crate) fn connect(
    spec: &LinkSpec<'_>,
    tickets: Arc<Tickets>,
    sink: Arc<dyn Sink>,
) -> Result<Arc<dyn Link>, ClientError> {
    match spec.transport {
        // Only the TCP link seals: an RDMA link would send and accept pages in the clear.
        transport @ Transport::Rdma { .. } if spec.keys.is_some() => Err(ClientError::NoLink {
            addr: spec.addr,
            transport,
            why: "; page sealing is implemented for TCP only (run with --page-encryption \
                      off to use RDMA)",
        }),
        Transport::Tcp => {
            let c: Arc<dyn Link> = tcp::TcpLink::connect(spec, tickets, sink)?;
            Ok(c)
        }
        #[cfg(feature = "rdma")]
        Transport::Rdma { one_sided } => {
            let c: Arc<dyn Link> = rdma::RdmaLink::connect(spec, one_sided, tickets, sink)?;
            Ok(c)
        }
        #[cfg(not(feature = "rdma"))]
        Transport::Rdma { .. } => Err(ClientError::Rdma {
            addr: spec.addr,
            reason: "this build has no RDMA support (cargo feature `rdma`)",
        }),
        // A transport `farvm_transport` knows before this client has its link.
        transport => Err(ClientError::NoLink {
            addr: spec.addr,
            transport,
            why: "",
        }),
    }
}
