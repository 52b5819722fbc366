//! farvm's default prefetcher on traces of real programs: every trace committed in `traces/`
//! (made by `scripts/make-trace.sh`, see `traces/README.md`) is replayed with injected hits
//! through a local memory of half its footprint, and `leap+stream` must meet the rule of
//! `farvm_prefetch::compare`: no more demand misses than the best of next-n, read-ahead, stride
//! and leap, at most 10% waste, and never more demand misses than no prefetching. It holds on
//! every committed trace (docs/prefetch-real-traces.md has the table).

use std::path::{Path, PathBuf};

use farvm_prefetch::compare::{compare, Verdict};
use farvm_prefetch::trace::read_trace;
use farvm_prefetch::Config;

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
fn leap_stream_meets_the_rule_on_every_committed_trace() {
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
        if !v.pass {
            failed.push(format!("rule broken: {line}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
