//! A/B runs of one remote-memory cell under two or more setups ([`CellSetup`]), taking turns,
//! for the benches that measure one choice against its baseline in the same invocation
//! (`farvm-lab bench placement`, `farvm-lab bench page-space`, `farvm-lab bench stage2`).

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use farvm_vmm::devices::pvctl::ProcessRecord;
use farvm_vmm::remote::{Budget, RemoteStats};
use farvm_vmm::vm::VmReport;
use farvm_vmm::workload_spec::{place, PlacedWorkload};
use serde::Serialize;

use super::remote::runner::{
    budget_for, finished_in_time, run_remote, run_remote_vm, times, CellSetup,
};
use super::remote::runs::median_run;

/// The options every A/B bench takes.
#[derive(Args, Debug)]
pub struct AbArgs {
    /// Workload (repeatable; NAME[:key=value,...]) [default: the command's list, above].
    #[arg(long = "workload", value_name = "SPEC")]
    pub workloads: Vec<String>,
    /// Local memory, percent of the footprint.
    #[arg(long = "local", value_name = "PCT", default_value_t = 25.0)]
    pub local: f64,
    /// Prefetcher (repeatable) [default: the command's list, above].
    #[arg(long = "prefetcher", value_name = "NAME")]
    pub prefetchers: Vec<String>,
    /// Runs per cell and setup (median reported).
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

/// What an A/B bench runs: workloads (as given and placed) and prefetchers, checked.
pub(super) struct Plan {
    pub specs: Vec<String>,
    pub placed: Vec<PlacedWorkload>,
    pub prefetchers: Vec<String>,
    pub timeout: Duration,
}

impl AbArgs {
    /// Checks the options and fills in the command's defaults.
    pub(super) fn plan(&self, workloads: &[&str], prefetchers: &[&str]) -> Result<Plan> {
        if !(self.local > 0.0 && self.local < 100.0) {
            bail!("--local {}: must be a percentage in (0, 100)", self.local);
        }
        let or_default = |given: &[String], default: &[&str]| -> Vec<String> {
            if given.is_empty() {
                default.iter().map(|s| s.to_string()).collect()
            } else {
                given.to_vec()
            }
        };
        let specs = or_default(&self.workloads, workloads);
        let prefetchers = or_default(&self.prefetchers, prefetchers);
        for p in &prefetchers {
            if !farvm_prefetch::registry::names().contains(&p.as_str()) {
                bail!(
                    "unknown --prefetcher `{p}` (known: {})",
                    farvm_prefetch::registry::names().join(", ")
                );
            }
        }
        let placed = place(&specs, 1).map_err(anyhow::Error::msg)?;
        Ok(Plan {
            specs,
            placed,
            prefetchers,
            timeout: Duration::from_secs(self.cell_timeout.max(1)),
        })
    }
}

impl Plan {
    /// The cell of workload `wi` with prefetcher `pf`, reproducing `reference`.
    pub(super) fn cell<'a>(
        &'a self,
        ab: &AbArgs,
        wi: usize,
        pf: &'a str,
        budget: Budget,
        reference: &ProcessRecord,
    ) -> Cell<'a> {
        Cell {
            workload: &self.placed[wi],
            spec: &self.specs[wi],
            budget,
            local_pct: ab.local,
            prefetcher: pf,
            timeout: self.timeout,
            repeat: ab.repeat,
            checksum: reference.checksum,
            ops: reference.ops,
        }
    }
}

/// The reference run of a workload (all memory local to the engine, no prefetch, `setup`):
/// its record (checksum, ops) and the budget of `local` percent of its footprint.
pub(super) fn reference(
    w: &PlacedWorkload,
    local: f64,
    timeout: Duration,
    setup: CellSetup,
) -> Result<(ProcessRecord, Budget)> {
    let (rec, st, _) = run_remote(w, Budget::Unlimited, "none", timeout, setup)?;
    let rec = rec.with_context(|| {
        format!(
            "{}: the reference run did not finish in {} s",
            w.name(),
            timeout.as_secs()
        )
    })?;
    Ok((rec, budget_for(local, st.engine.resident_pages)))
}

/// One setup's runs of a cell: its median run (by measured time) and every run's time.
#[derive(Debug, Serialize)]
pub(super) struct Way {
    pub measured_ms: f64,
    /// The median run's whole process (setup, warm-up, measured phase) by the host clock.
    pub total_ms: f64,
    pub runs_ms: Vec<f64>,
    pub demand_faults: u64,
    pub fault_p50_us: f64,
    pub accuracy: f64,
    pub coverage: f64,
    pub page_table_walks: u64,
    pub faults_seen_virtual: u64,
}

