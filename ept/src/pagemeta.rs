//! Per-page side data of the page-state table: the fingerprint of each page's remote (clean)
//! content, taken when its data is installed or written back, compared at eviction (the dirty
//! check, see `evict`) and when a read returns (a server's stale copy, see `complete`); when
//! its demand fault was read and its read submitted / staged data arrived (latency
//! histograms, prefetch timeliness); and which process a prefetch was issued for (per-process
//! statistics, `procstats`).
//!
//! Written only by the page's current owner in the state table (whoever moved it to
//! `INFLIGHT` or `EVICTING`) before it publishes the next state, whose release/acquire CAS
//! orders them for the next owner: plain relaxed atomics suffice.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::hash::{self, Fingerprint};
use crate::procstats::ProcRef;

/// The clean fingerprint of a page whose remote content this engine has not seen (never read
/// or written back by it). An XXH3-128 of real data equal to it is a 2^-128 event.
pub(crate) const UNKNOWN_FP: Fingerprint = 0;

/// The write version of content with fingerprint `fp`: its low 64 bits. Identical content
/// shares a version, harmlessly: it is the same page.
#[inline]
pub(crate) fn version_of(fp: Fingerprint) -> crate::store::Version {
    crate::store::Version(fp as u64)
}

pub(crate) struct PageMeta {
    /// Two words per page.
    clean: Box<[AtomicU64]>,
    /// When the demand fault was read (ns, `Clock`), 0 = none (a VMM access).
    fault_at: Box<[AtomicU64]>,
    /// When its read was submitted, then (staged pages) when the data arrived.
    io_at: Box<[AtomicU64]>,
    /// The process a prefetch read of the page was issued for ([`ProcRef`] bits), set when
    /// the read is issued; its outcome (staged, injected, hit, wasted) is counted for it.
    owner: Box<[AtomicU64]>,
    zero: Fingerprint,
}

fn atomics(n: u64) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

impl PageMeta {
    pub fn new(pages: u64) -> Self {
        Self {
            clean: atomics(2 * pages),
            fault_at: atomics(pages),
            io_at: atomics(pages),
            owner: (0..pages)
                .map(|_| AtomicU64::new(ProcRef::NONE.bits()))
                .collect(),
            zero: hash::zero(),
        }
    }

    /// The fingerprint of an all-zero page.
    #[inline]
    pub fn zero_fp(&self) -> Fingerprint {
        self.zero
    }

    #[inline]
    pub fn clean_fp(&self, p: u64) -> Fingerprint {
        let lo = self.clean[2 * p as usize].load(Ordering::Relaxed) as u128;
        let hi = self.clean[2 * p as usize + 1].load(Ordering::Relaxed) as u128;
        lo | (hi << 64)
    }

    /// The version a read of `p` expects (`farvm_pageio::Version`): the low 64 bits of its
    /// clean fingerprint, the content last written back or read (docs/sealing.md).
    #[inline]
    pub fn version(&self, p: u64) -> crate::store::Version {
        version_of(self.clean_fp(p))
    }

    /// Set by the page's owner (INFLIGHT / EVICTING) before it publishes a new state.
    #[inline]
    pub fn set_clean_fp(&self, p: u64, fp: Fingerprint) {
        self.clean[2 * p as usize].store(fp as u64, Ordering::Relaxed);
        self.clean[2 * p as usize + 1].store((fp >> 64) as u64, Ordering::Relaxed);
    }

    #[inline]
    pub fn fault_at(&self, p: u64) -> u64 {
        self.fault_at[p as usize].load(Ordering::Relaxed)
    }

    #[inline]
    pub fn set_fault_at(&self, p: u64, ns: u64) {
        self.fault_at[p as usize].store(ns, Ordering::Relaxed);
    }

    #[inline]
    pub fn io_at(&self, p: u64) -> u64 {
        self.io_at[p as usize].load(Ordering::Relaxed)
    }

    #[inline]
    pub fn set_io_at(&self, p: u64, ns: u64) {
        self.io_at[p as usize].store(ns, Ordering::Relaxed);
    }

    #[inline]
    pub fn owner(&self, p: u64) -> ProcRef {
        ProcRef::from_bits(self.owner[p as usize].load(Ordering::Relaxed))
    }

    #[inline]
    pub fn set_owner(&self, p: u64, r: ProcRef) {
        self.owner[p as usize].store(r.bits(), Ordering::Relaxed);
    }
}
