//! Remote memory for a VM: the glue between the paging engine (`farvm-ept`, which owns guest
//! RAM and knows nothing of sockets or KVM) and the rest of the VMM. Guest RAM paged by the
//! engine is `vstate::memory::GuestRam::paged`.
//!
//! - [`store`]: the engine's page store over the memserver client (`RemoteStore`).
//! - [`stage2`]: KVM_PRE_FAULT_MEMORY injection with feature detection (`StageTwo`).
//! - [`setup`]: building it all (embedded loopback memserver when none is given), vCPU/
//!   agent-slot registration, stats.

pub mod setup;
pub mod stage2;
pub mod store;

pub use farvm_ept::{Budget, DEFAULT_PROBE_EVERY};
pub use setup::{
    PageSpaceKind, RemoteError, RemoteHealth, RemoteMemory, RemoteSpec, RemoteStats,
    Stage2Prefault, StatsSource,
};
