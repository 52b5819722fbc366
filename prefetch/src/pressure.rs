//! Memory pressure, per process: how often its demand faults hit pages it faulted on, or had
//! fetched for it, a short while ago.
//!
//! A page a process faults on again soon after it was brought in was evicted in between: local
//! memory is too small for what the process is touching now, and every speculative page fetched
//! for it pushes out a page it is about to use. The estimate is an exponentially weighted
//! moving average (weight 1/32) of "this fault is a re-fault" over the process's faults, where
//! "recent" is two generations of a 16,384-bit page filter (a generation ends after
//! [`GENERATION`] faults, so a page is remembered for the last 2,048 to 4,096 faults) holding
//! every faulted page and every candidate proposed at a fault. A filter collision reads as a
//! re-fault, so the threshold is [`THRESHOLD`] above the filters' current fill (the chance of a
//! collision).
//!
//! `leap+stream` turns cautious while a process is under pressure (see
//! [`crate::composite`]): measured on traces of real programs (`docs/prefetch-real-traces.md`),
//! 246 of the 573 pages a numeric kernel had prefetched and never used were evicted before
//! their use; processes that are not under pressure see no change.
//!
//! Per-process state lives in a fixed [`SlotTable`]; nothing allocates after construction, and
//! a fault or a candidate costs one hash and one or two word operations.

use crate::slots::SlotTable;
use crate::{PageNo, ProcessKey};

/// Words of one generation's page filter (16,384 bits, 2 KiB).
const WORDS: usize = 256;
/// Faults per filter generation.
pub const GENERATION: u32 = 2048;
/// Fixed-point unit of the re-fault rate: 1.0 = `ONE`.
pub const ONE: u32 = 1024;
/// Re-fault rate above which a process is under pressure (100/1024, about 10%), on top of the
/// rate at which the filters' collisions make a new page look seen.
pub const THRESHOLD: u32 = 100;
/// The moving average's weight is 1/2^`WEIGHT_SHIFT`.
const WEIGHT_SHIFT: u32 = 5;

/// Per-process memory-pressure estimate (module documentation).
pub struct Pressure {
    slots: SlotTable,
    /// Two filters per slot: generations `2·slot` and `2·slot + 1`.
    filters: Box<[[u64; WORDS]]>,
    /// Which of its two filters a slot is filling (0 or 1).
    current: Box<[u8]>,
    /// Faults logged in the current generation.
    faults: Box<[u32]>,
    /// Re-fault rate, in 1/[`ONE`].
    rate: Box<[u32]>,
    /// Bits set in each filter (same indexing as `filters`).
    set: Box<[u32]>,
}

/// Word index and bit mask of `page` in a filter.
fn bit(page: PageNo) -> (usize, u64) {
    // The top 14 bits of a multiplicative hash: 256 words × 64 bits.
    let h = (page.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 50) as usize;
    (h >> 6, 1u64 << (h & 63))
}

impl Pressure {
    /// State for up to `slots` processes (at least 1), LRU-replaced.
    pub fn new(slots: usize) -> Self {
        let n = slots.max(1);
        Self {
            slots: SlotTable::new(n),
            filters: vec![[0u64; WORDS]; 2 * n].into_boxed_slice(),
            current: vec![0; n].into_boxed_slice(),
            faults: vec![0; n].into_boxed_slice(),
            rate: vec![0; n].into_boxed_slice(),
            set: vec![0; 2 * n].into_boxed_slice(),
        }
    }

    fn remember(&mut self, slot: usize, page: PageNo) {
        let (w, b) = bit(page);
        let f = 2 * slot + usize::from(self.current[slot]);
        if self.filters[f][w] & b == 0 {
            self.filters[f][w] |= b;
            self.set[f] += 1;
        }
    }

    /// Whether `page` is in either of `slot`'s filters.
    fn seen(&self, slot: usize, page: PageNo) -> bool {
        let (w, b) = bit(page);
        (self.filters[2 * slot][w] | self.filters[2 * slot + 1][w]) & b != 0
    }

