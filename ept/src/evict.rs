//! The evictor thread: keeps resident pages below the low-water mark (budget minus the free
//! reserve) with some prefetch headroom, so demand faults find a free frame and never reclaim
//! inline, and prefetches find frames too.
//!
//! Victim order: (1) consumed prefetches — staged pages the guest touched, and late hits —
//! first, as in Leap's eager eviction; (2) a CLOCK sweep over the page table: every resident
//! page gets one second chance after install (its reference bit), unpinned pages only. Without
//! hardware accessed bits (no page_idle on this kernel, and sampling by unmapping costs a
//! 55–115 µs guest fault each here) that alone is FIFO by install time with a second chance, so
//! (3) refault distance stands in for the accessed bit: a page demand-faulted back within one
//! budget's worth of evictions since it was evicted (Linux's workingset test) is marked hot and
//! survives up to three more sweeps. Measured in `benches/fault_path.rs` (table 5).
//!
//! One round, for up to `evict_batch` victims:
//! 1. claim: CAS `LOCAL|STAGED (unpinned) -> EVICTING` (the evictor now owns the page);
//! 2. zap the guest view (one vectored MADV_DONTNEED): from here the guest cannot write the
//!    page, its data stays in the memfd, and a guest touch faults (MINOR) and waits;
//! 3. dirty check by content: fingerprint the memfd page and compare with the fingerprint of
//!    the remote copy taken at install. This is race-free — it looks at the final content after
//!    the guest lost access, whereas a write tracker (KVM dirty log, uffd async WP +
//!    PAGEMAP_SCAN) harvested *before* the zap misses writes between harvest and zap. It also
//!    catches writes by the VMM and devices, and silent stores stay clean;
//! 4. write back the dirty ones straight from the memfd (no copy), without waiting: up to
//!    [`ROUNDS_IN_FLIGHT`] rounds wait for their write-backs while the next ones are claimed,
//!    zapped and hashed (a write-back waited for inline bounded a write-heavy scan at 25%
//!    local to ~15 µs per page: a round of 49 pages took ~750 µs, 450 µs of it waiting);
//! 5. once a round's write-backs are all done: pages a guest faulted on meanwhile are rescued (mapped again, no I/O); failed write-backs
//!    stay resident; the rest are freed with one vectored MADV_REMOVE and become REMOTE (or
//!    NEVER again if still all-zero and never stored).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Inner;
use crate::error::EngineError;
use crate::state::{self as st, state_of};
use crate::stats::Hist;
use crate::store::{PageBuf, Status, WriteReq};
use crate::PAGE_SIZE;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Verdict {
    /// Same content as the remote copy: drop.
    Clean,
    /// All zero and same as at install (never stored, or stored as zeros): back to NEVER.
    Zero,
    /// Must be written back first.
    Dirty,
    /// Was dirty and its write-back completed: freed like a clean page, counted as dirty.
    Written,
    /// Write-back failed: keep it.
    Keep,
}

struct Victim {
    page: u64,
    /// The word it had when claimed (flags tell prefetch history).
    word: u32,
    fp: u128,
    verdict: Verdict,
}

/// Eviction rounds whose write-backs may be in flight at once. A round waits for its
/// write-backs before freeing its pages; while it waits, the next rounds are claimed, zapped
/// and hashed, so write latency (hundreds of µs on a busy 2-core host) no longer bounds the
/// eviction rate of dirty pages.
const ROUNDS_IN_FLIGHT: usize = 4;

/// One round's victims and buffers (allocated once, reused).
struct Round {
    /// Sorted by page.
    victims: Vec<Victim>,
    pages: Vec<u64>,
    writes: Vec<WriteReq>,
    /// Write-backs submitted and not completed yet.
    pending: usize,
    started: u64,
    /// When the last "still outstanding" warning was logged.
    warned: u64,
}

impl Round {
    fn new(batch: usize) -> Self {
        Self {
            victims: Vec::with_capacity(batch),
            pages: Vec::with_capacity(batch),
            writes: Vec::with_capacity(batch),
            pending: 0,
            started: 0,
            warned: 0,
        }
    }

    fn is_free(&self) -> bool {
        self.victims.is_empty()
    }
}

