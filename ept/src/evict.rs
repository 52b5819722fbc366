//! The evictor thread: keeps resident pages below the low-water mark (budget minus the free
//! reserve) with some prefetch headroom, so demand faults find a free frame and never reclaim
//! inline, and prefetches find frames too.
//!
//! Victim order: a CLOCK sweep over the page table: every resident page gets one second chance
//! after install (its reference bit), unpinned pages only. Without hardware accessed bits (no
//! page_idle on this kernel, and sampling by unmapping costs a 55–115 µs guest fault each here)
//! that alone is FIFO by install time with a second chance, so refault distance stands in for
//! the accessed bit: a page demand-faulted back within one budget's worth of evictions since it
//! was evicted (Linux's workingset test) is marked hot and survives up to three more sweeps.
//! Measured in `benches/fault_path.rs` (table 5).
//!
//! Prefetched pages the guest was seen to use (marker and late hits) are not evicted first, as
//! Leap's eager eviction would: a page is seen used at its first touch, while a scan goes on
//! reading it, and evicting it then cost the scan a refault of that page; it also took the page
//! out alone, one move and one TLB shootdown for one page, where the sweep takes it with its
//! neighbours (`docs/data-path-journal.md`, "Consumed prefetches are not evicted first").
//!
//! One round, for up to `evict_batch` victims:
//! 1. claim: CAS `LOCAL|STAGED (unpinned) -> EVICTING` (the evictor now owns the page);
//! 2. zap the guest view (memfd: one vectored MADV_DONTNEED over the victims' spans,
//!    `spans.rs`: runs bridged over unmapped gaps, one TLB shootdown per span; anon: one
//!    `UFFDIO_MOVE` per run of victims, straight into the pool's next slots after a few
//!    rounds in a row without write-backs, see `backing.rs`): from here the guest cannot write
//!    the page, its data stays in the memfd (or the moved frame), and a guest touch faults and
//!    waits;
//! 3. dirty check by content: fingerprint the memfd page and compare with the fingerprint of
//!    the remote copy taken at install. This is race-free — it looks at the final content after
//!    the guest lost access, whereas a write tracker (KVM dirty log, uffd async WP +
//!    PAGEMAP_SCAN) harvested *before* the zap misses writes between harvest and zap. It also
//!    catches writes by the VMM and devices, and silent stores stay clean;
//! 4. write back the dirty ones straight from the memfd (no copy; anon: after moving the
//!    round's victims from pool slots to their staging slots), without waiting: up to
//!    [`ROUNDS_IN_FLIGHT`] rounds wait for their write-backs while the next ones are claimed,
//!    zapped and hashed (a write-back waited for inline bounded a write-heavy scan at 25%
//!    local to ~15 µs per page: a round of 49 pages took ~750 µs, 450 µs of it waiting);
//! 5. once a round's write-backs are all done: pages a guest faulted on meanwhile are rescued (mapped again, no I/O); failed write-backs
//!    stay resident; the rest are unmapped from the alias (one vectored MADV_DONTNEED over
//!    their spans) and freed with one vectored MADV_REMOVE (anon: frames in pool slots stay
//!    there and are published as free, the others move to the pool) and become REMOTE (or
//!    NEVER again if still all-zero and never stored).
//!
//! The thread owns its rounds, the CLOCK hand and the write back-off; everything else it acts
//! on through the parts.

use std::sync::Arc;
use std::time::Duration;

use crate::backing::Refused;
use crate::clock::Clock;
use crate::errlog::ErrorLog;
use crate::error::EngineError;
use crate::frames::Frames;
use crate::installer::Installer;
use crate::lost::LostPages;
use crate::pagemeta::{version_of, PageMeta};
use crate::parts::Parts;
use crate::port::StorePort;
use crate::procstats::{ProcessCounter, ProcessTable};
use crate::queues::Queues;
use crate::refault::RefaultClock;
use crate::reseal::{self, Sweep, Turn};
use crate::spans;
use crate::state::{self as st, state_of, PageTable};
use crate::stats::{Counter, Counters, Hist, Histograms};
use crate::store::{Completion, Priority, ReadReq, Status, WriteReq};
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

