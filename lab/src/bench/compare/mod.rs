//! `farvm-lab bench compare`: farvm against what operators run today, in one invocation. The
//! same test-guest VM (`farvm run`, one child process per run) runs each workload all-local,
//! on farvm remote memory (loopback memserver) with each prefetcher, and with all RAM local but
//! its VMM process in a memory cgroup limited to the same budget, the kernel swapping it to
//! zram or to a swapfile on a tmpfs-backed loop device (Linux swap read-ahead at the host's
//! `vm.page-cluster`). QEMU boots the same guest, all-local and in the same cgroup and swap
//! ([`qemu`]). Host setup and teardown live in [`host`]; the table and charts in [`report`].

mod failure;
mod guest_rss;
mod host;
pub(crate) mod qemu;
mod report;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use farvm_vmm::workload_spec::{place, PlacedWorkload};
use serde::Serialize;

use super::remote::runner::guest_mem;
use failure::{exit_ending, oom_ending, signal_ending, FailedCell, Failure};
use guest_rss::{GuestStats, Steer, Watch, Watcher};
use host::{MemCgroup, SwapDevice, SwapKind};

pub const COMPARE_ABOUT: &str = "\
farvm against kernel swap, in one invocation. Every run is `farvm run` booting the test guest
with one workload (a child process per run; the same guest RAM size, frame layout and workload
in every setup), and the workload's measured phase as the guest times it is compared:

  all-local          --local-only, no limit (the baseline every time is normalised to)
  farvm PREFETCHER   remote memory: --local-memory BUDGET on a loopback farvm-memserver, once
                     per --prefetcher (default leap+stream and none)
  kernel swap, zram  --local-only, the VMM process in a cgroup-v1 memory cgroup limited to
                     BUDGET + the VMM's own memory, the kernel swapping to a zram device (lz4)
  kernel swap, loop  the same, swapping to a swapfile on a loop device backed by tmpfs
  kernel swap, NBD   the same, swapping to an NBD device (nbd-client -swap) served by nbd-server
                     on 127.0.0.1 from a file on tmpfs: swap over the loopback TCP farvm's
                     memserver uses (--swap nbd or all; the nbd module: the KVM lab has it)
  QEMU all-local     qemu-system-x86_64 -accel kvm -machine microvm booting the same test guest
                     (its PVH entry; results on the serial console), no limit
  QEMU + kernel swap QEMU in the same memory cgroup, limited to BUDGET + QEMU's own memory,
                     swapping to each kernel-swap device (what operators run today)

Linux's swap read-ahead runs at the host's vm.page-cluster (printed; left as found). BUDGET is
--local percent of the workload's footprint (pages the VM touches, from a farvm run with all
memory local to its paging engine). Equal budgets: while a VM runs in the cgroup, farvm-lab
samples the guest-RAM mapping in the VMM's /proc/PID/smaps (resident and swapped pages) and the
cgroup's charge every 20 ms. The all-local run gives the VMM's own memory (most the cgroup held
beyond the guest's resident pages) and its kernel memory (v1 memory.kmem.usage_in_bytes, v2
memory.stat kernel). A kernel-swap run starts at limit BUDGET + own memory and the limit is
steered so that the guest keeps BUDGET pages resident, as farvm's engine does: down by the
guest's excess, up by half its shortfall when the cgroup is at the limit, never below BUDGET +
the kernel memory (which reclaim cannot free). The tables show, per kernel-swap cell, the
guest's resident pages once the kernel swapped (median, max), pages swapped in and the final
limit, next to farvm's demand faults and prefetches (QEMU: see --qemu-limit for the start;
QEMU runs with transparent huge pages off, 4 KiB guest pages like farvm's). Under cgroup v1 the cgroup's OOM killer is off
(memory.oom_control): at such limits the cgroup's reclaim gives up on pages a vCPU keeps mapped
and would kill the VMM; without the OOM killer the VMM waits until reclaim frees a page, and
that wait is part of kernel swap's time. Under cgroup v2 (kernels without v1 memory, such as
the KVM lab's) the limit is memory.high: reclaim and throttling above it, no OOM killer.

farvm-lab sets up and tears down the cgroup, the zram device, the tmpfs mount, the swapfile and
its loop device itself (also on errors and Ctrl-C), and refuses to start when it is not root,
the cgroup-v1 memory controller or zram is missing, or swap is already on. --swap none skips
the kernel-swap setups (no root needed); --qemu none skips QEMU.

