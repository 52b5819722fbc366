//! farvm-ept: the guest-memory paging engine.
//!
//! Guest RAM is a memfd mapped twice: the guest view (given to KVM, registered with userfaultfd
//! in MISSING|MINOR mode) and an engine-private alias. A guest fault on a page is resolved by its
//! state in a lock-free page table:
//! - never written: zero-filled locally, no network;
//! - remote: a demand read lands in the memfd through the alias, then UFFDIO_CONTINUE maps it
//!   and wakes the vCPU; concurrent faults on the same in-flight page wait on that one read;
//! - every demand fault feeds the prefetcher (`farvm_prefetch::Prefetcher`); its candidates are
//!   read at low priority and *injected* (mapped before the guest asks, no wake), except marker
//!   and sampled probe pages, which stay staged so their first touch reveals the hit rate;
//! - an evictor keeps resident pages under the budget minus a free reserve, by CLOCK with
//!   refault distance; dirtiness is decided race-free from content after the guest view is
//!   unmapped; dirty pages are written back before they are freed, clean ones dropped.
//!
//! The engine knows nothing of sockets or KVM: page I/O goes through [`store::RemoteStore`],
//! stage-2 pre-faulting through [`stage2::StageTwo`], both implemented by the VMM.
//!
//! Layout: the engine's state is split into parts with one owner each (listed in `parts.rs`);
//! the fault handler (`fault`), the completion path (`complete`), the evictor (`evict`) and
//! VMM accesses (`access`) act on the parts and never on one another; [`Engine`]
//! (`engine.rs`) assembles them and is the public handle.

// The engine's state, one part per file.
mod backing;
mod clock;
mod errlog;
pub mod faultlog;
mod frames;
mod installer;
mod lost;
mod movetrace;
mod pagemeta;
mod parts;
mod port;
mod prefetch_slots;
pub mod procstats;
mod queues;
mod refault;
mod reseal;
mod spans;
mod state;
pub mod stats;
mod touchlog;
pub mod vcpu;

// What acts on the parts.
mod access;
mod complete;
mod evict;
mod fault;
mod snapshot;

mod engine;

pub mod config;
pub mod error;
pub mod hash;
pub mod memstore;
pub mod stage2;
/// The page-store seam (`farvm-pageio`), under the name the engine's modules use.
pub use farvm_pageio as store;
pub mod sys;
pub use snapshot::SavedPage;
pub mod translate;

pub use backing::GuestMemory;
pub use config::{Budget, ConfigError, EngineConfig, DEFAULT_PROBE_EVERY};
pub use engine::{Engine, EngineParts};
pub use error::EngineError;
pub use lost::LostPage;
pub use procstats::{ProcessCounterValues, ProcessSnapshot, ProcessStats};
pub use state::PageState;
pub use stats::{CounterValues, PrefetchEstimate, Stats};

/// Guest page size (4 KiB).
pub const PAGE_SIZE: usize = 4096;
