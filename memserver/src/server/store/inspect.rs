//! The store seen from outside its protocol: a stored page as the server holds it (crc32c,
//! seal, data), read out and written over in place. This is what a compromised memory server
//! can do to the pages it holds — show them to someone, alter them (fixing the crc32c, as an
//! attacker would), swap them between page numbers or namespaces, roll them back to an older
//! copy — and what the tests of the VMM's page sealing do to prove it is caught
//! (docs/sealing.md). The server itself never calls it.

use std::sync::atomic::Ordering;

use farvm_memproto::{wire_crc, PAGE_SIZE, SEAL_LEN};

use super::Store;

/// One stored page: what a READ of it returns.
#[derive(Clone, PartialEq, Eq)]
pub struct StoredPage {
    /// Its crc32c, over seal and data, as the writer sent it.
    pub crc: u32,
    /// Its seal (zero for an unsealed page).
    pub seal: [u8; SEAL_LEN],
    /// Its 4096 bytes.
    pub data: Box<[u8; PAGE_SIZE]>,
}

impl StoredPage {
    /// Sets the crc32c to match the seal and data as they are now: what an attacker does
    /// after altering them, so that only the seal can tell.
    pub fn fix_crc(&mut self) {
        self.crc = wire_crc(&self.seal, &self.data[..]);
    }
}

impl std::fmt::Debug for StoredPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredPage")
            .field("crc", &format_args!("{:#010x}", self.crc))
            .finish_non_exhaustive()
    }
}

impl Store {
    /// A copy of page `page` of namespace `ns` as stored, if it is (in single slots only: a
    /// slab granted for one-sided RDMA holds unsealed pages).
    pub fn stored_page(&self, ns: u64, page: u64) -> Option<StoredPage> {
        let map = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        let ns = map.get(&ns)?;
        let index = ns.index.read().unwrap_or_else(|e| e.into_inner());
        let e = index.pages.get(&page)?;
        let mut data = Box::new([0u8; PAGE_SIZE]);
        // SAFETY: the slot belongs to this namespace's index, whose read lock we hold (no
        // writer touches or frees it meanwhile); 4 KiB into a distinct buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(self.arena.slot_ptr(e.slot), data.as_mut_ptr(), PAGE_SIZE)
        };
        Some(StoredPage {
            crc: e.crc,
            seal: e.seal,
            data,
        })
    }

    /// Overwrites stored page `page` of namespace `ns` with `with` (crc32c, seal and data as
    /// given, unchecked); false if the page is not stored in a single slot.
    pub fn overwrite_page(&self, ns: u64, page: u64, with: &StoredPage) -> bool {
        let map = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        let Some(ns) = map.get(&ns) else {
            return false;
        };
        if ns.reclaimed.load(Ordering::Acquire) {
            return false;
        }
        let mut index = ns.index.write().unwrap_or_else(|e| e.into_inner());
        let Some(e) = index.pages.get_mut(&page) else {
            return false;
        };
        e.crc = with.crc;
        e.seal = with.seal;
        // SAFETY: the slot belongs to this namespace's index, whose write lock we hold; the
        // source is a distinct 4 KiB buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                with.data.as_ptr(),
                self.arena.slot_ptr(e.slot),
                PAGE_SIZE,
            )
        };
        true
    }

    /// The page numbers namespace `ns` holds in single slots, ascending.
    pub fn stored_pages(&self, ns: u64) -> Vec<u64> {
        let map = self.namespaces.read().unwrap_or_else(|e| e.into_inner());
        let Some(ns) = map.get(&ns) else {
            return Vec::new();
        };
        let index = ns.index.read().unwrap_or_else(|e| e.into_inner());
        let mut pages: Vec<u64> = index.pages.keys().copied().collect();
        pages.sort_unstable();
        pages
    }
}
