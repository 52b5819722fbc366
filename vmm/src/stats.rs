//! VM exit counters by kind (relaxed atomics: one increment per exit, which already costs
//! microseconds on this host).

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Counters of vCPU exits to userspace.
#[derive(Debug, Default)]
pub struct ExitStats {
    /// Port I/O to the serial console.
    pub io_serial: AtomicU64,
    /// Port I/O to the paravirtual control device.
    pub io_pv: AtomicU64,
    /// Other port I/O (answered with all-ones, writes ignored).
    pub io_other: AtomicU64,
    /// MMIO accesses.
    pub mmio: AtomicU64,
    /// HLT exits.
    pub hlt: AtomicU64,
    /// KVM_RUN returned EINTR (a kick: pause, shutdown, signal).
    pub interrupted: AtomicU64,
    /// Triple faults (KVM_EXIT_SHUTDOWN).
    pub shutdown: AtomicU64,
    /// KVM internal errors (emulation failures).
    pub internal_error: AtomicU64,
    /// Failed VM entries.
    pub fail_entry: AtomicU64,
    /// Any other exit reason.
    pub other: AtomicU64,
}

/// A plain snapshot of [`ExitStats`].
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ExitCounts {
    /// Port I/O to the serial console.
    pub io_serial: u64,
    /// Port I/O to the paravirtual control device.
    pub io_pv: u64,
    /// Other port I/O (answered with all-ones, writes ignored).
    pub io_other: u64,
    /// MMIO accesses.
    pub mmio: u64,
    /// HLT exits.
    pub hlt: u64,
    /// KVM_RUN returned EINTR (a kick: pause, shutdown, signal).
    pub interrupted: u64,
    /// Triple faults (KVM_EXIT_SHUTDOWN).
    pub shutdown: u64,
    /// KVM internal errors (emulation failures).
    pub internal_error: u64,
    /// Failed VM entries.
    pub fail_entry: u64,
    /// Any other exit reason.
    pub other: u64,
}

impl ExitStats {
    /// Counts one exit.
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
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
    /// All exits.
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
