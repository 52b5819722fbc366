//! Engine-faithful replay: a prefetcher driven the way `farvm-ept` drives it, without I/O.
//!
//! The plain evaluator ([`super::replay`]) makes every prefetched page resident at once and
//! never loses one. The paging engine does neither, and a stream prefetcher that is right in the
//! plain evaluator can still run away from the guest in the engine. This model reproduces the
//! engine's realities deterministically, with time counted in guest accesses (*ticks*):
//! - every read (demand or prefetch) takes `latency` ticks; a touch of a page whose prefetch is
//!   still in flight is a *late hit*: the guest waits for it and the prefetcher hears
//!   `on_late_hit` (`on_marker_hit` for a marker; `on_hit` with `marker_continuation` off), and
//!   its answer is issued as the engine's is;
//!   a demand fault stalls the guest `latency` ticks, and the prefetcher is consulted when the
//!   demand read is already on its way (its candidates are issued before the stall);
//! - at most `max_inflight` prefetch reads are in flight; candidates beyond that are *deferred*
//!   in a bounded FIFO (entries older than `defer_max_age` ticks are dropped), except markers,
//!   which are always issued;
//! - local memory holds `local_pages` frames, in-flight reads included; an LRU page is evicted
//!   for each read issued when full, so a prefetched page may be evicted before its use;
//! - candidates already resident or in flight are ignored (counted as `redundant`), like the
//!   engine's dedupe; with `zero_fill`, pages never accessed before are zero-filled locally on
//!   first touch (no latency), their faults still go to the prefetcher, and candidates for
//!   never-written pages are skipped (also `redundant`);
//! - a marker page is staged, not mapped: its first touch is reported with
//!   [`Prefetcher::on_marker_hit`] (its answer is fetched) or, with `marker_continuation` off,
//!   with [`Prefetcher::on_hit`]; other prefetched pages are injected and their use is silent.

use std::collections::{HashMap, HashSet, VecDeque};

use super::lru::{Lru, Meta};
use super::EvalError;
use crate::trace::Trace;
use crate::{Candidates, PageNo, Prefetcher, ProcessKey};

/// Engine-model settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineModelConfig {
    /// Local frames (resident pages + reads in flight), at least 1.
    pub local_pages: usize,
    /// Ticks a read takes.
    pub latency: u64,
    /// Prefetch reads in flight at most (the engine's `max_prefetch_inflight`).
    pub max_inflight: usize,
    /// Deferred candidates kept at most (the oldest is dropped when full).
    pub defer_cap: usize,
    /// Deferred candidates older than this many ticks are dropped as stale.
    pub defer_max_age: u64,
    /// Staged markers reported with `on_marker_hit` (answer fetched) rather than `on_hit`.
    pub marker_continuation: bool,
    /// First touches are zero fills (see the module documentation).
    pub zero_fill: bool,
}

impl Default for EngineModelConfig {
    /// The engine's defaults, with a read worth 64 guest accesses.
    fn default() -> Self {
        Self {
            local_pages: 4096,
            latency: 64,
            max_inflight: 256,
            defer_cap: 1024,
            defer_max_age: 2048,
            marker_continuation: true,
            zero_fill: true,
        }
    }
}

/// What one engine-model replay counted.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct EngineModelStats {
    /// Trace records replayed.
    pub accesses: u64,
    /// Touches of remote pages (a network read the guest waits for in full).
    pub demand_faults: u64,
    /// First touches of never-written pages, filled with zeros locally (no read).
    pub zero_fills: u64,
    /// Touches of pages whose prefetch was still in flight.
    pub late_hits: u64,
    /// First touches of prefetched pages that had arrived (markers included).
    pub prefetch_hits: u64,
    /// Of `prefetch_hits`, those on marker pages (the hits the prefetcher is told of).
    pub marker_hits: u64,
    /// Candidates the prefetcher proposed.
    pub proposals: u64,
    /// Proposals for pages resident, in flight or never written (ignored).
    pub redundant: u64,
    /// Prefetch reads issued.
    pub prefetch_issued: u64,
    /// Candidates put off because the prefetch queue was full.
    pub deferred: u64,
    /// Deferred candidates dropped (queue full or stale).
    pub dropped: u64,
    /// Prefetched pages evicted before any use.
    pub evicted_unused: u64,
    /// Ticks at the end: accesses plus the time the guest waited.
    pub ticks: u64,
}

