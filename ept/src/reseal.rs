//! The re-seal sweep of a key rotation (docs/sealing.md, "Rotation"): once the store says its
//! key was rotated ([`crate::store::RemoteStore::reseal_wanted`]), every page with a stored
//! copy is re-sealed under the new key, in page order, and the store is told when none is
//! left under the old one.
//!
//! It runs on the evictor thread, a few pages per turn of its loop ([`PAGES_PER_TURN`] when the
//! evictor is idle, one while it evicts): the evictor is the only thread that writes pages
//! back, so no write-back of a page can overtake its re-seal and leave older content on the
//! servers. The fault path never waits for it: a fault on a page being re-sealed reads it
//! under either key. Owned here: the sweep's progress ([`ResealProgress`], shared with the
//! engine's stats) and the evictor's sweep state ([`Sweep`]).
//!
//! No per-page state: the cursor is the count. Pages below it were re-sealed by the sweep or
//! written back after the rotation (under the new key), pages at or above it may still be
//! under the old key. A page whose read or write-back is in flight when the cursor reaches it
//! is waited for (the cursor stays), and the sweep starts only once every eviction round
//! started before the rotation was noticed has finished: its write-backs may have been sealed
//! under the old key.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use crate::pagemeta::{version_of, PageMeta, UNKNOWN_FP};
use crate::port::StorePort;
use crate::state::{self as st, state_of, PageTable};
use crate::stats::{Counter, Counters};

/// Pages re-sealed per turn of the evictor's loop when it has nothing to evict (two round
/// trips each, on the evictor's thread).
pub(crate) const PAGES_PER_TURN: usize = 32;

/// The sweep's progress, read by the engine's stats.
#[derive(Default)]
pub(crate) struct ResealProgress {
    running: AtomicBool,
    /// The next page to re-seal.
    cursor: AtomicU64,
}

impl ResealProgress {
    /// Whether a sweep runs, and the pages at or above its cursor that have a stored copy
    /// (those may still be under the old key).
    pub fn left(&self, table: &PageTable, meta: &PageMeta) -> Option<u64> {
        if !self.running.load(Ordering::Acquire) {
            return None;
        }
        let from = self.cursor.load(Ordering::Acquire);
        Some(
            (from..table.len())
                .filter(|&p| has_stored_copy(table.load(p), meta.clean_fp(p)))
                .count() as u64,
        )
    }
}

/// Whether a page in state word `w` with clean fingerprint `fp` may have a stored copy.
fn has_stored_copy(w: u32, fp: crate::hash::Fingerprint) -> bool {
    !matches!(state_of(w), st::NEVER | st::LOST) && fp != UNKNOWN_FP
}

/// What a turn of the sweep left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// No sweep runs or is pending.
    Idle,
    /// Pages are left and the next can be re-sealed at once.
    More,
    /// Pages are left, but the sweep waits (for older rounds, or a page in flight).
    Waiting,
}

/// What the next page needs.
enum Next {
    /// Nothing stored, or re-sealed: the cursor moves on.
    Done,
    /// Its read or write-back is in flight: try again next turn.
    Wait,
}

/// The evictor's side of the sweep.
pub(crate) struct Sweep {
    table: Arc<PageTable>,
    meta: Arc<PageMeta>,
    port: Arc<StorePort>,
    counters: Arc<Counters>,
    progress: Arc<ResealProgress>,
    /// When the evictor noticed the rotation (its clock, ns); `None`: no sweep pending.
    noticed: Option<u64>,
}

impl Sweep {
    pub fn new(
        table: Arc<PageTable>,
        meta: Arc<PageMeta>,
        port: Arc<StorePort>,
        counters: Arc<Counters>,
        progress: Arc<ResealProgress>,
    ) -> Self {
        Self {
            table,
            meta,
            port,
            counters,
            progress,
            noticed: None,
        }
    }

    /// One turn: notices a rotation at `now`, starts the sweep once no round older than that
    /// is in flight (`oldest_round`: when the oldest round still in flight started), and
    /// re-seals up to `budget` pages.
    pub fn turn(&mut self, now: u64, oldest_round: Option<u64>, budget: usize) -> Turn {
        let running = self.progress.running.load(Ordering::Relaxed);
        if !running {
            if self.noticed.is_none() {
                if !self.port.reseal_wanted() {
                    return Turn::Idle;
                }
                self.noticed = Some(now);
            }
            if matches!((oldest_round, self.noticed), (Some(o), Some(n)) if o <= n) {
                return Turn::Waiting;
            }
            self.progress.cursor.store(0, Ordering::Release);
            self.progress.running.store(true, Ordering::Release);
            tracing::info!("key rotated: re-sealing the stored pages under the new key");
        }
        let pages = self.table.len();
        for _ in 0..budget {
            let p = self.progress.cursor.load(Ordering::Relaxed);
            if p >= pages {
                self.finish();
                return Turn::Idle;
            }
            match self.reseal(p) {
                Next::Done => self.progress.cursor.store(p + 1, Ordering::Release),
                Next::Wait => return Turn::Waiting,
            }
        }
        Turn::More
    }

    fn reseal(&self, p: u64) -> Next {
        let w = self.table.load(p);
        match state_of(w) {
            st::INFLIGHT | st::EVICTING => return Next::Wait,
            _ if !has_stored_copy(w, self.meta.clean_fp(p)) => return Next::Done,
            _ => {}
        }
        // REMOTE, LOCAL or STAGED: the stored copy is the one the clean fingerprint names, and
        // only this thread could write it again.
        match self.port.reseal(p, version_of(self.meta.clean_fp(p))) {
            Ok(true) => {
                self.counters.inc(Counter::ResealedPages);
                Next::Done
            }
            Ok(false) => Next::Done,
            Err(e) => {
                self.counters.inc(Counter::ResealFailed);
                let failed = self.counters.get(Counter::ResealFailed);
                if failed.is_power_of_two() {
                    tracing::warn!(page = p, failed, "re-seal failed, retried: {e}");
                }
                Next::Wait
            }
        }
    }

    fn finish(&mut self) {
        self.port.reseal_finished();
        self.noticed = None;
        self.progress.running.store(false, Ordering::Release);
        self.counters.inc(Counter::ResealSweeps);
        tracing::info!("every stored page is re-sealed under the new key");
    }
}
