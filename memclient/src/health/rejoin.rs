//! Connecting to a server, and putting a server that was taken out of service back in service
//! once it answers again (runs on the client's maintenance thread).
//!
//! A timeout or a dropped connection takes a server out of service at once: that keeps a
//! vCPU from waiting on a server that is gone. But the same signals come from a server that is
//! only slow for a moment (a CPU-starved host, a network blip), and if that server held the
//! last live replica of a slab, the slab would be unusable for good. So the client keeps
//! trying: every maintenance tick it reconnects to each server out of service, asks for its
//! instance id, and
//! - same id: the server kept its pages. Its connections are swapped in, it is back in
//!   service, the slabs it was the last replica of work again, slabs left with fewer than
//!   R replicas meanwhile are re-replicated (onto it, if it is the only choice or, with a
//!   pool, in the slab's home), and its copies of slabs that were re-replicated elsewhere
//!   meanwhile are discarded (nothing reads them; they would only hold its space);
//! - another id: the server restarted and holds nothing of ours. It is first removed from
//!   every placement (a slab it was the last replica of is lost: logged as an error), then
//!   put in service as an empty server.
//!
//! A server that was only stopped (SIGSTOP, a long stall) may still hold requests of its old
//! connections in their socket buffers, and applies them as soon as it runs again. The
//! client reported those as failed, and the paging engine keeps such pages and writes them
//! again later — so a stale write must not land *after* a newer one. Hence the settle time:
//! the new connections wait [`settle_time`] before the STAT that puts the server back, and
//! only then carry writes; the old buffers are drained within microseconds of the resume.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::core::Core;

