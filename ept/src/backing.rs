//! Where guest RAM's pages live: the two backings the installer runs on.
//!
//! - **memfd** (default): one memfd mapped twice, the guest view (registered MISSING|MINOR)
//!   and the engine's alias; data lands in the memfd through the alias and is mapped with
//!   `UFFDIO_CONTINUE`; eviction zaps the guest view and punches the page out.
//! - **anon**: private anonymous guest RAM (`sys::anon::AnonRam`): data lands in the page's
//!   staging slot, `UFFDIO_MOVE` moves the frame into the guest view and, at eviction, back out;
//!   freed frames go to a pool the fault handler takes landing frames from, so a page cycle
//!   allocates, zeroes and frees nothing (`docs/data-path.md`).
//!
//! Where a page's data is, by its state (anon): INFLIGHT, STAGED and EVICTING pages have it in
//! their staging slot; a LOCAL page in the guest view once its `mapped` bit is set, else (a
//! victim given back, or between claim and map) in its staging slot. A reader of a pinned LOCAL
//! page maps it first ([`Backing::local_ptr`]): only the evictor moves a page out, and only
//! after claiming it, which a pin prevents.
//!
//! The pool is a ring of pool slots with one producer (the evictor, [`Backing::free`]) and one
//! consumer (the fault handler's read batches, [`Backing::take_frames`]): no lock, no
//! allocation. A read that finds no pool frame lands in an empty slot, which the kernel fills
//! with a zeroed page as the memfd does; a freed frame that finds the pool full is freed.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::sys::anon::AnonRam;
use crate::sys::mem::{self, GuestRam};
use crate::sys::uffd::{self, Installed, Uffd};
use crate::PAGE_SIZE;

const PG: u64 = PAGE_SIZE as u64;

/// Which backing guest RAM uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuestMemory {
    /// A memfd mapped twice; installs with UFFDIO_CONTINUE.
    #[default]
    Memfd,
    /// Private anonymous memory; pages move with UFFDIO_MOVE (Linux 6.8 or later).
    Anon,
}

impl GuestMemory {
    /// Parses `memfd` or `anon`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "memfd" => Some(Self::Memfd),
            "anon" => Some(Self::Anon),
            _ => None,
        }
    }
}

pub(crate) enum Backing {
    Memfd { ram: GuestRam, uffd: Uffd },
    Anon(Anon),
}

pub(crate) struct Anon {
    ram: AnonRam,
    /// One bit per guest page: its frame is in the guest view.
    mapped: Box<[AtomicU64]>,
    /// Frames in pool slots `head..tail` (mod the pool size).
    head: AtomicU64,
    tail: AtomicU64,
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

impl Backing {
    /// Guest RAM of `len` bytes, its guest view registered with a new uffd; `pool_pages` is
    /// the anon pool's size (free frames kept for reuse).
    pub fn new(len: usize, kind: GuestMemory, pool_pages: u64) -> io::Result<Self> {
        let features = uffd::feature::THREAD_ID;
        match kind {
            GuestMemory::Memfd => {
                let ram = GuestRam::new(len)?;
                let uffd = Uffd::open(
                    features | uffd::feature::MISSING_SHMEM | uffd::feature::MINOR_SHMEM,
                )?;
                uffd.register(
                    ram.guest_base(),
                    ram.len() as u64,
                    uffd::mode::MISSING | uffd::mode::MINOR,
                )?;
                Ok(Self::Memfd { ram, uffd })
            }
            GuestMemory::Anon => {
                let ram = AnonRam::new(len, pool_pages.max(1), features)?;
                let words = ram.pages().div_ceil(64) as usize;
                Ok(Self::Anon(Anon {
                    ram,
                    mapped: (0..words).map(|_| AtomicU64::new(0)).collect(),
                    head: AtomicU64::new(0),
                    tail: AtomicU64::new(0),
                }))
            }
        }
    }

    pub fn uffd(&self) -> &Uffd {
        match self {
            Self::Memfd { uffd, .. } => uffd,
            Self::Anon(a) => a.ram.uffd(),
        }
    }

    pub fn pages(&self) -> u64 {
        match self {
            Self::Memfd { ram, .. } => ram.pages(),
            Self::Anon(a) => a.ram.pages(),
        }
    }

