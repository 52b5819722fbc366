//! farvm-pageio: the page-store seam, one vocabulary shared by the paging engine (`farvm-ept`)
//! and every page store (the memserver client's store, the engine's in-process test store).
//!
//! The engine drives a [`RemoteStore`]; finished requests come back through the
//! [`CompletionSink`] the engine attaches.
//!
//! Contract:
//! - Requests are submitted in batches and complete asynchronously, in any order, possibly on
//!   another thread, possibly before `read`/`write` returns (an in-process store may complete
//!   inline). The engine holds no lock while submitting, so inline completion is fine.
//! - Completions are plain `Copy` values handed over in slices: no per-request heap allocation.
//! - A read of a page the server never stored completes with [`Status::Absent`], distinct from
//!   a failure.
//! - [`PageBuf`] memory belongs to the engine and stays valid and unaliased from submission until
//!   the request's completion has been delivered; the store must not touch it afterwards.

use std::ptr::NonNull;
use std::sync::Arc;

/// Page size of every request (4 KiB).
pub const PAGE_SIZE: usize = 4096;

/// Guest page number (guest-physical address >> 12).
pub type GuestPage = u64;

/// A page's write version: what identifies the content the engine last wrote back (or read) for
/// a page, known before a read returns. A store that authenticates pages binds each written
/// copy to its version and accepts a read only at the version the engine expects, so an older
/// copy, or another page's, is never delivered (docs/sealing.md). The engine uses the low 64
/// bits of its fingerprint of that content; [`Version::UNKNOWN`] when it has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Version(pub u64);

impl Version {
    /// The engine knows no content for the page (never written back or read this run).
    pub const UNKNOWN: Self = Self(0);
}

/// Request priority: demand reads block a vCPU and must overtake prefetches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Priority {
    /// A vCPU is blocked on this page.
    Demand,
    /// Fetched ahead of the guest on the prefetcher's guess; nobody waits on it yet.
    Prefetch,
}

/// 4 KiB of engine-owned memory a request reads into or writes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageBuf(NonNull<u8>);

// SAFETY: a PageBuf is an address handed between threads under the store contract above (the
// engine does not touch the bytes while the request is outstanding).
unsafe impl Send for PageBuf {}
// SAFETY: as above.
unsafe impl Sync for PageBuf {}

impl PageBuf {
    /// Wraps `ptr`; `None` if it is null.
    ///
    /// # Safety
    /// `ptr` must point at 4 KiB of writable memory that stays valid while requests using it
    /// are outstanding.
    pub unsafe fn new(ptr: *mut u8) -> Option<Self> {
        NonNull::new(ptr).map(Self)
    }

    /// The first byte of the page.
    pub fn as_ptr(self) -> *mut u8 {
        self.0.as_ptr()
    }

    /// The page's bytes.
    ///
    /// # Safety
    /// Only while the request owning this buffer is outstanding, by the store serving it.
    pub unsafe fn as_mut_slice<'a>(self) -> &'a mut [u8] {
        // SAFETY: per the constructor's and this method's contracts.
        unsafe { core::slice::from_raw_parts_mut(self.0.as_ptr(), PAGE_SIZE) }
    }

    /// The page's bytes, read-only.
    ///
    /// # Safety
    /// As [`PageBuf::as_mut_slice`].
    pub unsafe fn as_slice<'a>(self) -> &'a [u8] {
        // SAFETY: per the constructor's and this method's contracts.
        unsafe { core::slice::from_raw_parts(self.0.as_ptr(), PAGE_SIZE) }
    }
}

/// Read one page from the store into engine memory.
#[derive(Clone, Copy, Debug)]
pub struct ReadReq {
    /// The guest page to read.
    pub page: GuestPage,
    /// Demand reads overtake prefetches in the store's queues.
    pub priority: Priority,
    /// Where the page's bytes land (engine memory, untouched by the engine until completion).
    pub dst: PageBuf,
    /// The version the engine expects the page at.
    pub version: Version,
}

/// Write one page back from engine memory to the store.
#[derive(Clone, Copy, Debug)]
pub struct WriteReq {
    /// The guest page to write.
    pub page: GuestPage,
    /// Its bytes (engine memory, kept unchanged until completion).
    pub src: PageBuf,
    /// The version of these bytes (what a later read of the page will expect).
    pub version: Version,
}

/// What a completed request was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// A [`ReadReq`] (demand or prefetch).
    Read,
    /// A [`WriteReq`] (a write-back).
    Write,
}

