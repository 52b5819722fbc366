//! Sealed pages against a memory server that misbehaves (issue 35, docs/sealing.md), through
//! the paging engine's page store (`PageStore`, what the VMM uses): a server that flips a bit
//! of a stored page (fixing its crc32c, as an attacker would), returns another page number's
//! page, an older version of the page, or another VM's page. The engine is never handed such
//! a page: with a replica the read fails over and delivers the right content, without one the
//! page reads as absent with no copy to blame (the engine makes it LOST: exit 74, naming the
//! page). And a dump of the store after marker pages were written holds no copy of the marker.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use common::*;
use farvm_memclient::{Client, ClientConfig, PageKey, PageStore, StoreConfig};
use farvm_memproto::{wire_crc, PAGE_SIZE};
use farvm_memserver::server::store::StoredPage;
use farvm_memserver::server::{Server, ServerConfig, ServerHandle};
use farvm_pageio::{
    Completion, CompletionSink, PageBuf, Priority, ReadReq, RemoteStore, Replica, Status, Version,
    WriteReq,
};

/// The VM's namespace, and another VM's.
const NS: u64 = 7;
const OTHER_NS: u64 = 8;

/// Write-back completions, waited for one batch at a time.
#[derive(Default)]
struct Sink {
    done: Mutex<Vec<Completion>>,
    cv: Condvar,
}

impl CompletionSink for Sink {
    fn complete(&self, batch: &[Completion]) {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(batch);
        self.cv.notify_all();
    }
}

struct Vm {
    store: Arc<PageStore>,
    sink: Arc<Sink>,
}

impl Vm {
    /// A page store of namespace `ns` on `servers` (replicas in this order for every slab),
    /// sealing under `key` if given.
    fn new(servers: &[SocketAddr], ns: u64, key: Option<&PageKey>) -> Self {
        let mut cfg = ClientConfig::new(servers.to_vec());
        cfg.slab_pages = 1024;
        cfg.replication = Some(servers.len());
        cfg.slab_homes = vec![(0..servers.len() as u16).collect()];
        cfg.timeout = Duration::from_secs(5);
        cfg.page_key = key.cloned();
        let client = Arc::new(Client::connect(cfg).expect("client connects"));
        let store = PageStore::new(
            client,
            StoreConfig {
                namespace: ns,
                slots: 16,
            },
        );
        let sink = Arc::new(Sink::default());
        store.attach(sink.clone()).expect("attach");
        Self { store, sink }
    }

    /// Writes `data` as `page` at `version` and waits until every replica stored it.
    fn write(&self, page: u64, data: &[u8], version: u64) {
        let mut src = data.to_vec();
        // SAFETY: `src` is 4 KiB, alive and untouched until the completion below arrived.
        let src_buf = unsafe { PageBuf::new(src.as_mut_ptr()) }.expect("non-null");
        self.sink.done.lock().unwrap().clear();
        self.store
            .write(&[WriteReq {
                page,
                src: src_buf,
                version: Version(version),
            }])
            .expect("write submitted");
        let mut done = self.sink.done.lock().unwrap();
        while done.is_empty() {
            done = self.sink.cv.wait(done).unwrap();
        }
        assert_eq!(done[0].status, Status::Ok, "write-back of page {page}");
    }

    /// Reads `page` expecting `version` on the calling thread (the demand path): its status,
    /// the copy that answered, and the bytes that landed.
    fn read(&self, page: u64, version: u64) -> (Status, Replica, Vec<u8>) {
        let mut dst = vec![0xeeu8; PAGE_SIZE];
        // SAFETY: `dst` is 4 KiB, alive and untouched until `read_now` returns.
        let dst_buf = unsafe { PageBuf::new(dst.as_mut_ptr()) }.expect("non-null");
        let (status, replica) = self
            .store
            .read_now(&ReadReq {
                page,
                priority: Priority::Demand,
                dst: dst_buf,
                version: Version(version),
            })
            .expect("the page store reads on the calling thread");
        (status, replica, dst)
    }
}

fn key() -> PageKey {
    PageKey::from_bytes([0x42; 32])
}

/// The four pages a misbehaving server serves wrong, one per slab (so that each is caught on
/// its own: a caught replica leaves its slab), with the version each read expects.
const FLIPPED: u64 = 0;
const OTHER_PAGE: u64 = 1024;
const OLD: u64 = 2048;
const OTHER_VM: u64 = 3072;

