//! farvm's memory pool: the directory of memory servers and VMs on etcd, where each VM's
//! remote memory goes, and what happens to it when a VM or a server goes away.
//!
//! * [`Directory`] — the etcd v3 directory (blocking API over the crate's own small runtime):
//!   [`Directory::declare_racks`], [`Directory::remove_rack`], [`Directory::register_server`]
//!   (only in a declared rack), [`Directory::admit_vm`], [`Directory::view`],
//!   [`Directory::watch`], [`Directory::collect_garbage`], [`Directory::commit_move`],
//!   [`Directory::set_draining`], [`Directory::status`], and the snapshots of pool VMs
//!   ([`VmRegistration::hand_to_snapshot`], [`Directory::restore_snapshot`],
//!   [`Directory::delete_snapshot`]). Key layout: [`keys`].
//! * [`placement`] — pure, rack-aware and capacity-aware slab placement: admission with a
//!   named shortfall, replica replacement, repair, drain and rebalance plans.
//! * [`gc`] — finding the namespaces of VMs whose lease expired; the [`NamespaceReclaimer`]
//!   seam that discards them on a memory server.
//! * [`status`] — racks → servers, hosts → VMs and the fleet's oversubscription ratio, as
//!   JSON or a table.
//! * [`cli`] — the operator's commands (`farvm pool …` and `farvm-pool …`).
//! * [`metrics`] — the status as Prometheus metrics (`farvm pool metrics`).
//! * [`local_etcd`] — starts a private etcd for tests and demos.
//! * [`delay`] — a TCP proxy adding latency between network namespaces.

pub mod cli;
pub mod delay;
pub mod directory;
pub mod gc;
pub mod ids;
pub mod keys;
pub mod local_etcd;
pub mod metrics;
pub mod placement;
pub mod record;
pub mod status;
pub mod units;
pub mod view;

pub use directory::SnapshotHolding;
pub use directory::{
    Connectivity, Directory, DirectoryConfig, PoolError, PoolWatch, RegistrationState,
    ServerRegistration, VmRegistration,
};
pub use gc::{GcReport, NamespaceReclaimer, Orphan};
pub use ids::{RackId, ServerId, VmId};
pub use placement::{AdmissionRequest, Move, PlacementError, Shortfall, VmPlacement};
pub use record::{ServerHealth, ServerRecord, SlabRecord, SnapshotRecord, VmRecord};
pub use status::PoolStatus;
pub use view::{PoolView, SlabRef};
