//! Multi-stream prefetcher: a stream table in the style of HOPP's STT and MARB's stream table.
//!
//! The table has a fixed number of entries (64 by default), each tagged with a process key and
//! replaced LRU (unconfirmed entries first, so a burst of random faults does not flush the
//! streams that are paying off). Lookup and replacement are O(1) whatever the table size: a
//! region index finds the entries near a page, and three intrusive LRU lists give the victim. A fault *joins* the entry of its process whose last page, or
//! prefetch frontier, is within `Δ_stream` pages (64 by default), nearest first: this clustering
//! separates interleaved streams (two threads scanning two arrays) that defeat a single majority
//! over one history. An entry whose last two deltas agree (≥ 2 consistent deltas) is
//! *confirmed*; from then on it only accepts faults on its stride lattice ahead of it, and each
//! such fault prefetches the next `depth` pages along the stride beyond what it already fetched.
//!
//! Depth starts at `init_depth` and doubles (up to `max_depth`) each time the stream proves it
//! consumes what it fetched: its marker is used, or it faults just past its frontier. Each
//! window carries one marker in its middle; when the caller reports the marker's first use
//! ([`Prefetcher::on_marker_hit`]) the stream issues its next window at once, so a steady scan
//! never misses even when ordinary hits are invisible (injected pages).
//!
//! A late hit (the guest reached a page of the stream's window whose read is still in flight,
//! [`Prefetcher::on_late_hit`]) means one window ahead is less than the reads' latency: the
//! stream doubles its depth (past the depth budget) and issues its next window at once, keeping
//! its outstanding marker, and so keeps one more window in flight from then on.
//!
//! A fault *inside* the issued window means the window is behind the guest (a page of it was
//! evicted before use, or the caller still holds it in a queue): the window restarts right
//! after the fault at half the depth (not below `init_depth`), instead of fetching further past
//! the frontier. Without that, a paging engine saw the frontier run away from the guest, every
//! later page fault, and ~1M proposals of pages already present per 16k-page re-read.
//!
//! Hits (`on_hit`: visible or late hits, and in `leap+stream` the pages of consumed Leap
//! windows) are accesses: they advance a confirmed stream and count towards an unconfirmed
//! stream's stride, but never create an entry or issue.

use crate::{Candidates, Nanos, PageNo, Prefetcher, ProcessKey, MAX_CANDIDATES};

/// Stream table tunables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamParams {
    /// Entries in the stream table (default 64).
    pub entries: usize,
    /// Δ_stream: how close (in pages) a fault must be to join a stream (default 64).
    pub delta: u64,
    /// Pages fetched by a newly confirmed stream (default 4).
    pub init_depth: usize,
    /// Maximum pages per window (default 64, at most [`MAX_CANDIDATES`]).
    pub max_depth: usize,
    /// Streams tagged by process key (`true`) or shared by all keys (`false`).
    pub per_process: bool,
    /// Depth budget: a window grows by at most one page per this many pages the stream has
    /// used, rounded down to a power of two (0 = no budget, the default; `leap+stream` uses
    /// 16).
    pub used_per_depth: u64,
    /// Two successive deltas of the same sign and at most this size, even unequal, confirm a
    /// stride-±1 stream (0 = off, the default; `leap+stream` uses 4).
    pub dense_gap: u64,
}

impl Default for StreamParams {
    fn default() -> Self {
        Self {
            entries: 64,
            delta: 64,
            init_depth: 4,
            max_depth: 64,
            per_process: true,
            used_per_depth: 0,
            dense_gap: 0,
        }
    }
}

/// Cold per-entry state; the fields every lookup reads live in [`Stream`]'s flat arrays.
#[derive(Clone, Copy, Debug, Default)]
struct Entry {
    last: PageNo,
    stride: i64,
    /// Consecutive equal deltas seen (2 = confirmed).
    run: u32,
    /// Last page fetched along the stride, if any.
    frontier: Option<PageNo>,
    depth: usize,
    /// Pages along the stride the stream has used since it was confirmed (saturating).
    used: u64,
}

impl Entry {
    /// Lattice steps from the last page to `page` (positive ahead), if `page` is on the lattice.
    fn steps_to(&self, page: PageNo) -> Option<u64> {
        let diff = page.wrapping_sub(self.last) as i64;
        diff.checked_div(self.stride)
            .filter(|_| diff.checked_rem(self.stride) == Some(0))
            .and_then(|k| u64::try_from(k).ok())
    }

