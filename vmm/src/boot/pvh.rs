//! The test guest on VMMs other than farvm: QEMU boots its kernel ELF through the PVH entry
//! (`XEN_ELFNOTE_PHYS32_ENTRY`, images/testguest/kernel/src/pvh.rs) with the [`BootInfo`] as
//! its first module (`-initrd`), and reads the results from the serial console.
//!
//! Such a VM has one vCPU and no farvm paravirtual device: the kernel does its bulk memory work
//! itself (emulated ring 0 on this host: slower boot, same workload code), writes its log lines
//! and one line per ended process on COM1 ([`parse_console`]), and powers off through QEMU's
//! `isa-debug-exit` device ([`exit_status`]).
//!
//! [`BootInfo`]: farvm_guest_agent::boot::BootInfo

use std::ffi::OsString;
use std::path::Path;

use farvm_guest_agent::boot::{MemRange, MAX_PROCS};
use vm_memory::ByteValued;

use super::testguest::{boot_info, TestPlan};
use super::{elf, BootError};

/// RAM the VM gets above the guest's frames: QEMU's firmware puts its tables and the
/// BootInfo module at the top of RAM, which the guest kernel must not hand out as frames.
pub const TOP_RESERVE: u64 = 8 << 20;

/// The BootInfo module for `plan` on a VM whose guest frames are `0..mem_bytes` (the VM gets
/// `mem_bytes + TOP_RESERVE`, see [`qemu_args`]): the same BootInfo farvm writes for one vCPU
/// with `mem_bytes` of RAM.
pub fn boot_module(
    kernel: &[u8],
    mem_bytes: u64,
    tsc_khz: u64,
    plan: &TestPlan,
) -> Result<Vec<u8>, BootError> {
    if plan.procs.len() > MAX_PROCS {
        return Err(BootError::Setup(format!(
            "{} processes requested; the test guest takes at most {MAX_PROCS}",
            plan.procs.len()
        )));
    }
    if let Some(p) = plan.procs.iter().find(|p| p.cpu != 0) {
        return Err(BootError::Setup(format!(
            "a process on vCPU {}: the PVH entry starts one vCPU",
            p.cpu
        )));
    }
    let (_, end) = elf::phys_range(kernel)?;
    let first_free = end.div_ceil(0x1000) * 0x1000;
    if !mem_bytes.is_multiple_of(0x1000) || first_free >= mem_bytes {
        return Err(BootError::DoesNotFit(format!(
            "{mem_bytes} bytes of RAM (page-aligned, above the kernel's end at {first_free:#x})"
        )));
    }
    let ranges = [MemRange {
        gpa: 0,
        len: mem_bytes,
    }];
    let info = boot_info(&ranges, first_free, 1, tsc_khz, plan);
    Ok(info.as_slice().to_vec())
}

/// `qemu-system-x86_64` arguments booting `kernel` with `module` (from [`boot_module`] for
/// `mem_bytes`) under KVM on a `microvm` machine (no BIOS: its qboot firmware enters the PVH
/// entry directly), console on stdout. `-cpu host` without `arch-capabilities`: QEMU 7.2 cannot
/// set that MSR on this host's KVM (PVM) and aborts.
pub fn qemu_args(kernel: &Path, module: &Path, mem_bytes: u64) -> Vec<OsString> {
    let mut a: Vec<OsString> = [
        "-accel",
        "kvm",
        "-cpu",
        "host,-arch-capabilities",
        "-machine",
        "microvm",
        "-smp",
        "1",
        "-m",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    a.push(format!("{}k", (mem_bytes + TOP_RESERVE) >> 10).into());
    for s in [
        "-nodefaults",
        "-no-user-config",
        "-display",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
        "-device",
        "isa-debug-exit,iobase=0xf4,iosize=0x04",
        "-kernel",
    ] {
        a.push(s.into());
    }
    a.push(kernel.into());
    a.push("-initrd".into());
    a.push(module.into());
    a
}

/// The guest's power-off status from QEMU's exit code: `isa-debug-exit` makes QEMU exit with
/// `(status << 1) | 1`; any other code (even: QEMU itself ended or failed) is `None`.
pub fn exit_status(qemu_code: i32) -> Option<u32> {
    (qemu_code & 1 == 1).then_some((qemu_code >> 1) as u32)
}

/// The TSC frequency KVM gives a vCPU on this host (KVM_GET_TSC_KHZ of a scratch VM), for
/// BootInfo's `tsc_khz`.
pub fn host_tsc_khz() -> Result<u64, BootError> {
    let kvm = kvm_ioctls::Kvm::new().map_err(|e| BootError::Setup(format!("/dev/kvm: {e}")))?;
    let vm = kvm
        .create_vm()
        .map_err(|e| BootError::Setup(format!("KVM_CREATE_VM: {e}")))?;
    let vcpu = vm
        .create_vcpu(0)
        .map_err(|e| BootError::Setup(format!("KVM_CREATE_VCPU: {e}")))?;
    let khz = vcpu
        .get_tsc_khz()
        .map_err(|e| BootError::Setup(format!("KVM_GET_TSC_KHZ: {e}")))?;
    Ok(u64::from(khz))
}

/// How a process ended, as its console line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsoleOutcome {
    /// `done ops N checksum 0xH elapsed_ns T`.
    Done {
        /// Operations of the measured phase.
        ops: u64,
        /// The workload's checksum.
        checksum: u64,
        /// The measured phase, guest-timed.
        elapsed_ns: u64,
    },
    /// Anything else (`killed ...`, `failed error E`, `ended in state S`): the rest of the line.
    Other(String),
}

