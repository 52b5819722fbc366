//! The transport-neutral half of RDMA, plain code that client and server share and that is
//! unit-tested on hosts without an RDMA device (the verbs calls live in `farvm-memclient`,
//! feature `rdma`):
//! - [`bootstrap`] and [`endpoint`]: what the two sides exchange on the TCP control connection
//!   of an RDMA session (queue-pair addresses, receive slots). This is the transport farvm runs:
//!   protocol frames as SEND/RECV messages over a reliable-connected queue pair.
//! - [`region`] and [`plan`]: one-sided access (region grants, work-request planning), for a
//!   transport that reads a server's registered arena directly; not on the wire yet.

pub mod bootstrap;
pub mod endpoint;
pub mod plan;
pub mod region;
