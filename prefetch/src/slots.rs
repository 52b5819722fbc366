//! Fixed-capacity table mapping process keys to state slots, with LRU replacement.
//!
//! Every per-process prefetcher keeps its state in arrays indexed by a slot number from this
//! table. The table is allocated once at construction; lookups scan at most `capacity` keys
//! (64 by default: a few cache lines) and never allocate, so a decision stays allocation-free
//! and lock-free. When the table is full the least recently used process loses its state, which
//! only costs that process a short re-learning period.

use crate::ProcessKey;

/// Result of [`SlotTable::acquire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Index into the caller's state arrays.
    pub index: usize,
    /// The slot was (re)assigned to this key just now: the caller must reset its state.
    pub fresh: bool,
}

/// Process key → slot index, LRU-replaced.
#[derive(Debug)]
pub struct SlotTable {
    keys: Box<[ProcessKey]>,
    /// Last-use stamp per slot; 0 = free.
    stamps: Box<[u64]>,
    clock: u64,
    /// Index of the most recent hit: consecutive faults usually come from one process.
    last: usize,
}

impl SlotTable {
    /// A table of `capacity` slots (at least 1).
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            keys: vec![0; capacity].into_boxed_slice(),
            stamps: vec![0; capacity].into_boxed_slice(),
            clock: 0,
            last: 0,
        }
    }

    /// How many processes the table holds before it reuses slots.
    pub fn capacity(&self) -> usize {
        self.keys.len()
    }

    /// The slot of `key`, if it has one (does not touch the LRU order).
    pub fn find(&self, key: ProcessKey) -> Option<usize> {
        if self.stamps[self.last] != 0 && self.keys[self.last] == key {
            return Some(self.last);
        }
        (0..self.keys.len()).find(|&i| self.stamps[i] != 0 && self.keys[i] == key)
    }

    /// The slot of `key`, assigning (and reporting as fresh) the least recently used slot if the
    /// key has none.
    pub fn acquire(&mut self, key: ProcessKey) -> Slot {
        self.clock += 1;
        if let Some(i) = self.find(key) {
            self.stamps[i] = self.clock;
            self.last = i;
            return Slot {
                index: i,
                fresh: false,
            };
        }
        // Free slots have stamp 0, so the minimum is a free slot if there is one.
        let mut victim = 0;
        for i in 1..self.stamps.len() {
            if self.stamps[i] < self.stamps[victim] {
                victim = i;
            }
        }
        self.keys[victim] = key;
        self.stamps[victim] = self.clock;
        self.last = victim;
        Slot {
            index: victim,
            fresh: true,
        }
    }

    /// Frees the slot of `key`, if any.
    pub fn remove(&mut self, key: ProcessKey) -> Option<usize> {
        let i = self.find(key)?;
        self.stamps[i] = 0;
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assigns_reuses_and_replaces_lru() {
        let mut t = SlotTable::new(2);
        let a = t.acquire(10);
        assert!(a.fresh);
        let b = t.acquire(20);
        assert!(b.fresh);
        assert_ne!(a.index, b.index);
        assert_eq!(
            t.acquire(10),
            Slot {
                index: a.index,
                fresh: false
            }
        );
        // 20 is now least recently used: 30 takes its slot.
        let c = t.acquire(30);
        assert_eq!(
            c,
            Slot {
                index: b.index,
                fresh: true
            }
        );
        assert_eq!(t.find(20), None);
        assert_eq!(t.remove(10), Some(a.index));
        assert_eq!(t.find(10), None);
        assert_eq!(
            t.acquire(40),
            Slot {
                index: a.index,
                fresh: true
            }
        );
    }
}
