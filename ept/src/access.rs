//! VMM accesses to guest memory: the VMM never loads or stores through the guest view (an absent
//! page would fault into the engine's own uffd). Instead it calls these, which make pages
//! resident through the engine (same states, same dedupe), pin them for the copy so the evictor
//! cannot take them meanwhile, and copy through the engine's alias mapping.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::engine::Inner;
use crate::error::EngineError;
use crate::state::{self as st, state_of};
use crate::store::{PageBuf, Priority, ReadReq, Status};
use crate::PAGE_SIZE;

/// How long a VMM access waits for one page before giving up with an error.
const ACCESS_TIMEOUT: Duration = Duration::from_secs(30);

impl Inner {
    /// Validates `[gpa, gpa+len)`; returns its page span `(first, end)`.
    pub(crate) fn check_range(&self, gpa: u64, len: u64) -> Result<(u64, u64), EngineError> {
        let mem = self.ram.len() as u64;
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
            if self.stop.load(Ordering::Acquire) {
                return Err(EngineError::Stopped);
            }
            let w = self.table.load(p);
            let demand = st::pins_only(w) | st::INFLIGHT | st::F_DEMAND;
            match state_of(w) {
                st::LOCAL => return Ok(()),
                st::NEVER | st::REMOTE if self.try_reserve(true) => {
                    if self.table.cas(p, w, demand).is_err() {
                        self.release_frame();
                        continue;
                    }
                    if state_of(w) == st::NEVER {
                        self.install_zero(p, true);
                        continue;
                    }
                    self.submit_vmm_read(p);
                }
                st::STAGED => {
                    if self.table.cas(p, w, demand).is_ok() {
                        self.publish_local(p, |_| 0, true);
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
                    self.lost_page_accessed(p);
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

    fn submit_vmm_read(&self, p: u64) {
        self.counters
            .remote_reads_demand
            .fetch_add(1, Ordering::Relaxed);
        self.t_io[p as usize].store(self.now(), Ordering::Relaxed);
        self.t_fault[p as usize].store(0, Ordering::Relaxed);
        // SAFETY: the page is INFLIGHT and owned by this read until its completion.
        let dst = unsafe { PageBuf::new(self.ram.alias_page(p)) }.expect("non-null");
        let req = ReadReq {
            page: p,
            priority: Priority::Demand,
            dst,
        };
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        if let Err(e) = self.store.read(&[req]) {
            self.outstanding.fetch_sub(1, Ordering::AcqRel);
            self.on_read_done(p, Status::Failed(e));
        }
    }

    /// Makes `p` resident and pins it (caller unpins).
    pub(crate) fn pin_page(&self, p: u64) -> Result<(), EngineError> {
        let deadline = Instant::now() + ACCESS_TIMEOUT;
        loop {
            self.make_local(p, deadline)?;
            if self.table.try_pin(p) {
                return Ok(());
            }
        }
    }

    pub(crate) fn ensure_resident(&self, gpa: u64, len: u64) -> Result<(), EngineError> {
        let (first, end) = self.check_range(gpa, len)?;
        let deadline = Instant::now() + ACCESS_TIMEOUT;
        for p in first..end {
            self.make_local(p, deadline)?;
        }
        Ok(())
    }

    /// Calls `f(page, offset_in_page, range_in_buffer)` for each page piece of the access.
    fn for_pieces(
        &self,
        gpa: u64,
        len: usize,
        mut f: impl FnMut(u64, usize, std::ops::Range<usize>) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        self.check_range(gpa, len as u64)?;
        self.counters.vmm_accesses.fetch_add(1, Ordering::Relaxed);
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

    pub(crate) fn read_bytes(&self, gpa: u64, buf: &mut [u8]) -> Result<(), EngineError> {
        self.for_pieces(gpa, buf.len(), |p, off, r| {
            if state_of(self.table.load(p)) == st::NEVER {
                // Never written: zeros, without allocating the page.
                buf[r].fill(0);
                return Ok(());
            }
            self.pin_page(p)?;
            let dst = &mut buf[r];
            // SAFETY: the page is resident and pinned (not evictable); the alias mapping is
            // never uffd-registered; `off + dst.len() <= PAGE_SIZE`.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    self.ram.alias_page(p).add(off),
                    dst.as_mut_ptr(),
                    dst.len(),
                )
            };
            self.table.unpin(p);
            Ok(())
        })
    }

    pub(crate) fn write_bytes(&self, gpa: u64, data: &[u8]) -> Result<(), EngineError> {
        self.for_pieces(gpa, data.len(), |p, off, r| {
            self.pin_page(p)?;
            let src = &data[r];
            // SAFETY: as in `read_bytes`; the eviction fingerprint will see this write.
            unsafe {
                core::ptr::copy_nonoverlapping(
                    src.as_ptr(),
                    self.ram.alias_page(p).add(off),
                    src.len(),
                )
            };
            self.table.unpin(p);
            Ok(())
        })
    }
}

/// Page-table walks (`translate::VirtualPages`) read only pages that are resident now: the
/// fault thread must never wait for I/O, least of all its own.
impl crate::translate::GuestPages for Inner {
    fn read_u64(&self, gpa: u64) -> Option<u64> {
        let p = gpa / PAGE_SIZE as u64;
        if p >= self.pages() || !self.table.try_pin(p) {
            return None;
        }
        let off = (gpa % PAGE_SIZE as u64) as usize & !7;
        // SAFETY: `p` is pinned LOCAL (the evictor cannot free it meanwhile) and in bounds of
        // the alias mapping; `off` is 8-aligned inside the page. The guest may write the word
        // concurrently (an accessed bit): an atomic load makes that a defined race.
        let v = unsafe {
            (*(self.ram.alias_page(p).add(off) as *const std::sync::atomic::AtomicU64))
                .load(Ordering::Relaxed)
        };
        self.table.unpin(p);
        Some(v)
    }

    fn copy_page(&self, gpn: u64, out: &mut [u64; 512]) -> bool {
        if gpn >= self.pages() || !self.table.try_pin(gpn) {
            return false;
        }
        let base = self.ram.alias_page(gpn) as *const std::sync::atomic::AtomicU64;
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: as in `read_u64`: pinned, in bounds (i < 512 words = 4 KiB), aligned.
            *o = unsafe { (*base.add(i)).load(Ordering::Relaxed) };
        }
        self.table.unpin(gpn);
        true
    }
}
