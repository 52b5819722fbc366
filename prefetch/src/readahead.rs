//! The `read-ahead` baseline: Linux swap cluster read-ahead (`swapin_nr_pages()` and
//! `swap_cluster_readahead()`, mm/swap_state.c), which Leap compares against.
//!
//! Its history is two faults: the previous fault offset and the previous window. The window is
//! `hits + 2` (hits = read-ahead pages used since the last decision) rounded up to a power of
//! two ≥ 4, capped at `max` (8 = 2^page_cluster), never below half the previous window; with no
//! hits it is 2 if the fault is adjacent to the previous one, else 1. It then reads the aligned
//! block of that size around the fault. Hits are only learnt through `on_hit`, so in injected
//! mode this baseline degrades to adjacent-pair read-ahead.

use crate::slots::SlotTable;
use crate::{Candidates, Nanos, PageNo, Prefetcher, ProcessKey};

#[derive(Clone, Copy, Debug, Default)]
struct RaState {
    prev: PageNo,
    prev_win: usize,
    hits: usize,
}

/// Linux swap read-ahead.
pub struct ReadAhead {
    max: usize,
    per_process: bool,
    slots: SlotTable,
    states: Box<[RaState]>,
}

/// `__swapin_nr_pages()` from Linux.
pub fn swapin_nr_pages(
    prev: PageNo,
    offset: PageNo,
    hits: usize,
    max: usize,
    prev_win: usize,
) -> usize {
    let mut pages = hits + 2;
    if pages == 2 {
        if offset != prev.wrapping_add(1) && offset != prev.wrapping_sub(1) {
            pages = 1;
        }
    } else {
        let mut roundup = 4;
        while roundup < pages {
            roundup <<= 1;
        }
        pages = roundup;
    }
    pages = pages.min(max);
    pages.max(prev_win / 2)
}

impl ReadAhead {
    /// A read-ahead window growing up to `max` pages; `slots` streams tracked, per process if `per_process`.
    pub fn new(max: usize, slots: usize, per_process: bool) -> Self {
        let slots = slots.max(1);
        Self {
            max: max.max(1),
            per_process,
            slots: SlotTable::new(slots),
            states: vec![RaState::default(); slots].into_boxed_slice(),
        }
    }
    fn key(&self, key: ProcessKey) -> ProcessKey {
        if self.per_process {
            key
        } else {
            0
        }
    }
}

impl Prefetcher for ReadAhead {
    fn name(&self) -> &'static str {
        "read-ahead"
    }
    fn on_fault(&mut self, key: ProcessKey, page: PageNo, _now: Nanos, out: &mut Candidates) {
        out.clear();
        let slot = self.slots.acquire(self.key(key));
        let st = &mut self.states[slot.index];
        if slot.fresh {
            // Linux starts with prev_offset = 0 and last_readahead_pages = 0.
            *st = RaState::default();
        }
        let hits = std::mem::take(&mut st.hits);
        let win = swapin_nr_pages(st.prev, page, hits, self.max, st.prev_win);
        st.prev = page;
        st.prev_win = win;
        if win <= 1 {
            return;
        }
        // Windows are powers of two (or 2), so the mask selects the aligned block.
        let mask = (win as u64).next_power_of_two() - 1;
        let start = page & !mask;
        let end = page | mask;
        for p in start..=end {
            if p != page {
                out.push(p);
            }
        }
    }
    fn on_hit(&mut self, key: ProcessKey, _page: PageNo, _now: Nanos) {
        if let Some(s) = self.slots.find(self.key(key)) {
            self.states[s].hits += 1;
        }
    }
    fn forget(&mut self, key: ProcessKey) {
        self.slots.remove(self.key(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_window_rule() {
        assert_eq!(swapin_nr_pages(10, 50, 0, 8, 0), 1, "no hits, not adjacent");
        assert_eq!(swapin_nr_pages(10, 11, 0, 8, 0), 2, "no hits, adjacent");
        assert_eq!(swapin_nr_pages(10, 50, 1, 8, 0), 4, "hits+2 = 3 → 4");
        assert_eq!(swapin_nr_pages(10, 50, 5, 8, 0), 8);
        assert_eq!(swapin_nr_pages(10, 50, 50, 8, 0), 8, "capped");
        assert_eq!(swapin_nr_pages(10, 50, 0, 8, 8), 4, "halves at most");
    }

    #[test]
    fn aligned_block_around_fault_grows_with_hits() {
        let mut ra = ReadAhead::new(8, 4, true);
        let mut out = Candidates::new();
        ra.on_fault(1, 13, 0, &mut out);
        assert!(out.is_empty());
        ra.on_fault(1, 14, 1, &mut out);
        assert_eq!(out.as_slice(), &[15]);
        ra.on_hit(1, 15, 2);
        ra.on_hit(1, 16, 2);
        ra.on_hit(1, 17, 2);
        ra.on_fault(1, 18, 3, &mut out);
        // hits 3 → 5 → 8: block 16..=23 without 18.
        assert_eq!(out.as_slice(), &[16, 17, 19, 20, 21, 22, 23]);
    }
}
