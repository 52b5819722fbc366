//! How a run of `bench compare` failed. A failed run of a compared setup (a crash, a non-zero
//! exit, a checksum other than all-local's, a timeout, the cgroup's OOM) is that setup's result
//! in its cell, marked with the reason in the table, the JSON and the charts, not an error that
//! ends the bench: kernel swap failing at a budget is what the comparison is there to show.

use std::fmt;

use serde::Serialize;

/// Why one run did not give a result.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Failure {
    /// The run passed --cell-timeout.
    Timeout { secs: u64 },
    /// The kernel's OOM killer ended the VMM, or it failed while its cgroup was at the limit.
    Oom { detail: String },
    /// The VMM was killed by a signal other than the OOM killer's.
    Crash { detail: String },
    /// The VMM exited non-zero, gave no usable report, or its guest did not finish the workload.
    Exit { detail: String },
    /// The workload finished with another checksum than all-local's.
    Checksum { got: u64, want: u64 },
}

impl Failure {
    /// A one-word name of the kind, for the charts' labels ("failed: checksum").
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::Timeout { .. } => "timeout",
            Failure::Oom { .. } => "OOM",
            Failure::Crash { .. } => "crash",
            Failure::Exit { .. } => "exit",
            Failure::Checksum { .. } => "checksum",
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Timeout { secs } => write!(f, "timeout (> {secs} s)"),
            Failure::Oom { detail } | Failure::Crash { detail } | Failure::Exit { detail } => {
                f.write_str(detail)
            }
            Failure::Checksum { got, want } => {
                write!(f, "checksum {got:#x} differs from all-local's {want:#x}")
            }
        }
    }
}

/// A cell (one setup of one workload and budget) some of whose runs failed: the first failure
/// and how many of the runs failed. Such a cell has no time and takes no part in the ratios.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FailedCell {
    /// [`Failure::kind`] of the first failed run.
    pub kind: &'static str,
    /// The first failed run's reason ([`Failure`]'s `Display`).
    pub reason: String,
    pub failed_runs: usize,
    pub runs: usize,
}

impl FailedCell {
    /// The failed cell of `failures` (the failed runs' failures, in run order) out of `runs`
    /// runs; `None` when no run failed.
    pub fn of(failures: &[&Failure], runs: usize) -> Option<Self> {
        let first = failures.first()?;
        Some(FailedCell {
            kind: first.kind(),
            reason: first.to_string(),
            failed_runs: failures.len(),
            runs,
        })
    }

    /// The chart label of the cell.
    pub fn label(&self) -> String {
        format!("failed: {}", self.kind)
    }
}

impl fmt::Display for FailedCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "failed: {}", self.reason)?;
        if self.runs > 1 {
            write!(f, " ({} of {} runs)", self.failed_runs, self.runs)?;
        }
        Ok(())
    }
}

/// How a run killed by signal `sig` ended, with the cgroup's OOM record when it ran in one
/// (`hits`: times the cgroup hit its limit during the run, [`super::host::MemCgroup::limit_hits`]).
/// A VMM the kernel's OOM killer ended is "OOM-killed". A SIGSEGV/SIGBUS at the limit of a
/// cgroup whose OOM killer is off is the kernel failing a write to the VMM's memory that it
/// makes on the VMM's behalf: a fault taken inside the kernel cannot wait in the cgroup's OOM
/// wait as a user fault does, and when it is the update of a thread's rseq area on the way back
/// to user space, the kernel sends SIGSEGV (si_code SI_KERNEL; seen on this host with ftrace,
/// and gone with glibc's rseq off, the VMM then waiting at the limit instead). Reported as such
/// rather than as a bare signal.
pub fn signal_ending(sig: i32, cgroup_events: Option<&str>, hits: u64) -> Failure {
    let name = match sig {
        libc::SIGKILL => "SIGKILL",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGABRT => "SIGABRT",
        _ => "",
    };
    let s = format!("killed by signal {sig} {name}")
        .trim_end()
        .to_string();
    let Some(events) = cgroup_events else {
        return Failure::Crash { detail: s };
    };
    let oom_kill = events
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .any(|kv| kv[0] == "oom_kill" && kv[1] != "0");
    if oom_kill {
        Failure::Oom {
            detail: format!("OOM-killed ({s}; cgroup: {events})"),
        }
    } else if hits > 0
        && events.contains("oom_kill_disable 1")
        && (sig == libc::SIGSEGV || sig == libc::SIGBUS)
    {
        Failure::Oom {
            detail: format!(
                "{name} from the kernel at the cgroup's limit ({hits} charges refused, OOM \
                 killer off): a write the kernel makes to the VMM's memory (a thread's rseq \
                 area) could not wait for memory"
            ),
        }
    } else if !events.is_empty() {
        Failure::Crash {
            detail: format!("{s} (cgroup: {events})"),
        }
    } else {
        Failure::Crash { detail: s }
    }
}