    /// Moves the stream's last page forward to `page` (on the lattice ahead), counting the pages
    /// used.
    fn advance_to(&mut self, page: PageNo) {
        self.used = self.used.saturating_add(self.steps_to(page).unwrap_or(0));
        self.last = page;
    }

    /// Doubles the depth, up to `max`, and, with a budget (`used_per_depth` > 0), up to one
    /// page of depth per `used_per_depth` pages the stream has used: a window ahead never grows
    /// past what the stream has shown it consumes.
    fn grow(&mut self, init: usize, max: usize, used_per_depth: u64) {
        let mut depth = (self.depth * 2).min(max);
        if let Some(earned) = self.used.checked_div(used_per_depth) {
            // Rounded down to a power of two, so depths stay the powers of two they double
            // through (odd depths break the window alignment the engine's queue relies on).
            let earned = usize::try_from(earned).unwrap_or(usize::MAX).max(1);
            let earned = (1usize << earned.ilog2()).max(init);
            depth = depth.min(earned.max(self.depth));
        }
        self.depth = depth;
    }

    fn confirmed(&self) -> bool {
        self.run >= 2 && self.stride != 0
    }

    /// `page` lies on this stream's lattice strictly ahead of its last page.
    fn ahead_on_lattice(&self, page: PageNo) -> bool {
        let diff = page.wrapping_sub(self.last) as i64;
        // Checked: i64::MIN / -1 overflows, and pages come from untrusted traces.
        diff != 0
            && diff.checked_rem(self.stride) == Some(0)
            && diff.checked_div(self.stride).is_some_and(|k| k > 0)
    }

    /// `page` lies on the lattice within the fetched region (last, frontier].
    fn covers(&self, page: PageNo) -> bool {
        let Some(f) = self.frontier else {
            return false;
        };
        if !self.ahead_on_lattice(page) {
            return false;
        }
        let steps = |p: PageNo| (p.wrapping_sub(self.last) as i64).checked_div(self.stride);
        match (steps(page), steps(f)) {
            (Some(to_page), Some(to_front)) => to_page <= to_front,
            _ => false,
        }
    }

    /// `page` is the next one this confirmed stream expects (after its last page or frontier).
    fn expects(&self, page: PageNo) -> bool {
        self.confirmed()
            && (self.last.checked_add_signed(self.stride) == Some(page)
                || self
                    .frontier
                    .and_then(|f| f.checked_add_signed(self.stride))
                    == Some(page))
    }
}

/// `markers` value of an entry without an outstanding marker.
const NO_MARKER: u64 = u64::MAX;
/// End of an LRU list.
const NIL: u32 = u32::MAX;
/// LRU lists: free entries, unconfirmed streams, confirmed streams. Replacement takes a free
/// entry, else the least recently used unconfirmed one, else the least recently used one.
const FREE: u8 = 0;
const UNCONFIRMED: u8 = 1;
const CONFIRMED: u8 = 2;
/// Slots of the region index (a power of two; 16 KiB).
const INDEX_SLOTS: usize = 4096;

/// The stream table prefetcher.
///
/// Lookups are O(1): a direct-mapped *region index* maps `(key, page / R)` (R = Δ_stream
/// rounded up to a power of two) to the entry whose last page or frontier lies in that region,
/// so a fault probes the three regions that can hold a page within Δ_stream of it and verifies
/// the few entries found. An index slot can be overwritten by a colliding region; the entry it
/// pointed to is then found again once its next access re-registers it (it may start a
/// duplicate stream meanwhile, which LRU replacement retires). Replacement is O(1) with three
/// intrusive LRU lists.
pub struct Stream {
    params: StreamParams,
    keys: Box<[ProcessKey]>,
    /// Which LRU list each entry is on (`FREE` = unused).
    list: Box<[u8]>,
    prev: Box<[u32]>,
    next: Box<[u32]>,
    /// (most recently used, least recently used) of each list.
    ends: [(u32, u32); 3],
    /// Outstanding marker page per entry, or `NO_MARKER`.
    markers: Box<[PageNo]>,
    entries: Box<[Entry]>,
    /// Region index: entry + 1, or 0.
    index: Box<[u32]>,
    region_shift: u32,
    /// Most recently used entry: a fault that continues it skips the lookup.
    mru: usize,
    /// A stream confirmed by a fault now starts at half of `init_depth` (set per decision by
    /// `leap+stream` while the process is under memory pressure).
    cautious: bool,
}

