//! Namespaces (one per VM) and their page index over the arena; tenancy checks.
//!
//! Each namespace has its own `RwLock<page index → (slot, crc, seal)>`: reads of one VM never
//! contend with another VM, and a slot's bytes are only touched under its namespace's lock,
//! so a reader never sees a half-written or recycled slot. The index is a hash map (FxHash);
//! inserting a *new* page may grow it (amortised allocation), reading and overwriting do not.
//! The crc32c sent by the writer is stored and returned verbatim, so corruption anywhere
//! between the writer and the reader (including in this server's memory) is detected end to end.
//! So is the page's seal (40 bytes, opaque here: the VMM's authentication of the page), which
//! this server cannot read or forge, only keep beside the page.
//!
//! A slab granted for one-sided RDMA (`grant`) lives in an [`Extent`] instead: its pages
//! contiguous in the arena, followed by a page table of [`MetaWord`]s (presence and crc32c)
//! that the client reads and writes directly. Every path (TCP, two-sided RDMA, one-sided
//! RDMA) then stores and finds that slab's pages there. An extent has no room for seals: its
//! pages are unsealed (zero seal), and a sealed page is refused there (PROTOCOL.md).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rustc_hash::{FxHashMap, FxHashSet};

mod inspect;

pub use inspect::StoredPage;

use super::arena::{Arena, Slot};
use farvm_memproto::frame::{WIRE_DATA_AT, WIRE_PAGE, WIRE_SEAL_AT};
use farvm_memproto::rdma::grant::{MetaWord, GRANT_EXTENT_PAGES, GRANT_SLAB_PAGES};
use farvm_memproto::{page_crc, unsealed_wire_crc, PageSel, StatInfo, Status, PAGE_SIZE, SEAL_LEN};

/// Identity of a tenant: the key id of its secret (all zero when the server runs without
/// tokens).
pub type TenantId = [u8; 8];

#[derive(Clone, Copy)]
struct Entry {
    slot: Slot,
    crc: u32,
    seal: [u8; SEAL_LEN],
}

/// A wire page's parts: its crc32c, its seal and its data.
fn split_wire(wp: &[u8]) -> (u32, &[u8; SEAL_LEN], &[u8]) {
    let crc = u32::from_le_bytes([wp[0], wp[1], wp[2], wp[3]]);
    let seal = wp[WIRE_SEAL_AT..WIRE_DATA_AT]
        .try_into()
        .unwrap_or(&[0; SEAL_LEN]);
    (crc, seal, &wp[WIRE_DATA_AT..])
}

fn is_sealed(seal: &[u8; SEAL_LEN]) -> bool {
    seal.iter().any(|&b| b != 0)
}

/// A granted slab's memory: [`GRANT_SLAB_PAGES`] contiguous arena slots and a page-table
/// slot. Returned to the arena when the last holder (the namespace, or an RDMA session that
/// registered it) drops it, so registered memory is never handed to another namespace.
pub struct Extent {
    arena: Arc<Arena>,
    first: Slot,
}

impl Extent {
    /// The slab's first byte; `len()` bytes follow (pages, then the page table).
    pub fn ptr(&self) -> *mut u8 {
        self.arena.slot_ptr(self.first)
    }

    /// Bytes of the extent.
    pub fn len(&self) -> usize {
        GRANT_EXTENT_PAGES as usize * PAGE_SIZE
    }

    /// Never empty (an extent has a fixed size).
    pub fn is_empty(&self) -> bool {
        false
    }

    fn page(&self, off: u64) -> *mut u8 {
        self.arena.slot_ptr(self.first + off as u32)
    }

    fn meta(&self, off: u64) -> &AtomicU64 {
        let table = self.arena.slot_ptr(self.first + GRANT_SLAB_PAGES as u32);
        // SAFETY: the page-table slot belongs to this extent for its lifetime; entry `off` <
        // GRANT_SLAB_PAGES is 8-byte aligned (slots are page aligned) and inside the slot.
        // Remote writes by the NIC are plain stores to the same words.
        unsafe { &*(table.cast::<AtomicU64>().add(off as usize)) }
    }

    fn present_count(&self) -> u64 {
        (0..GRANT_SLAB_PAGES)
            .filter(|&o| MetaWord(self.meta(o).load(Ordering::Acquire)).is_present())
            .count() as u64
    }
}

