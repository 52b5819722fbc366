//! Namespaces (one per VM) and their page index over the arena; tenancy checks.
//!
//! Each namespace has its own `RwLock<page index → (slot, crc)>`: reads of one VM never
//! contend with another VM, and a slot's bytes are only touched under its namespace's lock,
//! so a reader never sees a half-written or recycled slot. The index is a hash map (FxHash);
//! inserting a *new* page may grow it (amortised allocation), reading and overwriting do not.
//! The crc32c sent by the writer is stored and returned verbatim, so corruption anywhere
//! between the writer and the reader (including in this server's memory) is detected end to end.

use std::sync::{Arc, RwLock};

use rustc_hash::FxHashMap;

use super::arena::{Arena, Slot};
use farvm_memproto::frame::WIRE_PAGE;
use farvm_memproto::{page_crc, PageSel, StatInfo, Status, PAGE_SIZE};

/// Identity of a tenant: the key id of its secret (all zero when the server runs without
/// tokens).
pub type TenantId = [u8; 8];

#[derive(Clone, Copy)]
struct Entry {
    slot: Slot,
    crc: u32,
}

/// One VM's pages.
pub struct Namespace {
    owner: TenantId,
    index: RwLock<FxHashMap<u64, Entry>>,
}

/// All namespaces plus the arena.
pub struct Store {
    arena: Arena,
    /// This process's instance id (see [`StatInfo::instance`]).
    instance: u64,
    namespaces: RwLock<FxHashMap<u64, Arc<Namespace>>>,
}

impl Store {
    /// A store over `arena`.
    pub fn new(arena: Arena) -> Self {
        Self {
            arena,
            instance: u64::from_le_bytes(farvm_memproto::auth::random_bytes::<8>()),
            namespaces: RwLock::new(FxHashMap::default()),
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
            return Ok(None);
        }
        let mut map = self.namespaces.write().unwrap_or_else(|e| e.into_inner());
        let ns = map.entry(id).or_insert_with(|| {
            Arc::new(Namespace {
                owner: tenant,
                index: RwLock::new(FxHashMap::default()),
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
            if let Some(e) = index.get(&sel.index(i)) {
                out[bm_at + i / 8] |= 1 << (i % 8);
                out.extend_from_slice(&e.crc.to_le_bytes());
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
        // Verify every checksum before touching anything, so a corrupt batch stores nothing.
        for i in 0..n {
            let wp = &pages[i * WIRE_PAGE..(i + 1) * WIRE_PAGE];
            let crc = u32::from_le_bytes([wp[0], wp[1], wp[2], wp[3]]);
            if page_crc(&wp[4..]) != crc {
                return Err(Status::ChecksumMismatch);
            }
        }
        let mut index = ns.index.write().unwrap_or_else(|e| e.into_inner());
        // Count pages needing a new slot (a scatter list may repeat an index: count it once).
        let scatter = matches!(sel, PageSel::Scatter(_));
        let mut new = 0u64;
        for i in 0..n {
            let idx = sel.index(i);
            let repeated = scatter && (0..i).any(|j| sel.index(j) == idx);
            if !index.contains_key(&idx) && !repeated {
                new += 1;
            }
        }
        if !self.arena.reserve(new) {
            return Err(Status::CapacityExhausted);
        }
        let mut written = 0;
        for i in 0..n {
            let wp = &pages[i * WIRE_PAGE..(i + 1) * WIRE_PAGE];
            let crc = u32::from_le_bytes([wp[0], wp[1], wp[2], wp[3]]);
            let idx = sel.index(i);
            let slot = match index.get_mut(&idx) {
                Some(_) if if_absent => continue,
                Some(e) => {
                    e.crc = crc;
                    e.slot
                }
                None => {
                    let slot = self.arena.take();
                    index.insert(idx, Entry { slot, crc });
                    slot
                }
            };
            // SAFETY: the slot is owned by this namespace's index and we hold its write lock;
            // the source is a distinct buffer of exactly PAGE_SIZE bytes.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    wp[4..].as_ptr(),
                    self.arena.slot_ptr(slot),
                    PAGE_SIZE,
                )
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
            if let Some(e) = index.remove(&sel.index(i)) {
                self.arena.free(e.slot);
                freed += 1;
            }
        }
        freed
    }

    /// Pages in a namespace.
    pub fn namespace_pages(&self, ns: Option<&Namespace>) -> u64 {
        ns.map_or(0, |ns| {
            ns.index.read().unwrap_or_else(|e| e.into_inner()).len() as u64
        })
    }
}