/// The cell every setup runs.
#[derive(Clone, Copy)]
pub(super) struct Cell<'a> {
    pub workload: &'a PlacedWorkload,
    /// How the workload was given (for messages).
    pub spec: &'a str,
    pub budget: Budget,
    pub local_pct: f64,
    pub prefetcher: &'a str,
    pub timeout: Duration,
    pub repeat: u32,
    /// The checksum and op count every run must reproduce.
    pub checksum: u64,
    pub ops: u64,
}

impl Cell<'_> {
    /// The cell under setup `name`, for messages.
    pub fn what(&self, name: &str) -> String {
        format!(
            "{} {}% {} {name}",
            self.spec, self.local_pct, self.prefetcher
        )
    }
}

/// One run of a cell that finished in time with the reference checksum.
pub(super) struct Checked {
    /// The workload's process.
    pub record: ProcessRecord,
    pub stats: RemoteStats,
    /// The VM's whole report (KVM's per-vCPU statistics too).
    pub report: VmReport,
}

/// Runs `cell` once under `setup` (named `name` in messages). A run that times out or
/// reproduces another checksum is an error: a comparison needs every run.
pub(super) fn checked_run(cell: &Cell, name: &str, setup: CellSetup) -> Result<Checked> {
    let what = cell.what(name);
    let (report, stats) = run_remote_vm(
        cell.workload,
        cell.budget,
        cell.prefetcher,
        cell.timeout,
        setup,
    )?;
    let record = finished_in_time(&report, &what)?
        .with_context(|| format!("{what}: did not finish in {} s", cell.timeout.as_secs()))?;
    if record.checksum != cell.checksum || record.ops != cell.ops {
        bail!(
            "{what}: checksum {:#x} differs from the reference run's {:#x}",
            record.checksum,
            cell.checksum
        );
    }
    Ok(Checked {
        record,
        stats,
        report,
    })
}

/// Runs `repeat` rounds of one run of each of `ways` setups (`run(i)` runs setup `i`), each
/// round starting with the next setup, so a drift in the host's load spreads over all of them.
/// Returns every setup's runs, in order.
pub(super) fn take_turns<T>(
    ways: usize,
    repeat: u32,
    mut run: impl FnMut(usize) -> Result<T>,
) -> Result<Vec<Vec<T>>> {
    let mut runs: Vec<Vec<T>> = (0..ways).map(|_| Vec::new()).collect();
    for round in 0..repeat as usize {
        for k in 0..ways {
            if farvm_vmm::signals::termination_requested().is_some() {
                bail!("interrupted");
            }
            let i = (round + k) % ways;
            runs[i].push(run(i)?);
        }
    }
    Ok(runs)
}

/// Runs `cell` `repeat` times under each of `a` and `b` (named for messages), taking turns
/// ([`take_turns`]). A run that times out or reproduces another checksum fails the comparison.
pub(super) fn compare(
    cell: &Cell,
    a: (&str, CellSetup),
    b: (&str, CellSetup),
) -> Result<(Way, Way)> {
    let setups = [a, b];
    let mut runs = take_turns(setups.len(), cell.repeat, |i| {
        let (name, setup) = setups[i];
        let run = checked_run(cell, name, setup)?;
        eprintln!("{}: {:.1} ms", cell.what(name), times(&run.record).0);
        Ok((run.record, run.stats))
    })?;
    let rb = runs.pop().expect("two setups");
    let ra = runs.pop().expect("two setups");
    Ok((way(ra), way(rb)))
}

fn way(runs: Vec<(ProcessRecord, RemoteStats)>) -> Way {
    let runs_ms: Vec<f64> = runs.iter().map(|(r, _)| times(r).0).collect();
    let (rec, st) = median_run(runs, |(r, _)| times(r).0).expect("repeat >= 1");
    let e = &st.engine;
    Way {
        measured_ms: times(&rec).0,
        total_ms: times(&rec).1,
        runs_ms,
        demand_faults: e.counters.demand_faults,
        fault_p50_us: e.fault_service.p50 as f64 / 1e3,
        accuracy: e.accuracy,
        coverage: e.coverage,
        page_table_walks: e.counters.page_table_walks,
        faults_seen_virtual: e.counters.faults_seen_virtual,
    }
}

/// Prints an A/B bench's table, and its report as JSON too with `--json`.
pub(super) fn print_report(markdown: &str, report: &impl Serialize, json: bool) -> Result<()> {
    print!("{markdown}");
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    }
    Ok(())
}
