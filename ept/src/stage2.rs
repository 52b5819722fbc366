//! Stage-2 injection: after a prefetched page is installed in the host mapping, ask KVM to build
//! the guest-physical (EPT/NPT) entry too, so the guest's first touch takes no exit at all.
//!
//! The VMM implements [`StageTwo`] with KVM_PRE_FAULT_MEMORY on a vCPU fd. The engine calls it
//! once, and if it answers [`PreFaultError::Unsupported`] (EOPNOTSUPP: shadow paging, e.g. PVM on
//! this host) disables it for good and counts it; the fallback is the host-PTE install alone,
//! which still lets KVM's shadow MMU prefetch up to 8 present neighbours per guest fault.

use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
/// Why a stage-2 pre-fault did not happen.
pub enum PreFaultError {
    #[error("KVM_PRE_FAULT_MEMORY is not supported by this kernel / KVM backend")]
    /// This KVM cannot pre-fault (EOPNOTSUPP); the engine stops asking.
    Unsupported,
    #[error("pre-fault failed (errno {0})")]
    /// The ioctl failed with this errno (counted, the page stays installed on the host side).
    Failed(i32),
}

/// Builds guest-physical (EPT/NPT) entries ahead of the guest: the VMM implements it on a vCPU fd.
pub trait StageTwo: Send + Sync {
    /// Populates stage-2 entries for guest-physical `[gpa, gpa + len)`.
    fn pre_fault(&self, gpa: u64, len: u64) -> Result<(), PreFaultError>;
}

/// For tests and hosts without the ioctl.
pub struct NoStageTwo;

impl StageTwo for NoStageTwo {
    fn pre_fault(&self, _gpa: u64, _len: u64) -> Result<(), PreFaultError> {
        Err(PreFaultError::Unsupported)
    }
}

/// Feature-detecting wrapper: disables itself on the first `Unsupported`.
pub(crate) struct StageTwoGate {
    inner: Box<dyn StageTwo>,
    enabled: AtomicBool,
}

impl StageTwoGate {
    pub fn new(inner: Box<dyn StageTwo>) -> Self {
        Self {
            inner,
            enabled: AtomicBool::new(true),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The call's outcome, or `None` if none was made (disabled).
    pub fn pre_fault(&self, gpa: u64, len: u64) -> Option<Result<(), PreFaultError>> {
        if !self.enabled() {
            return None;
        }
        let r = self.inner.pre_fault(gpa, len);
        match r {
            Ok(()) => {}
            Err(PreFaultError::Unsupported) => {
                tracing::info!("KVM_PRE_FAULT_MEMORY unsupported; host-PTE injection only");
                self.enabled.store(false, Ordering::Relaxed);
            }
            Err(e) => tracing::debug!("pre-fault {gpa:#x}+{len:#x}: {e}"),
        }
        Some(r)
    }
}
