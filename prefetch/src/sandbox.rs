//! The sandbox that lets each process's own history choose how widely `leap+stream` fetches
//! ([`crate::composite`]): its own decision alone (the *home* arm), or its own decision plus
//! the pages `next-n` proposes (the *wide* arm). It scores `next-n`'s proposals against the
//! faults that follow, without fetching them, and widens a process when they would have saved
//! misses at little waste; while a process is wide, markers on a sample of the added pages
//! measure what they are really worth, and the process goes back when they are wasted.
//!
//! Owns, per process (a [`SlotTable`] slot): the arm followed, the decayed scores, the
//! hysteresis state, a direct-mapped filter of `next-n`'s exclusive proposals, one of the pages
//! made resident lately (demand-fetched or prefetched), and a table of the trial's markers.
//!
//! Why a union and not a switch: a save is a fault on a page `next-n` proposed and the home arm
//! had not fetched, so the score counts what `next-n` would add to the home arm, not what the
//! home arm's own prefetches save (invisible with injected hits). Following `next-n` alone
//! would give those up unseen; following both keeps them and adds what was scored.
//!
//! Scoring (as in Sandbox Prefetching, Pugsley et al., HPCA 2014, on the miss stream), in
//! sums that halve at the end of every window of [`WINDOW`] faults: saves; exclusive proposals
//! (not resident lately); those the home arm fetched later (*covered*: used or not, unknown);
//! and those forgotten unused (overwritten in the filter before the process faulted on them).
//! The filter holds [`FILTER`] pages per process, so a proposal is remembered for thousands of
//! faults: long enough to score a table filled in random order, whose neighbours are used long
//! after they were proposed. The wide arm is a candidate in a window when its saves reach
//! [`GAIN_MIN_PER_WINDOW`] per window and both estimates of its waste are at most
//! [`MAX_SHADOW_WASTE`]: unused over resolved (unused + saves), and the proposals neither saved
//! nor covered over the proposals not covered (the first lags when proposals are forgotten
//! late, the second when saves come late; each alone let wasteful programs widen). A candidate
//! in [`STREAK`] consecutive windows is followed on *trial*.
//!
//! A trial is judged twice at the end of every window, and the process goes back home (the
//! wide arm cools down for a number of windows that doubles with every failed trial, at most
//! [`MAX_BACKOFF`]) when either fails:
//! - *waste*: one added page in [`TRIAL_SAMPLE`] is a marker; a marker hit is a used page, a
//!   marker not hit within [`MARKER_HORIZON`] faults an unused one; once [`TRIAL_MIN_SAMPLES`]
//!   are resolved, more than [`MAX_TRIAL_WASTE`] unused ends the trial (a marker on a page
//!   already resident is never staged, so never hit: it counts unused, which errs towards
//!   going home);
//! - *fault rate*: a window is a fixed number of faults, so its length in time is the inverse
//!   of the rate (in a trace replay, time is the record index); the trial's windows must be
//!   at least [`TRIAL_MARGIN`] longer than the longer of the last two windows at home.
//!
//! After [`LEASE`] windows the process goes back in any case, to score `next-n` again under the
//! program's current phase.
//!
//! Cost per decision: one slot lookup, one filter probe per fault and one filter write per
//! proposed page (an aging scan of the marker table once per window on trial); nothing is
//! allocated after construction and no lock is taken.

use crate::slots::SlotTable;
use crate::{Candidates, Nanos, PageNo, ProcessKey};

