//! VMM accesses to guest memory. The VMM never loads or stores through the guest view (an
//! absent page would fault into the engine's own uffd); it calls these, which make pages
//! resident through the same page states and dedupe as guest faults, pin them for the copy so
//! the evictor cannot take them meanwhile, and copy through the engine's alias mapping.
//!
//! Owns nothing but its handles to the parts; waits by polling the page's state word (VMM
//! accesses are rare and never on the fault path).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::clock::Clock;
use crate::error::EngineError;
use crate::frames::Frames;
use crate::installer::Installer;
use crate::lost::LostPages;
use crate::pagemeta::PageMeta;
use crate::parts::Parts;
use crate::port::StorePort;
use crate::queues::Queues;
use crate::state::{self as st, state_of, PageTable};
use crate::stats::{Counter, Counters};
use crate::store::{Priority, ReadReq};
use crate::PAGE_SIZE;

/// How long a VMM access waits for one page before giving up with an error.
const ACCESS_TIMEOUT: Duration = Duration::from_secs(30);

pub(crate) struct Access {
    table: Arc<PageTable>,
    meta: Arc<PageMeta>,
    frames: Arc<Frames>,
    installer: Arc<Installer>,
    port: Arc<StorePort>,
    queues: Arc<Queues>,
    lost: Arc<LostPages>,
    counters: Arc<Counters>,
    clock: Clock,
}

impl Access {
    pub fn new(parts: &Parts) -> Self {
        Self {
            table: parts.table().clone(),
            meta: parts.meta().clone(),
            frames: parts.frames().clone(),
            installer: parts.installer().clone(),
            port: parts.port().clone(),
            queues: parts.queues().clone(),
            lost: parts.lost().clone(),
            counters: parts.counters().clone(),
            clock: parts.clock(),
        }
    }

    /// Validates `[gpa, gpa+len)`; returns its page span `(first, end)`.
    pub fn check_range(&self, gpa: u64, len: u64) -> Result<(u64, u64), EngineError> {
        let mem = self.installer.guest_range().1;
        let bad = || EngineError::OutOfRange { gpa, len, mem };
        let end = gpa.checked_add(len).ok_or_else(bad)?;
        if end > mem {
            return Err(bad());
        }
        Ok((gpa / PAGE_SIZE as u64, end.div_ceil(PAGE_SIZE as u64)))
    }