pub(crate) fn run(inner: Arc<Inner>) {
    let batch = inner.cfg.evict_batch;
    let mut rounds: Vec<Round> = (0..ROUNDS_IN_FLIGHT).map(|_| Round::new(batch)).collect();
    let mut hand: u64 = 0;
    let mut backoff = WriteBackoff::default();
    let target = inner.evict_target;
    // Evicting down to `target` once resident pages passed `evict_start` (hysteresis).
    let mut active = false;
    loop {
        let stopping = inner.stop.load(Ordering::Acquire);
        let in_flight = rounds.iter().any(|r| !r.is_free());
        if stopping && !in_flight {
            return;
        }
        // Pages of unfinished rounds are still counted resident but already on their way out.
        let claimed: u64 = rounds.iter().map(|r| r.victims.len() as u64).sum();
        let resident = inner.resident.load(Ordering::Acquire);
        if resident > inner.evict_start {
            active = true;
        }
        if resident.saturating_sub(claimed) <= target {
            active = false;
        }
        let pause = backoff.remaining(inner.now());
        if pause > 0 && active && !stopping {
            if in_flight {
                wait_write_backs(
                    &inner,
                    &mut rounds,
                    &mut backoff,
                    Duration::from_nanos(pause),
                );
                continue;
            }
            std::thread::park_timeout(Duration::from_nanos(pause));
            continue;
        }
        let free_slot = rounds.iter().position(Round::is_free);
        match (active && !stopping, free_slot) {
            (true, Some(ri)) => {
                let want = batch.min((resident - claimed - target) as usize);
                let r = &mut rounds[ri];
                select(&inner, want.max(1), &mut hand, &mut r.victims);
                if r.victims.is_empty() {
                    // Everything resident is pinned or in flight: wait for completions.
                    if in_flight {
                        wait_write_backs(
                            &inner,
                            &mut rounds,
                            &mut backoff,
                            Duration::from_millis(1),
                        );
                    } else {
                        std::thread::park_timeout(Duration::from_millis(1));
                    }
                    continue;
                }
                start_round(&inner, r, &mut backoff);
                if r.pending == 0 {
                    finish_round(&inner, r);
                }
                // Completions that arrived meanwhile, without blocking.
                wait_write_backs(&inner, &mut rounds, &mut backoff, Duration::ZERO);
            }
            _ if in_flight => {
                wait_write_backs(
                    &inner,
                    &mut rounds,
                    &mut backoff,
                    Duration::from_millis(100),
                );
                if stopping {
                    // Shutting down: keep whatever has not been confirmed written.
                    for r in rounds.iter_mut().filter(|r| !r.is_free()) {
                        for v in r.victims.iter_mut().filter(|v| v.verdict == Verdict::Dirty) {
                            v.verdict = Verdict::Keep;
                        }
                        r.pending = 0;
                        finish_round(&inner, r);
                    }
                }
            }
            _ => std::thread::park_timeout(Duration::from_millis(20)),
        }
    }
}

/// Delivers write-back completions to their rounds (waiting up to `timeout` for the first)
/// and finishes rounds whose write-backs are all done.
fn wait_write_backs(
    inner: &Inner,
    rounds: &mut [Round],
    backoff: &mut WriteBackoff,
    timeout: Duration,
) {
    let first = if timeout.is_zero() {
        inner.wb_rx.try_recv().ok()
    } else {
        inner.wb_rx.recv_timeout(timeout).ok()
    };
    let Some(first) = first else {
        let now = inner.now();
        for r in rounds.iter_mut().filter(|r| r.pending > 0) {
            if now.saturating_sub(r.warned.max(r.started)) > 5_000_000_000 {
                tracing::warn!("{} write-backs still outstanding", r.pending);
                r.warned = now;
            }
        }
        return;
    };
    let mut next = Some(first);
    while let Some(done) = next {
        write_back_done(inner, rounds, backoff, done);
        next = inner.wb_rx.try_recv().ok();
    }
}

