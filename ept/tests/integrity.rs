//! Integrity under memory pressure: a seeded pattern over a large guest region with a small local
//! budget, rewritten and verified over many eviction / refetch cycles, every page, every word.
//!
//! Size and passes: `FARVM_EPT_INTEGRITY_MIB` (default 256 in release builds, 32 in debug
//! builds; 1024 for the 1 GiB run) and `FARVM_EPT_INTEGRITY_PASSES` (default 10).

mod common;

use std::time::Instant;

use common::{Vm, WORDS};
use farvm_ept::memstore::MemStoreConfig;
use farvm_ept::{Budget, PAGE_SIZE};

fn env_u64(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
        Err(_) => default,
    }
}

/// Two "vCPU" threads own alternating 2 MiB chunks; one walks its pages forwards, the other
/// with a stride, so both the stream and the irregular paths of the prefetcher are exercised.
fn run_passes(vm: &Vm, passes: u64, seed: u64) {
    let g = vm.guest();
    let chunk = (2 << 20) / PAGE_SIZE as u64;
    for pass in 0..passes {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for t in 0..2u64 {
                s.spawn(move || {
                    let mine: Vec<u64> = (0..g.pages).filter(|p| (p / chunk) % 2 == t).collect();
                    let n = mine.len();
                    for i in 0..n {
                        let p = if t == 0 { mine[i] } else { mine[(i * 7) % n] };
                        if pass > 0 {
                            if let Some((w, got, want)) = g.check(p, seed + pass - 1) {
                                panic!(
                                    "pass {pass}: page {p} word {w}: got {got:#x}, want {want:#x}"
                                );
                            }
                        } else {
                            assert_eq!(g.load(p, (p as usize) % WORDS), 0, "fresh page {p}");
                        }
                        g.fill(p, seed + pass);
                    }
                });
            }
        });
        let s = vm.engine.stats();
        eprintln!(
            "pass {pass}: {:.2}s, resident {}/{}, demand faults {}, prefetch injected {} staged {} \
             marker hits {}, evictions {} (dirty {}), fault p50 {} us p99 {} us",
            t0.elapsed().as_secs_f64(),
            s.resident_pages,
            s.budget_pages,
            s.counters.demand_faults,
            s.counters.prefetch_injected,
            s.counters.prefetch_staged,
            s.counters.prefetch_marker_hits,
            s.counters.evictions,
            s.counters.evict_dirty,
            s.fault_service.p50 / 1000,
            s.fault_service.p99 / 1000,
        );
        assert!(s.resident_pages <= s.budget_pages);
    }
    // Final verification of every page through the VMM path too.
    let mut buf = vec![0u8; PAGE_SIZE];
    for p in 0..g.pages {
        vm.engine
            .read_bytes(p * PAGE_SIZE as u64, &mut buf)
            .unwrap();
        for w in 0..WORDS {
            let got = u64::from_ne_bytes(buf[w * 8..w * 8 + 8].try_into().unwrap());
            assert_eq!(
                got,
                common::pattern(seed + passes - 1, p, w),
                "final page {p} word {w}"
            );
        }
    }
}

fn prefetcher() -> Box<dyn farvm_prefetch::Prefetcher> {
    farvm_prefetch::registry::build(
        farvm_prefetch::registry::DEFAULT,
        &farvm_prefetch::registry::Config::default(),
    )
    .expect("the default prefetcher builds")
}

#[test]
fn seeded_pattern_survives_ten_eviction_cycles_at_25_percent() {
    // 256 MiB in release (CI); a debug build is ~20x slower per word, so it defaults smaller.
    let mib = env_u64(
        "FARVM_EPT_INTEGRITY_MIB",
        if cfg!(debug_assertions) { 32 } else { 256 },
    );
    let passes = env_u64("FARVM_EPT_INTEGRITY_PASSES", 10).max(2);
    let vm = Vm::with(
        mib,
        Budget::Percent(25.0),
        prefetcher(),
        MemStoreConfig::default(),
        |_| {},
    );
    let t0 = Instant::now();
    run_passes(&vm, passes, 0x5EED);
    let s = vm.engine.stats();
    let pages = vm.pages;
    eprintln!(
        "{mib} MiB x {passes} passes in {:.1}s: {:?}",
        t0.elapsed().as_secs_f64(),
        s.counters
    );
    let refetched = s.counters.remote_reads_demand + s.counters.remote_reads_prefetch;
    assert!(
        s.counters.evictions >= (passes - 1) * (pages - s.budget_pages),
        "every page must go through an eviction per pass: {} evictions",
        s.counters.evictions
    );
    assert!(
        refetched >= (passes - 1) * (pages - s.budget_pages),
        "and come back: {refetched} reads"
    );
    assert_eq!(vm.engine.errors_total(), 0, "{:?}", vm.engine.take_errors());
}

#[test]
fn stress_at_10_percent_with_vmm_accesses_and_store_latency() {
    let store = MemStoreConfig {
        demand_latency: std::time::Duration::from_micros(20),
        prefetch_latency: std::time::Duration::from_micros(50),
        write_latency: std::time::Duration::from_micros(20),
    };
    let vm = Vm::with(64, Budget::Percent(10.0), prefetcher(), store, |c| {
        c.evict_batch = 128
    });
    run_passes(&vm, 3, 0xC0FFEE);
    assert_eq!(vm.engine.errors_total(), 0, "{:?}", vm.engine.take_errors());
}
