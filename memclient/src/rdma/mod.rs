//! One-sided RDMA under the client: completion-status mapping ([`wc`], plain code, always
//! built and tested) and the verbs layer (feature `rdma`: device, registered memory, connected
//! queue pairs, and [`RdmaTransport`], which reads and writes a server's registered arena
//! directly). The transport-neutral planning (region grants, work requests, queue-pair
//! addresses) is in `farvm_memproto::rdma`. The RDMA transport plugs in under the client at the
//! connection seam (`connection::Link`) once the server side grants regions on the wire.

#[cfg(feature = "rdma")]
mod verbs;
pub mod wc;

#[cfg(feature = "rdma")]
pub use verbs::{RdmaDevice, RdmaError, RdmaQueuePair, RdmaTransport};