    pub fn guest_base(&self) -> u64 {
        match self {
            Self::Memfd { ram, .. } => ram.guest_base(),
            Self::Anon(a) => a.ram.guest_base(),
        }
    }

    pub fn guest_page_addr(&self, p: u64) -> u64 {
        self.guest_base() + p * PG
    }

    /// Where the data of page `p` is while the engine owns it unmapped (INFLIGHT, STAGED,
    /// EVICTING after the zap): the alias page, or the staging slot.
    #[inline]
    pub fn data_ptr(&self, p: u64) -> *mut u8 {
        match self {
            Self::Memfd { ram, .. } => ram.alias_page(p),
            Self::Anon(a) => a.ram.staging_page(p),
        }
    }

    /// Maps `n` owned pages from `p` into the guest view, waking faulting threads if `wake`.
    /// A page mapped already (by a racing fault) is skipped (and woken if `wake`).
    pub fn map(&self, p: u64, n: u64, wake: bool) -> io::Result<Installed> {
        match self {
            Self::Memfd { ram, uffd } => uffd.continue_range(ram.guest_page_addr(p), n * PG, wake),
            Self::Anon(a) => a.move_in(p, n, wake),
        }
    }

    /// Makes owned, unmapped page `p` read as zeros: a never-written page (`hole`: a memfd
    /// hole, which allocating zero-fills) or a lost one.
    pub fn zero(&self, p: u64, hole: bool) {
        match self {
            Self::Memfd { ram, .. } if hole => ram.allocate_zero(p),
            // SAFETY: `p` is in range; the alias is never uffd-registered; the caller owns the
            // page, so nobody else writes it.
            Self::Memfd { ram, .. } => unsafe {
                core::ptr::write_bytes(ram.alias_page(p), 0, PAGE_SIZE)
            },
            // The staging slot may hold a reused frame: clear all of it.
            // SAFETY: as above; the staging area's missing faults are the kernel's.
            Self::Anon(a) => unsafe { core::ptr::write_bytes(a.ram.staging_page(p), 0, PAGE_SIZE) },
        }
    }

    /// Takes the claimed victims `pages` (sorted) out of the guest view; `spans` (bridged runs
    /// covering them, see `spans.rs`) for the memfd zap.
    pub fn zap(&self, pages: &[u64], spans: &[(u64, u64)]) -> io::Result<()> {
        match self {
            Self::Memfd { ram, .. } => ram.zap_guest_spans(spans),
            Self::Anon(a) => a.move_out(pages),
        }
    }

    /// Frees evicted `pages` (sorted; their data is no longer needed).
    pub fn free(&self, pages: &[u64], spans: &[(u64, u64)]) -> io::Result<()> {
        match self {
            Self::Memfd { ram, .. } => {
                ram.unmap_alias_spans(spans)?;
                ram.free(pages)
            }
            Self::Anon(a) => mem::for_runs(pages, |p, n| a.give(p, n)),
        }
    }

    /// Address of pinned `LOCAL` page `p` for the engine's own reads and writes (VMM
    /// accesses, page-table walks, agent slots): the alias, or the guest view after mapping
    /// the page if it is not yet.
    pub fn local_ptr(&self, p: u64) -> *mut u8 {
        match self {
            Self::Memfd { ram, .. } => ram.alias_page(p),
            Self::Anon(a) => {
                if !a.is_mapped(p) {
                    if let Err(e) = a.move_in(p, 1, true) {
                        tracing::error!("mapping guest page {p:#x} for the engine: {e}");
                    }
                }
                (a.ram.guest_base() + p * PG) as *mut u8
            }
        }
    }

    /// Gives the staging slots of `pages` (about to be read into) frames from the pool, where
    /// it has some. Only the fault handler calls this (the pool's one consumer).
    pub fn take_frames(&self, pages: &[u64]) {
        if let Self::Anon(a) = self {
            let _ = mem::for_runs(pages, |p, n| {
                a.take(p, n);
                Ok(())
            });
        }
    }

    pub fn resident_count(&self) -> io::Result<u64> {
        match self {
            Self::Memfd { ram, .. } => ram.resident_count(),
            Self::Anon(a) => a.ram.resident_count(),
        }
    }
}

impl Anon {
    fn is_mapped(&self, p: u64) -> bool {
        self.mapped[(p / 64) as usize].load(Ordering::Acquire) & (1 << (p % 64)) != 0
    }