Every run must reproduce the all-local checksum. A run of a compared setup that does not, or
that crashes (a signal), exits non-zero, hits --cell-timeout, is killed by the kernel's OOM
killer ('OOM-killed', with the cgroup's OOM record) or fails at the cgroup's limit, fails its
cell, and the bench goes on: the table gives 'failed: REASON' (and how many of the cell's runs
failed), compare.json the cell's `failed` (kind, reason, runs), the charts an x labelled
'failed: KIND' where its bar would stand; the ratios it would enter are '-'. Under cgroup v1
with the OOM killer off, a write the kernel makes to the VMM's memory on its behalf (a thread's
rseq area) cannot wait for memory at the limit, and the kernel sends SIGSEGV: reported as
'SIGSEGV from the kernel at the cgroup's limit'. A failed footprint or all-local run (the
references) ends the bench. Each cell runs --repeat times, setups taking turns; the median is
reported. Writes compare.md, compare.json and two charts (time over all-local; farvm over
kernel swap; log scale, ticks at 1, 2 and 5 times each power of ten) into --out.

EXAMPLES
  farvm-lab bench compare --out docs/bench/compare
  farvm-lab bench compare --workload seq:ws=32M --local 25 --swap zram --repeat 1

EXIT STATUS
  0 every run completed with the all-local checksum; 1 a cell failed (after every cell ran and
  the outputs were written; the failed cells are listed), a reference run failed, or the host
  could not be set up";

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// Workload (repeatable; NAME[:key=value,...]) [default: seq, stride, kv at ws=32M].
    #[arg(long = "workload", value_name = "SPEC")]
    pub workloads: Vec<String>,
    /// Local memory, percent of the footprint (repeatable) [default: 50 and 25].
    #[arg(long = "local", value_name = "PCT")]
    pub local: Vec<f64>,
    /// farvm prefetcher (repeatable) [default: leap+stream and none].
    #[arg(long = "prefetcher", value_name = "NAME")]
    pub prefetchers: Vec<String>,
    /// Kernel-swap devices: zram, loop, nbd (NBD over loopback TCP; needs the nbd module),
    /// both (zram and loop), all, or none.
    #[arg(
        long,
        value_name = "zram|loop|nbd|both|all|none",
        default_value = "both"
    )]
    pub swap: String,
    /// Runs per cell and setup (median reported).
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=15))]
    pub repeat: u32,
    /// Seconds one VM may run.
    #[arg(long, value_name = "SECS", default_value_t = 300)]
    pub cell_timeout: u64,
    /// QEMU (a path, or a name on PATH), or `none` to leave QEMU out.
    #[arg(long, value_name = "PATH|none", default_value = "qemu-system-x86_64")]
    pub qemu: String,
    /// QEMU's starting cgroup limit, steered from there so that the guest keeps BUDGET pages:
    /// BUDGET + farvm's VMM's own memory (`farvm`; the steering raises it if QEMU needs more),
    /// or BUDGET + QEMU's own memory measured all-local (`own`: tens of MiB, mostly cold; a
    /// short run can end before the steering has brought the guest down to BUDGET).
    #[arg(long, value_name = "own|farvm", default_value = "farvm")]
    pub qemu_limit: String,
    /// The farvm binary [default: `farvm` next to farvm-lab].
    #[arg(long, value_name = "PATH")]
    pub farvm: Option<PathBuf>,
    /// Directory for compare.md, compare.json and the charts.
    #[arg(long, value_name = "DIR", default_value = "compare-out")]
    pub out: PathBuf,
}

/// One setup of a cell.
#[derive(Clone, Debug, PartialEq)]
enum Setup {
    Farvm(String),
    Swap(SwapKind),
    /// QEMU all-local (`None`) or in the cgroup with kernel swap.
    Qemu(Option<SwapKind>),
}

impl Setup {
    fn label(&self) -> String {
        match self {
            Setup::Farvm(pf) => format!("farvm {pf}"),
            Setup::Swap(k) => k.label().to_string(),
            Setup::Qemu(None) => "QEMU all-local".to_string(),
            Setup::Qemu(Some(k)) => format!("QEMU + {}", k.label()),
        }
    }
}

