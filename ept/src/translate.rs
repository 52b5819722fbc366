//! The seam between guest-physical pages (what faults and installs are about) and the page
//! numbers — and the history — the prefetcher learns from.
//!
//! - [`Identity`]: guest-physical page numbers on both sides, one history per process key.
//! - [`VirtualPages`]: guest-*virtual* page numbers of the faulting process, found by walking
//!   its page tables from the CR3 its vCPU's agent slot published. Leap and HOPP learn over
//!   virtual pages: a process scanning its heap sequentially touches frames the guest kernel
//!   may have handed out in any physical order, and only the virtual order is a pattern.
//!
//! A fault gives a guest-physical page; its virtual page comes from a reverse map built by
//! walks of the process's user page tables, walked again when a fault misses it (new mappings), at
//! most once per [`REWALK_MIN`]. Candidates go the other way by a forward walk of the same
//! tables, with the last leaf table remembered (a window of candidates shares it). Pages the
//! walk cannot place — kernel pages, page-table pages, a walk not allowed yet — keep their
//! guest-physical number, tagged with [`PHYSICAL_TAG`] so that they never alias a virtual one,
//! and go to the [`GLOBAL_KEY`] history, not the process's: a process's history holds its own
//! user pages only, whatever its kernel did on its behalf. Faults no process is known for (no
//! guest agent, a thread that is not a vCPU) are in that global history too: without an agent a
//! guest has one guest-physical history.
//! Guest memory is read only through [`GuestPages`], which never touches a page that is not
//! resident: a walk that meets one skips that part of the tree. A stale map can only cost
//! prefetch accuracy, never correctness: every install is by guest-physical page.
//!
//! What the page tables look like is [`GuestPaging`]: 4-level, or 5-level when the guest runs
//! with CR4.LA57; 2 MiB and 1 GiB pages; and how a published CR3 value names a process (PCID
//! and no-flush bits, Linux's page-table-isolation pairs of PGDs).

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use farvm_prefetch::{PageNo, ProcessKey};
use rustc_hash::FxHashMap;

/// Reads of guest-physical memory for page-table walks.
pub trait GuestPages {
    /// The 8-byte-aligned u64 at guest-physical `gpa`, if its page is resident now (it is
    /// pinned for the read and never fetched).
    fn read_u64(&self, gpa: u64) -> Option<u64>;
    /// Copies guest page `gpn` into `out` if it is resident now; false otherwise.
    fn copy_page(&self, gpn: u64, out: &mut [u64; 512]) -> bool;
}

/// Translates between guest pages and the page numbers the prefetcher learns from.
pub trait PageSpace: Send {
    /// The process key a CR3 value published by the guest names (0: no process). By default
    /// the page-table root's address: CR3's low 12 bits (flags or PCID) and bit 63 (no-flush)
    /// are not part of it.
    fn process_key(&self, cr3: u64) -> ProcessKey {
        cr3 & ADDR
    }
    /// The history (process key) and prefetcher page number for guest page `gpn` faulted by
    /// process `key`.
    fn to_prefetch(
        &mut self,
        mem: &dyn GuestPages,
        key: ProcessKey,
        gpn: u64,
    ) -> (ProcessKey, PageNo);
    /// The guest page a candidate of history `key` refers to, if it maps to one.
    fn to_guest(&mut self, mem: &dyn GuestPages, key: ProcessKey, page: PageNo) -> Option<u64>;
    /// What the translation did so far (all zero for a space that does nothing).
    fn counts(&self) -> WalkCounts {
        WalkCounts::default()
    }
}

/// Guest-physical page numbers on both sides.
pub struct Identity;

impl PageSpace for Identity {
    fn to_prefetch(
        &mut self,
        _mem: &dyn GuestPages,
        key: ProcessKey,
        gpn: u64,
    ) -> (ProcessKey, PageNo) {
        (key, gpn)
    }
    fn to_guest(&mut self, _mem: &dyn GuestPages, _key: ProcessKey, page: PageNo) -> Option<u64> {
        Some(page)
    }
}

/// Marks a prefetcher page number that is a guest-physical page (see the module docs). Above
/// every 4-level (48-bit) or 5-level (57-bit) virtual page number.
pub const PHYSICAL_TAG: u64 = 1 << 62;
/// The history of faults that are no process's user pages: unattributed faults (no guest
/// agent, or a thread that is not a vCPU), kernel pages, page tables (module docs).
pub const GLOBAL_KEY: ProcessKey = 0;
/// Shortest interval between two walks of one process's page tables.
pub const REWALK_MIN: Duration = Duration::from_millis(2);
/// Longest: a walk that did not place the page it was made for doubles the interval up to this
/// (faults on pages no process maps — its own page tables, evicted and faulted back at low
/// local memory — would otherwise rewalk every `REWALK_MIN`); one that did resets it.
pub const REWALK_MAX: Duration = Duration::from_millis(128);
/// Processes whose maps are kept (the least recently used one is dropped beyond that).
const MAX_PROCESSES: usize = 64;

