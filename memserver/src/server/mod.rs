//! The memory server: listener, per-connection threads, store and metrics endpoint.
//!
//! Embeddable: [`Server::start`] binds, spawns its threads and returns a [`ServerHandle`] with
//! the bound address; dropping or [`ServerHandle::shutdown`] stops it. The binary
//! `farvm-memserver` is a thin wrapper around this.

mod affinity;
pub mod arena;
pub mod conn;
pub mod metrics;
#[cfg(feature = "rdma")]
mod rdma;
#[doc(hidden)]
pub mod replay;
pub mod store;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rustc_hash::FxHashMap;

use arena::Arena;
use farvm_httpd::{HttpError, HttpServer};
use farvm_memproto::auth::Secret;
use farvm_memproto::PAGE_SIZE;
use metrics::Metrics;
use store::{Store, TenantId};

/// What a server is started with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on (port 0: ephemeral).
    pub listen: SocketAddr,
    /// Address of the RDMA listener, if any (PROTOCOL.md, "RDMA transport"): the TCP control
    /// connections of RDMA sessions; needs the `rdma` feature and an RDMA device with a RoCE
    /// GID for the address clients reach.
    pub rdma: Option<SocketAddr>,
    /// Capacity in bytes (rounded down to whole pages).
    pub capacity_bytes: u64,
    /// Tenant secrets; empty = open mode (every client is one anonymous tenant).
    pub tokens: Vec<Secret>,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// Host CPU every connection-serving thread is pinned to (`None`: the scheduler places
    /// them). A VMM that keeps its fault path on one CPU puts the server's half there too.
    pub connection_cpu: Option<usize>,
}

impl ServerConfig {
    /// Loopback, ephemeral port, open mode, no metrics endpoint.
    pub fn loopback(capacity_bytes: u64) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            rdma: None,
            capacity_bytes,
            tokens: Vec::new(),
            metrics: None,
            connection_cpu: None,
        }
    }
}

/// Server start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Capacity below one page.
    #[error("capacity {0} bytes is less than one page ({PAGE_SIZE} bytes)")]
    CapacityTooSmall(u64),
    /// Arena mapping failed.
    #[error(transparent)]
    Arena(#[from] arena::ArenaError),
    /// Bind failed.
    #[error("cannot listen on {addr}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
    },
    /// The connection CPU is not one this process may run on.
    #[error("cannot pin connection threads to CPU {cpu}: {reason}")]
    Cpu {
        /// The CPU asked for.
        cpu: usize,
        /// Why not.
        reason: String,
    },
    /// The metrics endpoint could not be started.
    #[error("metrics endpoint: {0}")]
    Metrics(HttpError),
    /// `rdma` was asked of a build without RDMA support.
    #[error("this farvm-memserver was built without RDMA support (cargo feature `rdma`)")]
    NoRdmaSupport,
    /// Other socket or thread error.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub tenants: FxHashMap<TenantId, Secret>,
    pub(crate) stop: Arc<AtomicBool>,
    conns: Mutex<FxHashMap<u64, LiveConn>>,
    next_conn: AtomicU64,
    connection_cpu: Option<usize>,
}

impl Shared {
    fn new(
        store: Arc<Store>,
        tokens: &[Secret],
        stop: Arc<AtomicBool>,
        connection_cpu: Option<usize>,
    ) -> Self {
        Self {
            store,
            metrics: Arc::new(Metrics::default()),
            tenants: tokens.iter().map(|s| (s.key_id(), s.clone())).collect(),
            stop,
            conns: Mutex::new(FxHashMap::default()),
            next_conn: AtomicU64::new(0),
            connection_cpu,
        }
    }
}

/// An open connection: a handle to shut it down.
struct LiveConn {
    stream: TcpStream,
}

/// The server type (namespace for [`Server::start`]).
pub struct Server;

/// A running server. Dropping it shuts it down.
pub struct ServerHandle {
    addr: SocketAddr,
    /// The `--metrics` endpoint; stopped when dropped.
    metrics_server: Option<HttpServer>,
    rdma_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Server {
    /// Maps the arena, binds and starts serving.
    pub fn start(cfg: ServerConfig) -> Result<ServerHandle, ServerError> {
        let pages = cfg.capacity_bytes / PAGE_SIZE as u64;
        if pages == 0 {
            return Err(ServerError::CapacityTooSmall(cfg.capacity_bytes));
        }
        if let Some(cpu) = cfg.connection_cpu {
            affinity::check(cpu).map_err(|reason| ServerError::Cpu { cpu, reason })?;
        }
        let store = Arc::new(Store::new(Arena::new(pages)?));
        if cfg.rdma.is_some() && !cfg!(feature = "rdma") {
            return Err(ServerError::NoRdmaSupport);
        }
        let listener = TcpListener::bind(cfg.listen).map_err(|source| ServerError::Bind {
            addr: cfg.listen,
            source,
        })?;
        let rdma_listener = match cfg.rdma {
            Some(a) => {
                Some(TcpListener::bind(a).map_err(|source| ServerError::Bind { addr: a, source })?)
            }
            None => None,
        };
        let rdma_addr = match &rdma_listener {
            Some(l) => Some(l.local_addr()?),
            None => None,
        };
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared::new(
            store.clone(),
            &cfg.tokens,
            stop.clone(),
            cfg.connection_cpu,
        ));
        let metrics_server = match cfg.metrics {
            Some(maddr) => Some(
                metrics::serve(maddr, shared.metrics.clone(), store.clone())
                    .map_err(ServerError::Metrics)?,
            ),
            None => None,
        };
        let sh = shared.clone();
        #[cfg_attr(not(feature = "rdma"), allow(unused_mut))]
        let mut threads = vec![std::thread::Builder::new()
            .name("memserver-accept".into())
            .spawn(move || accept_loop(listener, sh, conn::serve))?];
        #[cfg(feature = "rdma")]
        if let Some(l) = rdma_listener {
            let sh = shared.clone();
            threads.push(
                std::thread::Builder::new()
                    .name("memserver-rdma-accept".into())
                    .spawn(move || accept_loop(l, sh, rdma::serve))?,
            );
            tracing::info!(addr = ?rdma_addr, "memserver RDMA listener");
        }
        #[cfg(not(feature = "rdma"))]
        drop(rdma_listener);
        tracing::info!(%addr, pages, tenants = cfg.tokens.len(), "memserver listening");
        Ok(ServerHandle {
            addr,
            rdma_addr,
            metrics_server,
            shared,
            threads,
        })
    }
}