/// The arm every process starts with: `leap+stream`'s own decision.
pub const HOME: usize = 0;
/// The home arm's decision plus `next-n`'s pages.
pub const WIDE: usize = 1;
/// Faults per scoring window.
pub const WINDOW: u32 = 64;
/// Saves (misses the wide arm would have avoided) per window that make it a candidate: 1 in
/// 8 of the window's faults.
pub const GAIN_MIN_PER_WINDOW: u32 = WINDOW / 8;
/// Largest estimated waste of `next-n`'s exclusive proposals for the wide arm to be a
/// candidate.
pub const MAX_SHADOW_WASTE: f64 = 0.10;
/// Consecutive candidate windows before a trial.
pub const STREAK: u8 = 3;
/// How much longer in time (fewer faults per unit of time) a trial's windows must be than the
/// longer of the last two windows at home for the trial to go on: 10%.
pub const TRIAL_MARGIN: f64 = 0.10;
/// Windows a trial lasts at most before the process goes back to score `next-n` again.
pub const LEASE: u32 = 8;
/// Longest cool-down, in windows, after a failed trial.
pub const MAX_BACKOFF: u32 = 64;
/// Filter entries per process (direct-mapped by page number, so a run of pages never collides
/// with itself).
pub const FILTER: usize = 4096;
/// Trial markers per process (direct-mapped by page number); one overwritten unhit counts as
/// unused.
pub const MARKS: usize = 256;
/// Faults after which a trial marker not hit counts as unused.
pub const MARKER_HORIZON: u32 = 256;
/// One page in this many that the wide arm adds is a marker.
pub const TRIAL_SAMPLE: u32 = 8;
/// Resolved trial markers needed before the trial's waste is judged.
pub const TRIAL_MIN_SAMPLES: u32 = 16;
/// Largest share of resolved trial markers unused for the trial to go on.
pub const MAX_TRIAL_WASTE: f64 = 0.10;
/// Filters per process: `next-n`'s exclusive proposals, then the pages resident lately.
const FILTERS: usize = 2;
const PROPOSED: usize = 0;
const RESIDENT: usize = 1;

/// Filter index and tag of a page (tag 0 = empty; pages 2^44 apart share a tag, which only
/// blurs a score).
#[inline]
fn entry(page: PageNo) -> (usize, u32) {
    let idx = (page % FILTER as u64) as usize;
    let tag = ((page / FILTER as u64) as u32).wrapping_add(1).max(1);
    (idx, tag)
}

/// Per-process scoring state.
#[derive(Clone, Copy, Debug, Default)]
struct Proc {
    /// The arm followed.
    active: u8,
    /// The current trial, if any: the length in time of the longer of the last two windows at
    /// home, and the windows left in its lease.
    trial: Option<(Nanos, u32)>,
    /// When the current window began.
    start: Nanos,
    /// Length in time of the previous window.
    last_span: Nanos,
    /// Faults in the current window.
    faults: u32,
    /// Faults since the process got its slot (the trial markers' clock).
    clock: u32,
    /// Decayed sums (halved every window) of `next-n`'s saves, exclusive proposals, covered
    /// and forgotten unused proposals.
    saves: u32,
    proposed: u32,
    covered: u32,
    unused: u32,
    /// Consecutive candidate windows.
    streak: u8,
    /// Windows to wait before the next trial.
    cooldown: u32,
    /// Cool-down after the next failed trial.
    backoff: u32,
    /// Trial markers hit, and aged out or overwritten unhit, since the trial began.
    marks_used: u32,
    marks_unused: u32,
    /// Pages the wide arm added (every [`TRIAL_SAMPLE`]-th becomes a marker).
    added: u32,
}

impl Proc {
    fn fresh() -> Self {
        Self {
            active: HOME as u8,
            backoff: 1,
            ..Self::default()
        }
    }
}

/// A trial marker outstanding: `page + 1` (0 = none) and the process's clock when issued.
#[derive(Clone, Copy, Debug, Default)]
struct Mark {
    tag: u64,
    issued: u32,
}

/// Per-process choice of how widely to fetch (see the module documentation).
#[derive(Debug)]
pub struct Sandbox {
    slots: SlotTable,
    procs: Box<[Proc]>,
    /// `[slot][filter][FILTER]`.
    filters: Box<[u32]>,
    /// `[slot][MARKS]`.
    marks: Box<[Mark]>,
    /// Switches of the followed arm (trials and returns), for reports and tests.
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
            marks: vec![Mark::default(); n * MARKS].into_boxed_slice(),
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

