//! The sandbox that lets each process's own history choose which prefetcher `leap+stream`
//! follows ([`crate::composite`]): it scores the proposals of the prefetchers that are not
//! followed against the faults that come next, without fetching them, and switches a process
//! to another *arm* when that arm would have saved more of its misses than the followed one.
//!
//! Owns, per process (a [`SlotTable`] slot): which arm is followed, the scores of the current
//! window, the hysteresis state, and one small direct-mapped filter per arm of the pages it
//! proposed that the followed arm did not fetch, plus one of the pages made resident lately
//! (demand-fetched or prefetched).
//!
//! Scoring (as in Sandbox Prefetching, Pugsley et al., HPCA 2014, on the miss stream): with
//! injected hits only faults are visible, so an arm is credited with a *save* when the process
//! faults on a page that arm proposed and the followed arm did not fetch: a miss it would have
//! avoided. Every window of [`WINDOW`] faults the best other arm is a candidate when its saves
//! reach [`GAIN_MIN_PER_WINDOW`] and its estimated waste (its exclusive proposals never faulted
//! on, over what it would have fetched) is at most [`MAX_SHADOW_WASTE`]; a candidate in
//! [`STREAK`] consecutive windows is followed on *trial*.
//!
//! What the followed arm saves is invisible (its pages are injected), and so is the waste it
//! causes, except as faults. A trial is therefore judged by the process's fault rate, a bandit's
//! measure that counts both: a window is a fixed number of faults, so its length in time is the
//! inverse of the rate (in a trace replay, time is the record index: accesses per fault). A
//! trial goes on while its windows are at least [`TRIAL_MARGIN`] longer than the longer of the
//! last two windows of the arm left behind; otherwise the process goes back, and the trial's
//! arm waits a cool-down that doubles with every failed trial ([`MAX_BACKOFF`] windows at
//! most). After [`LEASE`] windows the process goes back in any case, to measure the arm it
//! left again under the program's current phase.
//!
//! Cost per decision: one slot lookup, one filter probe per arm and one filter write per
//! proposed page; nothing is allocated after construction and no lock is taken.

use crate::slots::SlotTable;
use crate::{Nanos, PageNo, ProcessKey};

/// Arms a process can follow. Arm [`HOME`] is `leap+stream`'s own decision.
pub const ARMS: usize = 2;
/// The arm every process starts with.
pub const HOME: usize = 0;
/// Faults per scoring window.
pub const WINDOW: u32 = 64;
/// Saves (misses another arm would have avoided) per window that make it a candidate: 1 in 8
/// of the window's faults.
pub const GAIN_MIN_PER_WINDOW: u32 = WINDOW / 8;
/// Largest estimated waste of a candidate (exclusive proposals never faulted on, over the pages
/// it would have fetched).
pub const MAX_SHADOW_WASTE: f64 = 0.10;
/// Consecutive candidate windows before a switch.
pub const STREAK: u8 = 2;
/// How much longer in time (fewer faults per unit of time) a trial's windows must be than the
/// longer of the last two windows of the arm left behind for the trial to go on: 10%.
pub const TRIAL_MARGIN: f64 = 0.10;
/// Windows a trial lasts at most before the process goes back to measure the arm it left.
pub const LEASE: u32 = 8;
/// Longest cool-down, in windows, of an arm whose trial failed.
pub const MAX_BACKOFF: u32 = 64;
/// Filter entries per arm and process (direct-mapped by page number, so a run of pages never
/// collides with itself).
pub const FILTER: usize = 512;
/// Filters per process: one per arm, then the resident filter.
const FILTERS: usize = ARMS + 1;
const RESIDENT: usize = ARMS;