fn distance(a: PageNo, b: PageNo) -> u64 {
    a.abs_diff(b)
}

impl Stream {
    /// Builds the table; parameters are validated by [`crate::registry`].
    pub fn new(params: StreamParams) -> Self {
        let n = params.entries.clamp(1, NIL as usize - 1);
        let mut s = Self {
            params,
            keys: vec![0; n].into_boxed_slice(),
            list: vec![FREE; n].into_boxed_slice(),
            prev: vec![NIL; n].into_boxed_slice(),
            next: vec![NIL; n].into_boxed_slice(),
            ends: [(NIL, NIL); 3],
            markers: vec![NO_MARKER; n].into_boxed_slice(),
            entries: vec![Entry::default(); n].into_boxed_slice(),
            index: vec![0; INDEX_SLOTS].into_boxed_slice(),
            region_shift: params.delta.max(1).next_power_of_two().trailing_zeros(),
            mru: 0,
            cautious: false,
        };
        for i in 0..n {
            s.push_front(FREE, i);
        }
        s
    }

    fn key(&self, key: ProcessKey) -> ProcessKey {
        if self.params.per_process {
            key
        } else {
            0
        }
    }

    fn live(&self, i: usize, key: ProcessKey) -> bool {
        self.list[i] != FREE && self.keys[i] == key
    }

