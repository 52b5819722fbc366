//! The memory server: listener, per-connection threads, store and metrics endpoint.
//!
//! Embeddable: [`Server::start`] binds, spawns its threads and returns a [`ServerHandle`] with
//! the bound address; dropping or [`ServerHandle::shutdown`] stops it. The binary
//! `farvm-memserver` is a thin wrapper around this.

pub mod arena;
pub mod conn;
pub mod metrics;
pub mod store;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rustc_hash::FxHashMap;

use crate::protocol::auth::Secret;
use crate::protocol::PAGE_SIZE;
use arena::Arena;
use metrics::Metrics;
use store::{Store, TenantId};

/// What a server is started with.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on (port 0: ephemeral).
    pub listen: SocketAddr,
    /// Capacity in bytes (rounded down to whole pages).
    pub capacity_bytes: u64,
    /// Tenant secrets; empty = open mode (every client is one anonymous tenant).
    pub tokens: Vec<Secret>,
    /// Where to serve Prometheus metrics, if anywhere.
    pub metrics: Option<SocketAddr>,
}

impl ServerConfig {
    /// Loopback, ephemeral port, open mode, no metrics endpoint.
    pub fn loopback(capacity_bytes: u64) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            capacity_bytes,
            tokens: Vec::new(),
            metrics: None,
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
    /// Other socket or thread error.
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

pub(crate) struct Shared {
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub tenants: FxHashMap<TenantId, Secret>,
    stop: Arc<AtomicBool>,
    conns: Mutex<FxHashMap<u64, LiveConn>>,
    next_conn: AtomicU64,
}

/// An open connection: a handle to shut it down, and the thread serving it.
struct LiveConn {
    stream: TcpStream,
    /// Kernel thread id of its serving thread (0 until that thread has started).
    tid: i32,
}

/// The server type (namespace for [`Server::start`]).
pub struct Server;

/// A running server. Dropping it shuts it down.
pub struct ServerHandle {
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
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
        let store = Arc::new(Store::new(Arena::new(pages)?));
        let listener = TcpListener::bind(cfg.listen).map_err(|source| ServerError::Bind {
            addr: cfg.listen,
            source,
        })?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let shared = Arc::new(Shared {
            store: store.clone(),
            metrics: Arc::new(Metrics::default()),
            tenants: cfg.tokens.iter().map(|s| (s.key_id(), s.clone())).collect(),
            stop: stop.clone(),
            conns: Mutex::new(FxHashMap::default()),
            next_conn: AtomicU64::new(0),
        });
        let mut threads = Vec::new();
        let mut metrics_addr = None;
        if let Some(maddr) = cfg.metrics {
            let ml = TcpListener::bind(maddr).map_err(|source| ServerError::Bind {
                addr: maddr,
                source,
            })?;
            metrics_addr = Some(ml.local_addr()?);
            let (m, s, st) = (shared.metrics.clone(), store.clone(), stop.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("memserver-metrics".into())
                    .spawn(move || metrics::serve(ml, m, s, st))?,
            );
        }
        let sh = shared.clone();
        threads.push(
            std::thread::Builder::new()
                .name("memserver-accept".into())
                .spawn(move || accept_loop(listener, sh))?,
        );
        tracing::info!(%addr, pages, tenants = cfg.tokens.len(), "memserver listening");
        Ok(ServerHandle {
            addr,
            metrics_addr,
            shared,
            threads,
        })
    }
}

fn accept_loop(listener: TcpListener, sh: Arc<Shared>) {
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
                .insert(id, LiveConn { stream: c, tid: 0 });
        }
        let sh2 = sh.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("memserver-conn-{id}"))
            .spawn(move || {
                if let Some(c) = sh2
                    .conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get_mut(&id)
                {
                    // SAFETY: gettid has no preconditions.
                    c.tid = unsafe { libc::gettid() };
                }
                sh2.metrics.conn_open();
                match conn::serve(stream, sh2.clone()) {
                    Ok(()) => tracing::debug!(?peer, "connection closed"),
                    Err(conn::ConnEnd::Malformed(e)) => {
                        tracing::warn!(?peer, "closing connection: malformed frame: {e}")
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

    /// The bound metrics address, if enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Prometheus text of the current metrics.
    pub fn metrics_text(&self) -> String {
        self.shared.metrics.render(&self.shared.store)
    }

    /// Errors counted for an op and status.
    pub fn error_count(&self, op: metrics::Op, st: crate::protocol::Status) -> u64 {
        self.shared.metrics.errors(op, st)
    }

    /// Pages stored, all namespaces.
    pub fn pages_stored(&self) -> u64 {
        self.shared.store.occupancy().used_pages
    }

    /// Kernel thread ids of the threads serving open connections, in connection order. An
    /// embedding process uses them to place its fault path on CPUs (`farvm run
    /// --fault-path-cpu`): a connection's thread has registered its id before it answers the
    /// handshake, so every connection a client has completed is listed.
    pub fn connection_thread_ids(&self) -> Vec<i32> {
        let conns = self.shared.conns.lock().unwrap_or_else(|e| e.into_inner());
        let mut ids: Vec<(u64, i32)> = conns
            .iter()
            .filter(|(_, c)| c.tid > 0)
            .map(|(&id, c)| (id, c.tid))
            .collect();
        ids.sort_unstable();
        ids.into_iter().map(|(_, tid)| tid).collect()
    }

    /// Stops accepting, closes every connection and joins the server threads.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if self.shared.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Wake the blocking accept.
        let _ = TcpStream::connect(self.addr);
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
