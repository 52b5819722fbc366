//! Remote memory for a VM: the glue between the paging engine (`farvm-ept`, which owns guest
//! RAM and knows nothing of sockets or KVM) and the rest of the VMM. Guest RAM paged by the
//! engine is `vstate::memory::GuestRam::paged`.
//!
//! - [`setup`]: building it all for `farvm run` — the memserver client and its page store
//!   (`farvm_memclient::PageStore`), the engine — plus vCPU/agent-slot registration and stats.
//! - [`local_server`]: the `farvm-memserver` child process started when no server is given.
//! - [`pool`]: the VM's membership in a memory pool (`--pool`): admission, lease, moves, release.
//! - [`saving`]: what a snapshot of a pool VM needs of its remote memory, and what its
//!   restore brings back.
//! - [`stage2`]: KVM_PRE_FAULT_MEMORY injection with feature detection (`StageTwo`).

pub mod local_server;
pub mod pool;
pub mod saving;
pub mod setup;
pub mod stage2;

pub use farvm_ept::{Budget, DEFAULT_PROBE_EVERY};
pub use pool::{PoolAdmission, PoolSpec, PoolVm};
pub use saving::{PoolRestore, RemoteSaving};
pub use setup::{
    KeyRotation, PageSpace, RemoteError, RemoteHealth, RemoteMemory, RemoteSpec, RemoteStats,
    RotateKeyError, Stage2Prefault, StatsSource,
};
