//! Refault distance, standing in for hardware accessed bits (as Linux's workingset does for the
//! page cache): the eviction clock (pages evicted so far) and, per page, its reading at the
//! page's last eviction. A page demand-faulted back fewer than one budget's worth of evictions
//! after it left was part of the working set: a little more memory would have kept it.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub(crate) struct RefaultClock {
    /// Per page: the eviction clock at its last eviction + 1 (0 = never evicted).
    evicted_at: Box<[AtomicU32]>,
    /// Pages evicted so far.
    evictions: AtomicU64,
    /// Refaults closer than this many evictions are hot (the budget in pages).
    window: u64,
    enabled: bool,
}

impl RefaultClock {
    pub fn new(pages: u64, window: u64, enabled: bool) -> Self {
        Self {
            evicted_at: (0..pages).map(|_| AtomicU32::new(0)).collect(),
            evictions: AtomicU64::new(0),
            window,
            enabled,
        }
    }

    /// Advances the clock for the eviction of page `p` (called by its evictor).
    pub fn record_eviction(&self, p: u64) {
        let seq = self.evictions.fetch_add(1, Ordering::Relaxed);
        self.evicted_at[p as usize].store((seq as u32).wrapping_add(1).max(1), Ordering::Relaxed);
    }

    /// Whether faulting page `p` back now is a refault within the working set.
    pub fn is_hot(&self, p: u64) -> bool {
        if !self.enabled {
            return false;
        }
        let at = self.evicted_at[p as usize].load(Ordering::Relaxed);
        if at == 0 {
            return false;
        }
        let now = (self.evictions.load(Ordering::Relaxed) as u32).wrapping_add(1);
        (now.wrapping_sub(at) as u64) < self.window
    }
}
