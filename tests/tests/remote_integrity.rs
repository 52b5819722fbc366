//! Remote-memory integrity under eviction and server loss:
//! - a seeded pattern written over the guest's memory at 25% local and rewritten / re-read
//!   over 10 passes, so every page is evicted (written back) and refetched at least 10 times;
//!   the guest's per-pass sums must equal the native build's (a wrong word in any page changes
//!   them). Size: `FARVM_REMOTE_INTEGRITY_MIB` (default 512; 1024 is the 1 GiB, about
//!   2x longer);
//! - two `farvm-memserver` processes with replication 2, one SIGKILLed mid-run: the VM
//!   finishes with the native checksum;
//! - the only `farvm-memserver` frozen (SIGSTOP) mid-run for well past the request timeout,
//!   then resumed: it is taken out of service, the guest waits, the server is put back in
//!   service when it answers again, and the VM finishes with the native checksum;
//! - the only `farvm-memserver` killed and restarted empty mid-run: the guest goes back over
//!   pages only it held, and the VM is stopped with `MemoryLost` (exit status 74), never fed
//!   zeros and never left waiting.

mod remote_common;

use std::time::{Duration, Instant};

use remote_common::{
    assert_memory_lost, assert_native_checksums, run_remote, run_remote_errors, run_remote_with,
    setup, spec, wait_for_write_backs, MemserverProcess,
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
    sp.servers = vec![a.addr.into(), b.addr.into()];
    sp.replicas = Some(2);
    // The kill is seen at once (the connections reset); the timeout only has to be longer
    // than the worst answer time of a live server on this loaded 2-core host, where two VMs
    // share the CPUs with both servers (500 ms once took the survivor out of service).
    sp.timeout = Duration::from_secs(5);
    let s = setup(
        "remote-replicated",
        192 << 20,
        &["seq:ws=128M,passes=6,write=1"],
    );
    let mut killed_after_writes = 0;
    let (report, stats) = run_remote_with(&s, &sp, |remote| {
        // Kill once a good share of the pages live only remotely.
        killed_after_writes = wait_for_write_backs(remote, 20_000);
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

#[test]
fn frozen_sole_memserver_rejoins_and_the_run_completes() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let server = MemserverProcess::spawn("1G");
    let mut sp = spec("remote-frozen", "25%", "leap+stream");
    sp.servers = vec![server.addr.into()];
    sp.timeout = Duration::from_millis(300);
    let s = setup("remote-frozen", 144 << 20, &["seq:ws=96M,passes=6,write=1"]);
    let frozen = Duration::from_millis(2500);
    let mut out_of_service = false;
    let mut writes_at_freeze = 0;
    let (report, stats, errors) = run_remote_errors(&s, &sp, |remote| {
        writes_at_freeze = wait_for_write_backs(remote, 10_000);
        server.signal(libc::SIGSTOP);
        std::thread::sleep(frozen);
        let st = remote.stats();
        out_of_service =
            st.remote.dead_servers > st.remote.rejoined_servers && st.remote.suspended_slabs > 0;
        server.signal(libc::SIGCONT);
    });
    assert!(
        writes_at_freeze > 0,
        "the guest never wrote 10000 pages back"
    );
    assert!(
        out_of_service,
        "frozen for {frozen:?} with a 300 ms timeout, the server was not out of service with \
         its slab suspended: {:?}",
        stats.remote
    );
    assert_native_checksums(&s, &report, &stats);
    let r = &stats.remote;
    assert!(r.rejoined_servers >= 1, "the server never rejoined: {r:?}");
    assert_eq!(r.dead_servers, r.rejoined_servers, "{r:?}");
    assert_eq!(r.suspended_slabs, 0, "{r:?}");
    // What the engine saw meanwhile: store requests failing as unavailable or timed out —
    // retried, never a lost page.
    let unexpected: Vec<_> = errors
        .iter()
        .filter(|e| {
            !(e.starts_with("memory store ")
                && ["unreachable", "timed out", "queue full"]
                    .iter()
                    .any(|why| e.contains(why)))
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "unexpected engine errors: {unexpected:?}"
    );
    let c = &stats.engine.counters;
    assert!(
        c.remote_writes > writes_at_freeze,
        "the run went on writing after the resume: {c:?}"
    );
    eprintln!(
        "froze the only server after {writes_at_freeze} write-backs for {frozen:?}: {} store \
         errors, {} read retries, rejoined {}x; run ended with {} write-backs",
        c.store_errors, c.read_retries, r.rejoined_servers, c.remote_writes
    );
}

#[test]
fn a_sole_memserver_restarted_empty_stops_the_vm_with_memory_lost() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let mut server = MemserverProcess::spawn("1G");
    let addr = server.addr;
    let mut sp = spec("remote-restarted", "25%", "leap+stream");
    sp.servers = vec![addr.into()];
    sp.timeout = Duration::from_millis(300);
    let s = setup(
        "remote-restarted",
        144 << 20,
        &["seq:ws=96M,passes=6,write=1"],
    );
    let mut writes_at_kill = 0;
    let mut restarted = None;
    let (report, stats, errors) = run_remote_errors(&s, &sp, |remote| {
        writes_at_kill = wait_for_write_backs(remote, 10_000);
        server.kill();
        restarted = Some(MemserverProcess::spawn_at(&addr.to_string(), "1G"));
    });
    assert!(writes_at_kill > 0, "the guest never wrote 10000 pages back");
    // The guest goes back over pages only the dead server held: it must be stopped, not fed
    // zeros and not left hanging until the 240 s timeout.
    let gpa = assert_memory_lost(&s, &report, &stats);
    let c = &stats.engine.counters;
    // (The engine keeps its first 256 errors: the failed requests of the outage come first.)
    assert!(!errors.is_empty());
    assert!(stats.remote.rejoined_servers >= 1, "{:?}", stats.remote);
    eprintln!(
        "killed and restarted the only server after {writes_at_kill} write-backs: the VM \
         stopped on lost page {gpa:#x} ({} lost-page accesses)",
        c.lost_accesses
    );
    drop(restarted);
}