/// Per-process scoring state.
#[derive(Clone, Copy, Debug, Default)]
struct Proc {
    /// The arm followed.
    active: u8,
    /// The arm followed before the current trial, with the length in time of its last window
    /// (`None` when no trial is under way).
    trial: Option<(u8, Nanos, u32)>,
    /// When the current window began.
    start: Nanos,
    /// Length in time of the previous window.
    last_span: Nanos,
    /// Faults in the current window.
    faults: u32,
    /// Misses each arm would have avoided, this window.
    saves: [u32; ARMS],
    /// Exclusive proposals each arm made, this window.
    proposed: [u32; ARMS],
    /// Consecutive windows each arm was the candidate.
    streak: [u8; ARMS],
    /// Windows each arm must wait before its next trial.
    cooldown: [u32; ARMS],
    /// Cool-down after the next failed trial of each arm.
    backoff: [u32; ARMS],
}

impl Proc {
    fn fresh() -> Self {
        Self {
            active: HOME as u8,
            backoff: [1; ARMS],
            ..Self::default()
        }
    }
}

/// Per-process arm choice by sandboxed scoring (see the module documentation).
#[derive(Debug)]
pub struct Sandbox {
    slots: SlotTable,
    procs: Box<[Proc]>,
    /// `[slot][filter][FILTER]`: `page + 1`, 0 = empty.
    filters: Box<[u64]>,
    /// Processes switched away from [`HOME`] at least once (for reports and tests).
    switches: u64,
}

impl Sandbox {
    /// A sandbox for `slots` processes (LRU-replaced beyond that).
    pub fn new(slots: usize) -> Self {
        let slots = SlotTable::new(slots);
        let n = slots.capacity();
        Self {
            procs: vec![Proc::fresh(); n].into_boxed_slice(),
            filters: vec![0; n * FILTERS * FILTER].into_boxed_slice(),
            slots,
            switches: 0,
        }
    }

    /// How many switches of the followed arm have happened (trials and returns).
    pub fn switches(&self) -> u64 {
        self.switches
    }

    /// The arm `key` follows now ([`HOME`] for a process without state).
    pub fn active(&self, key: ProcessKey) -> usize {
        self.slots
            .find(key)
            .map_or(HOME, |s| usize::from(self.procs[s].active))
    }

    fn filter(&mut self, slot: usize, f: usize) -> &mut [u64] {
        let base = (slot * FILTERS + f) * FILTER;
        &mut self.filters[base..base + FILTER]
    }

    /// A demand fault of `key` on `page` at `now`: credits the arms that proposed it, closes
    /// the window if it is full, and returns `(slot, arm to follow for this fault)`.
    pub fn on_fault(&mut self, key: ProcessKey, page: PageNo, now: Nanos) -> (usize, usize) {
        let s = self.slots.acquire(key);
        let slot = s.index;
        if s.fresh {
            self.procs[slot] = Proc::fresh();
            self.procs[slot].start = now;
            self.filters[slot * FILTERS * FILTER..(slot + 1) * FILTERS * FILTER].fill(0);
        }
        let tag = page.wrapping_add(1);
        let idx = (page % FILTER as u64) as usize;
        let active = usize::from(self.procs[slot].active);
        for arm in 0..ARMS {
            if arm == active {
                continue;
            }
            let f = self.filter(slot, arm);
            if f[idx] == tag {
                f[idx] = 0;
                self.procs[slot].saves[arm] += 1;
            }
        }
        self.filter(slot, RESIDENT)[idx] = tag;
        // This fault follows from the window's decisions (its save counted there); it closes a
        // full window, and the arm chosen then decides it.
        if self.procs[slot].faults >= WINDOW && self.close_window(slot, now) {
            self.switches += 1;
        }
        self.procs[slot].faults += 1;
        (slot, usize::from(self.procs[slot].active))
    }

    /// Pages the followed arm had fetched for the process in `slot`.
    pub fn fetched(&mut self, slot: usize, pages: &[PageNo]) {
        let f = self.filter(slot, RESIDENT);
        for &p in pages {
            f[(p % FILTER as u64) as usize] = p.wrapping_add(1);
        }
    }

