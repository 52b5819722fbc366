//! The evaluator's local memory: an LRU list of pages with O(1) lookup, touch, insert and evict.
//!
//! Nodes live in one preallocated array linked into a doubly linked list (index links, no
//! pointers); a hash map from `(process key, page)` to node index finds them. Each node carries
//! the prefetch metadata the accounting needs.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::{Nanos, PageNo, ProcessKey};

const NIL: u32 = u32::MAX;

/// A fast hasher for integer keys (a multiply-xorshift mix; keys are not adversarial here).
#[derive(Default)]
pub struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0;
        z = (z ^ (z >> 32)).wrapping_mul(0xd6e8_feb8_6659_fd93);
        z ^ (z >> 32)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(23) ^ v).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Prefetch state of a resident page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Meta {
    /// Brought in by a prefetch and not used yet.
    pub unused_prefetch: bool,
    /// That prefetch was a marker.
    pub marker: bool,
    /// When it was prefetched.
    pub fetched_at: Nanos,
}

#[derive(Clone, Copy, Debug)]
struct Node {
    key: ProcessKey,
    page: PageNo,
    prev: u32,
    next: u32,
    meta: Meta,
}

/// A page pushed out by an insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Evicted {
    /// The process the page belongs to.
    pub key: ProcessKey,
    /// The page.
    pub page: PageNo,
    /// Its prefetch state when it was evicted (an unused prefetch counts as waste).
    pub meta: Meta,
}

/// Fixed-capacity LRU set of pages.
pub struct Lru {
    map: HashMap<(ProcessKey, PageNo), u32, BuildHasherDefault<MixHasher>>,
    nodes: Vec<Node>,
    /// Most recently used.
    head: u32,
    /// Least recently used (next victim).
    tail: u32,
    capacity: usize,
}

impl Lru {
    /// `capacity` pages, at least 1 and below 2^32.
    pub fn new(capacity: usize) -> Self {
        let capacity = capacity.clamp(1, NIL as usize - 1);
        Self {
            map: HashMap::with_capacity_and_hasher(capacity, Default::default()),
            nodes: Vec::with_capacity(capacity),
            head: NIL,
            tail: NIL,
            capacity,
        }
    }

    /// Resident pages.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether no page is resident.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The node index of `page` of process `key`, if resident.
    pub fn get(&self, key: ProcessKey, page: PageNo) -> Option<u32> {
        self.map.get(&(key, page)).copied()
    }

    /// The prefetch state of the page at node `idx` (an index [`Lru::get`] returned).
    pub fn meta(&mut self, idx: u32) -> &mut Meta {
        &mut self.nodes[idx as usize].meta
    }

