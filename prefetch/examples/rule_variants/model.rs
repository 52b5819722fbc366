//! The model of `leap+stream`'s own decision with the options' variants, and its replay: what
//! every mode of the example runs.

use std::collections::{HashMap, HashSet};

use farvm_prefetch::eval::lru::{Evicted, Lru, Meta};
use farvm_prefetch::leap::{Leap, LeapParams};
use farvm_prefetch::pressure::Pressure;
use farvm_prefetch::region::{RegionParams, RECENT};
use farvm_prefetch::runahead::RunAhead;
use farvm_prefetch::stream::{Stream, StreamParams};
use farvm_prefetch::trace::{read_trace, Trace};
use farvm_prefetch::{build, composite, Candidates, Config, Nanos, PageNo, Prefetcher, ProcessKey};

use crate::best_offset::OffsetTable;
use crate::footprint::Footprints;

/// Where a candidate came from.
pub(crate) const SOURCES: [&str; 10] = [
    "stream, at a fault",
    "stream, at its marker",
    "leap, at a fault",
    "leap, at its marker",
    "region read-around",
    "next-k",
    "run-ahead, at a fault",
    "run-ahead, at its marker",
    "wide (next K after every fault), best offsets or footprints",
    "temporal (the faults that followed this page's last fault)",
];
const STREAM_FAULT: u8 = 0;
const STREAM_MARKER: u8 = 1;
const LEAP_FAULT: u8 = 2;
const LEAP_MARKER: u8 = 3;
const REGION: u8 = 4;
const NEXT_K: u8 = 5;
const RUNAHEAD_FAULT: u8 = 6;
const RUNAHEAD_MARKER: u8 = 7;
const WIDE: u8 = 8;
const TEMPORAL: u8 = 9;
/// Outstanding read-around markers remembered per process (`--gate`).
const RING: usize = 8;
/// Bound of the read-around score (`--gate`).
const SCORE_MAX: i64 = 16;

/// Settings of the footprint table (`--footprint`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FootprintOpts {
    pub(crate) generation: u64,
    pub(crate) min_pages: u32,
    pub(crate) markers: bool,
    pub(crate) idle: bool,
}

/// The waste controller that knows the replay's true waste (`--oracle-cap`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Oracle {
    pub(crate) cap: f64,
    pub(crate) keep: usize,
    pub(crate) min_fetched: u64,
}

/// The options of a replay (main.rs's module documentation says what each does).
#[derive(Clone, Copy, Default)]
pub(crate) struct Opts {
    pub(crate) gate: Option<i64>,
    pub(crate) probe: u64,
    pub(crate) fill: Option<u32>,
    pub(crate) once: bool,
    pub(crate) margin: Option<u64>,
    pub(crate) next_k: u64,
    pub(crate) no_runahead: bool,
    pub(crate) no_region: bool,
    pub(crate) depth_budget: u64,
    pub(crate) wide: u64,
    pub(crate) oracle: Option<Oracle>,
    pub(crate) best_offset: Option<u32>,
    pub(crate) best_offset_rounds: bool,
    pub(crate) footprint: Option<FootprintOpts>,
    pub(crate) by_source: bool,
    pub(crate) holes: bool,
    pub(crate) temporal: usize,
}

/// Per-process read-around feedback (`--gate`).
#[derive(Default)]
struct Feedback {
    ring: [Option<PageNo>; RING],
    next: usize,
    score: i64,
    skipped: u64,
}

/// Region read-around with the variants of the options.
struct RegionModel {
    params: RegionParams,
    opts: Opts,
    recent: HashMap<ProcessKey, ([PageNo; RECENT], usize)>,
    feedback: HashMap<ProcessKey, Feedback>,
    /// (process, block) → pages faulted in it (bit per page) and whether it was read around.
    blocks: HashMap<(ProcessKey, PageNo), (u64, bool)>,
}

