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
//! Settings of the whole model, for the bound (`--grid`, docs/prefetch-real-traces.md, *How far
//! choosing can go*):
//! - `--depth-budget N`: the stream table's depth budget (one page of window per N pages a
//!   stream has used; default `composite::USED_PER_DEPTH`, 16).
//! - `--no-region`: no region read-around.
//! - `--wide K`: the next K pages after every fault are added to the answer (not under memory
//!   pressure), as the sandbox's wide arm does with `next-n`'s 8, but always.
//! - `--oracle-cap P` (with `--oracle-keep N`, `--oracle-min F`): a waste controller that knows
//!   the true waste: before each fault the replay's own waste so far (prefetched pages not used
//!   yet over pages fetched) is read, and while it is above P% (once F pages have been fetched,
//!   on demand or prefetched) the model decides as under memory pressure and keeps only the
//!   first N pages of its answer (0: all). No prefetcher can know this waste; it bounds what any
//!   waste controller could do.
//! - `--best-offset P`: a best-offset table (Michaud, HPCA 2016) over each process's faults:
//!   in rounds of 256 faults, each distance d of 1 to 8 pages scores when a fault lands d pages
//!   after one of the process's last 64 faults; the distances that scored on at least P% of the
//!   round's faults are fetched after every fault of the next round (not under pressure).
//!   `--best-offset-rounds` prints every round's scores to stderr.
//! - `--footprint G` (with `--footprint-min N`, `--footprint-markers`, `--footprint-idle`):
//!   spatial footprints (`footprint.rs`): a first fault in a 16-page block fetches the pages the
//!   process's last generation of a block with the same first offset touched (a generation
//!   lasts G faults), if they are at least N; with markers, every fetched page is a marker and
//!   its use joins the footprint; with idle, only after faults no other component answered.
//! - `--temporal K`: temporal correlation (as in temporal streaming, Wenisch et al., ISCA 2005,
//!   on the fault stream): a fault on a page the process faulted on before also fetches the
//!   K pages it faulted on right after that last fault (also under memory pressure).
//! - `--grid`: replays every trace under every combination of `--wide` {0, 1, 2, 8},
//!   `--depth-budget` {4, 16, 32}, run-ahead on/off, region read-around on/off and four
//!   controllers (none; the oracle at 9% keeping 1 page; at 10% keeping 1 after 300 pages; at
//!   9% keeping 2 after 300 pages), 192 settings, and prints per trace the best baseline (as
//!   `trace compare`), how many settings meet the rule, and the setting with the fewest misses
//!   at a waste of at most 10%: with a perfect choice per trace among all of them, could the
//!   rule hold?
//! - `--pareto`: the baselines at every setting of their one knob (`pareto.rs`: N or PW_max,
//!   28 settings) against `leap+stream` as `trace compare` runs it: per trace, how many baseline
//!   settings take fewer misses at no more waste, and the fewest misses a baseline setting takes
//!   at a waste of at most `leap+stream`'s, or at most 10% (docs/prefetch-real-traces.md,
//!   *Against every setting of the baselines*).
//! - `--sensitivity`: the rule of `trace compare` at local memory of 45%, 47.5%, 50%, 52.5% and
//!   55% of the footprint (`sensitivity.rs`; docs/prefetch-real-traces.md, *How firm the
//!   verdicts are*).
//!
//! A model to measure ideas before they go into the crate: it keeps its own state in hash maps
//! and allocates, which the crate's prefetchers must not. `model.rs` holds the model and its
//! replay, `best_offset.rs` the best-offset table, `footprint.rs` the footprint table, `grid.rs`
//! the bound, `pareto.rs` the baselines' sweep, `sensitivity.rs` the verdicts at other local
//! sizes; this file the options and the tables.

mod best_offset;
mod footprint;
mod grid;
mod model;
mod pareto;
mod sensitivity;

use std::collections::{HashMap, HashSet};

use farvm_prefetch::compare::MAX_WASTE;
use farvm_prefetch::composite;
use farvm_prefetch::{PageNo, ProcessKey};

use model::{fail, holes, load, replay, FootprintOpts, Opts, Oracle, Run, SOURCES};

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

fn main() {
    let mut opts = Opts {
        probe: 8,
        depth_budget: composite::USED_PER_DEPTH,
        ..Opts::default()
    };
    // The controller's and the footprints' settings may come before or after the option that
    // turns them on.
    let (mut oracle, mut oracle_cap) = (Oracle::default(), None);
    let (mut footprint, mut footprint_generation) = (FootprintOpts::default(), None);
    let mut run_grid = false;
    let mut run_pareto = false;
    let mut run_sensitivity = false;
    let mut baseline = None;
    let mut files = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| fail(format!("{a} needs a number ({what})")))
        };
        match a.as_str() {
            "--gate" => opts.gate = Some(value("score") as i64),
            "--probe" => opts.probe = value("one in N"),
            "--fill" => opts.fill = Some(value("pages") as u32),
            "--once" => opts.once = true,
            "--margin" => opts.margin = Some(value("pages")),
            "--next-k" => opts.next_k = value("pages"),
            "--no-runahead" => opts.no_runahead = true,
            "--no-region" => opts.no_region = true,
            "--depth-budget" => opts.depth_budget = value("pages"),
            "--wide" => opts.wide = value("pages"),
            "--oracle-cap" => oracle_cap = Some(value("percent") as f64 / 100.0),
            "--oracle-keep" => oracle.keep = value("pages") as usize,
            "--oracle-min" => oracle.min_fetched = value("pages"),
            "--grid" => run_grid = true,
            "--pareto" => run_pareto = true,
            "--sensitivity" => run_sensitivity = true,
            "--best-offset" => opts.best_offset = Some(value("percent") as u32),
            "--best-offset-rounds" => opts.best_offset_rounds = true,
            "--footprint" => footprint_generation = Some(value("faults")),
            "--footprint-min" => footprint.min_pages = value("pages") as u32,
            "--footprint-markers" => footprint.markers = true,
            "--footprint-idle" => footprint.idle = true,
            "--by-source" => opts.by_source = true,
            "--temporal" => opts.temporal = value("pages") as usize,
            "--holes" => opts.holes = true,
            "--baseline" => {
                baseline = Some(
                    args.next()
                        .unwrap_or_else(|| fail("--baseline needs a prefetcher's name")),
                )
            }
            _ if a.starts_with("--") => fail(format!("unknown option {a}")),
            _ => files.push(a),
        }
    }
    if files.is_empty() {
        fail("give at least one trace file (usage in the example's source)");
    }
    opts.oracle = oracle_cap.map(|cap| Oracle { cap, ..oracle });
    opts.footprint = footprint_generation.map(|generation| FootprintOpts {
        generation,
        ..footprint
    });
    if run_grid {
        grid::grid(&files);
        return;
    }
    if run_pareto {
        pareto::pareto(&files);
        return;
    }
    if run_sensitivity {
        sensitivity::sensitivity(&files);
        return;
    }
    println!("| trace | demand misses | waste | per process |");
    println!("|---|---:|---:|---|");
    let mut detail = String::new();
    let mut hole_rows = String::new();
    let mut first_touch_rows = String::new();
    for path in &files {
        let t = load(path);
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
