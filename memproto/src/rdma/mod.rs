//! The transport-neutral half of RDMA, plain code that client and server share and that is
//! unit-tested on hosts without an RDMA device (the verbs calls live in `farvm-memclient`,
//! feature `rdma`):
//! - [`bootstrap`] and [`endpoint`]: what the two sides exchange on the TCP control connection
//!   of an RDMA session (queue-pair addresses, receive slots); control frames then travel as
//!   SEND/RECV messages over a reliable-connected queue pair.
//! - [`grant`], [`region`] and [`plan`]: one-sided access to pages. The server grants a slab
//!   of its registered arena (address, rkey) on the control connection; the client plans RDMA
//!   READ/WRITE work requests for a page batch against its grants.

pub mod bootstrap;
pub mod endpoint;
pub mod grant;
pub mod plan;
pub mod region;
