//! `farvm-lab bench stage2`: what building injected pages' stage-2 entries ahead of the guest
//! (KVM_PRE_FAULT_MEMORY) buys, as the guest sees it: the guest-timed first access of a page,
//! without prefetching, with prefetching and stage-2 pre-fault off, and with it on, in one
//! invocation.

use std::time::Instant;

use anyhow::{bail, Result};
use clap::Args;
use farvm_vmm::remote::Stage2Prefault;
use farvm_vmm::vm::VmReport;
use farvm_workloads::lathist::counter;
use serde::Serialize;

use super::ab::{checked_run, print_report, reference, take_turns, AbArgs, Cell, Checked};
use super::remote::runner::{times, CellSetup};
use super::remote::runs::median_run;

pub const STAGE2_ABOUT: &str = "\
Stage-2 pre-fault: the guest-visible cost of reaching a page, three ways, in one invocation:
no prefetching (every first access of a non-resident page is a demand fault), prefetching with
stage-2 pre-fault off (a prefetched page is mapped on the host, and the guest's first touch
takes a stage-2 fault that KVM resolves from that mapping), and prefetching with stage-2
pre-fault on (KVM_PRE_FAULT_MEMORY builds the EPT/NPT entry as the page is installed: the
first touch takes no exit). Needs a KVM with two-dimensional paging and KVM_PRE_FAULT_MEMORY
(Linux 6.11 or later) for the third way to differ from the second; where KVM refuses the
pre-fault the table says so.

The workload (default stride:ws=32M, Leap's stride-10: one page in ten, every page once per
pass) times each page's first access in a pass in the guest (rdtsc): a fault, a prefetch hit
or a resident page. A reference run (all memory local to the engine) gives the footprint, the
budget (--local percent of it) and the checksum every run must reproduce; then --repeat
rounds of the three ways, taking turns. Columns (median run by page-access p50): page-access
p50 and p99, the no-prefetch p50 over this way's (above 1: faster), measured time, demand
faults, pages injected and pages pre-faulted in stage 2 (engine counters), and the stage-2
faults the guest's vCPU took (KVM's pf_taken statistic: every first touch of a page without
a stage-2 entry).

EXAMPLES
  farvm-lab bench stage2
  farvm-lab bench stage2 --workload stride:ws=16M --repeat 5
  scripts/kvm-lab run target/release/farvm-lab bench stage2 --workload stride:ws=16M

EXIT STATUS
  0 every run completed with the reference checksum; 1 a run failed, timed out or differed";

#[derive(Args, Debug)]
pub struct Stage2Args {
    #[command(flatten)]
    pub ab: AbArgs,
}

/// (name, prefetch, stage-2 pre-fault) of the three ways.
const WAYS: [(&str, bool, bool); 3] = [
    ("no prefetch", false, true),
    ("prefetch, stage-2 pre-fault off", true, false),
    ("prefetch, stage-2 pre-fault on", true, true),
];

#[derive(Debug, Serialize)]
struct Way {
    way: String,
    /// What the engine reported for stage-2 pre-fault in the median run.
    stage2_prefault: Stage2Prefault,
    page_access_p50_ns: f64,
    page_access_p99_ns: f64,
    /// The no-prefetch way's page-access p50 over this one's.
    speedup_p50: f64,
    measured_ms: f64,
    demand_faults: u64,
    prefetch_injected: u64,
    prefault_pages: u64,
    /// KVM `pf_taken` of the guest's vCPU 0: stage-2 faults it took.
    vcpu_stage2_faults: u64,
    /// Page-access p50 of every run (`--repeat`).
    runs_p50_ns: Vec<f64>,
}

#[derive(Debug, Serialize)]
struct Row {
    workload: String,
    local_pct: f64,
    prefetcher: String,
    ways: Vec<Way>,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    rows: Vec<Row>,
    wall_secs: f64,
}

/// KVM's statistic `name` of vCPU 0 in `report` (0 if KVM has no such statistic).
fn vcpu0_stat(report: &VmReport, name: &str) -> u64 {
    report
        .kvm_stats
        .first()
        .and_then(|s| s.as_ref())
        .and_then(|s| s.iter().find(|(k, _)| k == name).map(|&(_, v)| v))
        .unwrap_or(0)
}

