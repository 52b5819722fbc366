//! farvm-memserver: the remote page store (server) and the client the VMM uses.
//!
//! - [`protocol`]: the versioned wire format (PROTOCOL.md), crc32c per page, HMAC handshake.
//! - [`server`]: the daemon as a library ([`server::Server::start`]).
//! - [`client`]: pooled, pipelined, two-priority client with replication over several servers.
//! - [`transport`]: the page-transport abstraction shared by TCP and RDMA (feature `rdma`).
//! - [`bench`]: the `farvm-memserver bench` latency/throughput comparison with a raw TCP floor.
//! - [`process`]: observing a server process from outside (has SIGSTOP taken effect?).

pub mod bench;
pub mod client;
pub mod process;
/// The wire protocol (`farvm-memproto`).
pub use farvm_memproto as protocol;
pub mod server;
pub mod transport;