/// Applies one write-back completion to the round that owns its page.
fn write_back_done(
    inner: &Inner,
    rounds: &mut [Round],
    backoff: &mut WriteBackoff,
    done: crate::store::Completion,
) {
    let c = &inner.counters;
    let found = rounds.iter_mut().find_map(|r| {
        if r.pending == 0 {
            return None;
        }
        let i = r
            .victims
            .binary_search_by_key(&done.page, |v| v.page)
            .ok()?;
        (r.victims[i].verdict == Verdict::Dirty).then_some((r, i))
    });
    let Some((r, i)) = found else {
        // At shutdown, rounds stop waiting and keep their pages: late completions are moot.
        if !inner.stop.load(Ordering::Acquire) {
            tracing::error!("write completion for unexpected page {:#x}", done.page);
        }
        return;
    };
    match done.status {
        Status::Ok => {
            backoff.succeeded();
            c.remote_writes.fetch_add(1, Ordering::Relaxed);
            c.bytes_written
                .fetch_add(PAGE_SIZE as u64, Ordering::Relaxed);
            // Written: from here it is freed like a clean page, but counted as dirty.
            r.victims[i].verdict = Verdict::Written;
        }
        Status::Failed(error) => {
            c.store_errors.fetch_add(1, Ordering::Relaxed);
            c.evict_write_failed.fetch_add(1, Ordering::Relaxed);
            backoff.failed(inner);
            inner.push_error(EngineError::Store {
                op: "write",
                gpa: done.page * PAGE_SIZE as u64,
                error,
            });
            r.victims[i].verdict = Verdict::Keep;
        }
        Status::Absent => {
            tracing::error!("store answered a write with Absent; treating as failure");
            r.victims[i].verdict = Verdict::Keep;
        }
    }
    r.pending -= 1;
    if r.pending == 0 {
        finish_round(inner, r);
    }
}

/// Claims up to `want` victims.
fn select(inner: &Inner, want: usize, hand: &mut u64, out: &mut Vec<Victim>) {
    out.clear();
    let claim = |p: u64, w: u32, out: &mut Vec<Victim>| -> bool {
        let s = state_of(w);
        if (s != st::LOCAL && s != st::STAGED) || st::pins_of(w) != 0 {
            return false;
        }
        let ev = (w & !0xF) | st::EVICTING;
        if inner.table.cas(p, w, ev & !st::F_WAITERS).is_ok() {
            out.push(Victim {
                page: p,
                word: w,
                fp: 0,
                verdict: Verdict::Clean,
            });
            true
        } else {
            false
        }
    };
    // 1. Consumed prefetches first.
    while out.len() < want {
        let Ok(p) = inner.consumed_rx.try_recv() else {
            break;
        };
        let w = inner.table.load(p);
        if w & st::F_CONSUMED != 0 {
            claim(p, w, out);
        }
    }
    // 2. CLOCK: two full turns at most (the first may only clear reference bits).
    let n = inner.pages();
    let mut scanned = 0u64;
    while out.len() < want && scanned < 2 * n {
        let p = *hand;
        *hand = (*hand + 1) % n;
        scanned += 1;
        let w = inner.table.load(p);
        let s = state_of(w);
        if (s != st::LOCAL && s != st::STAGED) || st::pins_of(w) != 0 {
            continue;
        }
        if w & st::F_REF != 0 {
            let _ = inner.table.cas(p, w, w & !st::F_REF);
            continue;
        }
        if w & st::F_HOT != 0 {
            // A working-set page (refaulted soon after its last eviction): another turn.
            let _ = inner.table.cas(p, w, w - st::HOT_ONE);
            continue;
        }
        claim(p, w, out);
    }
}