/// Writes the pages the misbehaviours need, then makes server `bad` misbehave on each.
/// Returns the (page, version) pairs a correct read must deliver.
fn misbehave(vm: &Vm, servers: &[SocketAddr], bad: &ServerHandle) -> Vec<(u64, u64)> {
    let v = |p: u64| 1000 + p;
    for p in [FLIPPED, OTHER_PAGE, OTHER_PAGE + 1, OLD, OTHER_VM] {
        vm.write(p, &page(NS, p, 1), v(p));
    }
    // Another page number's page: same version, so only the page number tells them apart.
    vm.write(OTHER_PAGE + 1, &page(NS, OTHER_PAGE + 1, 1), v(OTHER_PAGE));
    let store = bad.store();
    // 1. A bit flipped in the stored ciphertext, the crc32c fixed.
    let mut s = store.stored_page(NS, FLIPPED).expect("stored");
    s.data[100] ^= 0x04;
    s.fix_crc();
    assert_eq!(s.crc, wire_crc(&s.seal, &s.data[..]));
    assert!(store.overwrite_page(NS, FLIPPED, &s));
    // 2. Another page number's page.
    let s = store.stored_page(NS, OTHER_PAGE + 1).expect("stored");
    assert!(store.overwrite_page(NS, OTHER_PAGE, &s));
    // 3. An older version of the page: kept, the page written again, the old one put back.
    let old: StoredPage = store.stored_page(NS, OLD).expect("stored");
    vm.write(OLD, &page(NS, OLD, 2), v(OLD) + 1);
    assert!(store.overwrite_page(NS, OLD, &old));
    // 4. Another VM's page: the same page number and version, sealed under the same key
    //    (another VM holding this VM's key file: the worst case).
    let other = Vm::new(servers, OTHER_NS, Some(&key()));
    other.write(OTHER_VM, &page(OTHER_NS, OTHER_VM, 1), v(OTHER_VM));
    let s = store.stored_page(OTHER_NS, OTHER_VM).expect("stored");
    assert!(store.overwrite_page(NS, OTHER_VM, &s));
    vec![
        (FLIPPED, v(FLIPPED)),
        (OTHER_PAGE, v(OTHER_PAGE)),
        (OLD, v(OLD) + 1),
        (OTHER_VM, v(OTHER_VM)),
    ]
}

fn start(n: usize) -> Vec<ServerHandle> {
    (0..n)
        .map(|_| Server::start(ServerConfig::loopback(1 << 26)).expect("server starts"))
        .collect()
}

#[test]
fn a_forged_misplaced_or_stale_page_fails_over_to_the_replica_that_holds_the_right_one() {
    let servers = start(2);
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let vm = Vm::new(&addrs, NS, Some(&key()));
    // Server 0 is every slab's first replica: each read asks it first.
    let wanted = misbehave(&vm, &addrs, &servers[0]);
    for (k, &(p, version)) in wanted.iter().enumerate() {
        let (status, replica, data) = vm.read(p, version);
        assert_eq!(status, Status::Ok, "page {p}");
        assert_eq!(replica, Replica(1), "page {p}: the good replica answered");
        let expect = if p == OLD {
            page(NS, p, 2)
        } else {
            page(NS, p, 1)
        };
        assert!(data == expect, "page {p}: wrong content delivered");
        assert_eq!(vm.store.client().unauthentic_reads(), k as u64 + 1);
    }
    let st = vm.store.client().stats();
    assert_eq!(st.read_failovers, 4, "{st:?}");
    assert!(
        st.replicas_rejected >= 4,
        "server 0 left every slab: {st:?}"
    );
}

#[test]
fn a_forged_misplaced_or_stale_page_with_no_replica_left_is_lost_never_delivered() {
    let servers = start(1);
    let addrs = [servers[0].addr()];
    let vm = Vm::new(&addrs, NS, Some(&key()));
    let wanted = misbehave(&vm, &addrs, &servers[0]);
    for (k, &(p, version)) in wanted.iter().enumerate() {
        let (status, replica, data) = vm.read(p, version);
        // Absent with no copy to blame: the engine makes the page LOST and a guest touching
        // it stops the VM with MemoryLost (exit status 74, naming the page).
        assert_eq!(status, Status::Absent, "page {p}");
        assert_eq!(replica, Replica::NONE, "page {p}");
        // Nothing of what the server sent stays where the guest's page would be.
        assert!(data.iter().all(|&b| b == 0), "page {p}: bytes left behind");
        assert_eq!(vm.store.client().unauthentic_reads(), k as u64 + 1);
    }
    // The pages the server did not touch still read right.
    let (status, _, data) = vm.read(OTHER_PAGE + 1, 1000 + OTHER_PAGE);
    assert_eq!(status, Status::Ok);
    assert!(data == page(NS, OTHER_PAGE + 1, 1));
}

