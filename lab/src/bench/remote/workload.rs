//! One workload's share of the matrix: its all-local baseline runs, the footprint run (all
//! memory local to the engine) that sizes every local share, and the runs of its cells, taking
//! turns between prefetchers; each cell's runs summed up as one row of the report.

use anyhow::{bail, Result};
use farvm_vmm::devices::pvctl::ProcessRecord;
use farvm_vmm::remote::{Budget, RemoteStats};
use farvm_workloads::lathist::counter;
use indicatif::ProgressBar;

use super::plan::Matrix;
use super::report::{Baseline, Cell, PhaseCounts};
use super::runner::{budget_for, run_local, run_remote, times, CellSetup, RunCpu};
use super::runs::median_run;

/// One run of a cell: its process record (`None`: it timed out), the engine's stats and the
/// run's CPU time by thread.
type Run = (Option<ProcessRecord>, RemoteStats, RunCpu);

/// Runs workload `wi` of `m`: its baseline and its cells, in the matrix's order.
pub(super) fn measure(m: &Matrix, wi: usize, bar: &ProgressBar) -> Result<(Baseline, Vec<Cell>)> {
    let w = &m.placed[wi];
    let setup = CellSetup {
        blob: m.blobs[wi],
        ..m.setup
    };
    let repeat = m.repeat;
    let cell_timeout = m.cell_timeout();
    // Without a terminal the bar is hidden: print one line per cell instead.
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stderr());
    bar.set_message(format!("{} all-local", w.name()));
    let mut local_runs = Vec::with_capacity(repeat);
    for _ in 0..repeat {
        local_runs.push(run_local(w, setup.blob)?);
        bar.inc(1);
    }
    let base_runs_ms: Vec<f64> = local_runs.iter().map(|r| times(r).0).collect();
    let base = median_run(local_runs, |r| times(r).0).expect("repeat >= 1");
    // The footprint run: all memory local to the engine, no prefetching. It is also the
    // matrix's (100%, none) cell.
    bar.set_message(format!("{} footprint", w.name()));
    let probe = run_remote(w, Budget::Unlimited, "none", cell_timeout, setup)?;
    bar.inc(1);
    if probe.0.is_none() {
        bail!(
            "{}: the footprint run (all memory local) did not finish in {} s",
            w.name(),
            m.cell_timeout_secs
        );
    }
    let footprint = probe.1.engine.resident_pages;
    let (bm, bt) = times(&base);
    let baseline = Baseline {
        workload: display_name(w.name(), &m.specs[wi]),
        spec: m.specs[wi].clone(),
        measured_ms: bm,
        total_ms: bt,
        checksum: base.checksum,
        ops: base.ops,
        footprint_pages: footprint,
        page_access_p50_ns: counter_or_nan(&base, counter::PAGE_ACCESS_P50_NS),
        runs_ms: base_runs_ms,
    };
    let mut cells = Vec::new();
    let mut probe = Some(probe);
    for &local in &m.locals {
        let budget = budget_for(local, footprint);
        // Repetitions take turns (none, a, b, none, a, b, ...): a drift in the host's load
        // then spreads over every prefetcher instead of biasing the one that ran last.
        let mut all_runs: Vec<Vec<Run>> = m
            .prefetchers
            .iter()
            .map(|_| Vec::with_capacity(repeat))
            .collect();
        // `--sealing-pairs`: each sealed run followed by the same cell unsealed.
        let mut unsealed_runs: Vec<Vec<Run>> = m.prefetchers.iter().map(|_| Vec::new()).collect();
        let unsealed = CellSetup {
            page_encryption: false,
            ..setup
        };
        if local >= 100.0 {
            if let Some(i) = m.prefetchers.iter().position(|p| p == "none") {
                all_runs[i].extend(probe.take());
            }
        }
        for _round in 0..repeat {
            let cells = m.prefetchers.iter().zip(all_runs.iter_mut());
            for ((pf, runs), off) in cells.zip(unsealed_runs.iter_mut()) {
                if m.sealing_pairs && off.len() < repeat && !off.iter().any(|(r, _, _)| r.is_none())
                {
                    if farvm_vmm::signals::termination_requested().is_some() {
                        bail!("interrupted");
                    }
                    bar.set_message(format!("{} {local}% {pf} unsealed", w.name()));
                    off.push(run_remote(w, budget, pf, cell_timeout, unsealed)?);
                    bar.inc(1);
                }
                if runs.len() >= repeat || runs.iter().any(|(r, _, _)| r.is_none()) {
                    continue;
                }
                if farvm_vmm::signals::termination_requested().is_some() {
                    bail!("interrupted");
                }
                bar.set_message(format!("{} {local}% {pf}", w.name()));
                let r = run_remote(w, budget, pf, cell_timeout, setup)?;
                bar.inc(1);
                if r.0.is_none() {
                    // It would time out again: one TIMEOUT run stands for the cell.
                    bar.inc((repeat - runs.len() - 1) as u64);
                }
                runs.push(r);
            }
        }
        for ((pf, runs), off) in m.prefetchers.iter().zip(all_runs).zip(unsealed_runs) {
            let mut c = row(&baseline, &base, local, pf, runs);
            (c.cpu_us_per_page_unsealed, c.measured_ms_unsealed) =
                match median_run(off, |(r, _, _)| {
                    r.as_ref().map_or(f64::INFINITY, |r| times(r).0)
                }) {
                    Some((Some(r), _, cpu)) => (cpu.us_per_page(), times(&r).0),
                    _ => (f64::NAN, f64::NAN),
                };
            if !interactive {
                eprintln!(
                    "[{}/{}] {} {}% {}: {}",
                    bar.position(),
                    m.vm_runs() + 1,
                    c.workload,
                    c.local_pct,
                    c.prefetcher,
                    if c.timed_out {
                        format!("TIMEOUT after {} s", m.cell_timeout_secs)
                    } else {
                        format!(
                            "{:.2}x all-local, {} demand faults",
                            c.norm_time, c.demand_faults
                        )
                    }
                );
            }
            cells.push(c);
        }
    }
    Ok((baseline, cells))
}