const PRESENT: u64 = 1;
/// Page size bit of a PDPT (1 GiB) or PD (2 MiB) entry.
const HUGE: u64 = 1 << 7;
/// Physical address bits of an entry (and of CR3).
const ADDR: u64 = 0x000F_FFFF_FFFF_F000;
/// Entries of the top-level table that map the user half (the lower half of the address
/// space: below 2^47 with 4 levels, below 2^56 with 5).
const USER_TOP_ENTRIES: u64 = 256;
/// Pages in a 2 MiB and a 1 GiB page.
const PAGES_2M: u64 = 512;
const PAGES_1G: u64 = 512 * 512;
/// Linux's page-table isolation: each PGD is an 8 KiB pair, the user copy 4 KiB above the
/// kernel one (`PTI_USER_PGTABLE_BIT`).
const PTI_USER_PGD: u64 = 1 << 12;

/// How the guest's page tables look, shared between the VMM (which learns it) and the page
/// space (which reads it at every translation). Changing it drops what the page space learnt.
#[derive(Debug, Default)]
pub struct GuestPaging {
    bits: AtomicU8,
}

const FIVE_LEVEL: u8 = 1;
const LINUX_PGD_PAIRS: u8 = 2;

impl GuestPaging {
    /// 4-level paging; `linux`: CR3 values are Linux's (see [`GuestPaging::root_of`]).
    pub fn new(linux: bool) -> Self {
        let p = GuestPaging::default();
        p.set(LINUX_PGD_PAIRS, linux);
        p
    }

    fn set(&self, bit: u8, on: bool) {
        if on {
            self.bits.fetch_or(bit, Ordering::Relaxed);
        } else {
            self.bits.fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// The guest runs with 5-level paging (CR4.LA57) or not.
    pub fn set_five_level(&self, on: bool) {
        self.set(FIVE_LEVEL, on);
    }

    /// Learns the paging depth from a vCPU's CR4 (bit 12, LA57).
    pub fn set_from_cr4(&self, cr4: u64) {
        self.set_five_level(cr4 & (1 << 12) != 0);
    }

    /// Whether the guest runs with 5-level paging (CR4.LA57).
    pub fn five_level(&self) -> bool {
        self.bits.load(Ordering::Relaxed) & FIVE_LEVEL != 0
    }

    /// Page-table levels: 4, or 5 with LA57.
    pub fn levels(&self) -> u32 {
        if self.five_level() {
            5
        } else {
            4
        }
    }

    /// The page-table root a CR3 value names, which keys the process: bits 0–11 (PCID, or the
    /// PWT/PCD flags) and 63 (no-flush on a CR3 write) are dropped, and for a Linux guest the
    /// user PGD of a page-table-isolation pair (bit 12 set) is the kernel PGD below it — one
    /// process, one key, whichever half it ran in. Linux kernels with page-table isolation
    /// built in allocate every PGD as an 8 KiB-aligned pair, so a kernel PGD never has bit 12.
    pub fn root_of(&self, cr3: u64) -> u64 {
        let root = cr3 & ADDR;
        if self.bits.load(Ordering::Relaxed) & LINUX_PGD_PAIRS != 0 {
            root & !PTI_USER_PGD
        } else {
            root
        }
    }
}

/// What a walk learnt of one process.
struct ProcessMap {
    cr3: u64,
    /// Guest-physical page -> virtual page (4 KiB and 2 MiB mappings).
    rev: FxHashMap<u64, u64>,
    /// 1 GiB mappings: (first guest page, first virtual page); 262,144 pages each, so kept
    /// as ranges rather than in `rev`.
    giant: Vec<(u64, u64)>,
    walked_at: Option<Instant>,
    /// The interval the next walk waits for (`REWALK_MIN` ..= `REWALK_MAX`).
    rewalk_after: Duration,
    last_use: u64,
}

impl ProcessMap {
    fn lookup(&self, gpn: u64) -> Option<u64> {
        if let Some(&v) = self.rev.get(&gpn) {
            return Some(v);
        }
        self.giant
            .iter()
            .find(|&&(g, _)| gpn >= g && gpn < g + PAGES_1G)
            .map(|&(g, v)| v + (gpn - g))
    }
}

/// Counts of what the translation did (for stats and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkCounts {
    /// Full walks of a process's page tables.
    pub walks: u64,
    /// Faults translated to a virtual page.
    pub translated: u64,
    /// Faults left guest-physical (not mapped by the process, or no walk allowed yet).
    pub untranslated: u64,
    /// Candidates that had no guest page (not mapped, or its tables not resident).
    pub unmapped_candidates: u64,
}

/// Guest-virtual page numbers per process, from page-table walks (module docs), 4- or 5-level
/// as [`GuestPaging`] says.
pub struct VirtualPages {
    paging: Arc<GuestPaging>,
    /// The depth the maps were learnt with (a change drops them).
    levels: u32,
    procs: Vec<ProcessMap>,
    tick: u64,
    /// The last leaf table found by a forward walk: (CR3, virtual page >> 9, the table's
    /// guest-physical page, or the 2 MiB range's first guest page if `huge`).
    leaf: Option<(u64, u64, u64, bool)>,
    /// One page per level for the full walk (allocated once).
    bufs: Box<[[u64; 512]; 5]>,
    counts: WalkCounts,
}

impl Default for VirtualPages {
    fn default() -> Self {
        Self::new()
    }
}

/// Adds what table `table` (a page of level `level`: 1 = page table, 2 = page directory, ...)
/// maps, virtual pages from `vbase` on, to `rev` / `giant`. `bufs[level - 1]` holds the table;
/// lower levels use the buffers below it. `top` limits the entries read (the user half).
fn walk_table(
    mem: &dyn GuestPages,
    bufs: &mut [[u64; 512]],
    level: u32,
    vbase: u64,
    entries: u64,
    rev: &mut FxHashMap<u64, u64>,
    giant: &mut Vec<(u64, u64)>,
) {
    let (lower, this) = bufs.split_at_mut(level as usize - 1);
    let table = &this[0];
    let span = 1u64 << (9 * (level - 1));
    for (i, &e) in table.iter().enumerate().take(entries as usize) {
        if e & PRESENT == 0 {
            continue;
        }
        let v = vbase + i as u64 * span;
        let target = (e & ADDR) >> 12;
        match level {
            1 => {
                rev.insert(target, v);
            }
            2 if e & HUGE != 0 => {
                let g = (e & ADDR & !0x1F_FFFF) >> 12;
                for k in 0..PAGES_2M {
                    rev.insert(g + k, v + k);
                }
            }
            3 if e & HUGE != 0 => {
                let g = (e & ADDR & !0x3FFF_FFFF) >> 12;
                if !giant.contains(&(g, v)) {
                    giant.push((g, v));
                }
            }
            // The page-size bit is reserved above the PDPT: a malformed entry, skip it.
            _ if e & HUGE != 0 => {}
            _ => {
                if mem.copy_page(target, &mut lower[level as usize - 2]) {
                    walk_table(mem, lower, level - 1, v, 512, rev, giant);
                }
            }
        }
    }
}

impl VirtualPages {
    /// Learns 4-level tables with CR3 values as the test guest publishes them.
    pub fn new() -> Self {
        Self::with_paging(Arc::new(GuestPaging::default()))
    }

