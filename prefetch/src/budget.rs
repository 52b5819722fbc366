//! The waste budget of `leap+stream` ([`crate::composite`]): per process, an estimate of the
//! share of fetched pages that its own decision wastes, and the throttle that makes that
//! decision cautious while the estimate runs above the cap.
//!
//! Owns, per process (a [`SlotTable`] slot): a ring of *sampled* pages (every
//! [`SAMPLE_EVERY`]-th page the decision proposes becomes a marker, so its first use is
//! reported even with injected hits), the decayed counts of samples used and unused, of pages
//! fetched and of demand faults, and whether the process is throttled.
//!
//! With injected hits a prefetched page's use is invisible; a marker's is not (the engine
//! stages it and reports its first touch, [`crate::Candidates`]). A sample is *used* when its
//! marker is hit, *unused* when the process has taken [`HORIZON`] more demand faults before
//! that (or when the ring is full and it is the oldest), or when the process faults on it
//! (evicted before use, or never fetched: the decision cannot tell). The share unused estimates the share
//! of prefetched pages never used, and the process's waste (unused over all pages fetched,
//! demand faults included, as `farvm_prefetch::compare` counts it) is that share times
//! prefetched / (prefetched + faults). Counts halve every [`DECAY_SAMPLES`] resolved samples,
//! so the estimate follows the program's phases.
//!
//! The estimate leans high: a sample the engine finds already resident is never fetched, so
//! its marker is never hit (the sandbox's filter of pages made resident lately,
//! [`crate::sandbox::Sandbox::recently_resident`], keeps most of them out, not all), and a page
//! used later than the horizon counts as unused. The throttle therefore goes on above
//! [`THROTTLE_ON`] (12%, over the rule's 10% cap) and off again below [`THROTTLE_OFF`],
//! judged once [`MIN_SAMPLES`] samples are resolved. While on, the composite decides as under
//! memory pressure and keeps only the nearest [`THROTTLED_DEPTH`] page of an answer that is
//! not a stream's window (cutting streams' windows breaks sequential re-reads in the engine
//! model: the estimate runs high there, its samples mostly proposed again while in flight).
//!
//! Cost per decision: one slot lookup, a countdown per proposed page, and a ring write per
//! sample; a marker hit scans the ring. Nothing is allocated after construction.

use crate::slots::SlotTable;
use crate::{Candidates, PageNo, ProcessKey};

/// One proposed page in this many becomes a sample (a marker).
pub const SAMPLE_EVERY: u8 = 8;
/// Outstanding samples per process at most (the oldest is judged unused to make room).
pub const RING: usize = 32;
/// Demand faults of the process after which a sample not used yet counts as unused.
pub const HORIZON: u32 = 256;
/// Resolved samples after which every count halves.
pub const DECAY_SAMPLES: u32 = 64;
/// Resolved samples before the estimate is acted on.
pub const MIN_SAMPLES: u32 = 8;
/// Estimated waste above which the process is throttled (the estimate leans high, see the
/// module documentation).
pub const THROTTLE_ON: f64 = 0.12;
/// Estimated waste below which a throttled process is let go again.
pub const THROTTLE_OFF: f64 = 0.10;
/// Pages of its answer a throttled process keeps (the nearest).
pub const THROTTLED_DEPTH: usize = 1;

const EMPTY: PageNo = PageNo::MAX;

/// Per-process estimate and throttle.
#[derive(Clone, Copy, Debug)]
struct Account {
    /// Outstanding samples, oldest at `tail`: the page ([`EMPTY`] once used) and the process's
    /// fault count when it was taken.
    ring: [(PageNo, u32); RING],
    tail: usize,
    len: usize,
    countdown: u8,
    /// Demand faults of the process so far (the samples' clock).
    clock: u32,
    used: u32,
    unused: u32,
    fetched: u32,
    faults: u32,
    throttled: bool,
}