    fn unlink(&mut self, i: usize) {
        let l = self.list[i] as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.ends[l].0 = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.ends[l].1 = p;
        } else {
            self.prev[n as usize] = p;
        }
    }

    fn push_front(&mut self, list: u8, i: usize) {
        let l = list as usize;
        let head = self.ends[l].0;
        self.list[i] = list;
        self.prev[i] = NIL;
        self.next[i] = head;
        if head == NIL {
            self.ends[l].1 = i as u32;
        } else {
            self.prev[head as usize] = i as u32;
        }
        self.ends[l].0 = i as u32;
    }

    /// The entry a new stream replaces.
    fn victim(&self) -> usize {
        [FREE, UNCONFIRMED, CONFIRMED]
            .iter()
            .map(|&l| self.ends[l as usize].1)
            .find(|&t| t != NIL)
            .unwrap_or(0) as usize
    }

    fn slot(&self, key: ProcessKey, region: u64) -> usize {
        let h = (region ^ key.rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> (64 - INDEX_SLOTS.trailing_zeros())) as usize
    }

    /// Marks entry `i` most recently used (on the list matching its state) and registers its
    /// last page and frontier in the region index.
    fn touch(&mut self, i: usize) {
        let list = if self.entries[i].confirmed() {
            CONFIRMED
        } else {
            UNCONFIRMED
        };
        self.unlink(i);
        self.push_front(list, i);
        self.mru = i;
        self.sync(i);
    }

    /// Registers entry `i`'s last page and frontier in the region index.
    fn sync(&mut self, i: usize) {
        let e = self.entries[i];
        let key = self.keys[i];
        let a = self.slot(key, e.last >> self.region_shift);
        self.index[a] = i as u32 + 1;
        if let Some(f) = e.frontier {
            let b = self.slot(key, f >> self.region_shift);
            self.index[b] = i as u32 + 1;
        }
    }

    /// The entry of `key` that `page` joins, nearest first (`Ok`), or the entry to replace
    /// for a new stream (`Err`).
    fn find(&self, key: ProcessKey, page: PageNo) -> Result<usize, usize> {
        if self.live(self.mru, key) && self.entries[self.mru].expects(page) {
            return Ok(self.mru);
        }
        let (mut best, mut best_d) = (usize::MAX, u64::MAX);
        let region = page >> self.region_shift;
        for r in [region.wrapping_sub(1), region, region.wrapping_add(1)] {
            let v = self.index[self.slot(key, r)];
            if v == 0 {
                continue;
            }
            let i = v as usize - 1;
            if !self.live(i, key) {
                continue;
            }
            let e = &self.entries[i];
            let mut d = distance(page, e.last);
            if let Some(f) = e.frontier {
                d = d.min(distance(page, f));
            }
            if d > self.params.delta || d >= best_d {
                continue;
            }
            if e.confirmed() && !e.ahead_on_lattice(page) {
                continue;
            }
            (best, best_d) = (i, d);
        }
        if best == usize::MAX {
            Err(self.victim())
        } else {
            Ok(best)
        }
    }

    /// Whether streams confirmed from now on start at half of `init_depth` (at least 1 page):
    /// the first window of a new stream is its most speculative one.
    pub fn set_cautious(&mut self, cautious: bool) {
        self.cautious = cautious;
    }

    /// Number of confirmed streams of `key` (for tests and diagnostics).
    pub fn confirmed_streams(&self, key: ProcessKey) -> usize {
        let key = self.key(key);
        (0..self.keys.len())
            .filter(|&i| self.live(i, key) && self.entries[i].confirmed())
            .count()
    }

    fn marker_entry(&self, key: ProcessKey, page: PageNo) -> Option<usize> {
        if page == NO_MARKER {
            return None;
        }
        (0..self.markers.len()).find(|&i| self.markers[i] == page && self.live(i, key))
    }

    /// Whether `page` is the outstanding marker of one of `key`'s streams.
    pub fn owns_marker(&self, key: ProcessKey, page: PageNo) -> bool {
        self.marker_entry(self.key(key), page).is_some()
    }

    /// Fetches the next `depth` pages along the stride, after the frontier if it is still
    /// ahead of the stream's last page, else after the last page, with a marker in the middle.
    fn issue(&mut self, i: usize, out: &mut Candidates) {
        self.issue_window(i, out, true);
    }

    /// [`Stream::issue`]; with `marker` false the window carries no marker and the stream's
    /// outstanding one stays.
    fn issue_window(&mut self, i: usize, out: &mut Candidates, marker: bool) {
        let e = &mut self.entries[i];
        let p = match e.frontier {
            Some(f) if e.ahead_on_lattice(f) => f,
            _ => e.last,
        };
        let depth = e.depth.clamp(1, MAX_CANDIDATES);
        if marker {
            self.markers[i] = NO_MARKER;
        }
        let Some(first) = p.checked_add_signed(e.stride) else {
            return;
        };
        // Distinct: `out` is empty and one progression with a non-zero stride never repeats.
        let start = out.len();
        let added = out.push_progression(first, e.stride, depth);
        if added == 0 {
            return;
        }
        let slice = out.as_slice();
        e.frontier = Some(slice[start + added - 1]);
        // One marker in the middle of the window.
        let m = start + added / 2;
        if marker && slice[m] != NO_MARKER {
            self.markers[i] = slice[m];
            out.set_marker(m);
        }
        self.sync(i);
    }
}

