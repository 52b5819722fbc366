//! Reading a guest virtual address the way the MMU would: a 4-level x86-64 walk of page
//! tables in guest RAM (2 MiB and 1 GiB leaves included). Used to show the instruction a
//! crashed or stuck vCPU was at, and by the test guest's boot tests.

use vm_memory::{Bytes, GuestAddress};

use super::memory::GuestRam;

const PTE_P: u64 = 1 << 0;
const PTE_PS: u64 = 1 << 7;

/// Walks the page tables rooted at `cr3` in guest memory like the MMU would (4-level; 4 KiB,
/// 2 MiB or 1 GiB leaves) and returns the guest-physical address for `va`, if mapped.
pub fn translate(ram: &GuestRam, cr3: u64, va: u64) -> Option<u64> {
    let mut table = cr3 & 0x000f_ffff_ffff_f000;
    for level in (0..4).rev() {
        let idx = (va >> (12 + 9 * level)) & 511;
        let e: u64 = ram.read_obj(GuestAddress(table + idx * 8)).ok()?;
        if e & PTE_P == 0 {
            return None;
        }
        let addr = e & 0x000f_ffff_ffff_f000;
        if level == 0 || (level <= 2 && e & PTE_PS != 0) {
            let page_mask = (1u64 << (12 + 9 * level)) - 1;
            return Some((addr & !page_mask) | (va & page_mask));
        }
        table = addr;
    }
    None
}