/// Steps 1-4 of a round: zap the claimed victims, fingerprint them, submit the dirty ones'
/// write-backs (their completions arrive later, see [`write_back_done`]).
fn start_round(inner: &Inner, r: &mut Round, backoff: &mut WriteBackoff) {
    let c = &inner.counters;
    r.started = inner.now();
    r.warned = 0;
    r.pending = 0;
    r.victims.sort_unstable_by_key(|v| v.page);
    r.pages.clear();
    r.pages.extend(
        r.victims
            .iter()
            .filter(|v| state_of(v.word) == st::LOCAL)
            .map(|v| v.page),
    );
    if let Err(e) = inner.ram.zap_guest(&r.pages) {
        // Nothing was proven unmapped: give every victim back untouched.
        inner.push_error(EngineError::os("zapping evicted pages", e));
        for v in r.victims.iter() {
            restore(inner, v.page);
        }
        r.victims.clear();
        return;
    }
    // 3. Content verdicts, now that the guest cannot write.
    r.writes.clear();
    for v in r.victims.iter_mut() {
        v.fp = inner.fingerprint(v.page);
        let clean = inner.clean_fp(v.page);
        v.verdict = if v.fp != clean {
            Verdict::Dirty
        } else if v.fp == inner.zero_fp {
            Verdict::Zero
        } else {
            Verdict::Clean
        };
        if v.verdict == Verdict::Dirty {
            // SAFETY: the memfd page is owned by the evictor (EVICTING) until its completion.
            let src = unsafe { PageBuf::new(inner.ram.alias_page(v.page)) }.expect("non-null");
            r.writes.push(WriteReq { page: v.page, src });
        }
    }
    // 4. Write back (asynchronously).
    if r.writes.is_empty() {
        return;
    }
    inner
        .outstanding
        .fetch_add(r.writes.len() as u64, Ordering::AcqRel);
    if let Err(e) = inner.store.write(&r.writes) {
        inner
            .outstanding
            .fetch_sub(r.writes.len() as u64, Ordering::AcqRel);
        c.store_errors.fetch_add(1, Ordering::Relaxed);
        c.evict_write_failed
            .fetch_add(r.writes.len() as u64, Ordering::Relaxed);
        inner.push_error(EngineError::Store {
            op: "write",
            gpa: r.writes[0].page * PAGE_SIZE as u64,
            error: e,
        });
        for v in r.victims.iter_mut().filter(|v| v.verdict == Verdict::Dirty) {
            v.verdict = Verdict::Keep;
        }
        backoff.failed(inner);
        return;
    }
    r.pending = r.writes.len();
}

/// Longest pause of the evictor while write-backs keep failing.
const MAX_WRITE_FAILURE_PAUSE_NS: u64 = 500_000_000;

/// The evictor's pause after failed write-backs. The store may be unavailable for a while (a
/// memserver taken out of service, waiting to rejoin). The failed pages stay resident;
/// claiming the same pages again at once would only zap, hash and fail them in a loop
/// (measured: ~46k failed write-backs a second with a fixed 5 ms pause), so new rounds wait a
/// back-off that doubles while failures go on (from the retry back-off up to 0.5 s) and
/// resets on the first write that succeeds.
#[derive(Default)]
struct WriteBackoff {
    /// No new round before this (ns, [`Inner::now`]).
    until: u64,
    /// The current back-off (ns; 0 after a success).
    current: u64,
}

impl WriteBackoff {
    fn failed(&mut self, inner: &Inner) {
        let first = inner.cfg.retry_backoff_ms.max(1) * 1_000_000;
        self.current = if self.current == 0 {
            first
        } else {
            (self.current * 2).min(MAX_WRITE_FAILURE_PAUSE_NS.max(first))
        };
        self.until = inner.now() + self.current;
    }

    fn succeeded(&mut self) {
        self.current = 0;
    }

    /// Nanoseconds left to wait (0: go on).
    fn remaining(&self, now: u64) -> u64 {
        self.until.saturating_sub(now)
    }
}