/// The guest-timed page-access p50 of a run, in ns.
fn p50(run: &Checked) -> f64 {
    run.record.counters[counter::PAGE_ACCESS_P50_NS] as f64
}

pub fn run(a: Stage2Args) -> Result<()> {
    farvm_vmm::signals::install_termination_handlers()?;
    let t0 = Instant::now();
    let plan = a.ab.plan(&["stride:ws=32M"], &["leap+stream"])?;
    let mut rows = Vec::new();
    for (wi, w) in plan.placed.iter().enumerate() {
        let (reference, budget) = reference(w, a.ab.local, plan.timeout, CellSetup::default())?;
        for pf in &plan.prefetchers {
            let cell = plan.cell(&a.ab, wi, pf, budget, &reference);
            let runs = take_turns(WAYS.len(), a.ab.repeat, |i| {
                let (name, prefetch, stage2_prefault) = WAYS[i];
                let cell = Cell {
                    prefetcher: if prefetch { pf.as_str() } else { "none" },
                    ..cell
                };
                let setup = CellSetup {
                    stage2_prefault,
                    ..CellSetup::default()
                };
                let run = checked_run(&cell, name, setup)?;
                if run.record.counters[counter::PAGE_ACCESSES_TIMED] == 0 {
                    bail!(
                        "{}: the workload timed no page access (use stride with a \
                         page-multiple stride)",
                        cell.what(name)
                    );
                }
                eprintln!(
                    "{}: page access p50 {:.2} µs, measured {:.1} ms",
                    cell.what(name),
                    p50(&run) / 1e3,
                    times(&run.record).0
                );
                Ok(run)
            })?;
            let mut ways: Vec<Way> = runs
                .into_iter()
                .zip(WAYS)
                .map(|(r, (name, _, _))| way(name, r))
                .collect();
            let base = ways[0].page_access_p50_ns;
            for w in &mut ways {
                w.speedup_p50 = base / w.page_access_p50_ns.max(1.0);
            }
            rows.push(Row {
                workload: w.name().to_string(),
                local_pct: a.ab.local,
                prefetcher: pf.clone(),
                ways,
            });
        }
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        rows,
        wall_secs: t0.elapsed().as_secs_f64(),
    };
    print_report(&markdown(&report), &report, a.ab.json)
}

fn way(name: &str, runs: Vec<Checked>) -> Way {
    let runs_p50_ns: Vec<f64> = runs.iter().map(p50).collect();
    let r = median_run(runs, p50).expect("repeat >= 1");
    let c = &r.stats.engine.counters;
    Way {
        way: name.to_string(),
        stage2_prefault: r.stats.stage2_prefault,
        page_access_p50_ns: p50(&r),
        page_access_p99_ns: r.record.counters[counter::PAGE_ACCESS_P99_NS] as f64,
        speedup_p50: f64::NAN,
        measured_ms: times(&r.record).0,
        demand_faults: c.demand_faults,
        prefetch_injected: c.prefetch_injected,
        prefault_pages: c.prefault_pages,
        vcpu_stage2_faults: vcpu0_stat(&r.report, "pf_taken"),
        runs_p50_ns,
    }
}

fn markdown(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    s.push_str(
        "| workload | local | way | stage-2 pre-fault | page access p50 µs | p99 µs | no-prefetch p50 / this | measured ms | demand faults | injected | pre-faulted | vCPU stage-2 faults |\n",
    );
    s.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for row in &r.rows {
        for w in &row.ways {
            let _ = writeln!(
                s,
                "| {} | {}% | {}{} | {} | {:.2} | {:.2} | {:.1} | {:.1} | {} | {} | {} | {} |",
                row.workload,
                row.local_pct,
                w.way,
                if w.way == WAYS[0].0 {
                    String::new()
                } else {
                    format!(" ({})", row.prefetcher)
                },
                if w.prefetch_injected == 0 {
                    "-".to_string()
                } else {
                    serde_json::to_value(w.stage2_prefault)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default()
                },
                w.page_access_p50_ns / 1e3,
                w.page_access_p99_ns / 1e3,
                w.speedup_p50,
                w.measured_ms,
                w.demand_faults,
                w.prefetch_injected,
                w.prefault_pages,
                w.vcpu_stage2_faults,
            );
        }
    }
    let _ = writeln!(
        s,
        "\nCommand: `{}` ({:.0} s). Ratios hold within this run only.",
        r.command, r.wall_secs
    );
    s
}
