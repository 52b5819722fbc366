//! Serving a lazily restored VM's resident pages from its snapshot's page file (the
//! Firecracker way, `farvm run --restore-pages lazy|...`): [`SnapshotPageFile`] is the page
//! file opened for reading with the set of pages it still serves, and [`PageFileStore`] the
//! paging engine's store, which answers a read of such a page with a `pread` of the file on the
//! calling thread and hands every other request to the memory pool's store. A page stops
//! being served from the file once the engine writes it back to the pool (or discards it):
//! from then on the pool holds its content. The engine checks every page read from the file
//! against the fingerprint the save recorded (`resident.pages`), as it checks a page read
//! from a server.
//!
//! Owns the open page file and one bit per page of guest RAM; a read costs one atomic load
//! and, for a page of the file, one `pread` — no lock, no allocation.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use farvm_ept::store::{
    Completion, CompletionSink, GuestPage, Op, ReadReq, RemoteStore, Replica, Status, StoreError,
    Version, WriteReq,
};

const PAGE: usize = 4096;

/// A snapshot's page file that cannot serve a page.
#[derive(Debug, thiserror::Error)]
pub enum PageFileError {
    /// The file cannot be opened or read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The page file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A page listed in it lies outside guest RAM.
    #[error("the page file {} lists page {page:#x}, outside guest RAM", path.display())]
    OutsideRam {
        /// The page file.
        path: PathBuf,
        /// The page.
        page: u64,
    },
}

/// Where guest-physical page `page` lies in a snapshot's page file (guest RAM's `regions`,
/// `(gpa, len)`, back to back).
pub fn file_offset(regions: &[(u64, u64)], page: u64) -> Option<u64> {
    let gpa = page * PAGE as u64;
    let mut off = 0;
    for &(start, len) in regions {
        if gpa >= start && gpa < start + len {
            return Some(off + gpa - start);
        }
        off += len;
    }
    None
}

/// A snapshot's page file, read page by page while the restored VM runs.
pub struct SnapshotPageFile {
    path: PathBuf,
    file: File,
    regions: Vec<(u64, u64)>,
    /// One bit per guest page: its content is the file's (not written back since).
    held: Box<[AtomicU64]>,
    /// Pages read from the file so far.
    served: AtomicU64,
    /// Pages of the recorded working set fetched so far.
    working_set_fetched: AtomicU64,
}

/// What a lazy restore has read from its snapshot's page file (`farvm stats`, the run's
/// report: `paging.lazy_restore`).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct LazyRestoreStats {
    /// Pages read from the page file (first touches, prefetches and the working set's
    /// fetch).
    pub page_file_reads: u64,
    /// Pages of the recorded working set fetched (`--restore-pages working-set[-async]`).
    pub working_set_fetched: u64,
}

impl std::fmt::Debug for SnapshotPageFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotPageFile")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SnapshotPageFile {
    /// Opens the page file at `path`, laid out as `regions` say, serving `pages`.
    pub fn open(
        path: &Path,
        regions: &[(u64, u64)],
        pages: impl Iterator<Item = u64>,
    ) -> Result<Self, PageFileError> {
        let read = |source| PageFileError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(read)?;
        let span = regions
            .iter()
            .map(|&(gpa, len)| gpa + len)
            .max()
            .unwrap_or(0);
        let held: Box<[AtomicU64]> = (0..(span / PAGE as u64).div_ceil(64))
            .map(|_| AtomicU64::new(0))
            .collect();
        for p in pages {
            if file_offset(regions, p).is_none() {
                return Err(PageFileError::OutsideRam {
                    path: path.to_path_buf(),
                    page: p,
                });
            }
            held[(p / 64) as usize].fetch_or(1 << (p % 64), Ordering::Relaxed);
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            regions: regions.to_vec(),
            held,
            served: AtomicU64::new(0),
            working_set_fetched: AtomicU64::new(0),
        })
    }

    /// Whether page `p`'s content is still the page file's.
    #[inline]
    pub fn holds(&self, p: u64) -> bool {
        self.held
            .get((p / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (p % 64)) != 0)
    }

    fn set(&self, p: u64, on: bool) {
        if let Some(w) = self.held.get((p / 64) as usize) {
            let bit = 1 << (p % 64);
            if on {
                w.fetch_or(bit, Ordering::AcqRel);
            } else {
                w.fetch_and(!bit, Ordering::AcqRel);
            }
        }
    }

    /// Reads page `p` from the file into `buf` (4 KiB).
    pub fn read_page(&self, p: u64, buf: &mut [u8]) -> Result<(), PageFileError> {
        let at = file_offset(&self.regions, p).ok_or_else(|| PageFileError::OutsideRam {
            path: self.path.clone(),
            page: p,
        })?;
        self.file
            .read_exact_at(&mut buf[..PAGE], at)
            .map_err(|source| PageFileError::Read {
                path: self.path.clone(),
                source,
            })
    }

    /// What was read so far.
    pub fn stats(&self) -> LazyRestoreStats {
        LazyRestoreStats {
            page_file_reads: self.served.load(Ordering::Relaxed),
            working_set_fetched: self.working_set_fetched.load(Ordering::Relaxed),
        }
    }

    /// Counts `n` pages of the working set fetched.
    pub(crate) fn working_set_fetched(&self, n: u64) {
        self.working_set_fetched.fetch_add(n, Ordering::Relaxed);
    }
}

