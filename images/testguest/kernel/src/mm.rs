//! Physical memory and page tables.
//!
//! Two allocators:
//! - the *pool*: a bump allocator over a contiguous block just above the kernel
//!   (`BootInfo::first_free_gpa`), sized at boot for the plan, for kernel objects that must be
//!   contiguous or below 4 GiB: page-table pages, kernel stacks, FPU areas, mailboxes;
//! - the *frame order*: every other frame of RAM, handed out in the seeded shuffled order of
//!   `farvm_guest_agent::frames::FrameOrder` (the model of a long-running OS's free list), for
//!   what processes see: their image, stack and heap. Positions are claimed with one atomic
//!   add; the VMM turns positions into GPAs in bulk (`FRAME_BATCH`), so a 2 MiB heap chunk costs
//!   two port exits instead of ~50,000 emulated instructions. If the VMM lacks the op, the
//!   kernel computes the same order itself (slowly).
//!
//! Frames are not recycled: processes of a test plan run once and never respawn.
//!
//! Page tables are written through the direct map. `FILL_PTES` (VMM writes a table) is only used
//! on a table that is not linked yet, so KVM's shadow paging has never seen it.

use core::mem::MaybeUninit;
use core::ptr::addr_of_mut;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use farvm_guest_agent::frames::FrameOrder;
use farvm_guest_agent::pv::{bulk, status};
use farvm_guest_agent::PAGE_SIZE;

use crate::arch::{image_gpa, phys};
use crate::global::Global;
use crate::pv;

pub const PTE_P: u64 = 1;
pub const PTE_W: u64 = 1 << 1;
pub const PTE_U: u64 = 1 << 2;
pub const PTE_A: u64 = 1 << 5;
pub const PTE_D: u64 = 1 << 6;
pub const PTE_NX: u64 = 1 << 63;
pub const ADDR_MASK: u64 = 0x000F_FFFF_FFFF_F000;
/// Flags of non-leaf entries: the leaf decides the real permissions. Accessed is preset: this
/// kernel never reads A/D bits (no reclaim), and under shadow paging (PVM) a clear bit makes
/// the host emulate the hardware's A/D update on first touch and keeps KVM from prefetching
/// neighbouring shadow entries: 5.4-7.4 µs per first touch instead of about 1 µs (research
/// notes, host-kvm-uffd.md item 4). Linux's direct map presets them too.
const TABLE_FLAGS: u64 = PTE_P | PTE_W | PTE_U | PTE_A;
/// Added to every leaf: see [`TABLE_FLAGS`].
const LEAF_FLAGS: u64 = PTE_P | PTE_A | PTE_D;

/// Out of memory (pool or frames): the plan does not fit in guest RAM.
#[derive(Clone, Copy, Debug)]
pub struct Oom;

static POOL_NEXT: AtomicU64 = AtomicU64::new(0);
static POOL_END: AtomicU64 = AtomicU64::new(0);
static RAM_IS_ZERO: AtomicBool = AtomicBool::new(true);

static ORDER: Global<MaybeUninit<FrameOrder>> = Global::new(MaybeUninit::uninit());
static ORDER_LEN: AtomicU64 = AtomicU64::new(0);
static NEXT_POS: AtomicU64 = AtomicU64::new(0);
/// Cleared when the VMM answers FRAME_BATCH with UNKNOWN_OP.
static PV_FRAMES: AtomicBool = AtomicBool::new(true);
static PV_FILL: AtomicBool = AtomicBool::new(true);
/// (seed, run shift, first free GPA) for FRAME_BATCH's aux operands.
static ORDER_ARGS: Global<[u64; 3]> = Global::new([0; 3]);

/// Per-vCPU scratch page: the frame list of one 2 MiB chunk.
#[repr(C, align(4096))]
struct Scratch([u64; 512]);
static SCRATCH: Global<[Scratch; crate::MAX_CPUS]> =
    Global::new([const { Scratch([0; 512]) }; crate::MAX_CPUS]);

/// Per-vCPU cache of single frames (like Linux's per-CPU page lists): one FRAME_BATCH of up
/// to 512 positions serves the next 512 single-frame allocations on that vCPU without a port
/// exit. Frames left in a cache when the plan ends are simply unused.
#[repr(C, align(4096))]
struct FrameCache {
    list: [u64; 512],
}
static CACHE: Global<[FrameCache; crate::MAX_CPUS]> =
    Global::new([const { FrameCache { list: [0; 512] } }; crate::MAX_CPUS]);
/// (next, count) of each vCPU's cache.
static CACHE_POS: Global<[(u32, u32); crate::MAX_CPUS]> = Global::new([(0, 0); crate::MAX_CPUS]);

