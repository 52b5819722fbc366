//! Anonymous guest RAM (`GuestMemory::Anon`: pages move with UFFDIO_MOVE between the guest
//! view, their staging slots and a pool of free frames): the mechanism's own hazards, whatever
//! `FARVM_GUEST_MEMORY` says. The rest of the suite runs on it with `FARVM_GUEST_MEMORY=anon`.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{none, Vm, WORDS};
use farvm_ept::memstore::MemStoreConfig;
use farvm_ept::{Budget, GuestMemory, PageState, PAGE_SIZE};

fn anon(mib: u64, budget: Budget, store: MemStoreConfig, prefetch: bool) -> Vm {
    let pf = if prefetch {
        farvm_prefetch::registry::build(
            farvm_prefetch::registry::DEFAULT,
            &farvm_prefetch::registry::Config::default(),
        )
        .expect("the default prefetcher builds")
    } else {
        none()
    };
    Vm::with(mib, budget, pf, store, |c| {
        c.guest_memory = GuestMemory::Anon;
        c.prefetch = prefetch;
    })
}

fn slow_writes() -> MemStoreConfig {
    MemStoreConfig {
        demand_latency: Duration::from_micros(20),
        prefetch_latency: Duration::from_micros(40),
        write_latency: Duration::from_micros(300),
    }
}

