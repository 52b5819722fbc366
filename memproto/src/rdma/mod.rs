//! The transport-neutral half of one-sided RDMA: which registered server memory backs each
//! slab ([`region`]), how a page batch becomes as few RDMA READ/WRITE work requests as possible
//! ([`plan`]), and the queue-pair address both sides exchange over the TCP control connection
//! ([`endpoint`]). The verbs calls themselves live with the client (`farvm-memclient`, feature
//! `rdma`); this part is plain code, unit-tested on hosts without an RDMA device.

pub mod endpoint;
pub mod plan;
pub mod region;
