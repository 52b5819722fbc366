//! Per-process paging statistics: exact counts per guest process (keyed by the page-table root,
//! CR3, its vCPU's agent slot published at fault time, plus the pid beside it), kept live in a
//! fixed-size table.
//!
//! What is counted for whom:
//! - *faults* — demand reads, zero fills, waits on a read or an eviction already under way, and
//!   prefetch hits (a touch of a staged page, a fault on a prefetch in flight; probe hits among
//!   them) — go to the process whose vCPU faulted (the toucher), so a process's faults on
//!   non-resident pages are exactly its demand faults + waits + hits;
//! - *prefetch fates the guest did not cause* (issued, injected, staged, wasted, inferred hits,
//!   unconfirmed, probes staged and wasted) go to the process whose fault (or hit) made the
//!   prefetcher issue the read (the issuer), remembered per page (`PageMeta::owner`) until the
//!   fate is known. For a process's private pages toucher and issuer are the same process.
//!
//! Bounded memory, no lock, no allocation on the fault path: [`MAX_PROCESSES`] entries
//! allocated once. Only the fault-handler thread creates entries ([`ProcessIndex`]): a fault of a
//! process not in the table takes a free entry or recycles the least recently seen one. The same
//! CR3 with a new pid (the guest reused the page-table page for a new process) starts a new
//! entry; the old one keeps its counts, marked retired, until recycled. Other threads (the
//! completion path, the evictor) only add to an entry named by a [`ProcRef`], and an add for a
//! recycled entry is dropped, never counted for its next process: each entry's generation is a
//! seqlock (odd while the fault thread resets it) and the adder announces itself in `busy` while
//! it checks the generation and adds, which the recycler waits out before resetting.

use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::stats::{CounterValues, PrefetchEstimate};

/// Entries in the table (processes tracked at once).
pub const MAX_PROCESSES: usize = 128;

