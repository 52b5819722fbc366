//! `leap+stream` and variants of its region read-around on traces of real programs, in the
//! setting of `farvm-lab trace compare` (injected hits, marker continuation, LRU local memory of
//! half the footprint), with each process's demand misses and each speculative source's pages.
//!
//! ```sh
//! cargo run --release -p farvm-prefetch --example rule_variants -- [OPTIONS] TRACE...
//! ```
//!
//! With no option the model is `leap+stream`'s own decision (`prefetch/src/composite.rs`: same
//! components, same arbitration), without the sandbox that may widen a process with `next-n`'s
//! pages (`prefetch/src/sandbox.rs`): on a trace where no process widens, the same misses and
//! waste as `trace compare`.
//! `--no-runahead` leaves out run-ahead (`prefetch/src/runahead.rs`): `leap+stream` as it was
//! before it. The other options change the region read-around (`prefetch/src/region.rs`) into
//! the variants measured in `docs/prefetch-real-traces.md`, *Feedback per source, region fill
//! detection, hole avoidance*:
//! - `--gate G` (with `--probe N`, default 8): feedback per source. Every read-around carries
//!   one marker (the lowest page of the block not among the process's recent faults); a marker
//!   hit scores +1, a marker that leaves the process's ring of 8 outstanding ones unhit −1
//!   (score clamped to ±16); while the score is below −G only one read-around in N is issued.
//! - `--fill F`: region fill detection. A per-process map of blocks and the pages faulted in
//!   each; a block with F faulted pages besides the fault is read around once, however long
//!   ago those faults were (the recent-faults test still applies too).
//! - `--once`: hole avoidance. A block is read around at most once per process.
//! - `--margin M`: a read-around sized to what the faults show: only the pages of the block
//!   within M pages of the lowest and the highest of the process's recent faults in it.
//! - `--next-k K`: the next K pages after a fault no component answered (not under pressure),
//!   before run-ahead.
//! - `--holes`: the never-touched holes of each trace's footprint: runs of touched pages per
//!   process, and how many holes of 1 to 8 pages lie between them (pages in them).
//! - `--by-source`: per-process misses and, per source, pages fetched, used, never touched by
//!   the program, evicted before use and left unused at the end; `--baseline NAME` adds the
//!   per-process misses of a registered prefetcher.
//!
//! A model to measure ideas before they go into the crate: it keeps its own state in hash maps
//! and allocates, which the crate's prefetchers must not.

use std::collections::{HashMap, HashSet};

use farvm_prefetch::compare::MAX_WASTE;
use farvm_prefetch::eval::lru::{Evicted, Lru, Meta};
use farvm_prefetch::leap::{Leap, LeapParams};
use farvm_prefetch::pressure::Pressure;
use farvm_prefetch::region::{RegionParams, RECENT};
use farvm_prefetch::runahead::RunAhead;
use farvm_prefetch::stream::{Stream, StreamParams};
use farvm_prefetch::trace::{read_trace, Trace};
use farvm_prefetch::{build, composite, Candidates, Config, Nanos, PageNo, Prefetcher, ProcessKey};

/// Where a candidate came from.
const SOURCES: [&str; 8] = [
    "stream, at a fault",
    "stream, at its marker",
    "leap, at a fault",
    "leap, at its marker",
    "region read-around",
    "next-k",
    "run-ahead, at a fault",
    "run-ahead, at its marker",
];
const STREAM_FAULT: u8 = 0;
const STREAM_MARKER: u8 = 1;
const LEAP_FAULT: u8 = 2;
const LEAP_MARKER: u8 = 3;
const REGION: u8 = 4;
const NEXT_K: u8 = 5;
const RUNAHEAD_FAULT: u8 = 6;
const RUNAHEAD_MARKER: u8 = 7;
/// Outstanding read-around markers remembered per process (`--gate`).
const RING: usize = 8;
/// Bound of the read-around score (`--gate`).
const SCORE_MAX: i64 = 16;

