//! `farvm-lab bench placement`: what pinning the fault path to one CPU (`--fault-path-cpu`) buys,
//! as ratios against the same cells left to the scheduler, in one invocation; plus the host's
//! thread wake-up round trip on one CPU and across two, which is why it can matter.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Args;
use farvm_vmm::affinity;
use serde::Serialize;

use super::ab::{compare, print_report, reference, AbArgs, Way};
use super::remote::runner::CellSetup;

pub const PLACEMENT_ABOUT: &str = "\
Fault-path placement: each cell run with its fault path pinned to one host CPU and left to the
scheduler, in alternation, in one invocation.

A demand fault hands off between threads several times: the vCPU blocks, the fault handler
wakes and sends the read, the embedded memserver's connection thread wakes and answers, the
handler wakes, installs the page and wakes the vCPU. `--fault-path-cpu N` (of `farvm run` and
`farvm-lab bench remote`) pins vCPU 0, the fault handler and the embedded memserver's connection
threads to CPU N; the evictor and the prefetch receiver stay free. Whether that helps depends
on what a wake-up of an idle CPU costs on the host, so the thread wake-up round trip (a
one-byte ping-pong between two pinned threads) is measured first, on one CPU and across two.

Workloads by default: kv, stride, random and seq at 32M; prefetchers none and leap+stream.
Every cell: a footprint run (all memory local to the engine) sets the budget to --local percent
of the pages the VM touches, as in `farvm-lab bench remote`; then --repeat runs each way, taking
turns. Columns: median measured-phase time of each way, their ratio (unpinned / pinned: above 1
means pinning is faster), demand faults and demand-fault service p50 of each way. Checksums must
equal between all runs of a workload.

EXAMPLES
  farvm-lab bench placement
  farvm-lab bench placement --workload kv:ws=32M,ops=100000 --prefetcher none --repeat 5
  farvm-lab bench placement --cpu 1 --json

EXIT STATUS
  0 every run completed with the same checksum; 1 a run failed, timed out or differed";

#[derive(Args, Debug)]
pub struct PlacementArgs {
    #[command(flatten)]
    pub ab: AbArgs,
    /// The CPU to pin the fault path to [default: the first this process may run on].
    #[arg(long, value_name = "N")]
    pub cpu: Option<usize>,
}

const DEFAULT_WORKLOADS: [&str; 4] = [
    "kv:ws=32M,ops=100000",
    "stride:ws=32M",
    "random:ws=32M,ops=100000",
    "seq:ws=32M",
];
const DEFAULT_PREFETCHERS: [&str; 2] = ["none", "leap+stream"];

#[derive(Debug, Serialize)]
struct Row {
    workload: String,
    local_pct: f64,
    prefetcher: String,
    unpinned: Way,
    pinned: Way,
    /// unpinned / pinned measured time (above 1: pinning is faster).
    speedup: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    cpu: usize,
    /// Thread wake-up round trip, both threads on `cpu`, µs.
    wakeup_same_cpu_us: f64,
    /// The same across `cpu` and another CPU (None with one CPU), µs.
    wakeup_cross_cpu_us: Option<f64>,
    other_cpu: Option<usize>,
    rows: Vec<Row>,
    wall_secs: f64,
}

pub fn run(a: PlacementArgs) -> Result<()> {
    farvm_vmm::signals::install_termination_handlers()?;
    let t0 = Instant::now();
    let allowed = affinity::allowed_cpus().context("reading this process's CPU affinity")?;
    let cpu = match a.cpu {
        Some(c) => {
            affinity::check_cpu(c).map_err(|e| anyhow::anyhow!("--cpu: {e}"))?;
            c
        }
        None => *allowed.first().context("this process may run on no CPU")?,
    };
    let plan = a.ab.plan(&DEFAULT_WORKLOADS, &DEFAULT_PREFETCHERS)?;

    const ROUNDS: u32 = 20_000;
    let same = affinity::wakeup_round_trip(cpu, cpu, ROUNDS).context("wake-up round trip")?;
    let other_cpu = allowed.iter().copied().find(|&c| c != cpu);
    let cross = other_cpu
        .map(|o| affinity::wakeup_round_trip(cpu, o, ROUNDS))
        .transpose()
        .context("wake-up round trip across CPUs")?;
    eprintln!(
        "thread wake-up round trip: {:.1} µs on CPU {cpu}{}",
        us(same),
        match (cross, other_cpu) {
            (Some(c), Some(o)) => format!(", {:.1} µs between CPUs {cpu} and {o}", us(c)),
            _ => ", one CPU only".into(),
        }
    );

    let mut rows = Vec::new();
    for (wi, w) in plan.placed.iter().enumerate() {
        let (base, budget) = reference(w, a.ab.local, plan.timeout, CellSetup::default())?;
        for pf in &plan.prefetchers {
            let cell = plan.cell(&a.ab, wi, pf, budget, &base);
            let pinned = CellSetup {
                fault_path_cpu: Some(cpu),
                ..CellSetup::default()
            };
            let (u, p) = compare(
                &cell,
                ("unpinned", CellSetup::default()),
                (&format!("pinned to CPU {cpu}"), pinned),
            )?;
            rows.push(Row {
                workload: w.name().to_string(),
                local_pct: a.ab.local,
                prefetcher: pf.clone(),
                speedup: u.measured_ms / p.measured_ms,
                unpinned: u,
                pinned: p,
            });
        }
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cpu,
        wakeup_same_cpu_us: us(same),
        wakeup_cross_cpu_us: cross.map(us),
        other_cpu,
        rows,
        wall_secs: t0.elapsed().as_secs_f64(),
    };
    print_report(&markdown(&report), &report, a.ab.json)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn markdown(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Thread wake-up round trip: {:.1} µs on CPU {}{}.\n",
        r.wakeup_same_cpu_us,
        r.cpu,
        match (r.wakeup_cross_cpu_us, r.other_cpu) {
            (Some(c), Some(o)) => format!(", {c:.1} µs between CPUs {} and {o}", r.cpu),
            _ => ", one CPU only".into(),
        }
    );
    let _ = writeln!(
        s,
        "| workload | local | prefetcher | unpinned ms | pinned to CPU {} ms | unpinned / pinned | whole process s (unpinned / pinned) | demand faults (unpinned / pinned) | fault p50 µs (unpinned / pinned) |",
        r.cpu
    );
    s.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for row in &r.rows {
        let _ = writeln!(
            s,
            "| {} | {}% | {} | {:.1} | {:.1} | {:.2} | {:.1} / {:.1} | {} / {} | {:.1} / {:.1} |",
            row.workload,
            row.local_pct,
            row.prefetcher,
            row.unpinned.measured_ms,
            row.pinned.measured_ms,
            row.speedup,
            row.unpinned.total_ms / 1e3,
            row.pinned.total_ms / 1e3,
            row.unpinned.demand_faults,
            row.pinned.demand_faults,
            row.unpinned.fault_p50_us,
            row.pinned.fault_p50_us
        );
    }
    let _ = writeln!(s, "\nCommand: `{}` ({:.0} s).", r.command, r.wall_secs);
    s
}
