//! The installer: puts page data into the guest view and takes it out again. Owns guest RAM
//! (its backing, `backing.rs`: a memfd with its guest view and the engine's private alias, or
//! anonymous memory whose pages move in and out), the userfaultfd registered on the guest
//! view, and the stage-2 pre-fault gate; counts what it installs.
//!
//! Two jobs, two files: the backing is the memory mechanism (where a page's bytes live, how
//! they enter and leave the guest view, the userfaultfd, landing frames), the same whichever
//! page it is; the installer is the page-state protocol on top of it (pins in the state
//! words, counters, the touch log, wake-ups, fingerprints, the stage-2 gate). The engine's other parts talk
//! to the installer only, so guest RAM has one owner; calls that need no page state
//! (`drop_landing`, `settle`, `evictable`, `unpool`, `publish_pool`, `free`) pass straight
//! through to the backing.
//!
//! Mapping protocol: a page is mapped into the guest view only while its state word is `LOCAL`
//! and holds a pin taken for the mapping ([`Installer::claim_local`], then
//! [`Installer::map_pinned`] drops the pin). The evictor claims unpinned pages only, so it
//! cannot claim and zap a page between its state change and its UFFDIO_CONTINUE. Data is
//! written and read through the alias, which is never registered: the engine's own loads and
//! stores never fault into its own userfaultfd.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::backing::{Backing, GuestMemory, Refused};
use crate::error::EngineError;
use crate::hash::{self, Fingerprint};
use crate::pagemeta::PageMeta;
use crate::stage2::{PreFaultError, StageTwo, StageTwoGate};
use crate::state::{self as st, PageTable};
use crate::stats::{Counter, Counters};
use crate::store::PageBuf;
use crate::sys::mem;
use crate::sys::uffd::{Fault, RawMsg, MAX_EVENTS};
use crate::touchlog::TouchLog;
use crate::translate::GuestPages;
use crate::PAGE_SIZE;

pub(crate) struct Installer {
    ram: Backing,
    stage2: StageTwoGate,
    table: Arc<PageTable>,
    meta: Arc<PageMeta>,
    counters: Arc<Counters>,
    touch_log: TouchLog,
}

impl Installer {
    /// Creates guest RAM of `len` bytes and registers its guest view with a new userfaultfd.
    pub fn new(
        len: usize,
        kind: GuestMemory,
        pool_pages: u64,
        stage2: Box<dyn StageTwo>,
        table: Arc<PageTable>,
        meta: Arc<PageMeta>,
        counters: Arc<Counters>,
    ) -> Result<Self, EngineError> {
        tracing::info!(backing = ?kind, "guest RAM backing");
        let ram = Backing::new(len, kind, pool_pages).map_err(|e| {
            EngineError::os(
                "creating guest RAM and its userfaultfd (needs root or \
                 vm.unprivileged_userfaultfd=1; anonymous guest memory needs Linux 6.8+)",
                e,
            )
        })?;
        Ok(Self {
            touch_log: TouchLog::new(table.len()),
            ram,
            stage2: StageTwoGate::new(stage2),
            table,
            meta,
            counters,
        })
    }

    /// The order pages first became resident ([`TouchLog`]).
    pub fn touch_log(&self) -> &TouchLog {
        &self.touch_log
    }

    pub fn pages(&self) -> u64 {
        self.ram.pages()
    }

    /// Host address and length of the guest view.
    pub fn guest_range(&self) -> (u64, u64) {
        (self.ram.guest_base(), self.ram.pages() * PAGE_SIZE as u64)
    }

    /// The guest page a fault address of the guest view falls in.
    #[inline]
    pub fn page_of(&self, addr: u64) -> Option<u64> {
        addr.checked_sub(self.ram.guest_base())
            .map(|off| off / PAGE_SIZE as u64)
            .filter(|&p| p < self.pages())
    }

    /// The userfaultfd, for the fault handler's epoll set.
    pub fn uffd_fd(&self) -> RawFd {
        self.ram.uffd().raw_fd()
    }

