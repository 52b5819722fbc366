//! `farvm-lab bench local`: each workload runs natively (farvm-workloads on the host) and in
//! the test guest (one process, guest RAM local), with identical parameters. Each workload does
//! its own setup and unmeasured warm-up pass before the measured phase; every run repeats
//! `--repeats` times and the table shows medians. Guest time is the guest's rdtsc-measured
//! phase; "host_ms" is the same phase measured by the VMM's host clock at the mailbox
//! doorbells (a cross-check that includes the doorbell exits).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use farvm_guest_agent::boot::flags;
use farvm_guest_agent::pv::{phase, state};
use farvm_units::{format_size, parse_size};
use farvm_vmm::boot::testguest::TestPlan;
use farvm_vmm::builder::{build, VmConfig};
use farvm_vmm::devices::pvctl::ProcessRecord;
use farvm_vmm::vm::VmOutcome;
use farvm_vmm::workload_spec::{place, PlacedWorkload};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

pub const LOCAL_ABOUT: &str = "\
Guest vs native time for each workload, measured in the same invocation.

For every workload, the same farvm-workloads code runs natively on the host and in a ring-3
process of the built-in test guest (guest RAM local, one process on vCPU 0), with the same
working set, seed and parameters. Each run does its setup and one unmeasured warm-up pass
before the measured phase; each side repeats --repeats times (a fresh VM per guest run) and the
table shows medians and the ratio guest/native. Checksums must agree bit for bit.

EXAMPLES
  farvm-lab bench local
  farvm-lab bench local --ws 64M --repeats 5 --workload seq --workload kv
  farvm-lab bench local --json > bench.json

EXIT STATUS
  0 all runs completed and checksums agree; 1 a run failed or a checksum differed";

#[derive(Args, Debug)]
pub struct LocalArgs {
    /// Working set of every workload.
    #[arg(long, value_name = "SIZE", default_value = "256M", value_parser = parse_size)]
    pub ws: u64,
    /// Runs per side (median reported).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub repeats: u32,
    /// Workload to run (repeatable; NAME[:key=value,...] as in `farvm run`)
    /// [default: seq stride random matmul matmul-blocked kv pagerank quicksort].
    #[arg(long = "workload", value_name = "SPEC")]
    pub workloads: Vec<String>,
    /// Guest LAPIC timer frequency.
    #[arg(long, value_name = "HZ", default_value_t = 100)]
    pub timer_hz: u32,
    /// Premap the heap (PV PTE fill) instead of demand paging it.
    #[arg(long)]
    pub premap: bool,
    /// Print the results as JSON.
    #[arg(long)]
    pub json: bool,
}

const DEFAULT_WORKLOADS: [&str; 8] = [
    "seq",
    "stride",
    "random",
    "matmul",
    "matmul-blocked",
    "kv",
    "pagerank",
    "quicksort",
];

