//! VM exit counters by kind (relaxed atomics: one increment per exit, which already costs
//! microseconds on this host).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Counters of vCPU exits to userspace.
#[derive(Debug, Default)]
pub struct ExitStats {
    pub io_serial: AtomicU64,
    pub io_pv: AtomicU64,
    pub io_other: AtomicU64,
    pub mmio: AtomicU64,
    pub hlt: AtomicU64,
    pub interrupted: AtomicU64,
    pub shutdown: AtomicU64,
    pub internal_error: AtomicU64,
    pub fail_entry: AtomicU64,
    pub other: AtomicU64,
}

/// A plain snapshot of [`ExitStats`].
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ExitCounts {
    pub io_serial: u64,
    pub io_pv: u64,
    pub io_other: u64,
    pub mmio: u64,
    pub hlt: u64,
    pub interrupted: u64,
    pub shutdown: u64,
    pub internal_error: u64,
    pub fail_entry: u64,
    pub other: u64,
}

impl ExitStats {
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> ExitCounts {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ExitCounts {
            io_serial: l(&self.io_serial),
            io_pv: l(&self.io_pv),
            io_other: l(&self.io_other),
            mmio: l(&self.mmio),
            hlt: l(&self.hlt),
            interrupted: l(&self.interrupted),
            shutdown: l(&self.shutdown),
            internal_error: l(&self.internal_error),
            fail_entry: l(&self.fail_entry),
            other: l(&self.other),
        }
    }
}

impl ExitCounts {
    pub fn total(&self) -> u64 {
        self.io_serial
            + self.io_pv
            + self.io_other
            + self.mmio
            + self.hlt
            + self.interrupted
            + self.shutdown
            + self.internal_error
            + self.fail_entry
            + self.other
    }
}
