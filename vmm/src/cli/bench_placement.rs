//! `farvm bench placement`: what pinning the fault path to one CPU (`--fault-path-cpu`) buys,
//! as ratios against the same cells left to the scheduler, in one invocation; plus the host's
//! thread wake-up round trip on one CPU and across two, which is why it can matter.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use farvm_vmm::affinity;
use farvm_vmm::devices::pvctl::ProcessRecord;
use farvm_vmm::remote::{Budget, RemoteStats};
use farvm_vmm::workload_spec::place;
use serde::Serialize;

use super::bench_remote::{budget_for, median_run, run_remote, times};

pub const PLACEMENT_ABOUT: &str = "\
Fault-path placement: each cell run with its fault path pinned to one host CPU and left to the
scheduler, in alternation, in one invocation.

A demand fault hands off between threads several times: the vCPU blocks, the fault handler
wakes and sends the read, the embedded memserver's connection thread wakes and answers, the
handler wakes, installs the page and wakes the vCPU. `--fault-path-cpu N` (of `farvm run` and
`farvm bench remote`) pins vCPU 0, the fault handler and the embedded memserver's connection
threads to CPU N; the evictor and the prefetch receiver stay free. Whether that helps depends
on what a wake-up of an idle CPU costs on the host, so the thread wake-up round trip (a
one-byte ping-pong between two pinned threads) is measured first, on one CPU and across two.

Every cell: a footprint run (all memory local to the engine) sets the budget to --local percent
of the pages the VM touches, as in `farvm bench remote`; then --repeat runs each way, taking
turns. Columns: median measured-phase time of each way, their ratio (unpinned / pinned: above 1
means pinning is faster), demand faults and demand-fault service p50 of each way. Checksums must
equal between all runs of a workload.

EXAMPLES
  farvm bench placement
  farvm bench placement --workload kv:ws=32M,ops=100000 --prefetcher none --repeat 5
  farvm bench placement --cpu 1 --json

EXIT STATUS
  0 every run completed with the same checksum; 1 a run failed, timed out or differed";

#[derive(Args, Debug)]
pub struct PlacementArgs {
    /// Workload (repeatable; NAME[:key=value,...]) [default: kv, stride, random and seq at
    /// 32M].
    #[arg(long = "workload", value_name = "SPEC")]
    pub workloads: Vec<String>,
    /// Local memory, percent of the footprint.
    #[arg(long = "local", value_name = "PCT", default_value_t = 25.0)]
    pub local: f64,
    /// Prefetcher (repeatable) [default: none leap+stream].
    #[arg(long = "prefetcher", value_name = "NAME")]
    pub prefetchers: Vec<String>,
    /// The CPU to pin the fault path to [default: the first this process may run on].
    #[arg(long, value_name = "N")]
    pub cpu: Option<usize>,
    /// Runs per cell and placement (median reported).
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=15))]
    pub repeat: u32,
    /// Seconds one VM may run; a cell that hits it fails the bench (a ratio needs both).
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub cell_timeout: u64,
    /// Print the results as JSON too.
    #[arg(long)]
    pub json: bool,
}

const DEFAULT_WORKLOADS: [&str; 4] = [
    "kv:ws=32M,ops=100000",
    "stride:ws=32M",
    "random:ws=32M,ops=100000",
    "seq:ws=32M",
];
const DEFAULT_PREFETCHERS: [&str; 2] = ["none", "leap+stream"];

/// One way of running a cell.
#[derive(Debug, Serialize)]
struct Way {
    measured_ms: f64,
    /// The median run's whole process (setup, warm-up, measured phase) by the host clock.
    total_ms: f64,
    runs_ms: Vec<f64>,
    demand_faults: u64,
    fault_p50_us: f64,
}

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
    if !(a.local > 0.0 && a.local < 100.0) {
        bail!("--local {}: must be a percentage in (0, 100)", a.local);
    }
    let allowed = affinity::allowed_cpus().context("reading this process's CPU affinity")?;
    let cpu = match a.cpu {
        Some(c) => {
            affinity::check_cpu(c).map_err(anyhow::Error::msg)?;
            c
        }
        None => *allowed.first().context("this process may run on no CPU")?,
    };
    let specs: Vec<String> = if a.workloads.is_empty() {
        DEFAULT_WORKLOADS.iter().map(|s| s.to_string()).collect()
    } else {
        a.workloads.clone()
    };
    let pfs: Vec<String> = if a.prefetchers.is_empty() {
        DEFAULT_PREFETCHERS.iter().map(|s| s.to_string()).collect()
    } else {
        a.prefetchers.clone()
    };
    for p in &pfs {
        if !farvm_prefetch::registry::names().contains(&p.as_str()) {
            bail!(
                "unknown --prefetcher `{p}` (known: {})",
                farvm_prefetch::registry::names().join(", ")
            );
        }
    }
    let placed = place(&specs, 1).map_err(anyhow::Error::msg)?;
    let timeout = Duration::from_secs(a.cell_timeout.max(1));

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
    for (wi, w) in placed.iter().enumerate() {
        let (probe, st) = run_remote(w, Budget::Unlimited, "none", timeout, None)?;
        let base = probe.with_context(|| {
            format!(
                "{}: the footprint run did not finish in {} s",
                w.name(),
                a.cell_timeout
            )
        })?;
        let budget = budget_for(a.local, st.engine.resident_pages);
        for pf in &pfs {
            let mut unpinned = Vec::new();
            let mut pinned = Vec::new();
            for round in 0..a.repeat {
                // Taking turns, and starting each round with the other way: a drift in the
                // host's load spreads over both.
                let order = if round % 2 == 0 {
                    [None, Some(cpu)]
                } else {
                    [Some(cpu), None]
                };
                for way in order {
                    if farvm_vmm::signals::termination_requested().is_some() {
                        bail!("interrupted");
                    }
                    let (rec, st) = run_remote(w, budget, pf, timeout, way)?;
                    let what = format!(
                        "{} {}% {pf} {}",
                        specs[wi],
                        a.local,
                        way.map_or("unpinned".into(), |c| format!("pinned to CPU {c}"))
                    );
                    let rec = rec.with_context(|| {
                        format!("{what}: did not finish in {} s", a.cell_timeout)
                    })?;
                    if rec.checksum != base.checksum || rec.ops != base.ops {
                        bail!(
                            "{what}: checksum {:#x} differs from the footprint run's {:#x}",
                            rec.checksum,
                            base.checksum
                        );
                    }
                    eprintln!("{what}: {:.1} ms", times(&rec).0);
                    match way {
                        None => unpinned.push((rec, st)),
                        Some(_) => pinned.push((rec, st)),
                    }
                }
            }
            let (u, p) = (way(unpinned), way(pinned));
            rows.push(Row {
                workload: w.name().to_string(),
                local_pct: a.local,
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
    print!("{}", markdown(&report));
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The median run of one way (by measured time) with every run's time.
fn way(runs: Vec<(ProcessRecord, RemoteStats)>) -> Way {
    let runs_ms: Vec<f64> = runs.iter().map(|(r, _)| times(r).0).collect();
    let (rec, st) = median_run(runs, |(r, _)| times(r).0).expect("repeat >= 1");
    Way {
        measured_ms: times(&rec).0,
        total_ms: times(&rec).1,
        runs_ms,
        demand_faults: st.engine.counters.demand_faults,
        fault_p50_us: st.engine.fault_service.p50 as f64 / 1e3,
    }
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