    fn filter(&mut self, slot: usize, f: usize) -> &mut [u32] {
        let base = (slot * FILTERS + f) * FILTER;
        &mut self.filters[base..base + FILTER]
    }

    /// A demand fault of `key` on `page` at `now`: credits `next-n` if it had proposed it,
    /// closes the window if it is full, and returns `(slot, arm to follow for this fault)`.
    pub fn on_fault(&mut self, key: ProcessKey, page: PageNo, now: Nanos) -> (usize, usize) {
        let s = self.slots.acquire(key);
        let slot = s.index;
        if s.fresh {
            self.procs[slot] = Proc::fresh();
            self.procs[slot].start = now;
            self.filters[slot * FILTERS * FILTER..(slot + 1) * FILTERS * FILTER].fill(0);
            self.marks[slot * MARKS..(slot + 1) * MARKS].fill(Mark::default());
        }
        let (idx, tag) = entry(page);
        let f = self.filter(slot, PROPOSED);
        if f[idx] == tag {
            f[idx] = 0;
            self.procs[slot].saves += 1;
        }
        self.filter(slot, RESIDENT)[idx] = tag;
        // This fault follows from the window's decisions (its save counted there); it closes a
        // full window, and the arm chosen then decides it.
        if self.procs[slot].faults >= WINDOW && self.close_window(slot, now) {
            self.switches += 1;
        }
        let p = &mut self.procs[slot];
        p.faults += 1;
        p.clock = p.clock.wrapping_add(1);
        (slot, usize::from(p.active))
    }

    /// Pages the followed arm fetched for the process in `slot`: a proposal of `next-n`
    /// among them is covered (whether it is used is not known).
    pub fn fetched(&mut self, slot: usize, pages: &[PageNo]) {
        let base = slot * FILTERS * FILTER;
        for &page in pages {
            let (idx, tag) = entry(page);
            self.filters[base + RESIDENT * FILTER + idx] = tag;
            let proposed = &mut self.filters[base + PROPOSED * FILTER + idx];
            if *proposed == tag {
                *proposed = 0;
                self.procs[slot].covered += 1;
            }
        }
    }

    /// Pages `next-n` proposed (not fetched) for the process in `slot`: those not resident
    /// lately are remembered as its exclusive proposals; one that overwrites an earlier
    /// proposal forgets that one unused.
    pub fn proposed(&mut self, slot: usize, pages: &[PageNo]) {
        let base = slot * FILTERS * FILTER;
        let (mut exclusive, mut unused) = (0, 0);
        for &page in pages {
            let (idx, tag) = entry(page);
            let old = self.filters[base + PROPOSED * FILTER + idx];
            if self.filters[base + RESIDENT * FILTER + idx] != tag && old != tag {
                unused += u32::from(old != 0);
                self.filters[base + PROPOSED * FILTER + idx] = tag;
                exclusive += 1;
            }
        }
        let p = &mut self.procs[slot];
        p.proposed += exclusive;
        p.unused += unused;
    }

    /// The wide arm added `out[from..]` to the home arm's pages for the process in `slot`:
    /// every [`TRIAL_SAMPLE`]-th of them becomes a marker.
    pub fn mark_added(&mut self, slot: usize, out: &mut Candidates, from: usize) {
        for i in from..out.len() {
            let p = &mut self.procs[slot];
            p.added = p.added.wrapping_add(1);
            if !p.added.is_multiple_of(TRIAL_SAMPLE) {
                continue;
            }
            let page = out.as_slice()[i];
            let m = &mut self.marks[slot * MARKS + (page % MARKS as u64) as usize];
            p.marks_unused += u32::from(m.tag != 0);
            *m = Mark {
                tag: page.wrapping_add(1),
                issued: p.clock,
            };
            out.set_marker(i);
        }
    }

    /// A marker hit of `key` on `page`: whether it was one of the trial's markers (then it is
    /// counted as used, and no other component owns it).
    pub fn marker_hit(&mut self, key: ProcessKey, page: PageNo) -> bool {
        let Some(slot) = self.slots.find(key) else {
            return false;
        };
        let m = &mut self.marks[slot * MARKS + (page % MARKS as u64) as usize];
        if m.tag != page.wrapping_add(1) {
            return false;
        }
        m.tag = 0;
        self.procs[slot].marks_used += 1;
        true
    }