/// The row of one cell: its median run (by measured time) against the all-local baseline `b`
/// (whose median run is `base`). A cell that timed out keeps the metrics at its stop and has
/// no times.
/// The workload's name in the report: a replayed trace is named after its file
/// (`replay:sqlite.trace.zst`), so several traces stay apart.
fn display_name(name: &str, spec: &str) -> String {
    let trace = spec
        .split([':', ','])
        .find_map(|kv| kv.strip_prefix("trace="))
        .map(|f| f.rsplit('/').next().unwrap_or(f));
    match trace {
        Some(file) => format!("{name}:{file}"),
        None => name.to_string(),
    }
}

fn row(b: &Baseline, base: &ProcessRecord, local: f64, pf: &str, runs: Vec<Run>) -> Cell {
    let runs_ms: Vec<f64> = runs
        .iter()
        .map(|(r, _, _)| r.as_ref().map_or(f64::NAN, |r| times(r).0))
        .collect();
    let (rec, st, cpu) = median_run(runs, |(r, _, _)| {
        r.as_ref().map_or(f64::INFINITY, |r| times(r).0)
    })
    .expect("at least one run");
    let timed_out = rec.is_none();
    let phase_counts = rec.as_ref().and_then(measured_phase);
    let rec = rec.unwrap_or_else(|| ProcessRecord {
        elapsed_ns: 0,
        ..base.clone()
    });
    let (m, t) = times(&rec);
    let e = &st.engine;
    let c = &e.counters;
    let mut cell = Cell {
        workload: b.workload.clone(),
        spec: b.spec.clone(),
        local_pct: local,
        prefetcher: pf.to_string(),
        measured_ms: m,
        total_ms: t,
        norm_time: m / b.measured_ms,
        ns_per_access: if rec.ops > 0 {
            rec.elapsed_ns as f64 / rec.ops as f64
        } else {
            f64::NAN
        },
        demand_faults: c.demand_faults,
        zero_fills: c.zero_fills,
        prefetch_issued: c.prefetch_issued,
        accuracy: e.accuracy,
        coverage: e.coverage,
        fault_p50_us: e.fault_service.p50 as f64 / 1e3,
        fault_p99_us: e.fault_service.p99 as f64 / 1e3,
        install_p50_us: e.install.p50 as f64 / 1e3,
        wake_p50_us: e.wake.p50 as f64 / 1e3,
        store_read_p50_us: e.store_read.p50 as f64 / 1e3,
        page_access_p50_ns: counter_or_nan(&rec, counter::PAGE_ACCESS_P50_NS),
        page_access_p99_ns: counter_or_nan(&rec, counter::PAGE_ACCESS_P99_NS),
        local_pages: e.budget_pages,
        evictions: c.evictions,
        bytes_read: c.bytes_read,
        bytes_written: c.bytes_written,
        checksum_ok: timed_out || (rec.checksum == base.checksum && rec.ops == base.ops),
        timed_out,
        runs_ms,
        measured_phase: phase_counts,
        cpu,
        cpu_us_per_page: cpu.us_per_page(),
        // Set by the caller from the cell's unsealed runs, if any.
        cpu_us_per_page_unsealed: f64::NAN,
        measured_ms_unsealed: f64::NAN,
        // Set with the run's streaming floor when the report is written.
        floor_ms: f64::NAN,
        time_per_floor: f64::NAN,
    };
    if timed_out {
        cell.measured_ms = f64::NAN;
        cell.norm_time = f64::NAN;
        cell.ns_per_access = f64::NAN;
        cell.page_access_p50_ns = f64::NAN;
        cell.page_access_p99_ns = f64::NAN;
    }
    cell
}

/// The paging counts of `r`'s measured phase, from the counters stamped on its doorbells.
fn measured_phase(r: &ProcessRecord) -> Option<PhaseCounts> {
    let d = r.measured_phase_paging()?;
    let e = farvm_ept::PrefetchEstimate::of(&d);
    Some(PhaseCounts {
        demand_faults: d.demand_faults,
        zero_fills: d.zero_fills,
        prefetch_issued: d.prefetch_issued,
        prefetch_hits: e.hits,
        accuracy: e.accuracy,
        coverage: e.coverage,
    })
}

/// Guest-reported page-access counter `i` of `r`; NaN if the workload times no page accesses.
fn counter_or_nan(r: &ProcessRecord, i: usize) -> f64 {
    if r.counters[counter::PAGE_ACCESSES_TIMED] == 0 {
        f64::NAN
    } else {
        r.counters[i] as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replayed_traces_are_named_after_their_file() {
        assert_eq!(
            display_name("replay", "replay:trace=traces/xz.trace.zst,records=9"),
            "replay:xz.trace.zst"
        );
        assert_eq!(display_name("seq", "seq:ws=32M"), "seq");
    }
}
