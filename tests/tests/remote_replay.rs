//! A real program's page-access pattern in the VM: the `replay` workload replays the first
//! million records of the committed `mix-numpy-redis` trace (a NumPy process and a Redis
//! server, interleaved; `traces/README.md`) on remote memory at 25% local. The trace reaches
//! the guest as its boot blob; each trace process becomes one guest process over a heap the
//! size of its footprint, and each checksum equals the same replay run natively.

mod remote_common;

use remote_common::{assert_native_checksums, run_remote, setup, spec};

#[test]
fn a_replayed_two_process_trace_at_25_percent_local_matches_native() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let trace = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../traces/mix-numpy-redis.trace.zst"
    );
    let s = setup(
        "remote-replay-25",
        32 << 20,
        &[&format!("replay:trace={trace},records=1000000")],
    );
    let (placed, blob) = s.placement();
    assert_eq!(placed.len(), 2, "one guest process per trace process");
    assert!(placed.iter().all(|w| w.name() == "replay"));
    assert_eq!(
        farvm_workloads::replay::section(&blob, 0)
            .map(|x| x.len())
            .zip(farvm_workloads::replay::section(&blob, 1).map(|x| x.len()))
            .map(|(a, b)| a + b),
        Some(1_000_000),
        "the blob holds the first million records"
    );
    let (report, stats) = run_remote(&s, &spec("remote-replay-25", "25%", "leap+stream"));
    assert_native_checksums(&s, &report, &stats);
    let c = &stats.engine.counters;
    assert!(c.evictions > 0, "25% local must evict: {c:?}");
    assert!(
        c.demand_faults > 0,
        "the replay must fault on remote pages: {c:?}"
    );
    assert_eq!(c.store_errors, 0);
}
