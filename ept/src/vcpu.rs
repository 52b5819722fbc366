//! Fault attribution: faulting thread id -> vCPU index (registered by the VMM) -> that vCPU's
//! agent slot in guest RAM -> the process key (CR3) the prefetcher keys its history by.
//!
//! The slot is read through the engine's alias mapping with the guest's seqlock protocol
//! (`farvm_guest_agent::slot`); its page is pinned resident so the read never needs I/O. A
//! slot page that is replaced or cleared is handed back for unpinning only once no fault
//! reads it any more ([`VcpuTable::replace_slot_page`]): unpinned under a read, it could be
//! evicted (and, with anonymous backing, mapped back in by the read) mid-eviction.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use farvm_guest_agent::slot::{AgentSlot, SLOT_MAGIC};

/// vCPUs the table can hold.
pub const MAX_VCPUS: usize = 64;
const NO_SLOT: u64 = u64::MAX;

/// Lock-free registry; lookups scan a fixed array (a handful of vCPUs, no hashing needed).
pub struct VcpuTable {
    /// `tid + 1` per vCPU index (0 = unregistered).
    tids: [AtomicU64; MAX_VCPUS],
    /// Guest page of the agent slot per vCPU, `NO_SLOT` if none.
    slots: [AtomicU64; MAX_VCPUS],
    /// Per vCPU, attributions reading its slot page right now.
    readers: [AtomicU32; MAX_VCPUS],
}

/// Offsets of the fields read at fault time (pinned by the ABI's const assertions).
const OFF_MAGIC: usize = core::mem::offset_of!(AgentSlot, magic);
const OFF_GEN: usize = core::mem::offset_of!(AgentSlot, generation);
const OFF_PID: usize = core::mem::offset_of!(AgentSlot, pid);
const OFF_CR3: usize = core::mem::offset_of!(AgentSlot, cr3);

/// What the slot said at fault time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attribution {
    /// The vCPU whose thread faulted, if registered.
    pub vcpu: Option<u32>,
    /// The vCPU has an agent slot registered.
    pub slot: bool,
    /// The guest process id its agent slot published (0: unknown).
    pub pid: u64,
    /// That process's page-table root (0: unknown / kernel).
    pub cr3: u64,
}

impl Attribution {
    /// The CR3 the slot published, which names the address space (the page space turns it
    /// into the prefetcher's process key); 0 = no process known (no vCPU, no slot): the
    /// global history.
    pub fn key(&self) -> u64 {
        self.cr3
    }

    /// Why no process can be named, if none can (per-process statistics).
    pub fn unattributed(&self) -> Option<crate::procstats::Unattributed> {
        use crate::procstats::Unattributed;
        match (self.vcpu, self.slot, self.cr3) {
            (None, ..) => Some(Unattributed::NoVcpu),
            (_, false, _) => Some(Unattributed::NoSlot),
            (_, true, 0) => Some(Unattributed::Unreadable),
            _ => None,
        }
    }
}

impl Default for VcpuTable {
    fn default() -> Self {
        Self::new()
    }
}

impl VcpuTable {
    /// An empty table (no vCPU registered).
    pub fn new() -> Self {
        Self {
            tids: std::array::from_fn(|_| AtomicU64::new(0)),
            slots: std::array::from_fn(|_| AtomicU64::new(NO_SLOT)),
            readers: std::array::from_fn(|_| AtomicU32::new(0)),
        }
    }

    /// Registers host thread `tid` as vCPU `vcpu` (its faults are attributed to it).
    pub fn set_tid(&self, vcpu: usize, tid: u32) {
        self.tids[vcpu].store(tid as u64 + 1, Ordering::Release);
    }

    /// The thread registered for `vcpu`, if any.
    pub fn tid(&self, vcpu: usize) -> Option<u32> {
        let t = self.tids.get(vcpu)?.load(Ordering::Acquire);
        t.checked_sub(1).map(|t| t as u32)
    }

