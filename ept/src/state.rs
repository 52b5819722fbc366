//! The page-state table: one `AtomicU32` per guest page, changed only by compare-and-swap, so
//! the fault handler, the completion path, the evictor and VMM accesses coordinate without a
//! lock. Whoever moves a page into `INFLIGHT` or `EVICTING` owns its data until it moves it out.
//!
//! Word layout: bits 0–3 state, bits 4–11 flags, bits 16–31 pin count (VMM accesses and agent
//! slots; a pinned page is never evicted).
//!
//! States (the brief's list maps as: never touched = `NEVER`, remote = `REMOTE`, in flight =
//! `INFLIGHT`, local = `LOCAL`, local-prefetched-unused = `LOCAL|PREFETCHED` or `STAGED`;
//! data gone from every memory server = `LOST`; "dirty" is not a state: it is decided
//! race-free from content at eviction, see `evict.rs`).
//!
//! Who moves a page between states: the fault handler (`fault`, its transition table), the
//! completion path (`complete`), the evictor (`evict`), VMM accesses (`access`), and the
//! installer's publish (`installer`: any owned state → `LOCAL`).

use std::sync::atomic::{AtomicU32, Ordering};

/// Never written by anyone: reads as zeros, served locally with no network trip.
pub const NEVER: u32 = 0;
/// Not resident; the memory server holds the only copy.
pub const REMOTE: u32 = 1;
/// A read (or zero fill) is under way; faults on it wait for the same completion.
pub const INFLIGHT: u32 = 2;
/// Resident and mapped into the guest view (or about to be, see the fault handler).
pub const LOCAL: u32 = 3;
/// A prefetched *marker* page: resident in the memfd but deliberately not mapped, so the
/// guest's first touch faults and reveals the hit.
pub const STAGED: u32 = 4;
/// Being evicted: unmapped from the guest view; the evictor owns it.
pub const EVICTING: u32 = 5;
/// The page's data exists nowhere it can be trusted: the memory servers no longer hold it
/// (every replica restarted empty, or a server answered "absent" or a wrong copy for a page
/// the engine wrote back), or its local frame was not where the engine left it (a batch free
/// that failed part-way, a frame gone from the guest view). Terminal: nothing reads it
/// again, a guest fault on it is reported to the VMM (`Engine::on_page_lost`) and left
/// waiting, a VMM access fails with `EngineError::PageLost`. Never zero-filled: that would be
/// silent corruption.
pub const LOST: u32 = 6;

const STATE_MASK: u32 = 0xF;

/// Came in by prefetch and no use has been seen yet.
pub const F_PREFETCHED: u32 = 1 << 4;
/// For `INFLIGHT` prefetches: stage instead of injecting on arrival.
pub const F_MARKER: u32 = 1 << 5;
// Bit 6 is free.
/// CLOCK reference bit, set at install, cleared by the evictor's sweep (second chance).
pub const F_REF: u32 = 1 << 7;
/// A guest fault is pending on this page (set by the fault handler on `INFLIGHT`/`EVICTING`).
pub const F_WAITERS: u32 = 1 << 8;
/// `INFLIGHT` for a demand fault or a VMM access (not a prefetch).
pub const F_DEMAND: u32 = 1 << 9;
/// The outstanding read was issued as a prefetch (kept until it completes, for accounting).
pub const F_PF_READ: u32 = 1 << 10;
/// A staged page chosen by the engine's sampler (not by the prefetcher): an unbiased sample of
/// all prefetches, used to estimate the hit rate of the injected ones.
pub const F_PROBE: u32 = 1 << 11;
/// Refaulted soon after its eviction (within one budget's worth of evictions): part of the
/// working set. A 2-bit count of extra CLOCK sweeps it survives (set to 3 on a hot refault).
pub const F_HOT: u32 = 3 << 12;
pub const HOT_ONE: u32 = 1 << 12;

const PIN_SHIFT: u32 = 16;
pub const PIN_ONE: u32 = 1 << PIN_SHIFT;

#[inline]
pub fn state_of(w: u32) -> u32 {
    w & STATE_MASK
}

#[inline]
pub fn pins_of(w: u32) -> u32 {
    w >> PIN_SHIFT
}

#[cfg(test)]
fn with_state(w: u32, s: u32) -> u32 {
    (w & !STATE_MASK) | s
}

/// Keeps only the pin count of `w` (flags are per-residency and reset on transitions).
#[inline]
pub fn pins_only(w: u32) -> u32 {
    w & !(PIN_ONE - 1)
}