#[derive(Clone, Copy)]
struct InFlight {
    ready: u64,
    prefetched: bool,
    marker: bool,
}

struct Model<'a> {
    cfg: EngineModelConfig,
    pf: &'a mut dyn Prefetcher,
    lru: Lru,
    inflight: HashMap<(ProcessKey, PageNo), InFlight>,
    /// Reads in completion order (the latency is constant, so issue order).
    queue: VecDeque<(u64, ProcessKey, PageNo)>,
    prefetch_inflight: usize,
    deferred: VecDeque<(ProcessKey, PageNo, bool, u64)>,
    written: HashSet<(ProcessKey, PageNo)>,
    cands: Candidates,
    now: u64,
    s: EngineModelStats,
}

impl Model<'_> {
    /// Completes every read due by `now`, then issues deferred candidates while slots allow.
    fn advance(&mut self, to: u64) {
        self.now = self.now.max(to);
        while let Some(&(ready, key, page)) = self.queue.front() {
            if ready > self.now {
                break;
            }
            self.queue.pop_front();
            let Some(f) = self.inflight.remove(&(key, page)) else {
                continue;
            };
            if f.prefetched {
                self.prefetch_inflight -= 1;
            }
            let meta = Meta {
                unused_prefetch: f.prefetched,
                marker: f.marker,
                fetched_at: ready,
            };
            self.lru.insert(key, page, meta);
        }
        while let Some(&(key, page, marker, since)) = self.deferred.front() {
            if self.now.saturating_sub(since) > self.cfg.defer_max_age {
                self.deferred.pop_front();
                self.s.dropped += 1;
                continue;
            }
            if !marker && self.prefetch_inflight >= self.cfg.max_inflight {
                break;
            }
            self.deferred.pop_front();
            self.start_read(key, page, true, marker);
        }
    }

    /// Frees a frame (LRU eviction) if local memory is full, then starts a read.
    fn start_read(&mut self, key: ProcessKey, page: PageNo, prefetched: bool, marker: bool) {
        if self.lru.get(key, page).is_some() || self.inflight.contains_key(&(key, page)) {
            return;
        }
        while self.lru.len() + self.inflight.len() >= self.cfg.local_pages && !self.lru.is_empty() {
            if let Some(ev) = self.lru.pop_lru() {
                if ev.meta.unused_prefetch {
                    self.s.evicted_unused += 1;
                }
            }
        }
        let ready = self.now + self.cfg.latency;
        self.inflight.insert(
            (key, page),
            InFlight {
                ready,
                prefetched,
                marker,
            },
        );
        self.queue.push_back((ready, key, page));
        if prefetched {
            self.prefetch_inflight += 1;
            self.s.prefetch_issued += 1;
        }
    }

    /// Issues the prefetcher's answer (in `self.cands`) like the engine: dedupe, cap, defer.
    fn issue(&mut self, key: ProcessKey) {
        for i in 0..self.cands.len() {
            let (page, marker) = (self.cands.as_slice()[i], self.cands.is_marker(i));
            self.s.proposals += 1;
            let present =
                self.lru.get(key, page).is_some() || self.inflight.contains_key(&(key, page));
            let never = self.cfg.zero_fill && !self.written.contains(&(key, page));
            if present || never {
                self.s.redundant += 1;
                continue;
            }
            if !marker && self.prefetch_inflight >= self.cfg.max_inflight {
                self.s.deferred += 1;
                if self.deferred.len() >= self.cfg.defer_cap {
                    self.deferred.pop_front();
                    self.s.dropped += 1;
                }
                self.deferred.push_back((key, page, marker, self.now));
                continue;
            }
            self.start_read(key, page, true, marker);
        }
    }

    fn access(&mut self, key: ProcessKey, page: PageNo) {
        self.advance(self.now + 1);
        let now = self.now;
        if let Some(idx) = self.lru.get(key, page) {
            let meta = *self.lru.meta(idx);
            self.lru.touch(idx);
            if meta.unused_prefetch {
                self.lru.meta(idx).unused_prefetch = false;
                self.s.prefetch_hits += 1;
                if meta.marker {
                    self.s.marker_hits += 1;
                    if self.cfg.marker_continuation {
                        self.pf.on_marker_hit(key, page, now, &mut self.cands);
                        self.issue(key);
                    } else {
                        self.pf.on_hit(key, page, now);
                    }
                }
            }
            return;
        }
        if let Some(f) = self.inflight.get_mut(&(key, page)) {
            let (prefetched, marker, ready) =
                (f.prefetched, std::mem::take(&mut f.marker), f.ready);
            if prefetched {
                // The engine installs a late prefetch on arrival and reports a visible hit: a
                // marker's as a marker hit, any other page's as a late hit, whose answer
                // (pages further ahead) it fetches.
                self.s.late_hits += 1;
                if !self.cfg.marker_continuation {
                    self.pf.on_hit(key, page, now);
                } else {
                    if marker {
                        self.pf.on_marker_hit(key, page, now, &mut self.cands);
                    } else {
                        self.pf.on_late_hit(key, page, now, &mut self.cands);
                    }
                    self.issue(key);
                }
            }
            self.advance(ready);
            if let Some(idx) = self.lru.get(key, page) {
                self.lru.meta(idx).unused_prefetch = false;
                self.lru.touch(idx);
            }
            return;
        }
        if self.cfg.zero_fill && self.written.insert((key, page)) {
            self.s.zero_fills += 1;
            while self.lru.len() + self.inflight.len() >= self.cfg.local_pages
                && self.lru.pop_lru().is_some()
            {}
            self.lru.insert(key, page, Meta::default());
            self.pf.on_fault(key, page, now, &mut self.cands);
            self.issue(key);
            return;
        }
        self.written.insert((key, page));
        self.s.demand_faults += 1;
        self.start_read(key, page, false, false);
        self.pf.on_fault(key, page, now, &mut self.cands);
        self.issue(key);
        self.advance(now + self.cfg.latency);
    }
}