#[derive(Debug, Serialize)]
struct Row {
    workload: String,
    ws_bytes: u64,
    native_ms: f64,
    guest_ms: f64,
    host_ms: f64,
    ratio: f64,
    /// Ratio of the fastest runs: less sensitive to other load on a shared host.
    min_ratio: f64,
    checksums_equal: bool,
    native_runs_ms: Vec<f64>,
    guest_runs_ms: Vec<f64>,
    checksum: u64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn native_run(w: &PlacedWorkload) -> Result<(f64, u64)> {
    let o = farvm_workloads::run_native(w.spec.workload.id, &w.spec.params())
        .map_err(|e| anyhow::anyhow!("native {}: {e}", w.name()))?;
    Ok((o.elapsed_ns as f64 / 1e6, o.checksum))
}

/// Host-clock duration of the measured phase, from the doorbell timestamps.
fn host_phase_ms(r: &ProcessRecord) -> f64 {
    let at = |ph| r.events.iter().find(|e| e.phase == ph).map(|e| e.host_ns);
    match (at(phase::MEASURE), at(phase::MEASURED)) {
        (Some(a), Some(b)) if b >= a => (b - a) as f64 / 1e6,
        _ => f64::NAN,
    }
}

fn guest_run(w: &PlacedWorkload, a: &LocalArgs) -> Result<(f64, f64, u64)> {
    let ws = w.spec.ws_bytes;
    // Heap + page tables + kernel, rounded to 64 MiB.
    let mem = ((ws + ws / 256 + (128 << 20)) + (64 << 20) - 1) & !((64 << 20) - 1);
    let mut f = flags::RAM_IS_ZERO;
    if a.premap {
        f |= flags::PREMAP_HEAP;
    }
    let plan = TestPlan {
        procs: vec![w.process_spec()],
        timer_hz: a.timer_hz,
        flags: f,
        frame_shuffle_seed: 1,
        frame_run_shift: 0,
        blob: Vec::new(),
    };
    let cfg = VmConfig::test_guest(&format!("bench-{}", std::process::id()), mem, 1, plan);
    let vm = build(&cfg).context("building the guest VM")?;
    let running = vm.start().context("starting the guest VM")?;
    let outcome = running.wait(Some(Duration::from_secs(1800)), true);
    let report = running.finish(outcome);
    if let VmOutcome::Signal { .. } = report.outcome {
        bail!("interrupted");
    }
    if report.outcome != (VmOutcome::GuestShutdown { status: 0 }) {
        bail!("guest run of {} failed: {}", w.name(), report.outcome);
    }
    let r = report
        .processes
        .first()
        .filter(|r| r.state == state::DONE)
        .with_context(|| format!("guest {}: no finished process in the report", w.name()))?;
    Ok((r.elapsed_ns as f64 / 1e6, host_phase_ms(r), r.checksum))
}

pub fn run(a: LocalArgs) -> Result<()> {
    farvm_vmm::signals::install_termination_handlers()?;
    let specs: Vec<String> = if a.workloads.is_empty() {
        DEFAULT_WORKLOADS
            .iter()
            .map(|n| format!("{n}:ws={}", a.ws))
            .collect()
    } else {
        a.workloads
            .iter()
            .map(|s| {
                if s.contains("ws=") {
                    s.clone()
                } else if s.contains(':') {
                    format!("{s},ws={}", a.ws)
                } else {
                    format!("{s}:ws={}", a.ws)
                }
            })
            .collect()
    };
    let placed = place(&specs, 1).map_err(anyhow::Error::msg)?;
    let bar = ProgressBar::new(placed.len() as u64 * u64::from(a.repeats) * 2);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut rows = Vec::new();
    for w in &placed {
        if !w.spec.workload.native {
            bail!(
                "{} runs only in the guest; it has no native baseline",
                w.name()
            );
        }
        let mut native_ms = Vec::new();
        let mut guest_ms = Vec::new();
        let mut host_ms = Vec::new();
        let mut sums = Vec::new();
        // Interleave native and guest runs so slow drifts of this shared host hit both.
        for rep in 0..a.repeats {
            bar.set_message(format!("{} native #{}", w.name(), rep + 1));
            let (ms, sum) = native_run(w)?;
            native_ms.push(ms);
            sums.push(sum);
            bar.inc(1);
            if farvm_vmm::signals::termination_requested().is_some() {
                bail!("interrupted");
            }
            bar.set_message(format!("{} guest #{}", w.name(), rep + 1));
            let (g, h, sum) = guest_run(w, &a)?;
            guest_ms.push(g);
            host_ms.push(h);
            sums.push(sum);
            bar.inc(1);
        }
        let equal = sums.iter().all(|s| *s == sums[0]);
        let n = median(&mut native_ms.clone());
        let g = median(&mut guest_ms.clone());
        rows.push(Row {
            workload: w.name().to_string(),
            ws_bytes: w.spec.ws_bytes,
            native_ms: n,
            guest_ms: g,
            host_ms: median(&mut host_ms),
            ratio: g / n,
            min_ratio: guest_ms.iter().copied().fold(f64::INFINITY, f64::min)
                / native_ms.iter().copied().fold(f64::INFINITY, f64::min),
            checksums_equal: equal,
            native_runs_ms: native_ms,
            guest_runs_ms: guest_ms,
            checksum: sums[0],
        });
    }
    bar.finish_and_clear();
    if a.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        println!(
            "farvm-lab bench local: median of {} runs per side, guest = test guest ring 3, local RAM",
            a.repeats
        );
        println!(
            "{:<15} {:>6} {:>11} {:>11} {:>11} {:>7} {:>9}  checksums",
            "workload", "ws", "native_ms", "guest_ms", "host_ms", "ratio", "min_ratio"
        );
        for r in &rows {
            println!(
                "{:<15} {:>6} {:>11.2} {:>11.2} {:>11.2} {:>7.3} {:>9.3}  {}",
                r.workload,
                format_size(r.ws_bytes),
                r.native_ms,
                r.guest_ms,
                r.host_ms,
                r.ratio,
                r.min_ratio,
                if r.checksums_equal { "equal" } else { "DIFFER" }
            );
        }
    }
    if rows.iter().any(|r| !r.checksums_equal) {
        bail!("guest and native checksums differ");
    }
    Ok(())
}
