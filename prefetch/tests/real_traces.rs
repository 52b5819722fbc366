//! farvm's default prefetcher on traces of real programs: every trace committed in `traces/`
//! (made by `scripts/make-trace.sh`, see `traces/README.md`) is replayed with injected hits
//! through a local memory of half its footprint, and `leap+stream` must meet the rule of
//! `farvm_prefetch::compare`: no more demand misses than the best of next-n, read-ahead, stride
//! and leap, at most 10% waste, and never more demand misses than no prefetching.
//!
//! The traces are split in two sets (`traces/README.md`): the *tuning set*, on which the
//! prefetchers' settings were chosen, and the *test set*, programs never used for tuning. Each
//! set is a test of its own, so a failure says which (docs/prefetch-real-traces.md has both
//! tables). Every committed trace belongs to exactly one set.

use std::path::{Path, PathBuf};

use farvm_prefetch::compare::{compare, Verdict};
use farvm_prefetch::trace::read_trace;
use farvm_prefetch::Config;

/// The tuning set (file names without `.trace.zst`).
const TUNING: &[&str] = &["sqlite", "redis", "numpy", "sort", "xz", "mix-numpy-redis"];
/// The test set: never used to tune a prefetcher.
const TEST: &[&str] = &[
    "cc1",
    "perl",
    "pydict",
    "pagerank",
    "java",
    "node",
    "bzip2",
    "mix-pydict-pagerank",
];

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

fn stem(path: &Path) -> String {
    path.file_name()
        .map(|f| {
            f.to_string_lossy()
                .trim_end_matches(".trace.zst")
                .to_string()
        })
        .unwrap_or_default()
}

/// The committed traces of `set`; every one of its names must be there.
fn traces_of(set: &[&str]) -> Vec<PathBuf> {
    let files = committed_traces();
    for name in set {
        assert!(
            files.iter().any(|f| stem(f) == *name),
            "no committed trace `{name}.trace.zst` in {files:?}"
        );
    }
    files
        .into_iter()
        .filter(|f| set.contains(&stem(f).as_str()))
        .collect()
}

#[test]
fn every_committed_trace_is_in_one_set() {
    for f in committed_traces() {
        let s = stem(&f);
        assert!(
            TUNING.contains(&s.as_str()) != TEST.contains(&s.as_str()),
            "{s}: in neither or both of the tuning and test sets"
        );
    }
}

#[test]
fn leap_stream_meets_the_rule_on_the_tuning_set() {
    meets_the_rule(&traces_of(TUNING));
}

#[test]
fn leap_stream_meets_the_rule_on_the_test_set() {
    meets_the_rule(&traces_of(TEST));
}

fn meets_the_rule(files: &[PathBuf]) {
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
        if !v.pass {
            failed.push(format!("rule broken: {line}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
