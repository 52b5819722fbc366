//! Fault-path micro-benchmark: `cargo bench -p farvm-ept --bench fault_path`.
//!
//! Prints four tables, every number measured in this run:
//! 1. the demand-fault steps (uffd read -> store request -> reply -> UFFDIO_CONTINUE -> vCPU
//!    resumes), per-step medians, using the engine's own primitives (the read lands in the
//!    memfd through the alias, `Uffd::continue_range` maps it, as the engine installs) on a
//!    memfd registered MISSING|MINOR, against the kernel-only first touch of an anonymous page
//!    measured in the same run;
//! 2. the whole engine: per-page cost of re-reading evicted memory, no prefetch vs prefetch;
//! 3. how well sampled probes estimate the hit rate of injected prefetches (vs every prefetch
//!    staged = exact), and what probing costs;
//! 4. eviction building blocks per page: fingerprint (the dirty check), zap, free, and landing
//!    a received page in a freed memfd page vs in a resident one;
//! 5. the cold-page policy: CLOCK with refault-distance protection vs plain CLOCK on a
//!    hot/cold random workload (demand faults and time per access);
//! 6. one page cycle (land, install, evict, free) with today's memfd guest RAM against
//!    anonymous guest RAM whose pages move in and out of a pool of staging pages with
//!    `UFFDIO_MOVE`, one page per call and in runs of 64 (see `anon_cycle`);
//! 7. installing runs of 1-64 received pages into anonymous guest RAM with `UFFDIO_MOVE` from
//!    pool slots against `UFFDIO_COPY` from a landing ring, with a thread touching memory on
//!    the other CPU (TLB shootdowns), and the eviction's options (see `landing.rs`).
//!
//! `FARVM_BENCH_PAGES` (default 4096) sets the sample size of table 1; `FARVM_BENCH_TABLES`
//! (default `1,2,3,4,5,6,7`) selects tables.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use farvm_ept::memstore::{MemStore, MemStoreConfig};
use farvm_ept::store::{Completion, CompletionSink, PageBuf, Priority, ReadReq, RemoteStore};
use farvm_ept::sys::mem::GuestRam;
use farvm_ept::sys::poll::Epoll;
use farvm_ept::sys::uffd::{self, Fault, RawMsg, Uffd, MAX_EVENTS};
use farvm_ept::{Budget, Engine, EngineConfig, EngineParts, PAGE_SIZE};

