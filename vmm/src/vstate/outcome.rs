//! How a VM ends, and the latch that decides it once. A vCPU, a device (power-off, the
//! console's escape), the paging engine (a lost page) or the VM's owner (a signal, a timeout, a
//! shutdown request) each propose an outcome; the first one wins. Deciding stops every vCPU:
//! a running one is kicked out of KVM_RUN (the kick sets `kvm_run.immediate_exit`, so no kick
//! is lost), a parked one is woken by [`OutcomeLatch::closed`] disconnecting.
//!
//! The latch lives below the VM and its devices, so each can stop the VM without knowing it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, RwLock};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use serde::Serialize;

use super::lock;
use crate::signals;

/// How a VM run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum VmOutcome {
    /// The guest wrote its exit status to the shutdown port, or powered off (ACPI S5:
    /// status 0).
    GuestShutdown {
        /// The status written.
        status: u32,
    },
    /// The guest asked for a reset (the ACPI reset register): farvm does not restart guests,
    /// the VM stops.
    GuestReboot,
    /// The guest kernel panicked.
    GuestPanic {
        /// The panic location and message from the guest's record.
        message: String,
    },
    /// SIGINT/SIGTERM.
    Signal {
        /// The signal number.
        signal: i32,
    },
    /// The operator typed the console's escape sequence (Ctrl-A x).
    ConsoleEscape,
    /// A shutdown request (control socket, API).
    ControlShutdown,
    /// The VM was saved to a snapshot (`farvm snapshot`, the API's `vm.snapshot`), which
    /// stops it, as `virsh save` expects.
    Snapshotted {
        /// The snapshot's directory.
        dir: String,
    },
    /// The VM moved to another host by live migration (`farvm migrate`): it runs there now.
    Migrated {
        /// The destination's address.
        to: String,
    },
    /// The run exceeded its time limit.
    Timeout {
        /// The limit, in seconds.
        secs: u64,
    },
    /// The guest crashed: internal emulation error, triple fault, failed entry, bad MMIO.
    Crash {
        /// The vCPU that crashed.
        cpu: u32,
        /// What KVM reported.
        message: String,
    },
    /// A host-side failure (ioctl error, ...).
    HostError {
        /// What failed.
        message: String,
    },
    /// The guest needed a page of remote memory whose data the memory servers lost.
    MemoryLost {
        /// Guest-physical address of the page.
        gpa: u64,
    },
    /// The memory pool reclaimed the VM's remote memory: its lease expired and the pool's
    /// collector claimed its pages (the VMM was paused, or cut off from etcd, for too long).
    MemoryReclaimed,
}

impl std::fmt::Display for VmOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmOutcome::GuestShutdown { status } => {
                write!(f, "guest shut down with status {status}")
            }
            VmOutcome::GuestReboot => write!(f, "the guest rebooted (the VM stops)"),
            VmOutcome::GuestPanic { message } => write!(f, "guest kernel panic: {message}"),
            VmOutcome::Signal { signal } => write!(f, "stopped by signal {signal}"),
            VmOutcome::ConsoleEscape => write!(f, "stopped from the console (Ctrl-A x)"),
            VmOutcome::ControlShutdown => write!(f, "shut down through the control socket"),
            VmOutcome::Snapshotted { dir } => write!(f, "saved to the snapshot {dir}"),
            VmOutcome::Migrated { to } => write!(f, "migrated to {to} (it runs there now)"),
            VmOutcome::Timeout { secs } => write!(f, "timed out after {secs} s"),
            VmOutcome::Crash { cpu, message } => write!(f, "vCPU {cpu}: {message}"),
            VmOutcome::HostError { message } => write!(f, "host error: {message}"),
            VmOutcome::MemoryLost { gpa } => write!(
                f,
                "guest memory lost: the guest needed page {gpa:#x}, whose data exists nowhere \
                 it can be trusted (every memory server holding it lost it or returned a wrong \
                 copy, or its local frame was not where the engine left it; the log says which)"
            ),
            VmOutcome::MemoryReclaimed => write!(
                f,
                "guest memory reclaimed: the memory pool's collector dropped this VM's remote \
                 pages after its lease expired (the VMM was paused, or cut off from etcd, for \
                 longer than --pool-lease-ttl plus the memory servers' --pool-gc-grace); the \
                 VM cannot go on"
            ),
        }
    }
}