    fn set_mapped(&self, p: u64, n: u64, on: bool) {
        for q in p..p + n {
            let (w, b) = ((q / 64) as usize, 1u64 << (q % 64));
            if on {
                self.mapped[w].fetch_or(b, Ordering::Release);
            } else {
                self.mapped[w].fetch_and(!b, Ordering::Release);
            }
        }
    }

    fn move_in(&self, p: u64, n: u64, wake: bool) -> io::Result<Installed> {
        let u = self.ram.uffd();
        let mut outcome = Installed::Done;
        let mut i = 0;
        while i < n {
            let dst = self.ram.guest_page_addr(p + i);
            match u.move_some(dst, self.ram.staging_page(p + i) as u64, (n - i) * PG, wake) {
                Ok(b) => {
                    self.set_mapped(p + i, b / PG, true);
                    i += b / PG;
                }
                // Mapped already by a racing fault or reader (which moved the frame in).
                Err(e) if matches!(errno(&e), libc::EEXIST | libc::ENOENT) => {
                    self.set_mapped(p + i, 1, true);
                    if wake {
                        u.wake(dst, PG)?;
                    }
                    outcome = Installed::AlreadyMapped;
                    i += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(outcome)
    }

    /// Moves the mapped ones of `pages` out into their staging slots.
    fn move_out(&self, pages: &[u64]) -> io::Result<()> {
        let u = self.ram.uffd();
        mem::for_runs(pages, |p, n| {
            let mut i = 0;
            while i < n {
                if !self.is_mapped(p + i) {
                    i += 1;
                    continue;
                }
                let mut m = 1;
                while i + m < n && self.is_mapped(p + i + m) {
                    m += 1;
                }
                let src = self.ram.guest_page_addr(p + i);
                match u.move_some(self.ram.staging_page(p + i) as u64, src, m * PG, false) {
                    Ok(b) => {
                        self.set_mapped(p + i, b / PG, false);
                        i += b / PG;
                    }
                    // Not mapped after all.
                    Err(e) if errno(&e) == libc::ENOENT => {
                        self.set_mapped(p + i, 1, false);
                        i += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })
    }

    fn pool_addr(&self, pos: u64) -> u64 {
        self.ram.pool_page(pos % self.ram.pool_pages()) as u64
    }

    /// Producer: frames of staging slots `[p, p+n)` into the pool, the rest freed.
    fn give(&self, p: u64, n: u64) -> io::Result<()> {
        let cap = self.ram.pool_pages();
        let head = self.head.load(Ordering::Acquire);
        let mut tail = self.tail.load(Ordering::Relaxed);
        let mut i = 0;
        let mut result = Ok(());
        while i < n {
            let space = cap - (tail - head);
            if space == 0 {
                break;
            }
            let m = (n - i).min(space).min(cap - tail % cap);
            let src = self.ram.staging_page(p + i) as u64;
            match self
                .ram
                .uffd()
                .move_some(self.pool_addr(tail), src, m * PG, false)
            {
                Ok(b) => {
                    tail += b / PG;
                    i += b / PG;
                }
                // No frame in this slot (nothing landed there): nothing to give.
                Err(e) if errno(&e) == libc::ENOENT => i += 1,
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.tail.store(tail, Ordering::Release);
        if i < n {
            self.ram.drop_staging(p + i, n - i)?;
        }
        result
    }

    /// Consumer: pool frames into staging slots `[p, p+n)` while the pool has some.
    fn take(&self, p: u64, n: u64) {
        let cap = self.ram.pool_pages();
        let tail = self.tail.load(Ordering::Acquire);
        let mut head = self.head.load(Ordering::Relaxed);
        let mut i = 0;
        while i < n && head < tail {
            let m = (n - i).min(tail - head).min(cap - head % cap);
            let dst = self.ram.staging_page(p + i) as u64;
            match self
                .ram
                .uffd()
                .move_some(dst, self.pool_addr(head), m * PG, false)
            {
                Ok(b) => {
                    head += b / PG;
                    i += b / PG;
                }
                // The slot has a frame already (an earlier read's): reuse it.
                Err(e) if errno(&e) == libc::EEXIST => i += 1,
                Err(e) => {
                    tracing::error!("taking pool frames for guest pages {p:#x}+{n}: {e}");
                    break;
                }
            }
        }
        self.head.store(head, Ordering::Release);
    }
}