impl Drop for Extent {
    fn drop(&mut self) {
        self.arena
            .free_extent(self.first, GRANT_EXTENT_PAGES as u32);
    }
}

/// A namespace's index: pages in single slots, and granted slabs.
#[derive(Default)]
struct Index {
    pages: FxHashMap<u64, Entry>,
    slabs: FxHashMap<u64, Arc<Extent>>,
}

impl Index {
    /// The extent and offset holding page `idx`, if its slab is granted.
    fn granted(&self, idx: u64) -> Option<(&Extent, u64)> {
        if self.slabs.is_empty() {
            return None;
        }
        let x = self.slabs.get(&(idx / GRANT_SLAB_PAGES))?;
        Some((x, idx % GRANT_SLAB_PAGES))
    }
}

/// One VM's pages.
pub struct Namespace {
    owner: TenantId,
    index: RwLock<Index>,
    /// Reclaimed: out of the store's map and emptied (set under the index's write lock). A
    /// connection may still hold it (its per-session cache): it must look the id up again,
    /// and a write must not land in it, where its slots would be lost to every namespace.
    reclaimed: AtomicBool,
}

impl Namespace {
    /// Whether the pool reclaimed it (see the field).
    pub fn is_reclaimed(&self) -> bool {
        self.reclaimed.load(Ordering::Acquire)
    }
}

/// All namespaces plus the arena.
pub struct Store {
    arena: Arc<Arena>,
    /// This process's instance id (see [`StatInfo::instance`]).
    instance: u64,
    namespaces: RwLock<FxHashMap<u64, Arc<Namespace>>>,
    /// Namespaces the pool reclaimed ([`Store::reclaim_namespace`]), refused from then on.
    reclaimed: Mutex<Fence>,
}

/// The reclaimed namespaces, the oldest forgotten past [`Fence::CAPACITY`] (a namespace is
/// one VM run's: after a million later reclaims, a VMM still paused from then is not
/// expected).
#[derive(Default)]
struct Fence {
    set: FxHashSet<u64>,
    order: VecDeque<u64>,
}

impl Fence {
    const CAPACITY: usize = 1 << 20;