/// A page's paging state, as reported to the VMM and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PageState {
    /// Never written: reads as zeros, filled locally.
    Never,
    /// Not resident; a memory server holds the only copy.
    Remote,
    /// A read or zero fill is under way.
    InFlight,
    /// Resident and mapped into the guest view.
    Local {
        /// Held resident by a VMM access or an agent slot (never evicted).
        pinned: bool,
        /// Brought in by a prefetch and not touched yet.
        prefetched: bool,
    },
    /// A prefetched marker: resident but unmapped until the guest's first touch.
    Staged,
    /// Being evicted (unmapped; the evictor owns it).
    Evicting,
    /// Its data is gone from every memory server (the page-state table's `LOST`).
    Lost,
}

impl PageState {
    pub(crate) fn from_word(w: u32) -> Self {
        match state_of(w) {
            NEVER => Self::Never,
            REMOTE => Self::Remote,
            INFLIGHT => Self::InFlight,
            LOCAL => Self::Local {
                pinned: pins_of(w) > 0,
                prefetched: w & F_PREFETCHED != 0,
            },
            STAGED => Self::Staged,
            LOST => Self::Lost,
            _ => Self::Evicting,
        }
    }
}

/// Lock-free table of page words.
pub struct PageTable {
    words: Box<[AtomicU32]>,
}

impl PageTable {
    pub fn new(pages: u64) -> Self {
        Self {
            words: (0..pages).map(|_| AtomicU32::new(NEVER)).collect(),
        }
    }

    pub fn len(&self) -> u64 {
        self.words.len() as u64
    }

    #[inline]
    pub fn load(&self, p: u64) -> u32 {
        self.words[p as usize].load(Ordering::Acquire)
    }

    /// CAS `cur -> new`; on failure returns the current word.
    #[inline]
    pub fn cas(&self, p: u64, cur: u32, new: u32) -> Result<(), u32> {
        self.words[p as usize]
            .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| ())
    }

    /// Applies `f` until it returns `None` (give up, returns the word seen) or the CAS lands
    /// (returns `Ok((old, new))`).
    #[inline]
    pub fn update(&self, p: u64, mut f: impl FnMut(u32) -> Option<u32>) -> Result<(u32, u32), u32> {
        let mut cur = self.load(p);
        loop {
            let new = f(cur).ok_or(cur)?;
            match self.cas(p, cur, new) {
                Ok(()) => return Ok((cur, new)),
                Err(seen) => cur = seen,
            }
        }
    }

    /// Adds a pin if the page is `LOCAL` (returns false otherwise: make it resident first).
    pub fn try_pin(&self, p: u64) -> bool {
        self.update(p, |w| {
            (state_of(w) == LOCAL && pins_of(w) < 0xFFFF).then(|| w + PIN_ONE)
        })
        .is_ok()
    }

    pub fn unpin(&self, p: u64) {
        let _ = self.update(p, |w| (pins_of(w) > 0).then(|| w - PIN_ONE));
    }

    /// Counts pages per state (for snapshots and tests; O(pages)).
    pub fn census(&self) -> [u64; 6] {
        let mut c = [0u64; 6];
        for w in self.words.iter() {
            let s = state_of(w.load(Ordering::Relaxed)) as usize;
            if s < c.len() {
                c[s] += 1;
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_only_on_local_and_blocks_nothing_else() {
        let t = PageTable::new(4);
        assert!(!t.try_pin(0), "NEVER pages cannot be pinned");
        t.cas(0, NEVER, LOCAL | F_REF).unwrap();
        assert!(t.try_pin(0));
        assert!(t.try_pin(0));
        assert_eq!(pins_of(t.load(0)), 2);
        assert_eq!(state_of(t.load(0)), LOCAL);
        // An evictor CAS that expects pins == 0 fails.
        assert!(t.cas(0, LOCAL | F_REF, EVICTING).is_err());
        t.unpin(0);
        t.unpin(0);
        assert_eq!(t.load(0), LOCAL | F_REF);
        t.unpin(0);
        assert_eq!(
            t.load(0),
            LOCAL | F_REF,
            "unpin of an unpinned page is a no-op"
        );
    }

    #[test]
    fn update_gives_up_on_none() {
        let t = PageTable::new(1);
        assert_eq!(t.update(0, |_| None), Err(NEVER));
        assert_eq!(
            t.update(0, |w| Some(with_state(w, REMOTE))),
            Ok((NEVER, REMOTE))
        );
        assert_eq!(t.census()[REMOTE as usize], 1);
    }
}
