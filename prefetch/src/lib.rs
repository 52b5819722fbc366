//! farvm-prefetch: decides which guest pages to fetch before the guest asks for them.
//!
//! This crate is pure: no I/O, no KVM, no sockets, no clocks. Callers feed it faults
//! (`process key`, `page`, `time`) and hit notifications, and it answers with candidate pages.
//! A decision allocates nothing: candidates are written into a caller-owned [`Candidates`].

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
    pub const fn new() -> Self {
        Self {
            pages: [0; MAX_CANDIDATES],
            markers: 0,
            len: 0,
        }
    }
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
    pub fn as_slice(&self) -> &[PageNo] {
        &self.pages[..self.len]
    }
    pub fn len(&self) -> usize {
        self.len
    }
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
    /// The process is gone; drop its state.
    fn forget(&mut self, key: ProcessKey);
}

/// What the caller can see of prefetch hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HitVisibility {
    /// Every first use of a prefetched page is reported (a kernel swap cache sees them).
    Visible,
    /// Prefetched pages are injected into the guest mapping; a hit raises no fault, so only what
    /// the design exposes (e.g. marker pages left to fault) is reported.
    Injected,
}
