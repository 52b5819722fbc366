//! `--grid`: every trace under every combination of the whole-model options, and what a perfect
//! choice per trace could reach.

use farvm_prefetch::compare::{compare, MAX_WASTE};
use farvm_prefetch::{composite, Config};

use crate::model::{fail, load, replay, Opts, Oracle};

/// The settings `--grid` replays: every combination of the whole-model options.
fn grid_settings() -> Vec<(String, Opts)> {
    let controllers: [(&str, Option<Oracle>); 4] = [
        ("", None),
        (
            ", oracle 9% keep 1",
            Some(Oracle {
                cap: 0.09,
                keep: 1,
                min_fetched: 0,
            }),
        ),
        (
            ", oracle 10% keep 1 after 300",
            Some(Oracle {
                cap: 0.10,
                keep: 1,
                min_fetched: 300,
            }),
        ),
        (
            ", oracle 9% keep 2 after 300",
            Some(Oracle {
                cap: 0.09,
                keep: 2,
                min_fetched: 300,
            }),
        ),
    ];
    let mut v = Vec::new();
    for wide in [0, 1, 2, 8] {
        for depth_budget in [4, 16, 32] {
            for no_runahead in [false, true] {
                for no_region in [false, true] {
                    for (name, oracle) in controllers {
                        let label = format!(
                            "wide {wide}, budget {depth_budget}{}{}{name}",
                            if no_runahead { ", no run-ahead" } else { "" },
                            if no_region { ", no region" } else { "" },
                        );
                        v.push((
                            label,
                            Opts {
                                wide,
                                depth_budget,
                                no_runahead,
                                no_region,
                                oracle,
                                probe: 8,
                                ..Opts::default()
                            },
                        ));
                    }
                }
            }
        }
    }
    v
}

/// One trace under every setting of [`grid_settings`]: a table row, and which settings meet
/// the rule.
fn grid_row(path: &str, settings: &[(String, Opts)]) -> (String, Vec<bool>) {
    let t = load(path);
    let name = path.rsplit('/').next().unwrap_or(path);
    let name = name.strip_suffix(".trace.zst").unwrap_or(name);
    // The baselines exactly as `farvm-lab trace compare` replays them.
    let verdict = compare(&t, &Config::default(), &mut |_, _| {})
        .unwrap_or_else(|e| fail(format!("{path}: {e}")))
        .verdict();
    let (mut meets, mut fewest) = (Vec::new(), None::<(u64, f64, &str)>);
    for (label, opts) in settings {
        let run = replay(&t, *opts, None);
        let w = run.waste();
        meets.push(verdict.met_by(run.misses, w));
        if w <= MAX_WASTE && fewest.is_none_or(|f| run.misses < f.0) {
            fewest = Some((run.misses, w, label));
        }
    }
    let fewest = fewest.map_or("none at ≤ 10%".to_string(), |(m, w, l)| {
        format!("{m} / {:.1}% ({l})", 100.0 * w)
    });
    let meet = meets.iter().filter(|&&m| m).count();
    (
        format!(
            "| {name} | {} {} | {meet} | {fewest} |\n",
            verdict.best_baseline, verdict.best_baseline_misses
        ),
        meets,
    )
}

/// `--grid`: the traces shared out to one thread per core, rows printed in the order given.
pub(crate) fn grid(files: &[String]) {
    let settings = grid_settings();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let rows = std::sync::Mutex::new(vec![(String::new(), Vec::new()); files.len()]);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(path) = files.get(i) else { break };
                let row = grid_row(path, &settings);
                eprintln!("{path}: done");
                rows.lock().expect("no worker panicked")[i] = row;
            });
        }
    });
    println!(
        "{} settings per trace. A setting meets the rule when its demand misses are at most the best baseline's and none's, at a waste of at most 10%.\n",
        settings.len()
    );
    println!("| trace | best baseline (misses) | settings that meet the rule | fewest misses at a waste ≤ 10% (setting) |");
    println!("|---|---|---:|---|");
    let rows = rows.into_inner().expect("no worker panicked");
    let mut traces_met = vec![0; settings.len()];
    for (r, meets) in &rows {
        print!("{r}");
        for (n, &m) in traces_met.iter_mut().zip(meets) {
            *n += usize::from(m);
        }
    }
    let mut order: Vec<usize> = (0..settings.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(traces_met[i]));
    println!();
    println!(
        "| setting (the ten that meet the rule on the most traces, and the model's own) | traces |"
    );
    println!("|---|---:|");
    let own = settings
        .iter()
        .position(|(_, o)| {
            o.wide == 0
                && o.depth_budget == composite::USED_PER_DEPTH
                && !o.no_runahead
                && !o.no_region
                && o.oracle.is_none()
        })
        .expect("the grid holds the model's own setting");
    let mut shown: Vec<usize> = order.iter().copied().take(10).collect();
    if !shown.contains(&own) {
        shown.push(own);
    }
    for i in shown {
        println!(
            "| {} | {} of {} |",
            settings[i].0,
            traces_met[i],
            rows.len()
        );
    }
}
