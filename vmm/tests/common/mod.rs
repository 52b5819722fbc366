//! Helpers for the VMM's own tests: the /dev/kvm gate and tiny hand-assembled guests.
#![allow(dead_code)]

use std::sync::Arc;

use farvm_guest_agent::boot::{KERNEL_PHYS_BASE, KERNEL_WINDOW_BASE};
use farvm_vmm::boot::elf::build_test_elf;
use farvm_vmm::boot::testguest::TestPlan;
use farvm_vmm::builder::{BootConfig, VmConfig};

/// True if KVM tests should run; false only when FARVM_SKIP_KVM=1. Panics with a clear message
/// when /dev/kvm is unusable otherwise.
pub fn kvm_available() -> bool {
    if std::env::var("FARVM_SKIP_KVM").as_deref() == Ok("1") {
        eprintln!("FARVM_SKIP_KVM=1: skipping a test that needs /dev/kvm");
        return false;
    }
    if let Err(e) = farvm_vmm::vstate::vm::check_available() {
        panic!("this test needs a usable /dev/kvm ({e}); set FARVM_SKIP_KVM=1 to skip it");
    }
    // In-process VMs get their threads' seccomp filters as `farvm run`'s do (FARVM_SECCOMP,
    // default on). The process filter goes on a helper thread that ends at once: the test's
    // threads, and what they run (`ip netns`, etcd), stay unfiltered.
    farvm_sandbox::start_for_tests("farvm-tests");
    true
}

/// Virtual address of the first code byte of a test kernel.
pub const ENTRY: u64 = KERNEL_WINDOW_BASE + KERNEL_PHYS_BASE;
/// Offset of the data area inside the test kernel image.
pub const DATA_OFF: usize = 0x400;

/// A tiny x86-64 assembler for the few instructions the tests need.
#[derive(Default)]
pub struct Asm {
    pub code: Vec<u8>,
}

impl Asm {
    pub fn mov_dx(&mut self, port: u16) -> &mut Self {
        self.code.extend_from_slice(&[0x66, 0xba]);
        self.code.extend_from_slice(&port.to_le_bytes());
        self
    }
    pub fn mov_eax(&mut self, v: u32) -> &mut Self {
        self.code.push(0xb8);
        self.code.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn mov_al(&mut self, v: u8) -> &mut Self {
        self.code.extend_from_slice(&[0xb0, v]);
        self
    }
    /// out dx, eax
    pub fn out32(&mut self) -> &mut Self {
        self.code.push(0xef);
        self
    }
    /// out dx, al
    pub fn out8(&mut self) -> &mut Self {
        self.code.push(0xee);
        self
    }
    /// mov eax, esi; add eax, imm8
    pub fn eax_from_esi_plus(&mut self, k: u8) -> &mut Self {
        self.code.extend_from_slice(&[0x89, 0xf0, 0x83, 0xc0, k]);
        self
    }
    /// pause; jmp back to pause (spin forever)
    pub fn spin(&mut self) -> &mut Self {
        self.code.extend_from_slice(&[0xf3, 0x90, 0xeb, 0xfc]);
        self
    }
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.code.extend_from_slice(b);
        self
    }
    /// Writes `value` to PV/serial `port` (32-bit).
    pub fn out_port(&mut self, port: u16, value: u32) -> &mut Self {
        self.mov_dx(port).mov_eax(value).out32()
    }
}

/// An ELF whose segment holds `code` at offset 0 and `data` at [`DATA_OFF`].
pub fn kernel_with(code: &[u8], data: &[u8]) -> Vec<u8> {
    assert!(code.len() <= DATA_OFF);
    let mut img = code.to_vec();
    img.resize(DATA_OFF, 0x90);
    img.extend_from_slice(data);
    build_test_elf(&img, ENTRY, KERNEL_PHYS_BASE)
}

/// GPA of byte `off` of the data area.
pub fn data_gpa(off: usize) -> u32 {
    (KERNEL_PHYS_BASE + (DATA_OFF + off) as u64) as u32
}

/// A VM config booting `kernel` as a test guest.
pub fn config(name: &str, kernel: Vec<u8>, vcpus: u32) -> VmConfig {
    let boot = BootConfig::TestGuest {
        kernel: Arc::from(kernel),
        plan: TestPlan::default(),
    };
    VmConfig::new(name, 64 << 20, vcpus, boot)
}

/// Raw bytes of a repr(C) value.
pub fn bytes_of<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: reading the bytes of a Copy repr(C) value of known size.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
        .to_vec()
}

