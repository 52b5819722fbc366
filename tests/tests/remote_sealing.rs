//! Sealed pages end to end (issue 35, docs/sealing.md): the test guest on remote memory with
//! `--page-encryption on` (the default), its memory server turned hostile mid-run — every page
//! it holds of the VM altered in place, the crc32c fixed as an attacker would:
//! - with a replica on another server, the VM finishes with the native checksums: no altered
//!   page is installed, the hostile replica leaves the slab, its reads fail over;
//! - with no replica, the VM is stopped with `MemoryLost` (exit status 74) naming a page,
//!   never fed the altered bytes.

mod remote_common;

use std::time::Duration;

use farvm_memserver::server::metrics::Op;
use farvm_memserver::server::{Server, ServerConfig, ServerHandle};
use farvm_vmm::spec::Endpoint;
use remote_common::{
    assert_memory_lost, assert_native_checksums, run_remote_errors, run_remote_with, setup, spec,
    wait_for_write_backs,
};

/// Flips one bit in every page of every namespace `server` holds and fixes each crc32c.
/// Returns how many pages it altered.
fn forge_every_page(server: &ServerHandle) -> usize {
    let store = server.store();
    let mut n = 0;
    for ns in store.namespace_ids() {
        for p in store.stored_pages(ns) {
            let Some(mut s) = store.stored_page(ns, p) else {
                continue;
            };
            s.data[(p as usize * 7) % 4096] ^= 0x10;
            s.fix_crc();
            n += usize::from(store.overwrite_page(ns, p, &s));
        }
    }
    n
}

fn server() -> ServerHandle {
    Server::start(ServerConfig::loopback(1 << 30)).expect("memory server starts")
}

#[test]
fn a_replica_keeps_the_guest_running_when_the_server_it_reads_forges_every_page() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let servers = [server(), server()];
    let mut sp = spec("sealed-replicated", "25%", "leap+stream");
    sp.servers = servers.iter().map(|s| Endpoint::tcp(s.addr())).collect();
    sp.replicas = Some(2);
    sp.timeout = Duration::from_secs(5);
    assert!(sp.page_encryption, "sealing is the default");
    let s = setup(
        "sealed-replicated",
        144 << 20,
        &["seq:ws=96M,passes=6,write=1"],
    );
    let mut forged = 0;
    let (report, stats) = run_remote_with(&s, &sp, |remote| {
        assert!(wait_for_write_backs(remote, 10_000) > 0, "no write-backs");
        // The slab's first replica serves its reads: that is the one to turn.
        let reads = |i: usize| servers[i].requests(Op::Read);
        let first = if reads(0) >= reads(1) { 0 } else { 1 };
        forged = forge_every_page(&servers[first]);
    });
    assert!(forged > 1000, "forged only {forged} pages");
    assert_native_checksums(&s, &report, &stats);
    let r = &stats.remote;
    assert!(r.page_encryption, "{r:?}");
    assert!(r.remote_unauthentic >= 1, "no forged page was read: {r:?}");
    assert!(
        r.replicas_rejected >= 1,
        "the forging replica stayed: {r:?}"
    );
    eprintln!(
        "forged {forged} pages on the replica serving reads: {} unauthentic responses, {} \
         replicas rejected, {} read fail-overs",
        r.remote_unauthentic, r.replicas_rejected, r.read_failovers
    );
}

#[test]
fn the_vm_stops_with_memory_lost_when_its_only_server_forges_every_page() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let only = server();
    let mut sp = spec("sealed-alone", "25%", "leap+stream");
    sp.servers = vec![Endpoint::tcp(only.addr())];
    sp.timeout = Duration::from_secs(5);
    let s = setup("sealed-alone", 144 << 20, &["seq:ws=96M,passes=6,write=1"]);
    let mut forged = 0;
    let (report, stats, errors) = run_remote_errors(&s, &sp, |remote| {
        assert!(wait_for_write_backs(remote, 10_000) > 0, "no write-backs");
        forged = forge_every_page(&only);
    });
    assert!(forged > 1000, "forged only {forged} pages");
    let gpa = assert_memory_lost(&s, &report, &stats);
    // Never installed: the engine saw the page absent (no copy left), not stale content.
    let c = &stats.engine.counters;
    assert_eq!(c.remote_stale, 0, "{c:?}");
    assert!(stats.remote.remote_unauthentic >= 1, "{:?}", stats.remote);
    assert!(
        errors.iter().any(|e| e.contains("no longer has it")),
        "the engine reported pages lost: {errors:?}"
    );
    eprintln!(
        "forged {forged} pages on the only server: the VM stopped on lost page {gpa:#x} ({} \
         unauthentic responses)",
        stats.remote.remote_unauthentic
    );
}

/// The key id (hex) a stored page's seal names: its first 4 bytes.
fn stored_key_id(server: &ServerHandle, ns: u64, p: u64) -> Option<String> {
    let s = server.store().stored_page(ns, p)?;
    Some(s.seal[..4].iter().map(|b| format!("{b:02x}")).collect())
}

/// A page-key rotation mid-run (`farvm rotate-key`): a second rotation is refused while the
/// first runs; the evictor re-seals every stored page under the new key, the previous key is
/// dropped, no page on the server is left under it, and the guest finishes with the native
/// checksums.
#[test]
fn a_key_rotation_mid_run_reseals_every_page_and_drops_the_old_key() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let only = server();
    let mut sp = spec("sealed-rotated", "25%", "leap+stream");
    sp.servers = vec![Endpoint::tcp(only.addr())];
    sp.timeout = Duration::from_secs(5);
    let s = setup(
        "sealed-rotated",
        144 << 20,
        &["seq:ws=96M,passes=6,write=1"],
    );
    let mut rotation = None;
    let mut took = Duration::ZERO;
    let (report, stats) = run_remote_with(&s, &sp, |remote| {
        assert!(wait_for_write_backs(remote, 10_000) > 0, "no write-backs");
        let source = remote.stats_source();
        let started = std::time::Instant::now();
        let r = source.rotate_key().expect("a rotation starts");
        let again = source.rotate_key().expect_err("one rotation at a time");
        assert!(again.to_string().contains("already under way"), "{again}");
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let st = remote.stats().remote;
            if st.previous_key_id.is_none() {
                assert_eq!(st.pages_to_reseal, 0, "{st:?}");
                took = started.elapsed();
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the re-seal did not finish: {st:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let store = only.store();
        for ns in store.namespace_ids() {
            let under_old = store
                .stored_pages(ns)
                .into_iter()
                .filter(|&p| stored_key_id(&only, ns, p).as_deref() == Some(r.previous.as_str()))
                .count();
            assert_eq!(
                under_old, 0,
                "pages left under the dropped key {}",
                r.previous
            );
        }
        rotation = Some(r);
    });
    let r = rotation.expect("rotated");
    assert_native_checksums(&s, &report, &stats);
    let remote = &stats.remote;
    assert_eq!(
        remote.key_id.as_deref(),
        Some(r.current.as_str()),
        "{remote:?}"
    );
    assert_eq!(remote.previous_key_id, None, "{remote:?}");
    assert_eq!(remote.key_rotations, 1, "{remote:?}");
    assert!(remote.resealed_pages > 1000, "{remote:?}");
    assert_eq!(remote.remote_unauthentic, 0, "{remote:?}");
    eprintln!(
        "rotated from key {} to {}: {} pages re-sealed, old key dropped {:.2} s after the \
         rotation",
        r.previous,
        r.current,
        remote.resealed_pages,
        took.as_secs_f64()
    );
}
