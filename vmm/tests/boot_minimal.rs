//! Boots hand-assembled 64-bit guests through the real VMM path (ELF load, page tables, GDT,
//! BootInfo, vCPU threads, exits) and checks PV ports, the serial console, error reporting and
//! the stop path.

mod common;

use std::time::{Duration, Instant};

use common::*;
use farvm_guest_agent::pv::{self, LogRecord, LOG_MAX};
use farvm_guest_agent::slot::{AgentSlot, SLOT_MAGIC};
use farvm_vmm::builder::{build, VmConfig};
use farvm_vmm::remote::{Budget, RemoteSpec};
use farvm_vmm::vm::{VmOutcome, VmReport, VmState};
use farvm_vmm::vstate::memory::Backing;
use vm_memory::{Bytes, GuestAddress};

fn run(cfg: VmConfig) -> VmReport {
    let vm = build(&cfg).expect("build VM");
    let running = vm.start().expect("start VM");
    let outcome = running.wait(Some(Duration::from_secs(60)), false);
    running.finish(outcome)
}

#[test]
fn log_serial_and_shutdown_status() {
    if !kvm_available() {
        return;
    }
    let mut rec = LogRecord {
        len: 11,
        cpu: 0,
        bytes: [0; LOG_MAX],
    };
    rec.bytes[..11].copy_from_slice(b"hello farvm");
    let mut a = Asm::default();
    a.out_port(pv::PORT_LOG, data_gpa(0))
        .mov_dx(0x3f8)
        .mov_al(b'H')
        .out8()
        .eax_from_esi_plus(5)
        .mov_dx(pv::PORT_SHUTDOWN)
        .out32()
        .spin();
    let r = run(config("t-log", kernel_with(&a.code, &bytes_of(&rec)), 1));
    assert_eq!(
        r.outcome,
        VmOutcome::GuestShutdown { status: 5 },
        "rsi = cpu 0, +5"
    );
    assert_eq!(r.exits.io_serial, 1);
    assert_eq!(r.exits.io_pv, 2);
}

#[test]
fn guest_log_lines_are_kept() {
    if !kvm_available() {
        return;
    }
    let mut rec = LogRecord {
        len: 5,
        cpu: 0,
        bytes: [0; LOG_MAX],
    };
    rec.bytes[..5].copy_from_slice(b"ping!");
    let mut a = Asm::default();
    a.out_port(pv::PORT_LOG, data_gpa(0))
        .out_port(pv::PORT_SHUTDOWN, 0)
        .spin();
    let vm = build(&config("t-log2", kernel_with(&a.code, &bytes_of(&rec)), 1)).unwrap();
    let shared = vm.shared().clone();
    let running = vm.start().unwrap();
    let o = running.wait(Some(Duration::from_secs(60)), false);
    running.finish(o);
    assert_eq!(shared.pv.log_lines(), vec!["ping!".to_string()]);
}

#[test]
fn emulation_failure_reports_instruction_bytes() {
    if !kvm_available() {
        return;
    }
    // movd xmm0, eax in ring 0: KVM's emulator cannot execute SSE (host-test-guest.md §0).
    let mut a = Asm::default();
    a.raw(&[0x66, 0x0f, 0x6e, 0xc0]).spin();
    let r = run(config("t-ie", kernel_with(&a.code, &[]), 1));
    match &r.outcome {
        VmOutcome::Crash { cpu: 0, message } => {
            assert!(message.contains("KVM_EXIT_INTERNAL_ERROR"), "{message}");
            assert!(message.contains("66 0f 6e c0"), "{message}");
            assert!(message.contains(&format!("{ENTRY:#x}")), "{message}");
        }
        other => panic!("expected a crash, got {other:?}"),
    }
}