    /// Pages `arm` (not followed) proposed for the process in `slot`: those not resident lately
    /// are remembered as its exclusive proposals.
    pub fn proposed(&mut self, slot: usize, arm: usize, pages: &[PageNo]) {
        let base = slot * FILTERS * FILTER;
        let resident = base + RESIDENT * FILTER;
        let own = base + arm * FILTER;
        let mut exclusive = 0;
        for &p in pages {
            let idx = (p % FILTER as u64) as usize;
            let tag = p.wrapping_add(1);
            if self.filters[resident + idx] != tag && self.filters[own + idx] != tag {
                self.filters[own + idx] = tag;
                exclusive += 1;
            }
        }
        self.procs[slot].proposed[arm] += exclusive;
    }

    /// Ends the window of `slot`: judges a trial, picks a candidate, resets the counts.
    /// Returns whether the followed arm changed.
    fn close_window(&mut self, slot: usize, now: Nanos) -> bool {
        let p = &mut self.procs[slot];
        let span = now.saturating_sub(p.start);
        let active = usize::from(p.active);
        let mut switched = false;
        for c in p.cooldown.iter_mut() {
            *c = c.saturating_sub(1);
        }
        if let Some((prev, before, left)) = p.trial {
            let prev = usize::from(prev);
            // Fewer faults per unit of time (a longer window) than the arm left behind had, or
            // back; back anyway when the lease runs out, to measure that arm again.
            if (span as f64) < (before as f64) * (1.0 + TRIAL_MARGIN) {
                p.cooldown[active] = p.backoff[active];
                p.backoff[active] = (p.backoff[active] * 2).min(MAX_BACKOFF);
                p.active = prev as u8;
                p.trial = None;
                switched = true;
            } else if left <= 1 {
                p.backoff[active] = 1;
                p.active = prev as u8;
                p.trial = None;
                switched = true;
            } else {
                p.trial = Some((prev as u8, before, left - 1));
            }
            p.streak = [0; ARMS];
        } else {
            let mut best: Option<(usize, u32)> = None;
            for arm in 0..ARMS {
                if arm == active {
                    continue;
                }
                let (saves, proposed) = (p.saves[arm], p.proposed[arm]);
                let unused = proposed.saturating_sub(saves);
                let waste = f64::from(unused) / f64::from(p.faults + proposed);
                let candidate = saves >= GAIN_MIN_PER_WINDOW
                    && waste <= MAX_SHADOW_WASTE
                    && p.cooldown[arm] == 0;
                if candidate && best.is_none_or(|(_, g)| saves > g) {
                    best = Some((arm, saves));
                }
            }
            for arm in 0..ARMS {
                if best.is_some_and(|(b, _)| b == arm) {
                    p.streak[arm] = p.streak[arm].saturating_add(1);
                } else {
                    p.streak[arm] = 0;
                }
            }
            if let Some((arm, _)) = best {
                if p.streak[arm] >= STREAK {
                    p.trial = Some((active as u8, span.max(p.last_span), LEASE));
                    p.active = arm as u8;
                    p.streak = [0; ARMS];
                    switched = true;
                }
            }
        }
        p.faults = 0;
        p.start = now;
        p.last_span = span;
        p.saves = [0; ARMS];
        p.proposed = [0; ARMS];
        switched
    }

    /// The process is gone.
    pub fn forget(&mut self, key: ProcessKey) {
        if let Some(slot) = self.slots.remove(key) {
            self.procs[slot] = Proc::fresh();
        }
    }