/// The engine's store for a lazily restored VM (module doc).
pub struct PageFileStore {
    file: Arc<SnapshotPageFile>,
    pool: Arc<dyn RemoteStore>,
    sink: OnceLock<Arc<dyn CompletionSink>>,
}

impl PageFileStore {
    /// Serves `file`'s pages, and hands every other request to `pool`.
    pub fn new(file: Arc<SnapshotPageFile>, pool: Arc<dyn RemoteStore>) -> Self {
        Self {
            file,
            pool,
            sink: OnceLock::new(),
        }
    }

    /// Reads a page of the file into the request's buffer.
    fn serve(&self, r: &ReadReq) -> Status {
        // SAFETY: the request's buffer is the store's until its completion is delivered
        // (the store contract in farvm-pageio), and that completion is delivered after this.
        let buf = unsafe { r.dst.as_mut_slice() };
        match self.file.read_page(r.page, buf) {
            Ok(()) => {
                self.file.served.fetch_add(1, Ordering::Relaxed);
                Status::Ok
            }
            Err(e) => {
                tracing::error!("lazy restore: {e}");
                Status::Failed(StoreError::Io(libc::EIO))
            }
        }
    }

    fn complete(&self, page: GuestPage, status: Status) {
        if let Some(sink) = self.sink.get() {
            sink.complete(&[Completion {
                op: Op::Read,
                page,
                status,
                replica: Replica::NONE,
            }]);
        }
    }

    /// Hands a run of reads to the pool; a refused run completes as failed here, since
    /// reads of the same batch served from the file have completed already.
    fn forward(&self, run: &[ReadReq]) {
        if run.is_empty() {
            return;
        }
        if let Err(e) = self.pool.read(run) {
            for r in run {
                self.complete(r.page, Status::Failed(e));
            }
        }
    }
}

impl RemoteStore for PageFileStore {
    fn attach(&self, sink: Arc<dyn CompletionSink>) -> Result<(), StoreError> {
        let _ = self.sink.set(sink.clone());
        self.pool.attach(sink)
    }

    fn read(&self, reqs: &[ReadReq]) -> Result<(), StoreError> {
        if !reqs.iter().any(|r| self.file.holds(r.page)) {
            return self.pool.read(reqs);
        }
        let mut run = 0;
        for (i, r) in reqs.iter().enumerate() {
            if self.file.holds(r.page) {
                self.forward(&reqs[run..i]);
                run = i + 1;
                let status = self.serve(r);
                self.complete(r.page, status);
            }
        }
        self.forward(&reqs[run..]);
        Ok(())
    }

    fn write(&self, reqs: &[WriteReq]) -> Result<(), StoreError> {
        // The pool holds these pages from now on. They are EVICTING: no read of them races.
        let held: Vec<GuestPage> = reqs
            .iter()
            .map(|r| r.page)
            .filter(|&p| self.file.holds(p))
            .collect();
        for &p in &held {
            self.file.set(p, false);
        }
        self.pool.write(reqs).inspect_err(|_| {
            // Refused: the evictor keeps the pages, and the file still has their content.
            for &p in &held {
                self.file.set(p, true);
            }
        })
    }

    fn discard(&self, pages: &[GuestPage]) -> Result<(), StoreError> {
        for &p in pages {
            self.file.set(p, false);
        }
        self.pool.discard(pages)
    }

    fn read_now(&self, req: &ReadReq) -> Option<(Status, Replica)> {
        if self.file.holds(req.page) {
            return Some((self.serve(req), Replica::NONE));
        }
        self.pool.read_now(req)
    }

    fn reject(&self, page: GuestPage, replica: Replica) -> bool {
        // The file is the page's only copy: its content failed the engine's check.
        !self.file.holds(page) && self.pool.reject(page, replica)
    }

    fn promote(&self, page: GuestPage) {
        self.pool.promote(page)
    }

    fn reseal_wanted(&self) -> bool {
        self.pool.reseal_wanted()
    }

    fn reseal(&self, page: GuestPage, version: Version) -> Result<bool, StoreError> {
        if self.file.holds(page) {
            return Ok(false); // not on the servers (their copy, if any, is an older one)
        }
        self.pool.reseal(page, version)
    }

    fn reseal_finished(&self) {
        self.pool.reseal_finished()
    }
}
