//! The bookkeeping of slab copies: which slab is being copied onto which new replica, the pages
//! written or discarded meanwhile, the old copies being scrubbed off a server a replica
//! moved away from, and the copies left on a server out of service when its replicas were
//! dropped (scrubbed if it comes back with its pages).
//!
//! Every change of a placement that a write can race with happens under this one lock
//! ([`Placements::fills`](crate::placement::Placements)), taken before the placement's shard:
//! starting a copy (the new replica becomes *filling* and its [`FillState`] is created in the
//! same critical section), registering a write to a slab being filled, the flip of a filled
//! replica to established, dropping a stopped copy, and dropping replicas that missed a
//! write. So a write either sees the slab filling and is tracked, or sees it settled.
//!
//! One copy per slab at a time, owned by its target: a copy that stops removes only its own
//! state and replica, never another copy's (a slab's copy that outlived its target's removal
//! once wiped a newer copy's record of the pages written meanwhile, and that copy then
//! became a replica missing writes).

use rustc_hash::{FxHashMap, FxHashSet};

use crate::placement::SlabKey;

/// Pages written or discarded in a slab while it is copied onto `target`.
pub(crate) struct FillState {
    /// This copy, among every copy the client made (a write registered with it names it).
    pub id: u64,
    /// The server being filled.
    pub target: u16,
    pub dirty: FxHashSet<u64>,
    /// Tracked writes/discards in flight.
    pub inflight: u32,
}

/// Copies in progress and old copies being scrubbed.
#[derive(Default)]
pub(crate) struct Fills {
    by_slab: FxHashMap<SlabKey, FillState>,
    /// The id of the next copy.
    next_id: u64,
    /// (slab, server): the server's old copy of the slab is being discarded (the replica
    /// moved away); no copy of that slab may go back there until it is done.
    scrubbing: FxHashSet<(SlabKey, u16)>,
    /// Per server taken out of service, the slabs whose replica on it was dropped from the
    /// placement (others held them): a server that comes back with its pages still has those
    /// copies, which nothing reads and nobody else knows of, so they are scrubbed then.
    left_behind: FxHashMap<u16, Vec<SlabKey>>,
}

impl Fills {
    /// Records the start of the copy of `key` onto `target`; false if the slab has one.
    pub fn start(&mut self, key: SlabKey, target: u16) -> bool {
        if self.by_slab.contains_key(&key) {
            return false;
        }
        self.next_id += 1;
        self.by_slab.insert(
            key,
            FillState {
                id: self.next_id,
                target,
                dirty: FxHashSet::default(),
                inflight: 0,
            },
        );
        true
    }

    /// The copy of `key`, if any.
    pub fn get(&self, key: SlabKey) -> Option<&FillState> {
        self.by_slab.get(&key)
    }

    /// The copy of `key` onto `target`, if that is the one in progress.
    pub fn get_mut(&mut self, key: SlabKey, target: u16) -> Option<&mut FillState> {
        self.by_slab.get_mut(&key).filter(|f| f.target == target)
    }

    /// The copy of `key`, whatever its target (a write registering with it).
    pub fn current_mut(&mut self, key: SlabKey) -> Option<&mut FillState> {
        self.by_slab.get_mut(&key)
    }

    /// Copy `id` of `key`, if it is still in progress (a write it tracked finishing: a later
    /// copy of the slab, even onto the same server, counts only its own writes).
    pub fn by_id_mut(&mut self, key: SlabKey, id: u64) -> Option<&mut FillState> {
        self.by_slab.get_mut(&key).filter(|f| f.id == id)
    }

    /// Ends the copy of `key` onto `target` (done or stopped); a copy onto another target is
    /// left alone.
    pub fn end(&mut self, key: SlabKey, target: u16) {
        if self.by_slab.get(&key).is_some_and(|f| f.target == target) {
            self.by_slab.remove(&key);
        }
    }

    /// Marks `server`'s old copy of `key` as being scrubbed; false if it already is.
    pub fn start_scrub(&mut self, key: SlabKey, server: u16) -> bool {
        self.scrubbing.insert((key, server))
    }

    pub fn end_scrub(&mut self, key: SlabKey, server: u16) {
        self.scrubbing.remove(&(key, server));
    }

    /// Records that `server`'s replica of `key` left the placement while it was out of
    /// service (its copy may still be there).
    pub fn leave_behind(&mut self, server: u16, key: SlabKey) {
        self.left_behind.entry(server).or_default().push(key);
    }

    /// The slabs whose copies `server` may still hold though no placement names it (see
    /// `left_behind`); the record is cleared.
    pub fn take_left_behind(&mut self, server: u16) -> Vec<SlabKey> {
        self.left_behind.remove(&server).unwrap_or_default()
    }

    /// Whether `server`'s old copy of `key` is being scrubbed.
    pub fn scrubbing(&self, key: SlabKey, server: u16) -> bool {
        self.scrubbing.contains(&(key, server))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_copy_never_ends_another_copy_of_its_slab() {
        let mut f = Fills::default();
        let key = (1, 2);
        assert!(f.start(key, 5));
        assert!(!f.start(key, 6), "one copy per slab");
        f.current_mut(key).unwrap().dirty.insert(9);
        let first = f.get(key).unwrap().id;
        f.end(key, 6);
        assert_eq!(f.get(key).map(|s| s.target), Some(5));
        assert!(f.get_mut(key, 6).is_none());
        assert!(f.get_mut(key, 5).is_some_and(|s| s.dirty.contains(&9)));
        f.end(key, 5);
        assert!(f.get(key).is_none());
        assert!(f.start(key, 5));
        assert!(
            f.by_id_mut(key, first).is_none(),
            "a write of the first copy onto 5 is not the second's"
        );
        assert!(f.start_scrub(key, 3));
        assert!(!f.start_scrub(key, 3));
        assert!(f.scrubbing(key, 3) && !f.scrubbing(key, 4));
        f.end_scrub(key, 3);
        assert!(!f.scrubbing(key, 3));
    }
}