    /// The slot of `key`, if it has one.
    pub fn slot(&self, key: ProcessKey) -> Option<usize> {
        self.slots.find(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drives one process that faults on every other page. The home arm proposes nothing
    /// useful; arm 1 proposes the next fault. `faster` is how many time units pass per fault
    /// while arm 1 is followed (1 while home is): above 1, following arm 1 lowers the fault rate.
    fn drive(windows: u64, faster: u64) -> Vec<usize> {
        let mut s = Sandbox::new(4);
        let mut followed = Vec::new();
        let mut now = 0;
        for i in 0..(WINDOW as u64 * windows) {
            let page = 1000 + 2 * i;
            let (slot, arm) = s.on_fault(7, page, now);
            followed.push(arm);
            if arm == HOME {
                s.fetched(slot, &[1 << 40 | i]);
                s.proposed(slot, 1, &[page + 2]);
                now += 1;
            } else {
                s.fetched(slot, &[page + 2]);
                s.proposed(slot, HOME, &[1 << 40 | i]);
                now += faster;
            }
        }
        followed
    }

    fn first_window_of(followed: &[usize], arm: usize, from: usize) -> Option<usize> {
        let w = WINDOW as usize;
        followed[from * w..]
            .iter()
            .position(|&a| a == arm)
            .map(|i| (from * w + i) / w)
    }

    #[test]
    fn an_arm_that_lowers_the_fault_rate_is_followed_for_its_lease() {
        let f = drive(30, 2);
        let w = WINDOW as usize;
        let streak = usize::from(STREAK);
        let lease = LEASE as usize;
        assert_eq!(
            first_window_of(&f, 1, 0),
            Some(streak),
            "after STREAK windows"
        );
        assert!(f[streak * w..(streak + lease) * w].iter().all(|&a| a == 1));
        // Back home to measure it again, then on trial again after STREAK windows.
        assert_eq!(f[(streak + lease) * w], HOME);
        assert_eq!(
            first_window_of(&f, 1, streak + lease),
            Some(2 * streak + lease)
        );
    }

    #[test]
    fn a_trial_without_fewer_faults_goes_back_and_backs_off() {
        let f = drive(12, 1);
        // Windows 0, 1 home (a candidate twice), 2 trial; no lower fault rate: home at 3,
        // cool-down 1 window (3), candidate at 3 and 4, trial at 5; cool-down 2 (6, 7),
        // candidate at 7 and 8, trial at 9.
        assert_eq!(first_window_of(&f, 1, 0), Some(2));
        assert_eq!(first_window_of(&f, HOME, 2), Some(3));
        assert_eq!(first_window_of(&f, 1, 3), Some(5));
        assert_eq!(first_window_of(&f, HOME, 5), Some(6));
        assert_eq!(first_window_of(&f, 1, 6), Some(9));
    }

    /// An arm whose proposals are mostly never used is not followed, however many misses it
    /// would save.
    #[test]
    fn a_wasteful_arm_is_not_followed() {
        let mut s = Sandbox::new(4);
        for i in 0..(WINDOW as u64 * 8) {
            let page = 1000 + 2 * i;
            let (slot, arm) = s.on_fault(7, page, i);
            assert_eq!(arm, HOME);
            let junk: [u64; 8] = std::array::from_fn(|k| 1 << 40 | (i * 8 + k as u64));
            s.proposed(slot, 1, &junk);
            s.proposed(slot, 1, &[page + 2]);
        }
        assert_eq!(s.switches(), 0);
    }

    /// Pages made resident lately are no exclusive proposals, so no saves either.
    #[test]
    fn proposals_of_resident_pages_are_not_scored() {
        let mut s = Sandbox::new(4);
        let (slot, _) = s.on_fault(7, 10, 0);
        s.fetched(slot, &[11]);
        s.proposed(slot, 1, &[10, 11, 12]);
        assert_eq!(s.procs[slot].proposed[1], 1, "only 12 is exclusive");
        s.on_fault(7, 12, 1);
        assert_eq!(s.procs[slot].saves[1], 1);
        s.on_fault(7, 12, 2);
        assert_eq!(s.procs[slot].saves[1], 1, "a save is counted once");
    }

    #[test]
    fn forgetting_a_process_resets_it() {
        let mut s = Sandbox::new(1);
        let (slot, _) = s.on_fault(1, 10, 0);
        s.proposed(slot, 1, &[11]);
        s.forget(1);
        assert_eq!(s.slot(1), None);
        assert_eq!(s.active(1), HOME);
        // Another key takes the slot with clean filters: page 11 is no save for it.
        let (slot2, _) = s.on_fault(2, 11, 1);
        assert_eq!(slot2, slot);
        assert_eq!(s.procs[slot2].saves, [0; ARMS]);
    }
}
