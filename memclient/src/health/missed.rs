//! Replicas that lack a write leave their slab's placement, so that no read goes to them.
//!
//! The invariant: an established replica of a slab holds every write to the slab that was
//! reported stored since it became established. A write is reported stored once every
//! replica it was sent to answered and at least one stored it; a replica that did not (its
//! server failed, timed out, or was already out of service and so was skipped) lacks it.
//! Such a replica is dropped from the placement *before* the write is reported, which also
//! covers a server that is put back in service later with the same instance (`rejoin`): it
//! is back only in the slabs whose writes it did not miss. A write no replica stored is
//! reported failed and changes nothing (the paging engine keeps its page and writes it
//! again). The slab is re-replicated from the replicas that stored the write (`recovery`).
//!
//! A dropped replica's copy stays on its server until the maintenance thread scrubs it there
//! (`rejoin`: at once if the server is in service, once it is back otherwise).
//!
//! The last established replica is never dropped here: a slab with no replica would read as
//! lost as a whole, while only the pages it missed are wrong, and the paging engine, which
//! knows each page's last content, rejects those one by one ([`Core::reject_replica`]).

use std::sync::atomic::Ordering;

use crate::core::Core;
use crate::placement::SlabKey;

impl Core {
    /// Drops the established replicas `missed` of slab `key` (they lack a write another
    /// replica stored), keeping at least one established replica.
    pub(crate) fn drop_missed(&self, key: SlabKey, missed: &[u16]) {
        let mut fills = self.placements.lock_fills();
        let mut m = self.placements.write_shard(key);
        let Some(p) = m.get_mut(&key) else {
            return;
        };
        let mut dropped = 0;
        for &s in missed {
            let established = (0..p.n as usize).filter(|&i| !p.is_filling(i)).count();
            if established <= 1 {
                break;
            }
            if let Some(i) = p.servers().iter().position(|&x| x == s) {
                // A filling replica of that server is a copy started after the write was
                // sent: its copy waits for the write (`quiesce`) and takes it from the
                // replicas that stored it.
                if !p.is_filling(i) {
                    p.remove_at(i);
                    fills.leave_behind(s, key);
                    dropped += 1;
                }
            }
        }
        drop(m);
        if dropped > 0 {
            self.health
                .replicas_dropped
                .fetch_add(dropped, Ordering::Relaxed);
            tracing::warn!(
                ns = key.0,
                slab = key.1,
                dropped,
                "replicas that missed a write left the slab; it is re-replicated"
            );
        }
    }

    /// A read of slab `key` answered by server `s` returned a page that is not the page's
    /// last written content (the paging engine's fingerprint says so). Drops `s` from the
    /// slab (it lacks a write) if another established replica remains. Returns whether one
    /// does: the page may be read again from it; false: no replica holds the page.
    pub(crate) fn reject_replica(&self, key: SlabKey, s: u16) -> bool {
        let mut fills = self.placements.lock_fills();
        let mut m = self.placements.write_shard(key);
        let Some(p) = m.get_mut(&key) else {
            return false;
        };
        let others = p
            .servers()
            .iter()
            .enumerate()
            .filter(|&(i, &x)| x != s && !p.is_filling(i))
            .count();
        if others == 0 {
            return false;
        }
        // Established only: a filling replica on that server is a newer copy, not the one
        // that answered.
        let established = (0..p.n as usize).find(|&i| p.replicas[i] == s && !p.is_filling(i));
        if let Some(i) = established {
            p.remove_at(i);
            fills.leave_behind(s, key);
            drop(m);
            self.health
                .replicas_rejected
                .fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                server = %self.addr(s),
                ns = key.0,
                slab = key.1,
                "a replica returned stale page content: it left the slab; the page is read \
                 from another replica and the slab re-replicated"
            );
        }
        true
    }
}