impl Account {
    fn fresh() -> Self {
        Self {
            ring: [(EMPTY, 0); RING],
            tail: 0,
            len: 0,
            countdown: SAMPLE_EVERY,
            clock: 0,
            used: 0,
            unused: 0,
            fetched: 0,
            faults: 0,
            throttled: false,
        }
    }

    /// Drops the used samples at the tail and resolves as unused those taken more than
    /// [`HORIZON`] faults ago, and the oldest one when `make_room` and the ring is full.
    fn expire(&mut self, make_room: bool) {
        while self.len > 0 {
            let (page, at) = self.ring[self.tail];
            let full = make_room && self.len == RING;
            if page != EMPTY && !full && self.clock.wrapping_sub(at) <= HORIZON {
                break;
            }
            self.tail = (self.tail + 1) % RING;
            self.len -= 1;
            if page != EMPTY {
                self.unused += 1;
                self.resolved();
            }
        }
    }

    /// The process's estimated waste, `None` before [`MIN_SAMPLES`] samples are resolved.
    fn waste(&self) -> Option<f64> {
        let resolved = self.used + self.unused;
        if resolved < MIN_SAMPLES {
            return None;
        }
        let unused_share = f64::from(self.unused) / f64::from(resolved);
        let fetched = f64::from(self.fetched);
        Some(unused_share * fetched / (fetched + f64::from(self.faults)).max(1.0))
    }

    /// One more sample resolved: decay, then re-judge the throttle.
    fn resolved(&mut self) {
        if self.used + self.unused >= DECAY_SAMPLES {
            self.used /= 2;
            self.unused /= 2;
            self.fetched /= 2;
            self.faults /= 2;
        }
        if let Some(w) = self.waste() {
            if w > THROTTLE_ON {
                self.throttled = true;
            } else if w < THROTTLE_OFF {
                self.throttled = false;
            }
        }
    }
}

/// Per-process waste estimate and throttle (see the module documentation).
#[derive(Debug)]
pub struct WasteBudget {
    slots: SlotTable,
    accounts: Box<[Account]>,
}

impl WasteBudget {
    /// A budget for `slots` processes (LRU-replaced beyond that).
    pub fn new(slots: usize) -> Self {
        let slots = SlotTable::new(slots);
        let n = slots.capacity();
        Self {
            accounts: vec![Account::fresh(); n].into_boxed_slice(),
            slots,
        }
    }

    /// A demand fault of `key` on `page`: counts it and returns whether the process's own
    /// decision must be cautious now. A sample faulted on counts as unused: it was evicted
    /// before its use (or never fetched: the decision cannot tell).
    pub fn on_fault(&mut self, key: ProcessKey, page: PageNo) -> bool {
        let s = self.slots.acquire(key);
        let a = &mut self.accounts[s.index];
        if s.fresh {
            *a = Account::fresh();
        }
        if a.len > 0 {
            if let Some(i) = a.ring.iter().position(|&(p, _)| p == page) {
                a.ring[i].0 = EMPTY;
                a.unused += 1;
                a.resolved();
            }
        }
        a.faults = a.faults.saturating_add(1);
        a.clock = a.clock.wrapping_add(1);
        a.expire(false);
        a.throttled
    }

    /// The decision for `key` proposed `out`: counts its pages and turns every
    /// [`SAMPLE_EVERY`]-th one that is not a marker already, and that `resident` does not know
    /// as resident lately (a resident page is never fetched, so its marker would never be
    /// hit), into a sample.
    pub fn proposed(
        &mut self,
        key: ProcessKey,
        out: &mut Candidates,
        resident: impl Fn(PageNo) -> bool,
    ) {
        let Some(slot) = self.slots.find(key) else {
            return;
        };
        let a = &mut self.accounts[slot];
        for i in 0..out.len() {
            if out.is_marker(i) {
                continue;
            }
            a.fetched = a.fetched.saturating_add(1);
            a.countdown -= 1;
            if a.countdown > 0 {
                continue;
            }
            let page = out.as_slice()[i];
            if resident(page) {
                a.countdown = 1;
                continue;
            }
            a.countdown = SAMPLE_EVERY;
            out.set_marker(i);
            a.expire(true);
            a.ring[(a.tail + a.len) % RING] = (page, a.clock);
            a.len += 1;
        }
    }

