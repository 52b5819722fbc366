//! The test guest on remote memory over RDMA (a `farvm-memserver --rdma` process, reached as
//! `rdma://`):
//! - alone at 25% local: every page evicted and fetched again over the RDMA link, the guest's
//!   checksums equal to the native build's;
//! - replicated across one TCP and one RDMA server, the RDMA one SIGKILLed mid-run: the VM
//!   finishes with the native checksums (nothing lost), the dead server taken out of service.
//!
//! They need an RDMA device: `FARVM_RDMA_IP` (the KVM lab's Soft-RoCE set-up exports it; CI's
//! lab stage runs these with `FARVM_REQUIRE_RDMA=1`).

mod remote_common;

use std::time::Duration;

use farvm_vmm::spec::{Endpoint, Transport};

use remote_common::{
    assert_native_checksums, rdma_ip, run_remote, run_remote_with, setup, spec,
    wait_for_write_backs, MemserverProcess,
};

#[test]
fn test_guest_on_an_rdma_memserver_keeps_its_checksums() {
    let Some(ip) = rdma_ip("test_guest_on_an_rdma_memserver_keeps_its_checksums") else {
        return;
    };
    if !farvm_tests::kvm_available() {
        return;
    }
    let server = MemserverProcess::spawn_rdma(ip, "256M");
    let rdma = server.rdma.expect("RDMA listener");
    let mut sp = spec("remote-rdma", "25%", "leap+stream");
    // Page sealing is implemented on TCP links only (docs/sealing.md).
    sp.page_encryption = false;
    sp.servers = vec![Endpoint {
        addr: rdma,
        transport: Transport::RDMA,
    }];
    let s = setup("remote-rdma", 48 << 20, &["seq:ws=16M,passes=3,write=1"]);
    let (report, stats) = run_remote(&s, &sp);
    assert_native_checksums(&s, &report, &stats);
    let c = &stats.engine.counters;
    let ws_pages = 16 << 8;
    assert!(
        c.remote_reads_demand + c.remote_reads_prefetch >= 2 * ws_pages,
        "the working set must come back over RDMA at least twice: {c:?}"
    );
    assert_eq!(stats.remote.dead_servers, 0, "{:?}", stats.remote);
    eprintln!(
        "over RDMA: {} demand + {} prefetch reads, {} write-backs",
        c.remote_reads_demand, c.remote_reads_prefetch, c.remote_writes
    );
}

#[test]
fn replicas_on_tcp_and_rdma_survive_killing_the_rdma_one() {
    let Some(ip) = rdma_ip("replicas_on_tcp_and_rdma_survive_killing_the_rdma_one") else {
        return;
    };
    if !farvm_tests::kvm_available() {
        return;
    }
    let tcp = MemserverProcess::spawn("256M");
    let mut over_rdma = MemserverProcess::spawn_rdma(ip, "256M");
    let rdma = over_rdma.rdma.expect("RDMA listener");
    let mut sp = spec("remote-rdma-replicated", "25%", "leap+stream");
    sp.page_encryption = false;
    sp.servers = vec![
        Endpoint::tcp(tcp.addr),
        Endpoint {
            addr: rdma,
            transport: Transport::RDMA,
        },
    ];
    sp.replicas = Some(2);
    // Generous: under emulation (the KVM lab) a live server may answer slowly; the kill itself
    // is seen at once (the control connection closes).
    sp.timeout = Duration::from_secs(10);
    let s = setup(
        "remote-rdma-replicated",
        64 << 20,
        &["seq:ws=24M,passes=4,write=1"],
    );
    let mut killed_after_writes = 0;
    let (report, stats) = run_remote_with(&s, &sp, |remote| {
        killed_after_writes = wait_for_write_backs(remote, 4_000);
        over_rdma.kill();
    });
    assert!(
        killed_after_writes > 0,
        "the guest never wrote 4000 pages back"
    );
    assert_native_checksums(&s, &report, &stats);
    assert_eq!(stats.remote.dead_servers, 1, "{:?}", stats.remote);
    let c = &stats.engine.counters;
    assert!(
        c.remote_writes > killed_after_writes,
        "the run went on writing after the kill: {c:?}"
    );
    eprintln!(
        "killed the RDMA server after {killed_after_writes} write-backs; run ended with {} \
         write-backs, {} read fail-overs",
        c.remote_writes, stats.remote.read_failovers
    );
    drop(tcp);
}