/// How a connection of one listener is served.
type ServeFn = fn(TcpStream, Arc<Shared>) -> Result<(), conn::ConnEnd>;

fn accept_loop(listener: TcpListener, sh: Arc<Shared>, serve: ServeFn) {
    for s in listener.incoming() {
        if sh.stop.load(Ordering::Acquire) {
            break;
        }
        let stream = match s {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("accept: {e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        let peer = stream.peer_addr().ok();
        let id = sh.next_conn.fetch_add(1, Ordering::Relaxed);
        if let Ok(c) = stream.try_clone() {
            sh.conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id, LiveConn { stream: c });
        }
        let sh2 = sh.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("memserver-conn-{id}"))
            .spawn(move || {
                if let Some(cpu) = sh2.connection_cpu {
                    // Before the handshake: a client that completed it is served here only.
                    if let Err(e) = affinity::pin_current(cpu) {
                        tracing::warn!(cpu, "cannot pin connection thread: {e}");
                    }
                }
                farvm_sandbox::enter(farvm_sandbox::ThreadClass::MemServerConnection);
                sh2.metrics.conn_open();
                match serve(stream, sh2.clone()) {
                    Ok(()) => tracing::debug!(?peer, "connection closed"),
                    Err(conn::ConnEnd::Malformed(e)) => {
                        tracing::warn!(?peer, "closing connection: malformed frame: {e}")
                    }
                    Err(e @ conn::ConnEnd::Version { .. }) => {
                        tracing::warn!(?peer, "refused: {e}")
                    }
                    Err(e) => tracing::info!(?peer, "closing connection: {e}"),
                }
                sh2.metrics.conn_close();
                sh2.conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
            });
        if let Err(e) = spawned {
            tracing::error!("cannot spawn connection thread: {e}");
            sh.conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id);
        }
    }
}

impl ServerHandle {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The bound RDMA listener address, if enabled.
    pub fn rdma_addr(&self) -> Option<SocketAddr> {
        self.rdma_addr
    }

    /// The bound metrics address, if enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_server.as_ref().and_then(HttpServer::tcp_addr)
    }

    /// The metrics as the endpoint serves them (OpenMetrics text).
    pub fn metrics_text(&self) -> String {
        metrics::exposition(self.shared.metrics.clone(), self.shared.store.clone()).render()
    }

    /// Errors counted for an op and status.
    pub fn error_count(&self, op: metrics::Op, st: farvm_memproto::Status) -> u64 {
        self.shared.metrics.errors(op, st)
    }

    /// Requests of `op` handled, over TCP or as RDMA SENDs (one-sided accesses are none).
    pub fn requests(&self, op: metrics::Op) -> u64 {
        self.shared.metrics.requests(op)
    }

    /// Slabs granted to RDMA sessions for one-sided access.
    pub fn rdma_grants(&self) -> u64 {
        self.shared.metrics.grants()
    }

    /// Pages stored, all namespaces.
    pub fn pages_stored(&self) -> u64 {
        self.shared.store.occupancy().used_pages
    }

    /// The server's occupancy (pages used and capacity) and instance id.
    pub fn occupancy(&self) -> farvm_memproto::StatInfo {
        self.shared.store.occupancy()
    }

    /// Reclaims namespace `id` for the pool: drops it and refuses it from then on (see
    /// [`store::Store::reclaim_namespace`]); returns the pages freed.
    pub fn reclaim_namespace(&self, id: u64) -> u64 {
        self.shared.store.reclaim_namespace(id)
    }

    /// The store itself: its pages as held ([`store::StoredPage`]), for tests that play a
    /// compromised server.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    /// The ids of every namespace this server holds.
    pub fn namespace_ids(&self) -> Vec<u64> {
        self.shared.store.namespace_ids()
    }

    /// Stops accepting, closes every connection and joins the server threads.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        self.metrics_server = None;
        // Wake the blocking accepts.
        let _ = TcpStream::connect(self.addr);
        if let Some(a) = self.rdma_addr {
            let _ = TcpStream::connect(a);
        }
        for (_, c) in self
            .shared
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain()
        {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}
