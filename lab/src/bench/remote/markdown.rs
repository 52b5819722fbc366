//! `remote.md`: the floors, the targets, the all-local baselines and the matrix as markdown
//! tables.

use super::report::Report;
use super::runs::spread;
use super::targets::targets;

fn f(v: f64, prec: usize) -> String {
    if v.is_finite() {
        format!("{v:.prec$}")
    } else {
        "-".into()
    }
}

/// The markdown report: floors, the remote-memory targets checked against this run, the all-local
/// baselines, and the matrix.
pub fn markdown(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "TCP 4 KiB floor (loopback, depth 1): p50 {:.1} µs, p99 {:.1} µs (the lower of blocking {:.1} µs and spinning {:.1} µs); \
         memserver read p50 {:.1} µs, p99 {:.1} µs; raw TCP streaming of 4 KiB pages: {:.0} pages/s ({:.2} µs/page; \
         the median of rounds at {}), its writer and reader using {:.2} µs of CPU per page.\n",
        r.floor.tcp_p50_us,
        r.floor.tcp_p99_us,
        r.floor.tcp_blocking_p50_us,
        r.floor.tcp_spinning_p50_us,
        r.floor.memserver_p50_us,
        r.floor.memserver_p99_us,
        r.floor.tcp_stream_pages_per_s,
        1e6 / r.floor.tcp_stream_pages_per_s.max(1e-9),
        r.floor
            .tcp_stream_rounds_pages_per_s
            .iter()
            .map(|p| format!("{:.2}", 1e6 / p.max(1e-9)))
            .collect::<Vec<_>>()
            .join(", "),
        r.floor.tcp_stream_cpu_us_per_page
    );
    let _ = writeln!(
        s,
        "Fault path (vCPU 0, fault handler, memserver connection threads): {}. Prefetchers \
         learn from {} page numbers.\n",
        match r.fault_path_cpu {
            Some(c) => format!("pinned to CPU {c} (`--fault-path-cpu {c}`)"),
            None => "left to the scheduler".into(),
        },
        r.page_space
    );
    s.push_str(&targets(r));
    let _ = writeln!(
        s,
        "| workload | all-local ms | footprint pages | page access p50 ns | checksum |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|");
    for b in &r.baselines {
        let _ = writeln!(
            s,
            "| {} | {}{} | {} | {} | {:#018x} |",
            b.spec,
            f(b.measured_ms, 1),
            spread(&b.runs_ms),
            b.footprint_pages,
            f(b.page_access_p50_ns, 0),
            b.checksum
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| workload | local | prefetcher | time / all-local | demand faults | accuracy | coverage | fault p50 µs | fault p99 µs | install p50 µs | wake p50 µs | page access p50 ns | ns/access | checksum |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in &r.cells {
        let _ = writeln!(
            s,
            "| {} | {}% | {} | {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.workload,
            c.local_pct,
            c.prefetcher,
            f(c.norm_time, 2),
            spread(&c.runs_ms),
            c.demand_faults,
            f(c.accuracy, 3),
            f(c.coverage, 3),
            f(c.fault_p50_us, 1),
            f(c.fault_p99_us, 1),
            f(c.install_p50_us, 1),
            f(c.wake_p50_us, 1),
            f(c.page_access_p50_ns, 0),
            f(c.ns_per_access, 1),
            match (c.timed_out, c.checksum_ok) {
                (true, _) => "TIMEOUT",
                (false, true) => "ok",
                (false, false) => "DIFFERS",
            }
        );
    }
    let _ = writeln!(
        s,
        "\nCPU per remote page in the measured phase (µs: the median run's CPU time by thread \
         between the workload's MEASURE and MEASURED doorbells, divided by the pages read from \
         the memserver meanwhile; memserver = the whole server process). Time / floor: the \
         measured phase's time against moving those pages at the run's raw TCP streaming \
         rate. Pages are sealed (--page-encryption on); sealing off: the total of the cell's \
         unsealed runs (--sealing-pairs), and sealing: what it cost per page (total - off):\n"
    );
    let _ = writeln!(
        s,
        "| workload | local | prefetcher | pages read | time / floor | total | sealing off | sealing | vCPU | fault | evict | store rx+install | store tx | memserver | other |"
    );
    let _ = writeln!(
        s,
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for c in r.cells.iter().filter(|c| c.cpu.measured_pages_read > 0) {
        let pages = c.cpu.measured_pages_read as f64;
        let m = c.cpu.measured.unwrap_or_default();
        let us = |ms: f64| f(ms * 1e3 / pages, 1);
        let _ = writeln!(
            s,
            "| {} | {}% | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.workload,
            c.local_pct,
            c.prefetcher,
            c.cpu.measured_pages_read,
            f(c.time_per_floor, 2),
            f(c.cpu_us_per_page, 1),
            f(c.cpu_us_per_page_unsealed, 1),
            f(c.cpu_us_per_page - c.cpu_us_per_page_unsealed, 2),
            us(m.vcpu),
            us(m.fault),
            us(m.evict),
            us(m.store_rx),
            us(m.store_tx),
            us(m.memserver),
            us(m.other),
        );
    }
    let paired: Vec<String> = r
        .cells
        .iter()
        .filter(|c| c.measured_ms_unsealed.is_finite() && c.measured_ms.is_finite())
        .map(|c| {
            format!(
                "{} {}% {} {}x",
                c.workload,
                c.local_pct,
                c.prefetcher,
                f(c.measured_ms / c.measured_ms_unsealed, 2)
            )
        })
        .collect();
    if !paired.is_empty() {
        let _ = writeln!(
            s,
            "\nMeasured time sealed / unsealed (median runs of the pairs): {}.",
            paired.join("; ")
        );
    }
    let sampled: Vec<_> = r.cells.iter().filter(|c| c.cpu.sampler_ms > 0.0).collect();
    if !sampled.is_empty() {
        let ms = |c: &&super::report::Cell| c.cpu.sampler_ms;
        let lo = sampled.iter().map(ms).fold(f64::INFINITY, f64::min);
        let hi = sampled.iter().map(ms).fold(0.0, f64::max);
        let all: f64 = sampled.iter().map(|c| c.cpu.whole.total()).sum();
        let _ =
            writeln!(
            s,
            "\nThe lab's CPU sampler, left out of these figures, used {}-{} ms of CPU per VM run \
             ({}% of what the runs themselves used).",
            f(lo, 0),
            f(hi, 0),
            f(sampled.iter().map(ms).sum::<f64>() * 100.0 / all.max(1e-9), 1),
        );
    }
    let _ = writeln!(
        s,
        "\nContext switches per 100 remote pages in the measured phase (each a block and a \
         wake-up, or a preemption; same runs):\n"
    );
    let _ = writeln!(
        s,
        "| workload | local | prefetcher | vCPU | fault | evict | store rx+install | store tx | memserver |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|");
    for c in r.cells.iter().filter(|c| c.cpu.measured_pages_read > 0) {
        let per = |n: f64| f(n * 100.0 / c.cpu.measured_pages_read as f64, 1);
        let w = c.cpu.measured_switches.unwrap_or_default();
        let _ = writeln!(
            s,
            "| {} | {}% | {} | {} | {} | {} | {} | {} | {} |",
            c.workload,
            c.local_pct,
            c.prefetcher,
            per(w.vcpu),
            per(w.fault),
            per(w.evict),
            per(w.store_rx),
            per(w.store_tx),
            per(w.memserver),
        );
    }
    // All-local runs, one footprint run per workload, the cells' runs — less the footprint
    // runs that stand as a (100%, none) cell.
    let reused = r
        .cells
        .iter()
        .filter(|c| c.local_pct >= 100.0 && c.prefetcher == "none")
        .count();
    let runs = r.cells.iter().map(|c| c.runs_ms.len()).sum::<usize>()
        + r.baselines
            .iter()
            .map(|b| b.runs_ms.len() + 1)
            .sum::<usize>()
        - reused;
    let repeated = r.cells.iter().any(|c| c.runs_ms.len() > 1);
    let _ = writeln!(
        s,
        "\n{runs} runs in {:.0} s.{} Command: `{}`",
        r.wall_secs,
        if repeated {
            " Each row is its median run; (±x%) is half the range of its runs' times."
        } else {
            ""
        },
        r.command
    );
    s
}