#[test]
fn guest_writes_racing_the_move_out_and_write_back_are_never_lost() {
    // Eight hot pages written over and over by one thread while another sweeps the rest of
    // guest RAM, so that the hot pages are evicted again and again: moved out, fingerprinted
    // and written back slowly (300 µs) while their writer faults on them and waits.
    let vm = anon(16, Budget::Bytes(1 << 20), slow_writes(), false);
    let g = vm.guest();
    let hot: Vec<u64> = (0..8).map(|i| i * 97 + 5).collect();
    let stop = AtomicBool::new(false);
    let (last, out) = std::thread::scope(|s| {
        let sweeper = s.spawn(|| {
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for p in (0..g.pages).filter(|p| !hot.contains(p)) {
                    g.store(p, 1, round);
                }
                round += 1;
            }
        });
        // Until the hot pages were found out of the guest view (evicted or on their way out)
        // often enough before a write (bounded).
        let mut v = 0u64;
        let mut out = 0u64;
        while v < 20_000 && (v < 400 || out < 200) {
            v += 1;
            for &p in &hot {
                let st = vm.engine.page_state(p * PAGE_SIZE as u64);
                if !matches!(st, Some(PageState::Local { .. })) {
                    out += 1;
                }
                for w in [0, WORDS / 2, WORDS - 1] {
                    g.store(p, w, v ^ p);
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        stop.store(true, Ordering::Relaxed);
        sweeper.join().unwrap();
        (v, out)
    });
    assert!(
        out >= 200,
        "the hot pages were evicted {out} times: too few"
    );
    let mut buf = vec![0u8; PAGE_SIZE];
    for &p in &hot {
        vm.engine
            .read_bytes(p * PAGE_SIZE as u64, &mut buf)
            .unwrap();
        for w in [0, WORDS / 2, WORDS - 1] {
            let got = u64::from_ne_bytes(buf[w * 8..w * 8 + 8].try_into().unwrap());
            assert_eq!(got, last ^ p, "page {p} word {w} (through the VMM path)");
            assert_eq!(g.load(p, w), last ^ p, "page {p} word {w} (guest)");
        }
    }
    // Demand reads come one page at a time: they landed in bounce pages and were installed
    // by a copy (the evicted frames still recycled for them would need a move each).
    let s = vm.engine.stats();
    assert!(s.counters.bounce_landings > 1000, "{:?}", s.counters);
    assert_eq!(vm.engine.errors_total(), 0, "{:?}", vm.engine.take_errors());
}

#[test]
fn prefetched_runs_straddling_evictions_keep_every_page() {
    // One thread scans forwards (prefetched runs land and move in as runs) while another
    // rewrites every third page of the same region behind it: the runs being installed border
    // pages being evicted, moved out and written back.
    let vm = anon(32, Budget::Percent(15.0), slow_writes(), true);
    let g = vm.guest();
    for p in 0..g.pages {
        g.fill(p, 1);
    }
    for pass in 0..3u64 {
        let seed = 1 + pass;
        std::thread::scope(|s| {
            s.spawn(|| {
                for p in 0..g.pages {
                    if p % 3 != 0 {
                        if let Some((w, got, want)) = g.check(p, seed) {
                            panic!("pass {pass}: page {p} word {w}: got {got:#x} want {want:#x}");
                        }
                        g.fill(p, seed + 1);
                    }
                }
            });
            s.spawn(|| {
                for p in (0..g.pages).step_by(3) {
                    if let Some((w, got, want)) = g.check(p, seed) {
                        panic!("pass {pass}: page {p} word {w}: got {got:#x} want {want:#x}");
                    }
                    g.fill(p, seed + 1);
                }
            });
        });
    }
    let s = vm.engine.stats();
    assert!(s.counters.prefetch_injected > 1000, "{:?}", s.counters);
    assert!(s.counters.evictions > 10_000, "{:?}", s.counters);
    // Runs landed in the pool's free frames (the evicted pages' frames), not only in pages the
    // kernel allocated. How many depends on the evictor keeping the pool filled, which a loaded
    // host delays (5,552 of ~24,700 reads once, under a full test suite and two VMs).
    assert!(s.counters.pool_landings > 1_000, "{:?}", s.counters);
    for p in 0..g.pages {
        assert_eq!(g.check(p, 4), None, "final page {p}");
    }
    assert_eq!(vm.engine.errors_total(), 0, "{:?}", vm.engine.take_errors());
}

#[test]
fn staged_markers_wait_in_bounce_pages_and_none_is_lost_or_leaked() {
    // Every fault proposes the next 8 pages, the last a marker, and one prefetch in 64 is a
    // probe: each scan of 16 MiB at 25% local stages hundreds of pages in bounce pages, some
    // touched (installed by a copy), some evicted untouched (their bounce pages freed).
    let vm = Vm::with(
        16,
        Budget::Percent(25.0),
        Box::new(common::Recorder::new(8, 8)),
        MemStoreConfig::default(),
        |c| c.guest_memory = GuestMemory::Anon,
    );
    let g = vm.guest();
    for p in 0..g.pages {
        g.fill(p, 1);
    }
    // Read and rewrite (dirty pages, written back), then read twice more without touching
    // the pages found staged, which are evicted untouched.
    let mut untouched = 0u64;
    for (pass, seed, rewrite) in [(0, 1, true), (1, 2, false), (2, 2, false)] {
        for p in 0..g.pages {
            if pass > 0 && vm.engine.page_state(p * PAGE_SIZE as u64) == Some(PageState::Staged) {
                untouched += 1;
                continue;
            }
            if let Some((w, got, want)) = g.check(p, seed) {
                panic!("pass {pass}: page {p} word {w}: got {got:#x} want {want:#x}");
            }
            if rewrite {
                g.fill(p, seed + 1);
            }
        }
    }
    let s = vm.engine.stats();
    assert!(s.counters.prefetch_staged > 1_000, "{:?}", s.counters);
    assert!(s.counters.prefetch_marker_hits > 200, "{:?}", s.counters);
    assert!(
        s.counters.bounce_landings >= s.counters.prefetch_staged / 2,
        "{:?}",
        s.counters
    );
    assert!(untouched > 100, "{untouched} staged pages left untouched");
    // At rest the frame counter matches the frames really held, bounce pages included: none
    // leaked by a staged page evicted untouched or installed.
    vm.settle();
    vm.assert_frames_match_the_counter_at_rest();
    for p in 0..g.pages {
        assert_eq!(g.check(p, 2), None, "final page {p}");
    }
    assert_eq!(vm.engine.errors_total(), 0, "{:?}", vm.engine.take_errors());
}

#[test]
fn partially_failed_read_batches_lose_no_page_and_no_frame() {
    // Prefetch batches whose reads partly fail: the failed pages give up the pool frames they
    // were to land in (their retries, or later reads, land in others intact), and the pool
    // goes on handing out frames: no slot stays held by a read that ended.
    let vm = anon(16, Budget::Bytes(2 << 20), MemStoreConfig::default(), true);
    let g = vm.guest();
    for p in 0..g.pages {
        g.fill(p, 7);
    }
    vm.settle();
    let mut landed = vm.engine.stats().counters.pool_landings;
    for round in 0..4u64 {
        vm.store.fail_next_reads(3 + round * 5);
        let seed = 7 + round;
        for p in 0..g.pages {
            if let Some((w, got, want)) = g.check(p, seed) {
                panic!("round {round}: page {p} word {w}: got {got:#x} want {want:#x}");
            }
            g.fill(p, seed + 1);
        }
        let now = vm.engine.stats().counters.pool_landings;
        assert!(
            now - landed > g.pages / 2,
            "round {round}: only {} of {} reads landed in pool frames",
            now - landed,
            g.pages
        );
        landed = now;
    }
    let s = vm.engine.stats();
    assert!(s.counters.store_errors >= 3, "{:?}", s.counters);
    // Frames are not leaked: guest view and staging slots hold no more than the budget and
    // the failed reads' slots.
    let resident = vm.engine.resident_by_mincore().unwrap();
    assert!(
        resident <= s.budget_pages + 64,
        "{resident} frames for a budget of {} pages",
        s.budget_pages
    );
}

#[test]
fn pages_the_kernel_refuses_to_move_out_stay_resident_and_eviction_goes_on() {
    // A fork that shares guest RAM (MADV_DOFORK) leaves every mapped page no longer exclusive
    // to this process, and UFFDIO_MOVE refuses to move such a page (EBUSY) until it is written
    // again. Pages written afterwards become movable again; a few left unwritten must be kept
    // resident after a bounded number of refusals, while eviction goes on with the others.
    let vm = anon(16, Budget::Bytes(2 << 20), MemStoreConfig::default(), false);
    let g = vm.guest();
    for p in 0..g.pages {
        g.fill(p, 1);
    }
    vm.settle();
    let local = |p: u64| {
        matches!(
            vm.engine.page_state(p * PAGE_SIZE as u64),
            Some(PageState::Local { .. })
        )
    };
    // Up to 16 mapped pages (read now, so mapped), never written again: they stay shared.
    let kept: Vec<u64> = (0..g.pages)
        .rev()
        .filter(|&p| local(p) && g.check(p, 1).is_none())
        .take(16)
        .collect();
    assert!(!kept.is_empty(), "no resident page after the fill");
    let len = g.pages as usize * PAGE_SIZE;
    let advise = |advice| {
        // SAFETY: advisory call on the engine's guest view, a mapping that lives as long as
        // `vm`; DOFORK and DONTFORK change only what a fork copies.
        let r = unsafe { libc::madvise(vm.base as *mut libc::c_void, len, advice) };
        assert_eq!(r, 0, "madvise: {}", std::io::Error::last_os_error());
    };
    advise(libc::MADV_DOFORK);
    // SAFETY: the child calls only _exit, which is async-signal-safe.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: leaving the forked child at once.
        unsafe { libc::_exit(0) };
    }
    assert!(pid > 0, "fork: {}", std::io::Error::last_os_error());
    let mut status = 0;
    // SAFETY: reaping the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    advise(libc::MADV_DONTFORK);
    // Write the other resident pages first (no fault: the evictor stays idle), which makes
    // them exclusive again.
    let others: Vec<u64> = (0..g.pages).filter(|p| !kept.contains(p)).collect();
    let evicted = vm.engine.stats().counters.evictions;
    let (resident, remote): (Vec<u64>, Vec<u64>) = others.iter().partition(|&&p| local(p));
    for &p in resident.iter().chain(&remote) {
        g.fill(p, 2);
    }
    // Read and rewrite them, sweeping guest RAM eight times its budget over, until the kept
    // pages were refused often enough (bounded).
    let mut pass = 0u64;
    while pass == 0 || pass < 40 && vm.engine.stats().counters.evict_unmovable < kept.len() as u64 {
        pass += 1;
        for &p in &others {
            if let Some((w, got, want)) = g.check(p, pass + 1) {
                panic!("pass {pass}: page {p} word {w}: got {got:#x} want {want:#x}");
            }
            g.fill(p, pass + 2);
        }
    }
    let s = vm.engine.stats();
    assert_eq!(
        s.counters.evict_unmovable,
        kept.len() as u64,
        "pages kept resident after {pass} passes: {:?}",
        s.counters
    );
    assert!(
        s.counters.evictions - evicted > g.pages * 3 / 2,
        "eviction stopped: {:?}",
        s.counters
    );
    for &p in &kept {
        assert!(local(p), "kept page {p} was evicted");
        assert_eq!(g.check(p, 1), None, "kept page {p}");
    }
    assert_eq!(vm.engine.errors_total(), 0, "{:?}", vm.engine.take_errors());
}

#[test]
fn a_victim_whose_frame_vanished_from_the_guest_view_is_lost_loudly_never_written_back() {
    // A frame taken out of the guest view behind the engine's back (here: MADV_DONTNEED by
    // this process) leaves a page the engine believes mapped with no data anywhere. Its
    // eviction must not fingerprint, write back and free whatever an empty slot reads
    // (zeros, which the guest would then read back "correctly"): the page becomes LOST.
    let vm = anon(16, Budget::Bytes(2 << 20), MemStoreConfig::default(), false);
    let g = vm.guest();
    for p in 0..g.pages {
        g.fill(p, 1);
    }
    vm.settle();
    let state = |p: u64| vm.engine.page_state(p * PAGE_SIZE as u64);
    let local = |p: u64| matches!(state(p), Some(PageState::Local { .. }));
    let victim = (0..g.pages)
        .rev()
        .find(|&p| local(p) && g.check(p, 1).is_none() && local(p))
        .expect("a resident page after the fill");
    // SAFETY: one page of the engine's guest view, which lives as long as `vm`; dropping its
    // frame is the fault under test (nothing else touches this page meanwhile).
    let r = unsafe {
        libc::madvise(
            (vm.base + victim as usize * PAGE_SIZE) as *mut libc::c_void,
            PAGE_SIZE,
            libc::MADV_DONTNEED,
        )
    };
    assert_eq!(r, 0, "madvise: {}", std::io::Error::last_os_error());
    // Sweep the other pages until the victim is evicted (bounded).
    let mut pass = 0u64;
    while local(victim) && pass < 40 {
        pass += 1;
        for p in (0..g.pages).filter(|&p| p != victim) {
            if let Some((w, got, want)) = g.check(p, pass) {
                panic!("pass {pass}: page {p} word {w}: got {got:#x} want {want:#x}");
            }
            g.fill(p, pass + 1);
        }
    }
    let s = vm.engine.stats();
    assert_eq!(
        state(victim),
        Some(PageState::Lost),
        "after {pass} passes: {:?}",
        s.counters
    );
    assert_eq!(s.counters.evict_vanished, 1, "{:?}", s.counters);
    let errors = vm.engine.take_errors();
    assert!(
        errors.iter().any(|e| matches!(e,
            farvm_ept::error::EngineError::FrameVanished { gpa } if *gpa == victim * PAGE_SIZE as u64)),
        "{errors:?}"
    );
}
