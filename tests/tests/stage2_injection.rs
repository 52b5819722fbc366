//! Stage-2 injection of prefetched pages.
//!
//! Where KVM offers KVM_PRE_FAULT_MEMORY (two-dimensional paging, EPT/NPT, Linux 6.11 or
//! later), the engine builds each injected page's stage-2 entry as it installs the page, so the
//! guest's first touch of it takes no exit. The test runs the same strided scan (one page in
//! ten, every page once per pass) twice, with stage-2 pre-fault on and off, and counts the
//! stage-2 faults the guest's vCPU took (KVM's own `pf_taken` statistic): with it off, every
//! injected page the guest touches costs one; with it on, they must be gone, and every injected
//! page must have been pre-faulted.
//!
//! Where KVM refuses the pre-fault (shadow paging, e.g. PVM), the test asserts the fallback
//! instead (refused once, then host-PTE injection only, native checksums), says so, and fails
//! if `FARVM_REQUIRE_STAGE2_PREFAULT=1`: the KVM lab stage of CI sets it, so the stage-2 path
//! is proven there.

mod remote_common;

use farvm_vmm::remote::{RemoteStats, Stage2Prefault};
use farvm_vmm::vm::VmReport;
use farvm_workloads::lathist::counter;
use remote_common::{assert_native_checksums, run_remote, setup, spec};

/// KVM's statistic `name` of vCPU 0.
fn vcpu0_stat(report: &VmReport, name: &str) -> u64 {
    let stats = report
        .kvm_stats
        .first()
        .and_then(|s| s.as_ref())
        .expect("KVM statistics of vCPU 0 (KVM_GET_STATS_FD)");
    stats
        .iter()
        .find(|(k, _)| k == name)
        .map(|&(_, v)| v)
        .unwrap_or_else(|| panic!("KVM has no vCPU statistic {name}: {stats:?}"))
}

/// One run of the strided scan at a local budget of half its working set.
fn stride_run(stage2_prefault: bool) -> (VmReport, RemoteStats) {
    let name = format!("stage2-{}", if stage2_prefault { "on" } else { "off" });
    let s = setup(&name, 64 << 20, &["stride:ws=16M"]);
    let mut sp = spec(&name, "8M", "leap+stream");
    sp.stage2_prefault = stage2_prefault;
    let (report, stats) = run_remote(&s, &sp);
    assert_native_checksums(&s, &report, &stats);
    let c = &stats.engine.counters;
    let rec = &report.processes[0];
    eprintln!(
        "stage-2 pre-fault {:?}: injected {} pre-faulted {} (calls {}, failed {}, refused {}) | demand faults {} zero fills {} | vCPU stage-2 faults {} | guest page access p50 {:.2} µs p99 {:.2} µs",
        stats.stage2_prefault,
        c.prefetch_injected,
        c.prefault_pages,
        c.prefault_calls,
        c.prefault_failed,
        c.prefault_unsupported,
        c.demand_faults,
        c.zero_fills,
        vcpu0_stat(&report, "pf_taken"),
        rec.counters[counter::PAGE_ACCESS_P50_NS] as f64 / 1e3,
        rec.counters[counter::PAGE_ACCESS_P99_NS] as f64 / 1e3,
    );
    assert!(
        c.prefetch_injected > 1000,
        "the scan must inject prefetched pages for this test to mean anything: {c:?}"
    );
    (report, stats)
}

#[test]
fn injected_pages_are_in_stage_2_before_the_guest_touches_them() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let supported = farvm_vmm::remote::stage2::host_supports_pre_fault();
    let required = std::env::var("FARVM_REQUIRE_STAGE2_PREFAULT").as_deref() == Ok("1");
    let (on_report, on) = stride_run(true);
    let c = &on.engine.counters;
    if !supported {
        // The fallback: the first call is refused, no more are made, pages are still injected
        // (host mapping) and the guest's results are right (checked by stride_run).
        assert_eq!(on.stage2_prefault, Stage2Prefault::Unsupported, "{on:#?}");
        assert_eq!(
            (c.prefault_calls, c.prefault_unsupported, c.prefault_pages),
            (1, 1, 0),
            "refused once, then never called: {c:?}"
        );
        eprintln!(
            "KVM_CAP_PRE_FAULT_MEMORY is 0 on this host: asserted the host-PTE fallback only; \
             stage-2 injection is tested where KVM has two-dimensional paging (scripts/kvm-lab)"
        );
        assert!(
            !required,
            "FARVM_REQUIRE_STAGE2_PREFAULT=1 but this KVM has no KVM_PRE_FAULT_MEMORY \
             (KVM_CAP_PRE_FAULT_MEMORY is 0: shadow paging, or Linux before 6.11)"
        );
        return;
    }
    assert_eq!(on.stage2_prefault, Stage2Prefault::On, "{on:#?}");
    assert_eq!(c.prefault_unsupported, 0, "{c:?}");
    assert_eq!(c.prefault_failed, 0, "no pre-fault call may fail: {c:?}");
    assert_eq!(
        c.prefault_pages, c.prefetch_injected,
        "every injected page must have its stage-2 entry built: {c:?}"
    );
    let (off_report, off) = stride_run(false);
    assert_eq!(off.stage2_prefault, Stage2Prefault::Off);
    assert_eq!(off.engine.counters.prefault_pages, 0);
    // Without pre-fault, each injected page the guest touches costs the vCPU one stage-2 fault
    // that the engine never sees (KVM resolves it from the host mapping); with it, none. The
    // other stage-2 faults (demand faults, zero fills, staged pages, boot) are alike in both
    // runs, so the difference is the injected pages' first touches.
    let faults_on = vcpu0_stat(&on_report, "pf_taken");
    let faults_off = vcpu0_stat(&off_report, "pf_taken");
    let injected_off = off.engine.counters.prefetch_injected;
    eprintln!(
        "vCPU stage-2 faults: pre-fault off {faults_off}, on {faults_on} (difference {}; \
         pages injected with it off {injected_off})",
        faults_off as i64 - faults_on as i64
    );
    assert!(
        faults_off.saturating_sub(faults_on) * 2 >= injected_off,
        "with stage-2 pre-fault off the vCPU should take about one more stage-2 fault per \
         injected page ({injected_off}); it took {faults_off} against {faults_on} with it on"
    );
}
