//! `farvm-lab trace eval`: replays a trace file through prefetchers and prints the results.

use std::fs::File;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use farvm_prefetch::eval::{EvalConfig, Stats};
use farvm_prefetch::report::{evaluate, mode};
use farvm_prefetch::trace::read_trace;
use farvm_prefetch::{names, Config, HitVisibility};

use super::{progress, table};

/// Which hit signal the prefetchers get.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum HitsArg {
    /// Every first use of a prefetched page is reported (a kernel swap cache, Leap's setting).
    Visible,
    /// Prefetched pages are injected: only marker pages report their first use (farvm).
    Injected,
    /// Both, one table each.
    Both,
}

pub(super) const EVAL_ABOUT: &str = "\
Replay a page-access trace through prefetchers and print Leap-style metrics.

For each prefetcher the trace is replayed through a local memory of --local-pages pages (LRU;
prefetched pages count against it; pages already resident are not prefetched again). Per record:
a resident, not yet used prefetched page is a prefetch hit; a non-resident page is a demand miss,
fetched, and the prefetcher proposes pages to fetch with it.

Hit visibility (--hits): `visible` tells the prefetcher of every prefetch hit, as Leap's swap
cache does. `injected` models farvm, which maps prefetched pages before the guest touches them:
such a touch raises no fault, so the prefetcher only hears of *marker* pages, which farvm fetches
but leaves unmapped so their first touch faults. A marker's first use counts as a prefetch hit,
never as a demand miss.

Metrics (Leap §3.1): cache adds = pages prefetched; accuracy = prefetch hits / cache adds;
coverage = prefetch hits / (prefetch hits + demand misses); waste = prefetched pages never used /
all pages fetched; timeliness = time from prefetch to first use (p50, p95), in ns for timed
traces, else in accesses.

Examples:
  farvm-lab trace eval --trace seq.trace --local-pages 524288
  farvm-lab trace eval --trace mix.trace --local-pages 262144 --prefetcher leap --global-history
  farvm-lab trace eval --trace seq.trace --local-pages 524288 --hits both --json > results.json";

/// Arguments of `farvm-lab trace eval`.
#[derive(Args, Debug)]
#[command(long_about = EVAL_ABOUT)]
pub struct EvalArgs {
    /// Trace file (text or binary, auto-detected; `-` = stdin).
    #[arg(long)]
    trace: PathBuf,
    /// Local memory in pages.
    #[arg(long)]
    local_pages: usize,
    /// `all`, or a comma-separated list of: none, next-n, stride, read-ahead, leap, stream,
    /// leap+stream.
    #[arg(long, default_value = "all")]
    prefetcher: String,
    /// What prefetchers learn of prefetch hits.
    #[arg(long, value_enum, default_value_t = HitsArg::Injected)]
    hits: HitsArg,
    /// Leap's eager eviction: a prefetched page is the next victim once used.
    #[arg(long)]
    eager_eviction: bool,
    /// Model a caller that reports marker faults with `on_hit` only, without fetching the
    /// next window the prefetcher proposes at a marker (`on_marker_hit`).
    #[arg(long)]
    no_marker_continuation: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Show a progress bar even when stderr is not a terminal.
    #[arg(long)]
    progress: bool,
    /// One global history for all processes instead of one per process.
    #[arg(long)]
    global_history: bool,
    /// Leap's history length H_size.
    #[arg(long, default_value_t = Config::default().h_size)]
    h_size: usize,
    /// Leap's N_split.
    #[arg(long, default_value_t = Config::default().n_split)]
    n_split: usize,
    /// Leap's PW_max (also read-ahead's maximum window).
    #[arg(long, default_value_t = Config::default().pw_max)]
    pw_max: usize,
    /// Stream table entries.
    #[arg(long, default_value_t = Config::default().stream_entries)]
    stream_entries: usize,
    /// Δ_stream: pages within which a fault joins a stream.
    #[arg(long, default_value_t = Config::default().stream_delta)]
    stream_delta: u64,
    /// Maximum pages per stream window.
    #[arg(long, default_value_t = Config::default().stream_max_depth)]
    stream_depth: usize,
    /// N of next-n (and pages per stride prediction).
    #[arg(long, default_value_t = Config::default().next_n)]
    next_n: usize,
}

