//! Where each slab lives: its replica servers, chosen by power of two choices on free
//! capacity, in a map sharded 64 ways (one `RwLock` each, so the request path takes no global
//! lock), plus the lock of every placement change a write may race with (`fills`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use rustc_hash::FxHashMap;

use crate::fills::Fills;
use crate::servers::Servers;
use crate::tickets::MAX_REPLICAS;

/// A slab: (namespace, slab index).
pub(crate) type SlabKey = (u64, u64);

const SHARDS: usize = 64;

/// A slab's replica set.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placement {
    pub replicas: [u16; MAX_REPLICAS],
    pub n: u8,
    /// Bit i: replicas[i] is still being filled (not read from; receives no client writes).
    pub filling: u8,
    /// Every replica of this slab was lost once (`forget_server`). Placed afresh by a later
    /// write, its replicas hold only what was written since: a page absent there is lost,
    /// not never written, and reads of it fail with [`crate::ClientError::Lost`].
    pub lost: bool,
}

impl Placement {
    pub fn servers(&self) -> &[u16] {
        &self.replicas[..self.n as usize]
    }

    pub fn is_filling(&self, i: usize) -> bool {
        self.filling & (1 << i) != 0
    }

    /// The replicas that serve reads and take client writes (not being filled), in order,
    /// into `out`; returns how many.
    pub fn established(&self, out: &mut [u16; MAX_REPLICAS]) -> usize {
        let mut n = 0;
        for (i, &s) in self.servers().iter().enumerate() {
            if !self.is_filling(i) {
                out[n] = s;
                n += 1;
            }
        }
        n
    }

    /// Adds `s` as a filling replica (the caller checked `n < MAX_REPLICAS` and recorded the
    /// copy under the fill lock, see `fills`).
    pub fn add_filling(&mut self, s: u16) {
        let n = self.n as usize;
        self.replicas[n] = s;
        self.filling |= 1 << n;
        self.n += 1;
    }

    /// Drops replica `pos`.
    pub fn remove_at(&mut self, pos: usize) {
        let n = self.n as usize;
        for i in pos..n - 1 {
            self.replicas[i] = self.replicas[i + 1];
        }
        let low = self.filling & ((1 << pos) - 1);
        let high = (self.filling >> (pos + 1)) << pos;
        self.filling = low | high;
        self.n -= 1;
    }
}

/// Every slab's placement.
pub(crate) struct Placements {
    shards: Box<[RwLock<FxHashMap<SlabKey, Placement>>]>,
    /// Copies in progress and scrubs (see `fills`), and the lock every placement change a
    /// write may race with takes before the shard's (recovery paths and writes to a slab
    /// being copied only, not the steady-state hot path).
    pub fills: Mutex<Fills>,
    rng: AtomicU64,
    /// A pool's choice of servers per pool slab ([`crate::ClientConfig::slab_homes`]), kept
    /// current by the pool's follower as replicas move ([`Placements::set_home`]); read only
    /// when a slab is first placed.
    homes: Box<[RwLock<Vec<u16>>]>,
    /// The pool owns placement ([`crate::ClientConfig::pool_placement`]): servers come from
    /// `homes` only.
    pool_only: bool,
}