/// 64 bytes no page holds by chance.
fn marker() -> [u8; 64] {
    std::array::from_fn(|i| (i as u8).wrapping_mul(37) ^ 0xa5)
}

fn holds(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Writes 64 pages each filled with the marker, dumps the server's store and says whether any
/// stored byte sequence (data or seal) holds the marker.
fn marker_in_store(key: Option<&PageKey>) -> bool {
    let servers = start(1);
    let vm = Vm::new(&[servers[0].addr()], NS, key);
    let m = marker();
    let content: Vec<u8> = m.iter().copied().cycle().take(PAGE_SIZE).collect();
    for p in 0..64 {
        vm.write(p, &content, 7 + p);
    }
    for p in [0, 63] {
        let (status, _, data) = vm.read(p, 7 + p);
        assert_eq!(status, Status::Ok);
        assert!(data == content, "page {p} reads back as written");
    }
    let store = servers[0].store();
    let pages = store.stored_pages(NS);
    assert_eq!(pages.len(), 64);
    pages.iter().any(|&p| {
        let s = store.stored_page(NS, p).expect("stored");
        holds(&s.data[..], &m) || holds(&s.seal, &m[..s.seal.len()])
    })
}

#[test]
fn a_dump_of_the_store_holds_no_copy_of_a_marker_the_vm_wrote_into_every_page() {
    assert!(
        !marker_in_store(Some(&key())),
        "a sealed page left the marker readable on the server"
    );
    // The same dump does find it when pages are not sealed (--page-encryption off).
    assert!(marker_in_store(None));
}

/// The key id a stored page's seal names (its first 4 bytes).
fn stored_key_id(server: &ServerHandle, p: u64) -> [u8; 4] {
    let s = server.store().stored_page(NS, p).expect("stored");
    [s.seal[0], s.seal[1], s.seal[2], s.seal[3]]
}

/// A key rotation through the page store: pages written after it are sealed under the new
/// key on every replica while pages of both keys read back; re-sealing every old page leaves
/// none under the old key on any server; after the old key is dropped every page still reads,
/// and a copy under the old key put back by the server is refused (never delivered).
#[test]
fn a_rotation_reseals_every_old_page_and_a_page_under_the_dropped_key_is_refused() {
    let servers = start(2);
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let (old, new) = (key(), PageKey::from_bytes([0x43; 32]));
    let vm = Vm::new(&addrs, NS, Some(&old));
    let v = |p: u64| 500 + p;
    for p in 0..32 {
        vm.write(p, &page(NS, p, 1), v(p));
    }
    let under_old = servers[0].store().stored_page(NS, 5).expect("stored");
    let keys = vm.store.client().keys().expect("sealing").clone();
    assert_eq!(keys.rotate(new.clone()), Ok(old.id()));
    for p in 32..48 {
        vm.write(p, &page(NS, p, 1), v(p));
    }
    for s in &servers {
        assert!((0..32).all(|p| stored_key_id(s, p) == old.id().0));
        assert!((32..48).all(|p| stored_key_id(s, p) == new.id().0));
    }
    for p in 0..48 {
        let (status, _, data) = vm.read(p, v(p));
        assert_eq!(status, Status::Ok, "page {p} under either key");
        assert!(data == page(NS, p, 1), "page {p}");
    }
    for p in 0..48 {
        assert_eq!(
            vm.store.reseal(p, Version(v(p))),
            Ok(farvm_memclient::Resealed::Written)
        );
    }
    assert_eq!(
        vm.store.reseal(4000, Version(1)),
        Ok(farvm_memclient::Resealed::Absent),
        "a page never written has nothing to re-seal"
    );
    for s in &servers {
        let left = (0..48)
            .filter(|&p| stored_key_id(s, p) == old.id().0)
            .count();
        assert_eq!(left, 0, "pages under the old key left on {}", s.addr());
    }
    assert_eq!(keys.drop_previous(), Some(old.id()));
    for p in 0..48 {
        let (status, _, data) = vm.read(p, v(p));
        assert_eq!(status, Status::Ok, "page {p} after the drop");
        assert!(data == page(NS, p, 1), "page {p}");
    }
    assert_eq!(vm.store.client().unauthentic_reads(), 0);
    // Both servers put back page 5's copy under the dropped key: it is refused, not installed.
    for s in &servers {
        assert!(s.store().overwrite_page(NS, 5, &under_old));
    }
    let (status, _, data) = vm.read(5, v(5));
    assert_eq!(status, Status::Absent);
    assert!(data.iter().all(|&b| b == 0));
    assert!(vm.store.client().unauthentic_reads() >= 1);
}
