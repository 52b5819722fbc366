//! Run-ahead: the page after a fault nobody answered, as a marker, and a short run past every
//! such marker the process uses, with the source's own hit rate gating it.
//!
//! Programs filling fresh memory in key order (an allocator's runs, a hash table, an
//! interpreter's object pools) fault again and again on the page just after one they faulted on
//! a little earlier, with no stride and too far apart in time for the stream table or region
//! read-around to see (`docs/prefetch-real-traces.md`: on the numpy/redis mix, 354 of the 757
//! first touches `leap+stream` missed and next-N did not were one page after one of the
//! process's last 64 misses, 255 more 2 to 8 pages after). Next-N catches them by reading N
//! pages after every miss, at a high waste. Run-ahead reads one page,
//! as a *marker*: only when the process uses it does the source learn it was right, and only
//! then does it read further: the next [`RUN`] pages, the last of them again a marker. A
//! run of first touches is followed a few pages at a time, and a fault next to an unused
//! neighbour costs one page. A chain that keeps being used grows its runs like the stream
//! table's depth budget, by one page per [`USED_PER_PAGE`] pages it has reached, up to
//! [`MAX_RUN`] with the marker in the middle, so a long scan costs about as many marker faults
//! as a stream's windows.
//!
//! Feedback per process: every used marker scores [`CREDIT`], every marker that leaves the
//! process's ring of [`RING`] outstanding ones unused −1 (score clamped to ±[`SCORE_MAX`]).
//! While the score is negative (fewer than one marker in [`CREDIT`] + 1 used) only one fault
//! in [`PROBE`] gets its page, each unused probe doubling the interval up to [`MAX_INTERVAL`],
//! so the source keeps measuring and reopens when the pattern comes back (Leap's adaptive
//! window is the precedent). On uniformly random faults it closes at once and stays closed.
//!
//! Its markers' hits are not reported to the stream table or Leap: run-ahead follows runs a
//! few pages at a time, and streams confirmed on those hits issued windows past the runs' ends
//! (measured, same document).
//!
//! Per-process state lives in a fixed [`SlotTable`]; nothing allocates after construction, and
//! a decision costs a slot lookup and at most [`RING`] compares.

use crate::slots::SlotTable;
use crate::{Candidates, PageNo, ProcessKey};

/// Outstanding markers remembered per process.
pub const RING: usize = 8;
/// Pages read past a used marker (the last one is the next marker).
pub const RUN: u64 = 3;
/// Longest run, in pages.
pub const MAX_RUN: u64 = 64;
/// A run grows by one page per this many pages its chain has used (rounded down to a power of
/// two), as the stream table's depth budget.
pub const USED_PER_PAGE: u64 = 64;
/// Score a used marker earns.
pub const CREDIT: i32 = 4;
/// Bound of the score.
pub const SCORE_MAX: i32 = 16;
/// While the gate is closed, one fault in this many still gets its page (the probe); every
/// probe that goes unused doubles the interval, up to [`MAX_INTERVAL`].
pub const PROBE: u32 = 8;
/// Longest interval between probes.
pub const MAX_INTERVAL: u32 = 1024;

#[derive(Clone, Copy, Debug)]
struct State {
    /// Outstanding markers (`PageNo::MAX` = none).
    ring: [PageNo; RING],
    /// The last page fetched with each marker.
    front: [PageNo; RING],
    /// Pages the run each marker belongs to has used so far.
    used: [u32; RING],
    next: usize,
    score: i32,
    skipped: u32,
    /// Faults between probes while the gate is closed.
    interval: u32,
}

impl Default for State {
    fn default() -> Self {
        Self {
            ring: [PageNo::MAX; RING],
            front: [0; RING],
            used: [0; RING],
            next: 0,
            score: 0,
            skipped: 0,
            interval: PROBE,
        }
    }
}

/// The run-ahead component (used inside `leap+stream`).
pub struct RunAhead {
    slots: SlotTable,
    states: Box<[State]>,
}

impl RunAhead {
    /// State for up to `slots` processes (at least 1), LRU-replaced.
    pub fn new(slots: usize) -> Self {
        let n = slots.max(1);
        Self {
            slots: SlotTable::new(n),
            states: vec![State::default(); n].into_boxed_slice(),
        }
    }

    /// Remembers `marker` as outstanding; the one it replaces in the ring was never used.
    fn issue(st: &mut State, marker: PageNo, front: PageNo, used: u32) {
        if st.ring[st.next] != PageNo::MAX {
            st.score = (st.score - 1).max(-SCORE_MAX);
            if st.score < 0 {
                st.interval = (st.interval * 2).min(MAX_INTERVAL);
            }
        }
        st.ring[st.next] = marker;
        st.front[st.next] = front;
        st.used[st.next] = used;
        st.next = (st.next + 1) % RING;
    }

    /// A demand fault of `key` on `page` that no other component answered (`decide`): reads
    /// the next page as a marker unless the gate is closed. Only called for such faults.
    pub fn on_fault(&mut self, key: ProcessKey, page: PageNo, out: &mut Candidates) {
        let slot = self.slots.acquire(key);
        if slot.fresh {
            self.states[slot.index] = State::default();
        }
        let st = &mut self.states[slot.index];
        if st.score < 0 {
            st.skipped += 1;
            if st.skipped < st.interval {
                return;
            }
            st.skipped = 0;
        }
        let Some(next) = page.checked_add(1).filter(|&p| p != PageNo::MAX) else {
            return;
        };
        if out.push_marker(next) {
            Self::issue(st, next, next, 1);
        }
    }

