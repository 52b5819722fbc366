//! Re-replication after a server dies (runs on the client's maintenance thread).
//!
//! For every slab that had a replica on the dead server, a live server outside the slab's
//! replica set is chosen (power of two choices; with a pool, the first server of the slab's
//! pool home that does not hold it, and none until the pool names one: see
//! [`crate::ClientConfig::pool_placement`]) and added as a *filling* replica: it is not
//! read from and client writes skip it. One copy per slab at a time, recorded under the fill
//! lock together with the filling bit (see `fills`). The copier then:
//! 1. waits for every write/discard that was already in flight (it may have read the old
//!    placement and so is not tracked as dirty);
//! 2. copies the slab from a surviving replica, chunk by chunk;
//! 3. repeatedly copies the pages written or discarded meanwhile (the slab's dirty set),
//!    taking the set only when no tracked write is in flight, and when the set is empty flips
//!    the replica to normal under the fill lock, so no write can slip between.
//!
//! The slab is served by its surviving replicas throughout; no client request waits on this.
//! A filling replica whose server dies stays in the placement until its copier sees it and
//! drops it with its record (so no second copy of the slab can start meanwhile and have its
//! record of pages written wiped by the first one's end); the next maintenance tick copies
//! the slab again.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use farvm_memproto::MAX_PAGES_PER_FRAME;

use crate::config::Fault;
use crate::core::Core;
use crate::placement::SlabKey;
use crate::tickets::{TicketOp, MAX_REPLICAS};
use crate::{ClientError, IoBuf};

impl Core {
    /// Server `dead` was taken out of service: drops it from the placement of every slab
    /// that has another live replica, and re-replicates those. A slab it was the last live
    /// replica of keeps it: the slab is suspended until the server answers again (see
    /// `rejoin`), because a timeout may well be transient and the server may still hold the
    /// only copy.
    pub(super) fn handle_dead(&self, dead: u16) {
        if !self.servers.is_dead(dead) {
            // Back in service before this event was handled (see `rejoin`).
            return;
        }
        let mut suspended = 0u64;
        {
            let mut fills = self.placements.lock_fills();
            for mut m in self.placements.write_all() {
                for (key, p) in m.iter_mut() {
                    let Some(pos) = p.servers().iter().position(|&s| s == dead) else {
                        continue;
                    };
                    if p.is_filling(pos) {
                        continue; // its copier drops it (module doc)
                    }
                    if self.live_source(p, Some(dead)).is_none() {
                        suspended += 1;
                        continue;
                    }
                    p.remove_at(pos);
                    fills.leave_behind(dead, *key);
                }
            }
        }
        if suspended > 0 {
            tracing::error!(
                server = %self.addr(dead),
                slabs = suspended,
                "the server out of service holds the last live replica of these slabs: their \
                 requests fail until it answers again"
            );
        }
        self.rereplicate_degraded();
    }

