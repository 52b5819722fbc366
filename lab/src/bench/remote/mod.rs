//! `farvm-lab bench remote`: every workload × local-memory share × prefetcher, each run in a
//! fresh test-guest VM whose RAM is remote (paging engine + an embedded memserver on loopback),
//! against baselines measured in the same invocation: the same workload with all RAM local (no
//! engine), and the 4 KiB TCP request/response floor of this loopback. Writes `remote.md`
//! (markdown table), `remote.json` and PNG charts into `--out`.
//!
//! Files: `plan.rs` (the matrix the options ask for), `runner.rs` (one VM run), `runs.rs`
//! (medians of repeated runs), `floor.rs` (loopback floors), `workload.rs` (one workload's
//! baselines and cells), `report.rs` (the JSON report), `markdown.rs` and `targets.rs`
//! (`remote.md`), `charts.rs` (PNGs). This file: the options and the order of work.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use farvm_vmm::remote::PageSpace;
use indicatif::{ProgressBar, ProgressStyle};

mod charts;
mod cpu;
mod floor;
mod markdown;
mod plan;
mod report;
pub(super) mod runner;
pub(super) mod runs;
mod targets;
mod workload;

use plan::Matrix;
use report::{write_report, Report};

pub const REMOTE_ABOUT: &str = "\
Remote-memory matrix: each workload x local memory x prefetcher, in one invocation.

