//! farvm's default prefetcher on traces of real programs: every trace committed in `traces/`
//! (made by `scripts/make-trace.sh`, see `traces/README.md`) is replayed with injected hits
//! through a local memory of half its footprint, and `leap+stream` must meet the rule of
//! `farvm_prefetch::compare`: no more demand misses than the best of next-n, read-ahead, stride
//! and leap, at most 10% waste, and never more demand misses than no prefetching.
//!
//! The rule is not met on every trace yet. [`KNOWN_GAPS`] names the traces where it fails, with
//! what leap+stream measures there today; for them the test holds that line (no more misses, no
//! more waste) and still demands never more misses than no prefetching. A trace that starts
//! meeting the rule must leave the list, so the list only ever shrinks.

use std::path::{Path, PathBuf};

use farvm_prefetch::compare::{compare, Verdict};
use farvm_prefetch::trace::read_trace;
use farvm_prefetch::Config;

/// Traces where leap+stream does not meet the rule yet: (file name, its demand misses, its
/// waste). See docs/prefetch-real-traces.md for the analysis.
const KNOWN_GAPS: &[(&str, u64, f64)] = &[
    // Waste 13.0% > 10% (misses 457 <= next-n's 468).
    ("redis.trace.zst", 457, 0.1300),
    // Misses 1436 > next-n's 1240, waste 10.6%.
    ("mix-numpy-redis.trace.zst", 1436, 0.1056),
];

/// The kinds of program the committed set must cover (file names start with these).
const EXPECTED: &[&str] = &["sqlite", "redis", "numpy", "sort", "xz", "mix-"];

fn committed_traces() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces");
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the committed traces are missing: {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("listing traces/").path())
        .filter(|p| p.to_string_lossy().ends_with(".trace.zst"))
        .collect();
    files.sort();
    files
}

fn check(path: &Path) -> (String, Verdict) {
    let name = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let file =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("opening {}: {e}", path.display()));
    let trace = read_trace(file).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    assert!(
        trace.records.len() > 100_000 && trace.kinds && trace.records.iter().any(|r| r.write),
        "{name}: a real trace has reads and writes and more than 100k records"
    );
    let c = compare(&trace, &Config::default(), &mut |_, _| {})
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    (name, c.verdict())
}

#[test]
fn leap_stream_meets_the_rule_or_holds_its_known_gap_on_every_committed_trace() {
    let files = committed_traces();
    for kind in EXPECTED {
        assert!(
            files.iter().any(|f| f
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(kind))),
            "no committed trace of kind `{kind}` in {files:?}"
        );
    }
    // Two threads: the machine running the suite is small, and each replay is single-threaded.
    let (a, b) = files.split_at(files.len() / 2);
    let verdicts: Vec<(String, Verdict)> = std::thread::scope(|s| {
        let h = s.spawn(|| a.iter().map(|p| check(p)).collect::<Vec<_>>());
        let mut v: Vec<_> = b.iter().map(|p| check(p)).collect();
        v.extend(h.join().expect("replay thread"));
        v
    });
    let mut failed = Vec::new();
    for (n, v) in &verdicts {
        let line = format!(
            "{n}: leap+stream {} misses at {:.1}% waste; best baseline {} {}; none {}",
            v.default_misses,
            100.0 * v.default_waste,
            v.best_baseline,
            v.best_baseline_misses,
            v.none_misses
        );
        if v.default_misses > v.none_misses {
            failed.push(format!("more misses than no prefetching: {line}"));
        }
        match KNOWN_GAPS.iter().find(|g| g.0 == n) {
            None if !v.pass => failed.push(format!("rule broken: {line}")),
            Some(_) if v.pass => failed.push(format!(
                "now meets the rule, take it off KNOWN_GAPS: {line}"
            )),
            Some(&(_, misses, waste)) if v.default_misses > misses || v.default_waste > waste => {
                failed.push(format!(
                    "worse than its known gap ({misses} misses, {:.1}% waste): {line}",
                    100.0 * waste
                ))
            }
            _ => {}
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
