//! `farvm-lab bench compare`'s outputs: the markdown table, the JSON report and two charts
//! (each setup's time over all-local; farvm over each kernel-swap device).

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

fn ms(c: &super::Cell, setup: &str) -> f64 {
    c.setups
        .iter()
        .find(|s| s.setup == setup)
        .map_or(f64::NAN, |s| s.median_ms)
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
            if let Some(ended) = &x.ended {
                let _ = write!(s, " {ended} |");
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
    let names: Vec<String> = r.cells.first().map_or(Vec::new(), |c| {
        c.setups.iter().map(|s| s.setup.clone()).collect()
    });
    let series: Vec<Series> = names
        .iter()
        .map(|n| Series {
            name: n.clone(),
            values: r.cells.iter().map(|c| ms(c, n) / c.all_local_ms).collect(),
        })
        .collect();
    let charts = grouped_bars(
        &dir.join("compare-vs-local.png"),
        "Measured time over all-local (log scale; lower is better)",
        "time / all-local",
        &cats,
        &series,
        &[RefLine {
            label: "all-local".into(),
            value: 1.0,
        }],
        true,
    )
    .and_then(|_| {
        let Some(f) = farvm_setup(r) else {
            return Ok(());
        };
        let series: Vec<Series> = swap_setups(r)
            .iter()
            .map(|sw| Series {
                name: format!("{f} ÷ {sw}"),
                values: r.cells.iter().map(|c| ms(c, &f) / ms(c, sw)).collect(),
            })
            .collect();
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

#[cfg(test)]
mod tests {
    use super::super::{Cell, SetupResult};
    use super::*;

    fn setup(name: &str, ms: f64) -> SetupResult {
        SetupResult {
            setup: name.into(),
            median_ms: ms,
            runs_ms: vec![ms],
            vs_all_local: ms / 10.0,
            faults: 7,
            prefetches: 3,
            guest: name
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
            ended: ms.is_nan().then(|| "timeout (> 90 s)".to_string()),
        }
    }

    #[test]
    fn table_has_farvm_over_each_swap_device_and_marks_timeouts() {
        let r = Report {
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
                    setup("farvm leap+stream", 50.0),
                    setup("farvm none", f64::NAN),
                    setup("kernel swap, zram", 100.0),
                    setup("kernel swap, loop on tmpfs", 25.0),
                    setup("QEMU + kernel swap, zram", 200.0),
                ],
            }],
        };
        let md = markdown(&r);
        assert!(md.contains("| farvm leap+stream ÷ kernel swap, zram | farvm leap+stream ÷ kernel swap, loop on tmpfs | farvm leap+stream ÷ QEMU + kernel swap, zram |"), "{md}");
        assert!(md.contains("| 50.0 (5.0×) | timeout (> 90 s) | 100.0 (10.0×) | 25.0 (2.5×) | 200.0 (20.0×) | **0.50** | **2.00** | **0.25** |"), "{md}");
        assert!(md.contains("| 2103 | 10.2, 9.2 MiB; 48.2, 11.2 MiB | 7 + 3 | 7 + 3 | 7 in, 2100 resident (max 2200), limit → 10.0 MiB |"), "{md}");
        assert!(md.contains("vm.page-cluster 3"), "{md}");
    }
}