/// The VM's end: decided once, by whoever sees it first (module doc).
pub struct OutcomeLatch {
    outcome: Mutex<Option<VmOutcome>>,
    decided: Condvar,
    stopping: AtomicBool,
    /// Dropped when the outcome is decided: every receiver of `closed` then wakes.
    closer: Mutex<Option<Sender<()>>>,
    closed: Receiver<()>,
    /// The vCPU threads to kick out of KVM_RUN when the outcome is decided; emptied before
    /// they are joined (a joined thread's id may not be signalled).
    vcpu_threads: RwLock<Vec<libc::pthread_t>>,
}

impl Default for OutcomeLatch {
    fn default() -> Self {
        let (closer, closed) = crossbeam_channel::bounded(0);
        OutcomeLatch {
            outcome: Mutex::new(None),
            decided: Condvar::new(),
            stopping: AtomicBool::new(false),
            closer: Mutex::new(Some(closer)),
            closed,
            vcpu_threads: RwLock::new(Vec::new()),
        }
    }
}

impl OutcomeLatch {
    /// Records `outcome` unless one is decided already, and stops every vCPU.
    pub fn decide(&self, outcome: VmOutcome) {
        {
            let mut o = lock(&self.outcome);
            if o.is_none() {
                *o = Some(outcome);
            }
        }
        self.stopping.store(true, Ordering::SeqCst);
        self.decided.notify_all();
        drop(lock(&self.closer).take());
        self.kick_vcpus();
    }

    /// Whether an outcome is decided (the vCPUs check before every KVM_RUN).
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// The outcome, once decided.
    pub fn outcome(&self) -> Option<VmOutcome> {
        lock(&self.outcome).clone()
    }

    /// Waits up to `timeout` for the outcome.
    pub fn wait(&self, timeout: Duration) -> Option<VmOutcome> {
        let o = lock(&self.outcome);
        let (o, _) = self
            .decided
            .wait_timeout_while(o, timeout, |o| o.is_none())
            .unwrap_or_else(|p| p.into_inner());
        o.clone()
    }

    /// A channel that never carries a message and disconnects when the outcome is decided: a
    /// thread blocked in a `select!` on it and its own requests wakes on a stop.
    pub fn closed(&self) -> &Receiver<()> {
        &self.closed
    }

    /// Makes [`OutcomeLatch::decide`] kick these vCPU threads; kicks them at once if the outcome
    /// is decided already (a stop raced their start).
    pub(crate) fn watch_vcpu_threads(&self, threads: Vec<libc::pthread_t>) {
        *self.vcpu_threads.write().unwrap_or_else(|p| p.into_inner()) = threads;
        if self.stopping() {
            self.kick_vcpus();
        }
    }

    /// Stops kicking the vCPU threads: called before they are joined.
    pub(crate) fn forget_vcpu_threads(&self) {
        self.vcpu_threads
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }

    /// Kicks every watched vCPU thread out of KVM_RUN.
    pub(crate) fn kick_vcpus(&self) {
        // The read lock keeps the threads unjoined while they are signalled.
        for t in self
            .vcpu_threads
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            signals::kick(*t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_outcome_wins_and_closes_the_channel() {
        let latch = OutcomeLatch::default();
        assert!(!latch.stopping());
        assert_eq!(latch.wait(Duration::from_millis(1)), None);
        assert!(matches!(
            latch.closed().try_recv(),
            Err(crossbeam_channel::TryRecvError::Empty)
        ));
        latch.decide(VmOutcome::GuestReboot);
        latch.decide(VmOutcome::ControlShutdown);
        assert!(latch.stopping());
        assert_eq!(latch.outcome(), Some(VmOutcome::GuestReboot));
        assert_eq!(latch.wait(Duration::ZERO), Some(VmOutcome::GuestReboot));
        assert!(matches!(
            latch.closed().try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        ));
    }
}