/// The first non-blank line of a VMM's error output, at most 160 characters: enough to say why
/// it failed in a table cell.
pub fn first_line(stderr: &str) -> String {
    let first = stderr.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    first.trim().chars().take(160).collect()
}

/// How a run that failed while its cgroup hit its limit (`hits` times) ended: `how` (exit
/// status) and the first line of its error output.
pub fn oom_ending(how: &str, stderr: &str, hits: u64) -> Failure {
    Failure::Oom {
        detail: format!(
            "failed at the cgroup's limit ({hits} charges refused): {how}: {}",
            first_line(stderr)
        ),
    }
}

/// A run that exited `how` (its exit status) outside the cgroup's limit: the first line of its
/// error output says why.
pub fn exit_ending(how: &str, stderr: &str) -> Failure {
    let first = first_line(stderr);
    Failure::Exit {
        detail: match first.is_empty() {
            true => how.to_string(),
            false => format!("{how}: {first}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_under_the_cgroups_oom_is_reported_as_such() {
        let v1 = "oom_kill_disable 1 under_oom 0 oom_kill 0";
        assert_eq!(
            signal_ending(11, None, 0),
            Failure::Crash {
                detail: "killed by signal 11 SIGSEGV".into()
            }
        );
        assert_eq!(
            signal_ending(11, Some(v1), 0).to_string(),
            format!("killed by signal 11 SIGSEGV (cgroup: {v1})")
        );
        let segv = signal_ending(11, Some(v1), 3);
        assert_eq!(segv.kind(), "OOM");
        assert!(
            segv.to_string()
                .starts_with("SIGSEGV from the kernel at the cgroup's limit (3 charges refused"),
            "{segv}"
        );
        let killed = signal_ending(9, Some("oom_kill_disable 0 under_oom 0 oom_kill 1"), 1);
        assert_eq!(killed.kind(), "OOM");
        assert!(
            killed
                .to_string()
                .starts_with("OOM-killed (killed by signal 9 SIGKILL"),
            "{killed}"
        );
        let v2 = "low 0 high 120 max 0 oom 0 oom_kill 1 oom_group_kill 0";
        assert!(signal_ending(9, Some(v2), 0)
            .to_string()
            .starts_with("OOM-killed"));
    }

    #[test]
    fn an_exit_names_its_status_and_first_error_line() {
        let e = exit_ending("exit 1", "\n  error: the guest faulted\nmore\n");
        assert_eq!(e.kind(), "exit");
        assert_eq!(e.to_string(), "exit 1: error: the guest faulted");
        assert_eq!(exit_ending("exit 2", "").to_string(), "exit 2");
        let oom = oom_ending("exit 70", "guest: triple fault", 4);
        assert_eq!(
            oom.to_string(),
            "failed at the cgroup's limit (4 charges refused): exit 70: guest: triple fault"
        );
    }

    #[test]
    fn a_cell_names_its_first_failure_and_how_many_runs_failed() {
        let sum = Failure::Checksum {
            got: 0xbad,
            want: 0x600d,
        };
        let late = Failure::Timeout { secs: 90 };
        assert_eq!(FailedCell::of(&[], 3), None);
        let one = FailedCell::of(&[&sum], 1).expect("a failure");
        assert_eq!(
            one.to_string(),
            "failed: checksum 0xbad differs from all-local's 0x600d"
        );
        assert_eq!(one.label(), "failed: checksum");
        let two = FailedCell::of(&[&late, &sum], 3).expect("a failure");
        assert_eq!(two.to_string(), "failed: timeout (> 90 s) (2 of 3 runs)");
        assert_eq!(two.label(), "failed: timeout");
        let json = serde_json::to_value(&two).expect("serializes");
        assert_eq!(json["kind"], "timeout");
        assert_eq!(json["failed_runs"], 2);
    }
}
