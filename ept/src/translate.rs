//! The seam between guest-physical pages (what faults and installs are about) and the page
//! numbers the prefetcher learns from.
//!
//! - [`Identity`]: guest-physical page numbers on both sides.
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
//! guest-physical number, tagged with [`PHYSICAL_TAG`] so that they never alias a virtual one.
//! Guest memory is read only through [`GuestPages`], which never touches a page that is not
//! resident: a walk that meets one skips that part of the tree. A stale map can only cost
//! prefetch accuracy, never correctness: every install is by guest-physical page.

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
    /// The prefetcher's page number for guest page `gpn` faulted by `key`.
    fn to_prefetch(&mut self, mem: &dyn GuestPages, key: ProcessKey, gpn: u64) -> PageNo;
    /// The guest page a candidate refers to, if it maps to one.
    fn to_guest(&mut self, mem: &dyn GuestPages, key: ProcessKey, page: PageNo) -> Option<u64>;
    /// What the translation did so far (all zero for a space that does nothing).
    fn counts(&self) -> WalkCounts {
        WalkCounts::default()
    }
}

/// Guest-physical page numbers on both sides.
pub struct Identity;

impl PageSpace for Identity {
    fn to_prefetch(&mut self, _mem: &dyn GuestPages, _key: ProcessKey, gpn: u64) -> PageNo {
        gpn
    }
    fn to_guest(&mut self, _mem: &dyn GuestPages, _key: ProcessKey, page: PageNo) -> Option<u64> {
        Some(page)
    }
}

/// Marks a prefetcher page number that is a guest-physical page (see the module docs). Above
/// every 4-level (48-bit) or 5-level (57-bit) virtual page number.
pub const PHYSICAL_TAG: u64 = 1 << 62;
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
/// PML4 entries of the user half (virtual addresses below 2^47).
const USER_PML4_ENTRIES: usize = 256;

