//! Bad input from the guest side of the agent ABI: whatever a guest writes into its agent slot
//! (any magic, generation, pid, CR3) and into the pages that CR3 names as page tables (entries
//! pointing anywhere, huge-page bits, loops), the engine attributes, walks and prefetches
//! without panicking, without reading outside guest memory (a read there would fault the test
//! process) and without losing a byte of the guest's data.

mod common;

use std::sync::Arc;

use common::{gettid, Recorder, Vm};
use farvm_ept::memstore::{MemStore, MemStoreConfig};
use farvm_ept::translate::{GuestPaging, VirtualPages};
use farvm_ept::{Budget, EngineConfig, EngineParts, PAGE_SIZE};
use farvm_guest_agent::slot::SLOT_MAGIC;
use proptest::prelude::*;

const MIB: u64 = 8;
const PAGES: u64 = MIB << 8;
const SLOT_PAGE: u64 = 1;

/// An engine learning over a Linux guest's virtual pages (the page-table walker on), with a
/// next-4 prefetcher whose candidates go back through the walker.
fn vm() -> Vm {
    let store = MemStore::new(MemStoreConfig::default());
    let mut cfg = EngineConfig::new(MIB << 20);
    cfg.budget = Budget::Percent(25.0);
    let mut parts = EngineParts::new(store.clone(), Box::new(Recorder::new(4, 2)));
    parts.page_space = Box::new(VirtualPages::with_paging(Arc::new(GuestPaging::new(true))));
    Vm::start(cfg, parts, store)
}

/// A page-table entry: mostly present entries pointing into RAM (some huge, some user), or
/// anything at all.
fn entry() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => (0..PAGES, 0u64..0x200).prop_map(|(p, flags)| p << 12 | flags | 1),
        1 => any::<u64>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn garbage_in_agent_slots_and_guest_page_tables_never_breaks_the_engine(
        slot in proptest::array::uniform6(any::<u64>()),
        magic_ok in any::<bool>(),
        cr3_page in prop_oneof![Just(None), (0..PAGES).prop_map(Some)],
        tables in proptest::collection::vec((2..PAGES, 2usize..512, entry()), 0..256),
    ) {
        let vm = vm();
        let g = vm.guest();
        // The slot: 48 bytes of garbage, with the right magic half the time and a CR3 inside
        // RAM (with any low bits) some of the time.
        let mut words = slot;
        if magic_ok {
            words[0] = SLOT_MAGIC;
            words[1] &= !1;
        }
        if let Some(p) = cr3_page {
            words[4] = p << 12 | (words[4] & 0xfff) | (words[4] & (1 << 63));
        }
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        vm.engine.write_bytes(SLOT_PAGE * PAGE_SIZE as u64, &bytes).unwrap();
        vm.engine.set_agent_slot(0, SLOT_PAGE * PAGE_SIZE as u64).unwrap();
        // Every page: word 1 says which page it is; then the "page tables" (word 1 is never
        // overwritten).
        let mut want = std::collections::HashMap::new();
        for p in 2..g.pages {
            g.store(p, 1, p + 1);
        }
        for &(p, w, v) in &tables {
            g.store(p, w, v);
            want.insert((p, w), v);
        }
        vm.settle();
        // A vCPU with that slot reads everything back (most of it is remote by now).
        let (tx, rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            tx.send(gettid()).unwrap();
            go_rx.recv().unwrap();
            let firsts: Vec<u64> = (2..g.pages).map(|p| g.load(p, 1)).collect();
            let entries: Vec<((u64, usize), u64)> =
                want.keys().map(|&(p, w)| ((p, w), g.load(p, w))).collect();
            (firsts, entries, want)
        });
        vm.engine.register_vcpu(0, rx.recv().unwrap()).unwrap();
        go_tx.send(()).unwrap();
        let (firsts, entries, want) = t.join().unwrap();
        for (i, v) in firsts.into_iter().enumerate() {
            prop_assert_eq!(v, i as u64 + 3, "page {}", i + 2);
        }
        for (k, v) in entries {
            prop_assert_eq!(v, want[&k], "page {} word {}", k.0, k.1);
        }
        let errors = vm.engine.take_errors();
        prop_assert!(errors.is_empty(), "{:?}", errors);
        let c = vm.engine.counters();
        prop_assert_eq!(c.lost_accesses, 0);
    }
}
