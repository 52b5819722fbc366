//! `--sensitivity`: the rule of `trace compare` with local memory a little smaller or larger
//! than half the footprint. A verdict that flips between neighbouring sizes was decided by a
//! few misses or a fraction of a point of waste, not by how the prefetchers behave.

use farvm_prefetch::compare::compare_at;
use farvm_prefetch::Config;

use crate::model::{fail, load};

/// Local memory as a share of the footprint, in per mille: `trace compare` uses 500.
const LOCAL_PER_MILLE: [usize; 5] = [450, 475, 500, 525, 550];

/// `--sensitivity`: one row per trace, a verdict per local size, then the counts.
pub(crate) fn sensitivity(files: &[String]) {
    let sizes: Vec<String> = LOCAL_PER_MILLE
        .iter()
        .map(|m| format!("{:.1}%", *m as f64 / 10.0))
        .collect();
    println!(
        "| trace | {} | verdicts that differ from the one at 50% |",
        sizes.join(" | ")
    );
    println!("|---|{}---:|", "---|".repeat(sizes.len()));
    let mut met = [0usize; LOCAL_PER_MILLE.len()];
    let mut stable = 0;
    for path in files {
        let t = load(path);
        let name = path.rsplit('/').next().unwrap_or(path);
        let name = name.strip_suffix(".trace.zst").unwrap_or(name);
        let footprint = t.footprint();
        let mut cells = Vec::new();
        let mut verdicts = Vec::new();
        for (i, &m) in LOCAL_PER_MILLE.iter().enumerate() {
            let local_pages = (footprint * m / 1000).max(1);
            let v = compare_at(&t, &Config::default(), local_pages, &mut |_, _| {})
                .unwrap_or_else(|e| fail(format!("{path}: {e}")))
                .verdict();
            met[i] += usize::from(v.pass);
            verdicts.push(v.pass);
            cells.push(format!(
                "{} {} / {:.1}% vs {}",
                if v.pass { "meets" } else { "fails" },
                v.default_misses,
                100.0 * v.default_waste,
                v.best_baseline_misses.min(v.none_misses)
            ));
        }
        let at_half = verdicts[LOCAL_PER_MILLE.len() / 2];
        let differ = verdicts.iter().filter(|&&p| p != at_half).count();
        stable += usize::from(differ == 0);
        println!("| {name} | {} | {differ} |", cells.join(" | "));
    }
    let counts: Vec<String> = met.iter().map(|n| n.to_string()).collect();
    println!("| traces that meet the rule | {} | |", counts.join(" | "));
    println!();
    println!(
        "{stable} of {} traces have the same verdict at every size.",
        files.len()
    );
}