/// Rounds in a row with no write-back after which victims move straight into pool slots
/// (`backing.rs`): a round that turns out to have write-backs moves them out again, one more
/// move per run, which rounds of scattered victims with a few dirty ones each (a key-value
/// workload) would pay often.
const CLEAN_ROUNDS_TO_POOL: u32 = 4;

/// One round's victims and buffers (allocated once, reused).
struct Round {
    /// Sorted by page.
    victims: Vec<Victim>,
    pages: Vec<u64>,
    /// The ranges unmapped for `pages` (see `spans.rs`).
    spans: Vec<(u64, u64)>,
    writes: Vec<WriteReq>,
    /// Write-backs submitted and not completed yet.
    pending: usize,
    /// The first pool position its victims were moved to (anon), until they are freed.
    pool_from: Option<u64>,
    started: u64,
    /// When the last "still outstanding" warning was logged.
    warned: u64,
}

impl Round {
    fn new(batch: usize) -> Self {
        Self {
            victims: Vec::with_capacity(batch),
            pages: Vec::with_capacity(batch),
            spans: Vec::with_capacity(batch),
            writes: Vec::with_capacity(batch),
            pending: 0,
            pool_from: None,
            started: 0,
            warned: 0,
        }
    }

    fn is_free(&self) -> bool {
        self.victims.is_empty()
    }
}

pub(crate) struct Evictor {
    table: Arc<PageTable>,
    meta: Arc<PageMeta>,
    refault: Arc<RefaultClock>,
    frames: Arc<Frames>,
    installer: Arc<Installer>,
    port: Arc<StorePort>,
    queues: Arc<Queues>,
    errors: Arc<ErrorLog>,
    lost: Arc<LostPages>,
    counters: Arc<Counters>,
    hist: Arc<Histograms>,
    procs: Arc<ProcessTable>,
    clock: Clock,
    /// Victims per round (`EngineConfig::evict_batch`).
    batch: usize,
    backoff: WriteBackoff,
    /// Victims the kernel refused to move out in the current round (anon).
    refused: Refused,
    /// Pages kept resident so far (logged at powers of two: rate-limited).
    unmovable: u64,
    /// Rounds in a row with no write-back: from [`CLEAN_ROUNDS_TO_POOL`] on, victims move
    /// straight into pool slots.
    clean_rounds: u32,
    /// A key rotation's re-seal sweep, run between rounds (`reseal.rs`).
    sweep: Sweep,
}

impl Evictor {
    pub fn new(parts: &Parts) -> Self {
        let cfg = parts.cfg();
        Self {
            table: parts.table().clone(),
            meta: parts.meta().clone(),
            refault: parts.refault().clone(),
            frames: parts.frames().clone(),
            installer: parts.installer().clone(),
            port: parts.port().clone(),
            queues: parts.queues().clone(),
            errors: parts.errors().clone(),
            lost: parts.lost().clone(),
            counters: parts.counters().clone(),
            hist: parts.hist().clone(),
            procs: parts.procs().clone(),
            clock: parts.clock(),
            batch: cfg.evict_batch,
            backoff: WriteBackoff::new(cfg.retry_backoff_ms.max(1) * 1_000_000),
            refused: Refused::default(),
            unmovable: 0,
            clean_rounds: 0,
            sweep: Sweep::new(
                parts.table().clone(),
                parts.meta().clone(),
                parts.port().clone(),
                parts.counters().clone(),
                parts.reseal().clone(),
            ),
        }
    }

