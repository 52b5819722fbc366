//! The pool directory on etcd (v3 API): memory servers and VMs register under leases they
//! keep alive, VMs are admitted with a transaction that commits their placement, and anyone
//! can read or watch the whole pool (see [`crate::keys`] for the layout).
//!
//! The API is blocking. etcd I/O runs on the directory's own small tokio runtime (one worker
//! thread, `farvm-pool-etcd`): lease keep-alives, watches and record updates run there in the
//! background, so a caller on a data path never waits on etcd ([`ServerRegistration::update`]
//! only hands the new record over). Blocking calls give up after the request timeout.
//!
//! # etcd going away
//! Calls made while etcd does not answer fail with [`PoolError::Unreachable`] ("etcd
//! unreachable at … (no answer for N s)") and [`Directory::connectivity`] says so;
//! the client reconnects by itself when etcd is back. Registrations keep retrying their lease
//! meanwhile; a lease that expired in the outage is granted again and the record re-put (a
//! VM's only while its placement still exists: see [`RegistrationState::Lost`]).

mod codec;
mod error;
mod gc;
mod handover;
mod lease;
mod racks;
mod server;
mod settle;
mod snapshot;
mod vm;
mod watch;

pub use error::PoolError;
pub use lease::RegistrationState;
pub use server::ServerRegistration;
pub use snapshot::SnapshotHolding;
pub use vm::VmRegistration;
pub use watch::PoolWatch;

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};

use crate::ids::ServerId;
use crate::keys::KeyLayout;
use crate::placement::Move;
use crate::record::SlabRecord;
use crate::status::PoolStatus;
use crate::view::PoolView;
use error::is_transport;

/// Where the directory is and how long it waits.
#[derive(Debug, Clone)]
pub struct DirectoryConfig {
    /// etcd client URLs, e.g. `http://10.77.0.2:2379`.
    pub endpoints: Vec<String>,
    /// Key prefix (default [`crate::keys::DEFAULT_PREFIX`]).
    pub prefix: String,
    /// How long one blocking call waits for etcd (default 3 s).
    pub request_timeout: Duration,
    /// TCP connect timeout (default 2 s).
    pub connect_timeout: Duration,
    /// The most operations etcd accepts in one transaction (etcd's `--max-txn-ops`, default
    /// 128). An admission needs one per slab plus one.
    pub max_txn_ops: usize,
}

impl DirectoryConfig {
    /// Defaults for these endpoints.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            prefix: crate::keys::DEFAULT_PREFIX.to_owned(),
            request_timeout: Duration::from_secs(3),
            connect_timeout: Duration::from_secs(2),
            max_txn_ops: 128,
        }
    }
}

/// Whether etcd answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connectivity {
    /// The last request got an answer.
    Connected,
    /// Requests have been failing for `down_for`.
    Unreachable {
        /// How long.
        down_for: Duration,
        /// The last transport error.
        detail: String,
    },
}

/// Tracks whether etcd answers, from the outcome of every request.
#[derive(Debug, Default)]
pub(crate) struct Link {
    down_since: Mutex<Option<(Instant, String)>>,
    endpoints: String,
}

impl Link {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(Instant, String)>> {
        self.down_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn up(&self) {
        *self.lock() = None;
    }

    /// Records a transport failure and returns the error callers see.
    pub fn down(&self, detail: String) -> PoolError {
        let mut g = self.lock();
        let since = match &*g {
            Some((since, _)) => *since,
            None => {
                tracing::warn!(endpoints = %self.endpoints, %detail, "etcd unreachable");
                Instant::now()
            }
        };
        *g = Some((since, detail.clone()));
        PoolError::Unreachable {
            endpoints: self.endpoints.clone(),
            down_for: since.elapsed(),
            detail,
        }
    }

    pub fn state(&self) -> Connectivity {
        match &*self.lock() {
            None => Connectivity::Connected,
            Some((since, detail)) => Connectivity::Unreachable {
                down_for: since.elapsed(),
                detail: detail.clone(),
            },
        }
    }

