//! `farvm-lab bench page-space`: the prefetcher learning from guest-virtual page numbers
//! (page-table walks from the faulting process's CR3) against guest-physical ones, with the test
//! guest's frames handed out in 2 MiB runs and fully shuffled, in one invocation.

use std::time::Instant;

use anyhow::Result;
use clap::Args;
use farvm_vmm::remote::PageSpace;
use serde::Serialize;

use super::ab::{compare, print_report, reference, AbArgs, Way};
use super::remote::runner::CellSetup;

pub const PAGE_SPACE_ABOUT: &str = "\
Page space: each cell's prefetcher fed guest-physical page numbers (the baseline) and
guest-virtual ones (`--page-space virtual`: the faulting process's page tables walked from the
CR3 its vCPU's agent slot holds), with the test guest's physical frames handed out in 2 MiB runs
(`--frame-run-shift 9`, farvm run's default with remote memory) and one by one in shuffled order
(`--frame-run-shift 0`, as a long-running kernel's fragmented free lists would), in one
invocation.

Workloads by default: seq and stride at 32M, quicksort 16M, blocked matmul 8M; prefetcher
leap+stream. Every workload: a reference run (all memory local to the engine) gives the
footprint, the budget (--local percent of it) and the checksum every run must reproduce; then,
for each frame layout, --repeat runs of each page space, taking turns. Columns: median measured time of each, their
ratio (physical / virtual: above 1 means virtual is faster), prefetch coverage and demand
faults of each, and the page-table walks the virtual runs made.

EXAMPLES
  farvm-lab bench page-space
  farvm-lab bench page-space --workload seq:ws=32M --repeat 5 --fault-path-cpu 0

EXIT STATUS
  0 every run completed with the reference checksum; 1 a run failed, timed out or differed";

#[derive(Args, Debug)]
pub struct PageSpaceArgs {
    #[command(flatten)]
    pub ab: AbArgs,
    /// Pin every run's fault path to host CPU N (as `farvm run --fault-path-cpu`).
    #[arg(long, value_name = "N")]
    pub fault_path_cpu: Option<usize>,
}

const DEFAULT_WORKLOADS: [&str; 4] = [
    "seq:ws=32M",
    "stride:ws=32M",
    "quicksort:ws=16M",
    "matmul-blocked:ws=8M",
];
/// (name, frame-run shift) of the two frame layouts.
const LAYOUTS: [(&str, u32); 2] = [("2 MiB runs", 9), ("shuffled 4 KiB", 0)];

#[derive(Debug, Serialize)]
struct Row {
    workload: String,
    frames: String,
    local_pct: f64,
    prefetcher: String,
    physical: Way,
    virtual_: Way,
    /// physical / virtual measured time (above 1: virtual is faster).
    speedup: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    fault_path_cpu: Option<usize>,
    rows: Vec<Row>,
    wall_secs: f64,
}

pub fn run(a: PageSpaceArgs) -> Result<()> {
    farvm_vmm::signals::install_termination_handlers()?;
    let t0 = Instant::now();
    farvm_vmm::affinity::check_fault_path_cpu(a.fault_path_cpu).map_err(anyhow::Error::msg)?;
    let plan = a.ab.plan(&DEFAULT_WORKLOADS, &["leap+stream"])?;
    let base_setup = CellSetup {
        fault_path_cpu: a.fault_path_cpu,
        ..CellSetup::default()
    };
    let mut rows = Vec::new();
    for (wi, w) in plan.placed.iter().enumerate() {
        let (reference, budget) = reference(w, a.ab.local, plan.timeout, base_setup)?;
        for pf in &plan.prefetchers {
            for (frames, shift) in LAYOUTS {
                let cell = plan.cell(&a.ab, wi, pf, budget, &reference);
                let with = |page_space| CellSetup {
                    page_space,
                    frame_run_shift: shift,
                    ..base_setup
                };
                let (physical, virtual_) = compare(
                    &cell,
                    (&format!("{frames}, physical"), with(PageSpace::Physical)),
                    (&format!("{frames}, virtual"), with(PageSpace::Virtual)),
                )?;
                rows.push(Row {
                    workload: w.name().to_string(),
                    frames: frames.to_string(),
                    local_pct: a.ab.local,
                    prefetcher: pf.clone(),
                    speedup: physical.measured_ms / virtual_.measured_ms,
                    physical,
                    virtual_,
                });
            }
        }
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        fault_path_cpu: a.fault_path_cpu,
        rows,
        wall_secs: t0.elapsed().as_secs_f64(),
    };
    print_report(&markdown(&report), &report, a.ab.json)
}

fn markdown(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    s.push_str(
        "| workload | frames | local | prefetcher | physical ms | virtual ms | physical / virtual | coverage (physical / virtual) | demand faults (physical / virtual) | page-table walks |\n",
    );
    s.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for row in &r.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {}% | {} | {:.1} | {:.1} | {:.2} | {:.3} / {:.3} | {} / {} | {} |",
            row.workload,
            row.frames,
            row.local_pct,
            row.prefetcher,
            row.physical.measured_ms,
            row.virtual_.measured_ms,
            row.speedup,
            row.physical.coverage,
            row.virtual_.coverage,
            row.physical.demand_faults,
            row.virtual_.demand_faults,
            row.virtual_.page_table_walks,
        );
    }
    let _ = writeln!(
        s,
        "\nFault path: {}. Command: `{}` ({:.0} s).",
        match r.fault_path_cpu {
            Some(c) => format!("pinned to CPU {c}"),
            None => "left to the scheduler".into(),
        },
        r.command,
        r.wall_secs
    );
    s
}
