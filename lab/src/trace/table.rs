//! Plain-text tables in the shape of Leap's Table 2: one row per metric, one column per
//! prefetcher.

use std::fmt::Write;

use farvm_prefetch::eval::Stats;

fn ratio(x: Option<f64>) -> String {
    x.map_or_else(|| "-".into(), |v| format!("{v:.4}"))
}

fn opt(x: Option<u64>) -> String {
    x.map_or_else(|| "-".into(), |v| v.to_string())
}

/// Renders `stats` as a metrics × prefetchers table.
pub fn render(stats: &[Stats], time_unit: &str) -> String {
    let rows: Vec<(String, Vec<String>)> = vec![
        (
            "accesses".into(),
            stats.iter().map(|s| s.accesses.to_string()).collect(),
        ),
        (
            "cache adds (prefetched)".into(),
            stats.iter().map(|s| s.cache_adds.to_string()).collect(),
        ),
        (
            "demand misses".into(),
            stats.iter().map(|s| s.demand_misses.to_string()).collect(),
        ),
        (
            "prefetch hits".into(),
            stats.iter().map(|s| s.prefetch_hits.to_string()).collect(),
        ),
        (
            "  of which markers".into(),
            stats.iter().map(|s| s.marker_hits.to_string()).collect(),
        ),
        (
            "evicted unused".into(),
            stats.iter().map(|s| s.evicted_unused.to_string()).collect(),
        ),
        (
            "accuracy".into(),
            stats.iter().map(|s| ratio(s.accuracy)).collect(),
        ),
        (
            "coverage".into(),
            stats.iter().map(|s| ratio(s.coverage)).collect(),
        ),
        (
            "waste".into(),
            stats.iter().map(|s| ratio(s.waste)).collect(),
        ),
        (
            format!("timeliness p50 ({time_unit})"),
            stats.iter().map(|s| opt(s.timeliness_p50)).collect(),
        ),
        (
            format!("timeliness p95 ({time_unit})"),
            stats.iter().map(|s| opt(s.timeliness_p95)).collect(),
        ),
    ];
    let label_w = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(0);
    let col_w: Vec<usize> = stats
        .iter()
        .enumerate()
        .map(|(i, s)| {
            rows.iter()
                .map(|r| r.1[i].len())
                .chain([s.prefetcher.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let _ = write!(out, "{:label_w$}", "");
    for (s, w) in stats.iter().zip(&col_w) {
        let _ = write!(out, "  {:>w$}", s.prefetcher);
    }
    out.push('\n');
    for (label, cells) in &rows {
        let pad = label_w - label.chars().count();
        let _ = write!(out, "{label}{:pad$}", "");
        for (c, w) in cells.iter().zip(&col_w) {
            let _ = write!(out, "  {c:>w$}");
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_column_per_prefetcher() {
        let a = Stats {
            prefetcher: "leap".into(),
            accesses: 10,
            coverage: Some(0.5),
            ..Stats::default()
        };
        let b = Stats {
            prefetcher: "leap+stream".into(),
            ..a.clone()
        };
        let t = render(&[a, b], "accesses");
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].ends_with("leap  leap+stream"), "{t}");
        let cov = lines.iter().find(|l| l.starts_with("coverage")).unwrap();
        assert_eq!(
            cov.split_whitespace().collect::<Vec<_>>(),
            ["coverage", "0.5000", "0.5000"]
        );
        assert!(t.contains("timeliness p95 (accesses)"));
        let acc = lines.iter().find(|l| l.starts_with("accuracy")).unwrap();
        assert!(acc.ends_with('-'), "missing ratios print as '-'");
    }
}
