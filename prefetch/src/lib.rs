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

/// A fixed-capacity list of candidate pages, filled by [`Prefetcher::on_fault`].
#[derive(Clone, Debug)]
pub struct Candidates {
    pages: [PageNo; MAX_CANDIDATES],
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
            len: 0,
        }
    }
    pub fn clear(&mut self) {
        self.len = 0;
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
