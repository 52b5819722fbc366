//! One VM run of a remote-memory benchmark cell: the test-guest VM a workload runs in, its
//! all-local baseline run (no paging engine) and its run with remote memory (paging engine +
//! an embedded memserver on loopback, a fresh one per run), and the times of a finished run.
//! The A/B benches (`bench/ab.rs`) run their cells through this too.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use farvm_guest_agent::boot::flags;
use farvm_guest_agent::pv::state;
use farvm_vmm::boot::testguest::TestPlan;
use farvm_vmm::builder::{build, VmConfig};
use farvm_vmm::devices::pvctl::ProcessRecord;
use farvm_vmm::remote::{Budget, PageSpace, RemoteSpec, RemoteStats};
use farvm_vmm::vm::{VmOutcome, VmReport};
use farvm_vmm::workload_spec::PlacedWorkload;

use super::cpu::CpuSampler;
pub(crate) use super::cpu::RunCpu;

fn ws_of(w: &PlacedWorkload) -> u64 {
    w.spec.ws_bytes
}

/// Guest RAM for one workload: heap + page tables + 40 MiB for the kernel and boot data,
/// rounded up to 16 MiB. (With the default 32 MiB working sets, 50% local then still holds
/// the whole working set: pass larger `--workload ...:ws=` to make that column page.)
pub(crate) fn guest_mem(w: &PlacedWorkload) -> u64 {
    let ws = ws_of(w);
    (ws + ws / 256 + (40 << 20) + (16 << 20) - 1) & !((16 << 20) - 1)
}

fn config(w: &PlacedWorkload, name: &str, run_shift: u32, blob: &[u8]) -> VmConfig {
    let mem = guest_mem(w) + (blob.len() as u64).next_multiple_of(16 << 20);
    let plan = TestPlan {
        procs: vec![w.process_spec()],
        timer_hz: 100,
        flags: flags::RAM_IS_ZERO,
        frame_shuffle_seed: 1,
        frame_run_shift: run_shift,
        blob: blob.to_vec(),
    };
    let mut cfg = VmConfig::test_guest(name, mem, 1, plan);
    // As `farvm run` with remote memory, for the all-local baseline too (same KVM setup).
    cfg.kvm_async_pf = false;
    cfg
}

/// (measured ms, whole-process ms by the host clock).
pub(crate) fn times(r: &ProcessRecord) -> (f64, f64) {
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

/// The all-local run of `w` (`blob`: its boot blob, for a replayed trace).
pub(super) fn run_local(w: &PlacedWorkload, blob: &[u8]) -> Result<ProcessRecord> {
    let vm = build(&config(
        w,
        &format!("bench-local-{}", std::process::id()),
        9,
        blob,
    ))
    .context("building the all-local VM")?;
    let running = vm.start()?;
    let outcome = running.wait(Some(Duration::from_secs(1800)), true);
    finished(&running.finish(outcome), &format!("all-local {}", w.name()))
}

/// The local budget for `local` percent of a footprint of `footprint` pages.
pub(crate) fn budget_for(local: f64, footprint: u64) -> Budget {
    if local >= 100.0 {
        Budget::Unlimited
    } else {
        Budget::Bytes(((footprint as f64 * local / 100.0).ceil() as u64).max(1) * 4096)
    }
}

/// How a remote-memory VM of a cell is set up beyond its budget and prefetcher.
#[derive(Clone, Copy)]
pub(crate) struct CellSetup {
    /// `--fault-path-cpu`.
    pub fault_path_cpu: Option<usize>,
    /// `--page-space`.
    pub page_space: PageSpace,
    /// The test guest hands out frames in runs of 2^shift (`--frame-run-shift`).
    pub frame_run_shift: u32,
    /// `--stage2-prefault on|off`.
    pub stage2_prefault: bool,
    /// `--page-encryption on|off`: pages sealed before they leave the VMM.
    pub page_encryption: bool,
    /// The workload's boot blob (a replayed trace, `replay:trace=`); empty otherwise. Static:
    /// a bench reads each trace once for the whole run.
    pub blob: &'static [u8],
}

impl Default for CellSetup {
    /// As `farvm run` with remote memory.
    fn default() -> Self {
        Self {
            fault_path_cpu: None,
            page_space: PageSpace::Virtual,
            frame_run_shift: 9,
            stage2_prefault: true,
            page_encryption: true,
            blob: &[],
        }
    }
}

/// Runs one remote-memory VM; `None` for the process if it hit `timeout`. Also returns the
/// CPU time the run took, by thread.
pub(crate) fn run_remote(
    w: &PlacedWorkload,
    budget: Budget,
    pf: &str,
    timeout: Duration,
    setup: CellSetup,
) -> Result<(Option<ProcessRecord>, RemoteStats, RunCpu)> {
    let sampler = CpuSampler::start();
    let (report, stats) = run_remote_vm(w, budget, pf, timeout, setup)?;
    let series = sampler.finish();
    let rec = finished_in_time(&report, &vm_name(w, pf))?;
    let cpu = RunCpu::of(&series, rec.as_ref());
    Ok((rec, stats, cpu))
}

fn vm_name(w: &PlacedWorkload, pf: &str) -> String {
    format!("bench-{}-{}-{pf}", std::process::id(), w.name())
}

/// [`run_remote`]'s VM run, returning the VM's whole report (KVM's per-vCPU statistics too)
/// whatever its outcome.
pub(crate) fn run_remote_vm(
    w: &PlacedWorkload,
    budget: Budget,
    pf: &str,
    timeout: Duration,
    setup: CellSetup,
) -> Result<(VmReport, RemoteStats)> {
    let name = vm_name(w, pf);
    let mut cfg = config(w, &name, setup.frame_run_shift, setup.blob);
    let mut spec = RemoteSpec::new(&name);
    spec.budget = budget;
    spec.prefetcher = pf.to_string();
    spec.fault_path_cpu = setup.fault_path_cpu;
    spec.page_space = setup.page_space;
    spec.stage2_prefault = setup.stage2_prefault;
    spec.page_encryption = setup.page_encryption;
    cfg.remote = Some(spec);
    let vm = build(&cfg).context("building the VM on remote memory")?;
    let running = vm.start()?;
    let outcome = running.wait(Some(timeout), true);
    let report = running.finish(outcome);
    let stats = report
        .paging
        .clone()
        .context("no paging stats from a VM on remote memory")?;
    let errors = &report.paging_errors;
    if !errors.is_empty() {
        bail!("paging engine errors in {name}: {errors:?}");
    }
    Ok((report, stats))
}

/// The finished process of a remote-memory run (`what` names it in errors), or `None` if the
/// VM hit its timeout; any other outcome is an error.
pub(crate) fn finished_in_time(report: &VmReport, what: &str) -> Result<Option<ProcessRecord>> {
    if let VmOutcome::Timeout { .. } = report.outcome {
        return Ok(None);
    }
    finished(report, what).map(Some)
}