impl Prefetcher for Stream {
    fn name(&self) -> &'static str {
        "stream"
    }

    fn on_fault(&mut self, key: ProcessKey, page: PageNo, _now: Nanos, out: &mut Candidates) {
        out.clear();
        let key = self.key(key);
        let i = match self.find(key, page) {
            Ok(i) => i,
            Err(v) => {
                self.keys[v] = key;
                self.markers[v] = NO_MARKER;
                self.entries[v] = Entry {
                    last: page,
                    depth: self.params.init_depth,
                    ..Entry::default()
                };
                self.touch(v);
                return;
            }
        };
        let max_depth = self.params.max_depth;
        let init_depth = self.params.init_depth;
        let used_per_depth = self.params.used_per_depth;
        let first_depth = if self.cautious {
            (init_depth / 2).max(1)
        } else {
            init_depth
        };
        let e = &mut self.entries[i];
        if e.confirmed() {
            // On the lattice ahead (checked by `find`). Just past the frontier means the whole
            // window was used: grow.
            let past_frontier = e
                .frontier
                .is_some_and(|f| f.checked_add_signed(e.stride) == Some(page));
            let inside = e.covers(page);
            e.advance_to(page);
            if past_frontier {
                e.grow(init_depth, max_depth, used_per_depth);
            }
            // Inside the window means the window is behind the guest: a page it issued is
            // missing as the guest arrives (still queued by the caller, or evicted before use).
            // Fetching further past the frontier would run away from the guest, and every
            // later page of the window would fault the same way; restart the window at the
            // fault instead, at half the depth, so repeated misses shrink what is re-proposed.
            if inside {
                e.depth = (e.depth / 2).max(init_depth.min(max_depth)).max(1);
            }
            e.frontier = None;
            self.touch(i);
            self.issue(i, out);
            return;
        }
        let delta = page.wrapping_sub(e.last) as i64;
        if delta == 0 {
            self.touch(i);
            return;
        }
        let gap = i64::try_from(self.params.dense_gap).unwrap_or(i64::MAX);
        let small = |d: i64| d != 0 && d.unsigned_abs() <= gap.unsigned_abs();
        if delta == e.stride {
            e.run += 1;
        } else if small(delta) && small(e.stride) && delta.signum() == e.stride.signum() {
            // Small forward (or backward) gaps of unequal size: a dense scan whose misses skip
            // pages, counted as stride ±1.
            e.stride = delta.signum();
            e.run += 1;
        } else {
            e.stride = delta;
            e.run = 1;
        }
        e.last = page;
        let confirmed = e.confirmed();
        if confirmed {
            e.depth = first_depth;
            e.frontier = None;
            e.used = u64::from(e.run) + 1;
        }
        self.touch(i);
        if confirmed {
            self.issue(i, out);
        }
    }

    fn on_hit(&mut self, key: ProcessKey, page: PageNo, _now: Nanos) {
        self.hit(key, page);
    }

    fn on_marker_hit(&mut self, key: ProcessKey, page: PageNo, _now: Nanos, out: &mut Candidates) {
        self.marker_hit(key, page, out);
    }

    fn on_late_hit(&mut self, key: ProcessKey, page: PageNo, _now: Nanos, out: &mut Candidates) {
        self.late_hit(key, page, out);
    }

    fn forget(&mut self, key: ProcessKey) {
        let key = self.key(key);
        for i in 0..self.keys.len() {
            if self.live(i, key) {
                self.unlink(i);
                self.push_front(FREE, i);
                self.markers[i] = NO_MARKER;
            }
        }
    }
}

impl Stream {
    /// A page someone prefetched was used (a visible or late hit, or a page another policy
    /// fetched and the guest consumed). It is an access like a fault, so it advances the stream
    /// it belongs to and counts towards an unconfirmed stream's stride: otherwise a stream
    /// whose every other page is prefetched (by Leap in `leap+stream`) only sees the gaps
    /// between prefetch windows and learns their width as its stride. A hit never creates an
    /// entry (hits are not the stream table's business when no stream is near) and never
    /// issues; the next fault or marker hit does.
    pub fn hit(&mut self, key: ProcessKey, page: PageNo) {
        let key = self.key(key);
        let Ok(i) = self.find(key, page) else {
            return;
        };
        let e = &mut self.entries[i];
        if !e.confirmed() {
            let delta = page.wrapping_sub(e.last) as i64;
            if delta == 0 {
                return;
            }
            if delta == e.stride {
                e.run += 1;
            } else {
                e.stride = delta;
                e.run = 1;
            }
            e.last = page;
            if e.confirmed() {
                e.depth = self.params.init_depth;
                e.frontier = None;
                e.used = u64::from(e.run) + 1;
            }
        } else {
            // A confirmed stream only accepts pages on its lattice ahead (checked by `find`).
            e.advance_to(page);
        }
        self.touch(i);
    }

    /// [`Prefetcher::on_late_hit`]; returns whether a window was issued. A late hit inside a
    /// confirmed stream's fetched region means the guest caught up with the stream's reads:
    /// one window ahead is less than the reads' latency. The stream answers with its next
    /// window past the frontier, twice as deep (up to `max_depth`, whatever the depth budget:
    /// the guest consumes the stream faster than it is fetched), so from then on it has one
    /// more window in flight; its outstanding marker (still ahead of the guest) stays the
    /// marker, and its hit issues the window after that. The lead so grows by a window per
    /// late hit until the guest stops catching up; the caller's in-flight cap bounds it.
    /// Anything else is an ordinary hit ([`Stream::hit`]).
    pub fn late_hit(&mut self, key: ProcessKey, page: PageNo, out: &mut Candidates) -> bool {
        out.clear();
        let k = self.key(key);
        let i = match self.find(k, page) {
            Ok(i) if self.entries[i].confirmed() && self.entries[i].covers(page) => i,
            _ => {
                self.hit(key, page);
                return false;
            }
        };
        let max_depth = self.params.max_depth;
        let e = &mut self.entries[i];
        e.advance_to(page);
        // Consumed faster than fetched: the depth budget (which keeps a slowly used stream
        // from holding pages the LRU evicts before use) does not apply.
        e.depth = (e.depth * 2).min(max_depth);
        let keep = self.markers[i] != NO_MARKER && self.entries[i].covers(self.markers[i]);
        self.touch(i);
        self.issue_window(i, out, !keep);
        !out.is_empty()
    }

