//! Remote-memory integrity under eviction and server loss:
//! - a seeded pattern written over the guest's memory at 25% local and rewritten / re-read
//!   over 10 passes, so every page is evicted (written back) and refetched at least 10 times;
//!   the guest's per-pass sums must equal the native build's (a wrong word in any page changes
//!   them). Size: `FARVM_REMOTE_INTEGRITY_MIB` (default 512; 1024 is the 1 GiB, about
//!   2x longer);
//! - two `farvm-memserver` processes with replication 2, one SIGKILLed mid-run: the VM
//!   finishes with the native checksum.

mod remote_common;

use std::time::{Duration, Instant};

use remote_common::{
    assert_native_checksums, run_remote, run_remote_with, setup, spec, MemserverProcess,
};

fn integrity_mib() -> u64 {
    std::env::var("FARVM_REMOTE_INTEGRITY_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&m: &u64| (16..=2048).contains(&m))
        .unwrap_or(512)
}

#[test]
fn seeded_pattern_survives_ten_eviction_cycles() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let mib = integrity_mib();
    let w = format!("seq:ws={mib}M,passes=10,write=1");
    let s = setup("remote-integrity", (mib + 48) << 20, &[&w]);
    let t0 = Instant::now();
    let (report, stats) = run_remote(&s, &spec("remote-integrity", "25%", "leap+stream"));
    assert_native_checksums(&s, &report, &stats);
    let c = &stats.engine.counters;
    let ws_pages = mib << 8;
    eprintln!(
        "{mib} MiB: {:.1} s, {} evictions ({} dirty), {} demand + {} prefetch reads",
        t0.elapsed().as_secs_f64(),
        c.evictions,
        c.evict_dirty,
        c.remote_reads_demand,
        c.remote_reads_prefetch
    );
    // Setup + warm-up + 10 passes each sweep the whole working set through a 25% budget.
    assert!(
        c.evictions >= 10 * ws_pages,
        "expected at least {} evictions (10 cycles of {ws_pages} pages), got {}",
        10 * ws_pages,
        c.evictions
    );
    assert!(
        c.remote_reads_demand + c.remote_reads_prefetch >= 10 * ws_pages,
        "expected at least 10 refetches of every page: {c:?}"
    );
}

#[test]
fn sigkill_of_one_replica_mid_run_keeps_the_checksum() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let mut a = MemserverProcess::spawn("1G");
    let b = MemserverProcess::spawn("1G");
    let mut sp = spec("remote-replicated", "25%", "leap+stream");
    sp.servers = vec![a.addr, b.addr];
    sp.replicas = Some(2);
    sp.timeout = Duration::from_millis(500);
    let s = setup(
        "remote-replicated",
        192 << 20,
        &["seq:ws=128M,passes=6,write=1"],
    );
    let mut killed_after_writes = 0;
    let (report, stats) = run_remote_with(&s, &sp, |remote| {
        // Kill once a good share of the pages live only remotely.
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let st = remote.stats();
            if st.engine.counters.remote_writes > 20_000 {
                killed_after_writes = st.engine.counters.remote_writes;
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        a.kill();
    });
    assert!(
        killed_after_writes > 0,
        "the guest never wrote 20000 pages back"
    );
    assert_native_checksums(&s, &report, &stats);
    assert_eq!(stats.remote.dead_servers, 1, "{:?}", stats.remote);
    let c = &stats.engine.counters;
    assert!(
        c.remote_writes > killed_after_writes,
        "the run went on writing after the kill: {c:?}"
    );
    eprintln!(
        "killed server 1 after {killed_after_writes} write-backs; run ended with {} write-backs, \
         {} read fail-overs",
        c.remote_writes, stats.remote.read_failovers
    );
    drop(b);
}