/// How long past its own --timeout a `farvm run` may take before the bench kills it: a VMM
/// whose memory cgroup is out of memory with the OOM killer off waits in the kernel, where its
/// own timer cannot end it.
const KILL_GRACE: Duration = Duration::from_secs(30);

/// Runs `cmd` to completion, or SIGKILLs it once `limit` has passed; its output either way, and
/// what `watch` saw of the guest's memory meanwhile.
fn output_within(
    mut cmd: Command,
    limit: Duration,
    watch: Option<Watch>,
) -> Result<(std::process::Output, Option<GuestStats>)> {
    let child = cmd.spawn().context("starting farvm")?;
    let pid = child.id();
    let watcher = match watch.map(|w| Watcher::start(pid, w)).transpose() {
        Ok(w) => w,
        Err(e) => {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
            return Err(e).context("starting the guest-memory watcher");
        }
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(limit) {
        Ok(out) => out,
        Err(_) => {
            eprintln!(
                "farvm (pid {pid}) still running after {} s: killing it",
                limit.as_secs()
            );
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            rx.recv().context("waiting for the killed farvm")?
        }
    };
    let _ = waiter.join();
    let stats = watcher.map(Watcher::finish);
    Ok((out.context("waiting for farvm")?, stats))
}

/// `farvm run`'s exit status when --timeout expired.
const TIMED_OUT: i32 = 124;

/// One finished `farvm run`.
#[derive(Clone, Debug, Serialize)]
pub struct RunResult {
    /// NaN if the run did not finish.
    pub measured_ms: f64,
    /// None if the run did not finish.
    pub checksum: Option<u64>,
    /// Why the run gave no result (it did not finish, or finished with the wrong checksum).
    pub failed: Option<Failure>,
    /// farvm: demand faults of the measured phase; kernel swap: pages swapped in host-wide
    /// during the run.
    pub faults: u64,
    /// farvm: prefetches issued in the measured phase.
    pub prefetches: u64,
    /// The guest's pages resident and swapped, sampled from the VMM's smaps (runs in a cgroup).
    pub guest: Option<GuestStats>,
}

/// A setup's runs of one cell.
#[derive(Clone, Debug, Serialize)]
pub struct SetupResult {
    pub setup: String,
    /// NaN (JSON null) when a run failed.
    pub median_ms: f64,
    /// The runs that gave a result.
    pub runs_ms: Vec<f64>,
    /// Median over all-local.
    pub vs_all_local: f64,
    /// Of the median run (see [`RunResult::faults`]).
    pub faults: u64,
    /// Of the median run (see [`RunResult::prefetches`]).
    pub prefetches: u64,
    /// Of the median run, or of the first failed one (see [`RunResult::guest`]).
    pub guest: Option<GuestStats>,
    /// Set when a run failed: the cell then has no time and no ratio.
    pub failed: Option<FailedCell>,
}

/// One workload at one local share.
#[derive(Clone, Debug, Serialize)]
pub struct Cell {
    pub workload: String,
    pub local_pct: f64,
    pub footprint_pages: u64,
    pub budget_bytes: u64,
    /// Memory-cgroup limit of the kernel-swap setups (budget + the VMM's own memory).
    pub cgroup_limit_bytes: u64,
    /// The same for QEMU (budget + QEMU's own memory), when QEMU runs.
    pub qemu_cgroup_limit_bytes: Option<u64>,
    /// The lowest limit the steering may set (budget + the VMM's kernel memory).
    pub cgroup_floor_bytes: u64,
    /// The same for QEMU.
    pub qemu_cgroup_floor_bytes: Option<u64>,
    pub all_local_ms: f64,
    /// The all-local checksum every run reproduced.
    pub checksum: u64,
    pub setups: Vec<SetupResult>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub command: String,
    pub cell_timeout_secs: u64,
    pub page_cluster: String,
    pub load_average: String,
    pub wall_secs: f64,
    pub cells: Vec<Cell>,
}

fn farvm_binary(given: &Option<PathBuf>) -> Result<PathBuf> {
    let path = match given {
        Some(p) => p.clone(),
        None => std::env::current_exe()
            .context("locating farvm-lab")?
            .with_file_name("farvm"),
    };
    if !path.is_file() {
        bail!(
            "no farvm binary at {} (build it: cargo build --release -p farvm-vmm; or pass --farvm)",
            path.display()
        );
    }
    Ok(path)
}

/// How to run one VM.
struct Runner<'a> {
    farvm: &'a Path,
    timeout: Duration,
}

