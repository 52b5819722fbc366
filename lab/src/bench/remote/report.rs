//! What `farvm-lab bench remote` reports: the matrix's cells, the all-local baselines and the
//! floors, as written to `remote.json` (and, through `markdown.rs`, `remote.md`).

use std::path::Path;

use anyhow::Result;
use farvm_vmm::remote::PageSpace;
use serde::Serialize;

use super::cpu::RunCpu;

/// One cell of the matrix.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Cell {
    pub workload: String,
    pub spec: String,
    pub local_pct: f64,
    pub prefetcher: String,
    pub measured_ms: f64,
    pub total_ms: f64,
    pub norm_time: f64,
    pub ns_per_access: f64,
    pub demand_faults: u64,
    pub zero_fills: u64,
    pub prefetch_issued: u64,
    pub accuracy: f64,
    pub coverage: f64,
    pub fault_p50_us: f64,
    pub fault_p99_us: f64,
    pub install_p50_us: f64,
    pub wake_p50_us: f64,
    pub store_read_p50_us: f64,
    /// Guest-timed first access of a page in a pass (stride), ns; NaN if not reported.
    pub page_access_p50_ns: f64,
    pub page_access_p99_ns: f64,
    /// The local budget this cell ran with, in pages.
    pub local_pages: u64,
    pub evictions: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub checksum_ok: bool,
    /// The VM did not finish within `--cell-timeout` (its metrics are those at the stop).
    pub timed_out: bool,
    /// Measured ms of every run of this cell (`--repeat`); the row is the median one.
    pub runs_ms: Vec<f64>,
    /// Paging counts of the median run's measured phase alone (the counts above are the
    /// whole run's: setup and warm-up too). None if the run timed out.
    pub measured_phase: Option<PhaseCounts>,
    /// CPU time of the median run by thread (this process's and the memserver child's): the
    /// whole VM run, and its measured phase.
    pub cpu: RunCpu,
    /// The measured phase's CPU time summed over all threads, per page read from the
    /// memserver in that phase (µs; NaN if none were read).
    pub cpu_us_per_page: f64,
    /// `--sealing-pairs`: the same with pages not sealed (`--page-encryption off`), from the
    /// median of the cell's unsealed runs (NaN without them).
    pub cpu_us_per_page_unsealed: f64,
    /// `--sealing-pairs`: the median unsealed run's measured ms (NaN without them).
    pub measured_ms_unsealed: f64,
    /// The measured phase's pages read from the memserver moved at the run's raw TCP
    /// streaming rate, ms (NaN if the phase read none): the transport floor of this cell.
    pub floor_ms: f64,
    /// `measured_ms / floor_ms`: the measured phase against its own pages' streaming floor.
    pub time_per_floor: f64,
}

impl Cell {
    /// Fills `floor_ms` and `time_per_floor` from the measured phase's pages read
    /// (`cpu.measured_pages_read`) and `floor`'s streaming rate. The whole run's
    /// `bytes_read` would count setup and warm-up pages the measured time does not include.
    pub fn set_floor(&mut self, floor: &Floor) {
        let pages = self.cpu.measured_pages_read as f64;
        (self.floor_ms, self.time_per_floor) = if pages > 0.0 && floor.tcp_stream_pages_per_s > 0.0
        {
            let ms = pages / floor.tcp_stream_pages_per_s * 1e3;
            (ms, self.measured_ms / ms)
        } else {
            (f64::NAN, f64::NAN)
        };
    }
}

/// Paging counts between a workload's MEASURE and MEASURED doorbells.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PhaseCounts {
    pub demand_faults: u64,
    pub zero_fills: u64,
    pub prefetch_issued: u64,
    /// Estimated prefetch hits (as the whole-run coverage estimates them).
    pub prefetch_hits: f64,
    pub accuracy: f64,
    pub coverage: f64,
}

/// The all-local baseline of one workload.
#[derive(Debug, Clone, Serialize)]
pub struct Baseline {
    pub workload: String,
    pub spec: String,
    pub measured_ms: f64,
    pub total_ms: f64,
    pub checksum: u64,
    pub ops: u64,
    /// Pages the VM touches with nothing evicted (the 100% of the local column).
    pub footprint_pages: u64,
    pub page_access_p50_ns: f64,
    /// Measured ms of every all-local run (`--repeat`); the row is the median one.
    pub runs_ms: Vec<f64>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Floor {
    /// The lower of the blocking and spinning request/response p50s (and that one's p99).
    pub tcp_p50_us: f64,
    pub tcp_p99_us: f64,
    /// 16 B request / 4 KiB response, blocking reads (farvm-lab bench memserver's floor).
    pub tcp_blocking_p50_us: f64,
    /// The same with the client polling the socket instead of sleeping in `recv`.
    pub tcp_spinning_p50_us: f64,
    pub memserver_p50_us: f64,
    pub memserver_p99_us: f64,
    /// Raw TCP streaming of 4 KiB pages over this loopback (one connection), pages/s: the
    /// median of the rounds below.
    pub tcp_stream_pages_per_s: f64,
    /// CPU time of that stream's writer and reader per page, µs (the median round's).
    pub tcp_stream_cpu_us_per_page: f64,
    /// Every round of the streaming measurement, pages/s, in the order measured.
    pub tcp_stream_rounds_pages_per_s: Vec<f64>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub command: String,
    /// `--fault-path-cpu`: the CPU every cell's fault path was pinned to, if any.
    pub fault_path_cpu: Option<usize>,
    /// Host CPUs this invocation could run on: every cell's threads and its memserver share
    /// them.
    pub host_cpus: usize,
    /// `--page-space`.
    pub page_space: PageSpace,
    pub floor: Floor,
    pub baselines: Vec<Baseline>,
    pub cells: Vec<Cell>,
    pub wall_secs: f64,
}

/// Writes `remote.md` and `remote.json` into `out`; returns the markdown.
pub(super) fn write_report(out: &Path, report: &Report) -> Result<String> {
    let md = super::markdown::markdown(report);
    std::fs::write(out.join("remote.md"), &md)?;
    std::fs::write(
        out.join("remote.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    Ok(md)
}
