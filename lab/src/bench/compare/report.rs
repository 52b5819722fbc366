//! `farvm-lab bench compare`'s outputs: the markdown table, the JSON report and two charts
//! (each setup's time over all-local; farvm over each kernel-swap device). A failed cell
//! ([`super::failure::FailedCell`]) is written as "failed: REASON" in the table, as `failed` in
//! the JSON and as an × labelled "failed: KIND" where its bar would stand; it has no time, so
//! the ratios it would enter are "-" and are left out of the charts' bars.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::Report;
use crate::plot::{grouped_bars, RefLine, Series};

/// The farvm setup the farvm ÷ kernel-swap columns use: the first one listed. The kernel-swap
/// setups are farvm's VMM (local only) and QEMU, each in the memory cgroup.
fn farvm_setup(r: &Report) -> Option<String> {
    r.cells
        .first()?
        .setups
        .iter()
        .find(|s| s.setup.starts_with("farvm "))
        .map(|s| s.setup.clone())
}

fn swap_setups(r: &Report) -> Vec<String> {
    r.cells.first().map_or(Vec::new(), |c| {
        c.setups
            .iter()
            .filter(|s| s.setup.contains("kernel swap"))
            .map(|s| s.setup.clone())
            .collect()
    })
}

fn find_setup<'a>(c: &'a super::Cell, name: &str) -> Option<&'a super::SetupResult> {
    c.setups.iter().find(|s| s.setup == name)
}

/// A setup's median time in a cell; NaN when it failed (or is not there).
fn ms(c: &super::Cell, name: &str) -> f64 {
    find_setup(c, name).map_or(f64::NAN, |s| s.median_ms)
}

/// The chart label of a setup that failed in a cell ("failed: checksum").
fn failed_label(c: &super::Cell, name: &str) -> Option<String> {
    find_setup(c, name)?.failed.as_ref().map(|f| f.label())
}

fn mib_pair(a: u64, b: u64) -> String {
    format!(
        "{:.1}, {:.1} MiB",
        a as f64 / 1048576.0,
        b as f64 / 1048576.0
    )
}

/// One setup's cell of the guest-pages table.
fn guest_pages(x: &super::SetupResult) -> String {
    if x.setup.starts_with("farvm ") {
        return format!("{} + {}", x.faults, x.prefetches);
    }
    let Some(g) = x.guest.as_ref().filter(|g| g.samples > 0) else {
        return x.faults.to_string();
    };
    let resident = g
        .resident_swapping_median
        .map_or(format!("never swapped, {} resident", g.resident_max), |m| {
            format!("{m} resident (max {})", g.resident_max)
        });
    let limit = g.limit_end_bytes.map_or(String::new(), |l| {
        format!(", limit → {:.1} MiB", l as f64 / 1048576.0)
    });
    format!("{} in, {resident}{limit}", x.faults)
}

