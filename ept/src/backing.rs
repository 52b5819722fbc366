//! Where guest RAM's pages live: the two backings the installer runs on.
//!
//! - **memfd** (the default): one memfd mapped twice,
//!   the guest view (registered MISSING|MINOR) and the engine's alias; data lands in the memfd
//!   through the alias and is mapped with `UFFDIO_CONTINUE`; eviction zaps the guest view and
//!   punches the page out.
//! - **anon** (opt-in, Linux 6.8+; see [`GuestMemory`]'s default): private anonymous
//!   guest RAM (`sys::anon::AnonRam`): data lands in a free frame of the pool (or, with the
//!   pool empty, in the page's staging slot), `UFFDIO_MOVE` moves the frame into the guest view
//!   and, at eviction, straight back into a pool slot (or, in a round with write-backs or with
//!   the pool full, out to its staging slot and from there to the pool), so a page cycle
//!   allocates, zeroes and frees nothing (`docs/data-path.md`): two moves per cycle of a clean
//!   page, none of them on the fault handler.
//!
//! Where a page's data is, by its state (anon): an INFLIGHT page's in its *landing* frame (the
//! pool slot the fault handler assigned it, [`Backing::assign_frames`]; its staging slot if it
//! was assigned none); STAGED pages' in the bounce page they landed in (markers and probes
//! land in bounce pages while there are free ones, and keep them until their first touch
//! installs them by a copy: no TLB shootdown on the way in, none to settle) or else their
//! staging slot; EVICTING pages' in the pool slot the move-out put them in (their landing
//! frame from there), their bounce page or their staging slot; a LOCAL page's in the guest
//! view once its `mapped` bit is set, else (a victim given back, or between claim and map:
//! there, in the landing frame if it has one) in its bounce page or staging slot. A
//! reader of a pinned LOCAL page maps it first ([`Backing::local_ptr`]): only the evictor
//! moves a page out, and only after claiming it, which a pin prevents.
//!
//! The pool is a ring of pool slots with one producer (the evictor, [`Backing::free`]) and one
//! consumer (the fault handler's read batches): no lock, no allocation, no syscall for the
//! consumer, which only hands out positions. A slot handed out keeps its frame until the
//! page's install moves it into the guest view (or a read that ends otherwise gives it up),
//! and stays the read's until its landing is released: the producer moves frames only into
//! slots no read holds (`landing_busy`), and stops at one still held as at a full pool. The
//! kernel's own refusal (EEXIST) would not do: an install empties the slot before it releases
//! the landing, and a frame moved in meanwhile (an evicted page's) would be dropped or written
//! by the release, which takes it for the landing frame. The ring has [`LANDING_SLOTS`] more
//! slots than the free frames it may hold, so that the reads in flight, whose landing frames
//! sit in the slots just behind the free ones, seldom stop the producer. A read that finds no
//! pool frame lands in its empty staging slot, which the kernel fills with a zeroed page as
//! the memfd does; a freed frame that finds the pool full is freed.
//!
//! The evictor moves a round's victims straight into the pool's next slots (positions from
//! `fill`), which become free frames only once the round is freed: [`Backing::publish_pool`]
//! advances `tail` up to the first position of the oldest round not freed yet. A round that
//! turns out to need write-backs moves its victims on to their staging slots and gives the
//! positions back ([`Backing::unpool`]) before it waits, so that no round holds positions
//! while the frames freed after it queue behind them; and victims go to pool slots first only
//! after a few rounds in a row without write-backs (`evict.rs`, `CLEAN_ROUNDS_TO_POOL`).
//!
//! A victim the kernel refuses to move out (EBUSY: shared or pinned, e.g. after a fork
//! without `MADV_DONTFORK`) stays mapped and resident; after [`UNMOVABLE_AFTER`] refusals in a
//! row the page is kept resident ([`Backing::evictable`] says no) and counted, so eviction
//! carries on with other victims. It is tried again after [`RETRY_EPOCH_ROUNDS`] eviction
//! rounds, and after each further refusal twice as many (at most 2^[`MAX_RETRY_SHIFT`] times
//! that): a page that becomes movable later (its sharer gone, the page written again) is
//! evicted again, and one that stays pinned costs a refused move ever more rarely.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use serde::{Deserialize, Serialize};

use crate::movetrace::{Move, MoveTrace};
use crate::sys::anon::AnonRam;
use crate::sys::mem::{self, GuestRam};
use crate::sys::uffd::{self, Installed, Uffd};
use crate::PAGE_SIZE;

const PG: u64 = PAGE_SIZE as u64;

/// Refused move-outs in a row after which a page is kept resident (and retried later).
pub(crate) const UNMOVABLE_AFTER: u32 = 3;
/// Eviction rounds (move-outs) per retry epoch of pages kept resident.
const RETRY_EPOCH_ROUNDS: u64 = 16;
/// A page kept resident is tried again `1 << min(refusals - UNMOVABLE_AFTER, MAX_RETRY_SHIFT)`
/// epochs after its last refusal.
const MAX_RETRY_SHIFT: u32 = 10;
/// `Anon::refused`: the refusals in a row are the low 8 bits, the epoch of the last one the
/// rest (24 bits, wrapping).
const REFUSALS: u32 = 0xFF;

/// `Anon::landing` of a page that has no landing frame (its data lands in its staging slot).
const NO_SLOT: u32 = u32::MAX;
/// `Anon::landing` flag: the rest is a bounce page, not a pool slot.
const BOUNCE: u32 = 1 << 31;
/// Bounce pages: single-page reads in flight at once that land in one (the rest take pool
/// frames).
const BOUNCE_PAGES: u64 = 512;
/// Pool slots beyond the free frames the pool may hold: room for the landing frames handed out
/// and not installed yet (reads in flight), so that the producer's next slot is rarely still
/// one of them (address space only: a slot holds a frame only while it is free or landing).
const LANDING_SLOTS: u64 = 1024;

/// Which backing guest RAM uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GuestMemory {
    /// A memfd mapped twice; installs with UFFDIO_CONTINUE.
    Memfd,
    /// Private anonymous memory; pages move with UFFDIO_MOVE (Linux 6.8 or later).
    Anon,
}

/// The default: memfd. Anonymous guest RAM (`anon`, Linux 6.8+) takes 0.6-0.85x the CPU per
/// remote page (`docs/data-path.md`) but is opt-in: under load, in the pool cluster tests,
/// guest pages have come back zeroed with it and with no counter moving
/// (`docs/data-path-journal.md`, "Anonymous guest memory is opt-in"); memfd's data never moves,
/// and ran the same tests clean.
impl Default for GuestMemory {
    fn default() -> Self {
        Self::Memfd
    }
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
    mapped: AtomicBits,
    /// Per guest page: the pool slot its read lands in ([`NO_SLOT`]: its staging slot). Set by
    /// the fault handler for a page it owns (INFLIGHT), cleared when the frame leaves the slot.
    landing: Box<[AtomicU32]>,
    /// Per guest page: move-outs the kernel refused in a row (EBUSY; low 8 bits, saturating)
    /// and the retry epoch of the last refusal (the rest, see [`REFUSALS`]).
    refused: Box<[AtomicU32]>,
    /// Move-outs so far (eviction rounds): the clock of retries.
    rounds: AtomicU64,
    /// One bit per pool slot: handed to a read as its landing frame ([`Anon::assign`]) and
    /// not released yet. The producer moves no frame into such a slot, even once it is
    /// empty: between an install moving the landing frame out and the landing being released,
    /// a frame moved in would be taken for the landing frame (dropped, or written) by whoever
    /// releases it.
    landing_busy: AtomicBits,
    /// One bit per bounce page: free.
    bounce_free: Box<[AtomicU64]>,
    /// Where the fault handler last found a free bounce page.
    bounce_hint: AtomicUsize,
    /// Frames in pool slots `head..tail` (mod the pool size) are free.
    head: AtomicU64,
    tail: AtomicU64,
    /// The producer's fill position (`>= tail`): positions `tail..fill` hold frames of
    /// victims still being evicted (published by [`Backing::publish_pool`]) or freed ones
    /// waiting behind them.
    fill: AtomicU64,
    /// At most this many free frames are kept (`tail - head`); the pool has
    /// [`LANDING_SLOTS`] more slots than that.
    max_free: u64,
    /// Every page's recent moves, with `FARVM_ANON_TRACE=1` (`movetrace.rs`).
    trace: Option<Box<MoveTrace>>,
    /// A frame gone from the guest view was reported with the extent of the damage.
    vanish_reported: AtomicBool,
}