    /// The evictor thread's body: runs until the engine stops and no round is in flight.
    pub fn run(mut self) {
        let batch = self.batch;
        let mut rounds: Vec<Round> = (0..ROUNDS_IN_FLIGHT).map(|_| Round::new(batch)).collect();
        let mut hand: u64 = 0;
        let target = self.frames.evict_target();
        // Evicting down to `target` once resident pages passed `evict_start` (hysteresis).
        let mut active = false;
        loop {
            // Pool positions filled by rounds that are freed now are free frames.
            let oldest = rounds.iter().filter_map(|r| r.pool_from).min();
            self.installer.publish_pool(oldest.unwrap_or(u64::MAX));
            let stopping = self.queues.stopping();
            let in_flight = rounds.iter().any(|r| !r.is_free());
            if stopping && !in_flight {
                return;
            }
            // Pages of unfinished rounds are still counted resident but already on their way
            // out.
            let claimed: u64 = rounds.iter().map(|r| r.victims.len() as u64).sum();
            let resident = self.frames.resident();
            if resident > self.frames.evict_start() {
                active = true;
            }
            if resident.saturating_sub(claimed) <= target {
                active = false;
            }
            let pause = self.backoff.remaining(self.clock.now());
            if pause > 0 && active && !stopping {
                if in_flight {
                    self.wait_write_backs(&mut rounds, Duration::from_nanos(pause));
                    continue;
                }
                std::thread::park_timeout(Duration::from_nanos(pause));
                continue;
            }
            // A key rotation's re-seal: a page per turn while evicting, a few when idle.
            let oldest_round = rounds
                .iter()
                .filter(|r| !r.is_free())
                .map(|r| r.started)
                .min();
            let evicting = active && !stopping;
            let budget = if evicting { 1 } else { reseal::PAGES_PER_TURN };
            let reseal = if stopping {
                Turn::Idle
            } else {
                self.sweep.turn(self.clock.now(), oldest_round, budget)
            };
            let free_slot = rounds.iter().position(Round::is_free);
            match (evicting, free_slot) {
                (true, Some(ri)) => {
                    let want = batch.min((resident - claimed - target) as usize);
                    let r = &mut rounds[ri];
                    self.select(want.max(1), &mut hand, &mut r.victims);
                    if r.victims.is_empty() {
                        // Everything resident is pinned or in flight: wait for completions.
                        if in_flight {
                            self.wait_write_backs(&mut rounds, Duration::from_millis(1));
                        } else {
                            std::thread::park_timeout(Duration::from_millis(1));
                        }
                        continue;
                    }
                    self.start_round(r);
                    if r.pending == 0 {
                        self.finish_round(r);
                    }
                    // Completions that arrived meanwhile, without blocking.
                    self.wait_write_backs(&mut rounds, Duration::ZERO);
                }
                _ if in_flight => {
                    self.wait_write_backs(&mut rounds, Duration::from_millis(100));
                    if stopping {
                        // Shutting down: keep whatever has not been confirmed written.
                        for r in rounds.iter_mut().filter(|r| !r.is_free()) {
                            for v in r.victims.iter_mut().filter(|v| v.verdict == Verdict::Dirty) {
                                v.verdict = Verdict::Keep;
                            }
                            r.pending = 0;
                            self.finish_round(r);
                        }
                    }
                }
                // Re-sealing: the next turn at once (its round trips bound the rate), or soon.
                _ if reseal == Turn::More => {}
                _ if reseal == Turn::Waiting => std::thread::park_timeout(Duration::from_millis(1)),
                _ => std::thread::park_timeout(Duration::from_millis(20)),
            }
        }
    }

    /// Delivers write-back completions to their rounds (waiting up to `timeout` for the
    /// first) and finishes rounds whose write-backs are all done.
    fn wait_write_backs(&mut self, rounds: &mut [Round], timeout: Duration) {
        let Some(first) = self.queues.next_written(timeout) else {
            let now = self.clock.now();
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
            self.write_back_done(rounds, done);
            next = self.queues.next_written(Duration::ZERO);
        }
    }