/// Why a store request failed. `Copy` so completions carry it without allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// No memory server holding the page can be reached (the engine retries with back-off).
    #[error("memory server unreachable")]
    Unavailable,
    /// The server did not answer within the store's request timeout.
    #[error("request timed out")]
    Timeout,
    /// The store was shut down; nothing more will be served.
    #[error("store is shut down")]
    Closed,
    /// The server's answer did not make sense (bad frame, checksum mismatch).
    #[error("protocol error")]
    Protocol,
    /// A system call failed with this errno.
    #[error("I/O error (errno {0})")]
    Io(i32),
    /// The store's request queue is full; submit again later.
    #[error("request queue full")]
    Busy,
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Done: a read's bytes are in its buffer, a write is stored.
    Ok,
    /// The server holds no copy of this page.
    Absent,
    /// The request failed; see the error for whether retrying can help.
    Failed(StoreError),
}

/// Which copy of a page answered a read: an index the store defines (the memserver client's
/// index of the server), handed back to [`RemoteStore::reject`] if the content is stale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Replica(pub u16);

impl Replica {
    /// No particular copy: a write, a read no copy answered, or a store with one copy.
    pub const NONE: Self = Self(u16::MAX);
}

/// One finished request, as the store reports it to the [`CompletionSink`].
#[derive(Clone, Copy, Debug)]
pub struct Completion {
    /// Read or write.
    pub op: Op,
    /// The request's guest page.
    pub page: GuestPage,
    /// How it ended.
    pub status: Status,
    /// The copy whose content a successful read delivered ([`Replica::NONE`] otherwise).
    pub replica: Replica,
}

/// Where completions go. Implemented by the engine; called from any thread.
pub trait CompletionSink: Send + Sync {
    /// Delivers finished requests (any order, any thread, possibly inline from a submit).
    fn complete(&self, batch: &[Completion]);
}

/// Remote page storage for one VM.
pub trait RemoteStore: Send + Sync {
    /// Called once by the engine before any request: where to deliver completions.
    fn attach(&self, sink: Arc<dyn CompletionSink>) -> Result<(), StoreError>;
    /// Submits reads. On `Err`, none of the batch was accepted and no completion will come.
    fn read(&self, reqs: &[ReadReq]) -> Result<(), StoreError>;
    /// Submits write-backs. On `Err`, none of the batch was accepted.
    fn write(&self, reqs: &[WriteReq]) -> Result<(), StoreError>;
    /// Drops the remote copies of `pages` (synchronous, best effort: no completion).
    fn discard(&self, pages: &[GuestPage]) -> Result<(), StoreError>;
    /// Reads `page` into `dst` on the calling thread and returns once it has landed: the
    /// demand path with no thread hand-off (the fault handler receives the response itself;
    /// on this host every wake-up of another thread costs 5-50 µs). `None`: not supported,
    /// the engine submits an asynchronous demand read instead. Must not be called with the
    /// same `dst` as an outstanding request. Returns the status and the copy that answered.
    fn read_now(&self, req: &ReadReq) -> Option<(Status, Replica)> {
        let _ = req;
        None
    }
    /// A read of `page` that `replica` answered delivered content the engine knows is not
    /// the page's last written content (its fingerprint differs): a copy that missed a write,
    /// or a damaged one. The store stops reading from that copy (it lacks a write, so it
    /// leaves the page's replica set) and says whether another copy may hold the page: true,
    /// the engine reads the page again; false, no copy does and the page is lost. Called on
    /// the completion path. Default: false (one copy).
    fn reject(&self, page: GuestPage, replica: Replica) -> bool {
        let _ = (page, replica);
        false
    }
    /// A vCPU now waits on an outstanding prefetch read of `page`: serve it at demand priority
    /// if it is still queued. Optional (default: nothing; it completes as a prefetch).
    fn promote(&self, page: GuestPage) {
        let _ = page;
    }
    /// Whether a re-seal sweep is wanted: the store's key was rotated and pages may still be
    /// stored under the previous key. Polled by the engine's evictor (an atomic load).
    /// Default: never (a store that does not seal).
    fn reseal_wanted(&self) -> bool {
        false
    }
    /// Re-seals the stored copy of `page` (expected at `version`) under the store's current
    /// key: read and written back with the same version, on the calling thread. The engine
    /// calls it from the thread that writes pages back, so no write of `page` overtakes it.
    /// `Ok(false)`: no copy stored, nothing to do. Default: `Ok(false)`.
    fn reseal(&self, page: GuestPage, version: Version) -> Result<bool, StoreError> {
        let _ = (page, version);
        Ok(false)
    }
    /// The engine's sweep re-sealed every stored page since the last
    /// [`RemoteStore::reseal_wanted`]: the store may forget its previous key. Default:
    /// nothing.
    fn reseal_finished(&self) {}
}