    /// The chance, in 1/[`ONE`], that a page never seen reads as seen (the filters' fill; a
    /// slight overestimate of their union's).
    fn false_rate(&self, slot: usize) -> u32 {
        let bits = (WORDS * 64) as u64;
        let set = u64::from(self.set[2 * slot] + self.set[2 * slot + 1]);
        (set.min(bits) * u64::from(ONE) / bits) as u32
    }

    /// A demand fault of `key` on `page`: updates the estimate and returns whether the process
    /// is under pressure.
    pub fn on_fault(&mut self, key: ProcessKey, page: PageNo) -> bool {
        let slot = self.slots.acquire(key);
        let s = slot.index;
        if slot.fresh {
            self.filters[2 * s] = [0; WORDS];
            self.filters[2 * s + 1] = [0; WORDS];
            self.current[s] = 0;
            self.faults[s] = 0;
            self.rate[s] = 0;
            self.set[2 * s] = 0;
            self.set[2 * s + 1] = 0;
        }
        let again = self.seen(s, page);
        let r = self.rate[s];
        self.rate[s] = r - (r >> WEIGHT_SHIFT) + if again { ONE >> WEIGHT_SHIFT } else { 0 };
        self.remember(s, page);
        self.faults[s] += 1;
        if self.faults[s] >= GENERATION {
            // The older generation is forgotten and becomes the current one.
            self.faults[s] = 0;
            self.current[s] ^= 1;
            let f = 2 * s + usize::from(self.current[s]);
            self.filters[f] = [0; WORDS];
            self.set[f] = 0;
        }
        self.rate[s] > THRESHOLD + self.false_rate(s)
    }

    /// Pages proposed for `key` at its last fault: a fault on one of them soon is a re-fault.
    pub fn fetched(&mut self, key: ProcessKey, pages: &[PageNo]) {
        let Some(s) = self.slots.find(key) else {
            return;
        };
        for &p in pages {
            self.remember(s, p);
        }
    }

    /// The re-fault rate of `key` in 1/[`ONE`], if it has state (for tests and diagnostics).
    pub fn rate(&self, key: ProcessKey) -> Option<u32> {
        self.slots.find(key).map(|s| self.rate[s])
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
    fn a_scan_that_fits_is_not_under_pressure() {
        let mut p = Pressure::new(4);
        for page in 0..20_000u64 {
            assert!(!p.on_fault(1, page), "page {page}: {:?}", p.rate(1));
        }
        assert!(p.rate(1).unwrap() < THRESHOLD / 2, "{:?}", p.rate(1));
    }

    #[test]
    fn re_faults_on_recent_pages_are_pressure_and_it_passes() {
        let mut p = Pressure::new(4);
        // A loop over 600 pages that does not fit: every fault after the first pass is a
        // re-fault of a page faulted 600 faults ago.
        let mut pressed = false;
        for i in 0..3000u64 {
            pressed = p.on_fault(1, i % 600);
        }
        assert!(pressed, "{:?}", p.rate(1));
        // Another process is not affected.
        assert!(!p.on_fault(2, 0));
        // A fresh scan lets the estimate decay below the threshold.
        for page in 10_000..10_200u64 {
            pressed = p.on_fault(1, page);
        }
        assert!(!pressed, "{:?}", p.rate(1));
    }

    #[test]
    fn fetched_pages_count_and_old_generations_are_forgotten() {
        let mut p = Pressure::new(1);
        p.on_fault(1, 0);
        p.fetched(1, &[100, 101, 102]);
        let before = p.rate(1).unwrap();
        p.on_fault(1, 101);
        assert!(p.rate(1).unwrap() > before, "a fault on a fetched page");
        // Page 5_000_000 is remembered for one more generation, then forgotten.
        let x = 5_000_000;
        p.on_fault(1, x);
        let s = p.slots.find(1).unwrap();
        let mut others = (1_000_000u64..).filter(|&q| bit(q) != bit(x));
        for _ in 0..GENERATION {
            p.on_fault(1, others.next().unwrap());
        }
        assert!(p.seen(s, x), "still in the older generation");
        for _ in 0..GENERATION {
            p.on_fault(1, others.next().unwrap());
        }
        assert!(!p.seen(s, x), "two generations later");
        p.forget(1);
        assert_eq!(p.rate(1), None);
    }
}
