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
use farvm_guest_agent::pv::{phase, state};
use farvm_vmm::boot::testguest::TestPlan;
use farvm_vmm::devices::pvctl::ProcessRecord;
use farvm_vmm::devices::serial::SerialOut;
use farvm_vmm::memory::Backing;
use farvm_vmm::remote::{Budget, RemoteMemory, RemoteSpec, RemoteStats};
use farvm_vmm::size::format_size;
use farvm_vmm::vm::{BootSpec, Vm, VmConfig, VmOutcome, VmReport};
use farvm_vmm::workload_spec::{place, PlacedWorkload};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

use super::plot::{grouped_bars, RefLine, Series};

pub const REMOTE_ABOUT: &str = "\
Remote-memory matrix: each workload x local memory x prefetcher, in one invocation.

Every cell boots a fresh test-guest VM (one process on vCPU 0) whose RAM is remote: the paging
engine keeps --local percent of guest RAM resident and pages the rest to an embedded memserver on
loopback (a fresh one per run). Baselines measured in the same invocation: the same workload with
all guest RAM local (no engine: \"all-local\"), and the raw TCP 4 KiB request/response floor of
this loopback (farvm-memserver's bench, depth 1), next to which demand-fault latency is shown.

Columns: measured-phase time normalised to all-local; demand faults; prefetch accuracy and
coverage (the engine's estimates: staged markers and 1-in-16 probes reveal hits of injected
prefetches); demand-fault service latency p50/p99 (fault read -> page installed and vCPU woken);
install p50 (UFFDIO_CONTINUE + wake); ns per access (stride: measured time / accesses).

Writes OUT/remote.md, OUT/remote.json and OUT/*.png (charts need a TrueType font, e.g.
fonts-dejavu-core).

EXAMPLES
  farvm bench remote                    # full matrix (8 workloads x 3 x 7)
  farvm bench remote --quick            # seq, stride, kv x {100,25}% x {none, leap+stream, next-n}
  farvm bench remote --workload stride --local 25 --prefetcher none --prefetcher leap+stream

EXIT STATUS
  0 every run completed with the all-local checksum; 1 a run failed or a checksum differed";

#[derive(Args, Debug)]
pub struct RemoteArgs {
    /// Workload (repeatable; NAME[:key=value,...]) [default: the 8 workloads, sized so the
    /// full matrix takes about 8 minutes on 2 cores: seq/stride/random/kv/pagerank 32M,
    /// quicksort 16M, matmul 8M].
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
    pub store_read_p50_us: f64,
    pub evictions: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub checksum_ok: bool,
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
}

#[derive(Debug, Clone, Serialize)]
pub struct Floor {
    pub tcp_p50_us: f64,
    pub tcp_p99_us: f64,
    pub memserver_p50_us: f64,
    pub memserver_p99_us: f64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub command: String,
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
    }
}

/// (measured ms, whole-process ms by the host clock).
fn times(r: &ProcessRecord) -> (f64, f64) {
    let first = r.events.first().map(|e| e.host_ns);
    let last = r.events.last().map(|e| e.host_ns);
    let total = match (first, last) {
        (Some(a), Some(b)) if b >= a => (b - a) as f64 / 1e6,
        _ => f64::NAN,
    };
    let _ = phase::MEASURE;
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

fn run_remote(w: &PlacedWorkload, local: f64, pf: &str) -> Result<(ProcessRecord, RemoteStats)> {
    let name = format!("bench-{}-{}-{local}-{pf}", std::process::id(), w.name());
    let cfg = config(w, &name, 9);
    let mut spec = RemoteSpec::new(&name);
    spec.budget = if local >= 100.0 {
        Budget::Unlimited
    } else {
        Budget::Percent(local)
    };
    spec.prefetcher = pf.to_string();
    let mut remote = RemoteMemory::start(&spec, cfg.mem_bytes)?;
    let vm = Vm::create_with_ram(cfg, remote.guest_ram()?).context("creating the VM")?;
    remote.bind_kvm(vm.vm_fd(), 1);
    let w1 = Arc::downgrade(vm.shared());
    let w2 = w1.clone();
    remote.watch_vcpus(
        1,
        move || w1.upgrade().map(|s| s.vcpu_tids()).unwrap_or_default(),
        move |c| w2.upgrade().and_then(|s| s.pv.agent_slot_gpa(c)),
    );
    let running = vm.start()?;
    let outcome = running.wait(Some(Duration::from_secs(1800)), true);
    let report = running.finish(outcome);
    let stats = remote.stats();
    let errors = remote.engine().take_errors();
    remote.shutdown();
    if !errors.is_empty() {
        bail!("paging engine errors in {name}: {errors:?}");
    }
    Ok((finished(&report, &name)?, stats))
}

fn floor(secs: u64) -> Result<Floor> {
    let cfg = farvm_memserver::bench::BenchConfig {
        duration: Duration::from_secs(secs.max(1)),
        depths: vec![1],
        rounds: 2,
        ..Default::default()
    };
    let rows = farvm_memserver::bench::run(&cfg, |_| {}).context("measuring the TCP floor")?;
    let r = rows.first().context("TCP floor: no result")?;
    Ok(Floor {
        tcp_p50_us: r.floor.p50_us,
        tcp_p99_us: r.floor.p99_us,
        memserver_p50_us: r.memserver.p50_us,
        memserver_p99_us: r.memserver.p99_us,
    })
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
    let placed = place(&specs, 1).map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let total = placed.len() * (1 + locals.len() * pfs.len());
    let bar = ProgressBar::new(total as u64 + 1);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message("TCP floor");
    let fl = floor(a.floor_secs)?;
    bar.inc(1);
    let mut baselines = Vec::new();
    let mut cells = Vec::new();
    for (wi, w) in placed.iter().enumerate() {
        bar.set_message(format!("{} all-local", w.name()));
        let base = run_local(w)?;
        bar.inc(1);
        let (bm, bt) = times(&base);
        baselines.push(Baseline {
            workload: w.name().to_string(),
            spec: specs[wi].clone(),
            measured_ms: bm,
            total_ms: bt,
            checksum: base.checksum,
            ops: base.ops,
        });
        for &local in &locals {
            for pf in &pfs {
                if farvm_vmm::signals::termination_requested().is_some() {
                    bail!("interrupted");
                }
                bar.set_message(format!("{} {local}% {pf}", w.name()));
                let (rec, st) = run_remote(w, local, pf)?;
                bar.inc(1);
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
                    store_read_p50_us: e.store_read.p50 as f64 / 1e3,
                    evictions: c.evictions,
                    bytes_read: c.bytes_read,
                    bytes_written: c.bytes_written,
                    checksum_ok: rec.checksum == base.checksum && rec.ops == base.ops,
                });
            }
        }
    }
    bar.finish_and_clear();
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        floor: fl,
        baselines,
        cells,
        wall_secs: t0.elapsed().as_secs_f64(),
    };
    let md = markdown(&report);
    std::fs::write(a.out.join("remote.md"), &md)?;
    std::fs::write(
        a.out.join("remote.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
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
    if report.cells.iter().any(|c| !c.checksum_ok) {
        bail!("a remote-memory run's checksum differs from its all-local run");
    }
    Ok(())
}

fn f(v: f64, prec: usize) -> String {
    if v.is_finite() {
        format!("{v:.prec$}")
    } else {
        "-".into()
    }
}

/// The markdown table (and the floor / baseline lines above it).
pub fn markdown(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "TCP 4 KiB floor (loopback, depth 1): p50 {:.1} µs, p99 {:.1} µs; memserver read p50 {:.1} µs, p99 {:.1} µs.\n",
        r.floor.tcp_p50_us, r.floor.tcp_p99_us, r.floor.memserver_p50_us, r.floor.memserver_p99_us
    );
    let _ = writeln!(s, "| workload | all-local ms | checksum |");
    let _ = writeln!(s, "|---|---|---|");
    for b in &r.baselines {
        let _ = writeln!(
            s,
            "| {} | {} | {:#018x} |",
            b.spec,
            f(b.measured_ms, 1),
            b.checksum
        );
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| workload | local | prefetcher | time / all-local | demand faults | accuracy | coverage | fault p50 µs | fault p99 µs | install p50 µs | ns/access | checksum |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in &r.cells {
        let _ = writeln!(
            s,
            "| {} | {}% | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            c.workload,
            c.local_pct,
            c.prefetcher,
            f(c.norm_time, 2),
            c.demand_faults,
            f(c.accuracy, 3),
            f(c.coverage, 3),
            f(c.fault_p50_us, 1),
            f(c.fault_p99_us, 1),
            f(c.install_p50_us, 1),
            f(c.ns_per_access, 1),
            if c.checksum_ok { "ok" } else { "DIFFERS" }
        );
    }
    let _ = writeln!(
        s,
        "\n{} runs in {:.0} s. Command: `{}`",
        r.cells.len() + r.baselines.len(),
        r.wall_secs,
        r.command
    );
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