impl Placements {
    pub fn new(seed: u64, homes: Vec<Vec<u16>>, pool_only: bool) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| RwLock::new(FxHashMap::default()))
                .collect(),
            fills: Mutex::new(Fills::default()),
            rng: AtomicU64::new(0x9e3779b97f4a7c15 ^ seed),
            homes: homes.into_iter().map(RwLock::new).collect(),
            pool_only,
        }
    }

    /// Whether the pool owns placement: the client picks no server outside a slab's home.
    pub fn pool_only(&self) -> bool {
        self.pool_only
    }

    /// The first server of slab `slab`'s pool home that is in service, outside `exclude` and
    /// has room for `need` pages (0: any in service): where the pool wants the slab's next
    /// replica. None without homes.
    pub fn home_target(
        &self,
        servers: &Servers,
        slab: u64,
        exclude: &[u16],
        need: u64,
    ) -> Option<u16> {
        if self.homes.is_empty() {
            return None;
        }
        let home = self.homes[(slab % self.homes.len() as u64) as usize]
            .read()
            .unwrap_or_else(|e| e.into_inner());
        home.iter()
            .copied()
            .find(|&s| !exclude.contains(&s) && takes(servers, s, need))
    }

    /// Pool slab `j`'s servers are now `servers`: slabs placed from now on go there. Whether
    /// `j` is one of the pool's slabs.
    pub fn set_home(&self, j: usize, servers: Vec<u16>) -> bool {
        let Some(h) = self.homes.get(j) else {
            return false;
        };
        *h.write().unwrap_or_else(|e| e.into_inner()) = servers;
        true
    }

    fn shard(&self, key: SlabKey) -> &RwLock<FxHashMap<SlabKey, Placement>> {
        let h = key.0.wrapping_mul(0x9e3779b97f4a7c15) ^ key.1.wrapping_mul(0xc2b2ae3d27d4eb4f);
        &self.shards[(h >> 58) as usize % SHARDS]
    }

    /// The fill lock (see the `fills` field).
    pub fn lock_fills(&self) -> std::sync::MutexGuard<'_, Fills> {
        self.fills.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The shard holding `key`, for writing.
    pub fn write_shard(&self, key: SlabKey) -> RwLockWriteGuard<'_, FxHashMap<SlabKey, Placement>> {
        self.shard(key).write().unwrap_or_else(|e| e.into_inner())
    }

    /// Every shard in turn, for reading.
    pub fn read_all(
        &self,
    ) -> impl Iterator<Item = RwLockReadGuard<'_, FxHashMap<SlabKey, Placement>>> {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Every shard in turn, for writing.
    pub fn write_all(
        &self,
    ) -> impl Iterator<Item = RwLockWriteGuard<'_, FxHashMap<SlabKey, Placement>>> {
        self.shards
            .iter()
            .map(|s| s.write().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn lookup(&self, key: SlabKey) -> Option<Placement> {
        self.shard(key)
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .copied()
    }

    fn rand(&self) -> u64 {
        // xorshift on a shared atomic: a lost update only repeats a number, harmless here.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng.store(x, Ordering::Relaxed);
        x
    }

    /// Power of two choices among `cands`: two at random, keep the one with more free space.
    fn two_choices(&self, servers: &Servers, cands: &[u16]) -> u16 {
        if cands.len() == 1 {
            return cands[0];
        }
        let a = cands[(self.rand() % cands.len() as u64) as usize];
        let mut b = cands[(self.rand() % (cands.len() as u64 - 1)) as usize];
        if b == a {
            b = cands[cands.len() - 1];
        }
        if servers.free_pages(b) > servers.free_pages(a) {
            b
        } else {
            a
        }
    }

    /// Up to `n` live servers outside `exclude` for a slab of `slab_pages`, each charged the
    /// slab until its next STAT refresh.
    pub fn choose(
        &self,
        servers: &Servers,
        exclude: &[u16],
        n: usize,
        slab_pages: u64,
    ) -> ([u16; MAX_REPLICAS], usize) {
        let mut out = [0u16; MAX_REPLICAS];
        let mut k = 0;
        let mut cands: [u16; 64] = [0; 64];
        while k < n {
            // Servers with room for the whole slab first, then any with room for a page, then
            // any in service (its free count may be stale): a full or draining server gets a
            // new slab only when nothing else can take it.
            let mut m = 0;
            for need in [slab_pages, 1, 0] {
                for s in 0..servers.len().min(64) as u16 {
                    let ok = if need == 0 {
                        !servers.is_dead(s)
                    } else {
                        servers.takes_new(s, need)
                    };
                    if ok && !exclude.contains(&s) && !out[..k].contains(&s) {
                        cands[m] = s;
                        m += 1;
                    }
                }
                if m > 0 {
                    break;
                }
            }
            if m == 0 {
                break;
            }
            let s = self.two_choices(servers, &cands[..m]);
            servers.charge(s, slab_pages);
            out[k] = s;
            k += 1;
        }
        (out, k)
    }

    /// Up to `r` servers for slab `slab`: its pool home servers that take new slabs, then
    /// others by [`Placements::choose`]. When the pool owns placement, its home servers in
    /// service and nothing else: the pool reserved the slab's room on them (a draining one
    /// is in a home only until the drain's move sets the next), and a server the pool did
    /// not choose would hold pages its records do not know of.
    fn choose_home(
        &self,
        servers: &Servers,
        slab: u64,
        r: usize,
        slab_pages: u64,
    ) -> ([u16; MAX_REPLICAS], usize) {
        let mut out = [0u16; MAX_REPLICAS];
        let mut k = 0;
        if !self.homes.is_empty() {
            let home = self.homes[(slab % self.homes.len() as u64) as usize]
                .read()
                .unwrap_or_else(|e| e.into_inner());
            let need = if self.pool_only { 0 } else { 1 };
            for &s in home.iter() {
                if k < r && takes(servers, s, need) {
                    servers.charge(s, slab_pages);
                    out[k] = s;
                    k += 1;
                }
            }
        }
        if k < r && !self.pool_only {
            let (more, m) = self.choose(servers, &out[..k], r - k, slab_pages);
            out[k..k + m].copy_from_slice(&more[..m]);
            k += m;
        }
        (out, k)
    }

    /// Places namespace `ns`'s slabs `0..slabs` on their pool homes as they are now, each
    /// slab without a placement: the slabs a previous client of the namespace wrote (a
    /// restored snapshot's), so that reads go to the servers rather than find them never
    /// written. Returns how many were placed. Without homes, none.
    pub fn adopt_homes(&self, ns: u64, slabs: u64) -> u64 {
        if self.homes.is_empty() {
            return 0;
        }
        let mut placed = 0;
        for k in 0..slabs {
            let home = self.homes[(k % self.homes.len() as u64) as usize]
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if home.is_empty() {
                continue;
            }
            let mut p = Placement {
                replicas: [0; MAX_REPLICAS],
                n: 0,
                filling: 0,
                lost: false,
            };
            for &s in home.iter().take(MAX_REPLICAS) {
                p.replicas[p.n as usize] = s;
                p.n += 1;
            }
            let mut m = self.write_shard((ns, k));
            if let std::collections::hash_map::Entry::Vacant(e) = m.entry((ns, k)) {
                e.insert(p);
                placed += 1;
            }
        }
        placed
    }

    /// The placement of `key`, placing it on `r` servers if it has none (or lost them all).
    pub fn place(
        &self,
        servers: &Servers,
        key: SlabKey,
        r: usize,
        slab_pages: u64,
    ) -> Option<Placement> {
        let mut m = self.write_shard(key);
        // A slab whose every replica was lost (`forget_server`) is placed afresh by its next
        // write: that page lives again, the others still read as absent (lost to the engine).
        let prev = m.get(&key).copied();
        if let Some(p) = prev.filter(|p| p.n > 0) {
            return Some(p);
        }
        let (replicas, n) = self.choose_home(servers, key.1, r, slab_pages);
        if n == 0 {
            return None;
        }
        let p = Placement {
            replicas,
            n: n as u8,
            filling: 0,
            lost: prev.is_some_and(|p| p.lost),
        };
        m.insert(key, p);
        Some(p)
    }
}

/// Whether server `s` exists and may take a slab's replica: in service with room for `need`
/// pages and not draining, or (`need` 0) just in service.
fn takes(servers: &Servers, s: u16, need: u64) -> bool {
    (s as usize) < servers.len()
        && if need == 0 {
            !servers.is_dead(s)
        } else {
            servers.takes_new(s, need)
        }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removing_a_replica_keeps_the_filling_bits_of_the_others() {
        let mut p = Placement {
            replicas: [4, 5, 6, 7],
            n: 4,
            filling: 0b1010,
            lost: false,
        };
        p.remove_at(1);
        assert_eq!(p.servers(), &[4, 6, 7]);
        assert_eq!(p.filling, 0b100);
        let mut out = [0; MAX_REPLICAS];
        let n = p.established(&mut out);
        assert_eq!(&out[..n], &[4, 6]);
    }
}
