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

/// The per-process statistics of `engine`'s guest, each process named by `name_of(pid)`.
pub fn per_process(
    engine: &farvm_ept::Engine,
    name_of: impl Fn(u64) -> Option<String>,
) -> PerProcessStats {
    let snap = engine.process_stats();
    let processes: Vec<ProcessRow> = snap
        .processes
        .into_iter()
        .map(|p| ProcessRow {
            pid: p.pid,
            name: name_of(p.pid),
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
