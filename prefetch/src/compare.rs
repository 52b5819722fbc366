//! The rule farvm's default prefetcher must meet on traces of real programs, and the comparison
//! behind it.
//!
//! Setting: the trace is replayed with injected hits (farvm's VMM) through a local memory of half
//! its footprint (distinct `(process, page)` pairs), once per prefetcher in [`COMPARED`].
//! Rule: `leap+stream` has no more demand misses than the best of the baselines `next-n`,
//! `read-ahead`, `stride` and `leap`, at a waste of at most 10% (prefetched pages never used /
//! pages fetched), and never more demand misses than `none`.

use crate::eval::{EvalConfig, Stats};
use crate::registry::{Config, DEFAULT};
use crate::report::evaluate;
use crate::trace::Trace;
use crate::HitVisibility;

/// Prefetchers replayed, in table order: every registered one.
pub const COMPARED: &[&str] = crate::registry::NAMES;

/// The baselines the default must match or beat.
pub const BASELINES: &[&str] = &["next-n", "read-ahead", "stride", "leap"];

/// Largest waste the default may have.
pub const MAX_WASTE: f64 = 0.10;

/// One trace replayed through every prefetcher in [`COMPARED`].
#[derive(Clone, Debug, serde::Serialize)]
pub struct Comparison {
    /// Records replayed.
    pub records: u64,
    /// Distinct `(process, page)` pairs.
    pub footprint: usize,
    /// Local memory of the replay, in pages.
    pub local_pages: usize,
    /// In [`COMPARED`] order.
    pub stats: Vec<Stats>,
}

/// The rule's verdict on one comparison.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Verdict {
    /// The baseline with the fewest demand misses.
    pub best_baseline: String,
    /// The best baseline's demand misses.
    pub best_baseline_misses: u64,
    /// The default prefetcher's demand misses.
    pub default_misses: u64,
    /// The default prefetcher's waste (prefetched, never used, over prefetched).
    pub default_waste: f64,
    /// Demand misses without prefetching.
    pub none_misses: u64,
    /// Whether the default meets the rule.
    pub pass: bool,
}

impl Verdict {
    /// Whether a prefetcher with `misses` demand misses at `waste` would meet the rule against
    /// this comparison's baselines (see the module documentation).
    pub fn met_by(&self, misses: u64, waste: f64) -> bool {
        misses <= self.best_baseline_misses && misses <= self.none_misses && waste <= MAX_WASTE
    }
}

impl Comparison {
    /// The replay of `name`.
    pub fn stats(&self, name: &str) -> Option<&Stats> {
        self.stats.iter().find(|s| s.prefetcher == name)
    }

    /// Checks the rule (see the module documentation).
    pub fn verdict(&self) -> Verdict {
        let misses = |n: &str| self.stats(n).map_or(u64::MAX, |s| s.demand_misses);
        let (best, best_misses) = BASELINES
            .iter()
            .map(|&n| (n, misses(n)))
            .min_by_key(|&(_, m)| m)
            .unwrap_or(("", u64::MAX));
        let d = self.stats(DEFAULT);
        let default_misses = d.map_or(u64::MAX, |s| s.demand_misses);
        let default_waste = d.and_then(|s| s.waste).unwrap_or(0.0);
        let mut v = Verdict {
            best_baseline: best.to_string(),
            best_baseline_misses: best_misses,
            default_misses,
            default_waste,
            none_misses: misses("none"),
            pass: false,
        };
        v.pass = v.met_by(default_misses, default_waste);
        v
    }
}

/// Replays `trace` through every prefetcher in [`COMPARED`] with `cfg`, injected hits and a
/// local memory of half the footprint.
pub fn compare(
    trace: &Trace,
    cfg: &Config,
    progress: &mut dyn FnMut(&str, u64),
) -> Result<Comparison, String> {
    let footprint = trace.footprint();
    replay_all(trace, cfg, footprint, (footprint / 2).max(1), progress)
}

/// The replay setting of the rule with `local_pages` of local memory: injected hits, marker
/// continuation, LRU without eager eviction.
pub fn setting(local_pages: usize) -> EvalConfig {
    EvalConfig {
        local_pages,
        hits: HitVisibility::Injected,
        eager_eviction: false,
        marker_continuation: true,
    }
}

/// [`compare`] with `local_pages` of local memory instead of half the footprint (how firm a
/// verdict is: the rule a little off its point).
pub fn compare_at(
    trace: &Trace,
    cfg: &Config,
    local_pages: usize,
    progress: &mut dyn FnMut(&str, u64),
) -> Result<Comparison, String> {
    replay_all(trace, cfg, trace.footprint(), local_pages, progress)
}

/// Every prefetcher of [`COMPARED`] replayed in the rule's setting (the footprint counted once
/// by the caller: it walks every record).
fn replay_all(
    trace: &Trace,
    cfg: &Config,
    footprint: usize,
    local_pages: usize,
    progress: &mut dyn FnMut(&str, u64),
) -> Result<Comparison, String> {
    let stats = evaluate(trace, COMPARED, cfg, &setting(local_pages), progress)?;
    Ok(Comparison {
        records: trace.records.len() as u64,
        footprint,
        local_pages,
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::gen::Workload;

    #[test]
    fn a_scan_passes_and_the_verdict_names_the_best_baseline() {
        let t = Workload::Sequential {
            pages: 4096,
            passes: 2,
        }
        .trace()
        .unwrap();
        let c = compare(&t, &Config::default(), &mut |_, _| {}).unwrap();
        assert_eq!((c.footprint, c.local_pages), (4096, 2048));
        let v = c.verdict();
        assert!(v.pass, "{v:?}");
        assert_eq!(v.best_baseline, "next-n");
        assert_eq!(v.none_misses, 8192);
    }
}
