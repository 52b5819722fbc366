//! farvm-prefetch: decides which guest pages to fetch before the guest asks for them.
//!
//! This crate is pure: no I/O, no KVM, no sockets, no clocks. Callers feed it faults
//! (`process key`, `page`, `time`) and hit notifications, and it answers with candidate pages.
//! A decision allocates nothing: candidates are written into a caller-owned [`Candidates`].
//!
//! Layout: the interface (this file); the policies ([`leap`], [`stream`], [`composite`] and the
//! baselines [`none`], [`next_n`], [`stride`], [`readahead`]) over a fixed per-process table
//! ([`slots`]), a per-process memory-pressure estimate ([`pressure`]) and the components of
//! `leap+stream` ([`region`], [`runahead`], and the [`sandbox`] that chooses its arm per
//! process); the by-name [`registry`]; page-access traces ([`trace`]) and the replay evaluator
//! ([`eval`]) with Leap's accounting; the standard results table ([`report`]) and the rule for
//! traces of real programs ([`compare`]).

pub mod compare;
pub mod composite;
pub mod eval;
pub mod leap;
pub mod next_n;
pub mod none;
pub mod pressure;
pub mod readahead;
pub mod region;
pub mod registry;
pub mod report;
pub mod runahead;
pub mod sandbox;
pub mod slots;
pub mod stream;
pub mod stride;
pub mod trace;

pub use registry::{build, names, BuildError, Config};

/// A page number (guest-physical or guest-virtual page frame, i.e. address >> 12).
pub type PageNo = u64;
/// Identifies whose access history a fault belongs to (a guest process, a trace pid).
pub type ProcessKey = u64;
/// Monotonic time in nanoseconds, supplied by the caller.
pub type Nanos = u64;

/// Upper bound on pages one decision may return.
pub const MAX_CANDIDATES: usize = 64;
const _: () = assert!(MAX_CANDIDATES <= 64, "markers is a u64 bitmask");

/// A fixed-capacity list of candidate pages, filled by [`Prefetcher::on_fault`].
///
/// A candidate may be a *marker*: the caller fetches it like any other candidate but must not
/// inject it into the guest mapping; it stays staged until the guest touches it, which raises a
/// fault the caller resolves locally and reports with [`Prefetcher::on_hit`]. Markers are how a
/// prefetcher whose hits are otherwise invisible (injected) still learns its hit rate, in the
/// spirit of Linux's async read-ahead marker page.
#[derive(Clone, Debug)]
pub struct Candidates {
    pages: [PageNo; MAX_CANDIDATES],
    /// Bit i set = `pages[i]` is a marker.
    markers: u64,
    len: usize,
}

impl Default for Candidates {
    fn default() -> Self {
        Self::new()
    }
}

impl Candidates {
    /// An empty list.
    pub const fn new() -> Self {
        Self {
            pages: [0; MAX_CANDIDATES],
            markers: 0,
            len: 0,
        }
    }
    /// Empties the list for the next decision (no allocation).
    pub fn clear(&mut self) {
        self.len = 0;
        self.markers = 0;
    }
    /// Appends `page` as a marker (see the type's documentation).
    pub fn push_marker(&mut self, page: PageNo) -> bool {
        let added = self.push(page);
        if added {
            self.markers |= 1 << (self.len - 1);
        }
        added
    }
    /// Turns the i-th candidate into a marker (no-op if out of range).
    pub fn set_marker(&mut self, i: usize) {
        if i < self.len {
            self.markers |= 1 << i;
        }
    }
    /// Whether the i-th candidate is a marker.
    pub fn is_marker(&self, i: usize) -> bool {
        i < self.len && self.markers & (1 << i) != 0
    }
    /// `(page, is_marker)` for each candidate, in order.
    pub fn iter(&self) -> impl Iterator<Item = (PageNo, bool)> + '_ {
        self.as_slice()
            .iter()
            .enumerate()
            .map(|(i, &p)| (p, self.is_marker(i)))
    }
    /// Appends `page` unless the list is full or already holds it; returns whether it was added.
    pub fn push(&mut self, page: PageNo) -> bool {
        if self.len == MAX_CANDIDATES || self.as_slice().contains(&page) {
            return false;
        }
        self.pages[self.len] = page;
        self.len += 1;
        true
    }
    /// Appends `page`, which the caller knows is not in the list yet (pages of one arithmetic
    /// progression, say): O(1) where [`Candidates::push`] scans the list. Returns whether it
    /// was added (false only when full). A duplicate breaks no memory safety, only the
    /// no-duplicates promise; debug builds check it.
    pub fn push_distinct(&mut self, page: PageNo) -> bool {
        debug_assert!(
            !self.as_slice().contains(&page),
            "push_distinct of a duplicate"
        );
        if self.len == MAX_CANDIDATES {
            return false;
        }
        self.pages[self.len] = page;
        self.len += 1;
        true
    }
    /// Appends up to `n` pages `first, first+step, first+2·step, ...` (`step` ≠ 0), stopping at
    /// the end of the u64 page range or of the list's capacity; returns how many were added.
    /// Like [`Candidates::push_distinct`], the caller guarantees none of them is already in the
    /// list. A tight loop with no per-page checks: this is how windows are written.
    pub fn push_progression(&mut self, first: PageNo, step: i64, n: usize) -> usize {
        if step == 0 {
            return usize::from(n > 0 && self.push(first));
        }
        let mag = step.unsigned_abs();
        let fits = if step > 0 {
            (u64::MAX - first) / mag
        } else {
            first / mag
        };
        let room = MAX_CANDIDATES - self.len;
        let n = n.min(room).min(
            usize::try_from(fits)
                .unwrap_or(usize::MAX)
                .saturating_add(1),
        );
        let base = self.len;
        for (i, slot) in self.pages[base..base + n].iter_mut().enumerate() {
            *slot = first.wrapping_add((i as u64).wrapping_mul(step as u64));
        }
        debug_assert!(
            self.pages[base..base + n]
                .iter()
                .all(|p| !self.pages[..base].contains(p)),
            "push_progression of a duplicate"
        );
        self.len += n;
        n
    }
    /// Like [`Candidates::push_distinct`], as a marker.
    pub fn push_distinct_marker(&mut self, page: PageNo) -> bool {
        let added = self.push_distinct(page);
        if added {
            self.markers |= 1 << (self.len - 1);
        }
        added
    }
    /// The candidate pages, in the order proposed.
    pub fn as_slice(&self) -> &[PageNo] {
        &self.pages[..self.len]
    }
    /// How many candidates there are.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A prefetch policy with per-process state.
