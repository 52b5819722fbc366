//! Per-process paging statistics as the operator sees them: the paging engine's exact
//! per-process counts (`farvm_ept::procstats`, keyed by the CR3 and pid a vCPU's agent slot
//! published at fault time) with each process's name from what the guest told the VMM — the
//! test guest's process mailboxes (its workload), or the Linux guest agent's process table.
//! Served by `farvm stats --per-process` (control socket command `processes`) and the metrics
//! endpoint (`farvm_process_*` series).

use farvm_ept::procstats::{ProcessCounterValues, UnattributedFaults};
use serde::Serialize;

/// One guest process's paging statistics.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessRow {
    /// Its pid (0: the guest kernel).
    pub pid: u64,
    /// Its name, if the guest told the VMM (`kernel` for pid 0: kernel threads and idle).
    pub name: Option<String>,
    /// Its page-table root.
    pub cr3: u64,
    /// Another process has taken over its page-table root since (it has exited).
    pub retired: bool,
    /// When the engine first and last saw a fault or prefetch of it, seconds since the engine
    /// started.
    pub first_seen_secs: f64,
    /// See `first_seen_secs`.
    pub last_seen_secs: f64,
    /// Its exact counts.
    pub counters: ProcessCounterValues,
    /// Faults on non-resident pages: demand faults, waits and prefetch hits.
    pub faults: u64,
    /// Observed prefetch hits (staged pages touched, faults on prefetches in flight).
    pub prefetch_hits: u64,
    /// Estimated hit rate of its prefetches.
    pub accuracy: f64,
    /// Estimated prefetch hits / (those + its demand faults).
    pub coverage: f64,
}

/// Every process the engine tracks, and how much of the guest's faulting it could attribute.
#[derive(Clone, Debug, Serialize)]
pub struct PerProcessStats {
    /// Most recently seen first.
    pub processes: Vec<ProcessRow>,
    /// Faults no process got.
    pub unattributed: UnattributedFaults,
    /// Faults (as in [`ProcessRow::faults`], plus zero fills) given to a guest process (pid
    /// other than 0).
    pub user_faults: u64,
    /// `user_faults / (user_faults + unattributed.no_vcpu + unattributed.unreadable)`: of the
    /// faults made while the guest agent published its slots, the share outside the guest
    /// kernel that was given to a process (1 when there were none). Faults before the agent
    /// registered (`unattributed.no_slot`: the guest's boot) are shown, not counted here.
    pub attribution: f64,
    /// Processes whose entries were recycled for newer ones (their counts are gone).
    pub recycled: u64,
}

/// Faults of one process the attribution share counts: everything it touched that was not
/// resident, zero fills included.
fn touched(c: &ProcessCounterValues) -> u64 {
    c.demand_faults + c.zero_fills + c.wait_faults + c.prefetch_hits()
}

/// The per-process statistics of `engine`'s guest, each process named from `names_of(pid)`
/// (the names it ran under, newest first: see [`name_rows`]).
pub fn per_process(
    engine: &farvm_ept::Engine,
    names_of: impl Fn(u64) -> Vec<String>,
) -> PerProcessStats {
    let snap = engine.process_stats();
    let mut processes: Vec<ProcessRow> = snap
        .processes
        .into_iter()
        .map(|p| ProcessRow {
            pid: p.pid,
            name: None,
            cr3: p.cr3,
            retired: p.retired,
            first_seen_secs: p.first_seen_ns as f64 / 1e9,
            last_seen_secs: p.last_seen_ns as f64 / 1e9,
            faults: p.counters.demand_faults + p.counters.wait_faults + p.counters.prefetch_hits(),
            prefetch_hits: p.counters.prefetch_hits(),
            counters: p.counters,
            accuracy: p.accuracy,
            coverage: p.coverage,
        })
        .collect();
    name_rows(&mut processes, names_of);
    let user_faults: u64 = processes
        .iter()
        .filter(|p| p.pid != 0)
        .map(|p| touched(&p.counters))
        .sum();
    let missed = snap.unattributed.no_vcpu + snap.unattributed.unreadable;
    PerProcessStats {
        processes,
        unattributed: snap.unattributed,
        user_faults,
        attribution: if user_faults + missed == 0 {
            1.0
        } else {
            user_faults as f64 / (user_faults + missed) as f64
        },
        recycled: snap.recycled,
    }
}

/// Names each row. A pid with several rows ran in several address spaces (an `exec` gives a
/// process a new one, and the agent reports the new name): its newest address space (latest
/// first seen) gets the name it has now, the one before it the name before that, and so on;
/// an address space older than every name kept gets the oldest. `names_of(pid)` gives the
/// names newest first.
pub fn name_rows(rows: &mut [ProcessRow], names_of: impl Fn(u64) -> Vec<String>) {
    for i in 0..rows.len() {
        let pid = rows[i].pid;
        let names = names_of(pid);
        let newer = rows
            .iter()
            .filter(|r| r.pid == pid && r.first_seen_secs > rows[i].first_seen_secs)
            .count();
        rows[i].name = names.get(newer).or(names.last()).cloned();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: u64, cr3: u64, first_seen_secs: f64) -> ProcessRow {
        ProcessRow {
            pid,
            name: None,
            cr3,
            retired: false,
            first_seen_secs,
            last_seen_secs: first_seen_secs,
            counters: ProcessCounterValues::default(),
            faults: 0,
            prefetch_hits: 0,
            accuracy: 0.0,
            coverage: 0.0,
        }
    }

    #[test]
    fn an_address_space_left_by_exec_keeps_the_name_it_ran_under() {
        // pid 40 ran `sh`, then exec'd `sqlite3` (a new page-table root); pid 7 never renamed.
        let mut rows = vec![
            row(40, 0x2000, 5.0),
            row(7, 0x3000, 1.0),
            row(40, 0x1000, 2.0),
        ];
        name_rows(&mut rows, |pid| match pid {
            40 => vec!["sqlite3".into(), "sh".into()],
            7 => vec!["init".into()],
            _ => vec![],
        });
        let names: Vec<_> = rows.iter().map(|r| r.name.as_deref()).collect();
        assert_eq!(names, [Some("sqlite3"), Some("init"), Some("sh")]);
        // Three address spaces, two names kept: the oldest gets the oldest name; no names, none.
        let mut rows = vec![
            row(40, 1, 1.0),
            row(40, 2, 2.0),
            row(40, 3, 3.0),
            row(9, 4, 1.0),
        ];
        name_rows(&mut rows, |pid| {
            if pid == 40 {
                vec!["c".into(), "b".into()]
            } else {
                vec![]
            }
        });
        let names: Vec<_> = rows.iter().map(|r| r.name.as_deref()).collect();
        assert_eq!(names, [Some("b"), Some("b"), Some("c"), None]);
    }
}
