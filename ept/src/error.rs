//! The engine's public error type: what [`crate::Engine`] calls return and what
//! [`crate::Engine::take_errors`] reports from its threads. Modules with failure modes of their
//! own keep their own enums ([`crate::config::ConfigError`], [`crate::store::StoreError`],
//! [`crate::stage2::PreFaultError`]) and are wrapped here.

use crate::config::ConfigError;
use crate::store::StoreError;

#[derive(Debug, thiserror::Error)]
/// What the engine's calls can fail with.
pub enum EngineError {
    #[error("invalid configuration: {0}")]
    /// The engine's configuration is invalid.
    Config(#[from] ConfigError),
    #[error("{what}: {source}")]
    /// A system call (mmap, userfaultfd, epoll ...) failed.
    Os {
        /// What was being done.
        what: &'static str,
        #[source]
        /// The OS error.
        source: std::io::Error,
    },
    #[error("guest range {gpa:#x}+{len:#x} is outside guest RAM ({mem:#x} bytes)")]
    /// A VMM access outside guest RAM.
    OutOfRange {
        /// First guest-physical address of the access.
        gpa: u64,
        /// Its length in bytes.
        len: u64,
        /// Guest RAM size in bytes.
        mem: u64,
    },
    #[error("agent slot GPA {0:#x} is not 4 KiB aligned")]
    /// An agent slot's guest-physical address is not page-aligned.
    MisalignedSlot(u64),
    #[error("memory store {op} of guest page {gpa:#x} failed: {error}")]
    /// The page store failed a request a VMM access waited on.
    Store {
        /// `read` or `write`.
        op: &'static str,
        /// Guest-physical address of the page.
        gpa: u64,
        /// The store's error.
        error: StoreError,
    },
    #[error(
        "guest page {gpa:#x} was written back but the memory server no longer has it \
         (data lost on the server side)"
    )]
    /// The page's data is gone from every memory server (the page is `LOST`).
    PageLost {
        /// Guest-physical address of the page.
        gpa: u64,
    },
    #[error(
        "guest page {gpa:#x}: the memory server returned content that differs from what this \
         VM last wrote back or read (an older or damaged copy); the page is lost rather than \
         given to the guest wrong"
    )]
    /// A read returned content whose fingerprint differs from the page's known remote content
    /// (the page is `LOST`).
    PageStale {
        /// Guest-physical address of the page.
        gpa: u64,
    },
    #[error(
        "guest page {gpa:#x}: a memory server returned content that differs from what this VM \
         last wrote back or read, or did not have the page (a replica that missed a write, or a \
         damaged one); that replica was dropped and the page is read again from another"
    )]
    /// A read returned content whose fingerprint differs from the page's known remote content,
    /// or found the page absent, and the store has another copy: the page is read again (it
    /// stays `INFLIGHT` or goes back to `REMOTE`), never installed from the stale copy.
    StaleCopyRejected {
        /// Guest-physical address of the page.
        gpa: u64,
    },
    #[error(
        "guest page {gpa:#x}: freeing its frame after eviction failed ({source}), so what the \
         guest would find in it is unknown; the page is lost rather than given to the guest \
         possibly wrong"
    )]
    /// An evicted page's frame could not be freed after a batch free failed part-way: its
    /// local content is unknown, and the page is `LOST`.
    EvictedFrameUnknown {
        /// Guest-physical address of the page.
        gpa: u64,
        #[source]
        /// The OS error of the free.
        source: std::io::Error,
    },
    #[error(
        "guest page {gpa:#x}: its frame was in neither the guest view nor where the engine \
         put it when eviction came to take it out, so what the guest last wrote there is \
         unknown; the page is lost rather than written back or given to the guest wrong"
    )]
    /// An eviction found a victim's frame gone from the guest view (anonymous guest memory):
    /// the page is `LOST`.
    FrameVanished {
        /// Guest-physical address of the page.
        gpa: u64,
    },
    #[error("vCPU index {0} is out of range (max {max})", max = crate::vcpu::MAX_VCPUS - 1)]
    /// A vCPU index at or above [`MAX_VCPUS`](crate::vcpu::MAX_VCPUS).
    BadVcpu(u32),
    #[error(
        "guest page {gpa:#x} is in use: a snapshot's remote pages are taken back only by a \
         VM that has not run yet"
    )]
    /// [`crate::Engine::adopt_remote`] found a page that is neither never written, remote nor
    /// resident and unpinned: the VM is not fresh.
    NotFresh {
        /// Guest-physical address of the page.
        gpa: u64,
    },
    #[error("the paging engine has stopped")]
    /// The engine was shut down.
    Stopped,
    #[error("timed out after {0:?} waiting for guest page {1:#x} to become resident")]
    /// A VMM access waited too long for a page (the duration, the guest-physical address).
    Timeout(std::time::Duration, u64),
}

impl EngineError {
    pub(crate) fn os(what: &'static str, source: std::io::Error) -> Self {
        Self::Os { what, source }
    }
}
