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
//! - [`page_file`]: a lazily restored VM's store, serving its snapshot's page file.
//! - [`working_set`]: fetching a restored snapshot's recorded working set, in order.

pub mod local_server;
pub mod page_file;
pub mod pool;
pub mod saving;
pub mod setup;
pub mod stage2;
pub mod working_set;

pub use farvm_ept::{Budget, DEFAULT_PROBE_EVERY};
pub use page_file::{
    file_offset, LazyRestoreStats, PageFileError, PageFileStore, SnapshotPageFile,
};
pub use pool::{PoolAdmission, PoolSpec, PoolVm};
pub use saving::{PoolRestore, RemoteSaving};
pub use setup::{
    KeyRotation, PageSpace, RemoteError, RemoteHealth, RemoteMemory, RemoteSpec, RemoteStats,
    RotateKeyError, Stage2Prefault, StatsSource,
};