macro_rules! process_counters {
    ($($(#[$doc:meta])* $name:ident: $id:ident),* $(,)?) => {
        /// Names one per-process counter.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum ProcessCounter { $($(#[$doc])* $id,)* }

        const NCOUNTERS: usize = [$(ProcessCounter::$id),*].len();

        /// One process's counters at one instant.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct ProcessCounterValues { $($(#[$doc])* pub $name: u64,)* }

        impl ProcessCounterValues {
            fn from_array(a: &[u64; NCOUNTERS]) -> Self {
                Self { $($name: a[ProcessCounter::$id as usize],)* }
            }

            /// `(name, value)` pairs, for exporters.
            pub fn pairs(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }

            /// What was counted between `earlier` and `self`.
            pub fn since(&self, earlier: &Self) -> Self {
                Self { $($name: self.$name.saturating_sub(earlier.$name),)* }
            }
        }
    };
}

process_counters! {
    /// Faults on pages whose data was remote (each became a demand read).
    demand_faults: DemandFaults,
    /// Faults on never-written pages (zero-filled locally).
    zero_fills: ZeroFills,
    /// Faults that waited on a read or an eviction already under way for the page.
    wait_faults: WaitFaults,
    /// Prefetch reads issued on this process's behalf.
    prefetch_issued: PrefetchIssued,
    /// Its prefetched pages mapped before use (no hit can be observed on them).
    prefetch_injected: PrefetchInjected,
    /// Its prefetched pages left staged (markers and probes), so a touch is seen.
    prefetch_staged: PrefetchStaged,
    /// Its touches of staged prefetched pages.
    prefetch_marker_hits: PrefetchMarkerHits,
    /// Its faults on prefetches still in flight.
    prefetch_late_hits: PrefetchLateHits,
    /// Staged pages of its prefetches evicted untouched.
    prefetch_wasted: PrefetchWasted,
    /// Injected pages of its prefetches found modified at eviction (a use seen late).
    prefetch_inferred_hits: PrefetchInferredHits,
    /// Injected pages of its prefetches evicted with no evidence of use.
    prefetch_unconfirmed: PrefetchUnconfirmed,
    /// Its prefetches sampled as probes (left staged).
    probe_staged: ProbeStaged,
    /// Its touches of probes (staged or in flight).
    probe_hits: ProbeHits,
    /// Probes evicted untouched.
    probe_wasted: ProbeWasted,
}

impl ProcessCounterValues {
    /// Observed prefetch hits: staged pages touched plus faults on prefetches in flight. With
    /// every prefetch staged (`probe_every` = 1) this is every hit.
    pub fn prefetch_hits(&self) -> u64 {
        self.prefetch_marker_hits + self.prefetch_late_hits
    }

    /// Accuracy and coverage by the engine's estimator, from this process's counts alone.
    pub fn estimate(&self) -> PrefetchEstimate {
        PrefetchEstimate::of(&CounterValues {
            demand_faults: self.demand_faults,
            prefetch_issued: self.prefetch_issued,
            prefetch_injected: self.prefetch_injected,
            prefetch_staged: self.prefetch_staged,
            prefetch_marker_hits: self.prefetch_marker_hits,
            prefetch_late_hits: self.prefetch_late_hits,
            prefetch_wasted: self.prefetch_wasted,
            prefetch_inferred_hits: self.prefetch_inferred_hits,
            prefetch_unconfirmed: self.prefetch_unconfirmed,
            probe_staged: self.probe_staged,
            probe_hits: self.probe_hits,
            probe_wasted: self.probe_wasted,
            ..Default::default()
        })
    }
}

/// One process as the table knew it at a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessStats {
    /// Its page-table root (CR3 as its agent slot published it; 0 for the guest kernel, pid 0).
    pub cr3: u64,
    /// Its pid (0 = the guest kernel: kernel threads, idle).
    pub pid: u64,
    /// A later process took over this CR3 (this one has exited); kept until recycled.
    pub retired: bool,
    /// First and last fault or prefetch outcome seen, ns since the engine started.
    pub first_seen_ns: u64,
    /// See `first_seen_ns`.
    pub last_seen_ns: u64,
    /// Its exact counts.
    pub counters: ProcessCounterValues,
    /// Estimated hit rate of its prefetches (see `Stats::accuracy`).
    pub accuracy: f64,
    /// Estimated prefetch hits / (those + its demand faults).
    pub coverage: f64,
}

/// Faults the table could not give to any process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnattributedFaults {
    /// On a thread that is not a registered vCPU.
    pub no_vcpu: u64,
    /// On a vCPU without an agent slot (before the guest registered one).
    pub no_slot: u64,
    /// The slot was there but held no process (not initialised, mid-update, CR3 0).
    pub unreadable: u64,
}

impl UnattributedFaults {
    /// All of them.
    pub fn total(&self) -> u64 {
        self.no_vcpu + self.no_slot + self.unreadable
    }
}

/// Everything the table holds at one instant.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessSnapshot {
    /// Live and retired entries, most recently seen first.
    pub processes: Vec<ProcessStats>,
    /// Faults no process got.
    pub unattributed: UnattributedFaults,
    /// Entries recycled for new processes so far (their counts are gone).
    pub recycled: u64,
}

/// Names an entry at one generation: what the page metadata remembers per prefetched page.
/// Packed in a u64 (`index << 32 | generation`); [`ProcRef::NONE`] names nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcRef(u64);

impl ProcRef {
    /// Names no entry.
    pub const NONE: ProcRef = ProcRef(u64::MAX);

    fn new(index: usize, generation: u32) -> Self {
        ProcRef(((index as u64) << 32) | u64::from(generation))
    }

    /// The reference packed in `bits` (see [`ProcRef::bits`]).
    pub fn from_bits(bits: u64) -> Self {
        ProcRef(bits)
    }

    /// The packed form, for page metadata.
    pub fn bits(self) -> u64 {
        self.0
    }

    fn parts(self) -> Option<(usize, u32)> {
        let index = (self.0 >> 32) as usize;
        (self != Self::NONE && index < MAX_PROCESSES).then_some((index, self.0 as u32))
    }
}

