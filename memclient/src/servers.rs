//! The memory servers as the client sees them: each one's connections (links), whether it is
//! in service, its instance id and free capacity, and which connection a request takes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::config::Lane;
use crate::connection::Link;

/// One server.
pub(crate) struct ServerState {
    pub addr: SocketAddr,
    /// Laid out as `[bulk..., write lane?, demand lane?]`. Replaced as a whole when the server
    /// rejoins (the read lock is held only to pick and clone one connection).
    pub conns: RwLock<Arc<[Arc<dyn Link>]>>,
    /// Bumped for every set of connections; failures reported by connections of an older
    /// set are stale and do not take the server out of service again.
    pub generation: AtomicU32,
    /// The server's instance id from its last STAT answer (0: not known yet).
    pub instance: AtomicU64,
    pub dead: AtomicBool,
    pub free_pages: AtomicU64,
    rr: AtomicUsize,
}

/// Every server, in the order of the client's configuration (a server's index is its id).
pub(crate) struct Servers {
    list: Vec<ServerState>,
    write_lane: bool,
    demand_lane: bool,
}

impl Servers {
    pub fn new(addrs: &[SocketAddr], write_lane: bool, demand_lane: bool) -> Self {
        Self {
            list: addrs
                .iter()
                .map(|&addr| ServerState {
                    addr,
                    conns: RwLock::new(Arc::from(Vec::new())),
                    generation: AtomicU32::new(0),
                    instance: AtomicU64::new(0),
                    dead: AtomicBool::new(false),
                    free_pages: AtomicU64::new(0),
                    rr: AtomicUsize::new(0),
                })
                .collect(),
            write_lane,
            demand_lane,
        }
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn get(&self, s: u16) -> Option<&ServerState> {
        self.list.get(s as usize)
    }

    pub fn iter(&self) -> impl Iterator<Item = &ServerState> {
        self.list.iter()
    }

    pub fn is_dead(&self, s: u16) -> bool {
        self.list[s as usize].dead.load(Ordering::Acquire)
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
        self.list
            .iter()
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