    /// Reads pending guest faults (non-blocking); returns how many.
    #[inline]
    pub fn read_faults(
        &self,
        raw: &mut [RawMsg; MAX_EVENTS],
        out: &mut [Fault; MAX_EVENTS],
    ) -> io::Result<usize> {
        self.ram.uffd().read_faults(raw, out)
    }

    /// The page behind `p` as a store buffer (memfd page through the alias, or staging
    /// slot). The caller owns the page (INFLIGHT for a read, EVICTING for a write-back) until
    /// the request completes.
    #[inline]
    pub fn page_buf(&self, p: u64) -> PageBuf {
        // SAFETY: the page's data address is 4 KiB of engine memory, mapped as long as `self`;
        // the page-state protocol gives it to one request at a time.
        unsafe { PageBuf::new(self.ram.data_ptr(p)) }.expect("guest RAM mappings are non-null")
    }

    /// Assigns the owned pages `pages` (sorted, read next) landing frames where the backing
    /// keeps free ones (anon: no syscall; markers and probes, which will be staged, in bounce
    /// pages); the fault handler's read batches only. Their [`Installer::page_buf`] is the
    /// landing frame from here.
    pub fn assign_frames(&self, pages: &[u64]) {
        let (pooled, bounced) = self
            .ram
            .assign_frames(pages, |p| self.table.load(p) & st::F_MARKER != 0);
        if pooled > 0 {
            self.counters.add(Counter::PoolLandings, pooled);
        }
        if bounced > 0 {
            self.counters.add(Counter::BounceLandings, bounced);
        }
    }

    /// A read of owned page `p` ended without data to keep (failed, or the page was lost):
    /// frees its landing frame, if any.
    pub fn drop_landing(&self, p: u64) {
        self.ram.drop_landing(p);
    }

    /// Owned page `p` stays unmapped for a while (STAGED): its data leaves a pool landing
    /// frame for the page's own slot (anon), keeping the pool's slots for reads in flight; a
    /// bounce page it keeps.
    pub fn settle(&self, p: u64) {
        self.ram.settle(p);
    }

    /// Whether page `p` may be evicted (see `backing::UNMOVABLE_AFTER`).
    #[inline]
    pub fn evictable(&self, p: u64) -> bool {
        self.ram.evictable(p)
    }

    /// Fingerprint of the memfd page behind `p`. The caller owns the page (INFLIGHT with data
    /// landed, or EVICTING after the zap), so nobody writes it meanwhile.
    #[inline]
    pub fn fingerprint(&self, p: u64) -> Fingerprint {
        // SAFETY: `p` is in range and the caller owns the page, so nobody writes it now.
        unsafe { hash::of_page(self.ram.data_ptr(p)) }
    }

    /// Publishes `p` as `LOCAL | flags(word)` (from INFLIGHT / STAGED / EVICTING, which the
    /// caller owns) and maps it into the guest view, waking waiters if `wake` or if the replaced
    /// word says a fault waits. Returns the replaced word.
    pub fn publish_local(&self, p: u64, flags: impl Fn(u32) -> u32, wake: bool) -> u32 {
        let old = self.claim_local(p, flags);
        let wake = wake || old & (st::F_WAITERS | st::F_DEMAND) != 0;
        self.map_pinned(p, 1, wake);
        old
    }

    /// First half of [`Installer::publish_local`]: the page becomes `LOCAL` with one pin held
    /// for the caller, not yet mapped. Returns the replaced word.
    pub fn claim_local(&self, p: u64, flags: impl Fn(u32) -> u32) -> u32 {
        // Every way into the guest view passes here: the touch log sees each page's first.
        self.touch_log.record(p);
        self.table
            .update(p, |w| {
                Some(st::pins_only(w) + st::PIN_ONE + (st::LOCAL | flags(w) | st::F_REF))
            })
            .map(|(old, _)| old)
            .unwrap_or(0)
    }