#[test]
fn triple_fault_is_reported() {
    if !kvm_available() {
        return;
    }
    // ud2 with no IDT: #UD -> #DF -> triple fault -> KVM_EXIT_SHUTDOWN.
    let mut a = Asm::default();
    a.raw(&[0x0f, 0x0b]);
    let r = run(config("t-tf", kernel_with(&a.code, &[]), 1));
    match &r.outcome {
        VmOutcome::Crash { message, .. } => {
            // PVM may report the unhandled #UD as an emulation failure instead of a shutdown.
            assert!(
                message.contains("triple-faulted") || message.contains("INTERNAL_ERROR"),
                "{message}"
            );
        }
        other => panic!("expected a crash, got {other:?}"),
    }
}

#[test]
fn vcpu_threads_agent_slot_and_clean_stop() {
    if !kvm_available() {
        return;
    }
    // Each vCPU announces an agent slot (vCPU 0 and 1 use separate pages in the data area),
    // reports CPU-done, then spins until the VMM stops it.
    let mut data = vec![0u8; 0x3000];
    // Align the slot pages: data area starts at 0x100400, so pages at +0xc00 and +0x1c00.
    for (cpu, off) in [(0u32, 0xc00usize), (1, 0x1c00)] {
        let s = AgentSlot {
            magic: SLOT_MAGIC,
            generation: 2,
            cpu,
            version: 1,
            pid: 40 + u64::from(cpu),
            cr3: 0x1000,
            switches: 1,
        };
        data[off..off + 48].copy_from_slice(&bytes_of(&s));
    }
    assert_eq!(data_gpa(0xc00) % 4096, 0);
    let mut a = Asm::default();
    // eax = 0x101000 + esi * 0x1000 : mov eax, esi; shl eax, 12; add eax, 0x101000
    a.raw(&[0x89, 0xf0, 0xc1, 0xe0, 0x0c, 0x05])
        .raw(&data_gpa(0xc00).to_le_bytes())
        .mov_dx(pv::PORT_AGENT_SLOT)
        .out32()
        .out_port(pv::PORT_CPU_DONE, 0)
        .spin();
    let vm = build(&config("t-smp", kernel_with(&a.code, &data), 2)).unwrap();
    let shared = vm.shared().clone();
    let running = vm.start().unwrap();
    // Thread ids are published before any guest instruction runs.
    assert!(
        shared.vcpu_tids().iter().all(|t| *t > 0),
        "{:?}",
        shared.vcpu_tids()
    );
    let t0 = Instant::now();
    while !(shared.pv.cpu_done(0) && shared.pv.cpu_done(1)) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "vCPUs never reported done"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(shared.current_pids(), vec![Some(40), Some(41)]);
    let tids = shared.vcpu_tids();
    for (i, tid) in tids.iter().enumerate() {
        let comm = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).unwrap();
        assert_eq!(comm.trim(), format!("vcpu{i}"));
    }
    // The vCPUs spin in the guest: the stop path must kick them out of KVM_RUN.
    let t1 = Instant::now();
    let r = running.finish(VmOutcome::ControlShutdown);
    assert_eq!(r.outcome, VmOutcome::ControlShutdown);
    assert!(
        t1.elapsed() < Duration::from_secs(10),
        "stop took {:?}",
        t1.elapsed()
    );
}

#[test]
fn mmio_access_is_an_error() {
    if !kvm_available() {
        return;
    }
    // mov eax, [0xffff8000d0000000]? Not mapped by the boot tables; use the direct map of an
    // address past RAM instead: the direct map covers RAM only, so use the kernel window
    // (0..1 GiB), which the 64 MiB VM does not back -> MMIO exit at GPA 0x8000000.
    let target = farvm_guest_agent::boot::KERNEL_WINDOW_BASE + 0x800_0000;
    let mut a = Asm::default();
    a.raw(&[0x48, 0xa1]).raw(&target.to_le_bytes()).spin(); // movabs rax, [target]
    let r = run(config("t-mmio", kernel_with(&a.code, &[]), 1));
    match &r.outcome {
        VmOutcome::Crash { message, .. } => assert!(message.contains("0x8000000"), "{message}"),
        other => panic!("expected a crash, got {other:?}"),
    }
}