impl Runner<'_> {
    /// `farvm run` of `spec`, with `extra` arguments, in `cgroup` if given (its limit steered
    /// by `steer`, if given); returns the run and the JSON report.
    fn run(
        &self,
        spec: &str,
        w: &PlacedWorkload,
        extra: &[String],
        cgroup: Option<&MemCgroup>,
        steer: Option<Steer>,
    ) -> Result<(RunResult, serde_json::Value)> {
        let mut cmd = match cgroup {
            Some(cg) => cg.command(self.farvm),
            None => Command::new(self.farvm),
        };
        cmd.args([
            "run",
            "--memory",
            &format!("{}M", guest_mem(w) >> 20),
            "--workload",
            spec,
            // The same guest frame layout in every setup (farvm run's default with remote
            // memory): kernel swap's read-ahead then sees the same address runs.
            "--frame-run-shift",
            "9",
            "--serial",
            "none",
            "--no-control-socket",
            "--json",
            "--timeout",
            &self.timeout.as_secs().to_string(),
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped());
        let swaps_before = host::swap_counters();
        let watch = cgroup.map(|cg| Watch {
            guest_bytes: guest_mem(w),
            cgroup: Some(cg.limit_file()),
            steer,
        });
        let hits_before = cgroup.map_or(0, MemCgroup::limit_hits);
        let (out, guest) = output_within(cmd, self.timeout + KILL_GRACE, watch)?;
        let oom = cgroup
            .map_or(0, MemCgroup::limit_hits)
            .saturating_sub(hits_before);
        let swaps_after = host::swap_counters();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let what = format!("farvm run --workload {spec} {}", extra.join(" "));
        let stderr = String::from_utf8_lossy(&out.stderr);
        // A run that failed (timed out, killed by a signal: the kernel's OOM killer, or a fault
        // the VMM took when the cgroup could not charge a page; a non-zero exit; no report) is
        // its setup's result, not a bench error: the caller decides (a reference run that
        // failed ends the bench).
        let report = match (
            out.status.code(),
            std::os::unix::process::ExitStatusExt::signal(&out.status),
        ) {
            (Some(TIMED_OUT), _) => Err(Failure::Timeout {
                secs: self.timeout.as_secs(),
            }),
            (_, Some(sig)) => Err(signal_ending(
                sig,
                cgroup.map(MemCgroup::events).as_deref(),
                oom,
            )),
            // Any other failure while the cgroup was out of memory (e.g. the guest crashed
            // because KVM could not fault in a guest page from inside the kernel) is kernel
            // swap's result at this limit.
            (Some(code), _) if code != 0 && oom > 0 => {
                Err(oom_ending(&format!("exit {code}"), &stderr, oom))
            }
            (Some(code), _) if code != 0 => Err(exit_ending(&format!("exit {code}"), &stderr)),
            _ => json_report(&stdout),
        };
        let v = match report {
            Ok(v) => v,
            Err(failure) => {
                eprintln!("{what}: {failure}: {}", stderr.trim());
                return Ok((
                    RunResult {
                        measured_ms: f64::NAN,
                        checksum: None,
                        faults: 0,
                        prefetches: 0,
                        guest,
                        failed: Some(failure),
                    },
                    serde_json::Value::Null,
                ));
            }
        };
        let p = &v["processes"][0];
        let phase = &p["measured_phase_paging"];
        let faults = match v["paging"].is_null() {
            true => swaps_after.0.saturating_sub(swaps_before.0),
            false => phase["demand_faults"].as_u64().unwrap_or(0),
        };
        Ok((
            RunResult {
                measured_ms: p["time_ms"].as_f64().unwrap_or(f64::NAN),
                checksum: p["checksum"].as_u64(),
                faults,
                prefetches: phase["prefetch_issued"].as_u64().unwrap_or(0),
                guest,
                failed: None,
            },
            v,
        ))
    }
}

/// The JSON report on a successful `farvm run`'s stdout (its last line starting with `{`),
/// whose process finished its workload; a failure of the run otherwise.
fn json_report(stdout: &str) -> Result<serde_json::Value, Failure> {
    let exit = |detail: String| Failure::Exit { detail };
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| exit("exit 0 without a JSON report on stdout".into()))?;
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| exit(format!("a bad JSON report: {e}")))?;
    let state = &v["processes"][0]["state_name"];
    if state != "done" {
        return Err(exit(format!("the guest's process ended {state}")));
    }
    Ok(v)
}

