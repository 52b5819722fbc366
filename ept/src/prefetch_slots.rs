//! Prefetch reads in flight, against the cap `EngineConfig::max_prefetch_inflight`: taken by
//! the fault handler when it issues a prefetch read, given back by the completion path when the
//! read issued as a prefetch completes (whatever became of the page meanwhile: the state word's
//! `F_PF_READ` flag says which reads hold a slot).

use std::sync::atomic::{AtomicU64, Ordering};

pub(crate) struct PrefetchSlots {
    in_flight: AtomicU64,
    cap: u64,
}

impl PrefetchSlots {
    pub fn new(cap: u64) -> Self {
        Self {
            in_flight: AtomicU64::new(0),
            cap,
        }
    }

    /// Whether the cap is reached (markers may exceed it: they carry the learning signal).
    #[inline]
    pub fn full(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) >= self.cap
    }

    #[inline]
    pub fn take(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    #[inline]
    pub fn give_back(&self) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }
}