/// What a move-out of victims left behind: pages the kernel refused to move (still mapped),
/// how many of them just reached [`UNMOVABLE_AFTER`] refusals, and where in the pool the
/// moved ones went.
#[derive(Default)]
pub(crate) struct Refused {
    /// Victims still mapped.
    pub pages: Vec<u64>,
    /// Victims whose frame is nowhere the engine put it (anon: neither in the guest view nor
    /// in its landing place): their data is unknown.
    pub vanished: Vec<u64>,
    /// Of those, newly kept resident (see [`UNMOVABLE_AFTER`]).
    pub unmovable: u64,
    /// The first pool position the move-out filled (anon), if it moved victims straight into
    /// pool slots: positions from there on are not free until the round is freed and
    /// [`Backing::publish_pool`] is told so.
    pub pool_from: Option<u64>,
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

impl Backing {
    /// Guest RAM of `len` bytes, its guest view registered with a new uffd; `pool_pages` is
    /// how many free frames the anon pool keeps for reuse at most (its ring has
    /// [`LANDING_SLOTS`] more slots, for the frames of reads in flight).
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
                let max_free = pool_pages.max(1);
                let ram = AnonRam::new(len, max_free + LANDING_SLOTS, features)?
                    .with_bounce(BOUNCE_PAGES)?;
                if ram.pool_pages() >= u64::from(BOUNCE) {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "the anonymous memory's free pool must have fewer than 2^31 pages",
                    ));
                }
                let pages = ram.pages() as usize;
                Ok(Self::Anon(Anon {
                    mapped: AtomicBits::new(ram.pages()),
                    landing: (0..pages).map(|_| AtomicU32::new(NO_SLOT)).collect(),
                    refused: (0..pages).map(|_| AtomicU32::new(0)).collect(),
                    landing_busy: AtomicBits::new(ram.pool_pages()),
                    rounds: AtomicU64::new(0),
                    bounce_free: (0..BOUNCE_PAGES / 64).map(|_| AtomicU64::new(!0)).collect(),
                    bounce_hint: AtomicUsize::new(0),
                    ram,
                    head: AtomicU64::new(0),
                    tail: AtomicU64::new(0),
                    fill: AtomicU64::new(0),
                    max_free,
                    trace: MoveTrace::from_env(pages as u64).map(Box::new),
                    vanish_reported: AtomicBool::new(false),
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
    /// EVICTING after the zap): the alias page, or the landing frame or staging slot.
    #[inline]
    pub fn data_ptr(&self, p: u64) -> *mut u8 {
        match self {
            Self::Memfd { ram, .. } => ram.alias_page(p),
            Self::Anon(a) => a.data_ptr(p),
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
            // The landing frame or staging slot may hold a reused frame: clear all of it.
            // SAFETY: as above; the staging area's and pool's missing faults are the kernel's.
            Self::Anon(a) => unsafe { core::ptr::write_bytes(a.data_ptr(p), 0, PAGE_SIZE) },
        }
    }

    /// Takes the claimed victims `pages` (sorted) out of the guest view; `spans` (bridged runs
    /// covering them, see `spans.rs`) for the memfd zap; with `to_pool`, anon moves them
    /// straight into pool slots while the pool has room. Victims the kernel refused to move
    /// (anon) are left mapped and listed in `refused`.
    pub fn zap(
        &self,
        pages: &[u64],
        spans: &[(u64, u64)],
        to_pool: bool,
        refused: &mut Refused,
    ) -> io::Result<()> {
        refused.pages.clear();
        refused.vanished.clear();
        refused.unmovable = 0;
        refused.pool_from = None;
        match self {
            Self::Memfd { ram, .. } => ram.zap_guest_spans(spans),
            Self::Anon(a) => a.move_out(pages, to_pool, refused),
        }
    }

    /// Whether page `p` may be evicted: false once the kernel refused to move it out
    /// [`UNMOVABLE_AFTER`] times in a row (anon), until its retry epoch comes.
    #[inline]
    pub fn evictable(&self, p: u64) -> bool {
        match self {
            Self::Memfd { .. } => true,
            Self::Anon(a) => a.evictable(p),
        }
    }

    /// Takes the victims among `pages` (sorted) that the last move-out put into pool slots
    /// from position `from` out again, into their staging slots (one move per run), and gives
    /// the positions back: a round that must wait for write-backs holds no pool slot, which
    /// would keep the pool from publishing the frames freed after it.
    pub fn unpool(&self, pages: &[u64], from: u64) -> io::Result<()> {
        match self {
            Self::Anon(a) => a.unpool(pages, from),
            Self::Memfd { .. } => Ok(()),
        }
    }

    /// Publishes the pool's filled positions before `limit` (the first position of the oldest
    /// eviction round not freed yet, `u64::MAX` for none) as free frames (anon).
    pub fn publish_pool(&self, limit: u64) {
        if let Self::Anon(a) = self {
            let to = limit.min(a.fill.load(Ordering::Relaxed));
            if to > a.tail.load(Ordering::Relaxed) {
                a.tail.store(to, Ordering::Release);
            }
        }
    }

    /// Frees evicted `pages` (sorted; their data is no longer needed).
    pub fn free(&self, pages: &[u64], spans: &[(u64, u64)]) -> io::Result<()> {
        match self {
            Self::Memfd { ram, .. } => {
                ram.unmap_alias_spans(spans)?;
                ram.free(pages)
            }
            Self::Anon(a) => a.free(pages),
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

    /// Assigns the owned pages `pages` (sorted; about to be read) landing frames from the pool
    /// while it has some, neighbours consecutive slots: positions only, no syscall. A page that
    /// has a landing frame already (a read retried) keeps it. Only the fault handler calls
    /// this (the pool's one consumer). Pages for which `staged` is true (markers and probes,
    /// which stay unmapped until the guest touches them) and pages with no neighbour in the
    /// batch get bounce pages while there are free ones. Returns (pool frames, bounce pages)
    /// handed out.
    pub fn assign_frames(&self, pages: &[u64], staged: impl Fn(u64) -> bool) -> (u64, u64) {
        match self {
            Self::Anon(a) => a.assign(pages, staged),
            Self::Memfd { .. } => (0, 0),
        }
    }

    /// A read of owned page `p` ended without an install (the page goes back to REMOTE or is
    /// LOST): its landing frame, if it has one, is freed and the slot left empty for the pool.
    pub fn drop_landing(&self, p: u64) {
        if let Self::Anon(a) = self {
            a.drop_landing(p);
        }
    }

    /// Owned page `p`'s data stays unmapped for a while (a STAGED prefetch): moves it from its
    /// pool landing frame to its staging slot, so that the pool slot is not held (a bounce
    /// page stays the page's until its install or eviction).
    pub fn settle(&self, p: u64) {
        if let Self::Anon(a) = self {
            if let Err(e) = a.settle(p) {
                tracing::error!("moving guest page {p:#x} to its staging slot: {e}");
            }
        }
    }

    /// Pages whose data is resident (the frame counter's real counterpart, for checks at
    /// rest): memfd pages; anon, frames in the guest view and staging slots plus the bounce
    /// pages held (by staged pages, and reads in flight).
    pub fn resident_count(&self) -> io::Result<u64> {
        match self {
            Self::Memfd { ram, .. } => ram.resident_count(),
            Self::Anon(a) => Ok(a.ram.resident_count()? + a.bounce_held()),
        }
    }
}

/// One bit per page or slot, set, cleared and read by any thread (release / acquire).
struct AtomicBits(Box<[AtomicU64]>);

impl AtomicBits {
    /// `n` bits, all clear.
    fn new(n: u64) -> Self {
        Self((0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }

    fn get(&self, i: u64) -> bool {
        self.0[(i / 64) as usize].load(Ordering::Acquire) & (1 << (i % 64)) != 0
    }

    fn set(&self, i: u64, on: bool) {
        let (w, b) = (&self.0[(i / 64) as usize], 1u64 << (i % 64));
        if on {
            w.fetch_or(b, Ordering::AcqRel);
        } else {
            w.fetch_and(!b, Ordering::AcqRel);
        }
    }
}

/// Where an owned, unmapped page's data lands and waits for its install.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Land {
    /// Its staging slot.
    Staging,
    /// Pool slot `s` (installed by a move).
    Pool(u64),
    /// Bounce page `b` (installed by a copy).
    Bounce(u64),
}

impl Land {
    fn of(v: u32) -> Self {
        match v {
            NO_SLOT => Self::Staging,
            v if v & BOUNCE != 0 => Self::Bounce(u64::from(v & !BOUNCE)),
            s => Self::Pool(u64::from(s)),
        }
    }
}

impl Anon {
    #[inline]
    fn land(&self, p: u64) -> Land {
        Land::of(self.landing[p as usize].load(Ordering::Acquire))
    }

    #[inline]
    fn addr(&self, p: u64, l: Land) -> *mut u8 {
        match l {
            Land::Staging => self.ram.staging_page(p),
            Land::Pool(s) => self.ram.pool_page(s),
            Land::Bounce(b) => self.ram.bounce_page(b),
        }
    }

    #[inline]
    fn data_ptr(&self, p: u64) -> *mut u8 {
        self.addr(p, self.land(p))
    }

    /// Takes a free bounce page (any thread may give one back, only the fault handler takes).
    fn take_bounce(&self) -> Option<u64> {
        let n = self.bounce_free.len();
        let start = self.bounce_hint.load(Ordering::Relaxed);
        for k in 0..n {
            let w = (start + k) % n;
            let word = &self.bounce_free[w];
            let mut v = word.load(Ordering::Acquire);
            while v != 0 {
                let bit = v & v.wrapping_neg();
                match word.compare_exchange_weak(v, v & !bit, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        self.bounce_hint.store(w, Ordering::Relaxed);
                        return Some(w as u64 * 64 + u64::from(bit.trailing_zeros()));
                    }
                    Err(now) => v = now,
                }
            }
        }
        None
    }

    /// Bounce pages not in the free set.
    fn bounce_held(&self) -> u64 {
        let free: u32 = self
            .bounce_free
            .iter()
            .map(|w| w.load(Ordering::Acquire).count_ones())
            .sum();
        self.bounce_free.len() as u64 * 64 - u64::from(free)
    }

    fn give_bounce(&self, b: u64) {
        self.bounce_free[(b / 64) as usize].fetch_or(1 << (b % 64), Ordering::AcqRel);
    }

    /// Gives up page `p`'s landing place `seen` if it is still the page's (whoever clears it
    /// first owns it): a bounce page goes back to the free set; a pool slot's frame is freed
    /// with `drop` (leaving the slot empty for the pool).
    fn release_landing(&self, p: u64, seen: Land, drop: bool) -> io::Result<()> {
        let cur = self.landing[p as usize].load(Ordering::Acquire);
        if Land::of(cur) != seen
            || seen == Land::Staging
            || self.landing[p as usize]
                .compare_exchange(cur, NO_SLOT, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
        {
            return Ok(());
        }
        match seen {
            Land::Bounce(b) => self.give_bounce(b),
            Land::Pool(s) => {
                if drop {
                    self.ram.drop_pool(s, 1)?;
                }
                self.vacated(s)?;
                // The landing frame left the slot (or was dropped there): the producer may
                // fill it again. (On an error above it stays blocked: what it holds is
                // unknown.)
                self.landing_busy.set(s, false);
            }
            _ => {}
        }
        Ok(())
    }

    /// How many of the `n` pool slots from `s` (not wrapping) the producer may move frames
    /// into: those before the first one still a read's landing slot.
    fn producer_may_fill(&self, s: u64, n: u64) -> u64 {
        (0..n).find(|&i| self.landing_busy.get(s + i)).unwrap_or(n)
    }

    /// Pool slot `s` lost its frame. If its position is filled but not published yet
    /// (`[tail, fill)`: a victim of a round not freed yet, moved back into the guest view by
    /// a rescue), a zeroed frame takes its place: a published position must hold a frame.
    /// An empty one would be handed to a read as its landing frame while the producer, which
    /// fills only empty slots, could move another frame into it before the read's first byte
    /// arrived and publish it again, and two reads in flight would land in one frame (seen:
    /// a page installed with another page's data, no counter moving).
    fn vacated(&self, s: u64) -> io::Result<()> {
        let cap = self.ram.pool_pages();
        let tail = self.tail.load(Ordering::Acquire);
        let fill = self.fill.load(Ordering::Relaxed);
        let mut pos = tail - tail % cap + s;
        if pos < tail {
            pos += cap;
        }
        if pos < fill {
            self.ram.fill_pool(s, 1)?;
        }
        Ok(())
    }

    /// Consumer: gives the pages without a landing place one. A page alone in the batch (no
    /// neighbour) or to be staged gets a bounce page, installed later by a copy, which
    /// flushes no TLB (a staged page keeps it until then: moving it to its staging slot and
    /// later into the guest view would cost a shootdown each); runs get pool positions
    /// `head..` (consecutive for neighbours), installed by one move per run. Returns (pool
    /// frames, bounce pages) handed out.
    fn assign(&self, pages: &[u64], staged: impl Fn(u64) -> bool) -> (u64, u64) {
        let cap = self.ram.pool_pages();
        let tail = self.tail.load(Ordering::Acquire);
        let start = self.head.load(Ordering::Relaxed);
        let mut head = start;
        let mut bounced = 0;
        for (i, &p) in pages.iter().enumerate() {
            let l = &self.landing[p as usize];
            if l.load(Ordering::Relaxed) != NO_SLOT {
                continue;
            }
            let alone =
                (i == 0 || pages[i - 1] + 1 != p) && pages.get(i + 1).is_none_or(|&q| q != p + 1);
            if alone || staged(p) {
                if let Some(b) = self.take_bounce() {
                    l.store(BOUNCE | b as u32, Ordering::Release);
                    bounced += 1;
                    continue;
                }
            }
            if head < tail {
                // Busy before the page names it: from here until its release the producer
                // leaves the slot alone.
                self.landing_busy.set(head % cap, true);
                l.store((head % cap) as u32, Ordering::Release);
                head += 1;
                self.note(p, 1, Move::Assigned);
            }
        }
        self.head.store(head, Ordering::Release);
        (head - start, bounced)
    }

    fn drop_landing(&self, p: u64) {
        if let Err(e) = self.release_landing(p, self.land(p), true) {
            tracing::error!("freeing the landing frame of guest page {p:#x}: {e}");
        }
    }

    fn settle(&self, p: u64) -> io::Result<()> {
        let l = self.land(p);
        let src = match l {
            // A bounce page is the pool's no more than the page's own slot is: the page keeps
            // it until its install copies it (or its eviction frees it).
            Land::Staging | Land::Bounce(_) => return Ok(()),
            Land::Pool(s) => self.ram.pool_page(s) as u64,
        };
        let dst = self.ram.staging_page(p) as u64;
        let r = match self.ram.uffd().move_some(dst, src, PG, false) {
            // A stale frame in the staging slot (an earlier read that landed there): its data
            // is not the page's.
            Err(e) if errno(&e) == libc::EEXIST => {
                self.ram.drop_staging(p, 1)?;
                self.ram.uffd().move_some(dst, src, PG, false)
            }
            r => r,
        };
        match r {
            Ok(_) => self.note(p, 1, Move::ToStaging),
            // Nothing landed (the read wrote no byte): an empty slot reads as zeros either way.
            Err(e) if errno(&e) == libc::ENOENT => {}
            Err(e) => return Err(e),
        }
        self.release_landing(p, l, false)
    }

    /// The retry epoch now (24 bits, wrapping).
    fn epoch(&self) -> u32 {
        ((self.rounds.load(Ordering::Relaxed) / RETRY_EPOCH_ROUNDS) as u32) & (u32::MAX >> 8)
    }

    fn evictable(&self, p: u64) -> bool {
        let v = self.refused[p as usize].load(Ordering::Relaxed);
        let n = v & REFUSALS;
        if n < UNMOVABLE_AFTER {
            return true;
        }
        let wait = 1u32 << (n - UNMOVABLE_AFTER).min(MAX_RETRY_SHIFT);
        let since = self.epoch().wrapping_sub(v >> 8) & (u32::MAX >> 8);
        since >= wait
    }

    /// Counts a refused move-out of page `p`; true if it makes the page kept resident.
    fn refuse(&self, p: u64) -> bool {
        let r = &self.refused[p as usize];
        let n = ((r.load(Ordering::Relaxed) & REFUSALS) + 1).min(REFUSALS);
        r.store((self.epoch() << 8) | n, Ordering::Relaxed);
        n == UNMOVABLE_AFTER
    }

    fn is_mapped(&self, p: u64) -> bool {
        self.mapped.get(p)
    }

    fn set_mapped(&self, p: u64, n: u64, on: bool) {
        for q in p..p + n {
            self.mapped.set(q, on);
        }
    }

    /// Records `what` for pages `[p, p+n)` in the move trace, if one is kept.
    #[inline]
    fn note(&self, p: u64, n: u64, what: Move) {
        if let Some(t) = &self.trace {
            t.record(p, n, what);
        }
    }

    /// The first time a frame is found gone from the guest view: logs how far the damage
    /// goes (every page marked mapped whose guest view holds no frame, as runs), where the
    /// mappings lie (page-table boundaries fall every 2 MiB), and the process's mappings over
    /// the guest view (a view partly unmapped or split would show there).
    fn report_vanished_extent(&self) {
        if self.vanish_reported.swap(true, Ordering::Relaxed) {
            return;
        }
        let present = self.ram.guest_present();
        let mut runs = Vec::new();
        let mut missing = 0u64;
        let mut p = 0u64;
        while p < self.ram.pages() {
            if self.is_mapped(p) && !present[p as usize] {
                let start = p;
                while p < self.ram.pages() && self.is_mapped(p) && !present[p as usize] {
                    p += 1;
                }
                missing += p - start;
                runs.push(format!("{start:#x}+{}", p - start));
            } else {
                p += 1;
            }
        }
        let (lo, hi) = (
            self.ram.guest_base(),
            self.ram.guest_base() + self.ram.pages() * PG,
        );
        let maps: Vec<String> = std::fs::read_to_string("/proc/self/maps")
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                let mut r = l.split(['-', ' ']);
                let a = r.next().and_then(|a| u64::from_str_radix(a, 16).ok());
                let b = r.next().and_then(|b| u64::from_str_radix(b, 16).ok());
                matches!((a, b), (Some(a), Some(b)) if a < hi && b > lo)
            })
            .map(str::to_owned)
            .collect();
        tracing::error!(
            "guest frames gone: {missing} pages marked mapped have no frame in the guest view, \
             in {} runs (first ones: {}); {}; mappings over the guest view: {}",
            runs.len(),
            runs.iter().take(16).cloned().collect::<Vec<_>>().join(" "),
            self.ram.layout(),
            maps.join(" | ")
        );
    }

    /// Whether every move is checked against the page tables (`FARVM_ANON_TRACE=2`).
    fn checking(&self) -> bool {
        self.trace.as_ref().is_some_and(|t| t.checks)
    }

    /// Page `p`'s recent moves, for an error message ("" without a trace).
    fn history(&self, p: u64) -> String {
        match &self.trace {
            Some(t) => format!("; its moves: {}", t.history(p)),
            None => String::new(),
        }
    }

    /// With checks (`FARVM_ANON_TRACE=2`): after a move of the `m` mapped pages from `p` out
    /// of the guest view that returned `r`, checks that the pages it did not report moved are
    /// still there (the kernel moved no more than it said).
    fn check_left_behind(&self, p: u64, m: u64, r: &io::Result<u64>, what: &str) {
        if !self.checking() {
            return;
        }
        // ENOENT: the first page had no frame (checked by the caller); the rest should.
        let k = match r {
            Ok(b) => b / PG,
            Err(e) if errno(e) == libc::ENOENT => 1,
            Err(_) => 0,
        };
        if k >= m {
            return;
        }
        if let Some(i) = self
            .ram
            .first_absent(self.ram.guest_page_addr(p + k), m - k)
        {
            let q = p + k + i;
            tracing::error!(
                "{what} of guest pages {p:#x}+{m}: the kernel reported {k} moved ({r:?}), but \
                 page {q:#x} left the guest view too{}",
                self.history(q)
            );
        }
    }

    /// With checks: that the `k` pages from `q` just installed hold frames in the
    /// guest view, and logs any that does not.
    fn check_installed(&self, q: u64, k: u64) {
        if !self.checking() {
            return;
        }
        if let Some(i) = self.ram.first_absent(self.ram.guest_page_addr(q), k) {
            self.note(q + i, 1, Move::InButAbsent);
            tracing::error!(
                "installed guest pages {q:#x}+{k}, but page {:#x} has no frame in the guest \
                 view right after{}",
                q + i,
                self.history(q + i)
            );
        }
    }

    /// Puts the frames of `n` owned pages from `p` into the guest view: one move per run of
    /// pages whose frames lie next to each other (landing frames in consecutive pool slots,
    /// or staging slots), one copy per page landed in a bounce page.
    fn move_in(&self, p: u64, n: u64, wake: bool) -> io::Result<Installed> {
        let u = self.ram.uffd();
        let mut outcome = Installed::Done;
        let mut i = 0;
        while i < n {
            let q = p + i;
            let dst = self.ram.guest_page_addr(q);
            let l = self.land(q);
            let src = self.addr(q, l) as u64;
            let mut m = 1;
            if !matches!(l, Land::Bounce(_)) {
                while i + m < n && {
                    let l2 = self.land(q + m);
                    !matches!(l2, Land::Bounce(_)) && self.addr(q + m, l2) as u64 == src + m * PG
                } {
                    m += 1;
                }
            }
            let r = match l {
                Land::Bounce(_) => u.copy_page(dst, src, wake).map(|()| PG),
                _ => u.move_some(dst, src, m * PG, wake),
            };
            match r {
                Ok(b) => {
                    let k = b / PG;
                    self.set_mapped(q, k, true);
                    self.note(q, k, Move::In);
                    self.check_installed(q, k);
                    for r in q..q + k {
                        let lr = if r == q { l } else { self.land(r) };
                        self.release_landing(r, lr, false)?;
                    }
                    i += k;
                }
                // Mapped already by a racing fault or reader (which installed the frame).
                Err(e) if matches!(errno(&e), libc::EEXIST | libc::ENOENT) => {
                    if errno(&e) == libc::EEXIST {
                        self.note(q, 1, Move::InExists);
                    } else if self.ram.present(dst) {
                        self.note(q, 1, Move::InNoSource);
                    } else {
                        // Neither the guest view nor the landing place holds the page: its
                        // data is not where the engine thinks it is.
                        self.note(q, 1, Move::InNothing);
                        tracing::error!(
                            "installing guest page {q:#x}: no frame at its landing place \
                             {l:?} and none in the guest view{}",
                            self.history(q)
                        );
                    }
                    self.set_mapped(q, 1, true);
                    // A frame still in a pool slot is not the page's any more: freed, so
                    // that the pool can fill the slot again.
                    self.release_landing(q, l, errno(&e) == libc::EEXIST)?;
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

    /// Moves the mapped ones of `pages` out, one move per run: with `to_pool`, straight into
    /// the pool's next slots while it has room (the page's landing frame from here: freeing it
    /// then moves nothing), else into their staging slots; those the kernel refuses (EBUSY)
    /// stay mapped and go to `refused`.
    fn move_out(&self, pages: &[u64], to_pool: bool, refused: &mut Refused) -> io::Result<()> {
        let u = self.ram.uffd();
        self.rounds.fetch_add(1, Ordering::Relaxed);
        let cap = self.ram.pool_pages();
        let head = self.head.load(Ordering::Acquire);
        let start = self.fill.load(Ordering::Relaxed);
        let mut fill = start;
        let mut pool_ok = to_pool;
        let r = mem::for_runs(pages, |p, n| {
            let mut i = 0;
            let mut stale_dropped = u64::MAX;
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
                let room = self.max_free.saturating_sub(fill - head);
                let fillable = if pool_ok && room > 0 {
                    self.producer_may_fill(fill % cap, m.min(room).min(cap - fill % cap))
                } else {
                    0
                };
                if pool_ok && fillable == 0 && room > 0 {
                    // The next slot is still a read's landing slot: as a full pool.
                    pool_ok = false;
                }
                let to_pool = fillable > 0;
                let dst = if to_pool {
                    m = fillable;
                    self.pool_addr(fill)
                } else {
                    self.ram.staging_page(p + i) as u64
                };
                if self.checking() {
                    if let Some(j) = self.ram.first_absent(src, m) {
                        tracing::error!(
                            "eviction of guest pages {:#x}+{m}: page {:#x}, marked mapped, has \
                             no frame in the guest view before the move{}",
                            p + i,
                            p + i + j,
                            self.history(p + i + j)
                        );
                    }
                }
                let moved = u.move_some(dst, src, m * PG, false);
                self.check_left_behind(p + i, m, &moved, "eviction");
                match moved {
                    Ok(b) => {
                        let k = b / PG;
                        self.set_mapped(p + i, k, false);
                        self.note(
                            p + i,
                            k,
                            if to_pool {
                                Move::OutPool
                            } else {
                                Move::OutStaging
                            },
                        );
                        if to_pool {
                            for j in 0..k {
                                let slot = ((fill + j) % cap) as u32;
                                self.landing[(p + i + j) as usize].store(slot, Ordering::Release);
                            }
                            fill += k;
                        }
                        for q in p + i..p + i + k {
                            let r = &self.refused[q as usize];
                            if r.load(Ordering::Relaxed) != 0 {
                                r.store(0, Ordering::Relaxed);
                            }
                        }
                        i += k;
                    }
                    // Not mapped after all.
                    Err(e) if errno(&e) == libc::ENOENT => {
                        let l = self.land(p + i);
                        self.note(p + i, 1, Move::OutNothing);
                        if !self.ram.present(self.addr(p + i, l) as u64) {
                            tracing::error!(
                                "evicting guest page {:#x}: marked mapped, but neither the guest \
                                 view nor its landing place {l:?} holds a frame{}",
                                p + i,
                                self.history(p + i)
                            );
                            refused.vanished.push(p + i);
                            self.report_vanished_extent();
                        }
                        self.set_mapped(p + i, 1, false);
                        i += 1;
                    }
                    // The pool slot is still a read's landing frame: the rest of the round
                    // goes to staging slots.
                    Err(e) if to_pool && errno(&e) == libc::EEXIST => pool_ok = false,
                    // A stale frame in the staging slot (a read that landed there before a
                    // retry took a pool frame): not the page's data. Freed, then once more.
                    Err(e) if errno(&e) == libc::EEXIST && stale_dropped != p + i => {
                        self.ram.drop_staging(p + i, 1)?;
                        stale_dropped = p + i;
                    }
                    // Shared or pinned: it stays mapped (and resident); the others go on.
                    Err(e) if errno(&e) == libc::EBUSY => {
                        self.note(p + i, 1, Move::OutBusy);
                        if self.refuse(p + i) {
                            refused.unmovable += 1;
                        }
                        refused.pages.push(p + i);
                        i += 1;
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        });
        self.fill.store(fill, Ordering::Relaxed);
        if fill > start {
            refused.pool_from = Some(start);
        }
        r
    }

    fn unpool(&self, pages: &[u64], from: u64) -> io::Result<()> {
        let u = self.ram.uffd();
        let mut i = 0;
        while i < pages.len() {
            let p = pages[i];
            let Land::Pool(s) = self.land(p) else {
                i += 1;
                continue;
            };
            let src = self.ram.pool_page(s) as u64;
            let mut m = 1;
            while i + m < pages.len()
                && pages[i + m] == p + m as u64
                && self.land(p + m as u64) == Land::Pool(s + m as u64)
            {
                m += 1;
            }
            let dst = self.ram.staging_page(p) as u64;
            let moved = match u.move_some(dst, src, m as u64 * PG, false) {
                Ok(b) => (b / PG) as usize,
                // A stale frame in the staging slot: not the page's data. Freed, once more.
                Err(e) if errno(&e) == libc::EEXIST => {
                    self.ram.drop_staging(p, m as u64)?;
                    (u.move_some(dst, src, m as u64 * PG, false)? / PG) as usize
                }
                Err(e) => return Err(e),
            };
            for q in p..p + moved as u64 {
                self.landing[q as usize].store(NO_SLOT, Ordering::Release);
            }
            self.note(p, moved as u64, Move::ToStaging);
            i += moved.max(1);
        }
        self.fill.store(from, Ordering::Relaxed);
        Ok(())
    }

    fn pool_addr(&self, pos: u64) -> u64 {
        self.ram.pool_page(pos % self.ram.pool_pages()) as u64
    }

    /// Frees evicted `pages` (sorted): frames the move-out put in pool slots stay there (free
    /// once published), bounce pages (staged pages never touched) go back to the free set,
    /// the others go into the pool while it has room, the rest dropped with one vectored call
    /// per 64 runs (one TLB flush, not one per run).
    fn free(&self, pages: &[u64]) -> io::Result<()> {
        let mut rest = [(0u64, 0u64); 64];
        let mut k = 0;
        // Only the staging slots' frames move; the rest is bookkeeping.
        let in_slot = |p: u64| self.land(p) == Land::Staging;
        mem::for_runs(pages, |first, len| {
            self.note(first, len, Move::Freed);
            let mut i = 0;
            while i < len {
                let staging = in_slot(first + i);
                let mut m = 1;
                while i + m < len && in_slot(first + i + m) == staging {
                    m += 1;
                }
                let (p, n) = (first + i, m);
                i += m;
                if !staging {
                    for q in p..p + n {
                        let l = self.land(q);
                        self.landing[q as usize].store(NO_SLOT, Ordering::Release);
                        // The page no longer names it before another read may take it.
                        match l {
                            Land::Bounce(b) => self.give_bounce(b),
                            // Still a read's landing slot (a page installed no further than
                            // its claim): not a producer position, so nobody would ever empty
                            // it. Dropped, and the slot handed back to the producer.
                            Land::Pool(s) if self.landing_busy.get(s) => {
                                self.ram.drop_pool(s, 1)?;
                                self.landing_busy.set(s, false);
                            }
                            _ => {}
                        }
                    }
                    continue;
                }
                let given = self.give(p, n);
                if given < n {
                    rest[k] = (p + given, n - given);
                    k += 1;
                    if k == rest.len() {
                        self.ram.drop_staging_runs(&rest)?;
                        k = 0;
                    }
                }
            }
            Ok(())
        })?;
        if k > 0 {
            self.ram.drop_staging_runs(&rest[..k])?;
        }
        Ok(())
    }

    /// Producer: frames of staging slots `[p, p+n)` into the pool while it has room (fewer
    /// than `max_free` free frames). Returns how many of the slots it dealt with (from `p`);
    /// the caller frees the rest.
    fn give(&self, p: u64, n: u64) -> u64 {
        let cap = self.ram.pool_pages();
        let head = self.head.load(Ordering::Acquire);
        let mut fill = self.fill.load(Ordering::Relaxed);
        let mut i = 0;
        while i < n {
            let space = self.max_free.saturating_sub(fill - head);
            if space == 0 {
                break;
            }
            let m = self.producer_may_fill(fill % cap, (n - i).min(space).min(cap - fill % cap));
            if m == 0 {
                // The next slot is still a read's landing slot: the pool is full up to it.
                break;
            }
            let src = self.ram.staging_page(p + i) as u64;
            match self
                .ram
                .uffd()
                .move_some(self.pool_addr(fill), src, m * PG, false)
            {
                Ok(b) => {
                    fill += b / PG;
                    i += b / PG;
                }
                // No frame in this slot (nothing landed there): nothing to give.
                Err(e) if errno(&e) == libc::ENOENT => i += 1,
                // The pool slot is still a read's landing frame: the pool is full up to it.
                Err(e) if errno(&e) == libc::EEXIST => break,
                Err(e) => {
                    // The pages' data is not needed any more: the rest is freed instead.
                    tracing::warn!("moving freed guest pages {p:#x}+{n} to the pool: {e}");
                    break;
                }
            }
        }
        self.fill.store(fill, Ordering::Relaxed);
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anon(pages: u64) -> Backing {
        Backing::new(pages as usize * PAGE_SIZE, GuestMemory::Anon, 4)
            .expect("anonymous guest RAM with UFFDIO_MOVE (Linux 6.8 or later)")
    }

    /// Zaps `p` alone; returns (refused, newly kept resident).
    fn zap_one(b: &Backing, p: u64, refused: &mut Refused) -> (bool, u64) {
        b.zap(&[p], &[(p, 1)], false, refused).expect("zap");
        (refused.pages == [p], refused.unmovable)
    }

    /// Eviction rounds that touch nothing, until `epochs` retry epochs have passed.
    fn pass_epochs(b: &Backing, epochs: u64, refused: &mut Refused) {
        for _ in 0..epochs * RETRY_EPOCH_ROUNDS {
            b.zap(&[], &[], false, refused).expect("empty zap");
        }
    }

    #[test]
    fn a_page_kept_resident_after_refusals_is_retried_and_evicted_once_movable() {
        let b = anon(8);
        let p = 3;
        // SAFETY: page 3 has no landing frame: its data pointer is its staging slot, whose
        // missing fault is the kernel's; nobody else uses this RAM.
        unsafe { core::ptr::write_volatile(b.data_ptr(p) as *mut u64, 0x5eed) };
        b.map(p, 1, false).expect("map page 3");
        let Backing::Anon(a) = &b else { unreachable!() };
        let guest = a.ram.guest_page_addr(p) as *mut u64;
        // Share the guest view's pages with a child (as a fork without MADV_DONTFORK does):
        // they are no longer exclusive to this process, which UFFDIO_MOVE refuses (EBUSY)
        // until the page is written again, even after the child is gone.
        // SAFETY: advisory call on the guest view, which `b` owns.
        let r = unsafe {
            libc::madvise(
                a.ram.guest_base() as *mut libc::c_void,
                a.ram.len(),
                libc::MADV_DOFORK,
            )
        };
        assert_eq!(r, 0, "madvise DOFORK");
        crate::sys::anon::fork_a_child_that_exits();

        let mut refused = Refused::default();
        for k in 1..=UNMOVABLE_AFTER {
            assert!(
                b.evictable(p),
                "refusal {k} of {UNMOVABLE_AFTER}: still evictable"
            );
            let kept = u64::from(k == UNMOVABLE_AFTER);
            assert_eq!(zap_one(&b, p, &mut refused), (true, kept), "refusal {k}");
        }
        assert!(
            !b.evictable(p),
            "kept resident after {UNMOVABLE_AFTER} refusals"
        );
        pass_epochs(&b, 1, &mut refused);
        assert!(b.evictable(p), "eligible again after one retry epoch");
        // Still shared: refused again, kept again (not counted anew), and now it waits twice
        // as long.
        assert_eq!(zap_one(&b, p, &mut refused), (true, 0), "first retry");
        pass_epochs(&b, 1, &mut refused);
        assert!(!b.evictable(p), "the second retry waits two epochs");
        pass_epochs(&b, 1, &mut refused);
        assert!(b.evictable(p), "eligible after two epochs");
        // The guest writes the page: exclusive again, so it moves out, data and all.
        // SAFETY: page 3 is mapped in the guest view; this is the guest writing it.
        unsafe { core::ptr::write_volatile(guest, 0xbeef) };
        assert_eq!(
            zap_one(&b, p, &mut refused),
            (false, 0),
            "moved out once movable"
        );
        // SAFETY: page 3's frame is in its staging slot now (EVICTING: the caller owns it).
        let moved = unsafe { core::ptr::read_volatile(b.data_ptr(p) as *const u64) };
        assert_eq!(moved, 0xbeef);
        assert!(b.evictable(p), "a page that moved starts over");
        assert_eq!(a.refused[p as usize].load(Ordering::Relaxed) & REFUSALS, 0);
    }

    /// Writes `v` into the first word of owned, unmapped page `p`'s data.
    fn put(b: &Backing, p: u64, v: u64) {
        // SAFETY: `p` is in range and unmapped; its data (staging slot or landing frame) is
        // this RAM's, whose missing faults are the kernel's; nobody else uses this RAM.
        unsafe { core::ptr::write_volatile(b.data_ptr(p) as *mut u64, v) };
    }

    fn get(b: &Backing, p: u64) -> u64 {
        // SAFETY: as in `put`.
        unsafe { core::ptr::read_volatile(b.data_ptr(p) as *const u64) }
    }

    #[test]
    fn the_pool_keeps_its_free_frames_and_reads_in_flight_do_not_stop_it() {
        let b = anon(64);
        let Backing::Anon(a) = &b else { unreachable!() };
        let free = |a: &Anon| a.tail.load(Ordering::Relaxed) - a.head.load(Ordering::Relaxed);
        for p in 0..8 {
            put(&b, p, 100 + p);
        }
        // Evicted pages 0..6: four frames kept (the pool's free frames), two freed.
        b.free(&[0, 1, 2, 3, 4, 5], &[]).expect("free");
        b.publish_pool(u64::MAX);
        assert_eq!(free(a), 4, "at most 4 free frames");
        // Two reads in flight take the two oldest free frames and land there.
        assert_eq!(b.assign_frames(&[20, 21], |_| false), (2, 0));
        put(&b, 20, 20);
        put(&b, 21, 21);
        // Further evictions refill the pool behind them, in slots of their own: the frames
        // of the reads in flight (not installed yet) stay theirs.
        b.free(&[6, 7], &[]).expect("free");
        b.publish_pool(u64::MAX);
        assert_eq!(free(a), 4, "refilled up to 4 free frames");
        assert_eq!((get(&b, 20), get(&b, 21)), (20, 21), "landed data intact");
        // The next reads get the refilled frames (reused: they hold the evicted data until
        // overwritten), none of which is a frame of the reads in flight.
        assert_eq!(b.assign_frames(&[30, 31, 32, 33], |_| false), (4, 0));
        let reused: Vec<u64> = (30..34).map(|p| get(&b, p)).collect();
        assert_eq!(reused, [102, 103, 106, 107]);
        // Installing the first reads frees their slots for the pool's later turns.
        b.map(20, 2, false).expect("install 20..22");
        assert_eq!(
            b.assign_frames(&[40, 41], |_| false),
            (0, 0),
            "no free frame left"
        );
    }

    /// A clean eviction round (`to_pool`) of pages 0..6, each mapped with `100 + p` first:
    /// victims 0..4 go straight into pool slots 0..4. Returns what the move-out reported.
    fn clean_round_of_six(b: &Backing) -> Refused {
        for p in 0..6 {
            put(b, p, 100 + p);
            b.map(p, 1, false).expect("map");
        }
        let mut refused = Refused::default();
        b.zap(&[0, 1, 2, 3, 4, 5], &[], true, &mut refused)
            .expect("zap");
        refused
    }

    #[test]
    fn victims_move_straight_into_pool_slots_and_become_free_frames_when_published() {
        let b = anon(64);
        let refused = clean_round_of_six(&b);
        assert!(refused.pages.is_empty());
        assert_eq!(
            refused.pool_from,
            Some(0),
            "the round's first pool position"
        );
        // Four victims fit the pool (its free frames at most), the rest went to staging; the
        // data is where the evictor fingerprints and writes back from.
        let lands: Vec<bool> = (0..6)
            .map(|p| {
                let Backing::Anon(a) = &b else { unreachable!() };
                matches!(a.land(p), Land::Pool(_))
            })
            .collect();
        assert_eq!(lands, [true, true, true, true, false, false]);
        assert_eq!(
            (0..6).map(|p| get(&b, p)).collect::<Vec<_>>(),
            (100..106).collect::<Vec<_>>()
        );
        // Not free before the round is freed and published.
        b.publish_pool(0);
        assert_eq!(b.assign_frames(&[20, 21], |_| false), (0, 0));
        // A victim given back leaves its pool slot for its staging slot, data and all.
        b.settle(2);
        assert_eq!(get(&b, 2), 102);
        b.free(&[0, 1, 3, 4, 5], &[]).expect("free");
        b.publish_pool(u64::MAX);
        // The freed victims' frames are the next reads' landing frames, in place (no move);
        // the slot given back is empty (a read landing there gets a zeroed page).
        assert_eq!(b.assign_frames(&[20, 21, 22, 23], |_| false), (4, 0));
        let landed: Vec<u64> = (20..24).map(|p| get(&b, p)).collect();
        assert_eq!(landed, [100, 101, 0, 103]);
    }

    #[test]
    fn a_staged_page_keeps_its_bounce_page_until_its_install_or_its_eviction() {
        let b = anon(64);
        let Backing::Anon(a) = &b else { unreachable!() };
        // A batch whose page 12 will be staged (a marker): it lands in a bounce page although
        // it has neighbours (the empty pool gives them none).
        assert_eq!(b.assign_frames(&[10, 11, 12, 13], |p| p == 12), (0, 1));
        assert!(matches!(a.land(12), Land::Bounce(_)));
        put(&b, 12, 12);
        b.settle(12);
        assert!(
            matches!(a.land(12), Land::Bounce(_)),
            "staged, it keeps the bounce page"
        );
        assert_eq!(a.bounce_held(), 1);
        // Its touch installs it by a copy, and the bounce page is free again.
        b.map(12, 1, false).expect("install 12");
        assert_eq!(a.land(12), Land::Staging);
        assert_eq!(a.bounce_held(), 0);
        let guest = (a.ram.guest_base() + 12 * PG) as *const u64;
        // SAFETY: page 12 is mapped in the guest view now; nobody else uses this RAM.
        assert_eq!(unsafe { core::ptr::read_volatile(guest) }, 12);
        // A staged page evicted untouched gives its bounce page back, leaving nothing behind.
        assert_eq!(b.assign_frames(&[20], |_| true), (0, 1));
        put(&b, 20, 20);
        b.settle(20);
        let resident = b.resident_count().expect("resident count");
        b.free(&[20], &[]).expect("free");
        assert_eq!(a.bounce_held(), 0);
        assert_eq!(a.land(20), Land::Staging);
        assert_eq!(b.resident_count().expect("resident count"), resident - 1);
    }

    #[test]
    fn a_round_with_write_backs_gives_its_pool_slots_back() {
        let b = anon(64);
        let Backing::Anon(a) = &b else { unreachable!() };
        for p in 8..12 {
            put(&b, p, p);
            b.map(p, 1, false).expect("map");
        }
        let mut refused = Refused::default();
        b.zap(&[8, 9, 10, 11], &[], true, &mut refused)
            .expect("zap");
        let from = refused.pool_from.expect("moved into pool slots");
        b.unpool(&[8, 9, 10, 11], from).expect("unpool");
        // Data in the staging slots (write-back reads it there), the positions given back.
        assert!((8..12).all(|p| a.land(p) == Land::Staging));
        assert_eq!(
            (8..12).map(|p| get(&b, p)).collect::<Vec<_>>(),
            [8, 9, 10, 11]
        );
        assert_eq!(a.fill.load(Ordering::Relaxed), from);
        // Freed after its write-backs, the round fills the pool as before.
        b.free(&[8, 9, 10, 11], &[]).expect("free");
        b.publish_pool(u64::MAX);
        assert_eq!(b.assign_frames(&[20, 21, 22, 23], |_| false), (4, 0));
        assert_eq!(
            (20..24).map(|p| get(&b, p)).collect::<Vec<_>>(),
            [8, 9, 10, 11]
        );
    }

    /// Pages 100 and 101, given their landing places already: their data lands, they are
    /// installed as a run, evicted (into pool slots with `to_pool`) and freed, and the pool's
    /// positions published: one turn of two frames through the ring.
    fn land_install_evict_100_101(b: &Backing, to_pool: bool, refused: &mut Refused) {
        put(b, 100, 0xAAAA);
        put(b, 101, 0xBBBB);
        b.map(100, 2, false).expect("install 100, 101");
        b.zap(&[100, 101], &[], to_pool, refused)
            .expect("evict 100, 101");
        b.free(&[100, 101], &[]).expect("free 100, 101");
        b.publish_pool(u64::MAX);
    }

    /// A victim rescued from a round that moved it straight into a pool slot used to leave that
    /// slot empty, published as a free frame. A read handed it had nothing there until its
    /// first byte arrived, so the producer (which stops only at an occupied slot, EEXIST)
    /// could lap the ring and move another freed frame into it, publish it again and hand it
    /// to a second read: two reads in flight in one frame, the first one's data overwritten
    /// after it landed (after its fingerprint check, if the completion ran in between).
    #[test]
    fn a_slot_emptied_by_a_rescue_is_never_shared_by_two_reads() {
        let b = anon(256);
        let Backing::Anon(a) = &b else { unreachable!() };
        let cap = a.ram.pool_pages();
        // A clean round (to_pool) moves victims 0..6 out: 0..4 into pool slots 0..4.
        let mut refused = clean_round_of_six(&b);
        assert_eq!(refused.pool_from, Some(0));
        // A fault arrived meanwhile on victim 1: finish_round rescues it (publish_local ->
        // move_in from its pool slot). Slot 1 is empty now.
        b.map(1, 1, false).expect("rescue 1");
        // The others are freed (frames stay in slots 0, 2, 3) and the round's positions are
        // published at the top of the evictor's next loop: slot 1 among them, empty.
        b.free(&[0, 2, 3, 4, 5], &[]).expect("free");
        b.publish_pool(u64::MAX);
        // The fault handler's next batch takes positions 0..4; page 21 lands in slot 1.
        assert_eq!(b.assign_frames(&[20, 21, 22, 23], |_| false), (4, 0));
        assert_eq!(a.land(21), Land::Pool(1));
        // 20, 22, 23 arrive and are installed; 21's response has not arrived yet.
        for p in [20, 22, 23] {
            put(&b, p, p);
        }
        b.map(20, 1, false).expect("install 20");
        b.map(22, 2, false).expect("install 22, 23");
        // The scan goes on: pages 100, 101 cycle (read into pool frames, installed, evicted
        // through their staging slots, freed into the pool), for four times around the ring.
        // The slot of 21's read holds a frame (the rescue's hole was filled), so the producer
        // stops there and no other read is handed it.
        for _ in 0..4 * cap {
            b.assign_frames(&[100, 101], |_| false);
            for q in [100, 101] {
                assert_ne!(
                    a.land(q),
                    Land::Pool(1),
                    "page 21's landing slot handed out again"
                );
            }
            land_install_evict_100_101(&b, false, &mut refused);
        }
        assert!(
            a.fill.load(Ordering::Relaxed) <= cap + 1,
            "the producer lapped the slot page 21's read holds"
        );
        // 21's response lands, intact, and is installed.
        put(&b, 21, 0x2121);
        assert_eq!(get(&b, 21), 0x2121);
        b.map(21, 1, false).expect("install 21");
    }

    /// An install moves a landing frame out of its pool slot before it releases the landing
    /// (`move_in`: the move, then `release_landing`). A slot empty but not released yet used
    /// to look free to the producer, which fills empty slots: a frame moved in there (an
    /// evicted page's data) was then taken for the landing frame by the release, dropped
    /// (a race lost to another installer of the same page) or written (`vacated`), and the
    /// slot could be handed to a second read while the first still named it: one page's
    /// data installed in another, or an evicted page's frame dropped (it then reads back as
    /// zeros), no counter moving. It takes a read in flight while the ring turns (a loaded
    /// host, a slow or failing server).
    #[test]
    fn a_landing_slot_emptied_by_an_install_stays_the_reads_until_released() {
        let b = anon(256);
        let Backing::Anon(a) = &b else { unreachable!() };
        let cap = a.ram.pool_pages();
        for p in 0..8 {
            put(&b, p, 100 + p);
        }
        b.free(&[0, 1, 2, 3, 4, 5], &[]).expect("free");
        b.publish_pool(u64::MAX);
        assert_eq!(b.assign_frames(&[20, 21], |_| false), (2, 0));
        let Land::Pool(slot) = a.land(21) else {
            panic!("page 21 lands in a pool slot: {:?}", a.land(21))
        };
        put(&b, 21, 0x2121);
        // The install's move, on a thread that is then preempted before it releases the
        // landing: the slot is empty and page 21 still names it.
        a.ram
            .uffd()
            .move_some(
                a.ram.guest_page_addr(21),
                a.ram.pool_page(slot) as u64,
                PG,
                false,
            )
            .expect("move 21 in");
        b.map(20, 1, false).expect("install 20");
        let mut refused = Refused::default();
        // Meanwhile the ring turns four times: pages 100, 101 cycle through pool frames.
        for _ in 0..4 * cap {
            b.assign_frames(&[100, 101], |_| false);
            for q in [100, 101] {
                assert_ne!(
                    a.land(q),
                    Land::Pool(slot),
                    "page 21's landing slot handed to another read before its release"
                );
            }
            land_install_evict_100_101(&b, true, &mut refused);
        }
        // The release: nothing else was in the slot for it to take.
        a.release_landing(21, Land::Pool(slot), true)
            .expect("release 21's landing");
        a.set_mapped(21, 1, true);
        let guest = a.ram.guest_page_addr(21) as *const u64;
        // SAFETY: page 21 is mapped in the guest view; nobody else uses this RAM.
        assert_eq!(unsafe { core::ptr::read_volatile(guest) }, 0x2121);
        // And the slot is the pool's again: the producer fills it on its next turn.
        for _ in 0..2 * cap {
            b.assign_frames(&[100, 101], |_| false);
            land_install_evict_100_101(&b, true, &mut refused);
        }
        assert!(
            a.fill.load(Ordering::Relaxed) > cap + slot,
            "the producer went past the released slot"
        );
    }

    #[test]
    fn a_retried_page_waits_at_most_the_longest_back_off() {
        let b = anon(4);
        let Backing::Anon(a) = &b else { unreachable!() };
        let p = 1;
        // As after many refusals: the count saturates and the wait stops doubling.
        for _ in 0..300 {
            a.refuse(p);
        }
        assert_eq!(
            a.refused[p as usize].load(Ordering::Relaxed) & REFUSALS,
            REFUSALS
        );
        let mut refused = Refused::default();
        pass_epochs(&b, (1 << MAX_RETRY_SHIFT) - 1, &mut refused);
        assert!(!b.evictable(p));
        pass_epochs(&b, 1, &mut refused);
        assert!(
            b.evictable(p),
            "retried after 2^{MAX_RETRY_SHIFT} epochs at most"
        );
    }
}
