//! Where a prefetcher's waste goes on traces of real programs, in the setting of
//! `farvm-lab trace compare` (injected hits, marker continuation, LRU local memory of half the
//! footprint): every prefetched page never used is either a page the traced program never
//! touches at all, a page it touches but that was evicted before its use, or one still resident
//! and unused when the trace ends. The last column counts marker faults: first uses of marker
//! pages, which the engine resolves locally (staged, not remote).
//! `cargo run --release -p farvm-prefetch --example waste_sources -- [--prefetcher NAME] TRACE...`
//! (default `leap+stream`; docs/prefetch-real-traces.md).

use std::collections::HashSet;

use farvm_prefetch::eval::lru::{Evicted, Lru, Meta};
use farvm_prefetch::trace::read_trace;
use farvm_prefetch::{build, Candidates, Config};

#[derive(Default)]
struct Counts {
    misses: u64,
    adds: u64,
    hits: u64,
    markers: u64,
    never_touched: u64,
    evicted_before_use: u64,
}

impl Counts {
    /// Counts an eviction of an unused prefetch by where the page stands in the trace.
    fn evicted(&mut self, footprint: &HashSet<(u64, u64)>, ev: Option<Evicted>) {
        let Some(ev) = ev else { return };
        if !ev.meta.unused_prefetch {
            return;
        }
        if footprint.contains(&(ev.key, ev.page)) {
            self.evicted_before_use += 1;
        } else {
            self.never_touched += 1;
        }
    }
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut name = "leap+stream".to_string();
    if let Some(i) = args.iter().position(|a| a == "--prefetcher") {
        name = args.get(i + 1).cloned().expect("--prefetcher NAME");
        args.drain(i..=i + 1);
    }
    println!(
        "| trace | prefetcher | demand misses | prefetched | used | unused | never touched by the program | evicted before use | resident, unused at the end | marker faults |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for path in &args {
        let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let t = read_trace(file).unwrap_or_else(|e| panic!("{path}: {e}"));
        let footprint: HashSet<(u64, u64)> = t.records.iter().map(|r| (r.key, r.page)).collect();
        let mut lru = Lru::new((footprint.len() / 2).max(1));
        let mut pf = build(&name, &Config::default()).unwrap_or_else(|e| panic!("{e}"));
        let mut out = Candidates::new();
        let mut c = Counts::default();
        for r in &t.records {
            let (k, page) = (r.key, r.page);
            let admit = match lru.get(k, page) {
                Some(i) => {
                    let m = *lru.meta(i);
                    lru.touch(i);
                    if m.unused_prefetch {
                        lru.meta(i).unused_prefetch = false;
                        c.hits += 1;
                        c.markers += u64::from(m.marker);
                        if m.marker {
                            pf.on_marker_hit(k, page, r.time, &mut out);
                        }
                    }
                    m.unused_prefetch && m.marker
                }
                None => {
                    c.misses += 1;
                    let ev = lru.insert(k, page, Meta::default());
                    c.evicted(&footprint, ev);
                    pf.on_fault(k, page, r.time, &mut out);
                    true
                }
            };
            if !admit {
                continue;
            }
            for i in 0..out.len() {
                let q = out.as_slice()[i];
                if lru.get(k, q).is_some() {
                    continue;
                }
                c.adds += 1;
                let meta = Meta {
                    unused_prefetch: true,
                    marker: out.is_marker(i),
                    fetched_at: r.time,
                };
                let ev = lru.insert(k, q, meta);
                c.evicted(&footprint, ev);
            }
        }
        let resident_unused = lru.metas().filter(|m| m.unused_prefetch).count();
        let file = path.rsplit('/').next().unwrap_or(path);
        println!(
            "| {file} | {name} | {} | {} | {} | {} | {} | {} | {resident_unused} | {} |",
            c.misses,
            c.adds,
            c.hits,
            c.adds - c.hits,
            c.never_touched,
            c.evicted_before_use,
            c.markers
        );
    }
}
