//! Every workload run in the test guest gives the same checksum as the native build of the
//! same code with the same parameters (bit for bit), at 64 MiB and, for a few, up to 1 GiB.

use farvm_guest_agent::pv::state;
use farvm_tests::{compare_with_native, kvm_available, native, record_for, GuestSetup};
use farvm_vmm::vm::VmOutcome;

fn check(setup: &GuestSetup) {
    let placed = setup.placed();
    let report = setup.run();
    assert_eq!(
        report.outcome,
        VmOutcome::GuestShutdown { status: 0 },
        "guest did not finish cleanly: {report:#?}"
    );
    assert_eq!(report.processes.len(), placed.len(), "{report:#?}");
    let mut bad = Vec::new();
    for (i, w) in placed.iter().enumerate() {
        let rec = record_for(&report, &placed, i).expect("mailbox");
        let nat = compare_with_native(w, rec);
        if rec.checksum != nat.checksum {
            bad.push(w.name());
        }
    }
    assert!(bad.is_empty(), "checksum mismatches: {bad:?}");
    for (i, w) in placed.iter().enumerate() {
        let rec = record_for(&report, &placed, i)
            .unwrap_or_else(|| panic!("no mailbox for {}: {report:#?}", w.name()));
        assert_eq!(
            rec.state,
            state::DONE,
            "{} ended in state {}",
            w.name(),
            rec.state
        );
        let nat = native(w);
        assert_eq!(
            rec.checksum,
            nat.checksum,
            "{} ({} bytes, seed {}): guest checksum {:#x} != native {:#x}",
            w.name(),
            w.spec.ws_bytes,
            w.spec.seed,
            rec.checksum,
            nat.checksum
        );
        assert_eq!(rec.ops, nat.ops, "{}: ops differ", w.name());
        assert!(rec.elapsed_ns > 0, "{}: no measured time", w.name());
    }
}

#[test]
fn all_workloads_at_64m_match_native() {
    if !kvm_available() {
        return;
    }
    let names = [
        "seq",
        "stride",
        "random",
        "matmul",
        "matmul-blocked",
        "kv",
        "pagerank",
        "quicksort",
    ];
    let specs: Vec<String> = names
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{n}:ws=64M,seed={}", 11 + i))
        .collect();
    let specs: Vec<&str> = specs.iter().map(String::as_str).collect();
    // Cooperative scheduling: processes on a vCPU run one after the other, so each measured
    // time is its own. Preemption is covered by the multi-process tests (processes.rs).
    let mut setup = GuestSetup::new("ck-64m", 1 << 30, 2, &specs);
    setup.timer_hz = 0;
    check(&setup);
}

#[test]
fn large_working_sets_match_native() {
    if !kvm_available() {
        return;
    }
    check(&GuestSetup::new(
        "ck-1g",
        1536 << 20,
        1,
        &["seq:ws=1G,seed=5,passes=1", "random:ws=256M,seed=6"],
    ));
}

#[test]
fn scan_beside_random_polluter_under_preemption_matches_native() {
    if !kvm_available() {
        return;
    }
    // The SNU setup: a sequential scan with a random "polluter" on the same vCPU, preempted
    // by the 100 Hz LAPIC timer (two processes per vCPU, interleaved).
    let setup = GuestSetup::new(
        "ck-polluter",
        512 << 20,
        2,
        &[
            "seq:ws=64M,seed=21,cpu=0",
            "random:ws=32M,seed=22,cpu=0",
            "stride:ws=64M,seed=23,cpu=1",
            "random:ws=32M,seed=24,cpu=1",
        ],
    );
    check(&setup);
}
