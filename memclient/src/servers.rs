//! The memory servers as the client sees them: each one's connections (links), whether it is
//! in service, its instance id and free capacity, and which connection a request takes.
//!
//! The list grows while the client runs (a pool adds the server a move or a repair targets
//! when it joined after the VM started) but never shrinks or reorders, so a server's index
//! stays its id for good. Its slots are allocated up front: the request path indexes them
//! without a lock.

use std::net::{Ipv4Addr, SocketAddr};

use farvm_transport::Endpoint;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use crate::config::Lane;
use crate::connection::Link;

/// Servers a client can know: the placement's bitmasks and candidate arrays hold 64.
pub const MAX_SERVERS: usize = 64;

/// One server.
pub(crate) struct ServerState {
    /// Set once, when the slot is taken.
    endpoint: OnceLock<Endpoint>,
    /// Laid out as `[bulk..., write lane?, demand lane?]`. Replaced as a whole when the server
    /// rejoins (the read lock is held only to pick and clone one connection).
    pub conns: RwLock<Arc<[Arc<dyn Link>]>>,
    /// Bumped for every set of connections; failures reported by connections of an older
    /// set are stale and do not take the server out of service again.
    pub generation: AtomicU32,
    /// The server's instance id from its last STAT answer (0: not known yet).
    pub instance: AtomicU64,
    pub dead: AtomicBool,
    /// Draining (a pool moves its slabs off): it takes no new slab.
    pub draining: AtomicBool,
    pub free_pages: AtomicU64,
    rr: AtomicUsize,
}

impl ServerState {
    fn vacant() -> Self {
        Self {
            endpoint: OnceLock::new(),
            conns: RwLock::new(Arc::from(Vec::new())),
            generation: AtomicU32::new(0),
            instance: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            free_pages: AtomicU64::new(0),
            rr: AtomicUsize::new(0),
        }
    }

    /// Its address and transport (a vacant slot: TCP to 0.0.0.0:0).
    pub fn endpoint(&self) -> Endpoint {
        self.endpoint
            .get()
            .copied()
            .unwrap_or(Endpoint::tcp(SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0))))
    }

    /// Its address: the server's identity for the client.
    pub fn addr(&self) -> SocketAddr {
        self.endpoint().addr
    }
}

/// Every server: those of the client's configuration in its order, then those added since
/// (a server's index is its id).
pub(crate) struct Servers {
    /// `MAX_SERVERS` slots (more if configured with more); `list[..len]` are in use.
    list: Box<[ServerState]>,
    len: AtomicUsize,
    /// Serializes [`Servers::add`] (never taken on the request path).
    adding: Mutex<()>,
    write_lane: bool,
    demand_lane: bool,
}

impl Servers {
    pub fn new(endpoints: &[Endpoint], write_lane: bool, demand_lane: bool) -> Self {
        let list: Box<[ServerState]> = (0..endpoints.len().max(MAX_SERVERS))
            .map(|_| ServerState::vacant())
            .collect();
        for (st, &e) in list.iter().zip(endpoints) {
            let _ = st.endpoint.set(e);
        }
        Self {
            list,
            len: AtomicUsize::new(endpoints.len()),
            adding: Mutex::new(()),
            write_lane,
            demand_lane,
        }
    }

