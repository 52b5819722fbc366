//! How a memory server is reached, as one type from every front door down to the connection
//! that opens the link:
//!
//! - [`Transport`]: TCP, or RDMA with pages moved one-sided or by SEND/RECV;
//! - [`Endpoint`]: a server's address and its transport, written as a URL
//!   (`[tcp://]HOST:PORT`, `rdma://HOST:PORT`) in `farvm run --memserver`, the host config,
//!   a domain's metadata and the pool's server records;
//! - [`verbs`] (feature `verbs`): the RDMA verbs layer (device by local address, registered
//!   memory, a connected queue pair with allocation-free post and poll) that the memory
//!   server's RDMA sessions and the client's RDMA link both use.
//!
//! The client's links live in `farvm_memclient::connection`; the transport-neutral RDMA plan
//! (bootstrap, queue-pair endpoints, grants) is the wire protocol's, `farvm_memproto::rdma`.

mod endpoint;
#[cfg(feature = "serde")]
mod serde_text;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use endpoint::{Endpoint, EndpointError, Transport};
