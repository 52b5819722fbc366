//! The seam between guest-physical pages (what faults and installs are about) and the page
//! numbers the prefetcher learns from. Today: identity (guest-physical page numbers). The
//! follow-up walks the guest page tables from the faulting process's CR3 to give the prefetcher
//! virtual page numbers (Leap/HOPP learn over VPNs); it plugs in here without touching the
//! fault path.

use farvm_prefetch::{PageNo, ProcessKey};

pub trait PageSpace: Send {
    /// The prefetcher's page number for guest page `gpn` faulted by `key`.
    fn to_prefetch(&mut self, key: ProcessKey, gpn: u64) -> PageNo;
    /// The guest page a candidate refers to, if it maps to one.
    fn to_guest(&mut self, key: ProcessKey, page: PageNo) -> Option<u64>;
}

/// Guest-physical page numbers on both sides.
pub struct Identity;

impl PageSpace for Identity {
    fn to_prefetch(&mut self, _key: ProcessKey, gpn: u64) -> PageNo {
        gpn
    }
    fn to_guest(&mut self, _key: ProcessKey, page: PageNo) -> Option<u64> {
        Some(page)
    }
}
