//! farvm-memclient: the memserver client, and the paging engine's page store over it.
//!
//! - [`Client`] ([`api`]): a pool of pipelined connections to several servers, slab placement
//!   by power-of-two choices on free capacity (`placement`), replication factor R with read
//!   fail-over, re-replication after a server dies and rejoin of servers that answer again
//!   ([`health`]). One [`Client::submit`] whose result goes where [`ReplyTo`] says; the read
//!   a vCPU waits on is received by the waiting thread itself ([`Client::submit_wait`]).
//! - [`PageStore`] ([`store`]): `farvm_pageio::RemoteStore` over the client, for the paging
//!   engine. Read responses are received straight into the engine's pages.
//! - [`bench`]: read latency and throughput against a raw TCP floor.
//! - Servers are [`Endpoint`]s: each one's [`Transport`] says which link it gets (TCP, or
//!   RDMA with feature `rdma`, on `farvm_transport`'s verbs layer).
//!
//! # Hot path
//! A request carries a caller-owned [`IoBuf`] (allocated once) that comes back when it
//! finishes. Nothing is heap-allocated per request and no global lock is taken: tickets come
//! from a lock-free queue (`tickets`), placement is sharded, each connection and each
//! ticket has its own lock. Page bytes land where the [`IoBuf`] says — in the buffer itself, or
//! in the caller's memory for an [`IoBuf::external`] buffer — and a read's pages are marked
//! present only once all of them landed and passed their crc32c check.
//!
//! # Absent pages
//! A read of a page that was never written (or was discarded) succeeds with the page marked
//! absent: [`IoBuf::is_present`] is false and its bytes are unspecified. The VMM zero-fills it.
//!
//! # Namespaces
//! A namespace is the VM id, a `u64`; [`namespace_for_name`] hashes a name to one.
//!
//! # Durability
//! A write completes when every live replica of its slab acknowledged it. If a replica dies
//! the slab is re-replicated onto another live server (when one exists); until then, or when
//! fewer than R servers are alive, the slab runs degraded (counted in [`ClientStats`]).
//! The client keeps the placement map in memory: it is per VM and lives as long as the VMM.
//!
//! # Servers that come back
//! A server is taken out of service on a timeout or a lost connection, which may be a
//! transient fault (an overloaded host, a network blip). The last live replica of a slab is
//! therefore never dropped from the slab's placement: the slab is *suspended* (its requests
//! fail with [`ClientError::NoLiveReplica`], the caller retries) until that server answers
//! again. The maintenance thread reconnects to servers out of service every second; one that
//! answers with the same instance id is put back in service and degraded slabs are
//! re-replicated onto it; one that restarted (another id) lost its pages, so it is removed from
//! every placement first. A slab left with no replica is lost: its reads fail with
//! [`ClientError::Lost`] until a write places it afresh. A server that never comes back is
//! dropped the same way once its owner says it is gone for good ([`Client::retire_server`]:
//! a memory pool's follower, when the server has been out of the pool long enough).

pub mod api;
pub mod bench;
mod config;
mod connection;
mod core;
mod error;
mod fills;
pub mod health;
mod iobuf;
mod placement;
mod reseal;
mod servers;
pub mod store;
mod tickets;

pub use api::{Client, Finished, FinishedSink, ReplyTo, Request};
pub use config::{ClientConfig, Fault};
/// The check of a READ response's landed pages (crc32c, then the seal), for the fuzzer
/// (`farvm-lab fuzz`): not part of the client's API.
#[doc(hidden)]
pub use connection::wire::accept_read_pages;
pub use error::ClientError;
pub use farvm_pageio::{Op, Priority};
pub use farvm_seal::{KeyError, KeyId, KeyRing, PageKey, RingState, RotateError};
pub use farvm_transport::{Endpoint, Transport};
pub use health::{ClientStats, RelocateError};
pub use iobuf::IoBuf;
pub use reseal::Resealed;
pub use servers::MAX_SERVERS;
pub use store::{PageStore, StoreConfig, StoreCounters};
pub use tickets::MAX_REPLICAS;

/// Hashes a VM name to a namespace id (FNV-1a 64; stable across versions).
pub fn namespace_for_name(name: &str) -> u64 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in name.as_bytes() {
        h ^= *b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}
