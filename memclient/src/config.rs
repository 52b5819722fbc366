//! Client settings ([`ClientConfig`]) and the connections ("lanes") a server gets.

use std::time::Duration;

use farvm_memproto::auth::Secret;
use farvm_transport::Endpoint;

/// Client settings. [`ClientConfig::new`] gives the defaults.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Memory servers, each with the transport its links use: an RDMA server's address is
    /// its RDMA listener (`farvm-memserver --rdma`), and its links need the `rdma` feature and
    /// an RDMA device on the route to it.
    pub servers: Vec<Endpoint>,
    /// Tenant secret (None: the servers must run in open mode).
    pub secret: Option<Secret>,
    /// Replication factor; default 2 with ≥ 2 servers, else 1.
    pub replication: Option<usize>,
    /// Slab size in pages (default 262144 = 1 GiB).
    pub slab_pages: u64,
    /// Bulk connections per server (default 2): writes, prefetch reads, discards.
    pub conns_per_server: usize,
    /// One more connection per server that carries only demand reads (default true), so a
    /// read a vCPU is blocked on never queues behind megabytes of prefetch responses on a
    /// shared TCP stream (the server serves each connection in order, on its own thread).
    pub demand_lane: bool,
    /// One more connection per server that carries only writes (default false): a write-back
    /// an evictor waits on then never queues behind prefetch reads on a bulk connection. (The
    /// server applies each connection's requests in order; across connections there is no
    /// order, so a caller must see a write complete before it reads the page back, as the
    /// paging engine does.)
    pub write_lane: bool,
    /// Requests in flight per connection (default 32).
    pub window: usize,
    /// Part of the window only demand requests may use (default window / 4).
    pub demand_reserve: usize,
    /// Requests queued or in flight per connection (default 256).
    pub depth: usize,
    /// Per-request timeout (default 2 s). A timed-out server is taken out of service.
    pub timeout: Duration,
    /// Connect and handshake timeout (default 2 s).
    pub connect_timeout: Duration,
    /// Outstanding user requests at most (default 1024).
    pub max_requests: usize,
    /// Replica servers chosen for the VM by a memory pool (indices into `servers`, one list
    /// per pool slab): slab `k` is first placed on `slab_homes[k % len]`, skipping servers out
    /// of service, full or draining. Empty (the default): power of two choices on free space.
    pub slab_homes: Vec<Vec<u16>>,
    /// The pool owns placement (set with `slab_homes`): the client never picks a server of its
    /// own. A slab is placed on its home's servers in service, a slab that lost a replica is
    /// refilled onto a home server that does not hold it, and a full server's replica moves
    /// onto one; where the home has none, the slab stays as it is until the pool's follower
    /// gives it a new home ([`crate::Client::set_slab_home`]), so that every replica is
    /// where the pool's records (rack-aware, reserved) say it is. Off (the default): the
    /// client re-replicates and relocates by power of two choices among its servers.
    pub pool_placement: bool,
    /// How long a thread waiting for a demand read (`Client::submit_wait`) polls its socket,
    /// giving the CPU away between polls, before it blocks (default zero: it blocks at once).
    /// Pays when the server's connection thread shares the waiter's CPU (`farvm run
    /// --fault-path-cpu` with the local memserver): its answer then finds the waiter awake and
    /// wakes nobody (docs/data-path-journal.md, "The demand path").
    pub demand_poll: Duration,
    /// A fault to inject, for tests of the layers above (default none).
    pub fault: Option<Fault>,
    /// The VM's page key (default none: pages travel and rest in the clear). With a key, every
    /// page a request with versions writes ([`IoBuf::set_versions`](crate::IoBuf), what the
    /// page store sends) is sealed with AES-256-GCM in the send buffer, and every page such a
    /// read receives is authenticated and opened in place in its destination; a page that
    /// fails is never delivered ([`ClientError::Unauthentic`], docs/sealing.md). TCP links
    /// only: an RDMA server with a key is refused at connect ([`ClientError::NoLink`]).
    pub page_key: Option<farvm_seal::PageKey>,
}

/// Faults the client injects on purpose (`ClientConfig::fault`), so that tests can show what
/// the layers above do when a replica is wrong. Never set in production.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The first slab copy (re-replication or move) skips its catch-up: the new replica lacks
    /// the writes made while it was copied, gets no write from then on while the slab has
    /// another replica, and serves the slab's reads first. The paging engine must reject what
    /// it returns stale and read those pages elsewhere.
    StaleCopy,
}

impl ClientConfig {
    /// Defaults for these servers (a bare address is a TCP server).
    pub fn new<E: Into<Endpoint>>(servers: impl IntoIterator<Item = E>) -> Self {
        Self {
            servers: servers.into_iter().map(Into::into).collect(),
            secret: None,
            replication: None,
            slab_pages: 1 << 18,
            conns_per_server: 2,
            demand_lane: true,
            write_lane: false,
            window: 32,
            demand_reserve: 8,
            depth: 256,
            timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            max_requests: 1024,
            slab_homes: Vec::new(),
            pool_placement: false,
            demand_poll: Duration::ZERO,
            fault: None,
            page_key: None,
        }
    }

    /// Connections opened per server: the bulk ones, then the write lane and the demand lane
    /// when configured (in that order, see [`Lane`]).
    pub(crate) fn conns_total(&self) -> usize {
        self.conns_per_server.max(1) + usize::from(self.write_lane) + usize::from(self.demand_lane)
    }
}

/// Which of a server's connections a request takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// Any bulk connection (reads, discards, recovery traffic).
    Bulk,
    /// The write lane if configured ([`ClientConfig::write_lane`]), else bulk.
    Write,
    /// The demand lane if configured ([`ClientConfig::demand_lane`]), else bulk.
    Demand,
}
