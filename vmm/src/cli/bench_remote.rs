//! `farvm bench remote`: every workload × local-memory share × prefetcher, each run in a fresh
//! test-guest VM whose RAM is remote (paging engine + an embedded memserver on loopback), against
//! baselines measured in the same invocation: the same workload with all RAM local (no engine),
//! and the 4 KiB TCP request/response floor of this loopback. Writes `remote.md` (markdown
//! table), `remote.json` and PNG charts into `--out`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use farvm_guest_agent::boot::flags;
use farvm_guest_agent::pv::state;
use farvm_vmm::boot::testguest::TestPlan;
use farvm_vmm::devices::pvctl::ProcessRecord;
use farvm_vmm::devices::serial::SerialOut;
use farvm_vmm::memory::Backing;
use farvm_vmm::remote::{Budget, PageSpaceKind, RemoteMemory, RemoteSpec, RemoteStats};
use farvm_vmm::size::format_size;
use farvm_vmm::vm::{BootSpec, Vm, VmConfig, VmOutcome, VmReport};
use farvm_vmm::workload_spec::{place, PlacedWorkload};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::plot::{grouped_bars, RefLine, Series};

pub const REMOTE_ABOUT: &str = "\
Remote-memory matrix: each workload x local memory x prefetcher, in one invocation.