impl RegionModel {
    fn on_fault(&mut self, key: ProcessKey, page: PageNo, decide: bool, out: &mut Candidates) {
        let block = self.params.block;
        let (pages, next) = self.recent.entry(key).or_insert(([PageNo::MAX; RECENT], 0));
        let recent = *pages;
        let near = recent
            .iter()
            .filter(|&&q| q != PageNo::MAX && q != page && q / block == page / block)
            .count();
        pages[*next] = page;
        *next = (*next + 1) % RECENT;
        let state = self.blocks.entry((key, page / block)).or_default();
        let bit = 1u64 << (page % block);
        let filled = self
            .opts
            .fill
            .is_some_and(|f| !state.1 && (state.0 & !bit).count_ones() >= f);
        state.0 |= bit;
        if !decide || (near < self.params.min_near && !filled) || (self.opts.once && state.1) {
            return;
        }
        if let Some(gate) = self.opts.gate {
            let fb = self.feedback.entry(key).or_default();
            if fb.score < -gate {
                fb.skipped += 1;
                if !fb.skipped.is_multiple_of(self.opts.probe.max(1)) {
                    return;
                }
            }
        }
        state.1 = true;
        let start = page - page % block;
        let (mut lo, mut hi) = (start, start + block - 1);
        if let Some(m) = self.opts.margin {
            let seen = recent
                .iter()
                .copied()
                .filter(|&q| q != PageNo::MAX && q / block == page / block)
                .chain([page]);
            lo = lo.max(seen.clone().min().unwrap_or(page).saturating_sub(m));
            hi = hi.min(seen.max().unwrap_or(page).saturating_add(m));
        }
        for p in lo..=hi {
            if p != page {
                out.push(p);
            }
        }
        let Some(fb) = self
            .opts
            .gate
            .map(|_| self.feedback.entry(key).or_default())
        else {
            return;
        };
        let marker = (start..start + block).find(|p| *p != page && !recent.contains(p));
        if let Some(i) = marker.and_then(|m| out.as_slice().iter().position(|&q| q == m)) {
            out.set_marker(i);
            if fb.ring[fb.next].is_some() {
                fb.score = (fb.score - 1).max(-SCORE_MAX);
            }
            fb.ring[fb.next] = marker;
            fb.next = (fb.next + 1) % RING;
        }
    }

    /// A read-around marker was used; returns whether `page` was one.
    fn marker_hit(&mut self, key: ProcessKey, page: PageNo) -> bool {
        let Some(fb) = self.feedback.get_mut(&key) else {
            return false;
        };
        let Some(i) = fb.ring.iter().position(|&m| m == Some(page)) else {
            return false;
        };
        fb.ring[i] = None;
        fb.score = (fb.score + 1).min(SCORE_MAX);
        true
    }
}

/// `leap+stream` (`prefetch/src/composite.rs`) with the region model, tagging every candidate
/// with its source.
struct Model {
    leap: Leap,
    stream: Stream,
    region: RegionModel,
    runahead: Option<RunAhead>,
    pressure: Pressure,
    sources: Vec<u8>,
    opts: Opts,
    /// Set by the replay before each fault (`--oracle-cap`).
    throttled: bool,
    offsets: HashMap<ProcessKey, OffsetTable>,
    footprints: Option<Footprints>,
    /// Per process: its faults in order, and each page's last position in them (`--temporal`).
    history: HashMap<ProcessKey, Vec<PageNo>>,
    last_at: HashMap<(ProcessKey, PageNo), usize>,
}

impl Model {
    fn new(opts: Opts) -> Self {
        let lp = LeapParams::default();
        Self {
            leap: Leap::new(LeapParams {
                markers: true,
                ..lp
            }),
            stream: Stream::new(StreamParams {
                dense_gap: composite::DENSE_GAP,
                used_per_depth: opts.depth_budget,
                ..StreamParams::default()
            }),
            region: RegionModel {
                params: RegionParams::default(),
                opts,
                recent: HashMap::new(),
                feedback: HashMap::new(),
                blocks: HashMap::new(),
            },
            runahead: (!opts.no_runahead).then(|| RunAhead::new(lp.slots)),
            pressure: Pressure::new(lp.slots),
            sources: Vec::new(),
            opts,
            throttled: false,
            offsets: HashMap::new(),
            footprints: opts
                .footprint
                .map(|f| Footprints::new(f.generation, f.min_pages, f.markers)),
            history: HashMap::new(),
            last_at: HashMap::new(),
        }
    }

