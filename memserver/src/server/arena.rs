//! The page arena: one anonymous `MAP_NORESERVE` mapping cut into 4 KiB slots, with a free
//! list. No heap allocation per page; memory is committed by the kernel on first write of a
//! slot, so a large `--capacity` costs nothing until it is used.
//!
//! Capacity is enforced by reservation (`reserve`) before any slot is taken, so a full server
//! answers `CapacityExhausted` instead of being OOM-killed by overcommit.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use farvm_memproto::PAGE_SIZE;

/// Arena creation failures.
#[derive(Debug, thiserror::Error)]
pub enum ArenaError {
    /// Capacity 0 or above the 2^32-slot limit of the slot index.
    #[error("capacity of {0} pages is outside 1..=2^32-1")]
    BadCapacity(u64),
    /// mmap failed.
    #[error("mmap of {bytes} bytes failed")]
    Mmap {
        /// Requested size.
        bytes: usize,
        /// errno.
        source: std::io::Error,
    },
}

/// A slot number in the arena.
pub type Slot = u32;

/// The mapping plus its allocator.
pub struct Arena {
    base: *mut u8,
    slots: u32,
    /// Slots handed out at least once; slots ≥ this were never used (bump allocation).
    fresh: AtomicU32,
    /// Slots given back; reused first. Only touched when pages are created or discarded.
    freed: Mutex<Vec<Slot>>,
    /// Extents (contiguous runs of slots, see [`Arena::take_extent`]) given back, by length.
    freed_extents: Mutex<Vec<(Slot, u32)>>,
    /// Slots reserved or in use; never above `slots`.
    used: AtomicU64,
}

// SAFETY: the arena hands out disjoint slots; callers synchronise access to each slot's bytes
// (the store holds the owning namespace's lock while touching a slot), so sharing the base
// pointer between threads is sound.
unsafe impl Send for Arena {}
// SAFETY: see `Send`; all allocator state is atomics or behind a mutex.
unsafe impl Sync for Arena {}

impl Arena {
    /// Maps an arena of `pages` slots.
    pub fn new(pages: u64) -> Result<Self, ArenaError> {
        if pages == 0 || pages > u32::MAX as u64 {
            return Err(ArenaError::BadCapacity(pages));
        }
        let bytes = pages as usize * PAGE_SIZE;
        // SAFETY: anonymous private mapping with no address hint; the kernel picks the address
        // and we check for MAP_FAILED. NORESERVE: commit on touch, capacity is enforced above.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ArenaError::Mmap {
                bytes,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(Self {
            base: p.cast(),
            slots: pages as u32,
            fresh: AtomicU32::new(0),
            freed: Mutex::new(Vec::new()),
            freed_extents: Mutex::new(Vec::new()),
            used: AtomicU64::new(0),
        })
    }

    /// Capacity in pages.
    pub fn capacity(&self) -> u64 {
        self.slots as u64
    }

    /// Pages in use or reserved.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserves `n` slots; false (and nothing reserved) if that would pass capacity.
    pub fn reserve(&self, n: u64) -> bool {
        let cap = self.slots as u64;
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                u.checked_add(n).filter(|&t| t <= cap)
            })
            .is_ok()
    }

    /// Gives back `n` reservations that were not turned into slots.
    pub fn unreserve(&self, n: u64) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }

    /// Takes a slot covered by an earlier `reserve`: a freed slot, else a never-used one, else
    /// one cut from a freed extent. Never fails: reservations bound the count.
    pub fn take(&self) -> Slot {
        let mut freed = self.freed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = freed.pop() {
            return s;
        }
        if let Ok(s) = self
            .fresh
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |f| {
                (f < self.slots).then_some(f + 1)
            })
        {
            return s;
        }
        let (first, n) = self
            .freed_extents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .expect("take() without reserve(): no slot left anywhere in the arena");
        freed.extend(first + 1..first + n);
        first
    }

    /// Returns a slot and its reservation.
    pub fn free(&self, s: Slot) {
        self.freed.lock().unwrap_or_else(|e| e.into_inner()).push(s);
        self.used.fetch_sub(1, Ordering::AcqRel);
    }

    /// Takes `n` contiguous slots covered by an earlier `reserve(n)`: a freed extent of that
    /// length, else never-used slots. `None` when neither exists (the never-used slots ran
    /// out while single freed slots remain): the caller gives the reservation back.
    pub fn take_extent(&self, n: u32) -> Option<Slot> {
        {
            let mut fe = self.freed_extents.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = fe.iter().position(|&(_, len)| len == n) {
                return Some(fe.swap_remove(i).0);
            }
        }
        self.fresh
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |f| {
                f.checked_add(n).filter(|&end| end <= self.slots)
            })
            .ok()
    }

    /// Returns an extent of `n` slots taken with [`Arena::take_extent`], and its reservation.
    pub fn free_extent(&self, first: Slot, n: u32) {
        self.freed_extents
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((first, n));
        self.used.fetch_sub(n as u64, Ordering::AcqRel);
    }

    /// Raw pointer to a slot's first byte.
    ///
    /// The caller must hold the lock that owns `s` (see the `Sync` impl) while using it.
    pub fn slot_ptr(&self, s: Slot) -> *mut u8 {
        assert!(s < self.slots, "slot {s} out of range");
        // SAFETY: s < slots, so the offset stays inside the mapping.
        unsafe { self.base.add(s as usize * PAGE_SIZE) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: base/len are exactly what mmap returned; no slot pointer outlives the arena
        // because the store owning it is dropped first.
        unsafe {
            libc::munmap(self.base.cast(), self.slots as usize * PAGE_SIZE);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_take_free_respects_capacity() {
        let a = Arena::new(3).unwrap();
        assert!(a.reserve(2));
        assert!(!a.reserve(2));
        let s0 = a.take();
        let s1 = a.take();
        assert_ne!(s0, s1);
        assert!(a.reserve(1));
        let s2 = a.take();
        assert_eq!(a.used(), 3);
        assert!(!a.reserve(1));
        a.free(s1);
        assert!(a.reserve(1));
        assert_eq!(a.take(), s1);
        let _ = s2;
        assert!(Arena::new(0).is_err());
    }

    #[test]
    fn extents_are_contiguous_reused_and_bounded() {
        let a = Arena::new(10).unwrap();
        assert!(a.reserve(1));
        let single = a.take();
        assert!(a.reserve(4));
        let e = a.take_extent(4).unwrap();
        assert!(e > single);
        assert!(a.reserve(4));
        let e2 = a.take_extent(4).unwrap();
        assert_eq!(e2, e + 4, "extents are cut from never-used slots");
        assert_eq!(a.used(), 9);
        a.free_extent(e, 4);
        assert_eq!(a.used(), 5);
        assert!(a.reserve(4));
        assert_eq!(a.take_extent(4), Some(e), "a freed extent is reused");
        a.free(single);
        assert!(a.reserve(1));
        // One slot left, but not contiguous with room for 2 more.
        assert_eq!(a.take_extent(2), None);
        a.unreserve(1);
        // Single slots are cut from freed extents once the never-used ones ran out.
        a.free_extent(e2, 4);
        assert!(a.reserve(5));
        let mut got: Vec<Slot> = (0..5).map(|_| a.take()).collect();
        got.sort_unstable();
        assert_eq!(got, vec![single, e2, e2 + 2, e2 + 3, 9]);
    }
}
