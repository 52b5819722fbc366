//! Every prefetcher decides without touching the heap: a counting global allocator watches
//! `on_fault`, `on_hit`, `on_marker_hit` and `forget` on faults from many processes (more than
//! the per-process table holds), scans, strides and random pages.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use farvm_prefetch::{build, names, Candidates, Config};

struct Counting;

thread_local! {
    // Const-initialised, so reading them never allocates. Only the thread that sets ARMED is
    // counted: the test harness allocates on its own threads meanwhile.
    static ARMED: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn note() {
    let _ = ARMED.try_with(|armed| {
        if armed.get() {
            let _ = ALLOCS.try_with(|n| n.set(n.get() + 1));
        }
    });
}

// SAFETY: every method forwards to the system allocator unchanged; the counter only reads and
// writes thread-local cells, which neither allocate nor unwind.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A deterministic mix of patterns: scans, strides, random pages, 100 processes.
fn workload() -> Vec<(u64, u64)> {
    let mut v = Vec::new();
    let mut x = 0x1234_5678u64;
    for i in 0..20_000u64 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let key = i % 100;
        let page = match key % 4 {
            0 => (key << 32) + i,
            1 => (key << 32) + 10 * i,
            2 => (key << 32) + (x >> 40),
            _ => (key << 32) + if i % 2 == 0 { i } else { (1 << 30) - i },
        };
        v.push((key, page));
    }
    v
}

#[test]
fn decisions_do_not_allocate() {
    let faults = workload();
    for &name in names() {
        for per_process in [true, false] {
            let cfg = Config {
                per_process,
                ..Config::default()
            };
            let mut pf = build(name, &cfg).expect("default config builds");
            let mut out = Candidates::new();
            let mut more = Candidates::new();
            ALLOCS.with(|n| n.set(0));
            ARMED.with(|a| a.set(true));
            for (t, &(key, page)) in faults.iter().enumerate() {
                let t = t as u64;
                pf.on_fault(key, page, t, &mut out);
                for i in 0..out.len() {
                    let p = out.as_slice()[i];
                    if out.is_marker(i) {
                        pf.on_marker_hit(key, p, t, &mut more);
                    } else if i % 2 == 0 {
                        pf.on_hit(key, p, t);
                    }
                }
                if t.is_multiple_of(997) {
                    pf.forget(key);
                }
            }
            ARMED.with(|a| a.set(false));
            let n = ALLOCS.with(|n| n.get());
            assert_eq!(
                n,
                0,
                "{name} (per_process {per_process}) allocated {n} times in {} decisions",
                faults.len()
            );
        }
    }
}

#[test]
fn the_counter_counts() {
    ALLOCS.with(|n| n.set(0));
    ARMED.with(|a| a.set(true));
    let v = std::hint::black_box(vec![1u8; 10]);
    ARMED.with(|a| a.set(false));
    drop(v);
    assert_eq!(
        ALLOCS.with(|n| n.get()),
        1,
        "the counting allocator must see allocations"
    );
}