/// Replays `trace` through `pf` the way the paging engine would drive it.
pub fn replay_engine(
    trace: &Trace,
    pf: &mut dyn Prefetcher,
    cfg: &EngineModelConfig,
) -> Result<EngineModelStats, EvalError> {
    if cfg.local_pages == 0 {
        return Err(EvalError::NoLocalMemory);
    }
    let mut m = Model {
        cfg: *cfg,
        pf,
        lru: Lru::new(cfg.local_pages),
        inflight: HashMap::new(),
        queue: VecDeque::new(),
        prefetch_inflight: 0,
        deferred: VecDeque::new(),
        written: HashSet::new(),
        cands: Candidates::new(),
        now: 0,
        s: EngineModelStats::default(),
    };
    for rec in &trace.records {
        m.access(rec.key, rec.page);
    }
    m.s.accesses = trace.records.len() as u64;
    m.s.ticks = m.now;
    Ok(m.s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{build, Config};

    #[test]
    fn no_prefetch_faults_once_per_remote_touch() {
        // Write 8 pages (zero fills), then re-read them through 4 frames: all remote again.
        let t = Trace::from_pairs((0..8).chain(0..8).map(|p| (1, p)));
        let mut pf = build("none", &Config::default()).unwrap();
        let cfg = EngineModelConfig {
            local_pages: 4,
            latency: 10,
            ..EngineModelConfig::default()
        };
        let s = replay_engine(&t, pf.as_mut(), &cfg).unwrap();
        assert_eq!((s.zero_fills, s.demand_faults), (8, 8));
        assert_eq!(s.ticks, 16 + 8 * 10, "each demand fault stalls one latency");
    }

    #[test]
    fn late_prefetches_are_waited_for_not_refetched() {
        // next-n at fault 0 fetches 1..=8; with latency 10 the guest reaches them early.
        let t = Trace::from_pairs((0..9).map(|p| (1, p)));
        let mut pf = build("next-n", &Config::default()).unwrap();
        let cfg = EngineModelConfig {
            local_pages: 64,
            latency: 10,
            zero_fill: false,
            ..EngineModelConfig::default()
        };
        let s = replay_engine(&t, pf.as_mut(), &cfg).unwrap();
        assert_eq!(s.demand_faults, 1);
        assert_eq!(s.late_hits + s.prefetch_hits, 8);
        assert!(s.late_hits == 0, "all arrived with the demand read: {s:?}");
    }
}
