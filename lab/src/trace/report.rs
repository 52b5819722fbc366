//! `farvm-lab trace report`: the README's results table, regenerated from scratch.

use clap::Args;
use farvm_prefetch::report::{mode, run as run_report, Scale};

use super::{progress, table};

pub(super) const REPORT_ABOUT: &str = "\
Generate the reference traces in memory, replay every prefetcher in both hit-visibility modes,
and print one Leap-style table per trace and mode, then the README's claims with PASS/FAIL.

Traces (with --full): sequential (2^20 pages), stride-10 (2^20 accesses), uniform random (2^20
accesses over 2^20 pages), two-stream (two interleaved scans of 2^19 pages in one process), and a
two-process mix (a 2^19-page scan interleaved 50/50 with a random polluter over 2^22 pages).
Local memory is 2^19 pages. By default every size is divided by 4 (same verdicts, a quarter of
the time); --quick divides by 16. Exits non-zero if a claim fails.

Examples:
  farvm-lab trace report
  farvm-lab trace report --full
  farvm-lab trace report --json > report.json";

/// Arguments of `farvm-lab trace report`.
#[derive(Args, Debug)]
#[command(long_about = REPORT_ABOUT)]
pub struct ReportArgs {
    /// Full-size traces (sizes above; about a minute of CPU).
    #[arg(long, conflicts_with = "quick")]
    full: bool,
    /// Traces 16 times smaller than --full (same verdicts, for a quick look).
    #[arg(long)]
    quick: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Show progress even when stderr is not a terminal.
    #[arg(long)]
    progress: bool,
}

pub fn run(a: ReportArgs) -> anyhow::Result<()> {
    let scale = match (a.full, a.quick) {
        (true, _) => Scale::Full,
        (_, true) => Scale::Quick,
        _ => Scale::Standard,
    };
    let pb = progress::bar(10, a.progress, "report");
    let report = run_report(scale, &mut |step| {
        if step.starts_with("replaying") {
            pb.inc(1);
        }
        pb.set_message(step.to_string());
    });
    pb.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for t in &report.tables {
            println!(
                "== {} ({} records, local memory {} pages, hits {})",
                t.trace,
                t.records,
                t.local_pages,
                mode(t.hits)
            );
            println!("{}", table::render(&t.stats, "accesses"));
        }
        println!("== claims");
        for c in &report.checks {
            let verdict = match c.pass {
                Some(true) => "PASS",
                Some(false) => "FAIL",
                None => "INFO",
            };
            println!(
                "{verdict} {}: {} (target: {})",
                c.claim, c.measured, c.target
            );
        }
    }
    if !report.all_pass() {
        let failed = report
            .checks
            .iter()
            .filter(|c| c.pass == Some(false))
            .count();
        anyhow::bail!(
            "{failed} of {} claims failed",
            report.checks.iter().filter(|c| c.pass.is_some()).count()
        );
    }
    Ok(())
}
