//! RDMA under the client: completion-status mapping ([`wc`], plain code, always built and
//! tested) and the verbs layer (feature `rdma`: device by local address, registered memory, a
//! connected queue pair with allocation-free post and poll). The link that carries the
//! protocol over it is `connection::rdma`; the memory server uses the same verbs layer for its
//! side. The transport-neutral parts (bootstrap, endpoints) are in `farvm_memproto::rdma`.

#[cfg(feature = "rdma")]
mod verbs;
pub mod wc;

#[cfg(feature = "rdma")]
pub use sideway::ibverbs::memory_region::MemoryRegion;
#[cfg(feature = "rdma")]
pub use verbs::{Completion, OneSided, RcQueuePair, RdmaDevice, RdmaError, POLL_BATCH};