/// The VMM's own memory in an all-local run in `cg`: the most the cgroup held beyond the
/// guest's resident pages, sampled while it ran (cgroup v2 charges the VMM's kernel memory too:
/// KVM's page tables, vCPU structures); the cgroup's peak less the footprint if nothing was
/// sampled (a run shorter than one sampling period).
fn own_memory(cg: &MemCgroup, r: &RunResult, footprint: u64) -> Result<u64> {
    match &r.guest {
        Some(g) if g.samples > 0 => Ok(g.vmm_own_max_bytes),
        _ => Ok(cg.max_usage()?.saturating_sub(footprint * 4096)),
    }
}

/// The most kernel memory (which reclaim cannot free) the cgroup held in an all-local run.
fn kernel_memory(r: &RunResult) -> u64 {
    r.guest.as_ref().map_or(0, |g| g.kernel_max_bytes)
}

/// Median; a timed-out run (NaN) counts as the slowest.
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| match (a.is_nan(), b.is_nan()) {
        (false, false) => a.total_cmp(b),
        (x, y) => x.cmp(&y),
    });
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn interrupted() -> Result<()> {
    if farvm_vmm::signals::termination_requested().is_some() {
        bail!("interrupted");
    }
    Ok(())
}

pub fn run(a: CompareArgs) -> Result<()> {
    farvm_vmm::signals::install_termination_handlers()?;
    let t0 = Instant::now();
    let swaps: Vec<SwapKind> = match a.swap.as_str() {
        "both" => vec![SwapKind::Zram, SwapKind::Loop],
        "zram" => vec![SwapKind::Zram],
        "loop" => vec![SwapKind::Loop],
        "nbd" => vec![SwapKind::Nbd],
        "all" => vec![SwapKind::Zram, SwapKind::Loop, SwapKind::Nbd],
        "none" => vec![],
        s => bail!("--swap {s}: expected zram, loop, nbd, both (zram and loop), all or none"),
    };
    let specs: Vec<String> = if a.workloads.is_empty() {
        ["seq:ws=32M", "stride:ws=32M", "kv:ws=32M"]
            .map(String::from)
            .to_vec()
    } else {
        a.workloads.clone()
    };
    let locals = if a.local.is_empty() {
        vec![50.0, 25.0]
    } else {
        a.local.clone()
    };
    if let Some(l) = locals.iter().find(|&&l| !(l > 0.0 && l < 100.0)) {
        bail!("--local {l}: must be a percentage in (0, 100)");
    }
    let prefetchers = if a.prefetchers.is_empty() {
        vec!["leap+stream".to_string(), "none".to_string()]
    } else {
        a.prefetchers.clone()
    };
    for p in &prefetchers {
        if !farvm_prefetch::registry::names().contains(&p.as_str()) {
            bail!(
                "unknown --prefetcher `{p}` (known: {})",
                farvm_prefetch::registry::names().join(", ")
            );
        }
    }
    if !["own", "farvm"].contains(&a.qemu_limit.as_str()) {
        bail!("--qemu-limit {}: expected own or farvm", a.qemu_limit);
    }
    let placed = place(&specs, 1).map_err(anyhow::Error::msg)?;
    let farvm = farvm_binary(&a.farvm)?;
    if !swaps.is_empty() {
        host::check_preconditions()?;
    }
    if swaps.contains(&SwapKind::Nbd) {
        host::check_nbd()?;
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let runner = Runner {
        farvm: &farvm,
        timeout: Duration::from_secs(a.cell_timeout.max(1)),
    };
    let tag = std::process::id().to_string();
    let cgroup = if swaps.is_empty() {
        None
    } else {
        Some(MemCgroup::create(&format!("farvm-compare-{tag}"))?)
    };
    let qemu = match a.qemu.as_str() {
        "none" => None,
        exe => Some(qemu::Qemu::new(exe, &tag, runner.timeout)?),
    };
    // QEMU all-local runs, per workload (filled with the baselines below).
    let mut qemu_local: Vec<Vec<RunResult>> = Vec::new();

    let mut cells = Vec::new();
    for (spec, w) in specs.iter().zip(&placed) {
        interrupted()?;
        // Footprint: farvm with all memory local to its engine. It and all-local are the
        // references every setup is measured against: without them no cell has a meaning.
        let (r, v) = runner.run(
            spec,
            w,
            &["--local-memory".into(), "all".into()],
            None,
            None,
        )?;
        if let Some(f) = &r.failed {
            bail!("{spec}: the footprint run (farvm --local-memory all) failed: {f}");
        }
        let footprint = v["paging"]["engine"]["resident_pages"]
            .as_u64()
            .with_context(|| format!("{spec}: no resident_pages in the footprint run"))?;
        // All-local, in the (unlimited) cgroup when there is one, for the VMM's own memory.
        let mut local_runs = Vec::new();
        let mut vmm_own = 0u64;
        let mut vmm_kernel = 0u64;
        for _ in 0..a.repeat {
            interrupted()?;
            if let Some(cg) = &cgroup {
                cg.set_limit(None)?;
            }
            let (r, _) = runner.run(spec, w, &["--local-only".into()], cgroup.as_ref(), None)?;
            if let Some(cg) = &cgroup {
                vmm_own = vmm_own.max(own_memory(cg, &r, footprint)?);
                vmm_kernel = vmm_kernel.max(kernel_memory(&r));
            }
            if let Some(f) = &r.failed {
                bail!("{spec}: the all-local run (the reference) failed: {f}");
            }
            eprintln!("{spec} all-local: {:.1} ms", r.measured_ms);
            local_runs.push(r);
        }
        let Some(checksum) = local_runs[0].checksum else {
            bail!("{spec}: the all-local run reported no checksum");
        };
        if let Some(r) = local_runs.iter().find(|r| r.checksum != Some(checksum)) {
            bail!(
                "{spec}: all-local runs disagree on the checksum ({:?} vs {checksum:#x})",
                r.checksum
            );
        }
        let all_local_ms = median(local_runs.iter().map(|r| r.measured_ms).collect());
        // QEMU all-local, in the (unlimited) cgroup when there is one, for QEMU's own memory.
        let mut qemu_own = None;
        let mut qemu_kernel = 0u64;
        let mut q_runs = Vec::new();
        if let Some(q) = &qemu {
            let mut own = 0u64;
            for _ in 0..a.repeat {
                interrupted()?;
                if let Some(cg) = &cgroup {
                    cg.set_limit(None)?;
                }
                let mut r = q.run(spec, w, cgroup.as_ref(), None)?;
                check_checksum(&mut r, checksum);
                // QEMU's own memory from the runs that finished (the QEMU + kernel swap cells
                // of a QEMU that never did are bound to fail, and are marked so).
                if let (Some(cg), None) = (&cgroup, &r.failed) {
                    own = own.max(own_memory(cg, &r, footprint)?);
                    qemu_kernel = qemu_kernel.max(kernel_memory(&r));
                }
                progress(&format!("{spec} QEMU all-local"), &r);
                q_runs.push(r);
            }
            qemu_own = Some(own);
        }
        for &local in &locals {
            let budget = ((footprint as f64 * local / 100.0).ceil() as u64).max(1) * 4096;
            cells.push(Cell {
                workload: spec.clone(),
                local_pct: local,
                footprint_pages: footprint,
                budget_bytes: budget,
                cgroup_limit_bytes: budget + vmm_own,
                cgroup_floor_bytes: budget + vmm_kernel,
                qemu_cgroup_floor_bytes: qemu_own.map(|_| match a.qemu_limit.as_str() {
                    "farvm" => budget + vmm_kernel,
                    _ => budget + qemu_kernel,
                }),
                qemu_cgroup_limit_bytes: qemu_own.map(|o| match a.qemu_limit.as_str() {
                    "farvm" => budget + vmm_own,
                    _ => budget + o,
                }),
                all_local_ms,
                checksum,
                setups: Vec::new(),
            });
            qemu_local.push(q_runs.clone());
        }
    }

    // farvm setups, all cells, taking turns within a cell.
    let mut setups: Vec<Setup> = prefetchers.iter().cloned().map(Setup::Farvm).collect();
    let farvm_setups = setups.len();
    if qemu.is_some() {
        setups.push(Setup::Qemu(None));
    }
    for &k in &swaps {
        setups.push(Setup::Swap(k));
        if qemu.is_some() {
            setups.push(Setup::Qemu(Some(k)));
        }
    }
    let mut results: Vec<Vec<Vec<RunResult>>> = cells
        .iter()
        .map(|_| setups.iter().map(|_| Vec::new()).collect())
        .collect();
    let run_cell = |ci: usize, si: usize, cg: Option<&MemCgroup>| -> Result<RunResult> {
        let c = &cells[ci];
        let wi = specs.iter().position(|s| *s == c.workload).unwrap_or(0);
        let extra: Vec<String> = match &setups[si] {
            Setup::Farvm(pf) => vec![
                "--local-memory".into(),
                format!("{}K", c.budget_bytes / 1024),
                "--prefetcher".into(),
                pf.clone(),
            ],
            Setup::Swap(_) | Setup::Qemu(_) => vec!["--local-only".into()],
        };
        let budget_pages = c.budget_bytes / 4096;
        let r = match (&setups[si], &qemu) {
            (Setup::Qemu(_), Some(q)) => {
                if let Some(cg) = cg {
                    cg.set_limit(c.qemu_cgroup_limit_bytes)?;
                }
                let steer = c.qemu_cgroup_limit_bytes.map(|start_bytes| Steer {
                    budget_pages,
                    start_bytes,
                    floor_bytes: c.qemu_cgroup_floor_bytes.unwrap_or(start_bytes),
                });
                q.run(&c.workload, &placed[wi], cg, steer.filter(|_| cg.is_some()))?
            }
            _ => {
                if let Some(cg) = cg {
                    cg.set_limit(Some(c.cgroup_limit_bytes))?;
                }
                let steer = cg.map(|_| Steer {
                    budget_pages,
                    start_bytes: c.cgroup_limit_bytes,
                    floor_bytes: c.cgroup_floor_bytes,
                });
                runner.run(&c.workload, &placed[wi], &extra, cg, steer)?.0
            }
        };
        let mut r = r;
        check_checksum(&mut r, c.checksum);
        progress(
            &format!("{} {}% {}", c.workload, c.local_pct, setups[si].label()),
            &r,
        );
        Ok(r)
    };
    for (ci, cell_runs) in results.iter_mut().enumerate() {
        for round in 0..a.repeat as usize {
            for k in 0..farvm_setups {
                interrupted()?;
                let si = (round + k) % farvm_setups;
                cell_runs[si].push(run_cell(ci, si, None)?);
            }
        }
    }
    if let Some(si) = setups.iter().position(|s| *s == Setup::Qemu(None)) {
        for (ci, cell_runs) in results.iter_mut().enumerate() {
            cell_runs[si] = qemu_local[ci].clone();
        }
    }
    // Kernel swap: one device at a time, every cell; farvm (local only) and QEMU take turns.
    for &kind in &swaps {
        let si = setups
            .iter()
            .position(|s| *s == Setup::Swap(kind))
            .unwrap_or(farvm_setups);
        let qi = setups.iter().position(|s| *s == Setup::Qemu(Some(kind)));
        let largest = cells
            .iter()
            .map(|c| c.footprint_pages * 4096)
            .max()
            .unwrap_or(0);
        let _dev = SwapDevice::start(kind, 2 * largest, &tag)?;
        for (ci, cell_runs) in results.iter_mut().enumerate() {
            for _ in 0..a.repeat {
                interrupted()?;
                cell_runs[si].push(run_cell(ci, si, cgroup.as_ref())?);
                if let Some(qi) = qi {
                    interrupted()?;
                    cell_runs[qi].push(run_cell(ci, qi, cgroup.as_ref())?);
                }
            }
        }
    }

    for (ci, c) in cells.iter_mut().enumerate() {
        for (si, runs) in results[ci].iter().enumerate() {
            c.setups
                .push(setup_result(setups[si].label(), runs, c.all_local_ms));
        }
    }
    drop(cgroup);
    drop(qemu);
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cell_timeout_secs: a.cell_timeout,
        page_cluster: std::fs::read_to_string("/proc/sys/vm/page-cluster")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into()),
        load_average: std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
        wall_secs: t0.elapsed().as_secs_f64(),
        cells,
    };
    report::write(&report, &a.out)?;
    // Every cell is in the report; the exit status still says that not every run succeeded.
    let failed: Vec<String> = report
        .cells
        .iter()
        .flat_map(|c| {
            c.setups.iter().filter_map(move |x| {
                let f = x.failed.as_ref()?;
                Some(format!("{} {}% {}: {f}", c.workload, c.local_pct, x.setup))
            })
        })
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} cell(s) failed (marked in {}):\n  {}",
            failed.len(),
            a.out.join("compare.md").display(),
            failed.join("\n  ")
        );
    }
    Ok(())
}

