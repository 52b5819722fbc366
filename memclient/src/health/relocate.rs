//! Moving a slab's replica from one server to another while the slab stays in use: off a
//! server that answered a write with CapacityExhausted (it is full: the write is failed, the
//! caller retries it and the retry lands on the new replica; with a pool, only onto a server
//! of the slab's pool home), and off a server a memory pool drains
//! ([`crate::Client::move_replicas`]).
//!
//! The new replica is filled exactly as a re-replication fills one (see `recovery`: copied
//! from a live replica, then the pages written meanwhile, then flipped to established under
//! the fill lock), then the old replica leaves the placement. Its pages of the slab are
//! discarded there only after every request that was in flight on the slab has finished, so
//! a read already on its way to the old server still finds its page. While they are
//! discarded the old server is marked as scrubbing that slab (see `fills`): no copy of the
//! slab may go back there meanwhile, or the discards would empty the new copy.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use farvm_memproto::MAX_PAGES_PER_FRAME;

use crate::core::Core;
use crate::placement::SlabKey;
use crate::tickets::TicketOp;
use crate::IoBuf;

/// Why a replica was not moved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RelocateError {
    /// The address is not one of the client's servers.
    #[error("{0} is not one of this client's memory servers")]
    UnknownServer(SocketAddr),
    /// The slab's placement changed (no replica on the source, or one on the target already).
    #[error(
        "slab {slab}: the placement changed (no replica on the source, or already on the target)"
    )]
    Changed {
        /// The slab index.
        slab: u64,
    },
    /// The slab is being filled (re-replication or another move): try again later.
    #[error("slab {slab} is being copied already; try again")]
    Busy {
        /// The slab index.
        slab: u64,
    },
    /// The copy stopped (the target or the last source went away).
    #[error("slab {slab}: copy to the new replica stopped: {why}")]
    Fill {
        /// The slab index.
        slab: u64,
        /// Why.
        why: &'static str,
    },
}

impl Core {
    /// A write to `key` found `from` full: moves that replica to a server with room, if
    /// there is one (otherwise the writes keep failing and are retried by the caller).
    pub(super) fn relocate_full(&self, key: SlabKey, from: u16) {
        let Some(p) = self.placements.lookup(key) else {
            return;
        };
        if p.filling != 0 || !p.servers().contains(&from) {
            return; // handled already, or being handled
        }
        let to = if self.placements.pool_only() {
            self.placements
                .home_target(&self.servers, key.1, p.servers(), 1)
        } else {
            let (c, k) = self
                .placements
                .choose(&self.servers, p.servers(), 1, self.cfg.slab_pages);
            (k == 1).then_some(c[0])
        };
        let Some(to) = to.filter(|&to| self.servers.takes_new(to, 1)) else {
            if self.placements.pool_only() {
                tracing::warn!(
                    server = %self.addr(from),
                    slab = key.1,
                    "memserver full and no other server of the slab's pool home has room: \
                     writes to this slab wait until the pool moves it"
                );
            } else {
                tracing::warn!(
                    server = %self.addr(from),
                    slab = key.1,
                    "memserver full and no other server has room: writes to this slab wait"
                );
            }
            return;
        };
        match self.move_replica(key, from, to) {
            Ok(()) => tracing::info!(
                from = %self.addr(from),
                to = %self.addr(to),
                slab = key.1,
                "slab replica moved off a full memserver"
            ),
            Err(e) => tracing::warn!(server = %self.addr(from), "moving off a full memserver: {e}"),
        }
    }

    /// Moves slab `key`'s replica on `from` to `to` (see the module doc).
    pub(crate) fn move_replica(
        &self,
        key: SlabKey,
        from: u16,
        to: u16,
    ) -> Result<(), RelocateError> {
        let slab = key.1;
        self.start_fill(key, from, to)?;
        if let Err(why) = self.fill_slab(key, to) {
            self.drop_filling(key, to);
            return Err(RelocateError::Fill { slab, why });
        }
        {
            // Under the fill lock, as every placement change a write may race with; the old
            // copy is marked as scrubbing in the same step (module doc).
            let mut fills = self.placements.lock_fills();
            let mut m = self.placements.write_shard(key);
            if let Some(p) = m.get_mut(&key) {
                if let Some(pos) = p.servers().iter().position(|&s| s == from) {
                    p.remove_at(pos);
                }
            }
            if !fills.start_scrub(key, from) {
                // Another move of this slab off `from` is scrubbing it already.
                self.health.replicas_moved.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
        }
        self.scrub(key, from);
        self.placements.lock_fills().end_scrub(key, from);
        self.health.replicas_moved.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Discards slab `key`'s pages on `from`, which no longer holds a replica of it, once
    /// every request that may still read there has finished.
    pub(super) fn scrub(&self, key: SlabKey, from: u16) {
        let slab = key.1;
        // Requests that read the old placement may still go to `from`: let them finish
        // before its copy goes. One that does not finish in time may still read there: the
        // copy stays (space on `from`, not a lost page).
        if !self.quiesce(key, true) {
            tracing::warn!(
                server = %self.addr(from),
                slab,
                "a request on the moved slab is still in flight: its old copy is kept"
            );
            return;
        }
        let (ns, _) = key;
        let base = slab * self.cfg.slab_pages;
        let mut io = IoBuf::new(MAX_PAGES_PER_FRAME);
        let mut at = 0;
        while at < self.cfg.slab_pages && !self.servers.is_dead(from) {
            let n = (self.cfg.slab_pages - at).min(MAX_PAGES_PER_FRAME as u64) as usize;
            if io.set_run(base + at, n).is_err() {
                break;
            }
            let (back, r) = self.direct_io_patient(from, TicketOp::Discard, ns, io);
            io = back;
            if let Err(e) = r {
                tracing::debug!(server = %self.addr(from), "discarding a moved slab: {e}");
                break;
            }
            at += n as u64;
        }
    }

    /// The slabs of namespace `ns` with a replica on `s`.
    pub(crate) fn slabs_on(&self, ns: u64, s: u16) -> Vec<u64> {
        let mut out: Vec<u64> = self
            .placements
            .read_all()
            .flat_map(|m| {
                m.iter()
                    .filter(|(k, p)| k.0 == ns && p.servers().contains(&s))
                    .map(|(k, _)| k.1)
                    .collect::<Vec<_>>()
            })
            .collect();
        out.sort_unstable();
        out
    }
}
