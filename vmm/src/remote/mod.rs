//! Remote memory for a VM: the glue between the paging engine (`farvm-ept`, which owns guest
//! RAM and knows nothing of sockets or KVM) and the rest of the VMM.
//!
//! - [`setup`]: building it all for `farvm run` — the memserver client and its page store
//!   (`farvm_memclient::PageStore`), the engine — plus vCPU/agent-slot registration and stats.
//! - [`local_server`]: the `farvm-memserver` child process started when no server is given.
//! - [`stage2`]: KVM_PRE_FAULT_MEMORY injection with feature detection (`StageTwo`).
//! - [`ram`]: the engine's guest RAM as the VMM's memory layer sees it (`ExternalRam`).

pub mod local_server;
pub mod ram;
pub mod setup;
pub mod stage2;

pub use farvm_ept::{Budget, DEFAULT_PROBE_EVERY};
pub use ram::EngineRam;
pub use setup::{PageSpaceKind, RemoteError, RemoteMemory, RemoteSpec, RemoteStats, StatsSource};