#[test]
fn kvm_stats_count_exits() {
    if !kvm_available() {
        return;
    }
    let mut a = Asm::default();
    for _ in 0..5 {
        a.out_port(0x80, 0);
    }
    a.out_port(pv::PORT_SHUTDOWN, 0).spin();
    let r = run(config("t-kst", kernel_with(&a.code, &[]), 1));
    assert_eq!(r.outcome, VmOutcome::GuestShutdown { status: 0 });
    assert_eq!(r.exits.io_other, 5);
    let s = r.kvm_stats[0]
        .as_ref()
        .expect("KVM_GET_STATS_FD works on this kernel");
    // Six `out`s, each a userspace exit (emulated ring-0 I/O counts under `exits`, not
    // `io_exits`, on this PVM host).
    let exits = s.iter().find(|(n, _)| n == "exits").map(|(_, v)| *v);
    assert!(exits.is_some_and(|v| v >= 6), "exits in {s:?}");
}

/// Guest RAM paged by the engine (remote memory, an embedded memory server): KVM's memslot is
/// the engine's guest view, the guest runs on it, and the VMM's own accesses (the boot data it
/// writes, the PV log record it reads) are copies made by the engine, never loads through the
/// guest view.
#[test]
fn a_vm_on_paged_ram_runs_and_vmm_accesses_go_through_the_engine() {
    if !kvm_available() {
        return;
    }
    let mut rec = LogRecord {
        len: 2,
        cpu: 0,
        bytes: [0; LOG_MAX],
    };
    rec.bytes[..2].copy_from_slice(b"hi");
    let mut a = Asm::default();
    a.out_port(pv::PORT_LOG, data_gpa(0))
        .out_port(pv::PORT_SHUTDOWN, 9)
        .spin();
    let mut cfg = config("t-paged", kernel_with(&a.code, &bytes_of(&rec)), 1);
    let mut spec = RemoteSpec::new("t-paged");
    spec.budget = Budget::Percent(50.0);
    spec.prefetcher = "none".into();
    cfg.remote = Some(spec);
    cfg.kvm_async_pf = false;
    let vm = build(&cfg).expect("build a VM on remote memory");
    let engine = vm.remote().expect("remote memory").engine();
    assert_eq!(vm.ram().backing(), Backing::External);
    let regions = vm.ram().regions();
    assert_eq!(regions.len(), 1);
    assert_eq!(
        (regions[0].host_addr(), regions[0].len()),
        engine.guest_ram(),
        "the memslot is the engine's guest view"
    );
    assert!(vm.ram().direct().is_err(), "no direct view of paged RAM");
    assert_eq!(vm.vcpu_fds().len(), 1);
    let boot_accesses = engine.counters().vmm_accesses;
    assert!(
        boot_accesses > 0,
        "the kernel and boot data were written through the engine"
    );
    let shared = vm.shared().clone();
    let running = vm.start().unwrap();
    let o = running.wait(Some(Duration::from_secs(60)), false);
    let r = running.finish(o);
    assert_eq!(r.outcome, VmOutcome::GuestShutdown { status: 9 });
    assert_eq!(shared.pv.log_lines(), vec!["hi".to_string()]);
    let paging = r.paging.expect("paging stats of a VM on remote memory");
    assert!(
        paging.engine.counters.vmm_accesses > boot_accesses,
        "the PV log read went through the engine: {:?}",
        paging.engine.counters
    );
    assert!(r.paging_errors.is_empty(), "{:?}", r.paging_errors);
    // The engine is shut down with the VM: an access now is an error, not a touch of the
    // unmapped guest view.
    assert!(shared.ram.read_obj::<u64>(GuestAddress(0)).is_err());
}

