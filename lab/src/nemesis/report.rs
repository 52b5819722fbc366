//! The run's summary: per fault kind how many were drawn, per schedule its VMs' endings, its
//! violations and the command that replays it; printed at the end and written to
//! `LOGS/summary.md`.

use std::fmt::Write as _;

use super::invariants::Violation;
use super::schedule::{Kind, Schedule};
use super::vms::Ending;

/// What one schedule came to.
pub struct Outcome {
    pub schedule: Schedule,
    pub endings: Vec<Ending>,
    pub violations: Vec<Violation>,
    /// The schedule could not be run (the cluster did not come up, ...): not a violation of
    /// an invariant, but no pass either.
    pub error: Option<String>,
    pub secs: f64,
    pub replay: String,
    /// When each phase ended, from the cluster's start.
    pub phases: String,
}

impl Outcome {
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.error.is_none()
    }
}

pub fn markdown(command: &str, outcomes: &[Outcome]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "Command: `{command}`\n");
    s.push_str("| fault kind | drawn |\n|---|---|\n");
    let mut total = 0;
    for k in Kind::ALL {
        let n: usize = outcomes
            .iter()
            .map(|o| o.schedule.faults.iter().filter(|f| f.kind == k).count())
            .sum();
        total += n;
        let _ = writeln!(s, "| {} | {n} |", k.name());
    }
    let _ = writeln!(s, "| all | {total} |\n");
    s.push_str("| seed | faults | VMs: native / lost (74) / killed (137) / other | violations | s | result |\n");
    s.push_str("|---|---|---|---|---|---|\n");
    for o in outcomes {
        let count = |l: &str| o.endings.iter().filter(|e| e.label() == l).count();
        let other = o.endings.iter().filter(|e| e.is_violation()).count();
        let _ = writeln!(
            s,
            "| {} | {} | {} / {} / {} / {} | {} | {:.0} | {} |",
            o.schedule.seed,
            o.schedule.faults.len(),
            count("native"),
            count("lost(74)"),
            count("killed(137)"),
            other,
            o.violations.len(),
            o.secs,
            if o.error.is_some() {
                "ERROR"
            } else if o.passed() {
                "pass"
            } else {
                "FAIL"
            }
        );
    }
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| !o.passed()).collect();
    let _ = writeln!(
        s,
        "\n{} schedule(s), {} passed, {} failed.",
        outcomes.len(),
        outcomes.len() - failed.len(),
        failed.len()
    );
    for o in failed {
        let _ = writeln!(s, "\nseed {}:", o.schedule.seed);
        if let Some(e) = &o.error {
            let _ = writeln!(s, "- could not run: {e}");
        }
        for v in &o.violations {
            let _ = writeln!(s, "- {v}");
        }
        let _ = writeln!(s, "- replay: `{}`", o.replay);
    }
    s
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::nemesis::invariants::Invariant;
    use crate::nemesis::schedule::{draw, Shape};

    fn outcome(seed: u64, endings: Vec<Ending>, violations: Vec<Violation>) -> Outcome {
        let shape = Shape {
            racks: 3,
            servers_per_rack: 2,
            vms: 3,
            lease_ttl: Duration::from_secs(2),
            gc_grace: Duration::from_secs(5),
        };
        Outcome {
            schedule: draw(seed, 4, Duration::from_secs(10), &Kind::ALL, shape),
            endings,
            violations,
            error: None,
            secs: 20.0,
            replay: format!("farvm-lab nemesis --seed {seed} --schedules 1"),
            phases: String::new(),
        }
    }

    #[test]
    fn the_summary_counts_every_kind_drawn_and_names_each_failed_seed_with_its_replay() {
        let ok = outcome(
            1,
            vec![Ending::Native, Ending::MemoryLost, Ending::Killed],
            vec![],
        );
        let bad = outcome(
            2,
            vec![Ending::Native, Ending::Hung, Ending::Native],
            vec![Violation {
                invariant: Invariant::Hang,
                what: "vm1 was still running".into(),
            }],
        );
        let both = [ok, bad];
        let drawn = |k: Kind| {
            both.iter()
                .flat_map(|o| &o.schedule.faults)
                .filter(|f| f.kind == k)
                .count()
        };
        let md = markdown("farvm-lab nemesis", &both);
        for k in Kind::ALL {
            assert!(
                md.contains(&format!("| {} | {} |", k.name(), drawn(k))),
                "{md}"
            );
        }
        assert!(md.contains("| all | 8 |"), "{md}");
        assert!(
            md.contains("| 1 | 4 | 1 / 1 / 1 / 0 | 0 | 20 | pass |"),
            "{md}"
        );
        assert!(
            md.contains("| 2 | 4 | 2 / 0 / 0 / 1 | 1 | 20 | FAIL |"),
            "{md}"
        );
        assert!(md.contains("2 schedule(s), 1 passed, 1 failed."), "{md}");
        assert!(
            md.contains("- invariant 4 (nothing hung): vm1 was still running"),
            "{md}"
        );
        assert!(
            md.contains("- replay: `farvm-lab nemesis --seed 2 --schedules 1`"),
            "{md}"
        );
        assert!(!md.contains("seed 1:"), "a passed seed is not listed: {md}");
    }
}
