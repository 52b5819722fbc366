//! The anonymous backing's per-page move history, for diagnosing where a page's frame went:
//! kept only with `FARVM_ANON_TRACE=1` or `2` (off, it costs one branch per move). Each guest
//! page keeps its last [`DEPTH`] moves (what, how many pages in the call, which thread, when);
//! a page whose frame is not where the engine thinks it is gets its history logged. With `2`,
//! every install and eviction move is also checked against the kernel's page tables
//! (mincore, a syscall per move: it changes the timing it observes).

use std::cell::Cell;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Instant;

/// Moves kept per page.
const DEPTH: usize = 8;

/// What happened to a page (its frame or its bookkeeping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Move {
    /// Install: its frame moved (or was copied) into the guest view; `mapped` set.
    In = 1,
    /// Install found the guest view holding a frame already (EEXIST); `mapped` set.
    InExists,
    /// Install found no frame at the landing place but one in the guest view; `mapped` set.
    InNoSource,
    /// Install found no frame anywhere.
    InNothing,
    /// Eviction: its frame moved out of the guest view to a pool slot; `mapped` cleared.
    OutPool,
    /// Eviction: its frame moved out of the guest view to its staging slot; `mapped` cleared.
    OutStaging,
    /// Eviction found no frame in the guest view (ENOENT); `mapped` cleared.
    OutNothing,
    /// Eviction refused by the kernel (EBUSY).
    OutBusy,
    /// The landing frame left a pool slot for the staging slot (settle / unpool).
    ToStaging,
    /// Freed (its frame to the pool or dropped).
    Freed,
    /// Given a landing place by the fault handler.
    Assigned,
    /// An install checked right after it found no frame in the guest view.
    InButAbsent,
}

impl Move {
    fn name(v: u8) -> &'static str {
        const NAMES: [&str; 13] = [
            "?",
            "in",
            "in-exists",
            "in-no-source",
            "in-nothing",
            "out-pool",
            "out-staging",
            "out-nothing",
            "out-busy",
            "to-staging",
            "freed",
            "assigned",
            "in-but-absent",
        ];
        NAMES.get(usize::from(v)).copied().unwrap_or("?")
    }
}

thread_local! {
    static TID: Cell<u32> = const { Cell::new(0) };
}

fn tid() -> u32 {
    TID.with(|t| {
        if t.get() == 0 {
            // SAFETY: gettid has no preconditions.
            t.set(unsafe { libc::gettid() } as u32);
        }
        t.get()
    })
}

/// The history of every guest page.
pub(crate) struct MoveTrace {
    start: Instant,
    /// Per page, [`DEPTH`] records: move (8 bits) | pages in the call (8) | thread id's low
    /// 16 bits | microseconds since start (32).
    records: Box<[[AtomicU64; DEPTH]]>,
    next: Box<[AtomicU8]>,
    /// Check every move against the page tables (`FARVM_ANON_TRACE=2`).
    pub checks: bool,
}

impl MoveTrace {
    /// A trace of `pages` pages if `FARVM_ANON_TRACE` is 1 or 2.
    pub fn from_env(pages: u64) -> Option<Self> {
        let checks = match std::env::var("FARVM_ANON_TRACE").ok().as_deref() {
            Some("1") => false,
            Some("2") => true,
            _ => return None,
        };
        tracing::warn!(
            checks,
            "FARVM_ANON_TRACE: every anonymous-memory move is recorded"
        );
        Some(Self::new(pages, checks))
    }

    /// An empty trace of `pages` pages.
    fn new(pages: u64, checks: bool) -> Self {
        Self {
            checks,
            start: Instant::now(),
            records: (0..pages)
                .map(|_| core::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            next: (0..pages).map(|_| AtomicU8::new(0)).collect(),
        }
    }

    /// Records `what` for pages `[p, p+n)`.
    pub fn record(&self, p: u64, n: u64, what: Move) {
        let us = self.start.elapsed().as_micros() as u64 & 0xFFFF_FFFF;
        let v = (what as u64) << 56 | n.min(255) << 48 | u64::from(tid() & 0xFFFF) << 32 | us;
        for q in p..p + n {
            let Some(slots) = self.records.get(q as usize) else {
                return;
            };
            let i = self.next[q as usize].fetch_add(1, Ordering::Relaxed) as usize % DEPTH;
            slots[i].store(v, Ordering::Relaxed);
        }
    }

    /// Page `p`'s history, oldest first: `move(pages)@thread+µs`.
    pub fn history(&self, p: u64) -> String {
        let Some(slots) = self.records.get(p as usize) else {
            return String::new();
        };
        let next = self.next[p as usize].load(Ordering::Relaxed) as usize;
        let mut s = format!("now +{}us:", self.start.elapsed().as_micros());
        for k in 0..DEPTH {
            let v = slots[(next + k) % DEPTH].load(Ordering::Relaxed);
            if v == 0 {
                continue;
            }
            let _ = write!(
                s,
                " {}({})@{}+{}us",
                Move::name((v >> 56) as u8),
                (v >> 48) & 0xFF,
                (v >> 32) & 0xFFFF,
                v & 0xFFFF_FFFF
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_keeps_its_last_moves_oldest_first() {
        let t = MoveTrace::new(4, false);
        t.record(1, 2, Move::In);
        for _ in 0..DEPTH {
            t.record(2, 1, Move::OutPool);
        }
        t.record(2, 1, Move::OutNothing);
        let h1 = t.history(1);
        assert!(h1.contains(" in(2)@"), "{h1}");
        let h2 = t.history(2);
        assert!(!h2.contains(" in("), "the oldest move is overwritten: {h2}");
        assert!(
            h2.trim_end()
                .split(' ')
                .next_back()
                .unwrap()
                .starts_with("out-nothing(1)"),
            "{h2}"
        );
        assert!(!t.history(0).contains('('), "page 0 never moved");
    }
}