    /// Adds a replica to every slab with fewer than R replicas and a live source, and fills
    /// it. A fill that stops drops its half-filled replica, so a later call tries again.
    pub(super) fn rereplicate_degraded(&self) {
        // Called every maintenance tick: look before taking any write lock.
        let wanted = self.placements.read_all().any(|m| {
            m.values()
                .any(|p| (p.n as usize) < self.r && p.filling == 0)
        });
        if !wanted {
            return;
        }
        let mut jobs: Vec<(SlabKey, u16)> = Vec::new();
        {
            let mut fills = self.placements.lock_fills();
            for mut m in self.placements.write_all() {
                for (key, p) in m.iter_mut() {
                    let n = p.n as usize;
                    if n >= self.r || n >= MAX_REPLICAS || p.filling != 0 {
                        continue;
                    }
                    if fills.get(*key).is_some() || self.live_source(p, None).is_none() {
                        continue;
                    }
                    // Not back onto a server whose old copy of the slab is being scrubbed.
                    let exclude: Vec<u16> = (0..self.servers.len() as u16)
                        .filter(|&s| p.servers().contains(&s) || fills.scrubbing(*key, s))
                        .collect();
                    let target = if self.placements.pool_only() {
                        // The pool's choice only (its follower sets the home a repair
                        // picked); none yet: the slab waits for it.
                        self.placements
                            .home_target(&self.servers, key.1, &exclude, 0)
                    } else {
                        let (c, k) =
                            self.placements
                                .choose(&self.servers, &exclude, 1, self.cfg.slab_pages);
                        (k == 1).then_some(c[0])
                    };
                    if let Some(t) = target.filter(|&t| fills.start(*key, t)) {
                        p.add_filling(t);
                        jobs.push((*key, t));
                    }
                }
            }
        }
        if !jobs.is_empty() {
            tracing::info!(slabs = jobs.len(), "re-replicating");
        }
        for (key, target) in jobs {
            match self.fill_slab(key, target) {
                Ok(()) => {
                    self.health
                        .slabs_rereplicated
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(why) => {
                    tracing::warn!(
                        ns = key.0,
                        slab = key.1,
                        target,
                        "re-replication stopped: {why}"
                    );
                    self.drop_filling(key, target);
                }
            }
        }
    }

    /// Adds `target` to slab `key` as a filling replica and records the copy (see `fills`):
    /// `Err(Busy)` if the slab has a copy in progress or `target`'s old copy of it is being
    /// scrubbed, `Err(Changed)` if the slab is gone, `from` no longer holds it or `target`
    /// already does.
    pub(super) fn start_fill(
        &self,
        key: SlabKey,
        from: u16,
        target: u16,
    ) -> Result<(), super::RelocateError> {
        use super::RelocateError::{Busy, Changed};
        let slab = key.1;
        let mut fills = self.placements.lock_fills();
        let mut m = self.placements.write_shard(key);
        let Some(p) = m.get_mut(&key) else {
            return Err(Changed { slab });
        };
        if p.filling != 0
            || p.n as usize >= MAX_REPLICAS
            || fills.get(key).is_some()
            || fills.scrubbing(key, target)
        {
            return Err(Busy { slab });
        }
        if !p.servers().contains(&from) || p.servers().contains(&target) {
            return Err(Changed { slab });
        }
        if !fills.start(key, target) {
            return Err(Busy { slab });
        }
        p.add_filling(target);
        Ok(())
    }

    /// Removes a replica whose fill stopped, with its copy's record (under the fill lock, as
    /// the flip to normal is); another copy of the slab is left alone.
    pub(super) fn drop_filling(&self, key: SlabKey, target: u16) {
        let mut fills = self.placements.lock_fills();
        if fills.get_mut(key, target).is_none() {
            return;
        }
        let mut m = self.placements.write_shard(key);
        if let Some(p) = m.get_mut(&key) {
            if let Some(i) = p.servers().iter().position(|&s| s == target) {
                if p.is_filling(i) {
                    p.remove_at(i);
                }
            }
        }
        fills.end(key, target);
    }

    fn source_for(&self, key: SlabKey, target: u16) -> Option<u16> {
        let p = self.placements.lookup(key)?;
        self.live_source(&p, Some(target))
    }

    /// Waits until every write/discard to `key` that is in flight now has finished (every
    /// request, reads too, with `all_ops`). False if one was still in flight after twice the
    /// request timeout: the caller must not go on as if it had finished (a write that read
    /// the old placement would miss the new replica; a read would find its page discarded).
    #[must_use]
    pub(super) fn quiesce(&self, key: SlabKey, all_ops: bool) -> bool {
        let deadline = Instant::now() + self.cfg.timeout * 2;
        let waits: Vec<(u32, u64)> = (0..self.tickets.slots.len() as u32)
            .filter_map(|tn| {
                let t = self.tickets.lock(tn);
                (t.active
                    && (all_ops || matches!(t.op, TicketOp::Write | TicketOp::Discard))
                    && (t.ns, t.slab) == key)
                    .then_some((tn, t.seq))
            })
            .collect();
        for (tn, seq) in waits {
            while self.tickets.lock(tn).seq == seq {
                if Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        true
    }

    /// Copies `pages` (all in slab `key`) from a live source to `target`: present pages are
    /// written, absent ones discarded.
    fn copy_pages(&self, key: SlabKey, target: u16, pages: &[u64]) -> Result<(), &'static str> {
        let (ns, _) = key;
        let mut io = IoBuf::new(MAX_PAGES_PER_FRAME);
        let mut present: Vec<u64> = Vec::with_capacity(MAX_PAGES_PER_FRAME);
        let mut absent: Vec<u64> = Vec::with_capacity(MAX_PAGES_PER_FRAME);
        let mut data: Vec<u8> = Vec::with_capacity(MAX_PAGES_PER_FRAME * 4096);
        // Sealed pages are copied as they are stored, seal and all (`IoBuf`'s raw reads).
        let mut seals = Vec::with_capacity(MAX_PAGES_PER_FRAME);
        for chunk in pages.chunks(MAX_PAGES_PER_FRAME) {
            let r = loop {
                if self.servers.is_dead(target) {
                    return Err("target died");
                }
                let src = self
                    .source_for(key, target)
                    .ok_or("no live source replica")?;
                io.set_scatter(chunk).map_err(|_| "bad chunk")?;
                let (back, r) = self.direct_io_patient(src, TicketOp::Read, ns, io);
                io = back;
                match r {
                    Err(e) if e.is_server_failure() => continue,
                    other => break other,
                }
            };
            r.map_err(|_| "source read failed")?;
            present.clear();
            absent.clear();
            data.clear();
            seals.clear();
            for (i, &p) in chunk.iter().enumerate() {
                if io.is_present(i) {
                    present.push(p);
                    data.extend_from_slice(io.page(i));
                    seals.push(*io.seal(i));
                } else {
                    absent.push(p);
                }
            }
            if !present.is_empty() {
                io.set_scatter(&present).map_err(|_| "bad chunk")?;
                io.data_mut().copy_from_slice(&data);
                for (i, seal) in seals.iter().enumerate() {
                    io.set_seal(i, seal);
                }
                let (back, r) = self.direct_io_patient(target, TicketOp::Write, ns, io);
                io = back;
                r.map_err(|_| "target write failed")?;
            }
            if !absent.is_empty() {
                io.set_scatter(&absent).map_err(|_| "bad chunk")?;
                let (back, r) = self.direct_io_patient(target, TicketOp::Discard, ns, io);
                io = back;
                r.map_err(|_| "target discard failed")?;
            }
        }
        Ok(())
    }

    pub(super) fn fill_slab(&self, key: SlabKey, target: u16) -> Result<(), &'static str> {
        if !self.quiesce(key, false) {
            return Err("a write that read the old placement is still in flight");
        }
        let base = key.1 * self.cfg.slab_pages;
        let mut pages: Vec<u64> = Vec::with_capacity(MAX_PAGES_PER_FRAME);
        let mut at = 0;
        while at < self.cfg.slab_pages {
            pages.clear();
            pages.extend((0..MAX_PAGES_PER_FRAME as u64).map(|i| base + at + i));
            self.copy_pages(key, target, &pages)?;
            at += MAX_PAGES_PER_FRAME as u64;
        }
        let give_up = Instant::now() + Duration::from_secs(30);
        // `Fault::StaleCopy`, on the first copy: the pages written meanwhile are not copied,
        // and the new replica serves reads first and gets no writes.
        let stale = self.cfg.fault == Some(Fault::StaleCopy)
            && self.health.fault_armed.swap(false, Ordering::AcqRel);
        loop {
            if Instant::now() > give_up {
                return Err("writes never paused long enough to finish the catch-up");
            }
            if self.servers.is_dead(target) {
                return Err("target died");
            }
            let dirty: Vec<u64> = {
                let mut fills = self.placements.lock_fills();
                let Some(fs) = fills.get_mut(key, target) else {
                    return Err("the copy's record is gone");
                };
                if fs.inflight > 0 {
                    None
                } else {
                    let d: Vec<u64> = fs.dirty.drain().collect();
                    if !d.is_empty() && stale {
                        Some(Vec::new())
                    } else if d.is_empty() {
                        // Flip under the fill lock: writes register under it, so none can
                        // observe "filling" after this and skip the target.
                        let mut m = self.placements.write_shard(key);
                        let placed = m.get_mut(&key).and_then(|p| {
                            let i = p.servers().iter().position(|&s| s == target)?;
                            p.is_filling(i).then_some((p, i))
                        });
                        let Some((p, i)) = placed else {
                            // Removed meanwhile (its server restarted empty): not a replica.
                            return Err("the new replica left the slab");
                        };
                        {
                            p.filling &= !(1 << i);
                            if stale {
                                // First in the read order (no other replica of the slab is
                                // filling: one copy per slab, so no bit moves).
                                p.replicas.swap(0, i);
                                *self
                                    .health
                                    .fault_deaf
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner()) = Some((key, target));
                                tracing::warn!(
                                    ns = key.0,
                                    slab = key.1,
                                    "fault injected: this slab's new replica lacks the \
                                     writes made while it was copied and gets none from now \
                                     on, and it serves reads first"
                                );
                            }
                        }
                        drop(m);
                        fills.end(key, target);
                        return Ok(());
                    } else {
                        Some(d)
                    }
                }
            }
            .unwrap_or_default();
            if dirty.is_empty() {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            }
            self.copy_pages(key, target, &dirty)?;
        }
    }
}

impl Core {
    /// `direct_io`, waiting out `QueueFull` (the VMM may hold every ticket for a moment).
    pub(super) fn direct_io_patient(
        &self,
        s: u16,
        op: TicketOp,
        ns: u64,
        mut io: IoBuf,
    ) -> (IoBuf, Result<u32, ClientError>) {
        for _ in 0..2000 {
            let (back, r) = self.direct_io(s, op, ns, io);
            if r != Err(ClientError::QueueFull) {
                return (back, r);
            }
            io = back;
            std::thread::sleep(Duration::from_millis(1));
        }
        (io, Err(ClientError::QueueFull))
    }
}