    /// The first use of `page` by `key` was reported (a marker hit, or a hit where hits are
    /// visible): whether it was one of its samples (now counted used).
    pub fn used(&mut self, key: ProcessKey, page: PageNo) -> bool {
        let Some(slot) = self.slots.find(key) else {
            return false;
        };
        let a = &mut self.accounts[slot];
        let Some(i) = a.ring.iter().position(|&(p, _)| p == page) else {
            return false;
        };
        a.ring[i].0 = EMPTY;
        a.used += 1;
        a.resolved();
        true
    }

    /// Whether `key` is throttled now.
    pub fn throttled(&self, key: ProcessKey) -> bool {
        self.slots
            .find(key)
            .is_some_and(|s| self.accounts[s].throttled)
    }

    /// The process is gone.
    pub fn forget(&mut self, key: ProcessKey) {
        if let Some(slot) = self.slots.remove(key) {
            self.accounts[slot] = Account::fresh();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Proposes `n` fresh pages per fault for `faults` faults; `use_sample` says whether each
    /// sample's marker gets hit.
    fn drive(b: &mut WasteBudget, faults: u64, n: u64, use_sample: impl Fn(u64) -> bool) {
        let mut page = 0;
        for _ in 0..faults {
            b.on_fault(1, u64::MAX - 1);
            let mut out = Candidates::new();
            for _ in 0..n {
                out.push(page);
                page += 1;
            }
            b.proposed(1, &mut out, |_| false);
            for (p, marker) in out.iter() {
                if marker && use_sample(p) {
                    assert!(b.used(1, p));
                }
            }
        }
    }

    #[test]
    fn every_eighth_page_is_a_sample() {
        let mut b = WasteBudget::new(4);
        b.on_fault(1, u64::MAX - 1);
        let mut out = Candidates::new();
        for p in 0..16 {
            out.push(p);
        }
        b.proposed(1, &mut out, |_| false);
        let markers: Vec<_> = out.iter().filter(|&(_, m)| m).map(|(p, _)| p).collect();
        assert_eq!(markers, vec![7, 15]);
    }

    #[test]
    fn resident_pages_and_existing_markers_are_not_sampled() {
        let mut b = WasteBudget::new(4);
        b.on_fault(1, u64::MAX - 1);
        let mut out = Candidates::new();
        for p in 0..9 {
            out.push(p);
        }
        out.set_marker(3);
        b.proposed(1, &mut out, |p| p == 8);
        assert!(out.iter().all(|(p, m)| m == (p == 3)), "{out:?}");
        // The next page proposed is sampled instead.
        let mut out = Candidates::new();
        out.push(100);
        b.proposed(1, &mut out, |_| false);
        assert!(out.is_marker(0));
    }

    #[test]
    fn a_process_whose_samples_go_unused_is_throttled_and_let_go_when_they_are_used() {
        let mut b = WasteBudget::new(4);
        // Every page proposed is used: never throttled.
        drive(&mut b, 400, 8, |_| true);
        assert!(!b.throttled(1));
        // Half the samples unused, 8 pages per fault: waste ~ 0.5 * 8/9.
        drive(&mut b, 400, 8, |p| p % 16 == 7);
        assert!(b.throttled(1));
        // All used again: let go.
        drive(&mut b, 400, 8, |_| true);
        assert!(!b.throttled(1));
    }

    #[test]
    fn other_processes_pages_are_not_samples() {
        let mut b = WasteBudget::new(4);
        b.on_fault(1, u64::MAX - 1);
        let mut out = Candidates::new();
        for p in 0..8 {
            out.push(p);
        }
        b.proposed(1, &mut out, |_| false);
        assert!(!b.used(2, 7));
        assert!(b.used(1, 7));
        assert!(!b.used(1, 7), "a sample is counted once");
    }
}
