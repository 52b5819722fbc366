//! Several processes in the test guest: isolated address spaces on 2 vCPUs, the agent slot
//! reporting the right pid per vCPU while processes run, and a ring-3 crash killing only the
//! crashing process.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use farvm_guest_agent::pv::state;
use farvm_tests::{kvm_available, native, record_for, GuestSetup};
use farvm_vmm::vm::VmOutcome;

#[test]
fn two_vcpus_three_processes_each_are_isolated() {
    if !kvm_available() {
        return;
    }
    let specs: Vec<String> = (0..6)
        .map(|i| format!("isolation:ws=4M,seed={},cpu={},rounds=4", 100 + i, i % 2))
        .collect();
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    let setup = GuestSetup::new("iso", 256 << 20, 2, &specs);
    let report = setup.run();
    assert_eq!(
        report.outcome,
        VmOutcome::GuestShutdown { status: 0 },
        "{report:#?}"
    );
    assert_eq!(report.processes.len(), 6);
    let mut cr3s = HashSet::new();
    for p in &report.processes {
        assert_eq!(
            p.state,
            state::DONE,
            "pid {} state {}: {p:#?}",
            p.pid,
            p.state
        );
        assert!(cr3s.insert(p.cr3), "pid {} shares CR3 {:#x}", p.pid, p.cr3);
    }
    let per_cpu = |c| report.processes.iter().filter(|p| p.cpu == c).count();
    assert_eq!((per_cpu(0), per_cpu(1)), (3, 3));
    // The isolation workload's checksum is deterministic: equal to its native run.
    let placed = setup.placed();
    for (i, w) in placed.iter().enumerate() {
        let rec = record_for(&report, &placed, i).expect("mailbox");
        assert_eq!(rec.checksum, native(w).checksum, "pid {}", rec.pid);
    }
}

#[test]
fn agent_slot_reports_running_pid_per_vcpu() {
    if !kvm_available() {
        return;
    }
    // One long CPU-bound process per vCPU: while they run, each vCPU's slot names its process.
    let setup = GuestSetup::new(
        "slot",
        128 << 20,
        2,
        &[
            "intops:cpu=0,iters=3000000000",
            "intops:cpu=1,iters=3000000000",
        ],
    );
    let running = setup.start();
    let shared = running.shared().clone();
    let t0 = Instant::now();
    let mut seen = None;
    while t0.elapsed() < Duration::from_secs(120) {
        if shared.outcome().is_some() {
            break;
        }
        let pids = shared.current_pids();
        if pids == vec![Some(1), Some(2)] {
            seen = Some(pids);
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let report = running.finish(VmOutcome::ControlShutdown);
    assert_eq!(
        seen,
        Some(vec![Some(1), Some(2)]),
        "agent slots never showed pid 1 on vCPU 0 and pid 2 on vCPU 1; report: {report:#?}"
    );
}

#[test]
fn ring3_crash_kills_only_its_process() {
    if !kvm_available() {
        return;
    }
    let setup = GuestSetup::new(
        "crash",
        256 << 20,
        2,
        &[
            "seq:ws=16M,seed=3,cpu=0",
            "crash:kind=0,cpu=0",
            "crash:kind=1,cpu=1",
            "random:ws=16M,seed=4,cpu=1",
            "crash:kind=2,cpu=1",
        ],
    );
    let placed = setup.placed();
    let report = setup.run();
    assert_eq!(
        report.outcome,
        VmOutcome::GuestShutdown { status: 0 },
        "the guest kernel must survive ring-3 faults: {report:#?}"
    );
    let expect_vector = [(1usize, 14u64), (2, 6), (4, 0)]; // #PF, #UD, #DE
    for (i, vector) in expect_vector {
        let rec = record_for(&report, &placed, i).expect("crash mailbox");
        assert_eq!(rec.state, state::KILLED, "{rec:#?}");
        assert_eq!(rec.fault_vector, vector, "{rec:#?}");
    }
    for i in [0usize, 3] {
        let rec = record_for(&report, &placed, i).expect("mailbox");
        assert_eq!(rec.state, state::DONE, "{rec:#?}");
        assert_eq!(
            rec.checksum,
            native(&placed[i]).checksum,
            "{}",
            placed[i].name()
        );
    }
}

/// KVM's statistic `name` of vCPU `cpu` now (0 when KVM reports it as 0 or not at all).
fn kvm_stat(shared: &farvm_vmm::vm::VmShared, cpu: usize, name: &str) -> u64 {
    shared.kvm_stats()[cpu]
        .as_ref()
        .and_then(|s| s.iter().find(|(k, _)| k == name).map(|&(_, v)| v))
        .unwrap_or(0)
}

#[test]
fn a_vcpu_with_nothing_left_to_run_blocks_in_the_host_kernel() {
    if !kvm_available() {
        return;
    }
    // Test VMs run with HLT exits disabled (as with remote memory), so the guest's own HLT
    // would halt in guest mode and hold a host CPU; the VMM must park the finished vCPU in KVM
    // instead, where it blocks (KVM's `blocking` statistic) until the VM stops.
    let setup = GuestSetup::new("idle-vcpu", 64 << 20, 2, &["intops:iters=4000000000,cpu=0"]);
    let running = setup.start();
    let shared = running.shared().clone();
    let t0 = Instant::now();
    while !shared.pv.cpu_done(1) {
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "vCPU 1 (no process) never reported done"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let t1 = Instant::now();
    let mut blocking = 0;
    while blocking == 0 && t1.elapsed() < Duration::from_secs(30) && !shared.pv.cpu_done(0) {
        blocking = kvm_stat(&shared, 1, "blocking");
        std::thread::sleep(Duration::from_millis(10));
    }
    let busy = !shared.pv.cpu_done(0);
    let r = running.finish(VmOutcome::ControlShutdown);
    assert_eq!(r.outcome, VmOutcome::ControlShutdown, "{r:#?}");
    assert!(
        busy,
        "vCPU 0 finished its process before vCPU 1 was seen blocking"
    );
    assert_eq!(
        blocking, 1,
        "vCPU 1 reported done but never blocked in the host kernel: {:?}",
        r.kvm_stats[1]
    );
}
