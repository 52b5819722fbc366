//! Trace replay: runs a prefetcher against a local memory of N pages and accounts as Leap §3.1.
//!
//! Model, per record `(key, page, time)`:
//! - resident and an unused prefetch → a *prefetch hit*: counted, timeliness sample
//!   (`time − prefetch time`), and reported to the prefetcher according to the hit visibility:
//!   a marker's first use always raises a (local) fault, so it is reported through
//!   [`Prefetcher::on_marker_hit`] in both modes and its answer is fetched (or, with
//!   `marker_continuation` off, through `on_hit` only); any other first use
//!   is reported through [`Prefetcher::on_hit`] only in `visible` mode (in `injected` mode the
//!   page is mapped and the touch is invisible). A marker's first use is *not* a demand miss.
//! - resident otherwise → a local hit (LRU touch).
//! - not resident → a *demand miss*: the page is fetched and [`Prefetcher::on_fault`] decides.
//!
//! Prefetched pages not yet resident are inserted (most recently used) and count against the
//! local memory; candidates already resident are ignored (like a swap-cache lookup). With eager
//! eviction (Leap §4.3) a prefetched page becomes the next eviction victim as soon as it is
//! used once; a second use before eviction makes it ordinary again.
//!
//! Metrics (Leap §3.1): accuracy = prefetch hits / pages prefetched ("cache adds");
//! coverage = prefetch hits / (prefetch hits + demand misses); timeliness = time from prefetch
//! to first use, p50 and p95, in nanoseconds for timed traces and in accesses otherwise.
//! Waste = prefetched pages never used / all pages fetched (demand + prefetch).

pub mod engine;
pub mod lru;

use lru::{Lru, Meta};

use crate::trace::Trace;
use crate::{Candidates, HitVisibility, Prefetcher};

/// Replay settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvalConfig {
    /// Local memory in pages (at least 1).
    pub local_pages: usize,
    /// Whether prefetch hits are visible to the prefetcher or only through markers.
    pub hits: HitVisibility,
    /// Leap's eager eviction of consumed prefetches.
    pub eager_eviction: bool,
    /// Whether the caller acts on marker faults with [`Prefetcher::on_marker_hit`] (fetching
    /// what it proposes) or only reports them with [`Prefetcher::on_hit`].
    pub marker_continuation: bool,
}

/// Why a replay cannot run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EvalError {
    #[error("local memory must hold at least 1 page")]
    /// [`EvalConfig::local_pages`] was 0.
    NoLocalMemory,
}

/// Counters and derived metrics of one replay.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Stats {
    /// The prefetcher's registry name.
    pub prefetcher: String,
    /// Trace records replayed.
    pub accesses: u64,
    /// Accesses to pages not resident and not prefetched (a fault the guest waits for).
    pub demand_misses: u64,
    /// Pages added to local memory by prefetching.
    pub cache_adds: u64,
    /// First uses of prefetched pages.
    pub prefetch_hits: u64,
    /// Of `prefetch_hits`, first uses of marker pages.
    pub marker_hits: u64,
    /// Prefetched pages evicted before any use.
    pub evicted_unused: u64,
    /// Prefetch hits / pages prefetched (`None` when nothing was prefetched).
    pub accuracy: Option<f64>,
    /// Prefetch hits / (prefetch hits + demand misses) (`None` for an empty trace).
    pub coverage: Option<f64>,
    /// Prefetched pages never used / pages fetched.
    pub waste: Option<f64>,
    /// Median accesses between a page's prefetch and its first use.
    pub timeliness_p50: Option<u64>,
    /// 95th percentile of the same.
    pub timeliness_p95: Option<u64>,
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// Nearest-rank percentile of unsorted samples (reorders them).
pub fn percentile(samples: &mut [u64], p: f64) -> Option<u64> {
    if samples.is_empty() {
        return None;
    }
    let rank = ((p / 100.0) * samples.len() as f64).ceil() as usize;
    let idx = rank.clamp(1, samples.len()) - 1;
    Some(*samples.select_nth_unstable(idx).1)
}

struct Replay<'a> {
    lru: Lru,
    stats: Stats,
    cands: Candidates,
    pf: &'a mut dyn Prefetcher,
    timeliness: Vec<u64>,
}

