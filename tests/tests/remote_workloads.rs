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
