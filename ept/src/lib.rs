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
//! - an evictor keeps resident pages under the budget minus a free reserve, consumed prefetches
//!   first then CLOCK; dirtiness is decided race-free from content after the guest view is
//!   unmapped; dirty pages are written back before they are freed, clean ones dropped.
//!
//! The engine knows nothing of sockets or KVM: page I/O goes through [`store::RemoteStore`],
//! stage-2 pre-faulting through [`stage2::StageTwo`], both implemented by the VMM.

mod access;
mod complete;
pub mod config;
mod engine;
pub mod error;
mod evict;
mod fault;
pub mod hash;
pub mod memstore;
pub mod stage2;
mod state;
pub mod stats;
/// The page-store seam (`farvm-pageio`), under the name the engine's modules use.
pub use farvm_pageio as store;
pub mod sys;
pub mod translate;
pub mod vcpu;

pub use config::{Budget, EngineConfig, DEFAULT_PROBE_EVERY};
pub use engine::{Engine, EngineParts, LostPage, PageState};
pub use error::EngineError;
pub use stats::{CounterValues, PrefetchEstimate, Stats};

/// Guest page size (4 KiB).
pub const PAGE_SIZE: usize = 4096;