    /// Makes `page` (None: no page) `vcpu`'s agent slot page and returns the previous one, if
    /// any, once no attribution still reads it: the caller may unpin it then.
    pub fn replace_slot_page(&self, vcpu: usize, page: Option<u64>) -> Option<u64> {
        // SeqCst with the reader's count-then-load in `attribute`: either the reader counted
        // itself before this swap (waited for below) or it loads the new page.
        let old = self.slots[vcpu].swap(page.unwrap_or(NO_SLOT), Ordering::SeqCst);
        while self.readers[vcpu].load(Ordering::SeqCst) != 0 {
            // A read of 48 bytes: a few hundred nanoseconds.
            std::thread::yield_now();
        }
        (old != NO_SLOT).then_some(old)
    }

    /// The guest page of `vcpu`'s agent slot, if one is registered.
    pub fn slot_page(&self, vcpu: usize) -> Option<u64> {
        let p = self.slots[vcpu].load(Ordering::SeqCst);
        (p != NO_SLOT).then_some(p)
    }

    /// The vCPU thread `tid` belongs to.
    pub fn vcpu_of(&self, tid: u32) -> Option<u32> {
        let want = tid as u64 + 1;
        self.tids
            .iter()
            .position(|t| t.load(Ordering::Relaxed) == want)
            .map(|i| i as u32)
    }

    /// Attributes a fault by thread id. `slot_ptr(page)` gives the alias address of a pinned
    /// slot page.
    ///
    /// # Safety
    /// `slot_ptr` must return a pointer to 4 KiB of readable, resident memory for every
    /// registered slot page (see [`read_slot`]).
    pub unsafe fn attribute(&self, tid: u32, slot_ptr: impl Fn(u64) -> *const u8) -> Attribution {
        let Some(vcpu) = self.vcpu_of(tid) else {
            return Attribution::default();
        };
        let mut a = Attribution {
            vcpu: Some(vcpu),
            ..Default::default()
        };
        // Counted as a reader before the page is loaded: it stays pinned until the count drops.
        let readers = &self.readers[vcpu as usize];
        readers.fetch_add(1, Ordering::SeqCst);
        if let Some(page) = self.slot_page(vcpu as usize) {
            a.slot = true;
            // SAFETY: forwarded from this function's contract.
            if let Some((pid, cr3)) = unsafe { read_slot(slot_ptr(page)) } {
                a.pid = pid;
                a.cr3 = cr3;
            }
        }
        readers.fetch_sub(1, Ordering::Release);
        a
    }
}