/// Step 5, once every write-back of the round is done: rescue, keep or free each victim.
fn finish_round(inner: &Inner, r: &mut Round) {
    let c = &inner.counters;
    let victims = &mut r.victims;
    let pages = &mut r.pages;
    pages.clear();
    for v in victims.iter_mut() {
        let w = inner.table.load(v.page);
        if w & st::F_WAITERS != 0 {
            if v.verdict == Verdict::Written {
                // The remote copy now holds exactly this content.
                inner.set_clean_fp(v.page, v.fp);
            }
            inner.publish_local(v.page, |_| 0, true);
            c.evict_rescued.fetch_add(1, Ordering::Relaxed);
            v.verdict = Verdict::Keep;
            continue;
        }
        if v.verdict == Verdict::Keep {
            restore(inner, v.page);
            continue;
        }
        pages.push(v.page);
    }
    if let Err(e) = inner.ram.free(pages) {
        inner.push_error(EngineError::os("freeing evicted pages", e));
        for v in victims.iter().filter(|v| v.verdict != Verdict::Keep) {
            if v.verdict == Verdict::Written {
                inner.set_clean_fp(v.page, v.fp);
            }
            restore(inner, v.page);
        }
        victims.clear();
        return;
    }
    for v in victims.iter().filter(|v| v.verdict != Verdict::Keep) {
        let next = match v.verdict {
            Verdict::Zero => st::NEVER,
            _ => st::REMOTE,
        };
        account(inner, v);
        let r = inner.table.update(v.page, |w| {
            Some(st::pins_only(w) | next | (w & st::F_WAITERS))
        });
        let Ok((_, new)) = r else { continue };
        if new & st::F_WAITERS == 0 {
            inner.release_frame();
            continue;
        }
        // A fault arrived after the rescue check: the data is gone from the memfd, so serve it
        // as a fresh demand fault (keeping the frame).
        let inflight = st::pins_only(new) | st::INFLIGHT | st::F_DEMAND;
        if inner.table.cas(v.page, new, inflight).is_err() {
            // The fault handler got there first and took its own frame.
            inner.release_frame();
            continue;
        }
        if next == st::NEVER {
            inner.install_zero(v.page, true);
        } else {
            inner.t_io[v.page as usize].store(inner.now(), Ordering::Relaxed);
            // SAFETY: the page is INFLIGHT, owned by this read until its completion.
            let dst = unsafe { PageBuf::new(inner.ram.alias_page(v.page)) }.expect("non-null");
            let req = crate::store::ReadReq {
                page: v.page,
                priority: crate::store::Priority::Demand,
                dst,
            };
            c.remote_reads_demand.fetch_add(1, Ordering::Relaxed);
            inner.outstanding.fetch_add(1, Ordering::AcqRel);
            if let Err(e) = inner.store.read(&[req]) {
                inner.outstanding.fetch_sub(1, Ordering::AcqRel);
                inner.on_read_done(v.page, Status::Failed(e));
            }
        }
    }
    victims.clear();
    inner
        .hist
        .record(Hist::EvictRound, inner.now().saturating_sub(r.started));
    c.evict_rounds.fetch_add(1, Ordering::Relaxed);
    inner.kick.kick();
}

/// Counts an eviction that completed.
fn account(inner: &Inner, v: &Victim) {
    let c = &inner.counters;
    c.evictions.fetch_add(1, Ordering::Relaxed);
    let seq = inner.evict_seq.fetch_add(1, Ordering::Relaxed);
    inner.evicted_at[v.page as usize].store((seq as u32).wrapping_add(1).max(1), Ordering::Relaxed);
    match v.verdict {
        Verdict::Clean => c.evict_clean.fetch_add(1, Ordering::Relaxed),
        Verdict::Zero => c.evict_zero.fetch_add(1, Ordering::Relaxed),
        _ => c.evict_dirty.fetch_add(1, Ordering::Relaxed),
    };
    if v.word & st::F_PREFETCHED != 0 {
        if state_of(v.word) == st::STAGED {
            c.prefetch_wasted.fetch_add(1, Ordering::Relaxed);
            if v.word & st::F_PROBE != 0 {
                c.probe_wasted.fetch_add(1, Ordering::Relaxed);
            }
        } else if v.verdict == Verdict::Written {
            c.prefetch_inferred_hits.fetch_add(1, Ordering::Relaxed);
        } else {
            c.prefetch_unconfirmed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Gives a claimed page back as resident. A LOCAL victim's guest mapping was zapped; the next
/// guest touch faults and the handler maps it again (LOCAL case), so leave it unmapped.
fn restore(inner: &Inner, p: u64) {
    let _ = inner.table.update(p, |w| {
        if w & st::F_WAITERS != 0 {
            None
        } else {
            Some(st::pins_only(w) | st::LOCAL | st::F_REF)
        }
    });
    if state_of(inner.table.load(p)) == st::EVICTING {
        // A fault waits: map it and wake.
        inner.publish_local(p, |_| 0, true);
    }
}
