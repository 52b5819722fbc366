//! `--pareto`: the baselines at every setting of their one knob, against `leap+stream` at its
//! own: on each trace, is there a baseline setting with fewer demand misses at no more waste
//! (`leap+stream` is then dominated), and what do the baselines reach when their waste is held
//! to `leap+stream`'s, or to 10%?
//!
//! The rule of `farvm-lab trace compare` sets each baseline at its default (N = 8 pages,
//! PW_max = 8) and asks `leap+stream` for fewer misses at a waste of at most 10% whatever the
//! baseline's own waste. These tables say how much of a failure is a baseline buying misses
//! with waste, and how much is `leap+stream` being beaten at the same waste.

use farvm_prefetch::compare::{compare, setting, MAX_WASTE};
use farvm_prefetch::eval::Stats;
use farvm_prefetch::registry::DEFAULT;
use farvm_prefetch::report::evaluate;
use farvm_prefetch::Config;

use crate::model::{fail, load};

/// The knob of each baseline and the values swept: `next-n` and `stride` fetch N pages,
/// `read-ahead` and `leap` open windows of at most PW_max pages.
const SWEEP: [(&str, &str, &[usize]); 4] = [
    ("next-n", "N", &[1, 2, 3, 4, 6, 8, 12, 16]),
    ("stride", "N", &[1, 2, 3, 4, 6, 8, 12, 16]),
    ("read-ahead", "PW_max", &[1, 2, 4, 8, 16, 32]),
    ("leap", "PW_max", &[1, 2, 4, 8, 16, 32]),
];

/// One baseline setting's result.
struct Point {
    label: String,
    misses: u64,
    waste: f64,
}

fn waste(s: &Stats) -> f64 {
    s.waste.unwrap_or(0.0)
}

/// Every baseline setting of [`SWEEP`] replayed on `t` as `trace compare` replays them.
fn sweep(path: &str, t: &farvm_prefetch::trace::Trace, local_pages: usize) -> Vec<Point> {
    let eval = setting(local_pages);
    let mut points = Vec::new();
    for (name, knob, values) in SWEEP {
        for &v in values {
            let cfg = match knob {
                "N" => Config {
                    next_n: v,
                    ..Config::default()
                },
                _ => Config {
                    pw_max: v,
                    ..Config::default()
                },
            };
            let stats = evaluate(t, &[name], &cfg, &eval, &mut |_, _| {})
                .unwrap_or_else(|e| fail(format!("{path}: {e}")));
            points.extend(stats.iter().map(|s| Point {
                label: format!("{name} {knob}={v}"),
                misses: s.demand_misses,
                waste: waste(s),
            }));
        }
    }
    points
}

/// The fewest misses among `points` at a waste of at most `cap`, as a table cell.
fn fewest_at(points: &[Point], cap: f64) -> (Option<u64>, String) {
    let best = points
        .iter()
        .filter(|p| p.waste <= cap)
        .min_by_key(|p| p.misses);
    match best {
        Some(p) => (
            Some(p.misses),
            format!("{} / {:.1}% ({})", p.misses, 100.0 * p.waste, p.label),
        ),
        None => (None, "none".to_string()),
    }
}

/// `--pareto`: one row per trace, then the counts.
pub(crate) fn pareto(files: &[String]) {
    println!("| trace | leap+stream (misses / waste) | rule of `trace compare` | baseline settings that dominate it | fewest baseline misses at ≤ leap+stream's waste | fewest baseline misses at ≤ 10% waste | leap+stream ≤ 10% and no more misses than that |");
    println!("|---|---|---|---:|---|---|---|");
    let (mut rule, mut undominated, mut capped) = (0, 0, 0);
    for path in files {
        let t = load(path);
        let name = path.rsplit('/').next().unwrap_or(path);
        let name = name.strip_suffix(".trace.zst").unwrap_or(name);
        let c = compare(&t, &Config::default(), &mut |_, _| {})
            .unwrap_or_else(|e| fail(format!("{path}: {e}")));
        let v = c.verdict();
        let own = c
            .stats(DEFAULT)
            .unwrap_or_else(|| fail(format!("{path}: no {DEFAULT} row")));
        let (m0, w0) = (own.demand_misses, waste(own));
        let points = sweep(path, &t, c.local_pages);
        let dominating = points
            .iter()
            .filter(|p| p.misses < m0 && p.waste <= w0)
            .count();
        let (_, matched) = fewest_at(&points, w0);
        let (best_capped, capped_cell) = fewest_at(&points, MAX_WASTE);
        let meets_capped =
            w0 <= MAX_WASTE && m0 <= v.none_misses && best_capped.is_none_or(|m| m0 <= m);
        rule += usize::from(v.pass);
        undominated += usize::from(dominating == 0);
        capped += usize::from(meets_capped);
        println!(
            "| {name} | {m0} / {:.1}% | {} | {dominating} | {matched} | {capped_cell} | {} |",
            100.0 * w0,
            if v.pass { "meets" } else { "fails" },
            if meets_capped { "yes" } else { "no" },
        );
    }
    let n = files.len();
    println!();
    println!("| of {n} traces | count |");
    println!("|---|---:|");
    println!("| meet the rule of `trace compare` (baselines at their defaults) | {rule} |");
    println!("| no baseline setting has fewer misses at no more waste | {undominated} |");
    println!("| leap+stream at ≤ 10% waste with no more misses than any baseline setting at ≤ 10% | {capped} |");
}