/// The `farvm-memserver` processes whose parent is `pid` (farvm's embedded memory server).
pub fn memserver_children(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|d| d.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| {
                s.contains("(farvm-memserver)")
                    && s.rsplit(')')
                        .next()
                        .and_then(|r| r.split_whitespace().nth(1))
                        == Some(&pid.to_string())
            })
        })
        .collect()
}

/// Whether process `pid` exists and has not exited (a zombie waiting to be reaped has).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| !r.trim_start().starts_with('Z'))
    })
}

/// The checksum of `workload` (a `--workload` spec) run natively: what a guest run must
/// reproduce.
pub fn native_checksum(workload: &str) -> u64 {
    let placed = farvm_vmm::workload_spec::place(&[workload.to_string()], 1).unwrap();
    let w = &placed[0];
    farvm_workloads::run_native(w.spec.workload.id, &w.spec.params())
        .unwrap()
        .checksum
}

/// Asserts that the first process of a `farvm run --json` report finished and reproduced the
/// native checksum of `workload`.
pub fn assert_native_report(report: &serde_json::Value, workload: &str) {
    let p = &report["processes"][0];
    // What says where a wrong result came from, first (CI prints the start of a message).
    let c = &report["paging"]["engine"]["counters"];
    // A failed workload says why in its report (a verifying scan, seq verify=1: the first
    // word it found wrong, from `farvm run`'s own account).
    let failed = match p["state_name"].as_str() {
        Some("killed") => format!(
            "the guest's workload was killed by exception vector {} error {} cr2 {} rip {}; ",
            p["fault_vector"], p["fault_error"], p["fault_cr2"], p["fault_rip"]
        ),
        _ => p["error_text"]
            .as_str()
            .map(|t| format!("the guest's workload failed: {t}; "))
            .unwrap_or_default(),
    };
    // The first line short (CI keeps the start of a long message), the rest after it.
    let why = format!(
        "{failed}remote_stale {} remote_absent {} lost_accesses {} store_errors {} \
         evict_write_failed {} evict_vanished {}\nremote {}\nprocess {p}",
        c["remote_stale"],
        c["remote_absent"],
        c["lost_accesses"],
        c["store_errors"],
        c["evict_write_failed"],
        c["evict_vanished"],
        report["paging"]["remote"]
    );
    assert_eq!(p["state_name"], "done", "{why}");
    assert_eq!(
        p["checksum"].as_u64(),
        Some(native_checksum(workload)),
        "{why}"
    );
}

/// A bzImage of `setup_sects` setup sectors whose header says `syssize` 16-byte units of
/// protected-mode kernel follow (zeros: enough for the loader's checks, never run).
pub fn bzimage(setup_sects: u8, syssize: u32, len: usize) -> Vec<u8> {
    let mut k = vec![0u8; len];
    k[0x1f1] = setup_sects;
    k[0x1f4..0x1f8].copy_from_slice(&syssize.to_le_bytes());
    k[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    k[0x202..0x206].copy_from_slice(b"HdrS");
    k[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    k[0x211] = 0x01; // loadflags: LOADED_HIGH
    k[0x214..0x218].copy_from_slice(&0x0010_0000u32.to_le_bytes()); // code32_start
    k[0x236..0x238].copy_from_slice(&0x0001u16.to_le_bytes()); // xloadflags: XLF_KERNEL_64
    k
}

/// Waits (bounded) until the VM behind the control socket `sock` runs its first process's
/// measured phase; panics if `vm` exits first.
pub fn wait_for_measured_phase(sock: &std::path::Path, vm: &mut std::process::Child) {
    use farvm_guest_agent::pv::{phase, state};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    loop {
        if let Some(status) = vm.try_wait().unwrap() {
            panic!("the VM exited ({status}) before its workload's measured phase");
        }
        if let Ok(v) = farvm_vmm::control::request(sock, "stats") {
            let p = &v["processes"][0];
            if p["state"] == state::RUNNING && p["phase"] == phase::MEASURE {
                return;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the workload did not reach its measured phase"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// This build's `farvm`.
pub fn farvm() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_farvm"))
}

/// Runs `cmd`, which must exit with status `code` (a refusal); returns what it wrote on its
/// standard error (the reason).
pub fn refusal(cmd: &mut std::process::Command, code: i32) -> String {
    let o = cmd.output().expect("run farvm");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "{err}");
    err
}
