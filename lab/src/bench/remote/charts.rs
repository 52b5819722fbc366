//! The PNG charts of `farvm-lab bench remote`: per local share, completion time and demand
//! faults; at the lowest share, prefetch accuracy, coverage and demand-fault latency against
//! the TCP floor.

use std::path::{Path, PathBuf};

use anyhow::Result;

use super::report::{Cell, Report};
use crate::plot::{grouped_bars, RefLine, Series};

pub(super) fn charts(
    r: &Report,
    out: &Path,
    locals: &[f64],
    pfs: &[String],
) -> Result<Vec<PathBuf>> {
    let workloads: Vec<String> = r.baselines.iter().map(|b| b.workload.clone()).collect();
    let mut files = Vec::new();
    let cell = |w: &str, l: f64, p: &str| {
        r.cells
            .iter()
            .find(|c| c.workload == w && c.local_pct == l && c.prefetcher == p)
    };
    let pick = |l: f64, get: &dyn Fn(&Cell) -> f64| -> Vec<Series> {
        pfs.iter()
            .map(|p| Series {
                name: p.clone(),
                values: workloads
                    .iter()
                    .map(|w| cell(w, l, p).map_or(f64::NAN, get))
                    .collect(),
                failed: Vec::new(),
            })
            .collect()
    };
    for &l in locals {
        let tag = format!("{}", l as u32);
        let p = out.join(format!("time_local{tag}.png"));
        grouped_bars(
            &p,
            &format!("Completion time normalised to all-local, {tag}% local"),
            "time / all-local",
            &workloads,
            &pick(l, &|c| c.norm_time),
            &[RefLine {
                label: "all-local".into(),
                value: 1.0,
            }],
            true,
        )?;
        files.push(p);
        let p = out.join(format!("faults_local{tag}.png"));
        grouped_bars(
            &p,
            &format!("Demand faults, {tag}% local"),
            "demand faults",
            &workloads,
            &pick(l, &|c| c.demand_faults as f64),
            &[],
            true,
        )?;
        files.push(p);
    }
    let low = locals.iter().copied().fold(f64::INFINITY, f64::min);
    let tag = format!("{}", low as u32);
    let p = out.join(format!("accuracy_local{tag}.png"));
    grouped_bars(
        &p,
        &format!("Prefetch accuracy, {tag}% local"),
        "accuracy",
        &workloads,
        &pick(low, &|c| c.accuracy),
        &[],
        false,
    )?;
    files.push(p);
    let p = out.join(format!("coverage_local{tag}.png"));
    grouped_bars(
        &p,
        &format!("Prefetch coverage, {tag}% local"),
        "coverage",
        &workloads,
        &pick(low, &|c| c.coverage),
        &[],
        false,
    )?;
    files.push(p);
    for (q, get) in [
        ("p50", &(|c: &Cell| c.fault_p50_us) as &dyn Fn(&Cell) -> f64),
        ("p99", &(|c: &Cell| c.fault_p99_us) as &dyn Fn(&Cell) -> f64),
    ] {
        let p = out.join(format!("fault_{q}_local{tag}.png"));
        grouped_bars(
            &p,
            &format!("Demand-fault service {q} (µs), {tag}% local, vs the TCP 4 KiB floor"),
            &format!("fault {q} µs"),
            &workloads,
            &pick(low, get),
            &[RefLine {
                label: format!(
                    "TCP floor {q} {:.1} µs",
                    if q == "p50" {
                        r.floor.tcp_p50_us
                    } else {
                        r.floor.tcp_p99_us
                    }
                ),
                value: if q == "p50" {
                    r.floor.tcp_p50_us
                } else {
                    r.floor.tcp_p99_us
                },
            }],
            true,
        )?;
        files.push(p);
    }
    Ok(files)
}