    /// The first use of a marker page of `key`: returns whether it was one of run-ahead's,
    /// and if so proposes the next run in `out` (cleared first).
    pub fn marker_hit(&mut self, key: ProcessKey, page: PageNo, out: &mut Candidates) -> bool {
        let Some(s) = self.slots.find(key) else {
            return false;
        };
        let st = &mut self.states[s];
        let Some(i) = st.ring.iter().position(|&m| m == page) else {
            return false;
        };
        st.ring[i] = PageNo::MAX;
        st.score = (st.score + CREDIT).min(SCORE_MAX);
        st.interval = PROBE;
        out.clear();
        let front = st.front[i].max(page);
        let used = st.used[i]
            .saturating_add(u32::try_from(front - page).unwrap_or(u32::MAX))
            .saturating_add(1);
        let earned = u64::from(used) / USED_PER_PAGE;
        let run = if earned < 2 * RUN {
            RUN
        } else {
            (1u64 << earned.ilog2()).min(MAX_RUN)
        };
        let first = front.saturating_add(1);
        let last = front.saturating_add(run).min(PageNo::MAX - 1);
        if last < first {
            return true;
        }
        let n = (last - first + 1) as usize;
        let m = if run > RUN {
            first + (last - first) / 2
        } else {
            last
        };
        out.push_progression(first, 1, n);
        if let Some(k) = out.as_slice().iter().position(|&p| p == m) {
            out.set_marker(k);
            Self::issue(
                st,
                m,
                last,
                used.saturating_add(u32::try_from(m - front).unwrap_or(u32::MAX)),
            );
        }
        true
    }

    /// The run-ahead score of `key`, if it has state (for tests and diagnostics).
    pub fn score(&self, key: ProcessKey) -> Option<i32> {
        self.slots.find(key).map(|s| self.states[s].score)
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
    fn a_used_marker_reads_a_short_run_and_the_next_marker() {
        let mut r = RunAhead::new(4);
        let mut out = Candidates::new();
        r.on_fault(1, 100, &mut out);
        assert_eq!(out.iter().collect::<Vec<_>>(), [(101, true)]);
        let mut more = Candidates::new();
        assert!(!r.marker_hit(2, 101, &mut more), "another process's page");
        assert!(r.marker_hit(1, 101, &mut more));
        assert_eq!(
            more.iter().collect::<Vec<_>>(),
            [(102, false), (103, false), (104, true)]
        );
        assert_eq!(r.score(1), Some(CREDIT));
        assert!(!r.marker_hit(1, 101, &mut more), "a marker is used once");
    }

    #[test]
    fn unused_markers_close_the_gate_and_probes_reopen_it() {
        let mut r = RunAhead::new(4);
        let mut out = Candidates::new();
        let mut issued = 0;
        for i in 0..20_000u64 {
            out.clear();
            r.on_fault(1, 1000 * i, &mut out);
            issued += out.len();
        }
        assert!(r.score(1).unwrap() < 0);
        assert!(
            issued < 100,
            "random faults: {issued} markers for 20,000 faults"
        );
        // The pattern comes back: a probe finds its marker used and the gate reopens.
        let mut more = Candidates::new();
        let mut reopened_after = None;
        for i in 0..4_000u64 {
            out.clear();
            r.on_fault(1, 1_000_000 + 10 * i, &mut out);
            if let Some((m, true)) = out.iter().next() {
                assert!(r.marker_hit(1, m, &mut more));
            }
            if r.score(1).unwrap() >= 0 {
                reopened_after = Some(i);
                break;
            }
        }
        assert!(
            reopened_after.is_some_and(|i| i <= u64::from(MAX_INTERVAL)),
            "{reopened_after:?}"
        );
        out.clear();
        r.on_fault(1, 5_000_000, &mut out);
        assert_eq!(out.as_slice(), &[5_000_001], "open again");
    }

    #[test]
    fn a_chain_that_keeps_being_used_grows_to_stream_sized_runs() {
        let mut r = RunAhead::new(1);
        let mut out = Candidates::new();
        r.on_fault(1, 0, &mut out);
        let mut markers = 0;
        let mut fetched = 0;
        let mut marker = out.as_slice()[0];
        while marker < 100_000 {
            markers += 1;
            assert!(r.marker_hit(1, marker, &mut out));
            fetched = out.as_slice().iter().copied().max().unwrap();
            assert_eq!(out.as_slice()[0] + out.len() as u64 - 1, fetched, "one run");
            let (m, _) = out.iter().find(|&(_, is)| is).unwrap();
            marker = m;
        }
        assert_eq!(out.len() as u64, MAX_RUN);
        assert_eq!(
            marker,
            out.as_slice()[(MAX_RUN as usize - 1) / 2],
            "marker mid-run"
        );
        assert!(fetched >= 100_000);
        assert!(
            markers < 100_000 / MAX_RUN + 500,
            "{markers} marker faults for a 100,000-page scan"
        );
    }

    #[test]
    fn no_overflow_at_the_end_of_the_page_range() {
        let mut r = RunAhead::new(1);
        let mut out = Candidates::new();
        r.on_fault(1, PageNo::MAX - 1, &mut out);
        assert!(out.is_empty(), "PageNo::MAX is the ring's empty mark");
        r.on_fault(1, PageNo::MAX - 3, &mut out);
        assert_eq!(out.as_slice(), &[PageNo::MAX - 2]);
        let mut more = Candidates::new();
        assert!(r.marker_hit(1, PageNo::MAX - 2, &mut more));
        assert!(more.len() <= 1, "{more:?}");
        r.forget(1);
        assert_eq!(r.score(1), None);
    }
}