struct Entry {
    /// Seqlock: 0 = never used, odd while the fault thread resets the entry.
    generation: AtomicU32,
    /// Adders from other threads between their generation check and their add.
    busy: AtomicU32,
    cr3: AtomicU64,
    pid: AtomicU64,
    retired: AtomicBool,
    first_ns: AtomicU64,
    last_ns: AtomicU64,
    counters: [AtomicU64; NCOUNTERS],
}

impl Entry {
    fn new() -> Self {
        Self {
            generation: AtomicU32::new(0),
            busy: AtomicU32::new(0),
            cr3: AtomicU64::new(0),
            pid: AtomicU64::new(0),
            retired: AtomicBool::new(false),
            first_ns: AtomicU64::new(0),
            last_ns: AtomicU64::new(0),
            counters: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The shared table (module docs).
pub struct ProcessTable {
    entries: Box<[Entry]>,
    no_vcpu: AtomicU64,
    no_slot: AtomicU64,
    unreadable: AtomicU64,
    recycled: AtomicU64,
}

impl Default for ProcessTable {
    fn default() -> Self {
        Self::new()
    }
}

/// Why a fault has no process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unattributed {
    /// On a thread that is not a registered vCPU.
    NoVcpu,
    /// On a vCPU without an agent slot.
    NoSlot,
    /// The slot held no process.
    Unreadable,
}

impl ProcessTable {
    /// An empty table.
    pub fn new() -> Self {
        Self {
            entries: (0..MAX_PROCESSES).map(|_| Entry::new()).collect(),
            no_vcpu: AtomicU64::new(0),
            no_slot: AtomicU64::new(0),
            unreadable: AtomicU64::new(0),
            recycled: AtomicU64::new(0),
        }
    }

    /// Counts a fault no process can be given.
    pub fn unattributed(&self, why: Unattributed) {
        let c = match why {
            Unattributed::NoVcpu => &self.no_vcpu,
            Unattributed::NoSlot => &self.no_slot,
            Unattributed::Unreadable => &self.unreadable,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Adds `n` to counter `c` of the entry `r` names, from any thread; dropped if `r` is
    /// [`ProcRef::NONE`] or the entry was recycled since `r` was taken.
    pub fn add(&self, r: ProcRef, c: ProcessCounter, n: u64) {
        let Some((i, generation)) = r.parts() else {
            return;
        };
        let e = &self.entries[i];
        // Dekker-style with `recycle`: the recycler publishes a new generation then waits for
        // `busy` to drain; an adder announces itself then checks the generation. SeqCst on both
        // sides: one of them sees the other.
        e.busy.fetch_add(1, Ordering::SeqCst);
        if e.generation.load(Ordering::SeqCst) == generation {
            e.counters[c as usize].fetch_add(n, Ordering::Relaxed);
        }
        e.busy.fetch_sub(1, Ordering::Release);
    }

    /// The counters of the live entry for `cr3` and `pid` (the VMM stamps guest phase events
    /// with them), if the table has one.
    pub fn counters_of(&self, cr3: u64, pid: u64) -> Option<ProcessCounterValues> {
        self.entries.iter().find_map(|e| {
            let s = read_entry(e)?;
            let cr3 = if pid == 0 { KERNEL_CR3 } else { cr3 };
            (!s.retired && s.cr3 == cr3 && s.pid == pid).then_some(s.counters)
        })
    }

    /// Every entry in use, most recently seen first (allocates: not for the fault path).
    pub fn snapshot(&self) -> ProcessSnapshot {
        let mut processes: Vec<ProcessStats> = self.entries.iter().filter_map(read_entry).collect();
        processes.sort_by_key(|p| std::cmp::Reverse(p.last_seen_ns));
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProcessSnapshot {
            processes,
            unattributed: UnattributedFaults {
                no_vcpu: l(&self.no_vcpu),
                no_slot: l(&self.no_slot),
                unreadable: l(&self.unreadable),
            },
            recycled: l(&self.recycled),
        }
    }
}

/// A consistent copy of entry `e`, if in use (retries while the fault thread resets it).
fn read_entry(e: &Entry) -> Option<ProcessStats> {
    loop {
        let g1 = e.generation.load(Ordering::Acquire);
        if g1 == 0 {
            return None;
        }
        if g1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let mut c = [0u64; NCOUNTERS];
        for (v, a) in c.iter_mut().zip(e.counters.iter()) {
            *v = a.load(Ordering::Relaxed);
        }
        let cr3 = e.cr3.load(Ordering::Relaxed);
        let pid = e.pid.load(Ordering::Relaxed);
        let retired = e.retired.load(Ordering::Relaxed);
        let first_seen_ns = e.first_ns.load(Ordering::Relaxed);
        let last_seen_ns = e.last_ns.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if e.generation.load(Ordering::Relaxed) != g1 {
            continue;
        }
        let counters = ProcessCounterValues::from_array(&c);
        let est = counters.estimate();
        return Some(ProcessStats {
            cr3,
            pid,
            retired,
            first_seen_ns,
            last_seen_ns,
            counters,
            accuracy: est.accuracy,
            coverage: est.coverage,
        });
    }
}

/// The fault thread's side: finds or creates the entry of a faulting process. Owns the
/// recency order (private arrays, no sharing) and a one-entry cache (faults come in runs from
/// one process). Fixed arrays: nothing allocated after construction.
pub struct ProcessIndex {
    /// Last use (a tick) per entry; 0 = free.
    used: Box<[u64; MAX_PROCESSES]>,
    /// Per entry: (cr3, pid) it is live for; retired entries hold `u64::MAX` as cr3.
    keys: Box<[(u64, u64); MAX_PROCESSES]>,
    tick: u64,
    last: Option<(u64, u64, ProcRef)>,
}

impl Default for ProcessIndex {
    fn default() -> Self {
        Self::new()
    }
}

const RETIRED: u64 = u64::MAX;
/// The page-table root the guest kernel's one entry is kept under (see [`ProcessIndex::lookup`]).
const KERNEL_CR3: u64 = 0;

impl ProcessIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self {
            used: Box::new([0; MAX_PROCESSES]),
            keys: Box::new([(0, 0); MAX_PROCESSES]),
            tick: 0,
            last: None,
        }
    }

    /// The entry of process (`cr3`, `pid`) seen at `now_ns`, created if new. `cr3` must not be
    /// 0 (a fault with no process is [`ProcessTable::unattributed`]). The guest kernel (pid 0:
    /// kernel threads and idle, which run on whatever address space they borrow) has one entry
    /// whatever its CR3, shown with CR3 0: a kernel thread on a process's page tables neither
    /// splits that process's counts nor retires its entry.
    pub fn lookup(&mut self, t: &ProcessTable, cr3: u64, pid: u64, now_ns: u64) -> ProcRef {
        let cr3 = if pid == 0 { KERNEL_CR3 } else { cr3 };
        self.tick += 1;
        let r = match self.last {
            Some((c, p, r)) if c == cr3 && p == pid => r,
            _ => {
                let r = self.find_or_create(t, cr3, pid, now_ns);
                self.last = Some((cr3, pid, r));
                r
            }
        };
        if let Some((i, _)) = r.parts() {
            self.used[i] = self.tick;
            t.entries[i].last_ns.store(now_ns, Ordering::Relaxed);
        }
        r
    }

    fn find_or_create(&mut self, t: &ProcessTable, cr3: u64, pid: u64, now_ns: u64) -> ProcRef {
        let mut free = None;
        for i in 0..MAX_PROCESSES {
            let (c, p) = self.keys[i];
            if self.used[i] == 0 {
                free.get_or_insert(i);
                continue;
            }
            if c != cr3 {
                continue;
            }
            if p == pid {
                return ProcRef::new(i, t.entries[i].generation.load(Ordering::Relaxed));
            }
            // The guest reused this page-table root for another process: the old one exited.
            self.keys[i].0 = RETIRED;
            t.entries[i].retired.store(true, Ordering::Relaxed);
        }
        let i = match free {
            Some(i) => i,
            None => {
                // Least recently seen (retired entries are never seen again, so they go first
                // once older than every live one).
                let i = (0..MAX_PROCESSES)
                    .min_by_key(|&i| self.used[i])
                    .unwrap_or(0);
                t.recycled.fetch_add(1, Ordering::Relaxed);
                i
            }
        };
        self.keys[i] = (cr3, pid);
        ProcRef::new(i, reset(&t.entries[i], cr3, pid, now_ns))
    }
}

/// Gives entry `e` to process (`cr3`, `pid`): a new (even) generation, counters zero. Returns
/// the generation.
fn reset(e: &Entry, cr3: u64, pid: u64, now_ns: u64) -> u32 {
    let g = e.generation.load(Ordering::Relaxed);
    // Odd: readers retry, adders holding the old generation are refused from here on.
    let odd = g.wrapping_add(1) | 1;
    e.generation.store(odd, Ordering::SeqCst);
    while e.busy.load(Ordering::SeqCst) != 0 {
        std::hint::spin_loop();
    }
    for c in e.counters.iter() {
        c.store(0, Ordering::Relaxed);
    }
    e.cr3.store(cr3, Ordering::Relaxed);
    e.pid.store(pid, Ordering::Relaxed);
    e.retired.store(false, Ordering::Relaxed);
    e.first_ns.store(now_ns, Ordering::Relaxed);
    e.last_ns.store(now_ns, Ordering::Relaxed);
    // Even again, never 0 (0 means "never used").
    let even = odd.wrapping_add(1).max(2);
    e.generation.store(even, Ordering::Release);
    even
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn counts_go_to_their_process_and_a_reused_cr3_starts_a_new_one() {
        let t = ProcessTable::new();
        let mut ix = ProcessIndex::new();
        let a = ix.lookup(&t, 0x1000, 7, 10);
        let b = ix.lookup(&t, 0x2000, 8, 20);
        assert_ne!(a, b);
        assert_eq!(ix.lookup(&t, 0x1000, 7, 30), a);
        t.add(a, ProcessCounter::DemandFaults, 3);
        t.add(b, ProcessCounter::ZeroFills, 5);
        t.add(ProcRef::NONE, ProcessCounter::ZeroFills, 5);
        assert_eq!(t.counters_of(0x1000, 7).unwrap().demand_faults, 3);
        assert_eq!(t.counters_of(0x2000, 8).unwrap().zero_fills, 5);
        // pid 9 now runs on CR3 0x1000: pid 7 exited. Its counts stay, retired.
        let c = ix.lookup(&t, 0x1000, 9, 40);
        assert_ne!(c, a);
        t.add(a, ProcessCounter::PrefetchWasted, 1); // a late outcome of pid 7's prefetch
        let s = t.snapshot();
        assert_eq!(s.processes.len(), 3);
        assert_eq!(s.processes[0].pid, 9, "most recent first");
        let old = s.processes.iter().find(|p| p.pid == 7).unwrap();
        assert!(old.retired);
        assert_eq!(
            (old.counters.demand_faults, old.counters.prefetch_wasted),
            (3, 1)
        );
        assert_eq!(
            t.counters_of(0x1000, 7),
            None,
            "retired entries are not live"
        );
        assert_eq!(t.counters_of(0x1000, 9).unwrap().demand_faults, 0);
    }

    #[test]
    fn kernel_threads_on_a_process_page_tables_do_not_split_its_counts() {
        let t = ProcessTable::new();
        let mut ix = ProcessIndex::new();
        let a = ix.lookup(&t, 0x1000, 7, 10);
        t.add(a, ProcessCounter::DemandFaults, 2);
        // A kernel thread borrows pid 7's address space, then another's: one kernel entry.
        let k = ix.lookup(&t, 0x1000, 0, 20);
        assert_eq!(ix.lookup(&t, 0x2000, 0, 25), k);
        t.add(k, ProcessCounter::DemandFaults, 5);
        assert_eq!(ix.lookup(&t, 0x1000, 7, 30), a, "pid 7 keeps its entry");
        t.add(a, ProcessCounter::DemandFaults, 1);
        let s = t.snapshot();
        assert_eq!(s.processes.len(), 2, "{s:?}");
        assert!(s.processes.iter().all(|p| !p.retired));
        assert_eq!(t.counters_of(0x1000, 7).unwrap().demand_faults, 3);
        assert_eq!(t.counters_of(0x2000, 0).unwrap().demand_faults, 5);
        let kernel = s.processes.iter().find(|p| p.pid == 0).unwrap();
        assert_eq!(kernel.cr3, 0);
    }

    #[test]
    fn a_full_table_recycles_the_least_recently_seen_and_drops_its_late_outcomes() {
        let t = ProcessTable::new();
        let mut ix = ProcessIndex::new();
        let refs: Vec<ProcRef> = (0..MAX_PROCESSES as u64)
            .map(|k| ix.lookup(&t, (k + 1) << 12, k + 100, k))
            .collect();
        // Touch all but the first again: the first is the least recently seen.
        for k in 1..MAX_PROCESSES as u64 {
            ix.lookup(&t, (k + 1) << 12, k + 100, 1000 + k);
        }
        let new = ix.lookup(&t, 0xdead_0000, 1, 5000);
        assert_eq!(new.parts().unwrap().0, refs[0].parts().unwrap().0);
        // A prefetch outcome of the evicted process arrives late: not counted for the new one.
        t.add(refs[0], ProcessCounter::PrefetchWasted, 1);
        t.add(new, ProcessCounter::DemandFaults, 1);
        let s = t.snapshot();
        assert_eq!(s.processes.len(), MAX_PROCESSES);
        assert_eq!(s.recycled, 1);
        let n = s.processes.iter().find(|p| p.cr3 == 0xdead_0000).unwrap();
        assert_eq!(n.counters.prefetch_wasted, 0);
        assert_eq!(n.counters.demand_faults, 1);
        assert!(!s.processes.iter().any(|p| p.cr3 == 1 << 12));
    }

    #[test]
    fn concurrent_adders_never_count_into_a_recycled_entry() {
        // Processes come and go (each new one recycles an entry of the full table) while two
        // threads add for whichever process is current. Every add made for a process still in
        // the table must be counted for it, exactly; adds for recycled processes must vanish.
        let t = Arc::new(ProcessTable::new());
        let mut ix = ProcessIndex::new();
        for k in 0..MAX_PROCESSES as u64 {
            ix.lookup(&t, (k + 1) << 12, k, 0);
        }
        let current = Arc::new(AtomicU64::new(ProcRef::NONE.bits()));
        let stop = Arc::new(AtomicBool::new(false));
        let adders: Vec<_> = (0..2)
            .map(|_| {
                let (t, cur, stop) = (t.clone(), current.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut made = std::collections::HashMap::<u64, u64>::new();
                    while !stop.load(Ordering::Relaxed) {
                        let bits = cur.load(Ordering::Acquire);
                        t.add(ProcRef::from_bits(bits), ProcessCounter::ProbeHits, 1);
                        *made.entry(bits).or_default() += 1;
                    }
                    made
                })
            })
            .collect();
        let rounds = 3000u64;
        let mut refs = Vec::new();
        for round in 0..rounds {
            let r = ix.lookup(&t, 0x100_0000 + (round << 12), 1_000_000 + round, round);
            refs.push(r);
            current.store(r.bits(), Ordering::Release);
            std::thread::yield_now();
        }
        stop.store(true, Ordering::Relaxed);
        let mut made = std::collections::HashMap::<u64, u64>::new();
        for h in adders {
            for (k, v) in h.join().unwrap() {
                *made.entry(k).or_default() += v;
            }
        }
        let s = t.snapshot();
        let mut checked = 0;
        for p in s.processes.iter().filter(|p| p.pid >= 1_000_000) {
            let round = (p.pid - 1_000_000) as usize;
            let want = made.get(&refs[round].bits()).copied().unwrap_or(0);
            assert_eq!(p.counters.probe_hits, want, "process of round {round}");
            checked += 1;
        }
        assert_eq!(checked, MAX_PROCESSES, "the last processes fill the table");
        assert!(s.recycled >= rounds);
    }
}