    /// Servers in use (the configured ones and those added since).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub fn get(&self, s: u16) -> Option<&ServerState> {
        self.list[..self.len()].get(s as usize)
    }

    pub fn iter(&self) -> impl Iterator<Item = &ServerState> {
        self.list[..self.len()].iter()
    }

    /// Slot `s` whether in use or not (its address, for connecting a server being added).
    pub fn slot(&self, s: u16) -> Option<&ServerState> {
        self.list.get(s as usize)
    }

    /// The index of the server at `endpoint`'s address, taking the next slot for it if it has
    /// none: `(index, true)` for a new one (a known server keeps the transport it has).
    /// `connect` (called with the new index before anyone else can see it) says whether the
    /// server is in service; if not, it is published out of service and the maintenance
    /// thread keeps trying it like any server out of service. None when every slot is taken.
    pub fn add(
        &self,
        endpoint: Endpoint,
        connect: impl FnOnce(u16) -> bool,
    ) -> Option<(u16, bool)> {
        let _one = self.adding.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = self.index_of(endpoint.addr) {
            return Some((s, false));
        }
        let n = self.len();
        let st = self.list.get(n)?;
        let _ = st.endpoint.set(endpoint);
        let up = connect(n as u16);
        st.dead.store(!up, Ordering::Release);
        // Published with its address and state set: readers load `len` with Acquire.
        self.len.store(n + 1, Ordering::Release);
        Some((n as u16, true))
    }

    pub fn is_dead(&self, s: u16) -> bool {
        self.list[s as usize].dead.load(Ordering::Acquire)
    }

    /// Whether server `s` may take a new slab of `slab_pages`: in service, not draining and
    /// with room for the whole slab (`slab_pages` 0: room for one page).
    pub fn takes_new(&self, s: u16, slab_pages: u64) -> bool {
        let st = &self.list[s as usize];
        !st.dead.load(Ordering::Acquire)
            && !st.draining.load(Ordering::Acquire)
            && st.free_pages.load(Ordering::Relaxed) >= slab_pages.max(1)
    }

    /// The index of the server at `addr`.
    pub fn index_of(&self, addr: std::net::SocketAddr) -> Option<u16> {
        self.iter().position(|s| s.addr() == addr).map(|i| i as u16)
    }

    pub fn free_pages(&self, s: u16) -> u64 {
        self.list[s as usize].free_pages.load(Ordering::Relaxed)
    }

    /// Accounts a slab against server `s` until the next STAT refresh.
    pub fn charge(&self, s: u16, pages: u64) {
        let f = &self.list[s as usize].free_pages;
        let _ = f.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
            Some(v.saturating_sub(pages))
        });
    }

    /// The connections of server `s` right now.
    pub fn conns(&self, s: u16) -> Arc<[Arc<dyn Link>]> {
        self.list[s as usize]
            .conns
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Closes every connection of server `s` (their outstanding requests fail).
    pub fn close_conns(&self, s: u16) {
        for c in self.conns(s).iter() {
            c.close();
        }
    }

    /// A connection to server `s` for `lane`: the demand or write lane when configured, else
    /// the less loaded of two bulk connections.
    pub fn pick_conn(&self, s: u16, lane: Lane) -> Option<Arc<dyn Link>> {
        let st = &self.list[s as usize];
        let conns = st.conns.read().unwrap_or_else(|e| e.into_inner());
        let (n_write, n_demand) = (usize::from(self.write_lane), usize::from(self.demand_lane));
        let bulk = match conns.len().checked_sub(n_write + n_demand) {
            Some(nb) if nb > 0 => {
                match lane {
                    Lane::Demand if n_demand == 1 => return conns.last().cloned(),
                    Lane::Write if n_write == 1 => return conns.get(nb).cloned(),
                    _ => {}
                }
                &conns[..nb]
            }
            _ => &conns[..],
        };
        match bulk.len() {
            0 => return None,
            1 => return bulk.first().cloned(),
            _ => {}
        }
        // Least outstanding of two (round-robin start) keeps connections evenly loaded.
        let i = st.rr.fetch_add(1, Ordering::Relaxed) % bulk.len();
        let j = (i + 1) % bulk.len();
        let (a, b) = (&bulk[i], &bulk[j]);
        Some(if b.outstanding() < a.outstanding() {
            b.clone()
        } else {
            a.clone()
        })
    }

    /// A live connection with requests in flight, if any, that a poller may receive on.
    /// (Never a demand lane: its requests are received by their own inline waiters, and a
    /// poller camping on it would hold its receive side while they wait.)
    pub fn busy_conn(&self) -> Option<Arc<dyn Link>> {
        let n_demand = usize::from(self.demand_lane);
        self.iter()
            .filter(|s| !s.dead.load(Ordering::Acquire))
            .find_map(|s| {
                let v = s.conns.read().unwrap_or_else(|e| e.into_inner());
                v[..v.len().saturating_sub(n_demand)]
                    .iter()
                    .find(|c| c.inflight() > 0 && !c.is_broken())
                    .cloned()
            })
    }
}