Every cell boots a fresh test-guest VM (one process on vCPU 0) whose RAM is remote: the paging
engine keeps --local percent of the VM's footprint resident and pages the rest to an embedded
memserver on loopback (a fresh one per run). The footprint is the number of pages the VM touches
when nothing is evicted (measured per workload by a first run with all memory local to the
engine), so 50% and 25% mean half and a quarter of what the VM actually uses. Baselines measured
in the same invocation: the same workload with all guest RAM local (no engine: \"all-local\"),
the raw TCP 4 KiB request/response floor of this loopback (farvm-memserver's bench, depth 1),
next to which demand-fault latency is shown, and the raw TCP streaming rate of 4 KiB pages (the
most pages per second any remote-memory design can move over this loopback).

Columns: measured-phase time normalised to all-local; demand faults; prefetch accuracy and
coverage (the engine's estimates: staged markers and 1-in-64 probes reveal hits of injected
prefetches); demand-fault service latency p50/p99 (fault read -> page installed and vCPU woken);
install p50 (UFFDIO_CONTINUE); ns per access (measured time / accesses); page access p50 (stride
only: the guest's own rdtsc timing of each page's first access in a pass: a fault, a prefetch
hit or a resident page).

A targets section above the table checks issue 5's goals against this run's numbers.

Writes OUT/remote.md, OUT/remote.json and OUT/*.png (charts need a TrueType font, e.g.
fonts-dejavu-core).

EXAMPLES
  farvm bench remote                    # full matrix (8 workloads x 3 x 7)
  farvm bench remote --quick            # seq, stride, kv x {100,25}% x {none, leap+stream, next-n}
  farvm bench remote --workload stride --local 25 --prefetcher none --prefetcher leap+stream
  farvm bench remote --quick --repeat 5 # medians of 5 runs per cell

EXIT STATUS
  0 every run completed with the all-local checksum; 1 a run failed or a checksum differed";

#[derive(Args, Debug)]
pub struct RemoteArgs {
    /// Workload (repeatable; NAME[:key=value,...]) [default: the 8 workloads:
    /// seq/stride/random/kv/pagerank 32M, quicksort 16M, matmul 8M. On 2 cores most cells take
    /// seconds, but naive matmul at 25% and pagerank at 50% and 25% of their footprint thrash
    /// until --cell-timeout, which makes the full matrix last over an hour].
    #[arg(long = "workload", value_name = "SPEC")]
    pub workloads: Vec<String>,
    /// Local memory, percent of guest RAM (repeatable) [default: 100 50 25].
    #[arg(long = "local", value_name = "PCT")]
    pub locals: Vec<f64>,
    /// Prefetcher (repeatable) [default: none read-ahead next-n stride leap stream leap+stream].
    #[arg(long = "prefetcher", value_name = "NAME")]
    pub prefetchers: Vec<String>,
    /// Reduced matrix: seq, stride, kv x {100, 25}% x {none, next-n, leap+stream}.
    #[arg(long)]
    pub quick: bool,
    /// Output directory for remote.md, remote.json and the PNG charts.
    #[arg(long, value_name = "DIR", default_value = "bench-remote")]
    pub out: PathBuf,
    /// Seconds of TCP-floor measurement (two rounds).
    #[arg(long, value_name = "SECS", default_value_t = 1)]
    pub floor_secs: u64,
    /// Print the table as JSON on stdout too.
    #[arg(long)]
    pub json: bool,
    /// Seconds one remote-memory VM may run before it is stopped and its cell reported as
    /// TIMEOUT (the matrix goes on).
    #[arg(long, value_name = "SECS", default_value_t = 120)]
    pub cell_timeout: u64,
    /// Runs per cell and per all-local baseline (1-15). Each reports its median run (by
    /// measured time) and the spread of all of them, so a ratio target is not decided by one
    /// noisy run: on this 2-core host single runs of the same cell vary by about ±10%.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=15))]
    pub repeat: u32,
    /// Pin every cell's fault path (vCPU 0, fault handler, the embedded memserver's
    /// connection threads) to host CPU N, as `farvm run --fault-path-cpu` [default: left to
    /// the scheduler]. `farvm bench placement` measures what that buys.
    #[arg(long, value_name = "N")]
    pub fault_path_cpu: Option<usize>,
    /// Page numbers every cell's prefetcher learns from, as `farvm run --page-space`.
    #[arg(long, value_name = "virtual|physical", default_value = "virtual")]
    pub page_space: PageSpaceKind,
}

const DEFAULT_WORKLOADS: [&str; 8] = [
    "seq:ws=32M",
    "stride:ws=32M",
    "random:ws=32M,ops=100000",
    "matmul:ws=8M",
    "matmul-blocked:ws=8M",
    "kv:ws=32M,ops=100000",
    "pagerank:ws=32M,iters=2",
    "quicksort:ws=16M",
];
const QUICK_WORKLOADS: [&str; 3] = ["seq:ws=32M", "stride:ws=32M", "kv:ws=32M,ops=100000"];
const DEFAULT_LOCALS: [f64; 3] = [100.0, 50.0, 25.0];
const QUICK_LOCALS: [f64; 2] = [100.0, 25.0];
const DEFAULT_PREFETCHERS: [&str; 7] = [
    "none",
    "read-ahead",
    "next-n",
    "stride",
    "leap",
    "stream",
    "leap+stream",
];
const QUICK_PREFETCHERS: [&str; 3] = ["none", "next-n", "leap+stream"];

/// One cell of the matrix.
#[derive(Debug, Clone, Serialize)]
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

/// The paging counts of `r`'s measured phase, from the counters stamped on its doorbells.
pub(super) fn measured_phase(r: &ProcessRecord) -> Option<PhaseCounts> {
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

#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    /// The lower of the blocking and spinning request/response p50s (and that one's p99).
    pub tcp_p50_us: f64,
    pub tcp_p99_us: f64,
    /// 16 B request / 4 KiB response, blocking reads (farvm-memserver bench's floor).
    pub tcp_blocking_p50_us: f64,
    /// The same with the client polling the socket instead of sleeping in `recv`.
    pub tcp_spinning_p50_us: f64,
    pub memserver_p50_us: f64,
    pub memserver_p99_us: f64,
    /// Raw TCP streaming of 4 KiB pages over this loopback (one connection), pages/s.
    pub tcp_stream_pages_per_s: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub command: String,
    /// `--fault-path-cpu`: the CPU every cell's fault path was pinned to, if any.
    pub fault_path_cpu: Option<usize>,
    /// `--page-space`.
    pub page_space: PageSpaceKind,
    pub floor: Floor,
    pub baselines: Vec<Baseline>,
    pub cells: Vec<Cell>,
    pub wall_secs: f64,
}

fn ws_of(w: &PlacedWorkload) -> u64 {
    w.spec.ws_bytes
}

/// Guest RAM for one workload: heap + page tables + 40 MiB for the kernel and boot data,
/// rounded up to 16 MiB. (With the default 32 MiB working sets, 50% local then still holds
/// the whole working set: pass larger `--workload ...:ws=` to make that column page.)
fn guest_mem(w: &PlacedWorkload) -> u64 {
    let ws = ws_of(w);
    (ws + ws / 256 + (40 << 20) + (16 << 20) - 1) & !((16 << 20) - 1)
}

fn config(w: &PlacedWorkload, name: &str, run_shift: u32) -> VmConfig {
    VmConfig {
        name: name.to_string(),
        mem_bytes: guest_mem(w),
        vcpus: 1,
        backing: Backing::Anonymous,
        serial: SerialOut::None,
        boot: BootSpec::TestGuest {
            kernel: Arc::from(farvm_vmm::builtin::test_guest_elf()),
            plan: TestPlan {
                procs: vec![w.process_spec()],
                timer_hz: 100,
                flags: flags::RAM_IS_ZERO,
                frame_shuffle_seed: 1,
                frame_run_shift: run_shift,
            },
        },
        echo_guest_logs: false,
        // As `farvm run` with remote memory, for the all-local baseline too (same KVM setup).
        kvm_async_pf: false,
    }
}

/// (measured ms, whole-process ms by the host clock).
pub(super) fn times(r: &ProcessRecord) -> (f64, f64) {
    let first = r.events.first().map(|e| e.host_ns);
    let last = r.events.last().map(|e| e.host_ns);
    let total = match (first, last) {
        (Some(a), Some(b)) if b >= a => (b - a) as f64 / 1e6,
        _ => f64::NAN,
    };
    (r.elapsed_ns as f64 / 1e6, total)
}

fn finished(report: &VmReport, what: &str) -> Result<ProcessRecord> {
    if let VmOutcome::Signal { .. } = report.outcome {
        bail!("interrupted");
    }
    if report.outcome != (VmOutcome::GuestShutdown { status: 0 }) {
        bail!("{what}: {}", report.outcome);
    }
    report
        .processes
        .first()
        .filter(|r| r.state == state::DONE)
        .cloned()
        .with_context(|| format!("{what}: no finished process"))
}

fn run_local(w: &PlacedWorkload) -> Result<ProcessRecord> {
    let vm = Vm::create(config(w, &format!("bench-local-{}", std::process::id()), 9))
        .context("creating the all-local VM")?;
    let running = vm.start()?;
    let outcome = running.wait(Some(Duration::from_secs(1800)), true);
    finished(&running.finish(outcome), &format!("all-local {}", w.name()))
}

/// The run with the median `key` (the lower middle one of an even count); `None` if empty.
pub(super) fn median_run<T>(mut runs: Vec<T>, key: impl Fn(&T) -> f64) -> Option<T> {
    if runs.is_empty() {
        return None;
    }
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let mid = (runs.len() - 1) / 2;
    Some(runs.swap_remove(mid))
}

/// "" for one run, else " (±x%)": half the range of `runs` relative to their median.
fn spread(runs: &[f64]) -> String {
    let mut v: Vec<f64> = runs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() < 2 {
        return String::new();
    }
    v.sort_by(f64::total_cmp);
    let med = v[(v.len() - 1) / 2];
    let half_range = (v[v.len() - 1] - v[0]) / 2.0;
    format!(" (±{:.0}%)", 100.0 * half_range / med.max(1e-9))
}

/// The local budget for `local` percent of a footprint of `footprint` pages.
pub(super) fn budget_for(local: f64, footprint: u64) -> Budget {
    if local >= 100.0 {
        Budget::Unlimited
    } else {
        Budget::Bytes(((footprint as f64 * local / 100.0).ceil() as u64).max(1) * 4096)
    }
}

/// How a remote-memory VM of a cell is set up beyond its budget and prefetcher.
#[derive(Clone, Copy, Debug)]
pub(super) struct CellSetup {
    /// `--fault-path-cpu`.
    pub fault_path_cpu: Option<usize>,
    /// `--page-space`.
    pub page_space: PageSpaceKind,
    /// The test guest hands out frames in runs of 2^shift (`--frame-run-shift`).
    pub frame_run_shift: u32,
}

impl Default for CellSetup {
    /// As `farvm run` with remote memory.
    fn default() -> Self {
        Self {
            fault_path_cpu: None,
            page_space: PageSpaceKind::Virtual,
            frame_run_shift: 9,
        }
    }
}

/// Runs one remote-memory VM; `None` for the process if it hit `timeout`.
pub(super) fn run_remote(
    w: &PlacedWorkload,
    budget: Budget,
    pf: &str,
    timeout: Duration,
    setup: CellSetup,
) -> Result<(Option<ProcessRecord>, RemoteStats)> {
    let name = format!("bench-{}-{}-{pf}", std::process::id(), w.name());
    let cfg = config(w, &name, setup.frame_run_shift);
    let mut spec = RemoteSpec::new(&name);
    spec.budget = budget;
    spec.prefetcher = pf.to_string();
    spec.fault_path_cpu = setup.fault_path_cpu;
    spec.page_space = setup.page_space;
    let mut remote = RemoteMemory::start(&spec, cfg.mem_bytes)?;
    let vm = Vm::create_with_ram(cfg, remote.guest_ram()?).context("creating the VM")?;
    remote.attach_vm(&vm);
    let running = vm.start()?;
    let outcome = running.wait(Some(timeout), true);
    let report = running.finish(outcome);
    let stats = remote.stats();
    let errors = remote.engine().take_errors();
    remote.shutdown();
    if !errors.is_empty() {
        bail!("paging engine errors in {name}: {errors:?}");
    }
    if let VmOutcome::Timeout { .. } = report.outcome {
        return Ok((None, stats));
    }
    Ok((Some(finished(&report, &name)?), stats))
}

fn floor(secs: u64) -> Result<Floor> {
    let cfg = farvm_memclient::bench::BenchConfig {
        duration: Duration::from_secs(secs.max(1)),
        depths: vec![1],
        rounds: 2,
        ..Default::default()
    };
    let server = farvm_vmm::remote::local_server::LocalServer::start(
        farvm_memclient::bench::capacity_bytes(&cfg),
        None,
    )
    .context("starting a memserver for the TCP floor")?;
    let rows = farvm_memclient::bench::run(&cfg, server.addr(), |_| {})
        .context("measuring the TCP floor")?;
    server.shutdown();
    let r = rows.first().context("TCP floor: no result")?;
    let (spin_p50, spin_p99) =
        farvm_memclient::bench::tcp_spinning_floor(Duration::from_secs(secs.max(1)))
            .context("measuring the spinning TCP floor")?;
    // The stricter of the two waiting policies is the floor: on this host a blocked waiter's
    // wake-up costs 10-50 µs depending on whether the other core is idle, and spinning avoids
    // it when the peer runs on the other core.
    let (tcp_p50_us, tcp_p99_us) = if spin_p50 < r.floor.p50_us {
        (spin_p50, spin_p99)
    } else {
        (r.floor.p50_us, r.floor.p99_us)
    };
    Ok(Floor {
        tcp_p50_us,
        tcp_p99_us,
        tcp_blocking_p50_us: r.floor.p50_us,
        tcp_spinning_p50_us: spin_p50,
        memserver_p50_us: r.memserver.p50_us,
        memserver_p99_us: r.memserver.p99_us,
        tcp_stream_pages_per_s: farvm_memclient::bench::tcp_stream_pages_per_sec(
            Duration::from_secs(secs.max(1)),
        )
        .context("measuring the TCP streaming rate")?,
    })
}

fn counter_or_nan(r: &ProcessRecord, i: usize) -> f64 {
    use farvm_workloads::lathist::counter;
    if r.counters[counter::PAGE_ACCESSES_TIMED] == 0 {
        f64::NAN
    } else {
        r.counters[i] as f64
    }
}

pub fn run(a: RemoteArgs) -> Result<()> {
    farvm_vmm::signals::install_termination_handlers()?;
    let t0 = Instant::now();
    let specs: Vec<String> = match (a.workloads.is_empty(), a.quick) {
        (false, _) => a.workloads.clone(),
        (true, true) => QUICK_WORKLOADS.iter().map(|s| s.to_string()).collect(),
        (true, false) => DEFAULT_WORKLOADS.iter().map(|s| s.to_string()).collect(),
    };
    let locals: Vec<f64> = match (a.locals.is_empty(), a.quick) {
        (false, _) => a.locals.clone(),
        (true, true) => QUICK_LOCALS.to_vec(),
        (true, false) => DEFAULT_LOCALS.to_vec(),
    };
    for l in &locals {
        if !(*l > 0.0 && *l <= 100.0) {
            bail!("--local {l}: must be a percentage in (0, 100]");
        }
    }
    let repeat = a.repeat.max(1) as usize;
    let pfs: Vec<String> = match (a.prefetchers.is_empty(), a.quick) {
        (false, _) => a.prefetchers.clone(),
        (true, true) => QUICK_PREFETCHERS.iter().map(|s| s.to_string()).collect(),
        (true, false) => DEFAULT_PREFETCHERS.iter().map(|s| s.to_string()).collect(),
    };
    for p in &pfs {
        if !farvm_prefetch::registry::names().contains(&p.as_str()) {
            bail!(
                "unknown --prefetcher `{p}` (known: {})",
                farvm_prefetch::registry::names().join(", ")
            );
        }
    }
    super::run::check_fault_path_cpu(a.fault_path_cpu).map_err(anyhow::Error::msg)?;
    let setup = CellSetup {
        fault_path_cpu: a.fault_path_cpu,
        page_space: a.page_space,
        ..CellSetup::default()
    };
    let placed = place(&specs, 1).map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    // Per workload: all-local, the footprint run (reused as the (100%, none) cell if the
    // matrix has one), and the matrix.
    let reused = usize::from(locals.iter().any(|&l| l >= 100.0) && pfs.iter().any(|p| p == "none"));
    let total = placed.len() * (repeat + 1 + (locals.len() * pfs.len()) * repeat - reused);
    let bar = ProgressBar::new(total as u64 + 1);
    // Without a terminal the bar is hidden: print one line per cell instead.
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let cell_timeout = Duration::from_secs(a.cell_timeout.max(1));
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("TCP floor");
    let fl = floor(a.floor_secs)?;
    bar.inc(1);
    let mut baselines = Vec::new();
    let mut cells = Vec::new();
    use farvm_workloads::lathist::counter;
    for (wi, w) in placed.iter().enumerate() {
        bar.set_message(format!("{} all-local", w.name()));
        let mut local_runs = Vec::with_capacity(repeat);
        for _ in 0..repeat {
            local_runs.push(run_local(w)?);
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
                a.cell_timeout
            );
        }
        let footprint = probe.1.engine.resident_pages;
        let (bm, bt) = times(&base);
        baselines.push(Baseline {
            workload: w.name().to_string(),
            spec: specs[wi].clone(),
            measured_ms: bm,
            total_ms: bt,
            checksum: base.checksum,
            ops: base.ops,
            footprint_pages: footprint,
            page_access_p50_ns: counter_or_nan(&base, counter::PAGE_ACCESS_P50_NS),
            runs_ms: base_runs_ms,
        });
        let mut probe = Some(probe);
        for &local in &locals {
            let budget = budget_for(local, footprint);
            // Repetitions take turns (none, a, b, none, a, b, ...): a drift in the host's load
            // then spreads over every prefetcher instead of biasing the one that ran last.
            let mut all_runs: Vec<Vec<_>> =
                pfs.iter().map(|_| Vec::with_capacity(repeat)).collect();
            if local >= 100.0 {
                if let Some(i) = pfs.iter().position(|p| p == "none") {
                    all_runs[i].extend(probe.take());
                }
            }
            for _round in 0..repeat {
                for (pf, runs) in pfs.iter().zip(all_runs.iter_mut()) {
                    if runs.len() >= repeat || runs.iter().any(|(r, _)| r.is_none()) {
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
            for (pf, runs) in pfs.iter().zip(all_runs) {
                let runs_ms: Vec<f64> = runs
                    .iter()
                    .map(|(r, _)| r.as_ref().map_or(f64::NAN, |r| times(r).0))
                    .collect();
                let (rec, st) = median_run(runs, |(r, _)| {
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
                cells.push(Cell {
                    workload: w.name().to_string(),
                    spec: specs[wi].clone(),
                    local_pct: local,
                    prefetcher: pf.clone(),
                    measured_ms: m,
                    total_ms: t,
                    norm_time: m / bm,
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
                    checksum_ok: timed_out
                        || (rec.checksum == base.checksum && rec.ops == base.ops),
                    timed_out,
                    runs_ms,
                    measured_phase: phase_counts,
                });
                if let Some(c) = cells.last_mut().filter(|c| c.timed_out) {
                    c.measured_ms = f64::NAN;
                    c.norm_time = f64::NAN;
                    c.ns_per_access = f64::NAN;
                    c.page_access_p50_ns = f64::NAN;
                    c.page_access_p99_ns = f64::NAN;
                }
                if let Some(c) = cells.last().filter(|_| !interactive) {
                    eprintln!(
                        "[{}/{}] {} {}% {}: {}",
                        bar.position(),
                        total + 1,
                        c.workload,
                        c.local_pct,
                        c.prefetcher,
                        if c.timed_out {
                            format!("TIMEOUT after {} s", a.cell_timeout)
                        } else {
                            format!(
                                "{:.2}x all-local, {} demand faults",
                                c.norm_time, c.demand_faults
                            )
                        }
                    );
                }
            }
        }
        // The results so far, so an interrupted matrix still leaves its finished rows.
        let partial = Report {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            fault_path_cpu: a.fault_path_cpu,
            page_space: a.page_space,
            floor: fl.clone(),
            baselines: baselines.clone(),
            cells: cells.clone(),
            wall_secs: t0.elapsed().as_secs_f64(),
        };
        write_report(&a.out, &partial)?;
    }
    bar.finish_and_clear();
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        fault_path_cpu: a.fault_path_cpu,
        page_space: a.page_space,
        floor: fl,
        baselines,
        cells,
        wall_secs: t0.elapsed().as_secs_f64(),
    };
    let md = write_report(&a.out, &report)?;
    print!("{md}");
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    match charts(&report, &a.out, &locals, &pfs) {
        Ok(files) => {
            for f in files {
                println!("wrote {}", f.display());
            }
        }
        Err(e) => eprintln!("farvm: charts skipped: {e:#}"),
    }
    let timeouts = report.cells.iter().filter(|c| c.timed_out).count();
    if timeouts > 0 {
        eprintln!(
            "farvm: {timeouts} run(s) did not finish within --cell-timeout {} s (TIMEOUT rows)",
            a.cell_timeout
        );
    }
    if report.cells.iter().any(|c| !c.checksum_ok) {
        bail!("a remote-memory run's checksum differs from its all-local run");
    }
    Ok(())
}

/// Writes `remote.md` and `remote.json` into `out`; returns the markdown.
fn write_report(out: &std::path::Path, report: &Report) -> Result<String> {
    let md = markdown(report);
    std::fs::write(out.join("remote.md"), &md)?;
    std::fs::write(
        out.join("remote.json"),
        serde_json::to_string_pretty(report)?,
    )?;
    Ok(md)
}

fn f(v: f64, prec: usize) -> String {
    if v.is_finite() {
        format!("{v:.prec$}")
    } else {
        "-".into()
    }
}

/// The markdown report: floors, issue 5's targets checked against this run, the all-local
/// baselines, and the matrix.
pub fn markdown(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "TCP 4 KiB floor (loopback, depth 1): p50 {:.1} µs, p99 {:.1} µs (the lower of blocking {:.1} µs and spinning {:.1} µs); \
         memserver read p50 {:.1} µs, p99 {:.1} µs; raw TCP streaming of 4 KiB pages: {:.0} pages/s ({:.2} µs/page).\n",
        r.floor.tcp_p50_us,
        r.floor.tcp_p99_us,
        r.floor.tcp_blocking_p50_us,
        r.floor.tcp_spinning_p50_us,
        r.floor.memserver_p50_us,
        r.floor.memserver_p99_us,
        r.floor.tcp_stream_pages_per_s,
        1e6 / r.floor.tcp_stream_pages_per_s.max(1e-9)
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

fn met(ok: bool) -> &'static str {
    if ok {
        "MET"
    } else {
        "NOT MET"
    }
}

/// Issue 5's targets, each checked against this run (lines only for cells the run has).
fn targets(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let Some(low) = r
        .cells
        .iter()
        .map(|c| c.local_pct)
        .min_by(|a, b| a.total_cmp(b))
    else {
        return s;
    };
    let cell = |w: &str, p: &str| {
        r.cells
            .iter()
            .find(|c| c.workload == w && c.local_pct == low && c.prefetcher == p)
    };
    let base = |w: &str| r.baselines.iter().find(|b| b.workload == w);
    let _ = writeln!(s, "Targets (issue 5), at {low}% local:\n");
    if let Some(c) = cell("seq", "leap+stream") {
        let _ = writeln!(
            s,
            "- sequential scan, leap+stream coverage in the VM {:.3} (target >= 0.97): {}",
            c.coverage,
            met(c.coverage >= 0.97)
        );
        if let Some(b) = base("seq") {
            // Every page the run read had to cross the loopback at least once: at the raw
            // streaming rate that alone takes this long.
            let pages = c.bytes_read as f64 / 4096.0;
            let floor_ms = pages / r.floor.tcp_stream_pages_per_s.max(1e-9) * 1e3;
            let _ = writeln!(
                s,
                "- sequential scan, leap+stream time {:.2}x all-local (target <= 1.3): {}. \
                 Moving its {:.0} pages over this loopback at the raw TCP streaming rate alone \
                 takes {:.1} ms = {:.2}x the all-local {:.1} ms",
                c.norm_time,
                met(c.norm_time <= 1.3),
                pages,
                floor_ms,
                floor_ms / b.measured_ms.max(1e-9),
                b.measured_ms
            );
        }
    }
    if let (Some(n), Some(l)) = (cell("stride", "none"), cell("stride", "leap+stream")) {
        let ratio = n.page_access_p50_ns / l.page_access_p50_ns.max(1.0);
        let _ = writeln!(
            s,
            "- stride-10, guest-visible page access p50: none {:.0} ns, leap+stream {:.0} ns = {:.1}x better (target >= 50x): {}",
            n.page_access_p50_ns,
            l.page_access_p50_ns,
            ratio,
            met(ratio >= 50.0)
        );
    }
    if let (Some(n), Some(l)) = (cell("kv", "none"), cell("kv", "leap+stream")) {
        let ratio = n.measured_ms / l.measured_ms.max(1e-9);
        let _ = write!(
            s,
            "- Zipf KV, leap+stream speed {:.3}x of no prefetch (target >= 0.98): {}",
            ratio,
            met(ratio >= 0.98)
        );
        // The runs took turns (none, leap+stream, none, ...): round i's two runs saw the
        // same host load.
        let mut paired: Vec<f64> = n
            .runs_ms
            .iter()
            .zip(&l.runs_ms)
            .map(|(a, b)| a / b)
            .filter(|x| x.is_finite())
            .collect();
        if paired.len() > 1 {
            paired.sort_by(f64::total_cmp);
            let _ = write!(
                s,
                ". Round by round {:.3}-{:.3}x, median {:.3}x",
                paired[0],
                paired[paired.len() - 1],
                paired[paired.len() / 2]
            );
        }
        if let (Some(pn), Some(pl)) = (n.measured_phase, l.measured_phase) {
            let _ = write!(
                s,
                ". Measured phase: leap+stream issued {} prefetches (est. {:.0} hits, coverage \
                 {:.3}) and took {} demand faults, none took {}",
                pl.prefetch_issued,
                pl.prefetch_hits,
                pl.coverage,
                pl.demand_faults,
                pn.demand_faults
            );
        }
        let _ = writeln!(s);
    }
    let demand: Vec<&Cell> = r
        .cells
        .iter()
        .filter(|c| c.local_pct == low && c.prefetcher == "none" && c.demand_faults >= 100)
        .collect();
    if !demand.is_empty() {
        let ok = demand
            .iter()
            .filter(|c| c.fault_p50_us <= 1.3 * (r.floor.tcp_p50_us + c.install_p50_us))
            .count();
        let worst = demand
            .iter()
            .map(|c| c.fault_p50_us / (r.floor.tcp_p50_us + c.install_p50_us).max(1e-9))
            .fold(0.0f64, f64::max);
        let _ = writeln!(
            s,
            "- demand-fault p50 <= 1.3x (TCP floor p50 {:.1} µs + the cell's install p50), prefetcher none: {ok} of {} workloads (worst {:.2}x): {}",
            r.floor.tcp_p50_us,
            demand.len(),
            worst,
            met(ok == demand.len())
        );
    }
    let _ = writeln!(s);
    s
}

fn charts(
    r: &Report,
    out: &std::path::Path,
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
    let _ = format_size(0);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::{median_run, spread};

    #[test]
    fn median_run_is_the_middle_one_and_the_lower_middle_of_an_even_count() {
        let runs = vec![
            ("c", 30.0),
            ("a", 10.0),
            ("e", 50.0),
            ("b", 20.0),
            ("d", 40.0),
        ];
        assert_eq!(median_run(runs, |r| r.1).map(|r| r.0), Some("c"));
        let even = vec![("b", 2.0), ("d", 4.0), ("a", 1.0), ("c", 3.0)];
        assert_eq!(median_run(even, |r| r.1).map(|r| r.0), Some("b"));
        // A timed-out run (infinite key) is never the median of runs that finished.
        let with_timeout = vec![("t", f64::INFINITY), ("x", 5.0), ("y", 6.0)];
        assert_eq!(median_run(with_timeout, |r| r.1).map(|r| r.0), Some("y"));
        assert_eq!(median_run(Vec::<(u8, f64)>::new(), |r| r.1), None);
    }

    #[test]
    fn spread_is_half_the_range_over_the_median() {
        assert_eq!(spread(&[100.0]), "");
        assert_eq!(spread(&[90.0, 100.0, 110.0]), " (±10%)");
        assert_eq!(spread(&[f64::NAN, 100.0]), "");
    }
}
