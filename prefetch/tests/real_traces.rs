//! farvm's default prefetcher on traces of real programs: every trace committed in `traces/`
//! (made by `scripts/make-trace.sh`, see `traces/README.md`) is replayed with injected hits
//! through a local memory of half its footprint, and `leap+stream` must meet the rule of
//! `farvm_prefetch::compare`: no more demand misses than the best of next-n, read-ahead, stride
//! and leap, at most 10% waste, and never more demand misses than no prefetching.
//!
//! The traces are split in two sets (`traces/README.md`): the *tuning set*, on which the
//! prefetchers' settings were chosen (including two earlier test sets whose results have been
//! seen), and the *test set*, programs never used for tuning. Each set is a test of its own,
//! so a failure says which (docs/prefetch-real-traces.md has the tables). Every committed trace
//! belongs to exactly one set. Where the rule is not met, the program is listed with its
//! measured gap (`TUNING_SET_MISSES`, `TEST_SET_MISSES`), which may not grow, and must leave
//! the list once it meets the rule.

use std::path::{Path, PathBuf};

use farvm_prefetch::compare::{compare, Verdict};
use farvm_prefetch::trace::read_trace;
use farvm_prefetch::Config;

/// The tuning set (file names without `.trace.zst`): the original six, then the first, second
/// and third test sets, each seen once and tuning data since.
const TUNING: &[&str] = &[
    "sqlite",
    "redis",
    "numpy",
    "sort",
    "xz",
    "mix-numpy-redis",
    "cc1",
    "perl",
    "pydict",
    "pagerank",
    "java",
    "node",
    "bzip2",
    "mix-pydict-pagerank",
    "gawk",
    "gzip",
    "zstd",
    "sqlite-range",
    "pyheap",
    "bfs",
    "lua",
    "jq",
    "ruby",
    "ocaml",
    "lame",
    "x264",
    "magick",
    "cxxmap",
    "xmllint",
    "brotli",
];
/// The test set: never used to tune a prefetcher.
const TEST: &[&str] = &[
    "git", "php", "tcl", "pandoc", "gs", "cc1plus", "guile", "diff",
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

/// A program on which `leap+stream` does not meet the rule (yet): its misses and waste may not
/// grow past these bounds, and it must leave its list once it meets the rule.
struct KnownMiss {
    name: &'static str,
    /// Most demand misses, as a multiple of the best baseline's.
    misses: f64,
    /// Most waste.
    waste: f64,
}

const fn known(name: &'static str, misses: f64, waste: f64) -> KnownMiss {
    KnownMiss {
        name,
        misses,
        waste,
    }
}

/// Tuning-set programs where the rule is not met (docs/prefetch-real-traces.md, "The wide
/// arm" and "The third test set, run once").
const TUNING_SET_MISSES: &[KnownMiss] = &[
    known("cc1", 1.05, 0.125),          // 675 vs next-n 664, 11.5% waste
    known("pydict", 1.00, 0.12),        // fewer misses than stride, 11.2% waste
    known("java", 1.10, 0.105),         // 471 vs next-n 442, 9.8% waste
    known("node", 1.10, 0.16),          // 682 vs next-n 638, 15.0% waste
    known("gawk", 1.00, 0.12),          // fewer misses than stride, 10.9% waste
    known("gzip", 1.00, 0.22),          // fewer misses than next-n, 21.4% waste
    known("sqlite-range", 1.12, 0.155), // 124 vs next-n 112, 14.9% waste
    known("bfs", 1.55, 0.035),          // 458 vs next-n 307, 2.7% waste
    known("ruby", 1.00, 0.13),          // fewer misses than next-n, 12.3% waste
    known("lame", 1.30, 0.125),         // 273 vs next-n 211, 11.9% waste
    known("x264", 1.00, 0.32),          // fewer misses than read-ahead, 31.2% waste
];

/// Test-set programs where the rule is not met, measured once after the settings were fixed
/// (docs/prefetch-real-traces.md, "The fourth test set, run once").
const TEST_SET_MISSES: &[KnownMiss] = &[
    known("git", 1.75, 0.155),    // 512 vs next-n 301, 14.7% waste
    known("pandoc", 1.40, 0.165), // 14505 vs next-n 10805, 15.8% waste
    known("gs", 1.25, 0.335),     // 799 vs next-n 671, 32.8% waste
    known("cc1plus", 1.10, 0.15), // 681 vs next-n 640, 14.5% waste
    known("guile", 1.10, 0.165),  // 689 vs next-n 648, 15.9% waste
];

#[test]
fn leap_stream_meets_the_rule_on_the_tuning_set_but_where_it_is_known_to_miss() {
    meets_the_rule(&traces_of(TUNING), TUNING_SET_MISSES);
}

#[test]
fn leap_stream_meets_the_rule_on_the_test_set_but_where_it_is_known_to_miss() {
    meets_the_rule(&traces_of(TEST), TEST_SET_MISSES);
}

fn line(n: &str, v: &Verdict) -> String {
    format!(
        "{n}: leap+stream {} misses at {:.1}% waste; best baseline {} {}; none {}",
        v.default_misses,
        100.0 * v.default_waste,
        v.best_baseline,
        v.best_baseline_misses,
        v.none_misses
    )
}

/// Every file's verdict, replayed on two threads (the machine running the suite is small, and
/// each replay is single-threaded).
fn verdicts(files: &[PathBuf]) -> Vec<(String, Verdict)> {
    let (a, b) = files.split_at(files.len() / 2);
    std::thread::scope(|s| {
        let h = s.spawn(|| a.iter().map(|p| check(p)).collect::<Vec<_>>());
        let mut v: Vec<_> = b.iter().map(|p| check(p)).collect();
        v.extend(h.join().expect("replay thread"));
        v
    })
}

fn meets_the_rule(files: &[PathBuf], known_misses: &[KnownMiss]) {
    let mut failed = Vec::new();
    for (n, v) in &verdicts(files) {
        let line = line(n, v);
        if v.default_misses > v.none_misses {
            failed.push(format!("more misses than no prefetching: {line}"));
        }
        let known = known_misses
            .iter()
            .find(|k| n.trim_end_matches(".trace.zst") == k.name);
        match (v.pass, known) {
            (true, None) => {}
            (true, Some(_)) => failed.push(format!(
                "meets the rule now: take it off its known misses (and update the docs): {line}"
            )),
            (false, None) => failed.push(format!("rule broken: {line}")),
            (false, Some(k)) => {
                let bound = (v.best_baseline_misses as f64 * k.misses).ceil() as u64;
                if v.default_misses > bound || v.default_waste > k.waste {
                    failed.push(format!(
                        "worse than its known miss ({}x the best baseline's misses, \
                         {:.1}% waste): {line}",
                        k.misses,
                        100.0 * k.waste
                    ));
                }
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