#[derive(serde::Serialize)]
struct Run<'a> {
    hits: HitVisibility,
    results: &'a [Stats],
}

#[derive(serde::Serialize)]
struct Output<'a> {
    trace: String,
    records: u64,
    timed: bool,
    local_pages: usize,
    eager_eviction: bool,
    config: Config,
    runs: Vec<Run<'a>>,
}

pub fn run(a: EvalArgs) -> anyhow::Result<()> {
    let cfg = Config {
        h_size: a.h_size,
        n_split: a.n_split,
        pw_max: a.pw_max,
        stream_entries: a.stream_entries,
        stream_delta: a.stream_delta,
        stream_max_depth: a.stream_depth,
        next_n: a.next_n,
        per_process: !a.global_history,
        ..Config::default()
    };
    cfg.validate()?;
    let selected: Vec<&str> = if a.prefetcher == "all" {
        names().to_vec()
    } else {
        let mut v = Vec::new();
        for n in a.prefetcher.split(',').map(str::trim) {
            let Some(&known) = names().iter().find(|&&k| k == n) else {
                bail!(
                    "unknown prefetcher `{n}` (known: all, {})",
                    names().join(", ")
                );
            };
            v.push(known);
        }
        v
    };
    if a.local_pages == 0 {
        bail!("--local-pages must be at least 1");
    }
    let trace = if a.trace.as_os_str() == "-" {
        read_trace(std::io::stdin().lock()).context("reading the trace from stdin")?
    } else {
        let f = File::open(&a.trace).with_context(|| format!("opening {}", a.trace.display()))?;
        read_trace(f).with_context(|| format!("reading {}", a.trace.display()))?
    };
    let modes: &[HitVisibility] = match a.hits {
        HitsArg::Visible => &[HitVisibility::Visible],
        HitsArg::Injected => &[HitVisibility::Injected],
        HitsArg::Both => &[HitVisibility::Visible, HitVisibility::Injected],
    };
    let n = trace.records.len() as u64;
    let pb = progress::bar(
        n * (selected.len() * modes.len()) as u64,
        a.progress,
        "replaying",
    );
    let mut all = Vec::new();
    for (m, &hits) in modes.iter().enumerate() {
        let eval = EvalConfig {
            local_pages: a.local_pages,
            hits,
            eager_eviction: a.eager_eviction,
            marker_continuation: !a.no_marker_continuation,
        };
        let mut done_before = 0u64;
        let stats = evaluate(&trace, &selected, &cfg, &eval, &mut |name, done| {
            pb.set_message(format!("{name} ({})", mode(hits)));
            let idx = selected.iter().position(|&s| s == name).unwrap_or(0) as u64;
            done_before = (m as u64 * selected.len() as u64 + idx) * n;
            pb.set_position(done_before + done);
        })
        .map_err(anyhow::Error::msg)?;
        all.push((hits, stats));
    }
    pb.finish_and_clear();
    if a.json {
        let out = Output {
            trace: a.trace.display().to_string(),
            records: n,
            timed: trace.timed,
            local_pages: a.local_pages,
            eager_eviction: a.eager_eviction,
            config: cfg,
            runs: all
                .iter()
                .map(|(h, s)| Run {
                    hits: *h,
                    results: s,
                })
                .collect(),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let unit = if trace.timed { "ns" } else { "accesses" };
    for (hits, stats) in &all {
        println!(
            "trace {} ({n} records), local memory {} pages, hits {}{}{}",
            a.trace.display(),
            a.local_pages,
            mode(*hits),
            if a.eager_eviction {
                ", eager eviction"
            } else {
                ""
            },
            if a.global_history {
                ", global history"
            } else {
                ""
            },
        );
        println!("{}", table::render(stats, unit));
    }
    Ok(())
}