    fn unlink(&mut self, idx: u32) {
        let Node { prev, next, .. } = self.nodes[idx as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    fn link_head(&mut self, idx: u32) {
        self.nodes[idx as usize].prev = NIL;
        self.nodes[idx as usize].next = self.head;
        if self.head != NIL {
            self.nodes[self.head as usize].prev = idx;
        }
        self.head = idx;
        if self.tail == NIL {
            self.tail = idx;
        }
    }

    fn link_tail(&mut self, idx: u32) {
        self.nodes[idx as usize].next = NIL;
        self.nodes[idx as usize].prev = self.tail;
        if self.tail != NIL {
            self.nodes[self.tail as usize].next = idx;
        }
        self.tail = idx;
        if self.head == NIL {
            self.head = idx;
        }
    }

    /// Marks `idx` most recently used.
    pub fn touch(&mut self, idx: u32) {
        if self.head != idx {
            self.unlink(idx);
            self.link_head(idx);
        }
    }

    /// Makes `idx` the next victim (Leap's eager eviction of a consumed prefetch).
    pub fn demote(&mut self, idx: u32) {
        if self.tail != idx {
            self.unlink(idx);
            self.link_tail(idx);
        }
    }

    /// Inserts a page that is not resident as most recently used, evicting the LRU page if full.
    pub fn insert(&mut self, key: ProcessKey, page: PageNo, meta: Meta) -> Option<Evicted> {
        debug_assert!(self.get(key, page).is_none());
        let mut evicted = None;
        let idx = if self.nodes.len() < self.capacity {
            self.nodes.push(Node {
                key,
                page,
                prev: NIL,
                next: NIL,
                meta,
            });
            (self.nodes.len() - 1) as u32
        } else {
            let victim = self.tail;
            self.unlink(victim);
            let old = self.nodes[victim as usize];
            self.map.remove(&(old.key, old.page));
            evicted = Some(Evicted {
                key: old.key,
                page: old.page,
                meta: old.meta,
            });
            let n = &mut self.nodes[victim as usize];
            n.key = key;
            n.page = page;
            n.meta = meta;
            victim
        };
        self.map.insert((key, page), idx);
        self.link_head(idx);
        evicted
    }

    /// Evicts the least recently used page, if any (a frame freed ahead of a read).
    pub fn pop_lru(&mut self) -> Option<Evicted> {
        if self.tail == NIL {
            return None;
        }
        let victim = self.tail;
        self.unlink(victim);
        let old = self.nodes[victim as usize];
        self.map.remove(&(old.key, old.page));
        // Keep the node array dense: move the last node into the hole.
        let last = (self.nodes.len() - 1) as u32;
        if victim != last {
            let moved = self.nodes[last as usize];
            self.nodes[victim as usize] = moved;
            if moved.prev == NIL {
                self.head = victim;
            } else {
                self.nodes[moved.prev as usize].next = victim;
            }
            if moved.next == NIL {
                self.tail = victim;
            } else {
                self.nodes[moved.next as usize].prev = victim;
            }
            self.map.insert((moved.key, moved.page), victim);
        }
        self.nodes.pop();
        Some(Evicted {
            key: old.key,
            page: old.page,
            meta: old.meta,
        })
    }

    /// Every resident page's metadata (for end-of-run accounting).
    pub fn metas(&self) -> impl Iterator<Item = &Meta> {
        self.nodes.iter().map(|n| &n.meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let mut l = Lru::new(3);
        for p in 0..3 {
            assert_eq!(l.insert(1, p, Meta::default()), None);
        }
        let i0 = l.get(1, 0).unwrap();
        l.touch(i0);
        let ev = l.insert(1, 3, Meta::default()).unwrap();
        assert_eq!((ev.key, ev.page), (1, 1));
        let i3 = l.get(1, 3).unwrap();
        l.demote(i3);
        let ev = l.insert(2, 3, Meta::default()).unwrap();
        assert_eq!((ev.key, ev.page), (1, 3), "a demoted page goes first");
        assert!(l.get(2, 3).is_some() && l.get(1, 0).is_some() && l.get(1, 2).is_some());
        assert_eq!(l.len(), 3);
    }

    #[test]
    fn pop_lru_frees_the_oldest_and_keeps_links() {
        let mut l = Lru::new(4);
        for p in 0..4 {
            l.insert(1, p, Meta::default());
        }
        let i1 = l.get(1, 1).unwrap();
        l.touch(i1);
        assert_eq!(l.pop_lru().map(|e| e.page), Some(0));
        assert_eq!(l.pop_lru().map(|e| e.page), Some(2));
        l.insert(1, 9, Meta::default());
        assert_eq!(l.len(), 3);
        let order: Vec<u64> = std::iter::from_fn(|| l.pop_lru().map(|e| e.page)).collect();
        assert_eq!(order, [3, 1, 9]);
        assert!(l.is_empty() && l.pop_lru().is_none());
    }

    #[test]
    fn capacity_one() {
        let mut l = Lru::new(1);
        l.insert(1, 1, Meta::default());
        let ev = l.insert(1, 2, Meta::default()).unwrap();
        assert_eq!(ev.page, 1);
        let i = l.get(1, 2).unwrap();
        l.touch(i);
        l.demote(i);
        assert_eq!(l.len(), 1);
    }
}