/// One `process ...` line of the test guest's console.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsoleProcess {
    /// Guest pid (1-based, plan order).
    pub pid: u32,
    /// `boot::workload::*` id.
    pub workload: u32,
    /// Working set in bytes.
    pub ws_bytes: u64,
    /// Workload seed.
    pub seed: u64,
    /// How it ended.
    pub outcome: ConsoleOutcome,
}

/// The process lines in the console output `text` (other lines are ignored), in order.
pub fn parse_console(text: &str) -> Vec<ConsoleProcess> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<ConsoleProcess> {
    let rest = line.split("farvm-testguest: process ").nth(1)?;
    let t: Vec<&str> = rest.split_whitespace().collect();
    let num = |i: usize, key: &str| -> Option<u64> {
        (t.get(i.checked_sub(1)?)? == &key).then_some(())?;
        t.get(i)?.parse().ok()
    };
    let pid = t.first()?.parse().ok()?;
    let workload = num(2, "workload")?;
    let ws_bytes = num(6, "ws")?;
    let seed = num(8, "seed")?;
    let outcome = match t.get(9..) {
        Some(["done", "ops", ops, "checksum", ck, "elapsed_ns", ns]) => ConsoleOutcome::Done {
            ops: ops.parse().ok()?,
            checksum: u64::from_str_radix(ck.strip_prefix("0x")?, 16).ok()?,
            elapsed_ns: ns.parse().ok()?,
        },
        Some(other) => ConsoleOutcome::Other(other.join(" ")),
        None => return None,
    };
    Some(ConsoleProcess {
        pid,
        workload: workload as u32,
        ws_bytes,
        seed,
        outcome,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use farvm_guest_agent::boot::{flags, workload, BootInfo, ProcessSpec, BOOT_MAGIC};

    #[test]
    fn console_lines_parse() {
        let text = "farvm-testguest: booted: 1 cpus, 2 processes\n\
            farvm-testguest: process 1 workload 1 cpu 0 ws 8388608 seed 1 done ops 4194304 \
            checksum 0x9cd226ae4e4ad54a elapsed_ns 637920\n\
            farvm-testguest: process 2 workload 101 cpu 0 ws 4096 seed 3 killed vector 14 cr2 \
            0x0 rip 0x401000\n\
            farvm-testguest: all 2 processes ended, 1 failed: powering off with status 1\n";
        let p = parse_console(text);
        assert_eq!(p.len(), 2);
        assert_eq!(
            (p[0].pid, p[0].workload, p[0].ws_bytes, p[0].seed),
            (1, 1, 8 << 20, 1)
        );
        assert_eq!(
            p[0].outcome,
            ConsoleOutcome::Done {
                ops: 4_194_304,
                checksum: 0x9cd2_26ae_4e4a_d54a,
                elapsed_ns: 637_920
            }
        );
        assert_eq!(
            p[1].outcome,
            ConsoleOutcome::Other("killed vector 14 cr2 0x0 rip 0x401000".into())
        );
        assert!(parse_console("farvm-testguest: process x workload").is_empty());
    }

    #[test]
    fn exit_codes_of_isa_debug_exit() {
        assert_eq!(exit_status(1), Some(0));
        assert_eq!(exit_status(3), Some(1));
        assert_eq!(exit_status(0), None);
        assert_eq!(exit_status(134), None);
    }

    #[test]
    fn module_is_farvms_boot_info_for_one_vcpu() {
        let kernel = elf::build_test_elf(&[0xf4; 0x1800], 0xFFFF_FFFF_8010_0000, 0x100000);
        let plan = TestPlan {
            procs: vec![ProcessSpec {
                cpu: 0,
                workload: workload::SEQ_SCAN,
                ws_bytes: 8 << 20,
                seed: 7,
                params: [4, 0, 0, 0],
            }],
            timer_hz: 100,
            flags: flags::RAM_IS_ZERO,
            frame_shuffle_seed: 1,
            frame_run_shift: 9,
            blob: Vec::new(),
        };
        let m = boot_module(&kernel, 64 << 20, 2_445_000, &plan).unwrap();
        let mut info = BootInfo::zeroed();
        info.as_mut_slice().copy_from_slice(&m);
        assert_eq!(info.magic, BOOT_MAGIC);
        assert_eq!((info.ncpus, info.nprocs, info.nram), (1, 1, 1));
        assert_eq!((info.ram[0].gpa, info.ram[0].len), (0, 64 << 20));
        assert_eq!(info.mem_bytes, 64 << 20);
        assert_eq!(info.first_free_gpa, 0x102000);
        assert_eq!(info.procs[0], plan.procs[0]);
        assert_eq!((info.frame_run_shift, info.tsc_khz), (9, 2_445_000));
        let mut two_cpus = plan.clone();
        two_cpus.procs[0].cpu = 1;
        assert!(boot_module(&kernel, 64 << 20, 1, &two_cpus).is_err());
        assert!(boot_module(&kernel, 0x100000, 1, &plan).is_err());
    }
}