    /// Applies one write-back completion to the round that owns its page.
    fn write_back_done(&mut self, rounds: &mut [Round], done: Completion) {
        let c = &self.counters;
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
            if !self.queues.stopping() {
                tracing::error!("write completion for unexpected page {:#x}", done.page);
            }
            return;
        };
        match done.status {
            Status::Ok => {
                self.backoff.succeeded();
                c.inc(Counter::RemoteWrites);
                c.add(Counter::BytesWritten, PAGE_SIZE as u64);
                // Written: from here it is freed like a clean page, but counted as dirty. The
                // remote copy now holds exactly this content, whatever becomes of the victim
                // (rescued, kept or freed): a read returning anything else found a stale copy
                // (`complete`).
                let v = &mut r.victims[i];
                self.meta.set_clean_fp(v.page, v.fp);
                v.verdict = Verdict::Written;
            }
            Status::Failed(error) => {
                c.inc(Counter::StoreErrors);
                c.inc(Counter::EvictWriteFailed);
                self.backoff.failed(self.clock.now());
                self.errors.push(EngineError::Store {
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
            self.finish_round(r);
        }
    }

    /// Claims up to `want` victims.
    fn select(&self, want: usize, hand: &mut u64, out: &mut Vec<Victim>) {
        out.clear();
        let table = &*self.table;
        let claim = |p: u64, w: u32, out: &mut Vec<Victim>| -> bool {
            let s = state_of(w);
            if (s != st::LOCAL && s != st::STAGED)
                || st::pins_of(w) != 0
                || !self.installer.evictable(p)
            {
                return false;
            }
            let ev = (w & !0xF) | st::EVICTING;
            if table.cas(p, w, ev & !st::F_WAITERS).is_ok() {
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
        // CLOCK: two full turns at most (the first may only clear reference bits).
        let n = table.len();
        let mut scanned = 0u64;
        while out.len() < want && scanned < 2 * n {
            let p = *hand;
            *hand = (*hand + 1) % n;
            scanned += 1;
            let w = table.load(p);
            let s = state_of(w);
            if (s != st::LOCAL && s != st::STAGED) || st::pins_of(w) != 0 {
                continue;
            }
            if w & st::F_REF != 0 {
                let _ = table.cas(p, w, w & !st::F_REF);
                continue;
            }
            if w & st::F_HOT != 0 {
                // A working-set page (refaulted soon after its last eviction): another turn.
                let _ = table.cas(p, w, w - st::HOT_ONE);
                continue;
            }
            claim(p, w, out);
        }
    }

    /// Steps 1-4 of a round: zap the claimed victims, fingerprint them, submit the dirty ones'
    /// write-backs (their completions arrive later, see [`Evictor::write_back_done`]).
    fn start_round(&mut self, r: &mut Round) {
        r.started = self.clock.now();
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
        spans::bridge(&self.table, &r.pages, &mut r.spans);
        // Straight into pool slots after a few rounds with no write-back in a row (not in a
        // phase with writes: a round that has some takes its victims out again, below).
        let to_pool = self.clean_rounds >= CLEAN_ROUNDS_TO_POOL;
        let zapped = self
            .installer
            .zap(&r.pages, &r.spans, to_pool, &mut self.refused);
        r.pool_from = self.refused.pool_from;
        if let Err(e) = zapped {
            // Nothing was proven unmapped: give every victim back untouched.
            self.errors
                .push(EngineError::os("zapping evicted pages", e));
            for v in r.victims.iter() {
                self.restore(v.page);
            }
            r.victims.clear();
            r.pool_from = None;
            return;
        }
        if !self.refused.pages.is_empty() {
            self.keep_refused(r);
        }
        if !self.refused.vanished.is_empty() {
            self.lose_vanished(r);
        }
        // 3. Content verdicts, now that the guest cannot write.
        r.writes.clear();
        for v in r.victims.iter_mut() {
            v.fp = self.installer.fingerprint(v.page);
            let clean = self.meta.clean_fp(v.page);
            v.verdict = if v.fp != clean {
                Verdict::Dirty
            } else if v.fp == self.meta.zero_fp() {
                Verdict::Zero
            } else {
                Verdict::Clean
            };
            if v.verdict == Verdict::Dirty {
                // The memfd page is owned by the evictor (EVICTING) until its completion.
                let src = self.installer.page_buf(v.page);
                r.writes.push(WriteReq {
                    page: v.page,
                    src,
                    version: version_of(v.fp),
                });
            }
        }
        self.clean_rounds = if r.writes.is_empty() {
            self.clean_rounds.saturating_add(1)
        } else {
            0
        };
        // 4. Write back (asynchronously).
        if r.writes.is_empty() {
            return;
        }
        if let Some(from) = r.pool_from.take() {
            // Waiting for write-backs, the round would hold pool slots that the frames freed
            // meanwhile queue behind: its victims go to their staging slots instead.
            if let Err(e) = self.installer.unpool(&r.pages, from) {
                self.errors
                    .push(EngineError::os("moving victims out of the pool", e));
                // Some victims may still be in their pool slots: the round keeps its
                // positions (unpublished) until it is freed, so no read lands on their data.
                r.pool_from = Some(from);
            }
            for w in r.writes.iter_mut() {
                w.src = self.installer.page_buf(w.page);
            }
        }
        let c = &self.counters;
        if let Err(e) = self.port.write(&r.writes) {
            c.inc(Counter::StoreErrors);
            c.add(Counter::EvictWriteFailed, r.writes.len() as u64);
            self.errors.push(EngineError::Store {
                op: "write",
                gpa: r.writes[0].page * PAGE_SIZE as u64,
                error: e,
            });
            for v in r.victims.iter_mut().filter(|v| v.verdict == Verdict::Dirty) {
                v.verdict = Verdict::Keep;
            }
            self.backoff.failed(self.clock.now());
            return;
        }
        r.pending = r.writes.len();
    }

    /// Step 5, once every write-back of the round is done: rescue, keep or free each victim.
    fn finish_round(&self, r: &mut Round) {
        let c = &self.counters;
        let victims = &mut r.victims;
        let pages = &mut r.pages;
        let spans = &mut r.spans;
        pages.clear();
        for v in victims.iter_mut() {
            let w = self.table.load(v.page);
            if w & st::F_WAITERS != 0 {
                self.installer.publish_local(v.page, |_| 0, true);
                c.inc(Counter::EvictRescued);
                v.verdict = Verdict::Keep;
                continue;
            }
            if v.verdict == Verdict::Keep {
                self.restore(v.page);
                continue;
            }
            if self.installer.fingerprint(v.page) != v.fp {
                // Written after the zap, through a mapping that should be gone: freeing it
                // would lose that write. Kept, with its remote copy (if written back) known
                // to be older, so its next eviction writes it back.
                c.inc(Counter::EvictLateWrites);
                tracing::error!(
                    "guest page {:#x} changed after it was unmapped for eviction; kept resident",
                    v.page
                );
                v.verdict = Verdict::Keep;
                self.restore(v.page);
                continue;
            }
            pages.push(v.page);
        }
        spans::bridge(&self.table, pages, spans);
        let freed_all = match self.installer.free(pages, spans) {
            Ok(()) => true,
            Err(e) => {
                self.errors
                    .push(EngineError::os("freeing evicted pages", e));
                false
            }
        };
        for v in victims.iter().filter(|v| v.verdict != Verdict::Keep) {
            if !freed_all && !self.free_alone(v) {
                continue;
            }
            let next = match v.verdict {
                Verdict::Zero => st::NEVER,
                _ => st::REMOTE,
            };
            self.account(v);
            let r = self.table.update(v.page, |w| {
                Some(st::pins_only(w) | next | (w & st::F_WAITERS))
            });
            let Ok((_, new)) = r else { continue };
            if new & st::F_WAITERS == 0 {
                self.frames.release();
                continue;
            }
            // A fault arrived after the rescue check: the data is gone from the memfd, so serve
            // it as a fresh demand fault (keeping the frame).
            let inflight = st::pins_only(new) | st::INFLIGHT | st::F_DEMAND;
            if self.table.cas(v.page, new, inflight).is_err() {
                // The fault handler got there first and took its own frame.
                self.frames.release();
                continue;
            }
            if next == st::NEVER {
                self.installer.install_zero(v.page, true);
            } else {
                self.meta.set_io_at(v.page, self.clock.now());
                self.port.read(&[ReadReq {
                    page: v.page,
                    priority: Priority::Demand,
                    dst: self.installer.page_buf(v.page),
                    version: self.meta.version(v.page),
                }]);
            }
        }
        victims.clear();
        r.pool_from = None;
        self.hist
            .record(Hist::EvictRound, self.clock.now().saturating_sub(r.started));
        c.inc(Counter::EvictRounds);
        self.queues.frames_freed();
    }

    /// After a batch free failed part-way, victim `v`'s frame may be gone or not: it is freed
    /// alone so that its fate is known. Whether it is gone (it goes on as in a freed batch).
    /// If that fails too, what the guest would find in its frame is unknown: the page becomes
    /// `LOST`, loudly, rather than handed back to the guest possibly zeroed (and written back
    /// so later).
    fn free_alone(&self, v: &Victim) -> bool {
        let p = v.page;
        let Err(e) = self.installer.free(&[p], &[(p, 1)]) else {
            return true;
        };
        let gpa = p * PAGE_SIZE as u64;
        self.errors
            .push(EngineError::EvictedFrameUnknown { gpa, source: e });
        // Its frame is not counted free again: whether it is, is what is unknown.
        let r = self.table.update(p, |w| Some(st::pins_only(w) | st::LOST));
        if let Ok((old, _)) = r {
            if old & st::F_WAITERS != 0 {
                self.lost.accessed(p);
            }
        }
        false
    }

    /// Victims the kernel refused to move out stay mapped and resident: given back, so that the
    /// round goes on with the others; pages refused too often are kept resident until their
    /// retry (`backing.rs`), counted and logged (at 1, 2, 4, ... such pages).
    fn keep_refused(&mut self, r: &mut Round) {
        let refused = &self.refused.pages;
        r.victims.retain(|v| {
            let keep = refused.binary_search(&v.page).is_err();
            if !keep {
                // Still mapped: LOCAL again (a waiter is woken; the map finds it mapped).
                self.restore(v.page);
            }
            keep
        });
        let n = self.refused.unmovable;
        if n > 0 {
            self.counters.add(Counter::EvictUnmovable, n);
            let before = self.unmovable;
            self.unmovable += n;
            if (before + 1..=self.unmovable).any(u64::is_power_of_two) {
                tracing::warn!(
                    "{} guest pages kept resident: the kernel refused to move them out {} \
                     times (shared or pinned pages; retried later, ever more rarely)",
                    self.unmovable,
                    crate::backing::UNMOVABLE_AFTER
                );
            }
        }
    }

    /// Victims whose frame was not where the engine left it: what the guest last wrote there
    /// is unknown, so the page becomes `LOST` (loud: the VM stops at its next access, naming
    /// it) rather than fingerprinted and written back as whatever an empty slot reads.
    fn lose_vanished(&mut self, r: &mut Round) {
        let vanished = &self.refused.vanished;
        self.counters
            .add(Counter::EvictVanished, vanished.len() as u64);
        r.victims.retain(|v| {
            if vanished.binary_search(&v.page).is_err() {
                return true;
            }
            self.errors.push(EngineError::FrameVanished {
                gpa: v.page * PAGE_SIZE as u64,
            });
            // Its frame is not counted free again: where it is, is what is unknown.
            let w = self
                .table
                .update(v.page, |w| Some(st::pins_only(w) | st::LOST));
            if let Ok((old, _)) = w {
                if old & st::F_WAITERS != 0 {
                    self.lost.accessed(v.page);
                }
            }
            false
        });
    }

    /// Counts an eviction that completed.
    fn account(&self, v: &Victim) {
        let c = &self.counters;
        c.inc(Counter::Evictions);
        self.refault.record_eviction(v.page);
        c.inc(match v.verdict {
            Verdict::Clean => Counter::EvictClean,
            Verdict::Zero => Counter::EvictZero,
            _ => Counter::EvictDirty,
        });
        if v.word & st::F_PREFETCHED != 0 {
            // The prefetch's outcome, for the process it was issued for.
            let issuer = self.meta.owner(v.page);
            let both = |global, own| {
                c.inc(global);
                self.procs.add(issuer, own, 1);
            };
            if state_of(v.word) == st::STAGED {
                both(Counter::PrefetchWasted, ProcessCounter::PrefetchWasted);
                if v.word & st::F_PROBE != 0 {
                    both(Counter::ProbeWasted, ProcessCounter::ProbeWasted);
                }
            } else if v.verdict == Verdict::Written {
                both(
                    Counter::PrefetchInferredHits,
                    ProcessCounter::PrefetchInferredHits,
                );
            } else {
                both(
                    Counter::PrefetchUnconfirmed,
                    ProcessCounter::PrefetchUnconfirmed,
                );
            }
        }
    }

    /// Gives a claimed page back as resident. A LOCAL victim's guest mapping was zapped; the
    /// next guest touch faults and the handler maps it again (LOCAL case), so leave it
    /// unmapped.
    fn restore(&self, p: u64) {
        // Its data leaves the pool slot the move-out put it in (anon), which the pool reuses.
        self.installer.settle(p);
        let _ = self.table.update(p, |w| {
            if w & st::F_WAITERS != 0 {
                None
            } else {
                Some(st::pins_only(w) | st::LOCAL | st::F_REF)
            }
        });
        if state_of(self.table.load(p)) == st::EVICTING {
            // A fault waits: map it and wake.
            self.installer.publish_local(p, |_| 0, true);
        }
    }
}

/// Longest pause of the evictor while write-backs keep failing.
const MAX_WRITE_FAILURE_PAUSE_NS: u64 = 500_000_000;

/// The evictor's pause after failed write-backs. The store may be unavailable for a while (a
/// memserver taken out of service, waiting to rejoin). The failed pages stay resident;
/// claiming the same pages again at once would only zap, hash and fail them in a loop
/// (measured: ~46k failed write-backs a second with a fixed 5 ms pause), so new rounds wait a
/// back-off that doubles while failures go on (from the retry back-off up to 0.5 s) and
/// resets on the first write that succeeds.
struct WriteBackoff {
    /// The first pause (ns): the engine's retry back-off.
    first: u64,
    /// No new round before this (ns, [`Clock`]).
    until: u64,
    /// The current back-off (ns; 0 after a success).
    current: u64,
}

impl WriteBackoff {
    fn new(first: u64) -> Self {
        Self {
            first,
            until: 0,
            current: 0,
        }
    }

    fn failed(&mut self, now: u64) {
        self.current = if self.current == 0 {
            self.first
        } else {
            (self.current * 2).min(MAX_WRITE_FAILURE_PAUSE_NS.max(self.first))
        };
        self.until = now + self.current;
    }

    fn succeeded(&mut self) {
        self.current = 0;
    }

    /// Nanoseconds left to wait (0: go on).
    fn remaining(&self, now: u64) -> u64 {
        self.until.saturating_sub(now)
    }
}