    /// Second half: maps `n` claimed pages from `p` with one UFFDIO_CONTINUE and drops the pins.
    pub fn map_pinned(&self, p: u64, n: u64, wake: bool) {
        if let Err(e) = self.ram.map(p, n, wake) {
            // The pages stay LOCAL: the next guest fault on one retries its mapping.
            tracing::error!("mapping guest pages {p:#x}+{n}: {e}");
        }
        for q in p..p + n {
            self.table.unpin(q);
        }
    }

    /// Zero-fills never-written page `p` and publishes it (the caller moved it to INFLIGHT and
    /// holds a frame).
    pub fn install_zero(&self, p: u64, wake: bool) {
        self.ram.zero(p, true);
        self.meta.set_clean_fp(p, self.meta.zero_fp());
        // Counted before the wake, so a woken vCPU never observes a stale count.
        self.counters.inc(Counter::ZeroFills);
        self.publish_local(p, |_| 0, wake);
    }

    /// Injects claimed prefetched pages (LOCAL, pinned): maps them without a wake, one
    /// UFFDIO_CONTINUE per run of neighbours (0.3-0.5 µs per page instead of ~1.2 µs per call),
    /// then pre-faults stage 2 for each run.
    pub fn inject(&self, pages: &mut [u64]) {
        pages.sort_unstable();
        let c = &self.counters;
        let _ = mem::for_runs(pages, |start, n| {
            self.map_pinned(start, n, false);
            c.add(Counter::PrefetchInjected, n);
            if let Some(r) = self
                .stage2
                .pre_fault(start * PAGE_SIZE as u64, n * PAGE_SIZE as u64)
            {
                c.inc(Counter::PrefaultCalls);
                match r {
                    Ok(()) => c.add(Counter::PrefaultPages, n),
                    Err(PreFaultError::Unsupported) => c.inc(Counter::PrefaultUnsupported),
                    Err(PreFaultError::Failed(_)) => c.inc(Counter::PrefaultFailed),
                }
            }
            Ok(())
        });
    }

    /// Maps `LOCAL` page `p` again (a fault raced with its install, or it was unmapped for an
    /// eviction that gave it back) under a pin, waking the faulting thread. False if the page
    /// is no longer `LOCAL`.
    pub fn remap(&self, p: u64) -> bool {
        if !self.table.try_pin(p) {
            return false;
        }
        let r = self.ram.map(p, 1, true);
        self.table.unpin(p);
        if let Err(e) = r {
            tracing::error!("re-mapping guest page {p:#x}: {e}");
        }
        true
    }

    /// Wakes the threads waiting on a fault of page `p` (mapped already).
    pub fn wake(&self, p: u64) {
        if let Err(e) = self
            .ram
            .uffd()
            .wake(self.ram.guest_page_addr(p), PAGE_SIZE as u64)
        {
            tracing::error!("UFFDIO_WAKE of guest page {p:#x}: {e}");
        }
    }

    /// Lets vCPUs blocked on lost page `p` leave the fault: maps a page of zeros at `p` and
    /// wakes them. The page stays `LOST` (see `lost`).
    pub fn release_lost(&self, p: u64) {
        // A LOST page has no owner: nothing else writes its data.
        self.ram.zero(p, false);
        if let Err(e) = self.ram.map(p, 1, true) {
            tracing::error!("releasing vCPUs from lost guest page {p:#x}: {e}");
        }
    }

    /// Takes the claimed victims `pages` (sorted) out of the guest view, keeping their data:
    /// memfd, by unmapping the ranges `spans` (`(first page, pages)`, see `spans.rs`, covering
    /// `pages`); anon, by moving each run of victims out, straight into pool slots with
    /// `to_pool` (while the pool has room), else to its staging slots. Victims the kernel
    /// refused to move stay mapped and are listed in `refused`.
    pub fn zap(
        &self,
        pages: &[u64],
        spans: &[(u64, u64)],
        to_pool: bool,
        refused: &mut Refused,
    ) -> io::Result<()> {
        self.ram.zap(pages, spans, to_pool, refused)
    }

