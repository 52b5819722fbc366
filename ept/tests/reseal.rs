//! A key rotation's re-seal sweep (`reseal.rs`, docs/sealing.md "Rotation") against a store
//! that records under which key generation each stored page was last written: while the guest
//! keeps writing and the evictor keeps writing back, the sweep re-seals every stored page with
//! the version of the content actually stored, tells the store once no page is left under
//! the old generation, and the guest's data stays intact.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use farvm_ept::memstore::{MemStore, MemStoreConfig};
use farvm_ept::store::{
    CompletionSink, GuestPage, ReadReq, RemoteStore, Replica, Status, StoreError, Version, WriteReq,
};
use farvm_ept::{Budget, EngineConfig, EngineParts};

/// A [`MemStore`] whose pages carry the key generation they were written under.
struct KeyedStore {
    inner: Arc<MemStore>,
    /// The current generation; odd while a rotation runs (as `farvm_seal::KeyRing`).
    generation: AtomicU64,
    written_under: Mutex<HashMap<GuestPage, u64>>,
    /// Re-seals whose version was not the stored content's.
    wrong_versions: AtomicU64,
    /// Set by `reseal_finished`: pages still under an older generation then.
    left_at_finish: Mutex<Option<usize>>,
    finished: AtomicBool,
}

impl KeyedStore {
    fn rotate(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    fn current(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

impl RemoteStore for KeyedStore {
    fn attach(&self, sink: Arc<dyn CompletionSink>) -> Result<(), StoreError> {
        self.inner.attach(sink)
    }
    fn read(&self, reqs: &[ReadReq]) -> Result<(), StoreError> {
        self.inner.read(reqs)
    }
    fn write(&self, reqs: &[WriteReq]) -> Result<(), StoreError> {
        let now = self.current();
        let mut m = self.written_under.lock().unwrap();
        for w in reqs {
            m.insert(w.page, now);
        }
        drop(m);
        self.inner.write(reqs)
    }
    fn discard(&self, pages: &[GuestPage]) -> Result<(), StoreError> {
        self.inner.discard(pages)
    }
    fn read_now(&self, req: &ReadReq) -> Option<(Status, Replica)> {
        self.inner.read_now(req)
    }
    fn reject(&self, page: GuestPage, replica: Replica) -> bool {
        self.inner.reject(page, replica)
    }
    fn reseal_wanted(&self) -> bool {
        self.current() % 2 == 1
    }
    fn reseal(&self, page: GuestPage, version: Version) -> Result<bool, StoreError> {
        let Some(data) = self.inner.get(page) else {
            return Ok(false);
        };
        // SAFETY: `data` is a 4 KiB buffer this function owns.
        let fp = unsafe { farvm_ept::hash::of_page(data.as_ptr()) };
        if Version(fp as u64) != version {
            self.wrong_versions.fetch_add(1, Ordering::SeqCst);
        }
        self.written_under
            .lock()
            .unwrap()
            .insert(page, self.current());
        Ok(true)
    }
    fn reseal_finished(&self) {
        let now = self.current();
        let left = self
            .written_under
            .lock()
            .unwrap()
            .iter()
            .filter(|(&p, &g)| g != now && self.inner.get(p).is_some())
            .count();
        *self.left_at_finish.lock().unwrap() = Some(left);
        // The previous key is dropped: the generation turns even again.
        self.generation.fetch_add(1, Ordering::SeqCst);
        self.finished.store(true, Ordering::SeqCst);
    }
}

#[test]
fn the_sweep_reseals_every_stored_page_while_the_guest_writes_and_then_ends_the_rotation() {
    let inner = MemStore::new(MemStoreConfig::default());
    let store = Arc::new(KeyedStore {
        inner: inner.clone(),
        generation: AtomicU64::new(0),
        written_under: Mutex::new(HashMap::new()),
        wrong_versions: AtomicU64::new(0),
        left_at_finish: Mutex::new(None),
        finished: AtomicBool::new(false),
    });
    let mut cfg = EngineConfig::new(16 << 20);
    cfg.budget = Budget::Bytes(4 << 20);
    let vm = Vm::start(cfg, EngineParts::new(store.clone(), none()), inner);
    let g = vm.guest();
    for p in 0..g.pages {
        g.fill(p, 1);
    }
    vm.settle();
    assert!(
        vm.store.len() as u64 > g.pages / 2,
        "pages were written back"
    );
    store.rotate();
    // The guest goes on writing every page (new seeds), so the evictor writes back while the
    // sweep runs.
    let writer = std::thread::spawn(move || {
        for round in 2..6 {
            for p in 0..g.pages {
                g.fill(p, round);
            }
        }
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !store.finished.load(Ordering::SeqCst) {
        assert!(
            Instant::now() < deadline,
            "the sweep did not finish: {:?}",
            vm.engine.stats().reseal_left
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    writer.join().unwrap();
    assert_eq!(*store.left_at_finish.lock().unwrap(), Some(0));
    assert_eq!(store.wrong_versions.load(Ordering::SeqCst), 0);
    for p in 0..g.pages {
        assert_eq!(g.check(p, 5), None, "page {p}");
    }
    let s = vm.engine.stats();
    assert_eq!(s.reseal_left, None, "no sweep runs");
    assert_eq!(s.counters.reseal_sweeps, 1);
    assert!(s.counters.resealed_pages > 0, "{:?}", s.counters);
    assert_eq!(vm.engine.errors_total(), 0, "{:?}", vm.engine.take_errors());
}