/// Sets up both allocators. BSP only, before the APs start.
pub fn init(
    cpu: usize,
    pool_gpa: u64,
    pool_bytes: u64,
    ram_is_zero: bool,
    order: FrameOrder,
    args: [u64; 3],
) {
    POOL_NEXT.store(pool_gpa, Ordering::Relaxed);
    POOL_END.store(pool_gpa + pool_bytes, Ordering::Relaxed);
    RAM_IS_ZERO.store(ram_is_zero, Ordering::Relaxed);
    if !ram_is_zero {
        // One PV op instead of emulated stores: the pool's pages are page tables and must start
        // zeroed.
        pv::zero(cpu, pool_gpa, pool_bytes);
    }
    ORDER_LEN.store(order.len(), Ordering::Relaxed);
    // SAFETY: written once by the BSP before any reader exists (APs wait for BOOT_DONE).
    unsafe {
        (*ORDER.get()).write(order);
        *ORDER_ARGS.get() = args;
    }
}

pub fn ram_is_zero() -> bool {
    RAM_IS_ZERO.load(Ordering::Relaxed)
}

/// Frames left in the shuffled order.
pub fn frames_left() -> u64 {
    ORDER_LEN
        .load(Ordering::Relaxed)
        .saturating_sub(NEXT_POS.load(Ordering::Relaxed))
}

/// `pages` contiguous, zeroed pool pages; returns the GPA.
pub fn pool_alloc(pages: u64) -> Result<u64, Oom> {
    let gpa = POOL_NEXT.fetch_add(pages * PAGE_SIZE, Ordering::Relaxed);
    if gpa + pages * PAGE_SIZE > POOL_END.load(Ordering::Relaxed) {
        return Err(Oom);
    }
    Ok(gpa)
}

/// Claims the next `n` (<= 512) frames of the shuffled order into this vCPU's scratch list.
/// Returns (kernel pointer to the list, its GPA).
fn claim_frames(cpu: usize, n: u64) -> Result<(*mut u64, u64), Oom> {
    // SAFETY: each vCPU uses only its own scratch page.
    let list = unsafe { addr_of_mut!((*SCRATCH.get())[cpu].0) as *mut u64 };
    claim_into(cpu, list, n)?;
    Ok((list, image_gpa(list)))
}

/// Claims the next `n` (<= 512) positions of the shuffled order and writes their frames'
/// GPAs to `list` (a page of this vCPU's in the kernel image).
fn claim_into(cpu: usize, list: *mut u64, n: u64) -> Result<(), Oom> {
    let pos = NEXT_POS.fetch_add(n, Ordering::Relaxed);
    if pos + n > ORDER_LEN.load(Ordering::Relaxed) {
        return Err(Oom);
    }
    let list_gpa = image_gpa(list);
    if PV_FRAMES.load(Ordering::Relaxed) {
        // SAFETY: written once at boot, read-only afterwards.
        let a = unsafe { *ORDER_ARGS.get() };
        match pv::bulk_op(
            cpu,
            bulk::FRAME_BATCH,
            list_gpa,
            pos,
            n,
            0,
            [a[0], a[1], a[2], 0],
        ) {
            status::OK => return Ok(()),
            _ => PV_FRAMES.store(false, Ordering::Relaxed),
        }
    }
    // SAFETY: initialised by `init` before any allocation.
    let order = unsafe { (*ORDER.get()).assume_init_ref() };
    for i in 0..n {
        let gpa = order.frame_gpa(pos + i).ok_or(Oom)?;
        // SAFETY: i < n <= 512, inside this vCPU's scratch page.
        unsafe { list.add(i as usize).write_volatile(gpa) };
    }
    Ok(())
}

/// One frame (zeroed), from this vCPU's cache of the shuffled order.
pub fn alloc_frame(cpu: usize) -> Result<u64, Oom> {
    // SAFETY: each vCPU uses only its own cache entry and page.
    let (pos, list) = unsafe {
        (
            &mut (*CACHE_POS.get())[cpu],
            addr_of_mut!((*CACHE.get())[cpu].list) as *mut u64,
        )
    };
    if pos.0 == pos.1 {
        let n = frames_left().clamp(1, 512);
        claim_into(cpu, list, n)?;
        *pos = (0, n as u32);
    }
    // SAFETY: pos.0 < pos.1 <= 512 entries written by claim_into.
    let gpa = unsafe { list.add(pos.0 as usize).read_volatile() };
    pos.0 += 1;
    if !ram_is_zero() {
        pv::zero(cpu, gpa, PAGE_SIZE);
    }
    Ok(gpa)
}

