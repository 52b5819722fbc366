//! Leap's prefetcher (Al Maruf & Chowdhury, USENIX ATC'20, §3.2), as the paper prints it.
//!
//! - ACCESSHISTORY: a per-process FIFO ring of the last `H_size` deltas between consecutive
//!   accesses (the first access of a process logs Δ = 0, as in the paper's example).
//! - FINDTREND (Alg. 1): Boyer–Moore majority over the newest `w = H_size / N_split` deltas,
//!   doubling `w` until a majority (≥ ⌊w/2⌋+1 occurrences) is found or `w > H_size`. The window
//!   holds exactly `w` entries (the printed `H_head-w-1` is off by two); while the history is
//!   still filling it holds what there is, but the threshold stays ⌊w/2⌋+1.
//! - GETPREFETCHWINDOWSIZE (Alg. 2): with `C_hit` = prefetch hits since the last sizing, no
//!   hits → 1 page if this access follows the current trend, else 0 (suspend); hits →
//!   roundup_pow2(C_hit+1) capped at `PW_max`, never below half the previous window; `C_hit`
//!   and the previous window are updated only in that branch (the printed indentation).
//! - DOPREFETCH: `PW` pages along the trend; with no trend but `PW > 0`, `PW` pages *around*
//!   the access along the last trend found (speculative): +Δ, −Δ, +2Δ, −2Δ, ...
//!
//! What the history logs: every demand miss, and every prefetch hit the caller reports
//! (`on_hit`), because in Leap a swap-cache hit still goes through `do_swap_page()`, which logs
//! it. In `injected` mode a hit is invisible, so paper-exact Leap sees only misses and its
//! `C_hit` stays 0.
//!
//! farvm extension (off in `leap`, on inside `leap+stream`): *markers*. The last page of each
//! trend window is a marker; when the caller reports its first use, the pages of the window up
//! to it are taken as consumed: they are logged as trend deltas and counted in `C_hit`, exactly
//! what a visible-hit caller would have reported. This restores paper behaviour when hits are
//! otherwise invisible.

use crate::slots::SlotTable;
use crate::{Candidates, Nanos, PageNo, Prefetcher, ProcessKey};

/// Leap's tunables (defaults from §5 of the paper and its code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeapParams {
    /// ACCESSHISTORY length (default 32).
    pub h_size: usize,
    /// First FINDTREND window is `h_size / n_split` (default 4, as in Leap's code).
    pub n_split: usize,
    /// PW_max (default 8).
    pub pw_max: usize,
    /// Number of per-process state slots (LRU-replaced).
    pub slots: usize,
    /// One history per process key (`true`) or one global history (`false`).
    pub per_process: bool,
    /// Emit a marker as the last page of each trend window (farvm extension).
    pub markers: bool,
}

impl Default for LeapParams {
    fn default() -> Self {
        Self {
            h_size: 32,
            n_split: 4,
            pw_max: 8,
            slots: 64,
            per_process: true,
            markers: false,
        }
    }
}

