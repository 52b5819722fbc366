//! The test guest under QEMU (`-accel kvm`, `-machine microvm`): booted through its PVH entry
//! with the BootInfo as `-initrd`, results read from the serial console, powered off through
//! `isa-debug-exit`. Every workload gives its native checksum, as under farvm.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use farvm_guest_agent::boot::{exit, flags, workload};
use farvm_tests::{kvm_available, native, vm_timeout};
use farvm_vmm::boot::pvh::{self, ConsoleOutcome};
use farvm_vmm::boot::testguest::TestPlan;
use farvm_vmm::workload_spec::place;

/// `FARVM_QEMU`, or `qemu-system-x86_64` on PATH; a clear failure when there is none.
fn qemu() -> PathBuf {
    if let Some(p) = std::env::var_os("FARVM_QEMU") {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("qemu-system-x86_64"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "this test needs qemu-system-x86_64 (Debian: qemu-system-x86, installed by \
                 scripts/setup.sh) or FARVM_QEMU=PATH; set FARVM_SKIP_KVM=1 to skip it"
            )
        })
}

/// A scratch directory for the kernel file and the module, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("farvm-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("scratch directory");
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs QEMU with `args`, SIGKILLed by coreutils' `timeout` if it outlives `limit`.
fn run_qemu(args: &[std::ffi::OsString], limit: Duration) -> Output {
    Command::new("timeout")
        .args(["-s", "KILL", &limit.as_secs().to_string()])
        .arg(qemu())
        .args(args)
        .output()
        .expect("running timeout(1) with qemu-system-x86_64")
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("writing a scratch file");
    p
}

#[test]
fn workloads_under_qemu_match_native() {
    if !kvm_available() {
        return;
    }
    // Every data workload of the test guest (ids 1..=8; 100 and up are kernel tests).
    let specs: Vec<String> = (workload::SEQ_SCAN..=workload::QUICKSORT)
        .map(|id| {
            let info = farvm_workloads::find_by_id(id).expect("a workload per id");
            format!("{}:ws=16M,seed={}", info.name, 30 + id)
        })
        .collect();
    let placed = place(&specs, 1).expect("specs");
    // Cooperative scheduling, as in guest_checksums.rs: processes run one after the other.
    let plan = TestPlan {
        procs: placed.iter().map(|p| p.process_spec()).collect(),
        timer_hz: 0,
        flags: flags::RAM_IS_ZERO,
        frame_shuffle_seed: 1,
        frame_run_shift: 9,
        blob: Vec::new(),
    };
    let mem = 256 << 20;
    let kernel = farvm_vmm::builtin::test_guest_elf();
    let tsc_khz = pvh::host_tsc_khz().expect("KVM_GET_TSC_KHZ");
    let module = pvh::boot_module(kernel, mem, tsc_khz, &plan).expect("boot module");
    let dir = Scratch::new("qemu-guest");
    let k = write(&dir.0, "testguest.elf", kernel);
    let m = write(&dir.0, "bootinfo.bin", &module);
    let out = run_qemu(
        &pvh::qemu_args(&k, &m, mem),
        vm_timeout(Duration::from_secs(300)),
    );
    let console = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code().and_then(pvh::exit_status),
        Some(exit::OK),
        "QEMU ended with {} (isa-debug-exit status expected 0):\n{console}\n{stderr}",
        out.status
    );
    let procs = pvh::parse_console(&console);
    assert_eq!(procs.len(), placed.len(), "{console}");
    for (w, p) in placed.iter().zip(&procs) {
        assert_eq!(
            (p.workload, p.ws_bytes, p.seed),
            (w.spec.workload.id, w.spec.ws_bytes, w.spec.seed)
        );
        let ConsoleOutcome::Done {
            ops,
            checksum,
            elapsed_ns,
        } = p.outcome
        else {
            panic!("{}: {:?}\n{console}", w.name(), p.outcome);
        };
        let nat = native(w);
        assert_eq!(
            checksum,
            nat.checksum,
            "{}: checksum under QEMU {checksum:#x} != native {:#x}",
            w.name(),
            nat.checksum
        );
        assert_eq!(ops, nat.ops, "{}: ops differ", w.name());
        assert!(elapsed_ns > 0, "{}: no measured time", w.name());
    }
}

#[test]
fn qemu_boot_without_boot_info_is_refused_on_the_console() {
    if !kvm_available() {
        return;
    }
    let dir = Scratch::new("qemu-noinfo");
    let k = write(
        &dir.0,
        "testguest.elf",
        farvm_vmm::builtin::test_guest_elf(),
    );
    let m = write(&dir.0, "empty.bin", &[0u8; 4096]);
    let out = run_qemu(
        &pvh::qemu_args(&k, &m, 64 << 20),
        vm_timeout(Duration::from_secs(120)),
    );
    let console = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code().and_then(pvh::exit_status),
        Some(exit::BAD_BOOT_INFO),
        "{}: {console}",
        out.status
    );
    assert!(console.contains("bad BootInfo: magic"), "{console}");
}