Every cell boots a fresh test-guest VM (one process on vCPU 0) whose RAM is remote: the paging
engine keeps --local percent of the VM's footprint resident and pages the rest to an embedded
memserver on loopback (a fresh one per run). The footprint is the number of pages the VM touches
when nothing is evicted (measured per workload by a first run with all memory local to the
engine), so 50% and 25% mean half and a quarter of what the VM actually uses. Baselines measured
in the same invocation: the same workload with all guest RAM local (no engine: \"all-local\"),
the raw TCP 4 KiB request/response floor of this loopback (farvm-memserver's bench, depth 1),
next to which demand-fault latency is shown, and the raw TCP streaming rate of 4 KiB pages (the
most pages per second any remote-memory design can move over this loopback).

Every cell seals its pages (farvm run's default, --page-encryption on); --sealing-pairs runs each
cell unsealed too and reports what sealing costs.

Columns: measured-phase time normalised to all-local; demand faults; prefetch accuracy and
coverage (the engine's estimates: staged markers and probes, 1 in 64 prefetches and 1 in 256
after the first 256, reveal hits of injected prefetches); demand-fault service latency p50/p99 (fault read -> page installed and vCPU woken);
install p50 (UFFDIO_CONTINUE); ns per access (measured time / accesses); page access p50 (stride
only: the guest's own rdtsc timing of each page's first access in a pass: a fault, a prefetch
hit or a resident page).

A targets section above the table checks the remote-memory goals (coverage, time against
all-local, stride page-access latency, no harm on Zipf KV, demand-fault latency against the
TCP floor) and the data path's (the scan's measured time against moving the pages its measured
phase read at the raw streaming rate, CPU per remote page) against this run's numbers.

Writes OUT/remote.md, OUT/remote.json and OUT/*.png (charts need a TrueType font, e.g.
fonts-dejavu-core).

EXAMPLES
  farvm-lab bench remote                    # full matrix (8 workloads x 3 x 7)
  farvm-lab bench remote --quick            # seq, stride, kv x {100,25}% x {none, leap+stream, next-n}
  farvm-lab bench remote --workload stride --local 25 --prefetcher none --prefetcher leap+stream
  farvm-lab bench remote --quick --repeat 5 # medians of 5 runs per cell
  farvm-lab bench remote --workload replay:trace=traces/sqlite.trace.zst,records=300000 \
            --local 50 --local 25 --prefetcher none --prefetcher next-n --prefetcher leap+stream
                                            # a real program's page accesses (single-process
                                            # traces; the trace is the VM's boot blob and
                                            # counts in its footprint)

EXIT STATUS
  0 every run completed with the all-local checksum; 1 a run failed or a checksum differed";

#[derive(Args, Debug)]
pub struct RemoteArgs {
    /// Workload (repeatable; NAME[:key=value,...]) [default: the 8 workloads:
    /// seq/stride/random/kv/pagerank 32M, quicksort 16M, matmul 8M. On 2 cores most cells take
    /// seconds, but naive matmul at 25% and pagerank at 50% and 25% of their footprint thrash
    /// until --cell-timeout, which makes the full matrix last over an hour]. A single-process
    /// trace replays with `replay:trace=FILE[,records=N]` (see `farvm run --help`).
    #[arg(long = "workload", value_name = "SPEC")]
    pub workloads: Vec<String>,
    /// Local memory, percent of guest RAM (repeatable) [default: 100 50 25].
    #[arg(long = "local", value_name = "PCT")]
    pub locals: Vec<f64>,
    /// Prefetcher (repeatable) [default: none read-ahead next-n stride leap stream leap+stream].
    #[arg(long = "prefetcher", value_name = "NAME")]
    pub prefetchers: Vec<String>,
    /// Reduced matrix: seq, stride, kv x {100, 25}% x {none, next-n, leap+stream}.
    #[arg(long)]
    pub quick: bool,
    /// Output directory for remote.md, remote.json and the PNG charts.
    #[arg(long, value_name = "DIR", default_value = "docs/bench/remote")]
    pub out: PathBuf,
    /// Seconds of each round of the floors: two rounds of the request/response floor, three of
    /// the streaming rate (their median is the floor).
    #[arg(long, value_name = "SECS", default_value_t = 1)]
    pub floor_secs: u64,
    /// Print the table as JSON on stdout too.
    #[arg(long)]
    pub json: bool,
    /// Seconds one remote-memory VM may run before it is stopped and its cell reported as
    /// TIMEOUT (the matrix goes on).
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub cell_timeout: u64,
    /// Runs per cell and per all-local baseline (1-15). Each reports its median run (by
    /// measured time) and the spread of all of them, so a ratio target is not decided by one
    /// noisy run: on this 2-core host single runs of the same cell vary by about ±10%.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=15))]
    pub repeat: u32,
    /// Pin every cell's fault path (vCPU 0, fault handler, the embedded memserver's
    /// connection threads) to host CPU N, as `farvm run --fault-path-cpu` [default: left to
    /// the scheduler]. `farvm-lab bench placement` measures what that buys.
    #[arg(long, value_name = "N")]
    pub fault_path_cpu: Option<usize>,
    /// Page numbers every cell's prefetcher learns from, as `farvm run --page-space`.
    #[arg(long, value_name = "virtual|physical", default_value = "virtual")]
    pub page_space: PageSpace,
    /// Also run every cell with `--page-encryption off`: each sealed run (the default, as
    /// `farvm run`) paired with an unsealed one just before it (alternating, so a drift in
    /// the host's load biases neither): the CPU table then shows both runs' CPU per remote page and
    /// what sealing costs per page, and a line compares their measured times. Doubles the
    /// cells' runs.
    #[arg(long)]
    pub sealing_pairs: bool,
}

pub fn run(a: RemoteArgs) -> Result<()> {
    farvm_vmm::signals::install_termination_handlers()?;
    let t0 = Instant::now();
    let m = Matrix::new(&a)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let bar = ProgressBar::new(m.vm_runs() as u64 + 1);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("TCP floor");
    let fl = floor::floor(a.floor_secs)?;
    bar.inc(1);
    let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut baselines = Vec::new();
    let mut cells = Vec::new();
    let report =
        |baselines: &[report::Baseline], cells: &[report::Cell], floor: &report::Floor| Report {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            fault_path_cpu: a.fault_path_cpu,
            host_cpus,
            page_space: a.page_space,
            floor: floor.clone(),
            baselines: baselines.to_vec(),
            cells: cells
                .iter()
                .cloned()
                .map(|mut c| {
                    c.set_floor(floor);
                    c
                })
                .collect(),
            wall_secs: t0.elapsed().as_secs_f64(),
        };
    for wi in 0..m.placed.len() {
        let (baseline, row) = workload::measure(&m, wi, &bar)?;
        baselines.push(baseline);
        cells.extend(row);
        // The results so far, so an interrupted matrix still leaves its finished rows.
        write_report(&a.out, &report(&baselines, &cells, &fl))?;
    }
    bar.finish_and_clear();
    let report = report(&baselines, &cells, &fl);
    let md = write_report(&a.out, &report)?;
    print!("{md}");
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    match charts::charts(&report, &a.out, &m.locals, &m.prefetchers) {
        Ok(files) => {
            for f in files {
                println!("wrote {}", f.display());
            }
        }
        Err(e) => eprintln!("farvm-lab: charts skipped: {e:#}"),
    }
    let timeouts = report.cells.iter().filter(|c| c.timed_out).count();
    if timeouts > 0 {
        eprintln!(
            "farvm-lab: {timeouts} run(s) did not finish within --cell-timeout {} s (TIMEOUT rows)",
            a.cell_timeout
        );
    }
    if report.cells.iter().any(|c| !c.checksum_ok) {
        bail!("a remote-memory run's checksum differs from its all-local run");
    }
    Ok(())
}