    fn insert(&mut self, id: u64) {
        if self.set.insert(id) {
            self.order.push_back(id);
            if self.order.len() > Self::CAPACITY {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

impl Store {
    /// A store over `arena`.
    pub fn new(arena: Arena) -> Self {
        Self {
            arena: Arc::new(arena),
            instance: u64::from_le_bytes(farvm_memproto::auth::random_bytes::<8>()),
            namespaces: RwLock::new(FxHashMap::default()),
            reclaimed: Mutex::new(Fence::default()),
        }
    }

    /// Server occupancy (namespace field zero).
    pub fn occupancy(&self) -> StatInfo {
        StatInfo {
            namespace_pages: 0,
            used_pages: self.arena.used(),
            capacity_pages: self.arena.capacity(),
            instance: self.instance,
        }
    }

    /// Looks a namespace up for `tenant`. With `create`, a missing namespace is created and
    /// owned by `tenant`. `Ok(None)`: absent and not created. `Err(Denied)`: another owner.
    /// `Err(Reclaimed)`: the pool reclaimed it (checked only when it is not held, so the
    /// request path of a live namespace never takes the fence's lock).
    pub fn namespace(
        &self,
        id: u64,
        tenant: TenantId,
        create: bool,
    ) -> Result<Option<Arc<Namespace>>, Status> {
        {
            let map = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
            if let Some(ns) = map.get(&id) {
                return if ns.owner == tenant {
                    Ok(Some(ns.clone()))
                } else {
                    Err(Status::Denied)
                };
            }
        }
        if !create {
            return if self.is_reclaimed(id) {
                Err(Status::Reclaimed)
            } else {
                Ok(None)
            };
        }
        let mut map = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
        // Checked under the map's lock: `reclaim_namespace` fences before it removes, so a
        // namespace reclaimed meanwhile is seen here, never created again.
        if self.is_reclaimed(id) {
            return Err(Status::Reclaimed);
        }
        let ns = map.entry(id).or_insert_with(|| {
            Arc::new(Namespace {
                owner: tenant,
                index: RwLock::new(Index::default()),
                reclaimed: AtomicBool::new(false),
            })
        });
        if ns.owner == tenant {
            Ok(Some(ns.clone()))
        } else {
            Err(Status::Denied)
        }
    }

    /// Appends the READ response body (bitmap, then present wire pages) to `out`; returns the
    /// number of present pages.
    pub fn read(&self, ns: Option<&Namespace>, sel: &PageSel<'_>, out: &mut Vec<u8>) -> usize {
        let n = sel.len();
        let bm_at = out.len();
        out.resize(bm_at + n.div_ceil(8), 0);
        let Some(ns) = ns else { return 0 };
        let index = ns.index.read().unwrap_or_else(|e| e.into_inner());
        let mut present = 0;
        for i in 0..n {
            let idx = sel.index(i);
            if let Some((x, off)) = index.granted(idx) {
                let m = MetaWord(x.meta(off).load(Ordering::Acquire));
                if m.is_present() {
                    out[bm_at + i / 8] |= 1 << (i % 8);
                    out.extend_from_slice(&unsealed_wire_crc(m.crc()).to_le_bytes());
                    out.extend_from_slice(&[0; SEAL_LEN]);
                    // SAFETY: the extent's page, 4 KiB inside it, held alive by the index we
                    // have read-locked. A concurrent one-sided write may change the bytes; the
                    // crc32c, checked by the reader, tells.
                    let page = unsafe { std::slice::from_raw_parts(x.page(off), PAGE_SIZE) };
                    out.extend_from_slice(page);
                    present += 1;
                }
            } else if let Some(e) = index.pages.get(&idx) {
                out[bm_at + i / 8] |= 1 << (i % 8);
                out.extend_from_slice(&e.crc.to_le_bytes());
                out.extend_from_slice(&e.seal);
                // SAFETY: the slot belongs to this namespace's index and we hold its read lock,
                // so no writer modifies or frees it while we copy (see module doc).
                let page =
                    unsafe { std::slice::from_raw_parts(self.arena.slot_ptr(e.slot), PAGE_SIZE) };
                out.extend_from_slice(page);
                present += 1;
            }
        }
        present
    }

    /// Stores a WRITE batch all-or-nothing. `pages` holds `sel.len()` wire pages.
    pub fn write(
        &self,
        ns: &Namespace,
        sel: &PageSel<'_>,
        pages: &[u8],
        if_absent: bool,
    ) -> Result<u32, Status> {
        let n = sel.len();
        // Verify every checksum (over seal and data) before touching anything, so a corrupt
        // batch stores nothing.
        for i in 0..n {
            let wp = &pages[i * WIRE_PAGE..(i + 1) * WIRE_PAGE];
            if page_crc(&wp[WIRE_SEAL_AT..]) != split_wire(wp).0 {
                return Err(Status::ChecksumMismatch);
            }
        }
        let mut index = ns.index.write().unwrap_or_else(|e| e.into_inner());
        if ns.is_reclaimed() {
            return Err(Status::Reclaimed);
        }
        // A granted slab keeps no seals: a sealed page there would come back unauthentic.
        for i in 0..n {
            let wp = &pages[i * WIRE_PAGE..(i + 1) * WIRE_PAGE];
            if index.granted(sel.index(i)).is_some() && is_sealed(split_wire(wp).1) {
                return Err(Status::BadRequest);
            }
        }
        // Count pages needing a new slot (a scatter list may repeat an index: count it once).
        let scatter = matches!(sel, PageSel::Scatter(_));
        let mut new = 0u64;
        for i in 0..n {
            let idx = sel.index(i);
            let repeated = scatter && (0..i).any(|j| sel.index(j) == idx);
            if index.granted(idx).is_none() && !index.pages.contains_key(&idx) && !repeated {
                new += 1;
            }
        }
        if !self.arena.reserve(new) {
            return Err(Status::CapacityExhausted);
        }
        let mut written = 0;
        for i in 0..n {
            let wp = &pages[i * WIRE_PAGE..(i + 1) * WIRE_PAGE];
            let (crc, seal, data) = split_wire(wp);
            let idx = sel.index(i);
            if let Some((x, off)) = index.granted(idx) {
                let meta = x.meta(off);
                if if_absent && MetaWord(meta.load(Ordering::Acquire)).is_present() {
                    continue;
                }
                // SAFETY: the extent's page, held alive by the write-locked index; the source
                // is a distinct buffer of exactly PAGE_SIZE bytes.
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), x.page(off), PAGE_SIZE) };
                // The page table holds the data's crc (one-sided readers check the data
                // alone); the wire crc over the zero seal and the data was verified above.
                meta.store(MetaWord::present(page_crc(data)).0, Ordering::Release);
                written += 1;
                continue;
            }
            let slot = match index.pages.get_mut(&idx) {
                Some(_) if if_absent => continue,
                Some(e) => {
                    e.crc = crc;
                    e.seal = *seal;
                    e.slot
                }
                None => {
                    let slot = self.arena.take();
                    let seal = *seal;
                    index.pages.insert(idx, Entry { slot, crc, seal });
                    slot
                }
            };
            // SAFETY: the slot is owned by this namespace's index and we hold its write lock;
            // the source is a distinct buffer of exactly PAGE_SIZE bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), self.arena.slot_ptr(slot), PAGE_SIZE)
            };
            written += 1;
        }
        Ok(written)
    }

