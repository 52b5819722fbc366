//! Region read-around: for faults that cluster in a small aligned block in no particular order.
//!
//! Real programs fill and revisit small regions out of order: an allocator hands out objects
//! from a run of fresh pages, a hash table's buckets, a B-tree's nodes and a program's data
//! segment sit next to each other and are touched in key order, not address order. Such faults
//! have no stride, so neither the stream table nor Leap's majority trend sees anything, while
//! next-N (every neighbour on every miss) covers them at a high waste. This component reads the
//! rest of an aligned block of `block` pages once the process's recent faults show the block is
//! dense: at least `min_near` of its last [`RECENT`] faults fell in the same block. Uniformly
//! random faults almost never meet that (3 of 8 recent faults in one 16-page block), so it
//! stays quiet where nothing can be predicted.
//!
//! Per-process state lives in a fixed [`SlotTable`]; nothing allocates after construction.

use crate::slots::SlotTable;
use crate::{Candidates, PageNo, ProcessKey};

/// Recent faults remembered per process.
pub const RECENT: usize = 8;

/// Region read-around tunables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionParams {
    /// Pages per aligned block (rounded up to a power of two in 2..=64; default 16).
    pub block: u64,
    /// Faults among the last [`RECENT`] that must share the block (default 3).
    pub min_near: usize,
    /// Per-process state slots.
    pub slots: usize,
}

impl Default for RegionParams {
    fn default() -> Self {
        Self {
            block: 16,
            min_near: 3,
            slots: 64,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Recent {
    pages: [PageNo; RECENT],
    next: usize,
}

impl Default for Recent {
    fn default() -> Self {
        Self {
            pages: [PageNo::MAX; RECENT],
            next: 0,
        }
    }
}

/// The region read-around component (used inside `leap+stream`).
pub struct Region {
    params: RegionParams,
    slots: SlotTable,
    recent: Box<[Recent]>,
}

impl Region {
    /// Builds the component.
    pub fn new(params: RegionParams) -> Self {
        let params = RegionParams {
            block: params.block.clamp(2, 64).next_power_of_two(),
            ..params
        };
        let n = params.slots.max(1);
        Self {
            params,
            slots: SlotTable::new(n),
            recent: vec![Recent::default(); n].into_boxed_slice(),
        }
    }

    /// A demand fault of `key` on `page`. If `decide` (no other component answered), reads the
    /// rest of the page's block into `out` when the block is dense. Every fault is logged.
    pub fn on_fault(&mut self, key: ProcessKey, page: PageNo, decide: bool, out: &mut Candidates) {
        let slot = self.slots.acquire(key);
        if slot.fresh {
            self.recent[slot.index] = Recent::default();
        }
        let block = self.params.block;
        let r = &mut self.recent[slot.index];
        let near = r
            .pages
            .iter()
            .filter(|&&q| q != PageNo::MAX && q != page && q / block == page / block)
            .count();
        r.pages[r.next] = page;
        r.next = (r.next + 1) % RECENT;
        if decide && near >= self.params.min_near {
            let start = page - page % block;
            for p in start..=start + (block - 1) {
                if p != page {
                    out.push(p);
                }
            }
        }
    }

    /// The process is gone.
    pub fn forget(&mut self, key: ProcessKey) {
        self.slots.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_around_a_dense_block_only() {
        let mut r = Region::new(RegionParams::default());
        let mut out = Candidates::new();
        for p in [37, 1000, 34, 45] {
            r.on_fault(1, p, true, &mut out);
            assert!(out.is_empty(), "fewer than 3 earlier faults in the block");
        }
        r.on_fault(1, 40, true, &mut out);
        assert_eq!(
            out.as_slice(),
            (32..48).filter(|&p| p != 40).collect::<Vec<_>>().as_slice()
        );
        let mut out = Candidates::new();
        r.on_fault(1, 41, false, &mut out);
        assert!(out.is_empty(), "another component answered");
        r.on_fault(2, 42, true, &mut out);
        assert!(out.is_empty(), "processes do not share recent faults");
        r.on_fault(1, u64::MAX - 1, true, &mut out);
        r.on_fault(1, u64::MAX - 2, true, &mut out);
        r.on_fault(1, u64::MAX - 3, true, &mut out);
        r.on_fault(1, u64::MAX - 4, true, &mut out);
        assert_eq!(
            out.len(),
            15,
            "the last block of the page range, no overflow"
        );
    }

    #[test]
    fn random_faults_rarely_read_around() {
        let mut r = Region::new(RegionParams::default());
        let mut out = Candidates::new();
        let mut x = 1u64;
        let mut issued = 0;
        for _ in 0..10_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            r.on_fault(1, (x >> 33) % (1 << 20), true, &mut out);
            issued += usize::from(!out.is_empty());
            out.clear();
        }
        assert!(issued < 10, "read around {issued} times");
    }
}
