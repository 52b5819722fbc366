//! Integrity against a store that behaves like several memory servers at once: completions
//! delivered by several threads concurrently (one per "server", the page's slab picks it),
//! each with its own randomly varying latency, plus demand reads served inline on the fault
//! thread and injected read and write failures. "vCPU" threads write and verify their own
//! pages in random order, every word, over many eviction / refetch cycles.
//!
//! Knobs: `FARVM_EPT_CHAOS_SECS` (default 8), `FARVM_EPT_CHAOS_LAT_US` (mean latency,
//! default 200), `FARVM_EPT_CHAOS_SERVERS` (default 6), `FARVM_EPT_CHAOS_FAIL_PPM` (injected
//! failures per million requests, default 2000), `FARVM_EPT_CHAOS_STALL_PPM` (requests that
//! stall their server for 50-300 ms, per million, default 500). Each backing (memfd, anon)
//! runs it.

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use common::WORDS;
use farvm_ept::store::{
    Completion, CompletionSink, GuestPage, Op, ReadReq, RemoteStore, Replica, Status, StoreError,
    WriteReq,
};
use farvm_ept::{Budget, EngineConfig, EngineParts, PAGE_SIZE};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?}")))
        .unwrap_or(default)
}

/// xorshift64*, one per thread.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

enum Req {
    Read(ReadReq),
    Write(WriteReq),
}

struct Server {
    queue: Mutex<VecDeque<(Instant, Req)>>,
    cv: Condvar,
}

struct Chaos {
    pages: Mutex<HashMap<GuestPage, Box<[u8; PAGE_SIZE]>>>,
    servers: Vec<Server>,
    sink: OnceLock<Arc<dyn CompletionSink>>,
    rng: Mutex<Rng>,
    mean_lat_us: u64,
    fail_ppm: u64,
    stall_ppm: u64,
    failed: AtomicU64,
    served: AtomicU64,
    stop: AtomicBool,
}

/// Pages per "slab": the server a page lives on.
const SLAB_PAGES: u64 = 2048;