/// Marks `r` failed when it finished with another checksum than all-local's `want`: its time
/// measured a different computation.
fn check_checksum(r: &mut RunResult, want: u64) {
    if let Some(got) = r.checksum.filter(|&got| got != want) {
        r.failed.get_or_insert(Failure::Checksum { got, want });
    }
}

/// One line of progress per run: its time, or why it failed.
fn progress(what: &str, r: &RunResult) {
    match &r.failed {
        Some(f) => eprintln!("{what}: failed: {f}"),
        None => eprintln!("{what}: {:.1} ms", r.measured_ms),
    }
}

/// A setup's cell from its runs. A cell any of whose runs failed is failed: it has no median
/// (NaN) and takes no part in the ratios, and its guest statistics are the first failed run's
/// (how far the kernel swapped before it failed); otherwise the median run's.
fn setup_result(setup: String, runs: &[RunResult], all_local_ms: f64) -> SetupResult {
    let failures: Vec<&Failure> = runs.iter().filter_map(|r| r.failed.as_ref()).collect();
    let failed = FailedCell::of(&failures, runs.len());
    let runs_ms: Vec<f64> = runs
        .iter()
        .filter(|r| r.failed.is_none())
        .map(|r| r.measured_ms)
        .collect();
    let med = match failed {
        Some(_) => f64::NAN,
        None => median(runs_ms.clone()),
    };
    let mid = match failed {
        Some(_) => runs.iter().find(|r| r.failed.is_some()),
        None => runs.iter().find(|r| r.measured_ms == med),
    };
    SetupResult {
        setup,
        median_ms: med,
        runs_ms,
        vs_all_local: med / all_local_ms,
        faults: mid.map_or(0, |r| r.faults),
        prefetches: mid.map_or(0, |r| r.prefetches),
        guest: mid.and_then(|r| r.guest.clone()),
        failed,
    }
}