    fn fault(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        self.sources.clear();
        let pressed = self.pressure.on_fault(key, page) || self.throttled;
        self.stream.set_cautious(pressed);
        self.stream.on_fault(key, page, now, out);
        let first = if out.is_empty() {
            self.leap.on_fault(key, page, now, out);
            LEAP_FAULT
        } else {
            self.leap.observe(key, page);
            STREAM_FAULT
        };
        let by_first = out.len();
        let decide = out.is_empty() && !pressed && !self.opts.no_region;
        self.region.on_fault(key, page, decide, out);
        let by_region = out.len();
        if out.is_empty() && !pressed {
            for j in 1..=self.opts.next_k {
                out.push(page.saturating_add(j));
            }
        }
        let by_next_k = out.len();
        if let Some(r) = self
            .runahead
            .as_mut()
            .filter(|_| out.is_empty() && !pressed)
        {
            r.on_fault(key, page, out);
        }
        let by_runahead = out.len();
        if self.opts.temporal > 0 {
            let h = self.history.entry(key).or_default();
            // Under memory pressure too: a page faulted on again was evicted, which is what
            // the pressure estimate counts, so gating on it would leave nothing to answer.
            if let Some(&i) = self.last_at.get(&(key, page)) {
                for &q in h[i + 1..].iter().take(self.opts.temporal) {
                    if q != page {
                        out.push_distinct(q);
                    }
                }
            }
            self.last_at.insert((key, page), h.len());
            h.push(page);
        }
        let by_temporal = out.len();
        if let Some(f) = self.footprints.as_mut() {
            let decide =
                !pressed && (out.is_empty() || !self.opts.footprint.is_some_and(|f| f.idle));
            f.fault(key, page, decide.then_some(&mut *out));
        }
        if let Some(threshold) = self.opts.best_offset {
            let table = self.offsets.entry(key).or_default();
            let out = (!pressed).then_some(&mut *out);
            table.fault(page, threshold, self.opts.best_offset_rounds, out);
        }
        if !pressed {
            for j in 1..=self.opts.wide {
                out.push_distinct(page.saturating_add(j));
            }
        }
        for i in 0..out.len() {
            self.sources.push(match i {
                _ if i < by_first => first,
                _ if i < by_region => REGION,
                _ if i < by_next_k => NEXT_K,
                _ if i < by_runahead => RUNAHEAD_FAULT,
                _ if i < by_temporal => TEMPORAL,
                _ => WIDE,
            });
        }
        self.pressure.fetched(key, out.as_slice());
    }

    fn marker(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        self.sources.clear();
        if self.stream.marker_hit(key, page, out) {
            self.sources.resize(out.len(), STREAM_MARKER);
            return;
        }
        if let Some(r) = self.runahead.as_mut() {
            if r.marker_hit(key, page, out) {
                self.sources.resize(out.len(), RUNAHEAD_MARKER);
                return;
            }
        }
        if self.region.marker_hit(key, page)
            || self
                .footprints
                .as_mut()
                .is_some_and(|f| f.marker_hit(key, page))
        {
            out.clear();
            return;
        }
        composite::leap_marker_hit(&mut self.leap, &mut self.stream, key, page, now, out);
        self.sources.resize(out.len(), LEAP_MARKER);
    }
}

#[derive(Clone, Copy, Default)]
pub(crate) struct SourceCounts {
    pub(crate) fetched: u64,
    pub(crate) used: u64,
    pub(crate) never_touched: u64,
    pub(crate) in_holes: u64,
    pub(crate) evicted_before_use: u64,
}

#[derive(Default)]
pub(crate) struct Run {
    pub(crate) misses: u64,
    pub(crate) fetched: u64,
    pub(crate) used: u64,
    pub(crate) misses_by_process: HashMap<ProcessKey, u64>,
    /// Every demand miss: (process, page, first touch of the page).
    pub(crate) miss_list: Vec<(ProcessKey, PageNo, bool)>,
    pub(crate) sources: [SourceCounts; SOURCES.len()],
}

impl Run {
    pub(crate) fn waste(&self) -> f64 {
        (self.fetched - self.used) as f64 / (self.fetched + self.misses).max(1) as f64
    }
}

/// Stops the example with a one-line error (exit status 2): bad input is not a crash.
pub(crate) fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("rule_variants: {msg}");
    std::process::exit(2)
}

/// The trace in `path` (the example stops with the path and the error if it cannot be read).
pub(crate) fn load(path: &str) -> Trace {
    let file = std::fs::File::open(path).unwrap_or_else(|e| fail(format!("{path}: {e}")));
    read_trace(file).unwrap_or_else(|e| fail(format!("{path}: {e}")))
}

