//! The error log: errors of the engine's threads (store failures, lost pages, OS calls that
//! failed), counted, kept for [`crate::Engine::take_errors`] (the first [`MAX_KEPT_ERRORS`]
//! since the last take) and logged at a bounded rate.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::clock::Clock;
use crate::error::EngineError;

/// Errors kept for `Engine::take_errors` (oldest first; later ones are counted, not kept).
const MAX_KEPT_ERRORS: usize = 256;

pub(crate) struct ErrorLog {
    kept: Mutex<VecDeque<EngineError>>,
    total: AtomicU64,
    /// When an error was last logged (ns, [`Clock`]).
    logged_at: AtomicU64,
    /// Errors not logged since then.
    unlogged: AtomicU64,
    clock: Clock,
}

impl ErrorLog {
    pub fn new(clock: Clock) -> Self {
        Self {
            kept: Mutex::new(VecDeque::new()),
            total: AtomicU64::new(0),
            logged_at: AtomicU64::new(0),
            unlogged: AtomicU64::new(0),
            clock,
        }
    }

    /// Records an error: counted, kept and logged — the first ten, then at most one line a
    /// second with the number left unlogged, because a store that is unavailable fails every
    /// retry of every waiting page.
    pub fn push(&self, e: EngineError) {
        let n = self.total.fetch_add(1, Ordering::Relaxed) + 1;
        let now = self.clock.now();
        let last = self.logged_at.load(Ordering::Relaxed);
        if n <= 10
            || (now.saturating_sub(last) >= 1_000_000_000
                && self
                    .logged_at
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok())
        {
            self.logged_at.store(now, Ordering::Relaxed);
            match self.unlogged.swap(0, Ordering::Relaxed) {
                0 => tracing::warn!("{e}"),
                quiet => tracing::warn!("{e} ({quiet} more errors since the last one logged)"),
            }
        } else {
            self.unlogged.fetch_add(1, Ordering::Relaxed);
        }
        if let Ok(mut q) = self.kept.lock() {
            if q.len() < MAX_KEPT_ERRORS {
                q.push_back(e);
            }
        }
    }

    /// The kept errors, oldest first; the log starts keeping afresh.
    pub fn take(&self) -> Vec<EngineError> {
        self.kept
            .lock()
            .map(|mut q| q.drain(..).collect())
            .unwrap_or_default()
    }

    /// Errors ever recorded (including ones not kept).
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }
}