/// FINDTREND(N_split) (Alg. 1) over `newest`, the valid history entries oldest first (so the
/// newest is last; at most H_size of them). Returns the majority delta, if any.
///
/// One Boyer–Moore pass from the newest entry backwards serves every window: its state after
/// `w` entries is a Boyer–Moore run over the newest-`w` window (the vote is order-insensitive),
/// so each doubling only extends the pass. Each window's candidate is then verified by counting
/// (≥ ⌊w/2⌋+1 occurrences); the result is the same as running Alg. 1 window by window.
pub fn find_trend(newest: &[i64], h_size: usize, n_split: usize) -> Option<i64> {
    let len = newest.len();
    let mut w = (h_size / n_split.max(1)).max(1);
    let (mut cand, mut count, mut done) = (0i64, 0usize, 0usize);
    loop {
        let upto = w.min(len);
        for &d in newest[len - upto..len - done].iter().rev() {
            if count == 0 {
                cand = d;
                count = 1;
            } else if d == cand {
                count += 1;
            } else {
                count -= 1;
            }
        }
        done = upto;
        if upto > 0 {
            let occurrences = newest[len - upto..].iter().filter(|&&d| d == cand).count();
            if occurrences > w / 2 {
                return Some(cand);
            }
        }
        w *= 2;
        if w > h_size {
            return None;
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct LeapState {
    head: usize,
    len: usize,
    last_page: PageNo,
    pw_prev: usize,
    c_hit: usize,
    /// Last non-zero trend found (for the speculative prefetch); 0 = none yet.
    last_trend: i64,
    /// Marker of the newest trend window: page, window start and trend.
    marker: Option<(PageNo, PageNo, i64)>,
}

/// Paper-exact Leap with per-process (or one global) history.
pub struct Leap {
    params: LeapParams,
    slots: SlotTable,
    states: Box<[LeapState]>,
    /// `slots × 2·h_size` deltas: each slot's ring is stored twice in a row (entry j at j and
    /// j + h_size), so its newest entries always form one contiguous slice.
    history: Box<[i64]>,
}

impl Leap {
    /// Builds the prefetcher; parameters are validated by [`crate::registry`].
    pub fn new(params: LeapParams) -> Self {
        let slots = params.slots.max(1);
        let h = params.h_size.max(1);
        Self {
            params,
            slots: SlotTable::new(slots),
            states: vec![LeapState::default(); slots].into_boxed_slice(),
            history: vec![0; slots * 2 * h].into_boxed_slice(),
        }
    }

    fn key(&self, key: ProcessKey) -> ProcessKey {
        if self.params.per_process {
            key
        } else {
            0
        }
    }

    /// The valid history of `slot`, oldest first.
    fn newest(&self, slot: usize) -> &[i64] {
        let h = self.params.h_size;
        let st = &self.states[slot];
        let base = slot * 2 * h;
        let end = base + st.head + h + 1;
        &self.history[end - st.len..end]
    }

    fn log(&mut self, slot: usize, page: PageNo) -> i64 {
        let h = self.params.h_size;
        let st = &mut self.states[slot];
        let delta = if st.len == 0 {
            0
        } else {
            page.wrapping_sub(st.last_page) as i64
        };
        st.head = (st.head + 1) % h;
        st.len = (st.len + 1).min(h);
        st.last_page = page;
        let base = slot * 2 * h;
        self.history[base + st.head] = delta;
        self.history[base + st.head + h] = delta;
        delta
    }

    /// Logs a fault handled by another policy (the stream table in `leap+stream`): the history
    /// stays complete, but no window is sized or issued.
    pub fn observe(&mut self, key: ProcessKey, page: PageNo) {
        let slot = self.slots.acquire(self.key(key));
        if slot.fresh {
            self.states[slot.index] = LeapState::default();
        }
        self.log(slot.index, page);
    }

    /// The current FINDTREND result for `key` (for tests and diagnostics).
    pub fn trend(&self, key: ProcessKey) -> Option<i64> {
        let slot = self.slots.find(self.key(key))?;
        find_trend(self.newest(slot), self.params.h_size, self.params.n_split)
    }

    /// The last prefetch window size chosen by a hit-driven sizing for `key`.
    pub fn previous_window(&self, key: ProcessKey) -> Option<usize> {
        self.slots
            .find(self.key(key))
            .map(|s| self.states[s].pw_prev)
    }

    /// The pages a marker hit on `page` credits as consumed: `(first, Δ, count)`, the window's
    /// pages since the last logged access, all of them when hits were invisible, just the
    /// marker when the caller reported the others. `None` if `page` is not the outstanding
    /// marker of `key` (for `leap+stream`, which tells its stream table about them).
    pub fn marker_window(&self, key: ProcessKey, page: PageNo) -> Option<(PageNo, i64, usize)> {
        let s = self.slots.find(self.key(key))?;
        self.window_consumed(s, page)
    }

    fn window_consumed(&self, s: usize, page: PageNo) -> Option<(PageNo, i64, usize)> {
        let st = &self.states[s];
        let (marker, _start, d) = st.marker.filter(|m| m.0 == page)?;
        let gap = marker.wrapping_sub(st.last_page) as i64;
        let steps = gap.checked_div(d).filter(|_| gap.checked_rem(d) == Some(0));
        let steps = steps.filter(|&k| k > 0 && k <= self.params.pw_max as i64)?;
        Some((st.last_page.wrapping_add_signed(d), d, steps as usize))
    }

    /// GETPREFETCHWINDOWSIZE (Alg. 2).
    fn window_size(&mut self, slot: usize, follows_trend: bool) -> usize {
        let pw_max = self.params.pw_max;
        let st = &mut self.states[slot];
        if st.c_hit == 0 {
            return usize::from(follows_trend);
        }
        let mut pw = (st.c_hit + 1).next_power_of_two().min(pw_max);
        if pw < st.pw_prev / 2 {
            pw = st.pw_prev / 2;
        }
        st.c_hit = 0;
        st.pw_prev = pw;
        pw
    }
}

/// Pushes up to `n` pages `page + iΔ` (i = 1..), skipping pages outside the u64 range.
fn push_along(out: &mut Candidates, page: PageNo, delta: i64, n: usize) {
    if let Some(first) = page.checked_add_signed(delta) {
        // Distinct: `out` is empty and a non-zero step never revisits a page.
        out.push_progression(first, delta, n);
    }
}

/// Pushes `n` pages around `page` along `delta`: +Δ, −Δ, +2Δ, −2Δ, ...
fn push_around(out: &mut Candidates, page: PageNo, delta: i64, n: usize) {
    let mut added = 0;
    let mut i: i64 = 1;
    // Bounded: at most 2n offsets are tried, whatever falls outside the u64 range.
    while added < n && (i as usize) <= n {
        for sign in [1i64, -1] {
            if added == n {
                break;
            }
            let off = delta.checked_mul(i * sign);
            if let Some(p) = off.and_then(|o| page.checked_add_signed(o)) {
                if out.push(p) {
                    added += 1;
                }
            }
        }
        i += 1;
    }
}

impl Prefetcher for Leap {
    fn name(&self) -> &'static str {
        "leap"
    }

    fn on_fault(&mut self, key: ProcessKey, page: PageNo, _now: Nanos, out: &mut Candidates) {
        out.clear();
        let slot = self.slots.acquire(self.key(key));
        if slot.fresh {
            self.states[slot.index] = LeapState::default();
        }
        let s = slot.index;
        let delta = self.log(s, page);
        let trend =
            find_trend(self.newest(s), self.params.h_size, self.params.n_split).filter(|&d| d != 0);
        let pw = self.window_size(s, trend == Some(delta));
        if pw == 0 {
            // Suspended: read only P_t (the demand fetch the caller does anyway).
            return;
        }
        match trend {
            Some(d) => {
                self.states[s].last_trend = d;
                push_along(out, page, d, pw);
                if self.params.markers && !out.is_empty() {
                    let last = out.len() - 1;
                    out.set_marker(last);
                    self.states[s].marker = Some((out.as_slice()[last], page, d));
                }
            }
            None => {
                let d = self.states[s].last_trend;
                if d != 0 {
                    push_around(out, page, d, pw);
                }
            }
        }
    }

    fn on_hit(&mut self, key: ProcessKey, page: PageNo, _now: Nanos) {
        let Some(s) = self.slots.find(self.key(key)) else {
            return;
        };
        self.log(s, page);
        self.states[s].c_hit += 1;
    }

    fn on_marker_hit(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        out.clear();
        let Some(s) = self.slots.find(self.key(key)) else {
            return;
        };
        let window = self.window_consumed(s, page);
        if self.states[s].marker.is_some_and(|m| m.0 == page) {
            self.states[s].marker = None;
        }
        let Some((first, d, consumed)) = window else {
            return self.on_hit(key, page, now);
        };
        for i in 0..consumed {
            self.log(s, first.wrapping_add_signed(d.wrapping_mul(i as i64)));
        }
        self.states[s].c_hit += consumed;
    }

    fn forget(&mut self, key: ProcessKey) {
        self.slots.remove(self.key(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leap(h: usize, n_split: usize) -> Leap {
        Leap::new(LeapParams {
            h_size: h,
            n_split,
            ..LeapParams::default()
        })
    }

    /// Leap Fig. 5: H_size = 8, N_split = 2.
    #[test]
    fn paper_worked_example() {
        let pages: [u64; 16] = [
            0x48, 0x45, 0x42, 0x3F, 0x3C, 0x02, 0x04, 0x06, 0x08, 0x0A, 0x0C, 0x10, 0x39, 0x12,
            0x14, 0x16,
        ];
        let mut l = leap(8, 2);
        let mut out = Candidates::new();
        let mut trends = Vec::new();
        for (t, &p) in pages.iter().enumerate() {
            l.on_fault(1, p, t as u64, &mut out);
            trends.push(l.trend(1));
        }
        assert_eq!(trends[0..3], [None, None, None], "too few deltas before t3");
        assert_eq!(trends[3], Some(-3), "trend -3 found at t3");
        assert_eq!(trends[7], None, "no trend at t7");
        assert_eq!(trends[8], Some(2), "+2 adopted at t8");
        assert_eq!(trends[12], Some(2), "+2 survives the noise at t12");
        assert_eq!(trends[13], Some(2), "+2 survives the noise at t13");
        assert_eq!(trends[15], Some(2), "+2 kept at t15");
    }

    #[test]
    fn find_trend_doubles_the_window() {
        // Newest 4 entries have no majority, the full 8 do (5 × +2).
        assert_eq!(find_trend(&[2, 2, 2, 4, 41, -39, 2, 2], 8, 2), Some(2));
        // 4 × -3 out of 8 is not a majority (needs 5).
        assert_eq!(find_trend(&[0, -3, -3, -3, -3, -58, 2, 2], 8, 2), None);
        // A partial history keeps the nominal threshold: 2 of 3 is not ⌊4/2⌋+1.
        assert_eq!(find_trend(&[0, -3, -3], 8, 2), None);
        assert_eq!(find_trend(&[], 8, 2), None);
    }

    #[test]
    fn window_grows_with_hits_capped_at_pw_max() {
        let mut l = leap(32, 4);
        let mut out = Candidates::new();
        let mut page = 100u64;
        let mut windows = Vec::new();
        // Sequential access with every prefetched page reported as a hit (visible mode).
        for t in 0..200 {
            l.on_fault(7, page, t, &mut out);
            windows.push(out.len());
            let fetched: Vec<u64> = out.as_slice().to_vec();
            for (i, &p) in fetched.iter().enumerate() {
                assert_eq!(p, page + 1 + i as u64, "prefetch follows the +1 trend");
                l.on_hit(7, p, t);
            }
            page += 1 + fetched.len() as u64;
        }
        assert!(
            windows[..4].iter().all(|&w| w == 0),
            "no trend before 5 deltas agree"
        );
        let grown: Vec<usize> = windows
            .iter()
            .copied()
            .skip_while(|&w| w == 0)
            .take(5)
            .collect();
        assert_eq!(
            grown,
            [1, 2, 4, 8, 8],
            "C_hit+1 rounded up to a power of two, cap 8"
        );
        assert!(windows.iter().all(|&w| w <= 8));
    }

    #[test]
    fn window_shrinks_at_most_by_half() {
        let mut l = leap(32, 4);
        let mut out = Candidates::new();
        // Reach PW = 8 on a sequential run with visible hits.
        let mut page = 0u64;
        for t in 0..40 {
            l.on_fault(1, page, t, &mut out);
            let fetched: Vec<u64> = out.as_slice().to_vec();
            for &p in &fetched {
                l.on_hit(1, p, t);
            }
            page += 1 + fetched.len() as u64;
        }
        assert_eq!(l.previous_window(1), Some(8));
        // Only one hit of the next window: roundup(2) = 2 < 8/2, so the window is 4.
        l.on_fault(1, page, 100, &mut out);
        assert_eq!(out.len(), 8);
        l.on_hit(1, page + 1, 101);
        l.on_fault(1, page + 2, 102, &mut out);
        assert_eq!(l.previous_window(1), Some(4));
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn suspends_without_trend_or_hits() {
        let mut l = leap(32, 4);
        let mut out = Candidates::new();
        let mut x = 12345u64;
        for t in 0..500 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            l.on_fault(3, (x >> 20) % 1_000_000, t, &mut out);
            assert!(out.is_empty(), "random faults must not prefetch");
        }
    }

    #[test]
    fn no_hit_follows_trend_fetches_one_page() {
        let mut l = leap(32, 4);
        let mut out = Candidates::new();
        for t in 0..20u64 {
            l.on_fault(1, 1000 + 10 * t, t, &mut out);
        }
        assert_eq!(out.as_slice(), &[1000 + 190 + 10]);
    }

    #[test]
    fn speculative_prefetch_around_page_along_last_trend() {
        let mut l = leap(8, 2);
        let mut out = Candidates::new();
        // Build trend +1 and a hit, then break the trend.
        for t in 0..6u64 {
            l.on_fault(1, t, t, &mut out);
        }
        assert_eq!(out.as_slice(), &[6]);
        l.on_hit(1, 6, 6);
        // Random jumps: no trend, but C_hit = 1 → PW = 2 around the page along +1.
        l.on_fault(1, 500, 7, &mut out);
        l.on_fault(1, 9000, 8, &mut out);
        l.on_fault(1, 30, 9, &mut out);
        l.on_hit(1, 31, 9);
        l.on_fault(1, 7000, 10, &mut out);
        assert_eq!(l.trend(1), None);
        assert_eq!(out.as_slice(), &[7001, 6999]);
    }

    #[test]
    fn per_process_histories_are_isolated() {
        let mut l = leap(32, 4);
        let mut out = Candidates::new();
        for t in 0..40u64 {
            l.on_fault(1, 10 * t, t, &mut out);
            l.on_fault(2, 1_000_000 - 3 * t, t, &mut out);
        }
        assert_eq!(l.trend(1), Some(10));
        assert_eq!(l.trend(2), Some(-3));
        let mut g = Leap::new(LeapParams {
            per_process: false,
            ..LeapParams::default()
        });
        for t in 0..40u64 {
            g.on_fault(1, 10 * t, t, &mut out);
            g.on_fault(2, 1_000_000 - 3 * t, t, &mut out);
        }
        assert_eq!(g.trend(1), None, "interleaved processes hide both trends");
    }

    #[test]
    fn marker_hit_stands_for_the_consumed_window() {
        let mut l = Leap::new(LeapParams {
            markers: true,
            ..LeapParams::default()
        });
        let mut out = Candidates::new();
        let mut page = 0u64;
        let mut t = 0;
        // Injected mode: only marker hits are reported.
        for _ in 0..100 {
            l.on_fault(1, page, t, &mut out);
            t += 1;
            let markers: Vec<u64> = out.iter().filter(|c| c.1).map(|c| c.0).collect();
            assert!(markers.len() <= 1);
            if let Some(&m) = markers.first() {
                assert_eq!(
                    m,
                    *out.as_slice().last().unwrap(),
                    "marker is the window's last page"
                );
                let mut more = Candidates::new();
                l.on_marker_hit(1, m, t, &mut more);
                assert!(more.is_empty());
            }
            page += 1 + out.len() as u64;
        }
        assert_eq!(
            l.trend(1),
            Some(1),
            "history learns the stride, not the window size"
        );
        assert_eq!(out.len(), 8, "window reaches PW_max as with visible hits");
    }
}