#[test]
fn pause_parks_every_vcpu_and_resume_lets_them_run() {
    if !kvm_available() {
        return;
    }
    // mov dx, 0x80; L: out dx, al; jmp L — an exit per iteration, forever, on both vCPUs.
    let mut a = Asm::default();
    a.mov_dx(0x80).raw(&[0xee, 0xeb, 0xfd]);
    let vm = build(&config("t-pause", kernel_with(&a.code, &[]), 2)).unwrap();
    assert_eq!(vm.state(), VmState::Created);
    let running = vm.start().unwrap();
    let io = || running.counters().exits.io_other;
    let wait_past = |n: u64| {
        let t0 = Instant::now();
        while io() <= n {
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the vCPUs do not run"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_past(100);
    assert_eq!(running.state(), VmState::Running);
    assert!(running.resume().is_err(), "a running VM cannot be resumed");
    running.pause().unwrap();
    assert_eq!(running.state(), VmState::Paused);
    running.pause().unwrap();
    let parked_at = io();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(io(), parked_at, "no guest instruction runs while paused");
    // A parked vCPU still answers its handle: each reports its state, at the port loop.
    let states = running.shared().dump_vcpus(Duration::from_secs(10));
    assert_eq!(states.len(), 2);
    for s in &states {
        let s = s.as_deref().expect("a parked vCPU reports its state");
        assert!(s.contains("RIP") && s.contains("lapic"), "{s}");
    }
    assert_eq!(running.state(), VmState::Paused, "a report does not resume");
    assert_eq!(io(), parked_at);
    running.resume().unwrap();
    wait_past(parked_at + 100);
    assert_eq!(running.state(), VmState::Running);
    // Running vCPUs report too (each kicked out of the guest, then back in).
    let states = running.shared().dump_vcpus(Duration::from_secs(10));
    assert!(states.iter().all(Option::is_some), "{states:?}");
    wait_past(io() + 100);
    // A stop wakes parked vCPUs: they leave without a resume.
    running.pause().unwrap();
    running.request_shutdown();
    assert_eq!(running.state(), VmState::Stopping);
    assert!(running.pause().is_err(), "a stopping VM cannot be paused");
    let o = running.wait(Some(Duration::from_secs(60)), false);
    assert_eq!(o, VmOutcome::ControlShutdown);
    assert_eq!(running.finish(o).outcome, VmOutcome::ControlShutdown);
}

#[test]
fn a_vm_built_to_be_restored_leaves_guest_ram_to_the_snapshot() {
    if !kvm_available() {
        return;
    }
    let mut a = Asm::default();
    a.out_port(pv::PORT_SHUTDOWN, 3).spin();
    let kernel = kernel_with(&a.code, b"boot data");
    // Local RAM: a fresh build writes the kernel and its boot data; one to be restored has
    // the same entry state and not a byte written.
    let fresh = build(&config("t-fresh", kernel.clone(), 1)).expect("build");
    let mut cfg = config("t-restoring", kernel.clone(), 1);
    cfg.restoring = true;
    let restoring = build(&cfg).expect("build a VM to be restored");
    assert_eq!(restoring.entry(), fresh.entry());
    let nonzero = |vm: &farvm_vmm::vm::Vm| {
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0usize;
        for r in vm.ram().regions() {
            for off in (0..r.len()).step_by(buf.len()) {
                vm.ram()
                    .read_slice(&mut buf, GuestAddress(r.gpa() + off))
                    .unwrap();
                n += buf.iter().filter(|b| **b != 0).count();
            }
        }
        n
    };
    assert!(nonzero(&fresh) > 0, "a fresh build writes the kernel");
    assert_eq!(
        nonzero(&restoring),
        0,
        "a build to be restored writes nothing"
    );
    // Remote memory: the engine never sees a VMM write, so no page of the build can be evicted
    // into the namespace the snapshot's remote pages live in.
    let mut cfg = config("t-restoring-remote", kernel, 1);
    let mut spec = RemoteSpec::new("t-restoring-remote");
    spec.budget = Budget::Percent(25.0);
    cfg.remote = Some(spec);
    cfg.restoring = true;
    let vm = build(&cfg).expect("build a VM on remote memory to be restored");
    let engine = vm.remote().expect("remote memory").engine();
    let c = engine.counters();
    assert_eq!(
        (c.vmm_accesses, c.zero_fills, c.remote_writes),
        (0, 0, 0),
        "{c:?}"
    );
}