/// Seqlock read of `(pid, cr3)` from an [`AgentSlot`] at `base`; `None` if the slot is not
/// initialised or stays mid-update for a few retries (the caller then attributes to "unknown").
///
/// # Safety
/// `base` must point at the start of 4 KiB of readable memory, 8-byte aligned, that stays
/// mapped during the call (a pinned page of the engine's alias mapping). The guest may write it
/// concurrently: it is only read with atomic loads.
pub unsafe fn read_slot(base: *const u8) -> Option<(u64, u64)> {
    // SAFETY: per the function contract; the offsets are inside AgentSlot (48 bytes) and
    // 8-byte aligned, and concurrent guest writes are why these are atomics.
    let field = |off: usize| unsafe { &*(base.add(off) as *const AtomicU64) };
    if field(OFF_MAGIC).load(Ordering::Relaxed) != SLOT_MAGIC {
        return None;
    }
    for _ in 0..8 {
        let g1 = field(OFF_GEN).load(Ordering::Acquire);
        if g1 & 1 == 1 {
            std::hint::spin_loop();
            continue;
        }
        let pid = field(OFF_PID).load(Ordering::Acquire);
        let cr3 = field(OFF_CR3).load(Ordering::Acquire);
        std::sync::atomic::fence(Ordering::Acquire);
        if field(OFF_GEN).load(Ordering::Relaxed) == g1 {
            return Some((pid, cr3));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C, align(4096))]
    struct Page([u8; 4096]);

    #[test]
    fn attributes_by_tid_through_the_slot() {
        let mut page = Page([0; 4096]);
        let slot = AgentSlot {
            magic: SLOT_MAGIC,
            generation: 4,
            cpu: 1,
            version: 1,
            pid: 7,
            cr3: 0x5000,
            switches: 2,
        };
        // SAFETY: the page is 4096 bytes, aligned, and AgentSlot is 48 bytes of plain data.
        unsafe { core::ptr::write(page.0.as_mut_ptr() as *mut AgentSlot, slot) };
        let t = VcpuTable::new();
        t.set_tid(1, 4242);
        t.replace_slot_page(1, Some(9));
        let base = page.0.as_ptr();
        // SAFETY: `base` is the 4 KiB page above, alive for the whole test.
        let a = unsafe {
            t.attribute(4242, |p| {
                assert_eq!(p, 9);
                base
            })
        };
        assert_eq!(
            a,
            Attribution {
                vcpu: Some(1),
                slot: true,
                pid: 7,
                cr3: 0x5000
            }
        );
        assert_eq!(a.unattributed(), None);
        // SAFETY: as above.
        assert_eq!(unsafe { t.attribute(1, |_| base) }, Attribution::default());
        // Mid-update (odd generation): unknown process, vCPU still known.
        // SAFETY: same page, writing the generation field in place.
        unsafe { (*(page.0.as_mut_ptr() as *mut AgentSlot)).generation = 5 };
        // SAFETY: as above.
        let a = unsafe { t.attribute(4242, |_| page.0.as_ptr()) };
        assert_eq!((a.vcpu, a.cr3), (Some(1), 0));
        assert_eq!(
            a.unattributed(),
            Some(crate::procstats::Unattributed::Unreadable)
        );
    }

    #[test]
    fn a_replaced_slot_page_is_handed_back_only_once_no_attribution_reads_it() {
        use std::sync::{mpsc, Arc};
        let page = Arc::new(Page([0; 4096]));
        let t = Arc::new(VcpuTable::new());
        t.set_tid(0, 55);
        assert_eq!(t.replace_slot_page(0, Some(5)), None);
        let (inside_tx, inside) = mpsc::channel();
        let (go, go_rx) = mpsc::channel::<()>();
        let reader = {
            let (t, page) = (t.clone(), page.clone());
            std::thread::spawn(move || {
                // SAFETY: the page is 4 KiB, aligned, alive as long as this thread's Arc.
                unsafe {
                    t.attribute(55, |p| {
                        assert_eq!(p, 5);
                        inside_tx.send(()).unwrap();
                        go_rx.recv().unwrap();
                        page.0.as_ptr()
                    })
                }
            })
        };
        inside.recv().unwrap();
        // The guest agent unregisters the slot while a fault reads it.
        let clearer = {
            let t = t.clone();
            std::thread::spawn(move || t.replace_slot_page(0, None))
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(
            !clearer.is_finished(),
            "the old slot page was handed back for unpinning while a fault read it"
        );
        go.send(()).unwrap();
        assert_eq!(reader.join().unwrap().vcpu, Some(0));
        assert_eq!(clearer.join().unwrap(), Some(5));
        assert_eq!(t.slot_page(0), None);
    }

    /// A guest without an agent (a Linux guest before its agent module registers a slot):
    /// the vCPU is known, the process is not, so the key is the global history's.
    #[test]
    fn a_vcpu_without_an_agent_slot_has_no_process_key() {
        let t = VcpuTable::new();
        t.set_tid(0, 77);
        // SAFETY: no slot is registered, so the pointer function is never called.
        let a = unsafe { t.attribute(77, |_| unreachable!("no slot page is registered")) };
        assert_eq!(
            a,
            Attribution {
                vcpu: Some(0),
                slot: false,
                pid: 0,
                cr3: 0
            }
        );
        assert_eq!(a.key(), crate::translate::GLOBAL_KEY);
    }
}