fn main() {
    let pages: u64 = std::env::var("FARVM_BENCH_PAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4096);
    println!("# farvm-ept fault-path benchmark ({pages} pages per configuration)\n");
    let tables = std::env::var("FARVM_BENCH_TABLES").unwrap_or_else(|_| "1,2,3,4,5,6,7".into());
    let want = |t: &str| tables.split(',').any(|x| x.trim() == t);
    if want("1") {
        steps_table(pages);
    }
    if want("2") {
        engine_table();
    }
    if want("3") {
        probe_table();
    }
    if want("4") {
        evict_table();
    }
    if want("5") {
        policy_table();
    }
    if want("6") {
        cycle::table();
    }
    if want("7") {
        landing::table();
    }
}

#[path = "fault_path/cycle.rs"]
mod cycle;
#[path = "fault_path/landing.rs"]
mod landing;

fn median(v: &mut [u64]) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

fn pct(v: &mut [u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[((v.len() - 1) as f64 * q) as usize]
}

/// Records when the store's reply arrives (inline completion).
struct StampSink {
    epoch: Instant,
    reply_ns: AtomicU64,
}

impl CompletionSink for StampSink {
    fn complete(&self, _batch: &[Completion]) {
        self.reply_ns
            .store(self.epoch.elapsed().as_nanos() as u64, Ordering::SeqCst);
    }
}

/// Per-page timestamps of one demand fault, ns since the epoch.
#[derive(Default, Clone, Copy)]
struct Stamps {
    touch: u64,
    read: u64,
    request: u64,
    reply: u64,
    installed: u64,
    resumed: u64,
}

fn run_steps(pages: u64) -> Vec<Stamps> {
    let epoch = Instant::now();
    let now = move || epoch.elapsed().as_nanos() as u64;
    let ram = Arc::new(GuestRam::new(pages as usize * PAGE_SIZE).expect("memfd"));
    let uffd = Arc::new(
        Uffd::open(
            uffd::feature::THREAD_ID | uffd::feature::MISSING_SHMEM | uffd::feature::MINOR_SHMEM,
        )
        .expect("userfaultfd (run as root)"),
    );
    uffd.register(
        ram.guest_base(),
        ram.len() as u64,
        uffd::mode::MISSING | uffd::mode::MINOR,
    )
    .expect("register");
    // The store holds every page's data (as after a write-back).
    let store = MemStore::new(MemStoreConfig::default());
    let sink = Arc::new(StampSink {
        epoch,
        reply_ns: AtomicU64::new(0),
    });
    store.attach(sink.clone()).expect("attach");
    {
        // Seed the store through its write path from a private buffer.
        let mut buf = vec![0x5Au8; PAGE_SIZE];
        for p in 0..pages {
            buf[..8].copy_from_slice(&p.to_ne_bytes());
            // SAFETY: `buf` outlives the synchronous (zero-latency) write.
            let b = unsafe { PageBuf::new(buf.as_mut_ptr()) }.unwrap();
            store
                .write(&[farvm_ept::store::WriteReq {
                    page: p,
                    src: b,
                    version: farvm_ept::store::Version::UNKNOWN,
                }])
                .unwrap();
        }
    }
    let stamps = Arc::new(Mutex::new(vec![Stamps::default(); pages as usize]));
    let base = ram.guest_base();
    let done = Arc::new(AtomicU64::new(0));
    let handler = {
        let (ram, uffd, stamps, done, sink) = (
            ram.clone(),
            uffd.clone(),
            stamps.clone(),
            done.clone(),
            sink.clone(),
        );
        let store = store.clone();
        std::thread::spawn(move || {
            let ep = Epoll::new().unwrap();
            ep.add(uffd.raw_fd(), 0).unwrap();
            let mut raw = [RawMsg::default(); MAX_EVENTS];
            let mut faults = [Fault::default(); MAX_EVENTS];
            while done.load(Ordering::SeqCst) < pages {
                if ep.wait(50).unwrap() == 0 {
                    continue;
                }
                let n = uffd.read_faults(&mut raw, &mut faults).unwrap();
                let t_read = now();
                for f in &faults[..n] {
                    let p = (f.address - base) / PAGE_SIZE as u64;
                    let t_req = now();
                    // SAFETY: the alias page, owned by this thread until the (inline) completion.
                    let dst = unsafe { PageBuf::new(ram.alias_page(p)) }.unwrap();
                    store
                        .read(&[ReadReq {
                            page: p,
                            priority: Priority::Demand,
                            dst,
                            version: farvm_ept::store::Version::UNKNOWN,
                        }])
                        .unwrap();
                    let t_reply = sink.reply_ns.load(Ordering::SeqCst);
                    let addr = ram.guest_page_addr(p);
                    uffd.continue_range(addr, PAGE_SIZE as u64, true).unwrap();
                    let t_inst = now();
                    let mut s = stamps.lock().unwrap();
                    let e = &mut s[p as usize];
                    e.read = t_read;
                    e.request = t_req;
                    e.reply = t_reply;
                    e.installed = t_inst;
                }
            }
        })
    };
    // The "vCPU": touches each page once, in order.
    for p in 0..pages {
        let t0 = now();
        // SAFETY: in bounds of the registered guest view; the handler resolves the fault.
        let v = unsafe { core::ptr::read_volatile((base + p * PAGE_SIZE as u64) as *const u64) };
        let t1 = now();
        assert_eq!(v, p, "page {p} has the wrong data");
        let mut s = stamps.lock().unwrap();
        s[p as usize].touch = t0;
        s[p as usize].resumed = t1;
        drop(s);
        done.fetch_add(1, Ordering::SeqCst);
    }
    handler.join().unwrap();
    let v = stamps.lock().unwrap().clone();
    v
}

fn kernel_first_touch(pages: u64) -> Vec<u64> {
    let len = pages as usize * PAGE_SIZE;
    // SAFETY: fresh private anonymous mapping, unmapped below.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let mut out = Vec::with_capacity(pages as usize);
    for i in 0..pages as usize {
        let t = Instant::now();
        // SAFETY: in bounds of the mapping; a write fault allocates a zeroed page.
        unsafe { core::ptr::write_volatile((p as *mut u8).add(i * PAGE_SIZE), 1) };
        out.push(t.elapsed().as_nanos() as u64);
    }
    // SAFETY: unmapping what we mapped.
    unsafe { libc::munmap(p, len) };
    out
}

fn steps_table(pages: u64) {
    let mut base = kernel_first_touch(pages);
    let base_med = median(&mut base);
    println!("## 1. Demand fault steps (median ns; in-process store, no network)\n");
    println!(
        "| install | fault->uffd read | read->request | request->reply | reply->installed | installed->vCPU resumes | total (vCPU view) | p99 total | total / kernel first touch |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let s = run_steps(pages);
    let col = |f: &dyn Fn(&Stamps) -> u64| -> Vec<u64> { s.iter().map(f).collect() };
    let mut a = col(&|x| x.read.saturating_sub(x.touch));
    let mut b = col(&|x| x.request.saturating_sub(x.read));
    let mut c = col(&|x| x.reply.saturating_sub(x.request));
    let mut d = col(&|x| x.installed.saturating_sub(x.reply));
    let mut e = col(&|x| x.resumed.saturating_sub(x.installed));
    let mut t = col(&|x| x.resumed.saturating_sub(x.touch));
    let tm = median(&mut t);
    println!(
        "| UFFDIO_CONTINUE (engine) | {} | {} | {} | {} | {} | {} | {} | {:.1}x |",
        median(&mut a),
        median(&mut b),
        median(&mut c),
        median(&mut d),
        median(&mut e),
        tm,
        pct(&mut t, 0.99),
        tm as f64 / base_med.max(1) as f64
    );
    println!(
        "\nBaseline in the same run: kernel first touch of an anonymous page, median {base_med} ns.\n"
    );
}

/// Builds an engine, writes `pages` pages, lets them go remote, then times a sequential re-read.
fn reread(
    prefetcher: &str,
    probe_every: u32,
    stride: u64,
) -> (f64, farvm_ept::Stats, farvm_ept::stats::CounterValues) {
    // Loopback-TCP-like store: the research notes measured a 4 KiB fetch at ~23 us median.
    let store = MemStore::new(MemStoreConfig {
        demand_latency: Duration::from_micros(25),
        prefetch_latency: Duration::from_micros(25),
        write_latency: Duration::from_micros(25),
    });
    let mut cfg = EngineConfig::new(64 << 20);
    cfg.budget = Budget::Percent(25.0);
    cfg.probe_every = probe_every;
    cfg.prefetch = prefetcher != "none";
    let pf =
        farvm_prefetch::registry::build(prefetcher, &farvm_prefetch::registry::Config::default())
            .expect("prefetcher");
    let engine = Engine::start(cfg, EngineParts::new(store, pf)).expect("engine");
    let (base, len) = engine.guest_ram();
    let pages = len / PAGE_SIZE as u64;
    let at = |p: u64| (base + p * PAGE_SIZE as u64) as *mut u64;
    for p in 0..pages {
        // SAFETY: in bounds of guest RAM; faults are resolved by the engine.
        unsafe { core::ptr::write_volatile(at(p), p + 1) };
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while engine.stats().resident_pages > engine.stats().budget_pages - engine.stats().reserve_pages
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    let before = engine.stats().counters;
    let t = Instant::now();
    let mut touched = 0u64;
    let mut p = 0u64;
    for _ in 0..pages {
        // SAFETY: as above.
        let v = unsafe { core::ptr::read_volatile(at(p)) };
        assert_eq!(v, p + 1);
        touched += 1;
        p = (p + stride) % pages;
    }
    let per_page = t.elapsed().as_nanos() as f64 / touched as f64;
    (per_page, engine.stats(), before)
}

fn engine_table() {
    println!(
        "## 2. Whole engine: re-reading 64 MiB at 25% local (store latency 25 us, median of 3)\n"
    );
    println!("| prefetcher | pattern | ns per page (vCPU view) | demand faults | prefetches injected | speed-up vs none |");
    println!("|---|---|---|---|---|---|");
    for (pattern, stride) in [("sequential", 1u64), ("stride 3", 3)] {
        // Median of 3 runs per row: the 2-core host is shared and noisy.
        let med3 = |name: &str| {
            let mut runs: Vec<_> = (0..3)
                .map(|_| reread(name, if name == "none" { 0 } else { 16 }, stride))
                .collect();
            runs.sort_by(|a, b| a.0.total_cmp(&b.0));
            runs.swap_remove(1)
        };
        let none = med3("none");
        let none_ns = none.0;
        for name in ["none", "next-n", "leap+stream"] {
            let (ns, s, b) = if name == "none" {
                none.clone()
            } else {
                med3(name)
            };
            println!(
                "| {name} | {pattern} | {ns:.0} | {} | {} | {:.2}x |",
                s.counters.demand_faults - b.demand_faults,
                s.counters.prefetch_injected - b.prefetch_injected,
                none_ns / ns
            );
        }
    }
    println!();
}

fn probe_table() {
    println!("## 3. Learning the hit rate of injected prefetches (leap+stream, 64 MiB at 25%, 25 us store)\n");
    println!("Exact = every prefetch staged (all hits visible as faults). Probe estimate = hits / staged");
    println!(
        "over the engine's 1-in-N systematic sample; markers = the prefetcher's own markers.\n"
    );
    println!("| sampled | pattern | probe estimate | markers-only rate | exact | ns per page | faults spent on probes |");
    println!("|---|---|---|---|---|---|---|");
    for (pattern, stride) in [("sequential", 1u64), ("stride 3", 3)] {
        let (exact_ns, exact, eb) = reread("leap+stream", 1, stride);
        let exact_acc = probe_rate(&exact, &eb);
        for every in [1u32, 4, 16, 64] {
            let (ns, s, b) = if every == 1 {
                (exact_ns, exact.clone(), eb.clone())
            } else {
                reread("leap+stream", every, stride)
            };
            let c = &s.counters;
            let marker_hits = (c.prefetch_marker_hits - b.prefetch_marker_hits)
                .saturating_sub(c.probe_hits - b.probe_hits);
            let markers = (c.prefetch_staged - b.prefetch_staged)
                .saturating_sub(c.probe_staged - b.probe_staged);
            println!(
                "| 1 in {every} | {pattern} | {:.3} | {} | {exact_acc:.3} | {ns:.0} | {} |",
                probe_rate(&s, &b),
                if markers == 0 {
                    "-".to_string()
                } else {
                    format!("{:.3}", marker_hits as f64 / markers as f64)
                },
                c.prefetch_marker_hits - b.prefetch_marker_hits
            );
        }
    }
    println!();
}

/// Probe hits / probes staged during the measured phase (unresolved probes count as misses).
fn probe_rate(s: &farvm_ept::Stats, b: &farvm_ept::stats::CounterValues) -> f64 {
    let hits = (s.counters.probe_hits - b.probe_hits) as f64;
    let staged = (s.counters.probe_staged - b.probe_staged) as f64;
    if staged == 0.0 {
        0.0
    } else {
        hits / staged
    }
}

fn evict_table() {
    let pages = 4096u64;
    let ram = GuestRam::new(pages as usize * PAGE_SIZE).expect("memfd");
    let fill = |ram: &GuestRam| {
        for p in 0..pages {
            // SAFETY: the alias page is in bounds and owned by this benchmark.
            unsafe { core::ptr::write_bytes(ram.alias_page(p), p as u8 | 1, PAGE_SIZE) };
        }
    };
    fill(&ram);
    // Fingerprint: best of 5 passes over resident pages (the first pass also pays TLB misses).
    let mut acc = 0u128;
    let mut fp_ns = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for p in 0..pages {
            // SAFETY: resident page nobody writes meanwhile.
            acc ^= unsafe { farvm_ept::hash::of_page(ram.alias_page(p)) };
        }
        fp_ns = fp_ns.min(t.elapsed().as_nanos() as f64 / pages as f64);
    }
    // The same hash compiled for baseline x86-64 (`xxhash-rust`: SSE2), same passes.
    let mut base_ns = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for p in 0..pages {
            // SAFETY: resident page nobody writes meanwhile; 4 KiB in bounds.
            let s = unsafe { core::slice::from_raw_parts(ram.alias_page(p), PAGE_SIZE) };
            acc ^= xxhash_rust::xxh3::xxh3_128(s);
        }
        base_ns = base_ns.min(t.elapsed().as_nanos() as f64 / pages as f64);
    }
    std::hint::black_box(acc);
    let all: Vec<u64> = (0..pages).collect();
    let scattered: Vec<u64> = (0..pages).step_by(2).collect();
    // This thread's CPU time, not wall time: on a shared host the wall time of a kernel-heavy
    // loop mostly measures how long other processes held the CPU.
    let time = |f: &dyn Fn()| {
        let t = thread_cpu_ns();
        f();
        (thread_cpu_ns() - t) as f64
    };
    let mut rows = Vec::new();
    for (name, set) in [("contiguous", &all), ("every other page", &scattered)] {
        fill(&ram);
        for chunk in set.chunks(64) {
            // Map into the guest view from the alias side (plain touch of the shared mapping).
            for &p in chunk {
                // SAFETY: the guest view is not registered with any uffd in this benchmark.
                unsafe {
                    core::ptr::read_volatile(ram.guest_page_addr(p) as *const u8);
                }
            }
        }
        let zap = time(&|| {
            for chunk in set.chunks(64) {
                ram.zap_guest(chunk).unwrap();
            }
        }) / set.len() as f64;
        let free = time(&|| {
            for chunk in set.chunks(64) {
                ram.free(chunk).unwrap();
            }
        }) / set.len() as f64;
        // Landing a received page through the alias, as the store does: first into the pages
        // just freed (the kernel faults, allocates and zeroes each one), then again into the
        // same pages, now resident (the copy alone): what reusing backing pages would save.
        let src = vec![0xA5u8; PAGE_SIZE];
        let land = || {
            time(&|| {
                for &p in set.iter() {
                    // SAFETY: the alias page is in bounds and owned by this benchmark; `src`
                    // is a separate 4 KiB buffer.
                    unsafe {
                        core::ptr::copy_nonoverlapping(src.as_ptr(), ram.alias_page(p), PAGE_SIZE)
                    };
                }
            }) / set.len() as f64
        };
        let land_freed = land();
        let land_resident = land();
        rows.push((name, [zap, free, land_freed, land_resident]));
    }
    println!(
        "## 4. Eviction building blocks (ns per page, batches of 64; fingerprint: wall time, \
         best of 5 passes; the rest: this thread's CPU time)\n"
    );
    println!("| step | contiguous | every other page |");
    println!("|---|---|---|");
    println!("| fingerprint (XXH3-128, the dirty check) | {fp_ns:.0} | {fp_ns:.0} |");
    println!(
        "| the same hash compiled for baseline x86-64 (xxhash-rust, SSE2) | {base_ns:.0} | \
         {base_ns:.0} |"
    );
    let steps = [
        "zap guest view (vectored MADV_DONTNEED)",
        "free memfd page (vectored MADV_REMOVE)",
        "land a page in a freed memfd page (fault, allocate, zero, copy)",
        "land a page in a resident memfd page (copy only)",
    ];
    for (i, step) in steps.iter().enumerate() {
        println!("| {step} | {:.0} | {:.0} |", rows[0].1[i], rows[1].1[i]);
    }
    println!(
        "\nFor comparison (research notes, same host): uffd async WP + PAGEMAP_SCAN costs the guest \
         4.6-7.1 us per first write after each harvest, KVM dirty logging 3.7-5.1 us."
    );
}

/// The calling thread's CPU time in ns.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the kernel to fill.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One hot/cold run: 10% of pages get `hot_share` of 200k random accesses.
fn hot_cold(refault_protect: bool, hot_share: f64) -> (f64, u64, u64) {
    let store = MemStore::new(MemStoreConfig {
        demand_latency: Duration::from_micros(25),
        prefetch_latency: Duration::from_micros(25),
        write_latency: Duration::from_micros(25),
    });
    let mut cfg = EngineConfig::new(64 << 20);
    cfg.budget = Budget::Percent(25.0);
    cfg.prefetch = false;
    cfg.refault_protect = refault_protect;
    let engine = Engine::start(
        cfg,
        EngineParts::new(store, Box::new(farvm_prefetch::none::NoPrefetch)),
    )
    .expect("engine");
    let (base, len) = engine.guest_ram();
    let pages = len / PAGE_SIZE as u64;
    let at = |p: u64| (base + p * PAGE_SIZE as u64) as *mut u64;
    for p in 0..pages {
        // SAFETY: in bounds of guest RAM; faults are resolved by the engine.
        unsafe { core::ptr::write_volatile(at(p), p) };
    }
    let hot = pages / 10;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let before = engine.stats().counters;
    let t = Instant::now();
    let n = 200_000u64;
    for _ in 0..n {
        let r = next();
        let p = if (r % 1000) as f64 / 1000.0 < hot_share {
            // Hot pages spread over the whole range (every 10th page).
            (next() % hot) * 10
        } else {
            next() % pages
        };
        // SAFETY: as above.
        let v = unsafe { core::ptr::read_volatile(at(p)) };
        assert_eq!(v, p);
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    let s = engine.stats().counters;
    (
        ns,
        s.demand_faults - before.demand_faults,
        s.hot_refaults - before.hot_refaults,
    )
}

fn policy_table() {
    println!(
        "## 5. Cold-page policy: 64 MiB at 25%, 10% hot pages, 200k random reads, 25 us store\n"
    );
    println!("| hot share of accesses | policy | demand faults | hot refaults | ns per access | faults vs plain CLOCK |");
    println!("|---|---|---|---|---|---|");
    for share in [0.5, 0.8, 0.95] {
        let (ns0, f0, _) = hot_cold(false, share);
        let (ns1, f1, h1) = hot_cold(true, share);
        println!("| {share} | CLOCK (second chance at install) | {f0} | - | {ns0:.0} | 1.00x |");
        println!(
            "| {share} | CLOCK + refault-distance protection | {f1} | {h1} | {ns1:.0} | {:.2}x |",
            f1 as f64 / f0.max(1) as f64
        );
    }
    println!();
}