#[cfg(test)]
mod tests {
    use super::failure::Failure;
    use super::{check_checksum, median, setup_result, RunResult};

    fn run(ms: f64, checksum: u64) -> RunResult {
        RunResult {
            measured_ms: ms,
            checksum: Some(checksum),
            failed: None,
            faults: 0,
            prefetches: 0,
            guest: None,
        }
    }

    #[test]
    fn a_run_with_another_checksum_than_all_locals_is_failed() {
        let mut same = run(5.0, 1);
        check_checksum(&mut same, 1);
        assert_eq!(same.failed, None);
        let mut other = run(5.0, 2);
        check_checksum(&mut other, 1);
        assert_eq!(other.failed, Some(Failure::Checksum { got: 2, want: 1 }));
        // A run that failed otherwise keeps its first reason.
        let mut late = run(5.0, 2);
        late.failed = Some(Failure::Timeout { secs: 9 });
        check_checksum(&mut late, 1);
        assert_eq!(late.failed, Some(Failure::Timeout { secs: 9 }));
    }

    #[test]
    fn a_cell_is_failed_by_any_failed_run_and_otherwise_has_the_median() {
        let ok = setup_result(
            "farvm none".into(),
            &[run(3.0, 1), run(1.0, 1), run(2.0, 1)],
            10.0,
        );
        assert_eq!(ok.failed, None);
        assert_eq!(ok.median_ms, 2.0);
        assert_eq!(ok.vs_all_local, 0.2);
        let mut bad = run(1.0, 2);
        check_checksum(&mut bad, 1);
        let failed = setup_result("farvm none".into(), &[run(3.0, 1), bad, run(2.0, 1)], 10.0);
        let cell = failed.failed.expect("a failed cell");
        assert_eq!((cell.kind, cell.failed_runs, cell.runs), ("checksum", 1, 3));
        assert!(failed.median_ms.is_nan() && failed.vs_all_local.is_nan());
        assert_eq!(failed.runs_ms, vec![3.0, 2.0]);
    }

    #[test]
    fn median_counts_a_timeout_as_the_slowest_run() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![f64::NAN, 1.0, 2.0]), 2.0);
        assert!(median(vec![f64::NAN, 1.0]).is_nan());
        assert!(median(Vec::new()).is_nan());
    }
}