    /// Learns the tables `paging` describes (the VMM may update it while the guest runs).
    pub fn with_paging(paging: Arc<GuestPaging>) -> Self {
        Self {
            levels: paging.levels(),
            paging,
            procs: Vec::with_capacity(MAX_PROCESSES),
            tick: 0,
            leaf: None,
            bufs: Box::new([[0; 512]; 5]),
            counts: WalkCounts::default(),
        }
    }

    /// Drops everything learnt if the guest's paging depth changed since.
    fn check_paging(&mut self) {
        let levels = self.paging.levels();
        if levels != self.levels {
            self.levels = levels;
            self.procs.clear();
            self.leaf = None;
        }
    }

    /// The map of process `cr3`, created (or recycled from the least recently used) if new.
    fn process(&mut self, cr3: u64) -> usize {
        self.tick += 1;
        if let Some(i) = self.procs.iter().position(|p| p.cr3 == cr3) {
            self.procs[i].last_use = self.tick;
            return i;
        }
        let fresh = ProcessMap {
            cr3,
            rev: FxHashMap::default(),
            giant: Vec::new(),
            walked_at: None,
            rewalk_after: REWALK_MIN,
            last_use: self.tick,
        };
        if self.procs.len() < MAX_PROCESSES {
            self.procs.push(fresh);
            return self.procs.len() - 1;
        }
        let i = (0..self.procs.len())
            .min_by_key(|&i| self.procs[i].last_use)
            .unwrap_or(0);
        // Keep the old tables' capacity: recycling allocates nothing once warm.
        let mut rev = std::mem::take(&mut self.procs[i].rev);
        rev.clear();
        let mut giant = std::mem::take(&mut self.procs[i].giant);
        giant.clear();
        self.procs[i] = ProcessMap {
            rev,
            giant,
            ..fresh
        };
        i
    }

