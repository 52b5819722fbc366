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
