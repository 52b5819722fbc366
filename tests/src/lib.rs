//! Shared helpers for farvm integration tests: the /dev/kvm gate, booting the built-in test
//! guest with a list of `--workload` specs, and native baselines of the same workloads.

use std::time::Duration;

use farvm_guest_agent::boot::flags;
use farvm_vmm::boot::testguest::TestPlan;
use farvm_vmm::builder::{build, VmConfig};
use farvm_vmm::devices::pvctl::ProcessRecord;
use farvm_vmm::vm::{RunningVm, VmReport};
use farvm_vmm::workload_spec::{plan, PlacedWorkload};
use farvm_workloads::Outcome;

/// Sends the engine's and client's `tracing` output (warnings by default; `FARVM_LOG` as for
/// `farvm`) to the test's captured output, so a failing test shows why — e.g. a memserver
/// taken out of service — next to its assertion. Idempotent.
pub fn init_logging() {
    let filter = std::env::var("FARVM_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_test_writer()
        .try_init();
}

/// Confines the VMs' threads as `farvm run` does (`FARVM_SECCOMP`, default on): every thread
/// class's seccomp filter on the threads the VMs, engines, clients and in-process servers of
/// this test process start from now on. The process filter goes on a helper thread that ends
/// at once: the harness's threads, and what they run (`ip netns exec`, etcd), stay
/// unfiltered. Idempotent.
pub fn start_sandbox() {
    farvm_sandbox::start_for_tests("farvm-tests");
}

/// True if KVM tests should run; false only when `FARVM_SKIP_KVM=1`. Panics with a clear
/// message when /dev/kvm is unusable otherwise.
pub fn kvm_available() -> bool {
    init_logging();
    start_sandbox();
    if std::env::var("FARVM_SKIP_KVM").as_deref() == Ok("1") {
        eprintln!("FARVM_SKIP_KVM=1: skipping a test that needs /dev/kvm");
        return false;
    }
    if let Err(e) = farvm_vmm::vstate::vm::check_available() {
        panic!("this test needs a usable /dev/kvm ({e}); set FARVM_SKIP_KVM=1 to skip it");
    }
    true
}

/// How long a test VM may run: `default`, or `FARVM_TEST_VM_TIMEOUT_SECS` where the host is
/// known to be slow (the KVM lab emulates every instruction). Only the bound changes: a VM that
/// hits it still fails its test.
pub fn vm_timeout(default: Duration) -> Duration {
    std::env::var("FARVM_TEST_VM_TIMEOUT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(default, Duration::from_secs)
}

/// How to boot the test guest.
#[derive(Clone, Debug)]
pub struct GuestSetup {
    /// VM name (also its control socket's).
    pub name: String,
    /// Guest RAM in bytes.
    pub mem_bytes: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// Workload specs, one ring-3 process each (as `farvm run --workload`).
    pub workloads: Vec<String>,
    /// Guest timer interrupt rate.
    pub timer_hz: u32,
    /// Boot flags (`farvm_guest_agent::boot::flags`).
    pub flags: u64,
    /// Seed of the guest's free-frame shuffle.
    pub frame_shuffle_seed: u64,
    /// Frames handed out in runs of 2^shift (0 = every frame shuffled).
    pub frame_run_shift: u32,
    /// How long the VM may run before the test fails.
    pub timeout: Duration,
}

impl GuestSetup {
    /// `workloads` in `mem_bytes` of RAM on `vcpus` vCPUs, 100 Hz timer, frames shuffled one by one, the default time bound.
    pub fn new(name: &str, mem_bytes: u64, vcpus: u32, workloads: &[&str]) -> Self {
        GuestSetup {
            name: name.into(),
            mem_bytes,
            vcpus,
            workloads: workloads.iter().map(|s| s.to_string()).collect(),
            timer_hz: 100,
            flags: flags::RAM_IS_ZERO,
            frame_shuffle_seed: 1,
            frame_run_shift: 0,
            timeout: vm_timeout(Duration::from_secs(300)),
        }
    }

    /// The placed workloads (as `farvm run` would place them).
    pub fn placed(&self) -> Vec<PlacedWorkload> {
        self.placement().0
    }

    /// The placed workloads and the boot blob (a `replay:trace=` spec's trace, else empty).
    pub fn placement(&self) -> (Vec<PlacedWorkload>, Vec<u8>) {
        let p = plan(&self.workloads, self.vcpus).expect("valid workload specs");
        (p.workloads, p.blob)
    }

    /// The VM configuration for this setup (local RAM; set `remote` for remote memory).
    pub fn config(&self) -> VmConfig {
        let (placed, blob) = self.placement();
        let plan = TestPlan {
            procs: placed.iter().map(|p| p.process_spec()).collect(),
            timer_hz: self.timer_hz,
            flags: self.flags,
            frame_shuffle_seed: self.frame_shuffle_seed,
            frame_run_shift: self.frame_run_shift,
            blob,
        };
        let mut cfg = VmConfig::test_guest(&self.name, self.mem_bytes, self.vcpus, plan);
        cfg.echo_guest_logs = std::env::var_os("FARVM_TEST_GUEST_LOG").is_some();
        // As `farvm run` with remote memory: faults on the vCPU threads.
        cfg.kvm_async_pf = false;
        cfg
    }

    /// Builds and starts the VM of `cfg` (this setup's [`GuestSetup::config`], possibly
    /// changed).
    pub fn start_with(&self, cfg: &VmConfig) -> RunningVm {
        let vm = build(cfg).expect("build the test-guest VM");
        vm.start().expect("start the test-guest VM")
    }

    /// Builds and starts the VM.
    pub fn start(&self) -> RunningVm {
        self.start_with(&self.config())
    }

    /// Boots, waits for the guest to stop (or the timeout), returns the report.
    pub fn run(&self) -> VmReport {
        let running = self.start();
        let outcome = running.wait(Some(self.timeout), false);
        running.finish(outcome)
    }
}

/// Runs a placed workload natively with the same parameters.
pub fn native(w: &PlacedWorkload) -> Outcome {
    native_blob(w, &[])
}

/// Runs a placed workload natively with the same parameters and boot blob (the native twin of
/// a `replay` process).
pub fn native_blob(w: &PlacedWorkload, blob: &[u8]) -> Outcome {
    farvm_workloads::run_native_blob(w.spec.workload.id, &w.spec.params(), blob)
        .unwrap_or_else(|e| panic!("native {}: {e}", w.name()))
}

/// Runs `w` natively, prints one guest-vs-native line for it and returns the native outcome;
/// the caller asserts on the checksums (each test says what a mismatch means for it).
pub fn compare_with_native(w: &PlacedWorkload, rec: &ProcessRecord) -> Outcome {
    compare_with_native_blob(w, &[], rec)
}

/// [`compare_with_native`] with the VM's boot blob.
pub fn compare_with_native_blob(w: &PlacedWorkload, blob: &[u8], rec: &ProcessRecord) -> Outcome {
    let nat = native_blob(w, blob);
    eprintln!(
        "{:<15} ws {:>10} guest {:>10.3} ms native {:>10.3} ms  checksum {:#018x} {}",
        w.name(),
        w.spec.ws_bytes,
        rec.elapsed_ns as f64 / 1e6,
        nat.elapsed_ns as f64 / 1e6,
        rec.checksum,
        if rec.checksum == nat.checksum {
            "=="
        } else {
            "!= native"
        }
    );
    nat
}

/// The process record of the i-th placed workload (matched by the spec the kernel copied into
/// the mailbox: workload, ws, seed, cpu; the first unused match).
pub fn record_for<'a>(
    report: &'a VmReport,
    placed: &[PlacedWorkload],
    i: usize,
) -> Option<&'a ProcessRecord> {
    // Pids are assigned in plan order by the test guest (pid = index + 1).
    let want = placed[i].process_spec();
    let by_pid = report.processes.iter().find(|p| p.pid as usize == i + 1);
    match by_pid {
        Some(p) if p.workload == want.workload && p.cpu == want.cpu => Some(p),
        _ => report
            .processes
            .iter()
            .find(|p| p.workload == want.workload && p.cpu == want.cpu),
    }
}