///
/// Contract (relied on by `farvm-ept` and the trace evaluator):
/// - `on_fault` is called for every demand miss the caller can observe, in order, and fills
///   `out` (cleared first by the prefetcher) with pages worth fetching now, nearest first.
/// - `on_hit` is called when a page this prefetcher proposed is used for the first time, when the
///   caller can observe it (see [`HitVisibility`]).
/// - Neither allocates.
pub trait Prefetcher: Send {
    /// Short stable name used on the command line and in tables (`leap`, `stream`, ...).
    fn name(&self) -> &'static str;
    /// A demand miss on `page` by `key` at time `now`.
    fn on_fault(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates);
    /// The first use of a page proposed earlier.
    fn on_hit(&mut self, key: ProcessKey, page: PageNo, now: Nanos);
    /// The first use of a *marker* page proposed earlier (the guest touched it and faulted; the
    /// caller resolved it locally). Like [`Prefetcher::on_hit`], but the prefetcher may answer
    /// with the next window, as Linux's async read-ahead does when it reaches its marker: this
    /// keeps a stream's pipeline full without waiting for a demand miss. Callers that can fetch
    /// at a marker fault should call this instead of `on_hit`; the default forwards to `on_hit`
    /// and proposes nothing, so callers that only call `on_hit` stay correct (one miss per
    /// window instead of none).
    fn on_marker_hit(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        out.clear();
        self.on_hit(key, page, now);
    }
    /// The first use of a page proposed earlier whose fetch is still under way: a *late hit*
    /// (the guest waits for it). Like [`Prefetcher::on_hit`], but it says the guest caught up
    /// with the prefetcher's pipeline, so the prefetcher may answer with pages further ahead.
    /// The default forwards to `on_hit` and proposes nothing.
    fn on_late_hit(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        out.clear();
        self.on_hit(key, page, now);
    }
    /// The process is gone; drop its state.
    fn forget(&mut self, key: ProcessKey);
}

/// What the caller can see of prefetch hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HitVisibility {
    /// Every first use of a prefetched page is reported (a kernel swap cache sees them).
    Visible,
    /// Prefetched pages are injected into the guest mapping; a hit raises no fault, so only what
    /// the design exposes (e.g. marker pages left to fault) is reported.
    Injected,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_progressions_stop_at_range_and_capacity() {
        let mut c = Candidates::new();
        assert_eq!(c.push_progression(u64::MAX - 5, 2, 10), 3);
        assert_eq!(c.as_slice(), &[u64::MAX - 5, u64::MAX - 3, u64::MAX - 1]);
        c.clear();
        assert_eq!(c.push_progression(10, -3, 10), 4);
        assert_eq!(c.as_slice(), &[10, 7, 4, 1]);
        c.clear();
        assert_eq!(c.push_progression(0, 1, 100), MAX_CANDIDATES);
        assert!(!c.push(1000));
        c.clear();
        assert!(c.push_marker(5));
        assert!(!c.push(5), "push deduplicates");
        c.set_marker(7);
        assert_eq!(c.iter().collect::<Vec<_>>(), [(5, true)]);
    }
}