    /// [`Prefetcher::on_marker_hit`]; returns whether `page` was one of this table's markers.
    pub fn marker_hit(&mut self, key: ProcessKey, page: PageNo, out: &mut Candidates) -> bool {
        out.clear();
        let key = self.key(key);
        let Some(i) = self.marker_entry(key, page) else {
            return false;
        };
        let (init_depth, max_depth) = (self.params.init_depth, self.params.max_depth);
        let used_per_depth = self.params.used_per_depth;
        let e = &mut self.entries[i];
        if e.covers(page) {
            e.advance_to(page);
        }
        e.grow(init_depth, max_depth, used_per_depth);
        self.touch(i);
        self.issue(i, out);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_scan(s: &mut Stream, pages: &[(u64, u64)], markers: bool) -> (usize, usize) {
        // A tiny local cache model: returns (misses, hits) for the access list.
        let mut fetched = std::collections::HashMap::<(u64, u64), bool>::new();
        let (mut misses, mut hits) = (0, 0);
        let mut out = Candidates::new();
        for (t, &(k, p)) in pages.iter().enumerate() {
            match fetched.remove(&(k, p)) {
                Some(is_marker) => {
                    hits += 1;
                    if is_marker && markers {
                        s.on_marker_hit(k, p, t as u64, &mut out);
                        for (c, m) in out.iter() {
                            fetched.insert((k, c), m);
                        }
                    }
                }
                None => {
                    misses += 1;
                    s.on_fault(k, p, t as u64, &mut out);
                    for (c, m) in out.iter() {
                        fetched.insert((k, c), m);
                    }
                }
            }
        }
        (misses, hits)
    }

    #[test]
    fn confirms_after_two_consistent_deltas() {
        let mut s = Stream::new(StreamParams::default());
        let mut out = Candidates::new();
        s.on_fault(1, 100, 0, &mut out);
        s.on_fault(1, 110, 1, &mut out);
        assert!(out.is_empty());
        assert_eq!(s.confirmed_streams(1), 0);
        s.on_fault(1, 120, 2, &mut out);
        assert_eq!(s.confirmed_streams(1), 1);
        assert_eq!(out.as_slice(), &[130, 140, 150, 160]);
        assert!(out.is_marker(2), "one marker in the middle of the window");
    }

    #[test]
    fn a_fault_inside_the_window_restarts_it_at_the_fault() {
        let mut s = Stream::new(StreamParams::default());
        let mut out = Candidates::new();
        for p in 0..3 {
            s.on_fault(1, p, p, &mut out);
        }
        // Grow to depth 16 on frontier faults: 3..=6, then 8..=15, then 17..=32.
        s.on_fault(1, 7, 3, &mut out);
        s.on_fault(1, 16, 4, &mut out);
        assert_eq!(out.as_slice(), (17..=32).collect::<Vec<_>>().as_slice());
        // Page 20 of the issued window faults (lost, or still queued by the caller): the window
        // is behind the guest. Restart right after the fault at half the depth, instead of
        // fetching 32..=47 past the frontier.
        s.on_fault(1, 20, 5, &mut out);
        assert_eq!(out.as_slice(), (21..=28).collect::<Vec<_>>().as_slice());
        // Repeated misses inside the window shrink the re-proposals down to the initial depth.
        s.on_fault(1, 22, 6, &mut out);
        assert_eq!(out.as_slice(), &[23, 24, 25, 26]);
        s.on_fault(1, 23, 7, &mut out);
        assert_eq!(out.as_slice(), &[24, 25, 26, 27]);
        // Just past the frontier grows again.
        s.on_fault(1, 28, 8, &mut out);
        assert_eq!(out.len(), 8);
        assert_eq!(out.as_slice()[0], 29);
    }

    #[test]
    fn hits_count_towards_an_unconfirmed_stride_but_create_nothing() {
        let mut s = Stream::new(StreamParams::default());
        let mut out = Candidates::new();
        s.on_hit(1, 500, 0);
        assert_eq!(s.confirmed_streams(1), 0);
        s.on_fault(1, 100, 0, &mut out);
        s.on_hit(1, 101, 1);
        s.on_hit(1, 102, 2);
        assert_eq!(s.confirmed_streams(1), 1, "100, 101, 102: stride 1");
        s.on_fault(1, 103, 3, &mut out);
        assert_eq!(out.as_slice(), &[104, 105, 106, 107]);
    }

    #[test]
    fn dense_gaps_confirm_a_stride_one_stream_when_enabled() {
        let faults = [100u64, 102, 105, 106];
        let mut plain = Stream::new(StreamParams::default());
        let mut dense = Stream::new(StreamParams {
            dense_gap: 4,
            ..StreamParams::default()
        });
        let mut out = Candidates::new();
        for (t, &p) in faults.iter().enumerate() {
            plain.on_fault(1, p, t as u64, &mut out);
        }
        assert_eq!(plain.confirmed_streams(1), 0, "gaps 2, 3, 1 never repeat");
        for (t, &p) in faults[..3].iter().enumerate() {
            dense.on_fault(1, p, t as u64, &mut out);
        }
        assert_eq!(dense.confirmed_streams(1), 1);
        assert_eq!(out.as_slice(), &[106, 107, 108, 109]);
    }

    #[test]
    fn a_depth_budget_holds_windows_to_what_the_stream_used() {
        let mut s = Stream::new(StreamParams {
            used_per_depth: 2,
            ..StreamParams::default()
        });
        let mut out = Candidates::new();
        for p in 0..3 {
            s.on_fault(1, p, p, &mut out);
        }
        // Frontier faults: 3 pages used at confirmation, 8 at page 7, 13 at page 12, 18 at 17;
        // the budget (used / 2, rounded down to a power of two) holds the depth at 4, then 8.
        s.on_fault(1, 7, 3, &mut out);
        assert_eq!(out.len(), 4, "8 used pages earn a depth of 4, not 8");
        s.on_fault(1, 12, 4, &mut out);
        assert_eq!(out.len(), 4, "13 used pages earn 6, rounded down to 4");
        s.on_fault(1, 17, 5, &mut out);
        assert_eq!(out.as_slice(), (18..26).collect::<Vec<_>>().as_slice());
    }

    #[test]
    fn a_late_hit_issues_the_next_window_deeper_and_keeps_the_marker() {
        let mut s = Stream::new(StreamParams {
            used_per_depth: 16,
            ..StreamParams::default()
        });
        let mut out = Candidates::new();
        for p in 0..3 {
            s.on_fault(1, p, p, &mut out);
        }
        // Confirmed at page 2: pages 3..7 with the marker at 5.
        assert_eq!(out.as_slice(), &[3, 4, 5, 6]);
        assert!(out.is_marker(2));
        // The guest reached page 3 while it was in flight: the next window goes out at once,
        // twice as deep although the budget (3 used pages) would hold it at 4, and without a
        // marker: page 5 stays the marker.
        assert!(s.late_hit(1, 3, &mut out));
        assert_eq!(out.as_slice(), (7..15).collect::<Vec<_>>().as_slice());
        assert!((0..out.len()).all(|i| !out.is_marker(i)));
        assert!(s.owns_marker(1, 5));
        // The marker's hit issues the window after that one.
        assert!(s.marker_hit(1, 5, &mut out));
        assert_eq!(out.as_slice()[0], 15);
        assert!(!s.owns_marker(1, 5));
        // A late hit outside every stream's window issues nothing and creates no stream.
        assert!(!s.late_hit(1, 5_000, &mut out));
        assert!(out.is_empty());
        assert_eq!(s.confirmed_streams(1), 1);
    }

    #[test]
    fn late_hits_keep_a_slow_pipeline_windows_ahead() {
        // A caller whose reads take `lag` accesses to arrive: a page proposed at access t is
        // there from access t + lag on; touching it earlier is a late hit.
        fn run(s: &mut Stream, late_hits: bool) -> (usize, usize) {
            let lag = 40u64;
            let mut arrives = std::collections::HashMap::<u64, (u64, bool)>::new();
            let mut out = Candidates::new();
            let (mut late, mut misses) = (0, 0);
            for t in 0..20_000u64 {
                match arrives.remove(&t) {
                    Some((at, marker)) => {
                        if marker {
                            s.on_marker_hit(1, t, t, &mut out);
                        } else if at > t {
                            late += 1;
                            if late_hits {
                                s.on_late_hit(1, t, t, &mut out);
                            } else {
                                s.on_hit(1, t, t);
                                out.clear();
                            }
                        } else {
                            out.clear();
                        }
                    }
                    None => {
                        misses += 1;
                        s.on_fault(1, t, t, &mut out);
                    }
                }
                for (c, m) in out.iter() {
                    arrives.entry(c).or_insert((t + lag, m));
                }
            }
            (late, misses)
        }
        let params = StreamParams {
            used_per_depth: 16,
            ..StreamParams::default()
        };
        let (late_before, misses_before) = run(&mut Stream::new(params), false);
        let (late_after, misses_after) = run(&mut Stream::new(params), true);
        assert!(
            misses_after <= misses_before,
            "{misses_after} > {misses_before}"
        );
        assert!(
            late_after * 10 < late_before,
            "late hits {late_before} -> {late_after}"
        );
    }

    #[test]
    fn far_fault_starts_a_new_stream() {
        let mut s = Stream::new(StreamParams::default());
        let mut out = Candidates::new();
        s.on_fault(1, 0, 0, &mut out);
        s.on_fault(1, 65, 1, &mut out); // beyond Δ_stream = 64
        s.on_fault(1, 130, 2, &mut out);
        assert!(out.is_empty());
        assert_eq!(s.confirmed_streams(1), 0);
    }

    #[test]
    fn markers_keep_a_scan_free_of_misses() {
        let mut s = Stream::new(StreamParams::default());
        let pages: Vec<(u64, u64)> = (0..10_000).map(|p| (1, p)).collect();
        let (misses, hits) = run_scan(&mut s, &pages, true);
        assert!(misses <= 4, "only the start misses, got {misses}");
        assert_eq!(misses + hits, 10_000);
        // Without marker continuation (a caller that only calls on_hit): one miss per window.
        let mut s = Stream::new(StreamParams::default());
        let (misses, _) = run_scan(&mut s, &pages, false);
        assert!(
            misses < 10_000 / 60,
            "depth grows to 64 on frontier faults, got {misses}"
        );
    }

    #[test]
    fn two_interleaved_streams_in_one_process() {
        let mut s = Stream::new(StreamParams::default());
        let pages: Vec<(u64, u64)> = (0..5_000)
            .flat_map(|i| [(1, i), (1, 1_000_000 + 3 * i)])
            .collect();
        let (misses, _) = run_scan(&mut s, &pages, true);
        assert_eq!(s.confirmed_streams(1), 2);
        assert!(misses <= 8, "both streams covered, got {misses} misses");
    }

    #[test]
    fn descending_stream() {
        let mut s = Stream::new(StreamParams::default());
        let pages: Vec<(u64, u64)> = (0..3_000u64).map(|i| (4, 1_000_000 - 2 * i)).collect();
        let (misses, _) = run_scan(&mut s, &pages, true);
        assert!(misses <= 4, "got {misses}");
    }

    #[test]
    fn random_faults_do_not_evict_confirmed_streams() {
        let mut s = Stream::new(StreamParams::default());
        let mut out = Candidates::new();
        for p in 0..3 {
            s.on_fault(1, p, p, &mut out);
        }
        assert_eq!(s.confirmed_streams(1), 1);
        let mut x = 7u64;
        for t in 0..1_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            s.on_fault(1, 1 << 30 | (x >> 33), t, &mut out);
        }
        assert_eq!(s.confirmed_streams(1), 1);
    }

    #[test]
    fn forget_drops_a_process_streams() {
        let mut s = Stream::new(StreamParams::default());
        let mut out = Candidates::new();
        for p in 0..3 {
            s.on_fault(9, p, p, &mut out);
        }
        s.forget(9);
        assert_eq!(s.confirmed_streams(9), 0);
    }
}
