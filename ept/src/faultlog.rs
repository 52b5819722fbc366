//! The fault log: an opt-in record of every guest fault the engine resolved — its guest page,
//! what it was (the per-process counter it went to) and the process the faulting vCPU's agent
//! slot named — for checking attribution against the guest's own ground truth (which frames
//! each process owned). Off unless [`crate::EngineConfig::fault_log_records`] is set.
//!
//! Fixed capacity, allocated once: the fault thread stores a record and then publishes the new
//! length (release); readers load the length (acquire) and read that many records. Once full,
//! further faults are counted as dropped, never recorded. No lock, no allocation per fault.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::procstats::ProcessCounter;

/// What a recorded fault was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// A demand read of a remote page.
    Demand,
    /// A never-written page, zero-filled.
    ZeroFill,
    /// A wait on a read or an eviction already under way.
    Wait,
    /// A touch of a staged prefetched page.
    MarkerHit,
    /// A fault on a prefetch still in flight.
    LateHit,
}

impl FaultKind {
    fn code(self) -> u64 {
        match self {
            Self::Demand => 1,
            Self::ZeroFill => 2,
            Self::Wait => 3,
            Self::MarkerHit => 4,
            Self::LateHit => 5,
        }
    }

    fn from_code(c: u64) -> Option<Self> {
        Some(match c {
            1 => Self::Demand,
            2 => Self::ZeroFill,
            3 => Self::Wait,
            4 => Self::MarkerHit,
            5 => Self::LateHit,
            _ => return None,
        })
    }

    /// The kind of a fault counted as `c` (None: not a fault counter).
    pub(crate) fn of(c: ProcessCounter) -> Option<Self> {
        Some(match c {
            ProcessCounter::DemandFaults => Self::Demand,
            ProcessCounter::ZeroFills => Self::ZeroFill,
            ProcessCounter::WaitFaults => Self::Wait,
            ProcessCounter::PrefetchMarkerHits => Self::MarkerHit,
            ProcessCounter::PrefetchLateHits => Self::LateHit,
            _ => return None,
        })
    }

    /// The name used in the log file (`farvm run --fault-log`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Demand => "demand",
            Self::ZeroFill => "zero",
            Self::Wait => "wait",
            Self::MarkerHit => "marker_hit",
            Self::LateHit => "late_hit",
        }
    }
}

/// One recorded fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRecord {
    /// The guest page (guest-physical address / 4096).
    pub gpn: u64,
    /// What it was.
    pub kind: FaultKind,
    /// Whether the faulting vCPU's agent slot named a process (false: no vCPU, no slot, or an
    /// unreadable slot — see `procstats::UnattributedFaults`).
    pub attributed: bool,
    /// The pid the slot named (0: the guest kernel — kernel threads, idle — or unattributed).
    pub pid: u64,
}

/// Bits of the first word: the guest page number (16 TiB of guest RAM at most, 32 bits).
const GPN_BITS: u32 = 40;
const GPN_MASK: u64 = (1 << GPN_BITS) - 1;
const ATTRIBUTED: u64 = 1 << 63;

/// The log (see the module docs).
pub struct FaultLog {
    /// Two words per record: `gpn | kind << 40 | attributed << 63`, then the pid.
    words: Box<[AtomicU64]>,
    len: AtomicUsize,
    dropped: AtomicU64,
}

impl FaultLog {
    /// A log of `capacity` records (0: off, records nothing).
    pub fn new(capacity: usize) -> Self {
        Self {
            words: (0..capacity.saturating_mul(2))
                .map(|_| AtomicU64::new(0))
                .collect(),
            len: AtomicUsize::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    /// Records are kept at all.
    pub fn enabled(&self) -> bool {
        !self.words.is_empty()
    }

    /// Appends a record; false if the log is off or full. Only one thread (the fault
    /// handler) may call this.
    pub fn record(&self, gpn: u64, kind: FaultKind, attributed: bool, pid: u64) -> bool {
        if !self.enabled() {
            return false;
        }
        let i = self.len.load(Ordering::Relaxed);
        if 2 * i + 1 >= self.words.len() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let w0 =
            (gpn & GPN_MASK) | kind.code() << GPN_BITS | if attributed { ATTRIBUTED } else { 0 };
        self.words[2 * i].store(w0, Ordering::Relaxed);
        self.words[2 * i + 1].store(pid, Ordering::Relaxed);
        self.len.store(i + 1, Ordering::Release);
        true
    }

    /// Records kept so far.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    /// No record kept yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Faults not recorded because the log was full.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The records kept so far, in the order the faults were resolved.
    pub fn records(&self) -> Vec<FaultRecord> {
        let n = self.len();
        (0..n)
            .filter_map(|i| {
                let w0 = self.words[2 * i].load(Ordering::Relaxed);
                Some(FaultRecord {
                    gpn: w0 & GPN_MASK,
                    kind: FaultKind::from_code((w0 >> GPN_BITS) & 0xff)?,
                    attributed: w0 & ATTRIBUTED != 0,
                    pid: self.words[2 * i + 1].load(Ordering::Relaxed),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_records_in_order_until_full_then_counts_drops() {
        let log = FaultLog::new(2);
        assert!(log.enabled() && log.is_empty());
        assert!(log.record(0x12345, FaultKind::Demand, true, 77));
        assert!(log.record(GPN_MASK, FaultKind::LateHit, false, 0));
        assert!(!log.record(9, FaultKind::ZeroFill, true, 1));
        assert_eq!(log.len(), 2);
        assert_eq!(log.dropped(), 1);
        assert_eq!(
            log.records(),
            vec![
                FaultRecord {
                    gpn: 0x12345,
                    kind: FaultKind::Demand,
                    attributed: true,
                    pid: 77
                },
                FaultRecord {
                    gpn: GPN_MASK,
                    kind: FaultKind::LateHit,
                    attributed: false,
                    pid: 0
                },
            ]
        );
    }

    #[test]
    fn an_empty_log_records_nothing() {
        let log = FaultLog::new(0);
        assert!(!log.enabled());
        assert!(!log.record(1, FaultKind::Wait, true, 5));
        assert_eq!((log.len(), log.dropped()), (0, 0));
        assert!(log.records().is_empty());
    }

    #[test]
    fn every_fault_counter_has_a_kind_that_round_trips() {
        for c in [
            ProcessCounter::DemandFaults,
            ProcessCounter::ZeroFills,
            ProcessCounter::WaitFaults,
            ProcessCounter::PrefetchMarkerHits,
            ProcessCounter::PrefetchLateHits,
        ] {
            let k = FaultKind::of(c).unwrap();
            assert_eq!(FaultKind::from_code(k.code()), Some(k));
        }
        assert_eq!(FaultKind::of(ProcessCounter::PrefetchIssued), None);
    }
}
