//! Per-VM metrics: counters (relaxed atomics), latency histograms (HDR, one set per recording
//! thread so recording never contends; merged on snapshot), and the serialisable [`Stats`]
//! snapshot (exporters such as the VMM's Prometheus endpoint render it).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident: $id:ident),* $(,)?) => {
        /// Names one live counter of [`Counters`].
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum Counter { $($(#[$doc])* $id,)* }

        const NCOUNTERS: usize = [$(Counter::$id),*].len();

        /// A copy of [`Counters`] at one instant.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
        pub struct CounterValues { $($(#[$doc])* pub $name: u64,)* }

        impl Counters {
            /// The value of every counter now.
            pub fn snapshot(&self) -> CounterValues {
                CounterValues { $($name: self.get(Counter::$id),)* }
            }
        }

        impl CounterValues {
            /// `(name, value)` pairs, for exporters.
            pub fn pairs(&self) -> Vec<(&'static str, u64)> {
                vec![$((stringify!($name), self.$name),)*]
            }

            /// What was counted between `earlier` and `self` (field by field; a counter never
            /// goes down, so a smaller value means `earlier` came from another engine: 0).
            pub fn since(&self, earlier: &CounterValues) -> CounterValues {
                CounterValues { $($name: self.$name.saturating_sub(earlier.$name),)* }
            }
        }
    };
}

/// Live counters, bumped with relaxed atomics from any engine thread.
pub struct Counters([AtomicU64; NCOUNTERS]);

impl Default for Counters {
    fn default() -> Self {
        Self(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl Counters {
    #[inline]
    /// Adds `n` to counter `c`.
    pub fn add(&self, c: Counter, n: u64) {
        self.0[c as usize].fetch_add(n, Ordering::Relaxed);
    }

    #[inline]
    /// Adds 1 to counter `c`.
    pub fn inc(&self, c: Counter) {
        self.add(c, 1);
    }

    /// Sets a counter whose running total is kept elsewhere (the page space's walk counts).
    #[inline]
    pub fn set(&self, c: Counter, v: u64) {
        self.0[c as usize].store(v, Ordering::Relaxed);
    }

    #[inline]
    /// Counter `c` now.
    pub fn get(&self, c: Counter) -> u64 {
        self.0[c as usize].load(Ordering::Relaxed)
    }
}

counters! {
    /// Guest faults on pages whose data is remote (each became a demand read).
    demand_faults: DemandFaults,
    /// Guest faults on never-written pages, served locally with zeros.
    zero_fills: ZeroFills,
    /// Faults on a page whose read was already in flight (waited on the same fetch).
    dedup_waits: DedupWaits,
    /// Faults on pages being evicted (rescued or refetched).
    evicting_waits: EvictingWaits,
    /// Faults on pages already local (raced with an install; woken).
    spurious_faults: SpuriousFaults,
    /// Demand faults that had to wait for the evictor to free a frame.
    frame_waits: FrameWaits,
    /// Demand faults on pages evicted less than one budget of evictions ago (working set).
    hot_refaults: HotRefaults,
    /// Demand faults (remote or never-written pages) whose thread id is not a registered vCPU:
    /// KVM resolved them on another thread (its async page-fault worker), so they cannot be
    /// attributed to a guest process.
    unattributed_faults: UnattributedFaults,
    /// Reads issued to the store at demand priority.
    remote_reads_demand: RemoteReadsDemand,
    /// Demand reads the fault handler served itself, synchronously (`RemoteStore::read_now`).
    sync_demand_reads: SyncDemandReads,
    /// Reads issued to the store at prefetch priority.
    remote_reads_prefetch: RemoteReadsPrefetch,
    /// Page write-backs completed successfully.
    remote_writes: RemoteWrites,
    /// Reads answered "absent on server": for a page the engine wrote back, its data is lost
    /// (the page becomes `LOST`).
    remote_absent: RemoteAbsent,
    /// Reads whose content is not what the engine last wrote back or read for the page (a
    /// memory server returned an older or damaged copy; the wire checksums cannot see it): the
    /// page becomes `LOST` rather than give the guest wrong data.
    remote_stale: RemoteStale,
    /// Guest faults and VMM accesses on `LOST` pages (each is reported to the VMM).
    lost_accesses: LostAccesses,
    /// Store requests that failed (read or write).
    store_errors: StoreErrors,
    /// Demand reads re-submitted after a failure.
    read_retries: ReadRetries,
    /// Bytes received from the store.
    bytes_read: BytesRead,
    /// Bytes sent to the store.
    bytes_written: BytesWritten,
    /// Prefetch reads issued.
    prefetch_issued: PrefetchIssued,
    /// Prefetched pages injected into the guest view before use.
    prefetch_injected: PrefetchInjected,
    /// Prefetched pages left staged (markers and probes) to observe hits.
    prefetch_staged: PrefetchStaged,
    /// Staged pages the guest then touched (exact hits).
    prefetch_marker_hits: PrefetchMarkerHits,
    /// Guest faults on a page whose prefetch was still in flight (late hits).
    prefetch_late_hits: PrefetchLateHits,
    /// Injected pages found modified at eviction (a use seen after the fact).
    prefetch_inferred_hits: PrefetchInferredHits,
    /// Staged pages evicted without being touched (exact waste).
    prefetch_wasted: PrefetchWasted,
    /// Prefetches the engine's sampler chose as probes (1 in `probe_every`, markers or not),
    /// left staged on arrival.
    probe_staged: ProbeStaged,
    /// Probes the guest touched (staged hit or late hit).
    probe_hits: ProbeHits,
    /// Probes evicted untouched.
    probe_wasted: ProbeWasted,
    /// Injected pages evicted with no evidence of use (an upper bound on injected waste).
    prefetch_unconfirmed: PrefetchUnconfirmed,
    /// Candidates skipped: not remote (already local, in flight, or never written).
    prefetch_skipped: PrefetchSkipped,
    /// Candidates deferred for lack of a frame below the low-water mark or an in-flight slot.
    prefetch_deferred: PrefetchDeferred,
    /// Deferred candidates dropped: the deferral queue was full or they went stale.
    prefetch_dropped: PrefetchDropped,
    /// Pages evicted.
    evictions: Evictions,
    /// Evicted pages that were clean and had a valid remote copy (no I/O).
    evict_clean: EvictClean,
    /// Evicted pages still all-zero and never stored: returned to "never written".
    evict_zero: EvictZero,
    /// Evicted pages written back first.
    evict_dirty: EvictDirty,
    /// Eviction cancelled because the guest faulted on the page meanwhile.
    evict_rescued: EvictRescued,
    /// Write-backs that failed (the page stays resident).
    evict_write_failed: EvictWriteFailed,
    /// Victims whose content changed after they were taken out of the guest view and
    /// fingerprinted: something wrote the page through a mapping that should no longer
    /// exist. Kept resident with their new content (written back at their next eviction)
    /// instead of freed, where that write would have been lost.
    evict_late_writes: EvictLateWrites,
    /// Victims whose frame was in neither the guest view nor its landing place when the
    /// evictor came to move it out (anonymous guest memory): their data is not where the
    /// engine left it, so they become `LOST` (the VM stops at the next access, naming the
    /// page) instead of being fingerprinted, written back and freed as whatever an empty
    /// slot reads (zeros).
    evict_vanished: EvictVanished,
    /// Reads landed in a free frame of the pool (anonymous guest memory), not in a page the
    /// kernel allocates and zeroes.
    pool_landings: PoolLandings,
    /// Single-page reads landed in a bounce page (anonymous guest memory) and installed with
    /// a copy, which flushes no TLB (a move would).
    bounce_landings: BounceLandings,
    /// Pages kept resident: the kernel refused to move them out of the guest view (anonymous
    /// guest memory, EBUSY: shared or pinned) several times in a row (retried later, ever
    /// more rarely; counted each time a page is kept anew).
    evict_unmovable: EvictUnmovable,
    /// Eviction rounds.
    evict_rounds: EvictRounds,
    /// Stage-2 pre-fault calls attempted.
    prefault_calls: PrefaultCalls,
    /// Stage-2 pre-fault unsupported (detected once, then disabled).
    prefault_unsupported: PrefaultUnsupported,
    /// Pages whose stage-2 entries a pre-fault call built (the injected pages the guest can
    /// touch without a stage-2 fault).
    prefault_pages: PrefaultPages,
    /// Pre-fault calls that failed otherwise (those pages fall back to the host-PTE install).
    prefault_failed: PrefaultFailed,
    /// VMM reads/writes resolved through the engine.
    vmm_accesses: VmmAccesses,
    /// Walks of a guest process's page tables (virtual page space, `translate::VirtualPages`).
    page_table_walks: PageTableWalks,
    /// Faults the prefetcher saw as guest-virtual pages of their process.
    faults_seen_virtual: FaultsSeenVirtual,
    /// Faults the virtual page space left guest-physical (unattributed, not mapped by the
    /// process, or no walk allowed yet). Zero with the physical page space, which translates
    /// nothing.
    faults_seen_physical: FaultsSeenPhysical,
    /// Prefetch candidates (virtual pages) that mapped to no resident-table guest page.
    candidates_unmapped: CandidatesUnmapped,
    /// Faults recorded in the fault log (`EngineConfig::fault_log_records`): the position a
    /// live reader can mark and find again in the log written at exit.
    fault_log_records: FaultLogRecords,
    /// Pages re-sealed under a rotated key by the evictor's sweep (`reseal`).
    resealed_pages: ResealedPages,
    /// Re-seals that failed (the page is tried again).
    reseal_failed: ResealFailed,
    /// Re-seal sweeps finished: key rotations whose previous key the store could drop.
    reseal_sweeps: ResealSweeps,
}

/// Which latency a sample belongs to.
#[derive(Clone, Copy, Debug)]
pub enum Hist {
    /// Demand fault read from the uffd -> page mapped and the vCPU's wake issued.
    FaultService,
    /// Fault read -> zero page installed.
    ZeroFill,
    /// Read submitted -> completion delivered (the store's share).
    StoreRead,
    /// Completion delivered -> UFFDIO_CONTINUE returned (hash + install + wake).
    Install,
    /// Staged page arrival -> first guest touch (prefetch timeliness).
    Timeliness,
    /// One eviction round (claim, zap, hash, write back, free).
    EvictRound,
    /// The UFFDIO_WAKE call that resumes a vCPU after a demand fault. On 2 busy cores it
    /// often returns only after the woken vCPU has run on this CPU, so it is reported apart
    /// from the fault service time.
    Wake,
}
const NHIST: usize = 7;

/// Histogram slots: each recording thread sticks to one, so locks are uncontended.
const SLOTS: usize = 8;

/// Latency histograms (HDR), one set per recording-thread slot, merged on read.
pub struct Histograms {
    slots: [Mutex<[Histogram<u64>; NHIST]>; SLOTS],
}

static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);
thread_local! {
    static MY_SLOT: Cell<usize> = Cell::new(NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SLOTS);
}

fn new_hist() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits; allocated once here, recording never allocates.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds are valid")
}

impl Default for Histograms {
    fn default() -> Self {
        Self {
            slots: std::array::from_fn(|_| Mutex::new(std::array::from_fn(|_| new_hist()))),
        }
    }
}

impl Histograms {
    /// Records `ns` nanoseconds in histogram `h` (allocation-free, uncontended lock).
    pub fn record(&self, h: Hist, ns: u64) {
        let slot = MY_SLOT.with(|s| s.get());
        if let Ok(mut g) = self.slots[slot].lock() {
            g[h as usize].saturating_record(ns.max(1));
        }
    }

    fn merged(&self) -> [Histogram<u64>; NHIST] {
        let mut out: [Histogram<u64>; NHIST] = std::array::from_fn(|_| new_hist());
        for s in &self.slots {
            if let Ok(g) = s.lock() {
                for (o, h) in out.iter_mut().zip(g.iter()) {
                    let _ = o.add(h);
                }
            }
        }
        out
    }
}

/// Summary of one latency distribution, in nanoseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencySummary {
    /// Observations.
    pub count: u64,
    /// Smallest.
    pub min: u64,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest.
    pub max: u64,
    /// Mean.
    pub mean: f64,
}

impl LatencySummary {
    fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        Self {
            count: h.len(),
            min: h.min(),
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            mean: h.mean(),
        }
    }
}

/// Prefetch accuracy and coverage estimated from counters (a whole run's, or the difference
/// between two snapshots, e.g. one phase of a workload).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PrefetchEstimate {
    /// Probe hits / resolved probes (probes are a systematic 1-in-N sample of every prefetch);
    /// `accuracy_markers` when no probe resolved.
    pub accuracy: f64,
    /// Hits / resolved staged pages (prefetcher markers and probes).
    pub accuracy_markers: f64,
    /// Estimated prefetch hits / (those + demand faults); injected hits are estimated as
    /// `injected * accuracy`.
    pub coverage: f64,
    /// The estimated prefetch hits behind `coverage`.
    pub hits: f64,
}

impl PrefetchEstimate {
    /// Estimates from the counters `c` (a run's, or the difference of two snapshots).
    pub fn of(c: &CounterValues) -> Self {
        let ratio = |hits: u64, misses: u64| {
            if hits + misses == 0 {
                None
            } else {
                Some(hits as f64 / (hits + misses) as f64)
            }
        };
        let accuracy_markers = ratio(c.prefetch_marker_hits, c.prefetch_wasted).unwrap_or(0.0);
        let accuracy = ratio(c.probe_hits, c.probe_wasted).unwrap_or(accuracy_markers);
        let hits = c.prefetch_marker_hits as f64
            + c.prefetch_late_hits as f64
            + c.prefetch_injected as f64 * accuracy;
        // Late hits are not demand faults (the fault joined the in-flight prefetch), so the
        // misses are exactly the demand faults.
        let denom = hits + c.demand_faults as f64;
        let coverage = if denom <= 0.0 { 0.0 } else { hits / denom };
        Self {
            accuracy,
            accuracy_markers,
            coverage,
            hits,
        }
    }
}

/// Everything the VMM serves on `farvm stats` / Prometheus for one VM.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Every counter.
    pub counters: CounterValues,
    /// Guest RAM in pages.
    pub total_pages: u64,
    /// The local budget in pages.
    pub budget_pages: u64,
    /// Pages kept free for demand faults.
    pub reserve_pages: u64,
    /// The evictor works down to this many resident pages once it starts.
    pub evict_target_pages: u64,
    /// Pages resident now.
    pub resident_pages: u64,
    /// Prefetch reads outstanding now.
    pub prefetch_inflight: u64,
    /// Pages per state: never, remote, inflight, local, staged, evicting.
    pub states: [u64; 6],
    /// The prefetcher's name.
    pub prefetcher: String,
    /// Whether stage-2 pre-fault is in use (false once KVM answered that it cannot).
    pub stage2_prefault: bool,
    /// Estimated hit rate of all prefetches: probe hits / resolved probes (probes are a
    /// systematic 1-in-N sample of every prefetch); falls back to `accuracy_markers` when no
    /// probe has resolved yet.
    pub accuracy: f64,
    /// Hits / resolved staged pages (prefetcher markers and probes). Markers sit where the
    /// prefetcher puts them (e.g. window ends), so this is not an unbiased sample.
    pub accuracy_markers: f64,
    /// Estimated prefetch hits / (those + demand faults). Injected hits are estimated as
    /// `injected * accuracy` (the sample's rate applied to the injected population).
    pub coverage: f64,
    /// Demand fault read → page installed and the vCPU's wake issued.
    pub fault_service: LatencySummary,
    /// Fault read → zero page installed.
    pub zero_fill: LatencySummary,
    /// Read submitted → completion delivered (the store's share).
    pub store_read: LatencySummary,
    /// Completion delivered → page installed (hash + UFFDIO_CONTINUE).
    pub install: LatencySummary,
    /// Staged page arrival → the guest's first touch.
    pub prefetch_timeliness: LatencySummary,
    /// One eviction round.
    pub evict_round: LatencySummary,
    #[serde(default)]
    /// The UFFDIO_WAKE that resumes a vCPU after a demand fault.
    pub wake: LatencySummary,
    /// While a key rotation's re-seal sweep runs: the pages at or above its cursor that have a
    /// stored copy (they may still be sealed under the previous key). `None`: no sweep.
    #[serde(default)]
    pub reseal_left: Option<u64>,
}

impl Stats {
    pub(crate) fn fill_derived(&mut self, h: &Histograms) {
        let e = PrefetchEstimate::of(&self.counters);
        self.accuracy_markers = e.accuracy_markers;
        self.accuracy = e.accuracy;
        self.coverage = e.coverage;
        let m = h.merged();
        self.fault_service = LatencySummary::of(&m[Hist::FaultService as usize]);
        self.zero_fill = LatencySummary::of(&m[Hist::ZeroFill as usize]);
        self.store_read = LatencySummary::of(&m[Hist::StoreRead as usize]);
        self.install = LatencySummary::of(&m[Hist::Install as usize]);
        self.prefetch_timeliness = LatencySummary::of(&m[Hist::Timeliness as usize]);
        self.evict_round = LatencySummary::of(&m[Hist::EvictRound as usize]);
        self.wake = LatencySummary::of(&m[Hist::Wake as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_merge_across_threads_and_render() {
        let h = Histograms::default();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let h = &h;
                s.spawn(move || {
                    for i in 1..=1000u64 {
                        h.record(Hist::FaultService, i * 1000 + t);
                    }
                });
            }
        });
        let mut st = Stats::default();
        st.counters.prefetch_marker_hits = 3;
        st.counters.prefetch_wasted = 1;
        st.counters.probe_hits = 1;
        st.counters.probe_wasted = 1;
        st.fill_derived(&h);
        assert_eq!(st.fault_service.count, 4000);
        assert!((st.fault_service.p50 as i64 - 500_000).abs() < 2_000);
        assert!((st.accuracy_markers - 0.75).abs() < 1e-9);
        assert!((st.accuracy - 0.5).abs() < 1e-9, "probes win over markers");
        let json = serde_json::to_string(&st).unwrap();
        let back: Stats = serde_json::from_str(&json).unwrap();
        assert_eq!(back, st);
    }

    #[test]
    fn a_phase_estimate_is_taken_from_the_difference_of_two_snapshots() {
        let c = Counters::default();
        c.set(Counter::DemandFaults, 100);
        c.set(Counter::PrefetchInjected, 50);
        let start = c.snapshot();
        c.add(Counter::DemandFaults, 10);
        c.add(Counter::PrefetchInjected, 40);
        c.add(Counter::ProbeHits, 3);
        c.inc(Counter::ProbeWasted);
        let d = c.snapshot().since(&start);
        assert_eq!((d.demand_faults, d.prefetch_injected), (10, 40));
        let e = PrefetchEstimate::of(&d);
        assert!((e.accuracy - 0.75).abs() < 1e-9);
        assert!((e.hits - 30.0).abs() < 1e-9, "40 injected at 75%");
        assert!(
            (e.coverage - 0.75).abs() < 1e-9,
            "30 hits / (30 + 10 faults)"
        );
        // Snapshots of two engines: no negative counts.
        assert_eq!(start.since(&c.snapshot()).demand_faults, 0);
        assert_eq!(
            PrefetchEstimate::of(&CounterValues::default()).coverage,
            0.0
        );
    }
}