    /// Moves the victims among `pages` that the last zap put into pool slots from position
    /// `from` on to their staging slots, and gives the positions back (anon).
    pub fn unpool(&self, pages: &[u64], from: u64) -> io::Result<()> {
        self.ram.unpool(pages, from)
    }

    /// The evictor's pool positions before `limit` hold free frames now (anon: victims moved
    /// straight into pool slots, see `backing.rs`); `u64::MAX` when no round holds any.
    pub fn publish_pool(&self, limit: u64) {
        self.ram.publish_pool(limit);
    }

    /// Frees the data of evicted `pages`: memfd, by punching them out after unmapping the
    /// ranges `spans` (which cover `pages`) from the alias (one TLB flush per range there, and
    /// none left for the frees); anon, by moving their frames to the pool for reuse.
    pub fn free(&self, pages: &[u64], spans: &[(u64, u64)]) -> io::Result<()> {
        self.ram.free(pages, spans)
    }

    /// Copies `dst.len()` bytes from offset `off` of page `p` out (through the alias, or the
    /// mapped guest view). The caller holds a pin on the page (resident, not evictable).
    pub fn copy_out(&self, p: u64, off: usize, dst: &mut [u8]) {
        assert!(p < self.pages() && off + dst.len() <= PAGE_SIZE);
        // SAFETY: in bounds of the page (checked above), whose address `local_ptr` gives
        // without any fault into our own uffd (never registered, or mapped); the pinned page is
        // neither freed nor moved out meanwhile.
        unsafe {
            core::ptr::copy_nonoverlapping(
                self.ram.local_ptr(p).add(off),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
    }

    /// Copies `src` into page `p` at offset `off` (the eviction fingerprint sees the write).
    /// The caller holds a pin on the page.
    pub fn copy_in(&self, p: u64, off: usize, src: &[u8]) {
        assert!(p < self.pages() && off + src.len() <= PAGE_SIZE);
        // SAFETY: as in `copy_out`.
        unsafe {
            core::ptr::copy_nonoverlapping(src.as_ptr(), self.ram.local_ptr(p).add(off), src.len())
        };
    }

    /// Engine address of pinned page `p`, for reading an agent slot page (see `vcpu`).
    pub fn alias_ptr(&self, p: u64) -> *const u8 {
        self.ram.local_ptr(p)
    }

    pub fn stage2_enabled(&self) -> bool {
        self.stage2.enabled()
    }

    /// Pages whose backing is present (mincore).
    pub fn resident_by_mincore(&self) -> io::Result<u64> {
        self.ram.resident_count()
    }
}

/// Page-table walks (`translate::VirtualPages`) read only pages that are resident now: the
/// fault thread must never wait for I/O, least of all its own.
impl GuestPages for Installer {
    fn read_u64(&self, gpa: u64) -> Option<u64> {
        let p = gpa / PAGE_SIZE as u64;
        if p >= self.pages() || !self.table.try_pin(p) {
            return None;
        }
        let off = (gpa % PAGE_SIZE as u64) as usize & !7;
        // SAFETY: `p` is pinned LOCAL (the evictor cannot free or move it meanwhile) and its
        // `local_ptr` page is mapped without a fault into our uffd; `off` is 8-aligned inside
        // the page. The guest may write the word
        // concurrently (an accessed bit): an atomic load makes that a defined race.
        let v = unsafe {
            (*(self.ram.local_ptr(p).add(off) as *const std::sync::atomic::AtomicU64))
                .load(Ordering::Relaxed)
        };
        self.table.unpin(p);
        Some(v)
    }

    fn copy_page(&self, gpn: u64, out: &mut [u64; 512]) -> bool {
        if gpn >= self.pages() || !self.table.try_pin(gpn) {
            return false;
        }
        let base = self.ram.local_ptr(gpn) as *const std::sync::atomic::AtomicU64;
        for (i, o) in out.iter_mut().enumerate() {
            // SAFETY: as in `read_u64`: pinned, in bounds (i < 512 words = 4 KiB), aligned.
            *o = unsafe { (*base.add(i)).load(Ordering::Relaxed) };
        }
        self.table.unpin(gpn);
        true
    }
}
