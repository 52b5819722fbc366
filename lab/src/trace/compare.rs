//! `farvm-lab trace compare`: every prefetcher on trace files, as markdown, with the verdict of
//! the rule for real traces (`farvm_prefetch::compare`).

use std::fmt::Write as _;
use std::fs::File;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use farvm_prefetch::compare::{compare, Comparison, COMPARED, MAX_WASTE};
use farvm_prefetch::trace::read_trace;
use farvm_prefetch::Config;

use super::progress;

pub(super) const COMPARE_ABOUT: &str = "\
Replay trace files through every prefetcher and print markdown tables with the verdict of the
rule farvm's default must meet on real programs.

Each trace is replayed with injected hits (what farvm's VMM sees) through a local memory of half
its footprint (distinct process/page pairs), once per prefetcher: none, next-n, stride,
read-ahead, leap, stream, leap+stream. Rule: leap+stream has no more demand misses than the best
of next-n, read-ahead, stride and leap, at a waste (prefetched pages never used / pages fetched)
of at most 10%, and never more demand misses than none.

Output: a summary table (one row per trace: demand misses per prefetcher, leap+stream's waste,
the verdict), then per trace a table of demand misses, coverage, accuracy and waste per
prefetcher. Exits non-zero if a trace breaks the rule.

Examples:
  farvm-lab trace compare traces/*.trace.zst
  farvm-lab trace compare --json traces/sort.trace.zst > sort.json";

/// Arguments of `farvm-lab trace compare`.
#[derive(Args, Debug)]
#[command(long_about = COMPARE_ABOUT)]
pub struct CompareArgs {
    /// Trace files (any format, zstd-compressed or not).
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// Print JSON instead of markdown.
    #[arg(long)]
    json: bool,
    /// Show progress even when stderr is not a terminal.
    #[arg(long)]
    progress: bool,
}

#[derive(serde::Serialize)]
struct Row {
    trace: String,
    comparison: Comparison,
    verdict: farvm_prefetch::compare::Verdict,
}

fn name(p: &std::path::Path) -> String {
    let file = p.file_name().map_or_else(
        || p.display().to_string(),
        |f| f.to_string_lossy().into_owned(),
    );
    file.trim_end_matches(".zst")
        .trim_end_matches(".trace")
        .to_string()
}

fn pct(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |v| format!("{:.1}%", 100.0 * v))
}

/// Renders the summary and per-trace tables.
fn markdown(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "| trace | records | footprint (pages) | local (pages) |"
    );
    for n in COMPARED {
        let _ = write!(out, " {n} |");
    }
    let _ = writeln!(out, " leap+stream waste | verdict |");
    let _ = write!(out, "|---|---:|---:|---:|");
    for _ in COMPARED {
        out.push_str("---:|");
    }
    out.push_str("---:|---|\n");
    for r in rows {
        let c = &r.comparison;
        let _ = write!(
            out,
            "| {} | {} | {} | {} |",
            r.trace, c.records, c.footprint, c.local_pages
        );
        for s in &c.stats {
            let bold = s.prefetcher == "leap+stream";
            let m = s.demand_misses;
            let _ = if bold {
                write!(out, " **{m}** |")
            } else {
                write!(out, " {m} |")
            };
        }
        let v = &r.verdict;
        let verdict = if v.pass {
            format!(
                "PASS (best baseline {} {})",
                v.best_baseline, v.best_baseline_misses
            )
        } else {
            format!(
                "FAIL (best baseline {} {})",
                v.best_baseline, v.best_baseline_misses
            )
        };
        let _ = writeln!(out, " {:.1}% | {verdict} |", 100.0 * v.default_waste);
    }
    for r in rows {
        let _ = writeln!(
            out,
            "\n**{}** ({} records, footprint {} pages, local memory {} pages, injected hits)\n",
            r.trace, r.comparison.records, r.comparison.footprint, r.comparison.local_pages
        );
        let _ = write!(out, "| |");
        for s in &r.comparison.stats {
            let _ = write!(out, " {} |", s.prefetcher);
        }
        out.push_str("\n|---|");
        for _ in &r.comparison.stats {
            out.push_str("---:|");
        }
        out.push('\n');
        type Cell = fn(&farvm_prefetch::eval::Stats) -> String;
        let metrics: [(&str, Cell); 5] = [
            ("demand misses", |s| s.demand_misses.to_string()),
            ("pages prefetched", |s| s.cache_adds.to_string()),
            ("coverage", |s| pct(s.coverage)),
            ("accuracy", |s| pct(s.accuracy)),
            ("waste", |s| pct(s.waste)),
        ];
        for (label, cell) in metrics {
            let _ = write!(out, "| {label} |");
            for s in &r.comparison.stats {
                let _ = write!(out, " {} |", cell(s));
            }
            out.push('\n');
        }
    }
    let _ = writeln!(
        out,
        "\nRule: leap+stream demand misses <= min(next-n, read-ahead, stride, leap) and <= none, \
         at waste <= {:.0}%.",
        100.0 * MAX_WASTE
    );
    out
}

pub fn run(a: CompareArgs) -> anyhow::Result<()> {
    let cfg = Config::default();
    let mut rows = Vec::with_capacity(a.traces.len());
    let pb = progress::bar(
        (a.traces.len() * COMPARED.len()) as u64,
        a.progress,
        "comparing",
    );
    for p in &a.traces {
        let f = File::open(p).with_context(|| format!("opening {}", p.display()))?;
        let trace = read_trace(f).with_context(|| format!("reading {}", p.display()))?;
        let trace_name = name(p);
        let mut last = String::new();
        let comparison = compare(&trace, &cfg, &mut |n, _| {
            if n != last {
                last = n.to_string();
                pb.set_message(format!("{trace_name}: {n}"));
                pb.inc(1);
            }
        })
        .map_err(anyhow::Error::msg)?;
        let verdict = comparison.verdict();
        rows.push(Row {
            trace: trace_name,
            comparison,
            verdict,
        });
    }
    pb.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", markdown(&rows));
    }
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| !r.verdict.pass)
        .map(|r| r.trace.as_str())
        .collect();
    if !failed.is_empty() {
        anyhow::bail!("leap+stream breaks the rule on {}", failed.join(", "));
    }
    Ok(())
}