#[inline(always)]
fn table(gpa: u64) -> *mut u64 {
    phys(gpa & ADDR_MASK) as *mut u64
}

#[inline(always)]
fn index(va: u64, level: u32) -> usize {
    ((va >> (12 + 9 * level)) & 511) as usize
}

/// Pointer to the entry for `va` at `level` (3 = PML4E ... 1 = PDE, 0 = PTE), creating the
/// tables above it.
fn entry(pml4: u64, va: u64, level: u32) -> Result<*mut u64, Oom> {
    let mut t = table(pml4);
    let mut l = 3;
    loop {
        // SAFETY: `t` is a page-table page (pool memory, direct-mapped) and index < 512.
        let e = unsafe { t.add(index(va, l)) };
        if l == level {
            return Ok(e);
        }
        // SAFETY: as above.
        let v = unsafe { e.read_volatile() };
        let next = if v & PTE_P != 0 {
            v & ADDR_MASK
        } else {
            let n = pool_alloc(1)?;
            // SAFETY: as above; the new table is zeroed pool memory.
            unsafe { e.write_volatile(n | TABLE_FLAGS) };
            n
        };
        t = table(next);
        l -= 1;
    }
}

/// Maps one 4 KiB page `va -> gpa` with `flags` (present, accessed and dirty added).
pub fn map_page(pml4: u64, va: u64, gpa: u64, flags: u64) -> Result<(), Oom> {
    let e = entry(pml4, va, 0)?;
    // SAFETY: `e` points into a page-table page of this address space.
    unsafe { e.write_volatile(gpa | flags | LEAF_FLAGS) };
    Ok(())
}

/// The frame mapped at `va`, if any.
pub fn lookup(pml4: u64, va: u64) -> Option<u64> {
    let mut t = table(pml4);
    let mut l = 3;
    loop {
        // SAFETY: walking present tables of this address space.
        let v = unsafe { t.add(index(va, l)).read_volatile() };
        if v & PTE_P == 0 {
            return None;
        }
        if l == 0 {
            return Some(v & ADDR_MASK);
        }
        t = table(v);
        l -= 1;
    }
}

/// Maps `va..va+len` (page aligned) to fresh frames from the shuffled order, one 2 MiB chunk
/// at a time: the chunk's frames come in one FRAME_BATCH; a chunk whose page table does not
/// exist yet gets a new table filled by the VMM (FILL_PTES) before the guest links it.
pub fn map_fresh(cpu: usize, pml4: u64, va: u64, len: u64, flags: u64) -> Result<(), Oom> {
    let end = va + len;
    let mut a = va;
    while a < end {
        let chunk_end = ((a >> 21) + 1) << 21;
        let b = if chunk_end < end { chunk_end } else { end };
        let n = (b - a) / PAGE_SIZE;
        let (list, list_gpa) = claim_frames(cpu, n)?;
        if !ram_is_zero() {
            for i in 0..n {
                // SAFETY: entry i < n of this vCPU's scratch list.
                pv::zero(
                    cpu,
                    unsafe { list.add(i as usize).read_volatile() },
                    PAGE_SIZE,
                );
            }
        }
        let pde = entry(pml4, a, 1)?;
        // SAFETY: `pde` points into a page-directory page of this address space.
        let pdv = unsafe { pde.read_volatile() };
        let first = index(a, 0) as u64;
        if pdv & PTE_P == 0 {
            let pt = pool_alloc(1)?;
            let leaf = flags | LEAF_FLAGS;
            let filled = PV_FILL.load(Ordering::Relaxed)
                && pv::bulk_op(
                    cpu,
                    bulk::FILL_PTES,
                    pt + first * 8,
                    list_gpa,
                    n,
                    leaf,
                    [0; 4],
                ) == status::OK;
            if !filled {
                PV_FILL.store(false, Ordering::Relaxed);
                fill_ptes(table(pt), first, list, n, leaf);
            }
            // Link only now: KVM never saw the table while the VMM wrote it.
            // SAFETY: as above.
            unsafe { pde.write_volatile(pt | TABLE_FLAGS) };
        } else {
            fill_ptes(table(pdv), first, list, n, flags | LEAF_FLAGS);
        }
        a = b;
    }
    Ok(())
}

fn fill_ptes(pt: *mut u64, first: u64, list: *const u64, n: u64, leaf: u64) {
    for i in 0..n {
        // SAFETY: first + i < 512 (the range stays inside one 2 MiB chunk) and i < n entries
        // of the scratch list.
        unsafe {
            pt.add((first + i) as usize)
                .write_volatile(list.add(i as usize).read_volatile() | leaf)
        };
    }
}
