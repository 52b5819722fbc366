//! Typed client errors.

use std::net::SocketAddr;

use farvm_memproto::Status;
use farvm_transport::Transport;

/// Everything a client call can fail with. Cheap to clone (no heap data), so one failure can
/// be reported to several waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// TCP connect or handshake I/O failed.
    #[error("cannot connect to memserver {addr}: {kind}")]
    Connect {
        /// Server address.
        addr: SocketAddr,
        /// The I/O error kind.
        kind: std::io::ErrorKind,
    },
    /// The server refused our proof, or could not prove it knows the secret.
    #[error("authentication with memserver {addr} failed: {reason}")]
    Auth {
        /// Server address.
        addr: SocketAddr,
        /// Why.
        reason: &'static str,
    },
    /// The namespace belongs to another tenant.
    #[error("namespace belongs to another tenant")]
    Denied,
    /// The memory pool reclaimed the namespace: its VM's lease expired and the pool's
    /// collector claimed its pages, so the server refuses it for good (a VMM paused or cut
    /// off from etcd for longer than its lease plus the servers' grace).
    #[error(
        "the memory pool reclaimed this namespace: its VM's lease expired (the VMM was paused \
         or cut off from etcd for longer than its lease and the servers' grace) and its pages \
         were dropped"
    )]
    Reclaimed,
    /// A server has no free page for this write; see PROTOCOL.md ("Capacity").
    #[error("memserver capacity exhausted")]
    CapacityExhausted,
    /// A page failed its crc32c check (in transit or at rest).
    #[error("page checksum mismatch")]
    ChecksumMismatch,
    /// No response within the configured timeout.
    #[error("request timed out")]
    Timeout,
    /// The connection closed or failed with the request outstanding.
    #[error("connection to memserver lost")]
    Disconnected,
    /// Every replica of the slab is dead or failed (for now: a server out of service may come
    /// back with its pages).
    #[error("no live replica holds this slab")]
    NoLiveReplica,
    /// The data is gone for good: every server that held a replica of the slab restarted
    /// empty. Distinct from [`ClientError::NoLiveReplica`] (wait and retry) and from a page
    /// never written (absent, reads as zeros). A read's buffer still says which pages were
    /// delivered (`IoBuf::is_present`): the others are the lost ones.
    #[error("page lost: every memserver that held it restarted empty")]
    Lost,
    /// Too many requests outstanding (tickets or connection slots exhausted).
    #[error("too many requests outstanding")]
    QueueFull,
    /// The request itself is invalid (empty, too large, spans slabs...).
    #[error("invalid request: {0}")]
    InvalidRequest(&'static str),
    /// The server speaks another wire-protocol version (PROTOCOL.md, "Versioning").
    #[error(
        "memserver {addr} speaks wire protocol version {server}, this client speaks {client}: \
         run farvm and farvm-memserver from the same release"
    )]
    Version {
        /// Server address.
        addr: SocketAddr,
        /// The version in the server's CHALLENGE header.
        server: u8,
        /// [`farvm_memproto::PROTOCOL_VERSION`].
        client: u8,
    },
    /// An RDMA link could not be set up: no RDMA device, none on the route to the server, a
    /// build without RDMA support, or a failed verbs call (the log has the details). A
    /// configuration error, like [`ClientError::Auth`]: not retried.
    #[error("cannot reach memserver {addr} over RDMA: {reason}")]
    Rdma {
        /// Server address (its RDMA bootstrap listener).
        addr: SocketAddr,
        /// Why.
        reason: &'static str,
    },
    /// The server's transport is one this client has no link for (a configuration error:
    /// not retried): not built in, or not one that seals pages when the client has a page
    /// key (sealing is TCP only, docs/sealing.md).
    #[error(
        "cannot reach memserver {addr}: this client has no link for transport {transport}{why}"
    )]
    NoLink {
        /// Server address.
        addr: SocketAddr,
        /// Its transport.
        transport: Transport,
        /// Empty, or why not (starts with "; ").
        why: &'static str,
    },
    /// A sealed page failed authentication: altered, another page's, another VM's, or an older
    /// version than the one expected (docs/sealing.md). Never delivered: the replica that sent
    /// it is dropped from the slab and the read fails over to another; with none left the
    /// page is [`ClientError::Lost`].
    #[error("page failed authentication (altered, misplaced or stale copy on the memserver)")]
    Unauthentic,
    /// The server violated the protocol.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// The server answered with an unexpected status.
    #[error("server error status {0:?}")]
    Server(Status),
}

impl ClientError {
    /// True when the error means the server (or the path to it) failed, so another replica
    /// should be tried and the server taken out of service.
    pub fn is_server_failure(&self) -> bool {
        matches!(
            self,
            ClientError::Timeout
                | ClientError::Disconnected
                | ClientError::Protocol(_)
                | ClientError::Connect { .. }
        )
    }

    pub(crate) fn from_status(st: Status) -> Self {
        match st {
            Status::Denied => ClientError::Denied,
            Status::Reclaimed => ClientError::Reclaimed,
            Status::CapacityExhausted => ClientError::CapacityExhausted,
            Status::ChecksumMismatch => ClientError::ChecksumMismatch,
            other => ClientError::Server(other),
        }
    }
}