    /// Maps an etcd error: transport failures mark the link down.
    pub fn error(&self, e: etcd_client::Error) -> PoolError {
        if is_transport(&e) {
            self.down(e.to_string())
        } else {
            self.up();
            PoolError::Etcd(e.to_string())
        }
    }
}

/// What the directory, its registrations and watches share.
pub(crate) struct Shared {
    rt: Option<tokio::runtime::Runtime>,
    pub client: Client,
    pub keys: KeyLayout,
    pub cfg: DirectoryConfig,
    pub link: Arc<Link>,
}

impl Shared {
    pub fn rt(&self) -> &tokio::runtime::Runtime {
        self.rt.as_ref().expect("runtime lives until drop")
    }

    /// Runs one etcd request to completion from a blocking caller, within the request timeout.
    pub fn call<T, F>(&self, fut: F) -> Result<T, PoolError>
    where
        F: Future<Output = Result<T, etcd_client::Error>>,
    {
        let timeout = self.cfg.request_timeout;
        // The timer must be created inside the runtime.
        match self
            .rt()
            .block_on(async move { tokio::time::timeout(timeout, fut).await })
        {
            Ok(Ok(v)) => {
                self.link.up();
                Ok(v)
            }
            Ok(Err(e)) => Err(self.link.error(e)),
            Err(_) => Err(self
                .link
                .down(format!("no answer within {:.1}s", timeout.as_secs_f64()))),
        }
    }

    /// Reads the whole pool at one revision.
    pub fn view(&self) -> Result<PoolView, PoolError> {
        let mut kv = self.client.kv_client();
        let root = self.keys.root();
        let resp = self.call(kv.get(root, Some(GetOptions::new().with_prefix())))?;
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok(codec::build_view(
            &self.keys,
            revision,
            resp.kvs()
                .iter()
                .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.value())),
        ))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Never blocks, also when the last handle is dropped inside another runtime.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// A handle on the pool directory. Cheap to clone; registrations and watches keep its
/// runtime alive.
#[derive(Clone)]
pub struct Directory {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("endpoints", &self.shared.cfg.endpoints)
            .field("prefix", &self.shared.cfg.prefix)
            .finish()
    }
}

/// Interval of the HTTP/2 pings on the connection to etcd (at least etcd's minimum, 5 s).
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(10);