    /// Trial markers of `slot` not hit within [`MARKER_HORIZON`] faults are unused.
    fn age_marks(&mut self, slot: usize) {
        let p = &mut self.procs[slot];
        for m in &mut self.marks[slot * MARKS..(slot + 1) * MARKS] {
            if m.tag != 0 && p.clock.wrapping_sub(m.issued) > MARKER_HORIZON {
                m.tag = 0;
                p.marks_unused += 1;
            }
        }
    }

    /// Ends the window of `slot`: judges a trial or scores `next-n`, and decays the sums.
    /// Returns whether the followed arm changed.
    fn close_window(&mut self, slot: usize, now: Nanos) -> bool {
        if self.procs[slot].trial.is_some() {
            self.age_marks(slot);
        }
        let p = &mut self.procs[slot];
        let span = now.saturating_sub(p.start);
        let mut switched = false;
        p.cooldown = p.cooldown.saturating_sub(1);
        if let Some((before, left)) = p.trial {
            let resolved = p.marks_used + p.marks_unused;
            let wasteful = resolved >= TRIAL_MIN_SAMPLES
                && f64::from(p.marks_unused) > MAX_TRIAL_WASTE * f64::from(resolved);
            let slower = (span as f64) < (before as f64) * (1.0 + TRIAL_MARGIN);
            if wasteful || slower {
                p.cooldown = p.backoff;
                p.backoff = (p.backoff * 2).min(MAX_BACKOFF);
                p.trial = None;
            } else if left <= 1 {
                p.backoff = 1;
                p.trial = None;
            } else {
                p.trial = Some((before, left - 1));
            }
            if p.trial.is_none() {
                p.active = HOME as u8;
                switched = true;
                self.marks[slot * MARKS..(slot + 1) * MARKS].fill(Mark::default());
            }
        } else {
            let resolved = p.unused + p.saves;
            let by_resolved = f64::from(p.unused) / f64::from(resolved.max(1));
            let open = p.proposed.saturating_sub(p.covered);
            let by_volume = f64::from(open.saturating_sub(p.saves)) / f64::from(open.max(1));
            // The sums halve every window: twice a window's worth in steady state.
            let candidate = p.saves / 2 >= GAIN_MIN_PER_WINDOW
                && by_resolved <= MAX_SHADOW_WASTE
                && by_volume <= MAX_SHADOW_WASTE
                && p.cooldown == 0;
            p.streak = if candidate { p.streak + 1 } else { 0 };
            if p.streak >= STREAK {
                p.trial = Some((span.max(p.last_span), LEASE));
                p.active = WIDE as u8;
                p.streak = 0;
                p.marks_used = 0;
                p.marks_unused = 0;
                switched = true;
            }
        }
        p.faults = 0;
        p.start = now;
        p.last_span = span;
        p.saves /= 2;
        p.proposed /= 2;
        p.covered /= 2;
        p.unused /= 2;
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

    /// One process faulting on every other page: `next-n` proposes the next fault, the home
    /// arm something useless. `faster` is how many time units pass per fault while wide (1 at
    /// home): above 1, widening lowers the fault rate. `used` says whether the pages the wide
    /// arm adds are used (their markers hit).
    fn drive(windows: u64, faster: u64, used: bool) -> Vec<usize> {
        let mut s = Sandbox::new(4);
        let mut followed = Vec::new();
        let mut now = 0;
        let mut out = Candidates::new();
        for i in 0..(WINDOW as u64 * windows) {
            let page = 1000 + 2 * i;
            let (slot, arm) = s.on_fault(7, page, now);
            followed.push(arm);
            out.clear();
            out.push(1 << 40 | i);
            if arm == HOME {
                s.fetched(slot, out.as_slice());
                s.proposed(slot, &[page + 2]);
                now += 1;
            } else {
                out.push(page + 2);
                s.mark_added(slot, &mut out, 1);
                s.fetched(slot, out.as_slice());
                if used && out.is_marker(1) {
                    assert!(s.marker_hit(7, page + 2));
                }
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
    fn a_useful_widening_is_followed_for_its_lease() {
        let f = drive(40, 2, true);
        let w = WINDOW as usize;
        // The sums need a window to reach the gain; then STREAK candidate windows.
        let start = first_window_of(&f, WIDE, 0).expect("widened");
        assert!(
            start <= usize::from(STREAK) + 1,
            "widened at window {start}"
        );
        let lease = LEASE as usize;
        assert!(f[start * w..(start + lease) * w].iter().all(|&a| a == WIDE));
        // Home to score `next-n` again, then wide again.
        assert_eq!(f[(start + lease) * w], HOME);
        assert!(first_window_of(&f, WIDE, start + lease).is_some());
    }

    #[test]
    fn a_widening_without_fewer_faults_goes_back_and_backs_off() {
        let f = drive(20, 1, true);
        let first = first_window_of(&f, WIDE, 0).expect("widened on trial");
        let back = first_window_of(&f, HOME, first).unwrap();
        assert_eq!(back, first + 1, "one window on trial");
        let second = first_window_of(&f, WIDE, back).expect("tried again");
        let back2 = first_window_of(&f, HOME, second).unwrap();
        let third = first_window_of(&f, WIDE, back2).expect("and again");
        assert!(
            third - back2 > second - back,
            "the cool-down grows: {back}..{second}, {back2}..{third}"
        );
    }

    #[test]
    fn a_widening_whose_added_pages_go_unused_ends() {
        let f = drive(40, 2, false);
        let first = first_window_of(&f, WIDE, 0).expect("widened on trial");
        let back = first_window_of(&f, HOME, first).unwrap();
        assert!(
            back - first < LEASE as usize,
            "unused markers end the trial before its lease: {first}..{back}"
        );
    }

    /// Proposals never faulted on are forgotten unused when later ones take their entries:
    /// `next-n` is not followed, however many misses it would save.
    #[test]
    fn a_wasteful_next_n_is_not_followed() {
        let mut s = Sandbox::new(4);
        for i in 0..(WINDOW as u64 * 8) {
            let page = 1000 + 2 * i;
            let (slot, arm) = s.on_fault(7, page, i);
            assert_eq!(arm, HOME);
            let junk: [u64; 8] = std::array::from_fn(|k| (1 << 40) + i * 8 + k as u64);
            s.proposed(slot, &junk);
            s.proposed(slot, &[page + 2]);
        }
        assert_eq!(s.switches(), 0);
    }

    /// Pages made resident lately are no exclusive proposals, so no saves either.
    #[test]
    fn proposals_of_resident_pages_are_not_scored() {
        let mut s = Sandbox::new(4);
        let (slot, _) = s.on_fault(7, 10, 0);
        s.fetched(slot, &[11]);
        s.proposed(slot, &[10, 11, 12]);
        assert_eq!(s.procs[slot].proposed, 1, "only 12 is exclusive");
        s.on_fault(7, 12, 1);
        assert_eq!(s.procs[slot].saves, 1);
        s.on_fault(7, 12, 2);
        assert_eq!(s.procs[slot].saves, 1, "a save is counted once");
        s.proposed(slot, &[13]);
        s.fetched(slot, &[13]);
        assert_eq!(s.procs[slot].covered, 1, "fetched by the home arm later");
    }

    #[test]
    fn forgetting_a_process_resets_it() {
        let mut s = Sandbox::new(1);
        let (slot, _) = s.on_fault(1, 10, 0);
        s.proposed(slot, &[11]);
        s.forget(1);
        assert_eq!(s.slot(1), None);
        assert_eq!(s.active(1), HOME);
        // Another key takes the slot with clean filters: page 11 is no save for it.
        let (slot2, _) = s.on_fault(2, 11, 1);
        assert_eq!(slot2, slot);
        assert_eq!(s.procs[slot2].saves, 0);
    }
}
