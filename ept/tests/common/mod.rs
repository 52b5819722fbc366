//! Shared helpers: an engine over a [`MemStore`], threads of the test acting as vCPUs that touch
//! the uffd-registered guest view with plain loads and stores, and seeded page patterns.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use farvm_ept::memstore::{MemStore, MemStoreConfig};
use farvm_ept::{Budget, Engine, EngineConfig, EngineParts, PAGE_SIZE};
use farvm_prefetch::{Candidates, Nanos, PageNo, Prefetcher, ProcessKey};

pub const WORDS: usize = PAGE_SIZE / 8;

pub struct Vm {
    pub engine: Engine,
    pub store: Arc<MemStore>,
    pub base: usize,
    pub pages: u64,
}

/// The host address of guest RAM, usable from test threads ("vCPUs").
#[derive(Clone, Copy)]
pub struct Guest {
    base: usize,
    pub pages: u64,
}

impl Vm {
    pub fn new(mem_mib: u64, budget: Budget, prefetcher: Box<dyn Prefetcher>) -> Self {
        Self::with(
            mem_mib,
            budget,
            prefetcher,
            MemStoreConfig::default(),
            |_| {},
        )
    }

    pub fn with(
        mem_mib: u64,
        budget: Budget,
        prefetcher: Box<dyn Prefetcher>,
        store_cfg: MemStoreConfig,
        tweak: impl FnOnce(&mut EngineConfig),
    ) -> Self {
        let store = MemStore::new(store_cfg);
        let mut cfg = EngineConfig::new(mem_mib << 20);
        cfg.budget = budget;
        tweak(&mut cfg);
        Self::start(cfg, EngineParts::new(store.clone(), prefetcher), store)
    }

    /// An engine started from `cfg` and `parts` (whose store is `store`).
    pub fn start(cfg: EngineConfig, parts: EngineParts, store: Arc<MemStore>) -> Self {
        let engine =
            Engine::start(cfg, parts).unwrap_or_else(|e| panic!("engine start failed: {e}"));
        let (base, len) = engine.guest_ram();
        Self {
            engine,
            store,
            base: base as usize,
            pages: len / PAGE_SIZE as u64,
        }
    }

    pub fn guest(&self) -> Guest {
        Guest {
            base: self.base,
            pages: self.pages,
        }
    }

    /// Waits until the evictor is idle: residency at or below its target, nothing in flight or
    /// being evicted, twice in a row.
    pub fn settle(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut quiet = 0;
        while quiet < 2 {
            let s = self.engine.stats();
            let idle = s.resident_pages <= s.budget_pages - s.reserve_pages
                && s.states[2] == 0
                && s.states[5] == 0;
            quiet = if idle { quiet + 1 } else { 0 };
            assert!(Instant::now() < deadline, "evictor did not settle: {s:?}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// At rest (the evictor may still be finishing a round), the frames guest RAM really holds
    /// (mincore, plus the backing's own held frames) equal the engine's resident-page counter:
    /// no frame leaked or counted twice.
    pub fn assert_frames_match_the_counter_at_rest(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let (m, r) = (
                self.engine.resident_by_mincore().unwrap(),
                self.engine.stats().resident_pages,
            );
            if m == r {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "frames held {m} != counter {r} at rest"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Guest {
    pub fn from_raw(base: u64, len: u64) -> Self {
        Self {
            base: base as usize,
            pages: len / PAGE_SIZE as u64,
        }
    }

    fn word_ptr(&self, page: u64, word: usize) -> *mut u64 {
        assert!(page < self.pages && word < WORDS);
        (self.base + page as usize * PAGE_SIZE + word * 8) as *mut u64
    }

    /// A guest (vCPU-like) load: may fault into the engine's uffd.
    pub fn load(&self, page: u64, word: usize) -> u64 {
        // SAFETY: in bounds of the live guest mapping; faults are resolved by the engine.
        unsafe { core::ptr::read_volatile(self.word_ptr(page, word)) }
    }

    pub fn store(&self, page: u64, word: usize, v: u64) {
        // SAFETY: as in `load`.
        unsafe { core::ptr::write_volatile(self.word_ptr(page, word), v) }
    }

    pub fn fill(&self, page: u64, seed: u64) {
        for w in 0..WORDS {
            self.store(page, w, pattern(seed, page, w));
        }
    }

    /// Returns the first mismatching word, if any.
    pub fn check(&self, page: u64, seed: u64) -> Option<(usize, u64, u64)> {
        (0..WORDS).find_map(|w| {
            let (got, want) = (self.load(page, w), pattern(seed, page, w));
            (got != want).then_some((w, got, want))
        })
    }
}

pub fn pattern(seed: u64, page: u64, word: usize) -> u64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(page << 12 | word as u64);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub fn gettid() -> u32 {
    // SAFETY: gettid has no preconditions.
    unsafe { libc::gettid() as u32 }
}

/// A prefetcher that proposes the next `n` pages, every `marker_every`-th one as a marker, and
/// records what it was told (for attribution and hit-signal tests).
pub struct Recorder {
    pub n: u64,
    pub marker_every: u64,
    pub seen: Arc<std::sync::Mutex<Vec<(ProcessKey, PageNo)>>>,
    pub hits: Arc<std::sync::atomic::AtomicU64>,
}

impl Recorder {
    pub fn new(n: u64, marker_every: u64) -> Self {
        Self {
            n,
            marker_every,
            seen: Default::default(),
            hits: Default::default(),
        }
    }
}

impl Prefetcher for Recorder {
    fn name(&self) -> &'static str {
        "test-next-n"
    }
    fn on_fault(&mut self, key: ProcessKey, page: PageNo, _now: Nanos, out: &mut Candidates) {
        if let Ok(mut s) = self.seen.lock() {
            if s.len() < 1 << 20 {
                s.push((key, page));
            }
        }
        out.clear();
        for i in 1..=self.n {
            if self.marker_every > 0 && i % self.marker_every == 0 {
                out.push_marker(page + i);
            } else {
                out.push(page + i);
            }
        }
    }
    fn on_hit(&mut self, _key: ProcessKey, _page: PageNo, _now: Nanos) {
        self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn forget(&mut self, _key: ProcessKey) {}
}

pub fn none() -> Box<dyn Prefetcher> {
    Box::new(Recorder::new(0, 0))
}