impl Directory {
    /// A directory on `cfg.endpoints`. Does not wait for etcd: the first requests fail with
    /// [`PoolError::Unreachable`] while it does not answer ([`Directory::ping`] checks).
    pub fn connect(cfg: DirectoryConfig) -> Result<Self, PoolError> {
        if cfg.endpoints.is_empty() {
            return Err(PoolError::Config("no etcd endpoint given".into()));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("farvm-pool-etcd")
            .enable_all()
            .build()
            .map_err(PoolError::Runtime)?;
        let opts = ConnectOptions::new()
            .with_connect_timeout(cfg.connect_timeout)
            .with_timeout(cfg.request_timeout)
            // HTTP/2 pings no more often than etcd allows: its server (--grpc-keepalive-min-time,
            // 5 s by default, and no pings without a stream) answers more frequent ones, or any
            // on an idle connection, with GOAWAY "too_many_pings" and closes the connection,
            // failing the calls in flight on it. Calls have their own timeout; the pings only
            // find a dead etcd under a long-lived stream (a lease keep-alive, a watch).
            .with_keep_alive(KEEP_ALIVE_EVERY, cfg.request_timeout)
            .with_keep_alive_while_idle(false);
        let client = rt
            .block_on(Client::connect(&cfg.endpoints, Some(opts)))
            .map_err(|e| PoolError::Config(format!("etcd endpoints {:?}: {e}", cfg.endpoints)))?;
        let link = Arc::new(Link {
            down_since: Mutex::new(None),
            endpoints: cfg.endpoints.join(","),
        });
        Ok(Self {
            shared: Arc::new(Shared {
                rt: Some(rt),
                client,
                keys: KeyLayout::new(&cfg.prefix),
                cfg,
                link,
            }),
        })
    }

    /// The key layout in use.
    pub fn keys(&self) -> &KeyLayout {
        &self.shared.keys
    }

    /// Whether etcd answered the last request (any request of this directory, its
    /// registrations and watches).
    pub fn connectivity(&self) -> Connectivity {
        self.shared.link.state()
    }

    /// Asks etcd for its status: Ok when it answers.
    pub fn ping(&self) -> Result<(), PoolError> {
        let mut m = self.shared.client.maintenance_client();
        self.shared.call(m.status()).map(|_| ())
    }

    /// The whole pool at one revision.
    pub fn view(&self) -> Result<PoolView, PoolError> {
        self.shared.view()
    }

    /// The pool's status (racks, servers, hosts, VMs, namespaces awaiting collection).
    pub fn status(&self) -> Result<PoolStatus, PoolError> {
        Ok(PoolStatus::from_view(&self.view()?))
    }

    /// Marks a server as draining (it takes no new slabs; `drain_plan` moves its slabs off)
    /// or clears the mark. The mark is the operator's, kept under `drain/<id>` without a
    /// lease, so it survives the server's restarts and its own record updates.
    pub fn set_draining(&self, server: &ServerId, draining: bool) -> Result<(), PoolError> {
        let key = self.shared.keys.drain_mark(server);
        let mut kv = self.shared.client.kv_client();
        if draining {
            self.shared.call(kv.put(key, b"{}".to_vec(), None))?;
        } else {
            self.shared.call(kv.delete(key, None))?;
        }
        Ok(())
    }

    /// Asks the VMMs of the moves' VMs to make them (see [`crate::keys`]): each is written
    /// under `moves/<vm>/<slab>`, replacing an older request for the same slab. The VMM
    /// copies the slab while the VM runs, then [`Directory::complete_move`]s it.
    pub fn request_moves(&self, moves: &[Move]) -> Result<(), PoolError> {
        let mut kv = self.shared.client.kv_client();
        for m in moves {
            let key = self.shared.keys.move_request(&m.slab.vm, m.slab.index);
            let v = serde_json::to_vec(m).map_err(|e| PoolError::Etcd(e.to_string()))?;
            self.shared.call(kv.put(key, v, None))?;
        }
        Ok(())
    }

    /// A requested move is done: commits it ([`Directory::commit_move`]) and deletes the
    /// request. A request whose placement changed meanwhile is deleted too (the operator's
    /// command plans again).
    pub fn complete_move(&self, m: &Move) -> Result<(), PoolError> {
        let r = self.commit_move(m);
        self.drop_move_request(m)?;
        r
    }

    /// Withdraws request `m` (it could not be made; the reason is logged by the VMM and the
    /// operator's command plans again). Only `m` itself: a newer request for the same slab
    /// (the command planned again while a VMM acted on an older view) stays.
    pub fn drop_move_request(&self, m: &Move) -> Result<(), PoolError> {
        let key = self.shared.keys.move_request(&m.slab.vm, m.slab.index);
        let v = serde_json::to_vec(m).map_err(|e| PoolError::Etcd(e.to_string()))?;
        let mut kv = self.shared.client.kv_client();
        let txn = Txn::new()
            .when([Compare::value(key.clone(), CompareOp::Equal, v)])
            .and_then([TxnOp::delete(key, None)]);
        self.shared.call(kv.txn(txn))?;
        Ok(())
    }

    /// Commits one move of a plan: slab `m.slab`'s replica on `m.from` is now on `m.to`. The
    /// VM's client copies the slab to `m.to` before committing. Fails with
    /// [`PoolError::Conflict`] if the placement changed since it was read.
    pub fn commit_move(&self, m: &Move) -> Result<(), PoolError> {
        let key = self.shared.keys.slab(&m.slab.vm, m.slab.index);
        let mut kv = self.shared.client.kv_client();
        let resp = self.shared.call(kv.get(key.clone(), None))?;
        let Some(cur) = resp.kvs().first() else {
            return Err(PoolError::Conflict { key });
        };
        let mut rec: SlabRecord = serde_json::from_slice(cur.value())
            .map_err(|e| PoolError::Etcd(format!("{key}: unreadable placement: {e}")))?;
        let Some(pos) = rec.replicas.iter().position(|s| *s == m.from) else {
            return Err(PoolError::Conflict { key });
        };
        if rec.replicas.contains(&m.to) {
            return Err(PoolError::Conflict { key });
        }
        rec.replicas[pos] = m.to.clone();
        let value = serde_json::to_vec(&rec).map_err(|e| PoolError::Etcd(e.to_string()))?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                cur.mod_revision(),
            )])
            .and_then([TxnOp::put(key.clone(), value, None::<PutOptions>)]);
        let resp = self.shared.call(kv.txn(txn))?;
        if resp.succeeded() {
            Ok(())
        } else {
            Err(PoolError::Conflict { key })
        }
    }
}
