//! farvm-memserver: the remote page store (server).
//!
//! - [`server`]: the daemon as a library ([`server::Server::start`]).
//! - [`pool_member`]: membership in a memory pool (`--pool`): registration in etcd and the
//!   garbage collector of this server's namespaces of VMs that left; [`orphans`]: the check
//!   that finds namespaces nothing in the pool owns any more.
//! - [`process`]: observing a server process from outside (has SIGSTOP taken effect?).
//!
//! The wire protocol is `farvm-memproto`; the RDMA verbs layer is `farvm-transport`'s. The
//! client, `farvm-memclient`, is not linked here (`farvm-lab bench memserver` measures a server
//! through it).

pub mod orphans;
pub mod pool_member;
pub mod process;
pub mod server;