    /// Brings page `p` to LOCAL (mapped), waiting as needed.
    fn make_local(&self, p: u64, deadline: Instant) -> Result<(), EngineError> {
        let mut spins = 0u32;
        loop {
            if self.queues.stopping() {
                return Err(EngineError::Stopped);
            }
            let w = self.table.load(p);
            let demand = st::pins_only(w) | st::INFLIGHT | st::F_DEMAND;
            match state_of(w) {
                st::LOCAL => return Ok(()),
                st::NEVER | st::REMOTE if self.frames.try_reserve(true) => {
                    if self.table.cas(p, w, demand).is_err() {
                        self.frames.release();
                        continue;
                    }
                    if state_of(w) == st::NEVER {
                        self.installer.install_zero(p, true);
                        continue;
                    }
                    self.read(p);
                }
                st::STAGED => {
                    if self.table.cas(p, w, demand).is_ok() {
                        self.installer.publish_local(p, |_| 0, true);
                    }
                    continue;
                }
                st::INFLIGHT if w & st::F_MARKER != 0 => {
                    // Install on arrival instead of staging it.
                    let _ = self.table.cas(p, w, (w & !st::F_MARKER) | st::F_DEMAND);
                }
                st::EVICTING if w & st::F_WAITERS == 0 => {
                    let _ = self.table.cas(p, w, w | st::F_WAITERS);
                }
                st::LOST => {
                    self.lost.accessed(p);
                    return Err(EngineError::PageLost {
                        gpa: p * PAGE_SIZE as u64,
                    });
                }
                _ => {}
            }
            if Instant::now() > deadline {
                return Err(EngineError::Timeout(ACCESS_TIMEOUT, p * PAGE_SIZE as u64));
            }
            spins += 1;
            if spins < 16 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// Reads page `p`, which this access moved to INFLIGHT (no fault to time).
    fn read(&self, p: u64) {
        self.meta.set_io_at(p, self.clock.now());
        self.meta.set_fault_at(p, 0);
        self.port.read(&[ReadReq {
            page: p,
            priority: Priority::Demand,
            dst: self.installer.page_buf(p),
            version: self.meta.version(p),
        }]);
    }

    /// Makes `p` resident and pins it (the caller unpins, [`PageTable::unpin`]).
    pub fn pin_page(&self, p: u64) -> Result<(), EngineError> {
        let deadline = Instant::now() + ACCESS_TIMEOUT;
        loop {
            self.make_local(p, deadline)?;
            if self.table.try_pin(p) {
                return Ok(());
            }
        }
    }

    pub fn ensure_resident(&self, gpa: u64, len: u64) -> Result<(), EngineError> {
        let (first, end) = self.check_range(gpa, len)?;
        let deadline = Instant::now() + ACCESS_TIMEOUT;
        for p in first..end {
            self.make_local(p, deadline)?;
        }
        Ok(())
    }

    /// Starts, in one batch, the reads of the remote pages of `[gpa, gpa+len)`, as far as
    /// frames below the prefetch mark allow: a VMM copy of a long range (a snapshot) then waits
    /// about one round trip per batch rather than one per page. Each read is the demand read
    /// [`Self::make_local`] would start (the page is installed on arrival); a page this does
    /// not start is brought in by the copy itself, one at a time.
    pub fn fetch_ahead(&self, gpa: u64, len: u64) -> Result<(), EngineError> {
        let (first, end) = self.check_range(gpa, len)?;
        self.fetch(first..end);
        Ok(())
    }

    /// As [`Self::fetch_ahead`], for the listed pages in their order (a restore's recorded
    /// working set). A page outside guest RAM is an error, and nothing is fetched.
    pub fn fetch_pages(&self, pages: &[u64]) -> Result<(), EngineError> {
        let mem = self.installer.guest_range().1;
        let total = mem / PAGE_SIZE as u64;
        if let Some(&p) = pages.iter().find(|&&p| p >= total) {
            return Err(EngineError::OutOfRange {
                gpa: p.saturating_mul(PAGE_SIZE as u64),
                len: PAGE_SIZE as u64,
                mem,
            });
        }
        self.fetch(pages.iter().copied());
        Ok(())
    }

    /// Starts the demand reads of the remote pages among `pages`, in one batch.
    fn fetch(&self, pages: impl Iterator<Item = u64>) {
        let mut reqs = Vec::new();
        for p in pages {
            let w = self.table.load(p);
            if state_of(w) != st::REMOTE {
                continue;
            }
            if !self.frames.try_reserve(false) {
                break;
            }
            let demand = st::pins_only(w) | st::INFLIGHT | st::F_DEMAND;
            if self.table.cas(p, w, demand).is_err() {
                self.frames.release();
                continue;
            }
            self.meta.set_io_at(p, self.clock.now());
            self.meta.set_fault_at(p, 0);
            reqs.push(ReadReq {
                page: p,
                priority: Priority::Demand,
                dst: self.installer.page_buf(p),
                version: self.meta.version(p),
            });
        }
        if !reqs.is_empty() {
            self.port.read(&reqs);
        }
    }

    /// Calls `f(page, offset_in_page, range_in_buffer)` for each page piece of the access.
    fn for_pieces(
        &self,
        gpa: u64,
        len: usize,
        mut f: impl FnMut(u64, usize, std::ops::Range<usize>) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        self.check_range(gpa, len as u64)?;
        self.counters.inc(Counter::VmmAccesses);
        let mut done = 0usize;
        while done < len {
            let a = gpa + done as u64;
            let p = a / PAGE_SIZE as u64;
            let off = (a % PAGE_SIZE as u64) as usize;
            let n = (PAGE_SIZE - off).min(len - done);
            f(p, off, done..done + n)?;
            done += n;
        }
        Ok(())
    }

    pub fn read_bytes(&self, gpa: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.for_pieces(gpa, buf.len(), |p, off, r| {
            if state_of(self.table.load(p)) == st::NEVER {
                // Never written: zeros, without allocating the page.
                buf[r].fill(0);
                return Ok(());
            }
            self.pin_page(p)?;
            self.installer.copy_out(p, off, &mut buf[r]);
            self.table.unpin(p);
            Ok(())
        })
    }

    pub fn write_bytes(&self, gpa: u64, data: &[u8]) -> Result<(), EngineError> {
        self.for_pieces(gpa, data.len(), |p, off, r| {
            self.pin_page(p)?;
            self.installer.copy_in(p, off, &data[r]);
            self.table.unpin(p);
            Ok(())
        })
    }
}
