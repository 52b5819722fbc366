//! Per-process paging statistics on the test guest: two processes with different access
//! patterns share one vCPU (time-sliced) on remote memory; the engine counts each one's faults
//! and prefetches by the page-table root and pid its agent slot publishes on every context
//! switch, and the counts match what the guest itself reports (heap size, passes) and what is
//! knowable from the workload.

mod remote_common;

use farvm_guest_agent::pv::phase;
use remote_common::{assert_native_checksums, run_remote, setup, spec};

#[test]
fn two_processes_get_their_own_exact_counts() {
    if !farvm_tests::kvm_available() {
        return;
    }
    // `seq` scans 48 MiB (warm-up pass, then 2 measured passes), `random` does random
    // read-modify-writes over 16 MiB; 16 MiB of local memory for both, so every page a scan
    // pass reaches was evicted since the pass before (48 MiB > 2 x 16 MiB: not even a working
    // set refault keeps it).
    let s = setup(
        "per-process",
        128 << 20,
        &["seq:ws=48M,passes=2", "random:ws=16M,ops=400000"],
    );
    let mut sp = spec("per-process", "16M", "leap+stream");
    // Every prefetch is a probe (staged): each touch of a non-resident page is then an event
    // the engine sees, so a process's demand faults + hits are exactly its touches of
    // non-resident pages.
    sp.probe_every = 1;
    let (report, stats) = run_remote(&s, &sp);
    assert_native_checksums(&s, &report, &stats);
    let pp = report
        .per_process
        .as_ref()
        .expect("per-process statistics of a VM on remote memory");
    let seq = report
        .processes
        .iter()
        .find(|p| p.pid == 1)
        .expect("pid 1 is seq");
    let rnd = report
        .processes
        .iter()
        .find(|p| p.pid == 2)
        .expect("pid 2 is random");
    let row = |pid: u64| {
        pp.processes
            .iter()
            .find(|r| r.pid == pid && !r.retired)
            .unwrap_or_else(|| panic!("no per-process row for pid {pid}: {pp:#?}"))
    };
    let (seq_row, rnd_row) = (row(1), row(2));
    for (r, rec) in [(seq_row, seq), (rnd_row, rnd)] {
        let c = &r.counters;
        eprintln!(
            "pid {} {:<7} cr3 {:#x}: demand {} zero {} waits {} issued {} hits {} (marker {}, \
             late {}) wasted {} accuracy {:.3} coverage {:.3}; heap {} pages",
            r.pid,
            r.name.as_deref().unwrap_or("?"),
            r.cr3,
            c.demand_faults,
            c.zero_fills,
            c.wait_faults,
            c.prefetch_issued,
            c.prefetch_hits(),
            c.prefetch_marker_hits,
            c.prefetch_late_hits,
            c.prefetch_wasted,
            r.accuracy,
            r.coverage,
            rec.heap_bytes / 4096
        );
        assert_eq!(r.cr3, rec.cr3, "the slot's CR3 is the mailbox's");
        // Every heap page was first written by the process itself: one zero fill each (plus
        // its stack and mailbox pages, which the kernel maps and the process touches).
        let heap_pages = rec.heap_bytes / 4096;
        assert!(
            c.zero_fills >= heap_pages && c.zero_fills <= heap_pages + 128,
            "pid {}: {} zero fills for a heap of {heap_pages} pages",
            r.pid,
            c.zero_fills
        );
        assert_eq!(c.prefetch_injected, 0, "every prefetch is a probe: {c:?}");
    }
    assert_eq!(seq_row.name.as_deref(), Some("seq"));
    assert_eq!(rnd_row.name.as_deref(), Some("random"));
    eprintln!(
        "attribution {:.5} of {} user faults; unattributed {:?}; {} processes tracked",
        pp.attribution,
        pp.user_faults,
        pp.unattributed,
        pp.processes.len()
    );
    assert!(pp.attribution >= 0.99, "{pp:#?}");
    // The VM-wide counters are the processes' plus the unattributed faults.
    let all = &stats.engine.counters;
    let sum = |f: fn(&farvm_ept::ProcessCounterValues) -> u64| -> u64 {
        pp.processes.iter().map(|r| f(&r.counters)).sum()
    };
    assert_eq!(all.prefetch_issued, sum(|c| c.prefetch_issued));
    assert_eq!(all.prefetch_staged, sum(|c| c.prefetch_staged));
    let missed = pp.unattributed.total();
    for (what, global, mine) in [
        ("demand faults", all.demand_faults, sum(|c| c.demand_faults)),
        (
            "marker hits",
            all.prefetch_marker_hits,
            sum(|c| c.prefetch_marker_hits),
        ),
        (
            "late hits",
            all.prefetch_late_hits,
            sum(|c| c.prefetch_late_hits),
        ),
    ] {
        assert!(
            mine <= global && global <= mine + missed,
            "{what}: processes {mine}, VM {global}, unattributed {missed}"
        );
    }

    // The measured passes of `seq`, from its own counters at its phase doorbells: each pass
    // touches every heap page once, and each was non-resident.
    let own = seq
        .measured_phase_own_paging()
        .expect("phase events carry the process's own counters");
    let vm_wide = seq
        .measured_phase_paging()
        .expect("phase events carry the VM's counters");
    let passes = 2;
    let touched = passes * seq.heap_bytes / 4096;
    let events = own.demand_faults + own.wait_faults + own.prefetch_hits();
    eprintln!(
        "seq measured passes: {events} faults on non-resident pages for {touched} page touches \
         (demand {}, waits {}, hits {}); the VM's counters over the same interval: demand {}, \
         marker hits {}",
        own.demand_faults,
        own.wait_faults,
        own.prefetch_hits(),
        vm_wide.demand_faults,
        vm_wide.prefetch_marker_hits
    );
    // A page mapped by a hit can be evicted again before the vCPU re-runs the access (used
    // prefetches go first), and the stack or mailbox page may be refaulted: a few extra
    // events, never fewer than the touches.
    assert!(
        events >= touched && events <= touched + touched / 50 + 64,
        "{events} events for {touched} touches: {own:?}"
    );
    assert_eq!(
        own.zero_fills, 0,
        "the heap was filled before the measured phase"
    );
    // The VM-wide difference counts `random`'s faults too (it ran meanwhile).
    assert!(
        vm_wide.demand_faults + vm_wide.prefetch_marker_hits + vm_wide.prefetch_late_hits > events,
        "the other process faulted during seq's measured phase: {vm_wide:?}"
    );
    // Different patterns, different prefetching: the scan is predicted, random access is not.
    assert!(seq_row.accuracy > 0.8, "{seq_row:?}");
    assert!(
        seq_row.coverage > rnd_row.coverage + 0.3,
        "coverage seq {} vs random {}",
        seq_row.coverage,
        rnd_row.coverage
    );
    let seq_phases: Vec<u32> = seq.events.iter().map(|e| e.phase).collect();
    assert!(seq_phases.contains(&phase::MEASURED), "{seq_phases:?}");
}
