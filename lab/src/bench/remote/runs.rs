//! Repeated runs of one cell (`--repeat`): which run stands for the cell, and how far apart
//! the runs were.

/// The run with the median `key` (the lower middle one of an even count); `None` if empty.
pub(crate) fn median_run<T>(mut runs: Vec<T>, key: impl Fn(&T) -> f64) -> Option<T> {
    if runs.is_empty() {
        return None;
    }
    runs.sort_by(|a, b| key(a).total_cmp(&key(b)));
    let mid = (runs.len() - 1) / 2;
    Some(runs.swap_remove(mid))
}

/// "" for one run, else " (±x%)": half the range of `runs` relative to their median.
pub(super) fn spread(runs: &[f64]) -> String {
    let mut v: Vec<f64> = runs.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() < 2 {
        return String::new();
    }
    v.sort_by(f64::total_cmp);
    let med = v[(v.len() - 1) / 2];
    let half_range = (v[v.len() - 1] - v[0]) / 2.0;
    format!(" (±{:.0}%)", 100.0 * half_range / med.max(1e-9))
}

#[cfg(test)]
mod tests {
    use super::{median_run, spread};

    #[test]
    fn median_run_is_the_middle_one_and_the_lower_middle_of_an_even_count() {
        let runs = vec![
            ("c", 30.0),
            ("a", 10.0),
            ("e", 50.0),
            ("b", 20.0),
            ("d", 40.0),
        ];
        assert_eq!(median_run(runs, |r| r.1).map(|r| r.0), Some("c"));
        let even = vec![("b", 2.0), ("d", 4.0), ("a", 1.0), ("c", 3.0)];
        assert_eq!(median_run(even, |r| r.1).map(|r| r.0), Some("b"));
        // A timed-out run (infinite key) is never the median of runs that finished.
        let with_timeout = vec![("t", f64::INFINITY), ("x", 5.0), ("y", 6.0)];
        assert_eq!(median_run(with_timeout, |r| r.1).map(|r| r.0), Some("y"));
        assert_eq!(median_run(Vec::<(u8, f64)>::new(), |r| r.1), None);
    }

    #[test]
    fn spread_is_half_the_range_over_the_median() {
        assert_eq!(spread(&[100.0]), "");
        assert_eq!(spread(&[90.0, 100.0, 110.0]), " (±10%)");
        assert_eq!(spread(&[f64::NAN, 100.0]), "");
    }
}