    /// Drops pages; returns how many existed.
    pub fn discard(&self, ns: &Namespace, sel: &PageSel<'_>) -> u32 {
        let mut index = ns.index.write().unwrap_or_else(|e| e.into_inner());
        let mut freed = 0;
        for i in 0..sel.len() {
            let idx = sel.index(i);
            if let Some((x, off)) = index.granted(idx) {
                let was = x.meta(off).swap(MetaWord::ABSENT.0, Ordering::AcqRel);
                freed += MetaWord(was).is_present() as u32;
            } else if let Some(e) = index.pages.remove(&idx) {
                self.arena.free(e.slot);
                freed += 1;
            }
        }
        freed
    }

    /// Drops a whole namespace, whoever owns it, frees its pages and refuses the id from then
    /// on (`Status::Reclaimed`), also to connections that still hold it: the pool reclaimed
    /// it, and a VMM that comes back late (paused past its lease) must not recreate it with
    /// its stale write-backs. Returns the pages it held. The pool's garbage collector does
    /// this for a VM whose lease expired or that released its placement (this server acts on
    /// the pool's word, not on a client's, so no tenant check applies).
    pub fn reclaim_namespace(&self, id: u64) -> u64 {
        // Fenced first: a lookup that misses the map from now on is refused.
        self.reclaimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id);
        let Some(ns) = self
            .namespaces
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id)
        else {
            return 0;
        };
        let mut index = ns.index.write().unwrap_or_else(|e| e.into_inner());
        ns.reclaimed.store(true, Ordering::Release);
        let mut freed = index.pages.len() as u64;
        for (_, e) in index.pages.drain() {
            self.arena.free(e.slot);
        }
        for (_, x) in index.slabs.drain() {
            freed += x.present_count();
            // An RDMA session may still hold the extent registered: its client now finds the
            // pages absent, as over TCP.
            for off in 0..GRANT_SLAB_PAGES {
                x.meta(off).store(MetaWord::ABSENT.0, Ordering::Release);
            }
        }
        freed
    }

    /// Whether the pool reclaimed namespace `id`.
    pub fn is_reclaimed(&self, id: u64) -> bool {
        self.reclaimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set
            .contains(&id)
    }

    /// The ids of every namespace held (a pool member checks them against the pool's owners).
    pub fn namespace_ids(&self) -> Vec<u64> {
        self.namespaces
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .copied()
            .collect()
    }

    /// Pages in a namespace.
    pub fn namespace_pages(&self, ns: Option<&Namespace>) -> u64 {
        ns.map_or(0, |ns| {
            let index = ns.index.read().unwrap_or_else(|e| e.into_inner());
            index.pages.len() as u64 + index.slabs.values().map(|x| x.present_count()).sum::<u64>()
        })
    }

    /// Grants slab `slab` of `ns` for one-sided access: moves its pages into a contiguous
    /// [`Extent`] (reserving the whole extent's capacity) the first time, and returns it.
    pub fn grant(&self, ns: &Namespace, slab: u64) -> Result<Arc<Extent>, Status> {
        if slab > u64::MAX / GRANT_SLAB_PAGES {
            return Err(Status::BadRequest);
        }
        let mut index = ns.index.write().unwrap_or_else(|e| e.into_inner());
        if let Some(x) = index.slabs.get(&slab) {
            return Ok(x.clone());
        }
        // An extent keeps no seals: a slab holding sealed pages stays in single slots.
        let first_page = slab * GRANT_SLAB_PAGES;
        if (first_page..first_page + GRANT_SLAB_PAGES)
            .any(|p| index.pages.get(&p).is_some_and(|e| is_sealed(&e.seal)))
        {
            return Err(Status::BadRequest);
        }
        let n = GRANT_EXTENT_PAGES as u32;
        if !self.arena.reserve(n as u64) {
            return Err(Status::CapacityExhausted);
        }
        let Some(first) = self.arena.take_extent(n) else {
            self.arena.unreserve(n as u64);
            return Err(Status::CapacityExhausted);
        };
        let x = Arc::new(Extent {
            arena: self.arena.clone(),
            first,
        });
        for off in 0..GRANT_SLAB_PAGES {
            let m = match index.pages.remove(&(slab * GRANT_SLAB_PAGES + off)) {
                Some(e) => {
                    // SAFETY: the page's slot is owned by this index (write-locked) and the
                    // extent's page is ours; both are 4 KiB and distinct.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            self.arena.slot_ptr(e.slot),
                            x.page(off),
                            PAGE_SIZE,
                        )
                    };
                    // SAFETY: as above; the page is now the extent's.
                    let data = unsafe { std::slice::from_raw_parts(x.page(off), PAGE_SIZE) };
                    self.arena.free(e.slot);
                    // The page table holds the data's crc. One that no longer matches the
                    // crc the writer sent (this server's memory damaged the page) is stored
                    // inverted, so that a reader still sees the mismatch.
                    let d = page_crc(data);
                    MetaWord::present(if unsealed_wire_crc(d) == e.crc { d } else { !d })
                }
                None => MetaWord::ABSENT,
            };
            x.meta(off).store(m.0, Ordering::Release);
        }
        index.slabs.insert(slab, x.clone());
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire_sealed(pages: &[u64], tag: u8, seal: [u8; SEAL_LEN]) -> Vec<u8> {
        let mut out = Vec::new();
        for &p in pages {
            let page = vec![tag ^ p as u8; PAGE_SIZE];
            out.extend_from_slice(&farvm_memproto::wire_crc(&seal, &page).to_le_bytes());
            out.extend_from_slice(&seal);
            out.extend_from_slice(&page);
        }
        out
    }

    fn wire(pages: &[u64], tag: u8) -> Vec<u8> {
        wire_sealed(pages, tag, [0; SEAL_LEN])
    }

    /// A reclaimed namespace is dropped and refused from then on, to reads and to writes that
    /// would recreate it; other namespaces are untouched.
    #[test]
    fn a_reclaimed_namespace_is_refused_for_good() {
        let store = Store::new(Arena::new(64).unwrap());
        for id in [1, 2] {
            let ns = store.namespace(id, [0; 8], true).unwrap().unwrap();
            let sel = PageSel::Run { start: 0, count: 3 };
            assert_eq!(store.write(&ns, &sel, &wire(&[0, 1, 2], 9), false), Ok(3));
        }
        assert_eq!(store.reclaim_namespace(1), 3);
        assert!(store.is_reclaimed(1) && !store.is_reclaimed(2));
        assert_eq!(
            store.namespace(1, [0; 8], true).err(),
            Some(Status::Reclaimed)
        );
        assert_eq!(
            store.namespace(1, [0; 8], false).err(),
            Some(Status::Reclaimed)
        );
        assert_eq!(store.namespace_ids(), vec![2]);
        assert_eq!(store.occupancy().used_pages, 3);
        // A connection still holding namespace 2 when it is reclaimed cannot write into it
        // (its slots would be lost to every namespace).
        let held = store.namespace(2, [0; 8], false).unwrap().unwrap();
        assert_eq!(store.reclaim_namespace(2), 3);
        let sel = PageSel::Run { start: 5, count: 1 };
        assert_eq!(
            store.write(&held, &sel, &wire(&[5], 1), false),
            Err(Status::Reclaimed)
        );
        assert!(held.is_reclaimed());
        assert_eq!(store.occupancy().used_pages, 0);
    }

    /// A granted slab keeps the pages stored before the grant, serves later writes, reads,
    /// discards and counts through its page table, and its capacity comes back with the
    /// namespace.
    #[test]
    fn granted_slabs_hold_their_pages_for_every_path() {
        let store = Store::new(Arena::new(5 * GRANT_EXTENT_PAGES).unwrap());
        let ns = store.namespace(1, [0; 8], true).unwrap().unwrap();
        let run = |start, count| PageSel::Run { start, count };
        store
            .write(
                &ns,
                &run(250, 10),
                &wire(&(250..260).collect::<Vec<_>>(), 1),
                false,
            )
            .unwrap();
        assert_eq!(store.occupancy().used_pages, 10);
        let x = store.grant(&ns, 0).unwrap();
        assert!(
            Arc::ptr_eq(&x, &store.grant(&ns, 0).unwrap()),
            "one extent per slab"
        );
        // Pages 250..256 moved into the extent, 256..260 stay single.
        assert_eq!(store.occupancy().used_pages, 4 + GRANT_EXTENT_PAGES);
        assert_eq!(store.namespace_pages(Some(&ns)), 10);
        assert!(MetaWord(x.meta(255).load(Ordering::Relaxed)).is_present());
        assert!(!MetaWord(x.meta(0).load(Ordering::Relaxed)).is_present());
        // Overwrite through the extent; if_absent leaves present pages alone.
        store
            .write(&ns, &run(254, 2), &wire(&[254, 255], 2), false)
            .unwrap();
        assert_eq!(
            store.write(&ns, &run(254, 3), &wire(&[254, 255, 256], 3), true),
            Ok(0)
        );
        let mut out = Vec::new();
        assert_eq!(store.read(Some(&ns), &run(249, 11), &mut out), 10);
        assert_eq!(out[0], 0b1111_1110);
        let body = &out[2..];
        for (k, p) in (250..260u64).enumerate() {
            let wp = &body[k * WIRE_PAGE..(k + 1) * WIRE_PAGE];
            let tag = if p == 254 || p == 255 { 2 } else { 1 };
            assert_eq!(wp[WIRE_DATA_AT], tag ^ p as u8, "page {p}");
            assert_eq!(split_wire(wp).0, page_crc(&wp[WIRE_SEAL_AT..]));
            assert_eq!(split_wire(wp).1, &[0; SEAL_LEN]);
        }
        // A sealed page has no place in a granted slab: refused, nothing of the batch stored.
        assert_eq!(
            store.write(
                &ns,
                &run(253, 2),
                &wire_sealed(&[253, 254], 4, [7; SEAL_LEN]),
                false
            ),
            Err(Status::BadRequest)
        );
        let mut again = Vec::new();
        store.read(Some(&ns), &run(249, 11), &mut again);
        assert_eq!(again, out);
        assert_eq!(store.discard(&ns, &run(255, 2)), 2);
        assert_eq!(store.namespace_pages(Some(&ns)), 8);
        drop(x);
        assert_eq!(store.reclaim_namespace(1), 8);
        assert_eq!(store.occupancy().used_pages, 0);
        // A slab past the end of the index space is refused. Capacity bounds grants, and so
        // does fragmentation: the ten single slots freed above are not one extent.
        let ns = store.namespace(2, [0; 8], true).unwrap().unwrap();
        assert_eq!(store.grant(&ns, u64::MAX).err(), Some(Status::BadRequest));

        let held: Vec<_> = (0..4).map(|s| store.grant(&ns, s).unwrap()).collect();
        assert_eq!(store.grant(&ns, 9).err(), Some(Status::CapacityExhausted));
        drop(held);
        // A slab holding a sealed page is not granted; the page keeps its seal.
        let sealed = wire_sealed(&[1400], 5, [9; SEAL_LEN]);
        store.write(&ns, &run(1400, 1), &sealed, false).unwrap();
        assert_eq!(store.grant(&ns, 5).err(), Some(Status::BadRequest));
        let mut out = Vec::new();
        assert_eq!(store.read(Some(&ns), &run(1400, 1), &mut out), 1);
        assert_eq!(&out[1..], &sealed[..]);
        assert_eq!(store.discard(&ns, &run(1400, 1)), 1);
    }
}
