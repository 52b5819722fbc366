//! The frame budget: how many guest pages are resident (hold a memfd page) against the
//! local-memory budget, and the marks the evictor works between. Every page that becomes
//! resident takes a frame here first ([`Frames::try_reserve`]) and gives it back when it is
//! freed or its read is abandoned.
//!
//! Marks, from the top: `budget` (demand faults may fill up to here: the free reserve is
//! theirs) > `low_water` = budget − reserve (prefetches may fill up to here) > `evict_start`
//! (the evictor wakes above it) > `evict_target` (and evicts down to here): the headroom
//! between low water and the target lets prefetches keep finding frames while the evictor
//! works in batches.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::thread::Thread;

use crate::config::{ConfigError, EngineConfig};

/// Prefetch reads in flight the headroom below low water is sized for, at most: a larger cap
/// lets more reads wait for frames instead of lowering what stays resident (measured: sizing
/// it for 256 cost the key-value workload at 50% local 14% more demand faults).
const HEADROOM_INFLIGHT: u64 = 128;

pub(crate) struct Frames {
    resident: AtomicU64,
    budget: u64,
    reserve: u64,
    low_water: u64,
    evict_start: u64,
    evict_target: u64,
    /// Everything fits: no evictor runs.
    unlimited: bool,
    evictor: OnceLock<Thread>,
}

impl Frames {
    pub fn new(cfg: &EngineConfig) -> Result<Self, ConfigError> {
        let (budget, reserve) = cfg.resolve()?;
        let unlimited = budget >= cfg.total_pages();
        let (reserve, low_water) = if unlimited {
            (0, budget)
        } else {
            (reserve, budget - reserve)
        };
        // Prefetch headroom below the low-water mark: the larger of the in-flight cap (at most
        // HEADROOM_INFLIGHT), two eviction batches and 1/8 of the budget, at most a quarter of
        // it (small budgets). The evictor then works in batches while prefetches keep finding
        // frames.
        let headroom = (cfg.max_prefetch_inflight as u64)
            .min(HEADROOM_INFLIGHT)
            .max(cfg.evict_batch as u64 * 2)
            .max(low_water / 8)
            .min(low_water / 4);
        Ok(Self {
            resident: AtomicU64::new(0),
            budget,
            reserve,
            low_water,
            evict_start: low_water.saturating_sub(headroom / 2),
            evict_target: low_water.saturating_sub(headroom),
            unlimited,
            evictor: OnceLock::new(),
        })
    }

    /// Takes one resident frame: demand may use the reserve, prefetch may not. Wakes the
    /// evictor once residency passes its start mark.
    #[inline]
    pub fn try_reserve(&self, demand: bool) -> bool {
        let limit = if demand { self.budget } else { self.low_water };
        let ok = self
            .resident
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                (r < limit).then_some(r + 1)
            })
            .is_ok();
        if self.resident.load(Ordering::Relaxed) > self.evict_start {
            self.wake_evictor();
        }
        ok
    }

    /// Gives a frame back (its page was freed, or its read abandoned).
    #[inline]
    pub fn release(&self) {
        self.resident.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn resident(&self) -> u64 {
        self.resident.load(Ordering::Acquire)
    }

    /// A demand reservation (`try_reserve(true)`) would find a frame now.
    pub fn demand_frame_free(&self) -> bool {
        self.resident() < self.budget
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    pub fn evict_start(&self) -> u64 {
        self.evict_start
    }

    pub fn evict_target(&self) -> u64 {
        self.evict_target
    }

    pub fn unlimited(&self) -> bool {
        self.unlimited
    }

    /// Names the evictor thread, for [`Frames::wake_evictor`] (once).
    pub fn set_evictor(&self, t: Thread) {
        let _ = self.evictor.set(t);
    }

    pub fn wake_evictor(&self) {
        if let Some(t) = self.evictor.get() {
            t.unpark();
        }
    }
}
