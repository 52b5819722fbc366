//! End to end on remote memory: the test guest's workloads run with their RAM behind the
//! paging engine and a loopback memserver, at 25% local memory (and a 10% stress run), and
//! every checksum equals the native build's, bit for bit.

mod remote_common;

use remote_common::{assert_native_checksums, run_remote, setup, spec};

#[test]
fn every_workload_at_25_percent_local_matches_native() {
    if !farvm_tests::kvm_available() {
        return;
    }
    // One VM, one process per workload (time-sliced on one vCPU), 64 MiB working sets; op
    // counts of the random-access ones trimmed so the run stays within CI time on 2 cores.
    let s = setup(
        "remote-all-25",
        544 << 20,
        &[
            "seq:ws=64M,passes=2,write=1",
            "stride:ws=64M",
            "random:ws=64M,ops=300000",
            "matmul:ws=16M",
            "matmul-blocked:ws=16M",
            "kv:ws=64M,ops=300000",
            "pagerank:ws=64M,iters=2",
            "quicksort:ws=32M",
        ],
    );
    let (report, stats) = run_remote(&s, &spec("remote-all-25", "25%", "leap+stream"));
    assert_native_checksums(&s, &report, &stats);
    let c = &stats.engine.counters;
    assert!(c.evictions > 0, "25% local must evict: {c:?}");
    assert!(
        c.demand_faults + c.prefetch_issued > 0,
        "nothing was fetched: {c:?}"
    );
    assert_eq!(c.store_errors, 0);
    // With KVM's async page faults off, faults arrive on vCPU threads and are attributed to
    // the guest process that made them. The only exceptions are the first faults of boot,
    // before the attach thread (polling every 0.5 ms) has registered the vCPU's thread id:
    // 4 of ~300k here. With async page faults on, it was every one of them.
    assert!(
        c.unattributed_faults * 1000 <= c.demand_faults + c.zero_fills,
        "faults seen on threads that are not vCPUs: {c:?}"
    );
}

#[test]
fn stress_at_10_percent_local_matches_native() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let s = setup(
        "remote-stress-10",
        192 << 20,
        &[
            "seq:ws=64M,passes=2,write=1",
            "random:ws=32M,ops=100000",
            "kv:ws=32M,ops=100000",
            "stride:ws=32M",
        ],
    );
    let (report, stats) = run_remote(&s, &spec("remote-stress-10", "10%", "leap+stream"));
    assert_native_checksums(&s, &report, &stats);
    let c = &stats.engine.counters;
    assert!(
        c.evict_dirty > 0 && c.remote_writes > 0,
        "dirty pages must have been written back: {c:?}"
    );
}

#[test]
fn no_prefetch_is_also_correct() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let s = setup(
        "remote-none",
        128 << 20,
        &["stride:ws=64M", "random:ws=16M,ops=50000"],
    );
    let (report, stats) = run_remote(&s, &spec("remote-none", "25%", "none"));
    assert_native_checksums(&s, &report, &stats);
    assert_eq!(stats.engine.counters.prefetch_issued, 0);
}

#[test]
fn a_pinned_fault_path_runs_on_its_cpu_and_matches_native() {
    use farvm_vmm::affinity::{allowed_cpus, thread_cpus};
    if !farvm_tests::kvm_available() {
        return;
    }
    // The last allowed CPU, so that the default (CPU 0) is not mistaken for the setting.
    let all = allowed_cpus().unwrap();
    let cpu = *all.last().unwrap();
    let s = setup("remote-pinned", 96 << 20, &["stride:ws=32M"]);
    let mut sp = spec("remote-pinned", "25%", "leap+stream");
    sp.fault_path_cpu = Some(cpu);
    let mut seen = None;
    let (report, stats) = remote_common::run_remote_with(&s, &sp, |remote| {
        // vCPU 0 is pinned by the attach thread once its thread id is registered.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while remote.engine().vcpu_thread_id(0).is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        let tids = remote.fault_path_thread_ids();
        seen = Some(
            tids.iter()
                .map(|&t| (t, thread_cpus(t).unwrap()))
                .collect::<Vec<_>>(),
        );
    });
    assert_native_checksums(&s, &report, &stats);
    let seen = seen.expect("checked while the guest ran");
    // Fault handler, at least one memserver connection, vCPU 0.
    assert!(seen.len() >= 3, "{seen:?}");
    for (tid, cpus) in &seen {
        assert_eq!(cpus, &vec![cpu], "thread {tid} of the fault path: {seen:?}");
    }
    // Nothing else is pinned: the evictors (of this and any concurrent test VM) stay free.
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        if std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == "ept-evict")
        {
            let tid: i32 = t.file_name().to_str().unwrap().parse().unwrap();
            if let Ok(cpus) = thread_cpus(tid) {
                assert_eq!(cpus, all, "evictor {tid}");
            }
        }
    }
}

#[test]
fn a_scan_over_shuffled_frames_is_prefetched_in_virtual_page_order() {
    use farvm_vmm::remote::PageSpace;
    if !farvm_tests::kvm_available() {
        return;
    }
    // Every 4 KiB frame handed out in shuffled order: the scan is sequential only virtually.
    let mut s = setup("remote-virtual", 96 << 20, &["seq:ws=32M"]);
    s.frame_run_shift = 0;
    let mut sp = spec("remote-virtual", "25%", "leap+stream");
    sp.page_space = PageSpace::Virtual;
    let (report, virt) = run_remote(&s, &sp);
    assert_native_checksums(&s, &report, &virt);
    // Phase events carry the engine's counters: the measured passes alone are a stream too.
    let measured = report.processes[0]
        .measured_phase_paging()
        .expect("phase events carry paging counters");
    let est = farvm_ept::PrefetchEstimate::of(&measured);
    assert!(
        measured.prefetch_issued > 0 && est.coverage > 0.9,
        "measured phase: {measured:?}, {est:?}"
    );
    assert!(measured.demand_faults <= virt.engine.counters.demand_faults);
    sp.page_space = PageSpace::Physical;
    let (report, phys) = run_remote(&s, &sp);
    assert_native_checksums(&s, &report, &phys);
    let (v, p) = (&virt.engine, &phys.engine);
    assert!(
        v.counters.page_table_walks > 0 && v.counters.faults_seen_virtual > 0,
        "no fault was translated: {:?}",
        v.counters
    );
    // The process's faults were placed by walks (the rest are the kernel's and boot's).
    assert!(
        v.counters.faults_seen_virtual > 4 * v.counters.faults_seen_physical,
        "{:?}",
        v.counters
    );
    assert_eq!(p.counters.page_table_walks, 0);
    // In virtual order the scan is a stream the prefetcher covers; physically it is random.
    assert!(
        v.coverage > 0.9 && v.coverage > p.coverage + 0.3,
        "coverage virtual {} vs physical {}",
        v.coverage,
        p.coverage
    );
    assert!(
        v.counters.demand_faults * 4 < p.counters.demand_faults,
        "demand faults virtual {} vs physical {}",
        v.counters.demand_faults,
        p.counters.demand_faults
    );
}