    /// Adds what the user page tables of process `i` map now to its reverse map. Entries are
    /// only added or overwritten, never cleared: at low local memory the tables themselves
    /// come and go (evicted, faulted back by the guest's walks), and a walk that finds one
    /// absent must not forget the pages it maps (measured on Zipf KV at 25%: a walk every
    /// ~30 ms, each re-learning what the last one dropped). A page the guest has since
    /// remapped keeps a stale entry until a walk sees its new place; that costs accuracy only.
    fn walk(&mut self, mem: &dyn GuestPages, i: usize, now: Instant) {
        self.counts.walks += 1;
        let root = (self.procs[i].cr3 & ADDR) >> 12;
        self.procs[i].walked_at = Some(now);
        let levels = self.levels;
        let pm = &mut self.procs[i];
        let top = &mut self.bufs[levels as usize - 1];
        if !mem.copy_page(root, top) {
            return; // the root itself is not resident: nothing to learn now
        }
        walk_table(
            mem,
            &mut self.bufs[..levels as usize],
            levels,
            0,
            USER_TOP_ENTRIES,
            &mut pm.rev,
            &mut pm.giant,
        );
    }

    /// Forward walk: the guest page virtual page `vpn` of `cr3` maps to, if its tables are
    /// resident and it is present.
    fn resolve(&mut self, mem: &dyn GuestPages, cr3: u64, vpn: u64) -> Option<u64> {
        let levels = self.levels;
        let top_shift = 9 * (levels - 1);
        if vpn >> (9 * levels) != 0 || vpn >> top_shift >= USER_TOP_ENTRIES {
            return None;
        }
        let region = vpn >> 9;
        let (leaf, huge) = match self.leaf {
            Some((c, r, leaf, huge)) if c == cr3 && r == region => (leaf, huge),
            _ => {
                let mut table = (cr3 & ADDR) >> 12;
                let mut found = None;
                for level in (1..levels).rev() {
                    let index = (vpn >> (9 * level)) & 511;
                    let e = mem.read_u64((table << 12) + index * 8)?;
                    if e & PRESENT == 0 {
                        return None;
                    }
                    if e & HUGE != 0 {
                        found = match level {
                            // A 2 MiB page: the range is the page itself.
                            1 => Some((e & ADDR & !0x1F_FFFF) >> 12),
                            // A 1 GiB page: the 2 MiB range of it `vpn` is in.
                            2 => Some(((e & ADDR & !0x3FFF_FFFF) >> 12) + (region & 511) * 512),
                            _ => return None, // reserved bit set: malformed
                        };
                        break;
                    }
                    table = (e & ADDR) >> 12;
                }
                let (leaf, huge) = found.map_or((table, false), |g| (g, true));
                self.leaf = Some((cr3, region, leaf, huge));
                (leaf, huge)
            }
        };
        if huge {
            return Some(leaf + (vpn & 511));
        }
        let e = mem.read_u64((leaf << 12) + (vpn & 511) * 8)?;
        (e & PRESENT != 0).then_some((e & ADDR) >> 12)
    }

    /// A fault the process's user mapping does not place: the global history.
    fn global(&mut self, gpn: u64) -> (ProcessKey, PageNo) {
        self.counts.untranslated += 1;
        (GLOBAL_KEY, gpn | PHYSICAL_TAG)
    }
}

impl PageSpace for VirtualPages {
    fn process_key(&self, cr3: u64) -> ProcessKey {
        self.paging.root_of(cr3)
    }

    fn to_prefetch(
        &mut self,
        mem: &dyn GuestPages,
        key: ProcessKey,
        gpn: u64,
    ) -> (ProcessKey, PageNo) {
        self.prefetch_page_at(mem, key, gpn, &Instant::now)
    }

    fn to_guest(&mut self, mem: &dyn GuestPages, key: ProcessKey, page: PageNo) -> Option<u64> {
        self.check_paging();
        if page & PHYSICAL_TAG != 0 {
            return Some(page & !PHYSICAL_TAG);
        }
        if key == GLOBAL_KEY {
            return None;
        }
        let r = self.resolve(mem, key, page);
        if r.is_none() {
            self.counts.unmapped_candidates += 1;
        }
        r
    }

