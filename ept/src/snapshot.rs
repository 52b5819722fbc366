//! The engine's side of a VM snapshot that leaves remote pages where they are: listing guest
//! RAM as resident pages (their bytes) and remote ones (the fingerprint of the content the
//! memory servers hold) without reading a remote page back ([`SnapshotPages::save`]), and, in
//! a fresh engine before its guest runs, taking remote pages back as `REMOTE` with their
//! fingerprints ([`SnapshotPages::adopt_remote`]), so that their first touch reads them from
//! the servers, versions and end-to-end checks as if this engine had written them back.
//!
//! Owns nothing but its handles to the parts; it runs on the VMM's thread while the VM is
//! paused (save) or not started (adopt), never on the fault path.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backing::Refused;
use crate::error::EngineError;
use crate::frames::Frames;
use crate::hash::Fingerprint;
use crate::installer::Installer;
use crate::pagemeta::{PageMeta, UNKNOWN_FP};
use crate::parts::Parts;
use crate::state::{self as st, state_of, PageTable};
use crate::PAGE_SIZE;

/// How long a page may stay in flight (a read or a write-back) before a save gives up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// One page of guest RAM as a snapshot sees it.
#[derive(Debug)]
pub enum SavedPage<'a> {
    /// Resident: its bytes.
    Resident(&'a [u8]),
    /// On the memory servers only: the fingerprint of the content they hold (its low 64 bits
    /// are the page's write version).
    Remote(Fingerprint),
}

pub(crate) struct SnapshotPages {
    table: Arc<PageTable>,
    meta: Arc<PageMeta>,
    frames: Arc<Frames>,
    installer: Arc<Installer>,
}

impl SnapshotPages {
    pub fn new(parts: &Parts) -> Self {
        Self {
            table: parts.table().clone(),
            meta: parts.meta().clone(),
            frames: parts.frames().clone(),
            installer: parts.installer().clone(),
        }
    }

    /// Calls `each(page, what)` for every page ever written, in page order: a resident page
    /// is pinned for the copy (the evictor cannot take it meanwhile), a page in flight is
    /// waited for. The guest must be paused: a page written after it was listed is not seen.
    /// A page whose data is lost fails the save with [`EngineError::PageLost`].
    pub fn save<E: From<EngineError>>(
        &self,
        mut each: impl FnMut(u64, SavedPage<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut buf = vec![0u8; PAGE_SIZE];
        for p in 0..self.table.len() {
            let deadline = Instant::now() + SETTLE_TIMEOUT;
            loop {
                let w = self.table.load(p);
                match state_of(w) {
                    st::NEVER => break,
                    st::REMOTE => {
                        each(p, SavedPage::Remote(self.meta.clean_fp(p)))?;
                        break;
                    }
                    st::LOST => {
                        return Err(EngineError::PageLost {
                            gpa: p * PAGE_SIZE as u64,
                        }
                        .into())
                    }
                    st::LOCAL if self.table.try_pin(p) => {
                        self.installer.copy_out(p, 0, &mut buf);
                        self.table.unpin(p);
                        each(p, SavedPage::Resident(&buf))?;
                        break;
                    }
                    // Prefetched and not mapped: its data is in the memfd, and the page cannot
                    // change while staged (only the fault handler moves it on).
                    st::STAGED if self.table.cas(p, w, w + st::PIN_ONE).is_ok() => {
                        self.installer.copy_out(p, 0, &mut buf);
                        self.table.unpin(p);
                        each(p, SavedPage::Resident(&buf))?;
                        break;
                    }
                    _ => {}
                }
                if Instant::now() > deadline {
                    return Err(EngineError::Timeout(SETTLE_TIMEOUT, p * PAGE_SIZE as u64).into());
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        Ok(())
    }

    /// Calls `each(page, bytes)` for every page resident now (mapped, or prefetched and
    /// staged), in page order, while the guest runs: a live migration's pre-copy round. Each
    /// page is pinned only for its copy; a page in flight, being evicted or pinned elsewhere
    /// is skipped (the final, paused listing of [`SnapshotPages::save`] settles it). A copy
    /// may race with a guest write: the caller compares what it sent with that listing.
    pub fn copy_resident<E>(
        &self,
        mut each: impl FnMut(u64, &[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut buf = vec![0u8; PAGE_SIZE];
        for p in 0..self.table.len() {
            let w = self.table.load(p);
            let pinned = match state_of(w) {
                st::LOCAL => self.table.try_pin(p),
                st::STAGED => self.table.cas(p, w, w + st::PIN_ONE).is_ok(),
                _ => false,
            };
            if !pinned {
                continue;
            }
            self.installer.copy_out(p, 0, &mut buf);
            self.table.unpin(p);
            each(p, &buf)?;
        }
        Ok(())
    }

    /// Makes page `p` `REMOTE`, its servers' content having fingerprint `fp`. For a fresh
    /// engine whose guest has not run: a never-written page just changes state; a resident
    /// one (boot data the VM's build wrote) is taken out of guest RAM first, as a clean
    /// eviction would.
    pub fn adopt_remote(&self, p: u64, fp: Fingerprint) -> Result<(), EngineError> {
        let gpa = p * PAGE_SIZE as u64;
        if p >= self.table.len() {
            return Err(EngineError::OutOfRange {
                gpa,
                len: PAGE_SIZE as u64,
                mem: self.table.len() * PAGE_SIZE as u64,
            });
        }
        if fp == UNKNOWN_FP {
            return Err(EngineError::PageStale { gpa });
        }
        // A page of the build that the evictor is moving out, or one still pinned, settles
        // first (loading the resident pages may have started evictions).
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        let w = loop {
            let w = self.table.load(p);
            let settled = match state_of(w) {
                st::NEVER | st::REMOTE | st::LOST => true,
                st::LOCAL => st::pins_of(w) == 0,
                _ => false,
            };
            if settled || Instant::now() > deadline {
                break w;
            }
            std::thread::sleep(Duration::from_micros(200));
        };
        match state_of(w) {
            st::NEVER => {
                self.meta.set_clean_fp(p, fp);
                self.table
                    .cas(p, w, st::pins_only(w) | st::REMOTE)
                    .map_err(|_| EngineError::NotFresh { gpa })
            }
            st::REMOTE => {
                self.meta.set_clean_fp(p, fp);
                Ok(())
            }
            st::LOCAL if st::pins_of(w) == 0 => {
                self.table
                    .cas(p, w, st::EVICTING)
                    .map_err(|_| EngineError::NotFresh { gpa })?;
                let mut refused = Refused::default();
                let out = self
                    .installer
                    .zap(&[p], &[(p, 1)], false, &mut refused)
                    .and_then(|()| {
                        if refused.pages.is_empty() && refused.vanished.is_empty() {
                            self.installer.free(&[p], &[(p, 1)])
                        } else {
                            Err(std::io::Error::other("the kernel refused to move it out"))
                        }
                    });
                if let Err(e) = out {
                    let _ = self.table.cas(p, st::EVICTING, st::LOCAL | st::F_REF);
                    return Err(EngineError::os(
                        "taking a restored page out of guest RAM",
                        e,
                    ));
                }
                self.meta.set_clean_fp(p, fp);
                self.table
                    .cas(p, st::EVICTING, st::REMOTE)
                    .map_err(|_| EngineError::NotFresh { gpa })?;
                self.frames.release();
                Ok(())
            }
            _ => Err(EngineError::NotFresh { gpa }),
        }
    }
}