impl Chaos {
    fn new(servers: usize, mean_lat_us: u64, fail_ppm: u64, stall_ppm: u64) -> Arc<Self> {
        let c = Arc::new(Self {
            pages: Mutex::new(HashMap::new()),
            servers: (0..servers)
                .map(|_| Server {
                    queue: Mutex::new(VecDeque::new()),
                    cv: Condvar::new(),
                })
                .collect(),
            sink: OnceLock::new(),
            rng: Mutex::new(Rng(0x9E37_79B9_7F4A_7C15)),
            mean_lat_us,
            fail_ppm,
            stall_ppm,
            failed: AtomicU64::new(0),
            served: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        for i in 0..servers {
            let c2 = c.clone();
            std::thread::Builder::new()
                .name(format!("chaos-server-{i}"))
                .spawn(move || c2.serve_loop(i))
                .unwrap();
        }
        c
    }

    fn latency(&self) -> Duration {
        let mut r = self.rng.lock().unwrap();
        // Mostly around the mean, sometimes 10x (a busy server).
        let base = r.below(2 * self.mean_lat_us + 1);
        let us = if r.below(50) == 0 { base * 10 } else { base };
        Duration::from_micros(us)
    }

    fn fails(&self) -> bool {
        self.rng.lock().unwrap().below(1_000_000) < self.fail_ppm
    }

    fn serve(&self, req: Req) -> Completion {
        self.served.fetch_add(1, Ordering::Relaxed);
        match req {
            Req::Read(r) => {
                let status = if self.fails() {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    Status::Failed(StoreError::Unavailable)
                } else {
                    match self.pages.lock().unwrap().get(&r.page) {
                        Some(d) => {
                            // SAFETY: the engine owns `dst` for this outstanding read.
                            unsafe { r.dst.as_mut_slice() }.copy_from_slice(&d[..]);
                            Status::Ok
                        }
                        None => Status::Absent,
                    }
                };
                Completion {
                    op: Op::Read,
                    page: r.page,
                    status,
                    replica: Replica(0),
                }
            }
            Req::Write(w) => {
                let status = if self.fails() {
                    self.failed.fetch_add(1, Ordering::Relaxed);
                    Status::Failed(StoreError::Unavailable)
                } else {
                    let mut d = Box::new([0u8; PAGE_SIZE]);
                    // SAFETY: the engine owns `src` for this outstanding write.
                    d.copy_from_slice(unsafe { w.src.as_slice() });
                    self.pages.lock().unwrap().insert(w.page, d);
                    Status::Ok
                };
                Completion {
                    op: Op::Write,
                    page: w.page,
                    status,
                    replica: Replica::NONE,
                }
            }
        }
    }

    fn serve_loop(&self, i: usize) {
        let s = &self.servers[i];
        let mut q = s.queue.lock().unwrap();
        loop {
            if self.stop.load(Ordering::SeqCst) {
                return;
            }
            let Some(&(due, _)) = q.front() else {
                q = s.cv.wait_timeout(q, Duration::from_millis(50)).unwrap().0;
                continue;
            };
            let now = Instant::now();
            if due > now {
                q = s.cv.wait_timeout(q, due - now).unwrap().0;
                continue;
            }
            // Every response due now, delivered as one batch (a multi-page response).
            let mut reqs = Vec::new();
            while reqs.len() < 16 && q.front().is_some_and(|(d, _)| *d <= now) {
                reqs.push(q.pop_front().unwrap().1);
            }
            drop(q);
            let done: Vec<Completion> = reqs.into_iter().map(|r| self.serve(r)).collect();
            self.sink.get().unwrap().complete(&done);
            q = s.queue.lock().unwrap();
        }
    }

    fn enqueue(&self, page: GuestPage, req: Req) {
        let s = &self.servers[((page / SLAB_PAGES) as usize) % self.servers.len()];
        // In order per server (a connection), each request after the one before.
        let mut q = s.queue.lock().unwrap();
        let after = q.back().map(|(d, _)| *d).unwrap_or_else(Instant::now);
        let mut due = after.max(Instant::now()) + self.latency() / 4;
        // Now and then a server stalls (a busy host, a dying server), holding every request
        // queued to it: reads in flight that long keep their landing frames meanwhile.
        let stall = {
            let mut r = self.rng.lock().unwrap();
            (r.below(1_000_000) < self.stall_ppm).then(|| 50 + r.below(250))
        };
        if let Some(ms) = stall {
            due += Duration::from_millis(ms);
        }
        q.push_back((due, req));
        s.cv.notify_one();
    }
}

impl RemoteStore for Chaos {
    fn attach(&self, sink: Arc<dyn CompletionSink>) -> Result<(), StoreError> {
        self.sink.set(sink).map_err(|_| StoreError::Closed)
    }
    fn read(&self, reqs: &[ReadReq]) -> Result<(), StoreError> {
        for r in reqs {
            self.enqueue(r.page, Req::Read(*r));
        }
        Ok(())
    }
    fn write(&self, reqs: &[WriteReq]) -> Result<(), StoreError> {
        for w in reqs {
            self.enqueue(w.page, Req::Write(*w));
        }
        Ok(())
    }
    fn discard(&self, pages: &[GuestPage]) -> Result<(), StoreError> {
        let mut m = self.pages.lock().unwrap();
        for p in pages {
            m.remove(p);
        }
        Ok(())
    }
    fn read_now(&self, req: &ReadReq) -> Option<(Status, Replica)> {
        let (page, dst) = (req.page, req.dst);
        // While it waits, the fault thread receives other responses too (as the memory
        // server client's inline receive does): their completions run on this thread.
        let k = self.rng.lock().unwrap().below(self.servers.len() as u64) as usize;
        let mut batch = Vec::new();
        {
            let mut q = self.servers[k].queue.lock().unwrap();
            let now = Instant::now();
            while batch.len() < 8 && q.front().is_some_and(|(d, _)| *d <= now + self.latency()) {
                batch.push(q.pop_front().unwrap().1);
            }
        }
        std::thread::sleep(self.latency());
        if !batch.is_empty() {
            let done: Vec<Completion> = batch.into_iter().map(|r| self.serve(r)).collect();
            self.sink.get().unwrap().complete(&done);
        }
        let c = self.serve(Req::Read(ReadReq {
            page,
            priority: farvm_ept::store::Priority::Demand,
            dst,
            version: req.version,
        }));
        Some((c.status, c.replica))
    }
}

fn word(version: u64, page: u64, w: usize) -> u64 {
    common::pattern(version, page, w)
}

#[test]
fn memfd_pages_survive_concurrent_completions_varying_latency_and_failures() {
    survive(farvm_ept::GuestMemory::Memfd);
}

#[test]
fn anonymous_pages_survive_concurrent_completions_varying_latency_and_failures() {
    survive(farvm_ept::GuestMemory::Anon);
}

fn survive(memory: farvm_ept::GuestMemory) {
    let secs = env_u64("FARVM_EPT_CHAOS_SECS", 8);
    let servers = env_u64("FARVM_EPT_CHAOS_SERVERS", 6) as usize;
    let lat = env_u64("FARVM_EPT_CHAOS_LAT_US", 200);
    let fail_ppm = env_u64("FARVM_EPT_CHAOS_FAIL_PPM", 2000);
    let stall_ppm = env_u64("FARVM_EPT_CHAOS_STALL_PPM", 500);
    let store = Chaos::new(servers, lat, fail_ppm, stall_ppm);
    let mut cfg = EngineConfig::new(64 << 20);
    cfg.budget = Budget::Percent(25.0);
    cfg.guest_memory = memory;
    let prefetcher = farvm_prefetch::registry::build(
        farvm_prefetch::registry::DEFAULT,
        &farvm_prefetch::registry::Config::default(),
    )
    .unwrap();
    let engine = farvm_ept::Engine::start(cfg, EngineParts::new(store.clone(), prefetcher))
        .unwrap_or_else(|e| panic!("engine start failed: {e}"));
    let (base, len) = engine.guest_ram();
    let g = common::Guest::from_raw(base, len);
    let threads = 4u64;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let bad = AtomicU64::new(0);
    let touched = AtomicU64::new(0);
    let engine = &engine;
    std::thread::scope(|s| {
        // Thread `threads` (the last share of the pages) is the VMM: it reads and writes
        // its pages through the engine's access path (pin, map if needed, copy), not by
        // faulting.
        for t in 0..=threads {
            let (bad, touched) = (&bad, &touched);
            let vmm = t == threads;
            s.spawn(move || {
                let mine: Vec<u64> = (0..g.pages)
                    .filter(|p| (p / 512) % (threads + 1) == t)
                    .collect();
                let mut buf = vec![0u8; PAGE_SIZE];
                let mut version = vec![0u64; mine.len()];
                let mut rng = Rng(0x1234_5678 + t * 7919);
                let mut i = 0usize;
                while Instant::now() < deadline {
                    // Runs of sequential pages from random places (the prefetcher finds
                    // streams), sometimes single random pages.
                    if rng.below(64) == 0 {
                        i = rng.below(mine.len() as u64) as usize;
                    }
                    let run = if rng.below(4) == 0 { 1 } else { 32 };
                    for _ in 0..run {
                        let k = i % mine.len();
                        let p = mine[k];
                        let v = version[k];
                        if vmm {
                            engine.read_bytes(p * PAGE_SIZE as u64, &mut buf).unwrap();
                        }
                        for w in 0..WORDS {
                            let got = if vmm {
                                u64::from_ne_bytes(buf[w * 8..w * 8 + 8].try_into().unwrap())
                            } else {
                                g.load(p, w)
                            };
                            let want = if v == 0 { 0 } else { word(v, p, w) };
                            if got != want {
                                let n = bad.fetch_add(1, Ordering::SeqCst);
                                if n < 20 {
                                    eprintln!(
                                        "page {p:#x} word {w}: got {got:#x}, want {want:#x} \
                                         (version {v})"
                                    );
                                }
                                break;
                            }
                        }
                        // Rewrite it with the next version (sometimes leave it as read).
                        if rng.below(3) != 0 {
                            let nv = v + 1;
                            if vmm {
                                for w in 0..WORDS {
                                    buf[w * 8..w * 8 + 8]
                                        .copy_from_slice(&word(nv, p, w).to_ne_bytes());
                                }
                                engine.write_bytes(p * PAGE_SIZE as u64, &buf).unwrap();
                            } else {
                                for w in 0..WORDS {
                                    g.store(p, w, word(nv, p, w));
                                }
                            }
                            version[k] = nv;
                        }
                        touched.fetch_add(1, Ordering::Relaxed);
                        i += 1;
                    }
                }
            });
        }
    });
    store.stop.store(true, Ordering::SeqCst);
    let st = engine.stats();
    eprintln!(
        "touched {} pages; store served {} requests, failed {}; {:?}",
        touched.load(Ordering::Relaxed),
        store.served.load(Ordering::Relaxed),
        store.failed.load(Ordering::Relaxed),
        st.counters
    );
    assert_eq!(bad.load(Ordering::SeqCst), 0, "pages with wrong content");
    assert_eq!(st.counters.evict_late_writes, 0);
    assert_eq!(st.counters.evict_vanished, 0);
    assert!(
        st.counters.evictions > 0 && st.counters.remote_reads_prefetch > 0,
        "the run paged: {:?}",
        st.counters
    );
}