impl Replay<'_> {
    fn admit(&mut self, key: u64, now: u64) {
        for i in 0..self.cands.len() {
            let page = self.cands.as_slice()[i];
            if self.lru.get(key, page).is_some() {
                continue;
            }
            let meta = Meta {
                unused_prefetch: true,
                marker: self.cands.is_marker(i),
                fetched_at: now,
            };
            self.stats.cache_adds += 1;
            if let Some(ev) = self.lru.insert(key, page, meta) {
                if ev.meta.unused_prefetch {
                    self.stats.evicted_unused += 1;
                }
            }
        }
    }
}

/// Replays `trace` through `pf`. `progress` is called with the number of records done every
/// 2^16 records and at the end.
pub fn replay(
    trace: &Trace,
    pf: &mut dyn Prefetcher,
    cfg: &EvalConfig,
    progress: &mut dyn FnMut(u64),
) -> Result<Stats, EvalError> {
    if cfg.local_pages == 0 {
        return Err(EvalError::NoLocalMemory);
    }
    let mut r = Replay {
        lru: Lru::new(cfg.local_pages),
        stats: Stats {
            prefetcher: pf.name().to_string(),
            ..Stats::default()
        },
        cands: Candidates::new(),
        pf,
        timeliness: Vec::new(),
    };
    for (n, rec) in trace.records.iter().enumerate() {
        if n & 0xffff == 0 && n > 0 {
            progress(n as u64);
        }
        let (key, page, now) = (rec.key, rec.page, rec.time);
        match r.lru.get(key, page) {
            Some(idx) => {
                let meta = *r.lru.meta(idx);
                if meta.unused_prefetch {
                    r.lru.meta(idx).unused_prefetch = false;
                    r.stats.prefetch_hits += 1;
                    r.timeliness.push(now.saturating_sub(meta.fetched_at));
                    if cfg.eager_eviction {
                        r.lru.demote(idx);
                    } else {
                        r.lru.touch(idx);
                    }
                    if meta.marker {
                        r.stats.marker_hits += 1;
                        if cfg.marker_continuation {
                            r.pf.on_marker_hit(key, page, now, &mut r.cands);
                            r.admit(key, now);
                        } else {
                            r.pf.on_hit(key, page, now);
                        }
                    } else if cfg.hits == HitVisibility::Visible {
                        r.pf.on_hit(key, page, now);
                    }
                } else {
                    r.lru.touch(idx);
                }
            }
            None => {
                r.stats.demand_misses += 1;
                if let Some(ev) = r.lru.insert(key, page, Meta::default()) {
                    if ev.meta.unused_prefetch {
                        r.stats.evicted_unused += 1;
                    }
                }
                r.pf.on_fault(key, page, now, &mut r.cands);
                r.admit(key, now);
            }
        }
    }
    progress(trace.records.len() as u64);
    let mut s = r.stats;
    s.accesses = trace.records.len() as u64;
    s.accuracy = ratio(s.prefetch_hits, s.cache_adds);
    s.coverage = ratio(s.prefetch_hits, s.prefetch_hits + s.demand_misses);
    s.waste = ratio(
        s.cache_adds - s.prefetch_hits,
        s.cache_adds + s.demand_misses,
    );
    s.timeliness_p50 = percentile(&mut r.timeliness, 50.0);
    s.timeliness_p95 = percentile(&mut r.timeliness, 95.0);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{build, Config};
    use crate::trace::gen::Workload;

    fn run(name: &str, trace: &Trace, hits: HitVisibility, local: usize) -> Stats {
        let mut pf = build(name, &Config::default()).unwrap();
        let cfg = EvalConfig {
            local_pages: local,
            hits,
            eager_eviction: false,
            marker_continuation: true,
        };
        replay(trace, pf.as_mut(), &cfg, &mut |_| {}).unwrap()
    }

    #[test]
    fn none_misses_every_first_touch() {
        let t = Trace::from_pairs([(1, 1), (1, 2), (1, 1), (1, 3), (1, 1)]);
        let s = run("none", &t, HitVisibility::Visible, 2);
        // 1 miss, 2 miss, 1 hit, 3 miss (evicts 2), 1 hit.
        assert_eq!(s.demand_misses, 3);
        assert_eq!(s.cache_adds, 0);
        assert_eq!(s.coverage, Some(0.0));
        assert_eq!(s.accuracy, None);
    }

    #[test]
    fn next_n_accounting_by_hand() {
        // next-n (N=8) on 0..=9: miss 0 → fetch 1..=8 (8 hits), miss 9 → fetch 10..=17 (unused).
        let t = Trace::from_pairs((0..10).map(|p| (1, p)));
        let s = run("next-n", &t, HitVisibility::Visible, 100);
        assert_eq!((s.demand_misses, s.cache_adds, s.prefetch_hits), (2, 16, 8));
        assert_eq!(s.accuracy, Some(0.5));
        assert_eq!(s.coverage, Some(0.8));
        // Page k (1..=8) was prefetched at t=0 and used at t=k.
        assert_eq!(s.timeliness_p50, Some(4));
        assert_eq!(s.timeliness_p95, Some(8));
        assert_eq!(s.waste, Some(8.0 / 18.0));
    }

    #[test]
    fn paper_leap_reaches_its_ceiling_only_with_visible_hits() {
        let t = Workload::Sequential {
            pages: 1 << 16,
            passes: 1,
        }
        .trace()
        .unwrap();
        let vis = run("leap", &t, HitVisibility::Visible, 1 << 15);
        let cov = vis.coverage.unwrap();
        assert!((cov - 8.0 / 9.0).abs() < 0.01, "visible coverage {cov}");
        assert!(vis.accuracy.unwrap() > 0.99);
        let inj = run("leap", &t, HitVisibility::Injected, 1 << 15);
        assert!(
            inj.coverage.unwrap() < cov - 0.05,
            "injected coverage {:?}",
            inj.coverage
        );
    }

    #[test]
    fn markers_count_as_hits_not_misses_in_injected_mode() {
        let t = Workload::Sequential {
            pages: 1 << 14,
            passes: 1,
        }
        .trace()
        .unwrap();
        let s = run("stream", &t, HitVisibility::Injected, 1 << 13);
        assert!(s.marker_hits > 0);
        assert!(s.demand_misses <= 4, "{s:?}");
        assert!(s.coverage.unwrap() > 0.999);
    }

    #[test]
    fn eager_eviction_keeps_unused_prefetches_longer() {
        // A scan with a hot page re-read between scan pages: eager eviction drops consumed scan
        // pages first, so the hot page survives in a tiny memory.
        let mut pairs = Vec::new();
        for p in 0..4000u64 {
            pairs.push((1, 1_000_000));
            pairs.push((1, p));
        }
        let t = Trace::from_pairs(pairs);
        let mut pf = build("next-n", &Config::default()).unwrap();
        let lazy = replay(
            &t,
            pf.as_mut(),
            &EvalConfig {
                local_pages: 12,
                hits: HitVisibility::Visible,
                eager_eviction: false,
                marker_continuation: true,
            },
            &mut |_| {},
        )
        .unwrap();
        let mut pf = build("next-n", &Config::default()).unwrap();
        let eager = replay(
            &t,
            pf.as_mut(),
            &EvalConfig {
                local_pages: 12,
                hits: HitVisibility::Visible,
                eager_eviction: true,
                marker_continuation: true,
            },
            &mut |_| {},
        )
        .unwrap();
        assert!(
            eager.demand_misses <= lazy.demand_misses,
            "eager {eager:?} lazy {lazy:?}"
        );
        assert!(eager.evicted_unused <= lazy.evicted_unused);
    }

    #[test]
    fn zero_local_pages_is_an_error() {
        let t = Trace::from_pairs([(1, 1)]);
        let mut pf = build("none", &Config::default()).unwrap();
        let cfg = EvalConfig {
            local_pages: 0,
            hits: HitVisibility::Visible,
            eager_eviction: false,
            marker_continuation: true,
        };
        assert_eq!(
            replay(&t, pf.as_mut(), &cfg, &mut |_| {}),
            Err(EvalError::NoLocalMemory)
        );
    }

    #[test]
    fn percentiles_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&mut v, 50.0), Some(50));
        assert_eq!(percentile(&mut v, 95.0), Some(95));
        assert_eq!(percentile(&mut [], 95.0), None);
    }
}