    fn counts(&self) -> WalkCounts {
        self.counts
    }
}

impl VirtualPages {
    /// [`PageSpace::to_prefetch`] with the clock as a parameter: `now` is read only when a
    /// rewalk is considered (so the common, translated case reads no clock), and tests give
    /// it a clock of their own instead of sleeping.
    fn prefetch_page_at(
        &mut self,
        mem: &dyn GuestPages,
        key: ProcessKey,
        gpn: u64,
        now: &dyn Fn() -> Instant,
    ) -> (ProcessKey, PageNo) {
        self.check_paging();
        if key == GLOBAL_KEY {
            // Not attributed to a process: its history is the global guest-physical one.
            return (GLOBAL_KEY, gpn | PHYSICAL_TAG);
        }
        let i = self.process(key);
        if let Some(vpn) = self.procs[i].lookup(gpn) {
            self.counts.translated += 1;
            return (key, vpn);
        }
        let pm = &self.procs[i];
        let t = now();
        let may_walk = pm
            .walked_at
            .is_none_or(|w| t.saturating_duration_since(w) >= pm.rewalk_after);
        if may_walk {
            self.walk(mem, i, t);
            let pm = &mut self.procs[i];
            if let Some(vpn) = pm.lookup(gpn) {
                pm.rewalk_after = REWALK_MIN;
                self.counts.translated += 1;
                return (key, vpn);
            }
            pm.rewalk_after = (pm.rewalk_after * 2).min(REWALK_MAX);
        }
        self.global(gpn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::{HashMap, HashSet};

    /// Guest memory as a map of pages; `absent` pages are not resident.
    #[derive(Default)]
    struct Mem {
        pages: RefCell<HashMap<u64, [u64; 512]>>,
        absent: RefCell<HashSet<u64>>,
        reads: RefCell<u64>,
    }

    impl Mem {
        fn set(&self, gpn: u64, index: usize, value: u64) {
            self.pages.borrow_mut().entry(gpn).or_insert([0; 512])[index] = value;
        }
    }

    impl GuestPages for Mem {
        fn read_u64(&self, gpa: u64) -> Option<u64> {
            *self.reads.borrow_mut() += 1;
            let p = gpa >> 12;
            if self.absent.borrow().contains(&p) {
                return None;
            }
            Some(
                self.pages
                    .borrow()
                    .get(&p)
                    .map_or(0, |pg| pg[(gpa as usize & 0xFFF) / 8]),
            )
        }
        fn copy_page(&self, gpn: u64, out: &mut [u64; 512]) -> bool {
            if self.absent.borrow().contains(&gpn) {
                return false;
            }
            *out = self.pages.borrow().get(&gpn).copied().unwrap_or([0; 512]);
            true
        }
    }

    const CR3: u64 = 0x10 << 12;

    /// A fault left guest-physical, in the global history.
    fn phys(gpn: u64) -> (ProcessKey, PageNo) {
        (GLOBAL_KEY, gpn | PHYSICAL_TAG)
    }

    /// Maps virtual page `vpn` to guest page `gpn` through tables at 0x10 (PML4), 0x11
    /// (PDPT), 0x12 (PD) and 0x13+ (one PT per 2 MiB region, by region index).
    fn map(m: &Mem, vpn: u64, gpn: u64) {
        let (l4, l3, l2, l1) = (vpn >> 27 & 511, vpn >> 18 & 511, vpn >> 9 & 511, vpn & 511);
        assert_eq!((l4, l3), (0, 0), "the test tables cover the first 1 GiB");
        m.set(0x10, l4 as usize, (0x11 << 12) | 0x7);
        m.set(0x11, l3 as usize, (0x12 << 12) | 0x7);
        let pt = 0x13 + l2;
        m.set(0x12, l2 as usize, (pt << 12) | 0x7);
        m.set(pt, l1 as usize, (gpn << 12) | 0x67);
    }

    #[test]
    fn a_shuffled_heap_is_seen_in_virtual_order_and_candidates_map_back() {
        let m = Mem::default();
        // Virtual pages 0x400.. (a heap at 4 MiB) on scattered guest frames.
        let frames: Vec<u64> = (0..1024u64).map(|i| 0x8000 + (i * 389) % 1024).collect();
        for (i, &g) in frames.iter().enumerate() {
            map(&m, 0x400 + i as u64, g);
        }
        let mut s = VirtualPages::new();
        for (i, &g) in frames.iter().enumerate() {
            assert_eq!(s.to_prefetch(&m, CR3, g), (CR3, 0x400 + i as u64));
        }
        // One walk placed them all.
        assert_eq!(s.counts().walks, 1);
        assert_eq!(s.counts().translated, 1024);
        for (i, &g) in frames.iter().enumerate() {
            assert_eq!(s.to_guest(&m, CR3, 0x400 + i as u64), Some(g));
        }
        // A window of neighbours shares its leaf table: the first walks down (3 reads to the
        // leaf table, the last cached one was another region's), then one read each.
        let before = *m.reads.borrow();
        for v in 0x500..0x510 {
            s.to_guest(&m, CR3, v);
        }
        assert_eq!(*m.reads.borrow() - before, 3 + 16);
        // Beyond the mapped heap: no guest page.
        assert_eq!(s.to_guest(&m, CR3, 0x400 + 1024), None);
        assert_eq!(s.to_guest(&m, CR3, 1 << 40), None);
    }

    #[test]
    fn unmapped_and_unattributed_pages_stay_physical_and_tagged() {
        let m = Mem::default();
        map(&m, 0x400, 0x9000);
        let mut s = VirtualPages::new();
        // Unattributed (no process key): the global history, guest-physical.
        let (k, p) = s.to_prefetch(&m, 0, 0x9000);
        assert_eq!((k, p), (GLOBAL_KEY, 0x9000 | PHYSICAL_TAG));
        assert_eq!(s.to_guest(&m, k, p), Some(0x9000));
        assert_eq!(s.to_guest(&m, k, 0x400), None);
        // A page the process does not map (a page-table page): tagged, in the global history
        // rather than the process's, and candidates near it go back to guest-physical
        // neighbours.
        let (k, t) = s.to_prefetch(&m, CR3, 0x12);
        assert_eq!((k, t), (GLOBAL_KEY, 0x12 | PHYSICAL_TAG));
        assert_eq!(s.to_guest(&m, k, t + 1), Some(0x13));
        assert!(s.counts().untranslated >= 1);
    }

    #[test]
    fn a_new_mapping_is_learnt_by_a_rewalk_no_sooner_than_the_minimum_interval() {
        let m = Mem::default();
        map(&m, 0x400, 0x9000);
        let mut s = VirtualPages::new();
        assert_eq!(s.to_prefetch(&m, CR3, 0x9000), (CR3, 0x400));
        map(&m, 0x401, 0x7777);
        // Right after a walk: no new walk, the page stays physical.
        assert_eq!(s.to_prefetch(&m, CR3, 0x7777), phys(0x7777));
        assert_eq!(s.counts().walks, 1);
        std::thread::sleep(REWALK_MIN + Duration::from_millis(1));
        assert_eq!(s.to_prefetch(&m, CR3, 0x7777), (CR3, 0x401));
        assert_eq!(s.counts().walks, 2);
    }

    #[test]
    fn walks_that_place_nothing_back_off_and_one_that_does_resets_the_interval() {
        let m = Mem::default();
        map(&m, 0x400, 0x9000);
        let mut s = VirtualPages::new();
        // The test's own clock: a sleep on a loaded host can outlast the doubled interval.
        let clock = std::cell::Cell::new(Instant::now());
        let now = || clock.get();
        let wait = |d: Duration| clock.set(clock.get() + d + Duration::from_millis(1));
        assert_eq!(s.prefetch_page_at(&m, CR3, 0x9000, &now), (CR3, 0x400));
        // A page no walk will place (say, one of the process's own page tables).
        wait(REWALK_MIN);
        s.prefetch_page_at(&m, CR3, 0x12, &now);
        assert_eq!(s.counts().walks, 2);
        // The interval doubled: REWALK_MIN later is too soon.
        wait(REWALK_MIN);
        s.prefetch_page_at(&m, CR3, 0x12, &now);
        assert_eq!(s.counts().walks, 2);
        wait(REWALK_MIN);
        map(&m, 0x401, 0x7777);
        assert_eq!(s.prefetch_page_at(&m, CR3, 0x7777, &now), (CR3, 0x401));
        assert_eq!(s.counts().walks, 3);
        assert_eq!(s.procs[0].rewalk_after, REWALK_MIN);
    }

    #[test]
    fn a_table_evicted_since_the_last_walk_does_not_make_its_pages_forgotten() {
        let m = Mem::default();
        map(&m, 0x400, 0x9000);
        map(&m, 0x600, 0x9100);
        let mut s = VirtualPages::new();
        assert_eq!(s.to_prefetch(&m, CR3, 0x9000), (CR3, 0x400));
        // The leaf table of 0x600.. goes remote; a miss makes the next walk.
        m.absent.borrow_mut().insert(0x13 + 3);
        std::thread::sleep(REWALK_MIN + Duration::from_millis(1));
        map(&m, 0x401, 0x7777);
        assert_eq!(s.to_prefetch(&m, CR3, 0x7777), (CR3, 0x401));
        assert_eq!(s.counts().walks, 2);
        assert_eq!(s.to_prefetch(&m, CR3, 0x9100), (CR3, 0x600));
    }

    #[test]
    fn non_resident_tables_are_skipped_never_read_and_huge_pages_are_walked() {
        let m = Mem::default();
        map(&m, 0x400, 0x9000);
        map(&m, 0x600, 0x9100);
        // A 2 MiB page at virtual 0x800.. (PD index 4) on guest pages 0xA000..
        m.set(0x12, 4, (0xA000 << 12) | HUGE | 0x7);
        // The PT of region 3 (virtual 0x600..) is not resident.
        m.absent.borrow_mut().insert(0x13 + 3);
        let mut s = VirtualPages::new();
        assert_eq!(s.to_prefetch(&m, CR3, 0x9000), (CR3, 0x400));
        assert_eq!(s.to_prefetch(&m, CR3, 0xA000 + 17), (CR3, 0x800 + 17));
        assert_eq!(s.to_guest(&m, CR3, 0x800 + 300), Some(0xA000 + 300));
        std::thread::sleep(REWALK_MIN + Duration::from_millis(1));
        assert_eq!(s.to_prefetch(&m, CR3, 0x9100), phys(0x9100));
        assert_eq!(s.to_guest(&m, CR3, 0x600), None);
        // A root that is not resident: nothing is learnt, nothing breaks.
        m.absent.borrow_mut().insert(0x10);
        let mut s = VirtualPages::new();
        assert_eq!(s.to_prefetch(&m, CR3, 0x9000), phys(0x9000));
        assert_eq!(s.to_guest(&m, CR3, 0x400), None);
    }

    #[test]
    fn processes_are_kept_apart_and_the_least_recent_is_recycled() {
        let m = Mem::default();
        map(&m, 0x400, 0x9000);
        let mut s = VirtualPages::new();
        // Another process whose root page is empty maps nothing.
        let other = 0x20 << 12;
        assert_eq!(s.to_prefetch(&m, other, 0x9000), phys(0x9000));
        assert_eq!(s.to_prefetch(&m, CR3, 0x9000), (CR3, 0x400));
        for k in 0..(MAX_PROCESSES as u64 + 4) {
            s.to_prefetch(&m, (0x100 + k) << 12, 1);
        }
        assert_eq!(s.procs.len(), MAX_PROCESSES);
    }

    /// A Linux-style address space: the kernel PGD at 0x40 (8 KiB aligned) and its user copy
    /// at 0x41 (page-table isolation), both mapping the user half the same way; the kernel half
    /// (entry 256 on) only in the kernel PGD. Virtual page 0x400 (4 MiB) -> guest page 0x9000;
    /// a kernel page (upper half) -> guest page 0x7000.
    fn linux_tables(m: &Mem) {
        for pgd in [0x40, 0x41] {
            m.set(pgd, 0, (0x42 << 12) | 0x67);
        }
        m.set(0x40, 300, (0x50 << 12) | 0x63);
        m.set(0x50, 0, (0x51 << 12) | 0x63);
        m.set(0x51, 0, (0x52 << 12) | 0x63);
        m.set(0x52, 0, (0x7000 << 12) | 0x63);
        m.set(0x42, 0, (0x43 << 12) | 0x67);
        m.set(0x43, 2, (0x44 << 12) | 0x67);
        m.set(0x44, 0, (0x9000 << 12) | 0x67);
    }

    #[test]
    fn pcid_and_no_flush_bits_and_the_pti_user_pgd_name_one_process() {
        let m = Mem::default();
        linux_tables(&m);
        let paging = Arc::new(GuestPaging::new(true));
        let mut s = VirtualPages::with_paging(paging.clone());
        let kernel_pgd = 0x40 << 12;
        // The kernel PGD with PCID 5 and the no-flush bit, and the user PGD (bit 12) with the
        // user PCID (bit 11 set): all the same process.
        for cr3 in [
            kernel_pgd,
            kernel_pgd | 5 | (1 << 63),
            (0x41 << 12) | 0x805,
            (0x41 << 12) | (1 << 63),
        ] {
            assert_eq!(s.process_key(cr3), kernel_pgd, "cr3 {cr3:#x}");
        }
        let key = s.process_key((0x41 << 12) | 0x805);
        assert_eq!(s.to_prefetch(&m, key, 0x9000), (kernel_pgd, 0x400));
        assert_eq!(s.to_guest(&m, key, 0x400), Some(0x9000));
        assert_eq!(s.procs.len(), 1);
        // Without Linux's PGD pairs (the test guest), bit 12 is an address bit: two processes.
        let plain = VirtualPages::new();
        assert_eq!(plain.process_key((0x41 << 12) | 0x805), 0x41 << 12);
        assert_eq!(Identity.process_key(kernel_pgd | 7 | (1 << 63)), kernel_pgd);
    }

    #[test]
    fn kernel_half_faults_go_to_the_global_history_not_the_process() {
        let m = Mem::default();
        linux_tables(&m);
        let mut s = VirtualPages::with_paging(Arc::new(GuestPaging::new(true)));
        let key = 0x40 << 12;
        assert_eq!(s.to_prefetch(&m, key, 0x9000), (key, 0x400));
        // A page only the kernel half maps (the kernel touched it for the process): its
        // history is the global one, guest-physical.
        std::thread::sleep(REWALK_MIN + Duration::from_millis(1));
        assert_eq!(s.to_prefetch(&m, key, 0x7000), phys(0x7000));
        // The walk never read the kernel half: only the user half's tables were copied.
        assert_eq!(s.procs[0].rev.len(), 1);
        // Candidates of the global history map back physically, never through the process.
        assert_eq!(
            s.to_guest(&m, GLOBAL_KEY, 0x7001 | PHYSICAL_TAG),
            Some(0x7001)
        );
        // Without an agent every fault is unattributed: one global guest-physical history.
        assert_eq!(s.to_prefetch(&m, GLOBAL_KEY, 0x9000), phys(0x9000));
        assert_eq!(s.to_guest(&m, GLOBAL_KEY, 0x400), None);
    }

    /// 5-level tables: PML5 0x60 -> PML4 0x61 -> PDPT 0x62 -> PD 0x63 -> PT 0x64, mapping
    /// virtual page `vpn` (whose PML5 index may be non-zero) to `gpn`.
    fn map5(m: &Mem, vpn: u64, gpn: u64) {
        let idx = |l: u32| ((vpn >> (9 * l)) & 511) as usize;
        m.set(0x60, idx(4), (0x61 << 12) | 0x7);
        m.set(0x61, idx(3), (0x62 << 12) | 0x7);
        m.set(0x62, idx(2), (0x63 << 12) | 0x7);
        m.set(0x63, idx(1), (0x64 << 12) | 0x7);
        m.set(0x64, idx(0), (gpn << 12) | 0x67);
    }

    #[test]
    fn five_level_tables_are_walked_when_the_guest_runs_with_la57() {
        let m = Mem::default();
        // A user page above the 4-level limit (2^47): PML5 index 3.
        let high = (3u64 << 36) | 0x1234;
        map5(&m, high, 0x9000);
        let paging = Arc::new(GuestPaging::default());
        let mut s = VirtualPages::with_paging(paging.clone());
        let root = 0x60 << 12;
        // Read as 4-level, the tables mean something else: nothing is placed.
        assert_eq!(s.to_prefetch(&m, root, 0x9000), phys(0x9000));
        assert_eq!(s.to_guest(&m, root, high), None);
        // The VMM learns CR4.LA57: the maps are dropped and relearnt 5-level.
        paging.set_from_cr4(1 << 12);
        assert_eq!(paging.levels(), 5);
        assert_eq!(s.to_prefetch(&m, root, 0x9000), (root, high));
        assert_eq!(s.to_guest(&m, root, high), Some(0x9000));
        assert_eq!(s.to_guest(&m, root, high + 1), None);
        // The kernel half of a 5-level space (PML5 index 256 on) is never a user page.
        assert_eq!(s.to_guest(&m, root, 256u64 << 36), None);
        assert_eq!(s.to_guest(&m, root, 1 << 45), None, "beyond 57 bits");
        paging.set_from_cr4(0);
        assert_eq!(paging.levels(), 4);
    }

    #[test]
    fn one_gib_pages_are_placed_both_ways() {
        let m = Mem::default();
        // PDPT entry 1 (virtual 1 GiB..2 GiB) is a 1 GiB page on guest pages 0x40000..
        m.set(0x10, 0, (0x11 << 12) | 0x7);
        m.set(0x11, 1, (0x40000 << 12) | HUGE | 0x7);
        let mut s = VirtualPages::new();
        let vbase = PAGES_1G;
        assert_eq!(s.to_prefetch(&m, CR3, 0x40000 + 7), (CR3, vbase + 7));
        assert_eq!(
            s.to_prefetch(&m, CR3, 0x40000 + 200_000),
            (CR3, vbase + 200_000)
        );
        assert_eq!(s.counts().walks, 1, "one walk placed the whole 1 GiB page");
        // Kept as a range, not 262,144 map entries.
        assert!(s.procs[0].rev.is_empty());
        assert_eq!(s.to_guest(&m, CR3, vbase + 1000), Some(0x40000 + 1000));
        assert_eq!(
            s.to_guest(&m, CR3, vbase + PAGES_1G - 1),
            Some(0x40000 + PAGES_1G - 1)
        );
        // Once one page of a 2 MiB range of it is resolved (two reads: PML4 and PDPT
        // entries), its neighbours need no read at all: the cached range is arithmetic.
        let before = *m.reads.borrow();
        assert_eq!(s.to_guest(&m, CR3, vbase + 1000), Some(0x40000 + 1000));
        assert_eq!(*m.reads.borrow() - before, 2);
        let before = *m.reads.borrow();
        for v in 1001..1010 {
            assert_eq!(s.to_guest(&m, CR3, vbase + v), Some(0x40000 + v));
        }
        assert_eq!(*m.reads.borrow(), before);
        assert_eq!(s.to_guest(&m, CR3, 2 * PAGES_1G), None);
    }
}