/// What a walk learnt of one process.
struct ProcessMap {
    cr3: u64,
    /// Guest-physical page -> virtual page.
    rev: FxHashMap<u64, u64>,
    walked_at: Option<Instant>,
    /// The interval the next walk waits for (`REWALK_MIN` ..= `REWALK_MAX`).
    rewalk_after: Duration,
    last_use: u64,
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

/// Guest-virtual page numbers per process, from page-table walks (module docs). 4-level
/// paging (the test guest's; a 5-level guest keeps guest-physical numbers: its user pages are
/// not found below a 4-level root).
pub struct VirtualPages {
    procs: Vec<ProcessMap>,
    tick: u64,
    /// The last leaf table found by a forward walk: (CR3, virtual page >> 9, the table's
    /// guest-physical page, or the 2 MiB page's first guest page if `huge`).
    leaf: Option<(u64, u64, u64, bool)>,
    /// One page per level for the full walk (allocated once).
    bufs: Box<[[u64; 512]; 4]>,
    counts: WalkCounts,
}

impl Default for VirtualPages {
    fn default() -> Self {
        Self::new()
    }
}

impl VirtualPages {
    /// An empty map (no process walked yet).
    pub fn new() -> Self {
        Self {
            procs: Vec::with_capacity(MAX_PROCESSES),
            tick: 0,
            leaf: None,
            bufs: Box::new([[0; 512]; 4]),
            counts: WalkCounts::default(),
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
        // Keep the old table's capacity: recycling allocates nothing once warm.
        let mut rev = std::mem::take(&mut self.procs[i].rev);
        rev.clear();
        self.procs[i] = ProcessMap { rev, ..fresh };
        i
    }

    /// Adds what the user page tables of process `i` map now to its reverse map. Entries are
    /// only added or overwritten, never cleared: at low local memory the tables themselves
    /// come and go (evicted, faulted back by the guest's walks), and a walk that finds one
    /// absent must not forget the pages it maps (measured on Zipf KV at 25%: a walk every
    /// ~30 ms, each re-learning what the last one dropped). A page the guest has since
    /// remapped keeps a stale entry until a walk sees its new place; that costs accuracy only.
    fn walk(&mut self, mem: &dyn GuestPages, i: usize) {
        self.counts.walks += 1;
        let root = (self.procs[i].cr3 & ADDR) >> 12;
        self.procs[i].walked_at = Some(Instant::now());
        let rev = &mut self.procs[i].rev;
        let [pml4, pdpt, pd, pt] = &mut *self.bufs;
        if !mem.copy_page(root, pml4) {
            return; // the root itself is not resident: nothing to learn now
        }
        for (l4, &e4) in pml4.iter().enumerate().take(USER_PML4_ENTRIES) {
            if e4 & PRESENT == 0 || !mem.copy_page((e4 & ADDR) >> 12, pdpt) {
                continue;
            }
            for (l3, &e3) in pdpt.iter().enumerate() {
                // 1 GiB pages are skipped: 262,144 entries each, and no guest here maps one.
                if e3 & PRESENT == 0 || e3 & HUGE != 0 || !mem.copy_page((e3 & ADDR) >> 12, pd) {
                    continue;
                }
                for (l2, &e2) in pd.iter().enumerate() {
                    if e2 & PRESENT == 0 {
                        continue;
                    }
                    let vbase = ((l4 as u64) << 27) | ((l3 as u64) << 18) | ((l2 as u64) << 9);
                    if e2 & HUGE != 0 {
                        let gbase = (e2 & ADDR & !0x1F_FFFF) >> 12;
                        for k in 0..512 {
                            rev.insert(gbase + k, vbase + k);
                        }
                        continue;
                    }
                    if !mem.copy_page((e2 & ADDR) >> 12, pt) {
                        continue;
                    }
                    for (l1, &e1) in pt.iter().enumerate() {
                        if e1 & PRESENT != 0 {
                            rev.insert((e1 & ADDR) >> 12, vbase + l1 as u64);
                        }
                    }
                }
            }
        }
    }

    /// Forward walk: the guest page virtual page `vpn` of `cr3` maps to, if its tables are
    /// resident and it is present.
    fn resolve(&mut self, mem: &dyn GuestPages, cr3: u64, vpn: u64) -> Option<u64> {
        if vpn >> 36 != 0 || (vpn >> 27) as usize >= USER_PML4_ENTRIES {
            return None;
        }
        let region = vpn >> 9;
        let (leaf, huge) = match self.leaf {
            Some((c, r, leaf, huge)) if c == cr3 && r == region => (leaf, huge),
            _ => {
                let mut table = (cr3 & ADDR) >> 12;
                let mut found = None;
                for level in [3u32, 2, 1] {
                    let index = (vpn >> (9 * level)) & 511;
                    let e = mem.read_u64((table << 12) + index * 8)?;
                    if e & PRESENT == 0 {
                        return None;
                    }
                    if e & HUGE != 0 {
                        if level != 1 {
                            return None; // a 1 GiB page (not walked, see `walk`)
                        }
                        found = Some(((e & ADDR & !0x1F_FFFF) >> 12, true));
                        break;
                    }
                    table = (e & ADDR) >> 12;
                }
                let (leaf, huge) = found.unwrap_or((table, false));
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
}

impl PageSpace for VirtualPages {
    fn to_prefetch(&mut self, mem: &dyn GuestPages, key: ProcessKey, gpn: u64) -> PageNo {
        if key == 0 {
            // Not attributed to a process: its history is guest-physical.
            return gpn | PHYSICAL_TAG;
        }
        let i = self.process(key);
        if let Some(&vpn) = self.procs[i].rev.get(&gpn) {
            self.counts.translated += 1;
            return vpn;
        }
        let pm = &self.procs[i];
        let may_walk = pm.walked_at.is_none_or(|t| t.elapsed() >= pm.rewalk_after);
        if may_walk {
            self.walk(mem, i);
            let pm = &mut self.procs[i];
            if let Some(&vpn) = pm.rev.get(&gpn) {
                pm.rewalk_after = REWALK_MIN;
                self.counts.translated += 1;
                return vpn;
            }
            pm.rewalk_after = (pm.rewalk_after * 2).min(REWALK_MAX);
        }
        self.counts.untranslated += 1;
        gpn | PHYSICAL_TAG
    }

    fn to_guest(&mut self, mem: &dyn GuestPages, key: ProcessKey, page: PageNo) -> Option<u64> {
        if page & PHYSICAL_TAG != 0 {
            return Some(page & !PHYSICAL_TAG);
        }
        if key == 0 {
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
            assert_eq!(s.to_prefetch(&m, CR3, g), 0x400 + i as u64);
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
        // Unattributed (no process key).
        let p = s.to_prefetch(&m, 0, 0x9000);
        assert_eq!(p, 0x9000 | PHYSICAL_TAG);
        assert_eq!(s.to_guest(&m, 0, p), Some(0x9000));
        assert_eq!(s.to_guest(&m, 0, 0x400), None);
        // A page the process does not map (a page-table page): tagged, and candidates near it
        // go back to guest-physical neighbours.
        let t = s.to_prefetch(&m, CR3, 0x12);
        assert_eq!(t, 0x12 | PHYSICAL_TAG);
        assert_eq!(s.to_guest(&m, CR3, t + 1), Some(0x13));
        assert!(s.counts().untranslated >= 1);
    }

    #[test]
    fn a_new_mapping_is_learnt_by_a_rewalk_no_sooner_than_the_minimum_interval() {
        let m = Mem::default();
        map(&m, 0x400, 0x9000);
        let mut s = VirtualPages::new();
        assert_eq!(s.to_prefetch(&m, CR3, 0x9000), 0x400);
        map(&m, 0x401, 0x7777);
        // Right after a walk: no new walk, the page stays physical.
        assert_eq!(s.to_prefetch(&m, CR3, 0x7777), 0x7777 | PHYSICAL_TAG);
        assert_eq!(s.counts().walks, 1);
        std::thread::sleep(REWALK_MIN + Duration::from_millis(1));
        assert_eq!(s.to_prefetch(&m, CR3, 0x7777), 0x401);
        assert_eq!(s.counts().walks, 2);
    }

    #[test]
    fn walks_that_place_nothing_back_off_and_one_that_does_resets_the_interval() {
        let m = Mem::default();
        map(&m, 0x400, 0x9000);
        let mut s = VirtualPages::new();
        assert_eq!(s.to_prefetch(&m, CR3, 0x9000), 0x400);
        // A page no walk will place (say, one of the process's own page tables).
        let wait = |d: Duration| std::thread::sleep(d + Duration::from_millis(1));
        wait(REWALK_MIN);
        s.to_prefetch(&m, CR3, 0x12);
        assert_eq!(s.counts().walks, 2);
        // The interval doubled: REWALK_MIN later is too soon.
        wait(REWALK_MIN);
        s.to_prefetch(&m, CR3, 0x12);
        assert_eq!(s.counts().walks, 2);
        wait(REWALK_MIN);
        map(&m, 0x401, 0x7777);
        assert_eq!(s.to_prefetch(&m, CR3, 0x7777), 0x401);
        assert_eq!(s.counts().walks, 3);
        assert_eq!(s.procs[0].rewalk_after, REWALK_MIN);
    }

    #[test]
    fn a_table_evicted_since_the_last_walk_does_not_make_its_pages_forgotten() {
        let m = Mem::default();
        map(&m, 0x400, 0x9000);
        map(&m, 0x600, 0x9100);
        let mut s = VirtualPages::new();
        assert_eq!(s.to_prefetch(&m, CR3, 0x9000), 0x400);
        // The leaf table of 0x600.. goes remote; a miss makes the next walk.
        m.absent.borrow_mut().insert(0x13 + 3);
        std::thread::sleep(REWALK_MIN + Duration::from_millis(1));
        map(&m, 0x401, 0x7777);
        assert_eq!(s.to_prefetch(&m, CR3, 0x7777), 0x401);
        assert_eq!(s.counts().walks, 2);
        assert_eq!(s.to_prefetch(&m, CR3, 0x9100), 0x600);
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
        assert_eq!(s.to_prefetch(&m, CR3, 0x9000), 0x400);
        assert_eq!(s.to_prefetch(&m, CR3, 0xA000 + 17), 0x800 + 17);
        assert_eq!(s.to_guest(&m, CR3, 0x800 + 300), Some(0xA000 + 300));
        std::thread::sleep(REWALK_MIN + Duration::from_millis(1));
        assert_eq!(s.to_prefetch(&m, CR3, 0x9100), 0x9100 | PHYSICAL_TAG);
        assert_eq!(s.to_guest(&m, CR3, 0x600), None);
        // A root that is not resident: nothing is learnt, nothing breaks.
        m.absent.borrow_mut().insert(0x10);
        let mut s = VirtualPages::new();
        assert_eq!(s.to_prefetch(&m, CR3, 0x9000), 0x9000 | PHYSICAL_TAG);
        assert_eq!(s.to_guest(&m, CR3, 0x400), None);
    }

    #[test]
    fn processes_are_kept_apart_and_the_least_recent_is_recycled() {
        let m = Mem::default();
        map(&m, 0x400, 0x9000);
        let mut s = VirtualPages::new();
        // Another process whose root page is empty maps nothing.
        let other = 0x20 << 12;
        assert_eq!(s.to_prefetch(&m, other, 0x9000), 0x9000 | PHYSICAL_TAG);
        assert_eq!(s.to_prefetch(&m, CR3, 0x9000), 0x400);
        for k in 0..(MAX_PROCESSES as u64 + 4) {
            s.to_prefetch(&m, (0x100 + k) << 12, 1);
        }
        assert_eq!(s.procs.len(), MAX_PROCESSES);
    }
}