#[derive(Clone, Copy, Default)]
struct Opts {
    gate: Option<i64>,
    probe: u64,
    fill: Option<u32>,
    once: bool,
    margin: Option<u64>,
    next_k: u64,
    no_runahead: bool,
    by_source: bool,
    holes: bool,
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
    next_k: u64,
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
                used_per_depth: composite::USED_PER_DEPTH,
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
            next_k: opts.next_k,
        }
    }

    fn fault(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        self.sources.clear();
        let pressed = self.pressure.on_fault(key, page);
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
        self.region
            .on_fault(key, page, out.is_empty() && !pressed, out);
        let by_region = out.len();
        if out.is_empty() && !pressed {
            for j in 1..=self.next_k {
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
        for i in 0..out.len() {
            self.sources.push(match i {
                _ if i < by_first => first,
                _ if i < by_region => REGION,
                _ if i < by_next_k => NEXT_K,
                _ => RUNAHEAD_FAULT,
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
        if self.region.marker_hit(key, page) {
            out.clear();
            return;
        }
        composite::leap_marker_hit(&mut self.leap, &mut self.stream, key, page, now, out);
        self.sources.resize(out.len(), LEAP_MARKER);
    }
}

#[derive(Clone, Copy, Default)]
struct SourceCounts {
    fetched: u64,
    used: u64,
    never_touched: u64,
    in_holes: u64,
    evicted_before_use: u64,
}

#[derive(Default)]
struct Run {
    misses: u64,
    fetched: u64,
    used: u64,
    misses_by_process: HashMap<ProcessKey, u64>,
    /// Every demand miss: (process, page, first touch of the page).
    miss_list: Vec<(ProcessKey, PageNo, bool)>,
    sources: [SourceCounts; SOURCES.len()],
}

impl Run {
    fn waste(&self) -> f64 {
        (self.fetched - self.used) as f64 / (self.fetched + self.misses).max(1) as f64
    }
}

/// Replays `t` through the model (`baseline` None) or a registered prefetcher.
fn replay(t: &Trace, opts: Opts, baseline: Option<&str>) -> Run {
    let footprint: HashSet<(ProcessKey, PageNo)> =
        t.records.iter().map(|r| (r.key, r.page)).collect();
    let mut lru = Lru::new((footprint.len() / 2).max(1));
    let (_, _, hole_pages) = holes(t);
    let mut model = Model::new(opts);
    let mut other: Option<Box<dyn Prefetcher>> =
        baseline.map(|n| build(n, &Config::default()).unwrap_or_else(|e| panic!("{n}: {e}")));
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
                match other.as_mut() {
                    Some(p) => p.on_fault(k, page, r.time, &mut out),
                    None => model.fault(k, page, r.time, &mut out),
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

/// The model's first-touch misses the baseline does not take, and how many of them are 1, or 2
/// to 8, pages after one of the process's previous 64 misses.
fn first_touches(name: &str, baseline: &str, run: &Run, base: &Run) -> String {
    let theirs: HashSet<(ProcessKey, PageNo)> = base
        .miss_list
        .iter()
        .filter(|m| m.2)
        .map(|m| (m.0, m.1))
        .collect();
    let mut recent: HashMap<ProcessKey, Vec<PageNo>> = HashMap::new();
    let (mut first, mut only, mut next, mut near) = (0, 0, 0, 0);
    for &(k, p, first_touch) in &run.miss_list {
        let r = recent.entry(k).or_default();
        if first_touch {
            first += 1;
            if !theirs.contains(&(k, p)) {
                only += 1;
                let gap = r
                    .iter()
                    .filter_map(|&q| p.checked_sub(q))
                    .filter(|&d| d >= 1)
                    .min();
                match gap {
                    Some(1) => next += 1,
                    Some(2..=8) => near += 1,
                    _ => {}
                }
            }
        }
        r.push(p);
        if r.len() > 64 {
            r.remove(0);
        }
    }
    format!("| {name} (vs {baseline}) | {first} | {only} | {next} | {near} |\n")
}

fn per_process(run: &Run) -> String {
    let mut v: Vec<_> = run.misses_by_process.iter().collect();
    v.sort();
    v.iter()
        .map(|(k, m)| format!("pid {k}: {m}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs of touched pages, holes of 1 to 8 pages between them and the pages in those holes.
fn holes(t: &Trace) -> (usize, usize, HashSet<(ProcessKey, PageNo)>) {
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

fn main() {
    let mut opts = Opts {
        probe: 8,
        ..Opts::default()
    };
    let mut baseline = None;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{a} needs a number ({what})"))
        };
        match a.as_str() {
            "--gate" => opts.gate = Some(value("score") as i64),
            "--probe" => opts.probe = value("one in N"),
            "--fill" => opts.fill = Some(value("pages") as u32),
            "--once" => opts.once = true,
            "--margin" => opts.margin = Some(value("pages")),
            "--next-k" => opts.next_k = value("pages"),
            "--no-runahead" => opts.no_runahead = true,
            "--by-source" => opts.by_source = true,
            "--holes" => opts.holes = true,
            "--baseline" => baseline = Some(args.next().expect("--baseline NAME")),
            _ => files.push(a),
        }
    }
    println!("| trace | demand misses | waste | per process |");
    println!("|---|---:|---:|---|");
    let mut detail = String::new();
    let mut hole_rows = String::new();
    let mut first_touch_rows = String::new();
    for path in &files {
        let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let t = read_trace(file).unwrap_or_else(|e| panic!("{path}: {e}"));
        let name = path.rsplit('/').next().unwrap_or(path);
        let run = replay(&t, opts, None);
        let flag = if run.waste() > MAX_WASTE {
            " (> 10%)"
        } else {
            ""
        };
        println!(
            "| {name} | {} | {:.1}%{flag} | {} |",
            run.misses,
            100.0 * run.waste(),
            per_process(&run)
        );
        if let Some(b) = baseline.as_deref() {
            let base = replay(&t, opts, Some(b));
            println!(
                "| {name}, {b} | {} | {:.1}% | {} |",
                base.misses,
                100.0 * base.waste(),
                per_process(&base)
            );
            first_touch_rows += &first_touches(name, b, &run, &base);
        }
        if opts.holes {
            let (runs, small, pages) = holes(&t);
            hole_rows += &format!("| {name} | {runs} | {small} | {} |\n", pages.len());
        }
        if opts.by_source {
            for (s, c) in SOURCES.iter().zip(run.sources) {
                if c.fetched > 0 {
                    let left = c.fetched - c.used - c.never_touched - c.evicted_before_use;
                    detail += &format!(
                        "| {name} | {s} | {} | {} | {} | {} | {} | {left} |\n",
                        c.fetched, c.used, c.never_touched, c.in_holes, c.evicted_before_use
                    );
                }
            }
        }
    }
    if !first_touch_rows.is_empty() {
        println!();
        println!("| trace | first-touch misses | of them not the baseline's | one page after one of the process's last 64 misses | 2 to 8 pages after |");
        println!("|---|---:|---:|---:|---:|");
        print!("{first_touch_rows}");
    }
    if opts.holes {
        println!();
        println!("| trace | runs of touched pages | holes of 1–8 pages between them | pages in those holes |");
        println!("|---|---:|---:|---:|");
        print!("{hole_rows}");
    }
    if opts.by_source {
        println!();
        println!("| trace | source | fetched | used | never touched by the program | of them in holes of 1–8 pages | evicted before use | resident, unused at the end |");
        println!("|---|---|---:|---:|---:|---:|---:|---:|");
        print!("{detail}");
    }
}
