//! farvm-memserver: the remote page store (server).
//!
//! - [`server`]: the daemon as a library ([`server::Server::start`]).
//! - [`bench`]: the `farvm-memserver bench` latency/throughput comparison with a raw TCP floor
//!   (an in-process server measured by the client's bench, `farvm_memclient::bench`).
//! - [`process`]: observing a server process from outside (has SIGSTOP taken effect?).
//!
//! The wire protocol is `farvm-memproto`; the client is `farvm-memclient`.

pub mod bench;
pub mod process;
pub mod server;