impl Core {
    /// One attempt to bring server `s` (out of service) back.
    pub(super) fn try_rejoin(self: &Arc<Self>, s: u16) {
        let Some(st) = self.servers.get(s) else {
            return;
        };
        // A new connection set: failures still reported by the old one are stale from here.
        let generation = st.generation.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        let conns = match self.connect_server(s, generation) {
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(server = %st.addr(), "still out of service: {e}");
                return;
            }
        };
        // Still out of service for every caller: only this STAT uses the new connections.
        *st.conns.write().unwrap_or_else(|e| e.into_inner()) = conns.clone();
        std::thread::sleep(settle_time(self.cfg.timeout));
        let Some(first) = conns.first() else {
            return;
        };
        let info = match self.blocking_stat(s, 0, Some(&**first)) {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!(server = %st.addr(), "connected, but STAT failed: {e}");
                for c in conns.iter() {
                    c.close();
                }
                return;
            }
        };
        let known = st.instance.load(Ordering::Acquire);
        if known != 0 && known != info.instance {
            self.forget_server(s);
        }
        st.instance.store(info.instance, Ordering::Release);
        st.free_pages.store(
            info.capacity_pages.saturating_sub(info.used_pages),
            Ordering::Relaxed,
        );
        st.dead.store(false, Ordering::Release);
        self.health.rejoined_servers.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(server = %st.addr(), "memserver back in service");
        self.rereplicate_degraded();
        // Its copies of slabs re-replicated elsewhere meanwhile are scrubbed by the next
        // maintenance tick (`scrub_left_behind`); a server that restarted has none.
    }

    /// Scrubs the left-behind copies (see `fills`) on every server in service.
    pub(super) fn scrub_left_behind_in_service(&self) {
        for s in 0..self.servers.len() as u16 {
            if !self.servers.is_dead(s) {
                self.scrub_left_behind(s);
            }
        }
    }

    /// Discards server `s`'s copies of the slabs whose replica on it was dropped (while it was
    /// out of service, or for a missed write or a stale page) and that did not come back to it
    /// (a re-replication may have refilled it there): nothing reads them, and a pool's records
    /// do not count them.
    fn scrub_left_behind(&self, s: u16) {
        let keys = self.placements.lock_fills().take_left_behind(s);
        let mut scrubbed = 0u64;
        for key in keys {
            {
                let mut fills = self.placements.lock_fills();
                let placed_here = self
                    .placements
                    .lookup(key)
                    .is_some_and(|p| p.servers().contains(&s));
                if placed_here || !fills.start_scrub(key, s) {
                    continue;
                }
            }
            self.scrub(key, s);
            self.placements.lock_fills().end_scrub(key, s);
            scrubbed += 1;
        }
        if scrubbed > 0 {
            tracing::info!(
                server = %self.addr(s),
                slabs = scrubbed,
                "discarded the server's copies of slabs it no longer holds a replica of"
            );
        }
    }

    /// Connects to server `s`, just given a slot (not yet visible to anyone else), and asks
    /// for its instance id and free space. Whether it is in service now.
    pub(crate) fn bring_in(self: &Arc<Self>, s: u16) -> bool {
        let Some(st) = self.servers.slot(s) else {
            return false;
        };
        let conns = match self.connect_server(s, 0) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(server = %st.addr(), "cannot connect to the added memserver (retried): {e}");
                return false;
            }
        };
        *st.conns.write().unwrap_or_else(|e| e.into_inner()) = conns.clone();
        let info = match conns.first().map(|c| self.blocking_stat(s, 0, Some(&**c))) {
            Some(Ok(i)) => i,
            Some(Err(e)) => {
                tracing::warn!(server = %st.addr(), "connected to the added memserver, but STAT failed (retried): {e}");
                for c in conns.iter() {
                    c.close();
                }
                return false;
            }
            None => return false,
        };
        st.instance.store(info.instance, Ordering::Release);
        st.free_pages.store(
            info.capacity_pages.saturating_sub(info.used_pages),
            Ordering::Relaxed,
        );
        tracing::info!(server = %st.addr(), "memserver added");
        true
    }

    /// Server `s` restarted: nothing it held is ours any more. Removes it from every
    /// placement; slabs left with no replica are lost.
    fn forget_server(&self, s: u16) {
        let (dropped, lost) = self.drop_from_placements(s, false);
        let addr = self.addr(s);
        if lost > 0 {
            tracing::error!(
                server = %addr,
                slabs = lost,
                "memserver restarted and held the only copy of these slabs: their pages are lost"
            );
        } else {
            tracing::warn!(server = %addr, slabs = dropped, "memserver restarted empty");
        }
    }

    /// Server `s`, out of service, left the memory pool for good (the pool says so: see
    /// [`crate::Client::retire_server`]): it is removed from every placement, so the slabs it
    /// was the last replica of stop waiting for it — they are lost, and the guest touching one
    /// of their pages learns it — instead of being suspended until a server that will not
    /// come back answers again. Its copies are recorded as left behind: if it answers after
    /// all, they are discarded. `None` if `s` is in service (it still answers: nothing to do).
    pub(crate) fn retire_server(&self, s: u16) -> Option<u64> {
        if !self.servers.is_dead(s) {
            return None;
        }
        let (dropped, lost) = self.drop_from_placements(s, true);
        let addr = self.addr(s);
        if lost > 0 {
            tracing::error!(
                server = %addr,
                slabs = lost,
                "memserver left the memory pool holding the only live copy of these slabs: their pages are lost"
            );
        } else if dropped > 0 {
            tracing::warn!(server = %addr, slabs = dropped, "memserver left the memory pool; its replicas are dropped");
        }
        Some(lost)
    }

    /// Removes server `s` from every placement (a filling replica too: its copier finds it
    /// gone at the flip and stops); a slab left with no replica is lost. `may_hold`: the
    /// server may still hold its copies (recorded as left behind), rather than having
    /// restarted empty. Returns (replicas dropped, slabs lost).
    fn drop_from_placements(&self, s: u16, may_hold: bool) -> (u64, u64) {
        let (mut dropped, mut lost) = (0u64, 0u64);
        let mut fills = self.placements.lock_fills();
        if !may_hold {
            // Restarted empty: no copy of ours is left behind there.
            fills.take_left_behind(s);
        }
        for mut m in self.placements.write_all() {
            for (key, p) in m.iter_mut() {
                if let Some(pos) = p.servers().iter().position(|&x| x == s) {
                    p.remove_at(pos);
                    dropped += 1;
                    if may_hold {
                        fills.leave_behind(s, *key);
                    }
                    if p.n == 0 {
                        p.lost = true;
                        lost += 1;
                    }
                }
            }
        }
        (dropped, lost)
    }
}

/// How long a reconnected server must keep answering before it carries requests again: long
/// enough for it to drain what its old connections had buffered (see the module doc), short
/// enough that a guest waiting on a suspended slab resumes soon.
fn settle_time(timeout: std::time::Duration) -> std::time::Duration {
    timeout.clamp(
        std::time::Duration::from_millis(100),
        std::time::Duration::from_secs(1),
    )
}