/// Replays `t` through the model (`baseline` None) or a registered prefetcher.
pub(crate) fn replay(t: &Trace, opts: Opts, baseline: Option<&str>) -> Run {
    let footprint: HashSet<(ProcessKey, PageNo)> =
        t.records.iter().map(|r| (r.key, r.page)).collect();
    let mut lru = Lru::new((footprint.len() / 2).max(1));
    let hole_pages = if opts.by_source {
        holes(t).2
    } else {
        HashSet::new()
    };
    let mut model = Model::new(opts);
    let mut other: Option<Box<dyn Prefetcher>> = baseline
        .map(|n| build(n, &Config::default()).unwrap_or_else(|e| fail(format!("{n}: {e}"))));
    let mut out = Candidates::new();
    let mut source_of: HashMap<(ProcessKey, PageNo), u8> = HashMap::new();
    let mut run = Run::default();
    let mut touched: HashSet<(ProcessKey, PageNo)> = HashSet::new();
    let evicted = |run: &mut Run, ev: Option<Evicted>, src: &mut HashMap<_, u8>| {
        let Some(ev) = ev.filter(|e| e.meta.unused_prefetch) else {
            return;
        };
        if let Some(s) = src.remove(&(ev.key, ev.page)) {
            let c = &mut run.sources[usize::from(s)];
            if footprint.contains(&(ev.key, ev.page)) {
                c.evicted_before_use += 1;
            } else {
                c.never_touched += 1;
                c.in_holes += u64::from(hole_pages.contains(&(ev.key, ev.page)));
            }
        }
    };
    for r in &t.records {
        let (k, page) = (r.key, r.page);
        let first_touch = touched.insert((k, page));
        match lru.get(k, page) {
            Some(i) => {
                let m = *lru.meta(i);
                lru.touch(i);
                if !m.unused_prefetch {
                    continue;
                }
                lru.meta(i).unused_prefetch = false;
                run.used += 1;
                if let Some(s) = source_of.remove(&(k, page)) {
                    run.sources[usize::from(s)].used += 1;
                }
                if !m.marker {
                    continue;
                }
                match other.as_mut() {
                    Some(p) => p.on_marker_hit(k, page, r.time, &mut out),
                    None => model.marker(k, page, r.time, &mut out),
                }
            }
            None => {
                run.misses += 1;
                *run.misses_by_process.entry(k).or_default() += 1;
                run.miss_list.push((k, page, first_touch));
                let ev = lru.insert(k, page, Meta::default());
                evicted(&mut run, ev, &mut source_of);
                model.throttled = opts.oracle.is_some_and(|o| {
                    run.fetched + run.misses >= o.min_fetched && run.waste() > o.cap
                });
                match other.as_mut() {
                    Some(p) => p.on_fault(k, page, r.time, &mut out),
                    None => model.fault(k, page, r.time, &mut out),
                }
                if let Some(keep) = opts.oracle.map(|o| o.keep).filter(|&n| n > 0) {
                    if model.throttled && out.len() > keep {
                        let kept: Vec<(PageNo, bool)> = out.iter().take(keep).collect();
                        out.clear();
                        for (q, marker) in kept {
                            if marker {
                                out.push_marker(q);
                            } else {
                                out.push(q);
                            }
                        }
                    }
                }
            }
        }
        for i in 0..out.len() {
            let q = out.as_slice()[i];
            if lru.get(k, q).is_some() {
                continue;
            }
            run.fetched += 1;
            if other.is_none() {
                let s = model.sources[i];
                run.sources[usize::from(s)].fetched += 1;
                source_of.insert((k, q), s);
            }
            let meta = Meta {
                unused_prefetch: true,
                marker: out.is_marker(i),
                fetched_at: r.time,
            };
            let ev = lru.insert(k, q, meta);
            evicted(&mut run, ev, &mut source_of);
        }
        out.clear();
    }
    run
}

/// Runs of touched pages, holes of 1 to 8 pages between them and the pages in those holes.
pub(crate) fn holes(t: &Trace) -> (usize, usize, HashSet<(ProcessKey, PageNo)>) {
    let mut pages: Vec<(ProcessKey, PageNo)> = t.records.iter().map(|r| (r.key, r.page)).collect();
    pages.sort_unstable();
    pages.dedup();
    let (mut runs, mut small, mut in_small) = (0, 0, HashSet::new());
    for (i, &(k, p)) in pages.iter().enumerate() {
        let prev = i.checked_sub(1).map(|j| pages[j]);
        if prev != Some((k, p.wrapping_sub(1))) {
            runs += 1;
            if let Some((_, pp)) = prev.filter(|&(pk, _)| pk == k) {
                let gap = p - pp - 1;
                if (1..=8).contains(&gap) {
                    small += 1;
                    in_small.extend((pp + 1..p).map(|q| (k, q)));
                }
            }
        }
    }
    (runs, small, in_small)
}
