//! Remote memory for a VM: the glue between the paging engine (`farvm-ept`, which owns guest
//! RAM and knows nothing of sockets or KVM) and the rest of the VMM.
//!
//! - [`store`]: the engine's page store over the memserver client (`RemoteStore`).
//! - [`stage2`]: KVM_PRE_FAULT_MEMORY injection with feature detection (`StageTwo`).
//! - [`ram`]: the engine's guest RAM as the VMM's memory layer sees it (`ExternalRam`).
//! - [`setup`]: building it all for `farvm run` (embedded loopback memserver when none is
//!   given), vCPU/agent-slot registration, stats.

pub mod ram;
pub mod setup;
pub mod stage2;
pub mod store;

pub use farvm_ept::{Budget, DEFAULT_PROBE_EVERY};
pub use ram::EngineRam;
pub use setup::{PageSpaceKind, RemoteError, RemoteMemory, RemoteSpec, RemoteStats, StatsSource};