pub fn markdown(r: &Report) -> String {
    let mut s = String::new();
    let Some(first) = r.cells.first() else {
        return s;
    };
    let names: Vec<&str> = first.setups.iter().map(|x| x.setup.as_str()).collect();
    let farvm = farvm_setup(r);
    let swaps = swap_setups(r);
    s.push_str("| workload | local | all-local ms |");
    for n in &names {
        let _ = write!(s, " {n} ms (× all-local) |");
    }
    if let Some(f) = &farvm {
        for sw in &swaps {
            let _ = write!(s, " {f} ÷ {sw} |");
        }
    }
    s.push('\n');
    let cols = 3 + names.len() + if farvm.is_some() { swaps.len() } else { 0 };
    s.push_str(&"|---".repeat(cols));
    s.push_str("|\n");
    for c in &r.cells {
        let _ = write!(
            s,
            "| {} | {}% | {:.1} |",
            c.workload, c.local_pct, c.all_local_ms
        );
        for x in &c.setups {
            if let Some(failed) = &x.failed {
                let _ = write!(s, " {failed} |");
            } else {
                let _ = write!(s, " {:.1} ({:.1}×) |", x.median_ms, x.vs_all_local);
            }
        }
        if let Some(f) = &farvm {
            for sw in &swaps {
                let ratio = ms(c, f) / ms(c, sw);
                if ratio.is_nan() {
                    let _ = write!(s, " - |");
                } else {
                    let _ = write!(s, " **{ratio:.2}** |");
                }
            }
        }
        s.push('\n');
    }
    s.push_str(
        "\nThe guest's pages: farvm, demand faults + prefetches issued in the measured phase \
         (the engine keeps at most the budget resident); kernel swap, pages swapped in \
         (host-wide, the whole run) and the guest's resident pages sampled from the VMM's smaps \
         once the kernel swapped (median, max), the cgroup limit steered so that the guest keeps \
         the budget (start → end):\n\n",
    );
    s.push_str("| workload | local | footprint pages | budget pages | cgroup limit start, floor (farvm; QEMU) |");
    for n in &names {
        let _ = write!(s, " {n} |");
    }
    s.push('\n');
    s.push_str(&"|---".repeat(5 + names.len()));
    s.push_str("|\n");
    for c in &r.cells {
        let _ = write!(
            s,
            "| {} | {}% | {} | {} | {}; {} |",
            c.workload,
            c.local_pct,
            c.footprint_pages,
            c.budget_bytes / 4096,
            mib_pair(c.cgroup_limit_bytes, c.cgroup_floor_bytes),
            c.qemu_cgroup_limit_bytes
                .zip(c.qemu_cgroup_floor_bytes)
                .map_or("-".to_string(), |(l, f)| mib_pair(l, f))
        );
        for x in &c.setups {
            let _ = write!(s, " {} |", guest_pages(x));
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "\nCommand: `{}` ({:.0} s; load average at the end {}; vm.page-cluster {}). Median of each \
         setup's runs; ratios hold within this run only.",
        r.command, r.wall_secs, r.load_average, r.page_cluster
    );
    s
}

/// Writes compare.md, compare.json, compare-vs-local.png and compare-farvm-vs-swap.png into
/// `dir`, and prints the table. Charts need a TrueType font; without one they are skipped
/// with a message.
pub fn write(r: &Report, dir: &Path) -> Result<()> {
    let md = markdown(r);
    print!("{md}");
    std::fs::write(dir.join("compare.md"), &md).context("writing compare.md")?;
    std::fs::write(
        dir.join("compare.json"),
        serde_json::to_string_pretty(r)? + "\n",
    )
    .context("writing compare.json")?;
    let cats: Vec<String> = r
        .cells
        .iter()
        .map(|c| {
            format!(
                "{} {}%",
                c.workload.split(':').next().unwrap_or(""),
                c.local_pct
            )
        })
        .collect();
    let charts = grouped_bars(
        &dir.join("compare-vs-local.png"),
        "Measured time over all-local (log scale; lower is better)",
        "time / all-local",
        &cats,
        &vs_local_series(r),
        &[RefLine {
            label: "all-local".into(),
            value: 1.0,
        }],
        true,
    )
    .and_then(|_| {
        let series = farvm_vs_swap_series(r);
        if series.is_empty() {
            return Ok(());
        }
        grouped_bars(
            &dir.join("compare-farvm-vs-swap.png"),
            "farvm over kernel swap (below 1: farvm faster)",
            "farvm time / kernel-swap time",
            &cats,
            &series,
            &[RefLine {
                label: "equal".into(),
                value: 1.0,
            }],
            true,
        )
    });
    if let Err(e) = charts {
        eprintln!("farvm-lab: charts skipped: {e:#}");
    }
    Ok(())
}

/// The first chart's bars: each setup's time over all-local per cell, a failed cell marked.
fn vs_local_series(r: &Report) -> Vec<Series> {
    let names: Vec<String> = r.cells.first().map_or(Vec::new(), |c| {
        c.setups.iter().map(|s| s.setup.clone()).collect()
    });
    names
        .iter()
        .map(|n| Series {
            name: n.clone(),
            values: r.cells.iter().map(|c| ms(c, n) / c.all_local_ms).collect(),
            failed: r.cells.iter().map(|c| failed_label(c, n)).collect(),
        })
        .collect()
}

/// The second chart's bars: farvm's time over each kernel-swap setup's per cell; a ratio with a
/// failed side is marked with that side's failure (the kernel-swap one first).
fn farvm_vs_swap_series(r: &Report) -> Vec<Series> {
    let Some(f) = farvm_setup(r) else {
        return Vec::new();
    };
    swap_setups(r)
        .iter()
        .map(|sw| Series {
            name: format!("{f} ÷ {sw}"),
            values: r.cells.iter().map(|c| ms(c, &f) / ms(c, sw)).collect(),
            failed: r
                .cells
                .iter()
                .map(|c| failed_label(c, sw).or_else(|| failed_label(c, &f)))
                .collect(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::failure::Failure;
    use super::super::{setup_result, Cell, RunResult};
    use super::*;

    /// A run of `setup` that took `ms` (checksum 1, all-local's), or failed with `failed`.
    fn run(setup: &str, ms: f64, failed: Option<Failure>) -> RunResult {
        RunResult {
            measured_ms: if failed.is_some() { f64::NAN } else { ms },
            checksum: failed.is_none().then_some(1),
            failed,
            faults: 7,
            prefetches: 3,
            guest: setup
                .contains("swap")
                .then_some(crate::bench::compare::guest_rss::GuestStats {
                    samples: 10,
                    resident_max: 2200,
                    resident_swapping_median: Some(2100),
                    swapped_max: 500,
                    vmm_own_max_bytes: 2 << 20,
                    kernel_max_bytes: 1 << 20,
                    limit_end_bytes: Some(10 << 20),
                }),
        }
    }

    /// One cell (seq at 25%, all-local 10 ms): farvm none timed out; QEMU + zram finished one
    /// run with all-local's checksum and one with another (the abort).
    fn report() -> Report {
        let runs = |name: &str, runs: Vec<RunResult>| setup_result(name.into(), &runs, 10.0);
        let mismatch = Some(Failure::Checksum { got: 2, want: 1 });
        let qemu = "QEMU + kernel swap, zram";
        Report {
            command: "farvm-lab bench compare".into(),
            cell_timeout_secs: 90,
            page_cluster: "3".into(),
            load_average: "1 1 1".into(),
            wall_secs: 1.0,
            cells: vec![Cell {
                workload: "seq:ws=32M".into(),
                local_pct: 25.0,
                footprint_pages: 8412,
                budget_bytes: 2103 * 4096,
                cgroup_limit_bytes: 2103 * 4096 + (2 << 20),
                qemu_cgroup_limit_bytes: Some(2103 * 4096 + (40 << 20)),
                cgroup_floor_bytes: 2103 * 4096 + (1 << 20),
                qemu_cgroup_floor_bytes: Some(2103 * 4096 + (3 << 20)),
                all_local_ms: 10.0,
                checksum: 1,
                setups: vec![
                    runs("farvm leap+stream", vec![run("farvm", 50.0, None)]),
                    runs(
                        "farvm none",
                        vec![run("farvm", 0.0, Some(Failure::Timeout { secs: 90 }))],
                    ),
                    runs("kernel swap, zram", vec![run("swap", 100.0, None)]),
                    runs("kernel swap, loop on tmpfs", vec![run("swap", 25.0, None)]),
                    runs(qemu, vec![run(qemu, 200.0, None), run(qemu, 0.0, mismatch)]),
                ],
            }],
        }
    }

    #[test]
    fn table_has_farvm_over_each_swap_device_and_marks_failed_cells() {
        let md = markdown(&report());
        assert!(md.contains("| farvm leap+stream ÷ kernel swap, zram | farvm leap+stream ÷ kernel swap, loop on tmpfs | farvm leap+stream ÷ QEMU + kernel swap, zram |"), "{md}");
        // The failed cells say why; the ratio with the failed QEMU cell is left out.
        assert!(md.contains("| 50.0 (5.0×) | failed: timeout (> 90 s) | 100.0 (10.0×) | 25.0 (2.5×) | failed: checksum 0x2 differs from all-local's 0x1 (1 of 2 runs) | **0.50** | **2.00** | - |"), "{md}");
        assert!(md.contains("| 2103 | 10.2, 9.2 MiB; 48.2, 11.2 MiB | 7 + 3 | 7 + 3 | 7 in, 2100 resident (max 2200), limit → 10.0 MiB |"), "{md}");
        assert!(md.contains("vm.page-cluster 3"), "{md}");
    }

    #[test]
    fn a_failed_cell_has_its_reason_and_no_time_in_the_json() {
        let json = serde_json::to_value(report()).expect("serializes");
        let qemu = &json["cells"][0]["setups"][4];
        assert_eq!(qemu["failed"]["kind"], "checksum");
        assert_eq!(
            qemu["failed"]["reason"],
            "checksum 0x2 differs from all-local's 0x1"
        );
        assert_eq!(qemu["failed"]["failed_runs"], 1);
        assert!(qemu["median_ms"].is_null(), "{qemu}");
        // Only the run that gave a result has a time.
        assert_eq!(qemu["runs_ms"], serde_json::json!([200.0]));
        let farvm = &json["cells"][0]["setups"][0];
        assert!(farvm["failed"].is_null(), "{farvm}");
        assert_eq!(farvm["median_ms"], 50.0);
    }

    #[test]
    fn charts_mark_failed_cells_instead_of_drawing_their_bars() {
        let r = report();
        let local = vs_local_series(&r);
        assert_eq!(local[0].values, vec![5.0]);
        assert_eq!(local[0].failed, vec![None]);
        assert!(local[1].values[0].is_nan());
        assert_eq!(local[1].failed, vec![Some("failed: timeout".to_string())]);
        assert!(local[4].values[0].is_nan());
        assert_eq!(local[4].failed, vec![Some("failed: checksum".to_string())]);
        let vs_swap = farvm_vs_swap_series(&r);
        assert_eq!(vs_swap.len(), 3);
        assert_eq!(vs_swap[0].values, vec![0.5]);
        assert_eq!(vs_swap[0].failed, vec![None]);
        assert!(vs_swap[2].values[0].is_nan());
        assert_eq!(
            vs_swap[2].failed,
            vec![Some("failed: checksum".to_string())]
        );
    }
}
