//! Processes: creation (address space, image, stack, heap, mailbox, first frame) and the table.
//!
//! Address space of a process (`farvm_guest_agent::boot::user`): its own PML4 whose kernel half
//! (entries 256 = direct map, 511 = kernel window) is copied from the boot tables; the program's
//! segments with 4 KiB PTEs (text RX, rodata R, data RW, NX where not executable); a 256 KiB
//! stack; the mailbox page; the heap (premapped, or demand-paged by the #PF handler); for a
//! `replay` process, the boot blob read-only at `BLOB_VA`.

use core::ptr::addr_of_mut;

use farvm_guest_agent::boot::{flags, user, workload, ProcessSpec};
use farvm_guest_agent::pv::{state, Mailbox, MAILBOX_MAGIC};
use farvm_guest_agent::PAGE_SIZE;

use crate::arch::phys;
use crate::elf::Image;
use crate::global::Global;
use crate::mm::{self, Oom, PTE_NX, PTE_U, PTE_W};
use crate::trap::{TrapFrame, FRAME_SIZE};
use crate::{cpu, pv, MAX_PROCS};

pub const FREE: u32 = 0;
pub const RUNNABLE: u32 = 1;
pub const EXITED: u32 = 2;

#[derive(Clone, Copy)]
pub struct Process {
    pub state: u32,
    pub pid: u32,
    pub cpu: u32,
    pub workload: u32,
    /// GPA of the PML4 (the CR3 value).
    pub pml4: u64,
    /// Kernel VA of the top of the 8 KiB kernel stack (TSS.RSP0 while it runs).
    pub kstack_top: u64,
    pub mailbox_gpa: u64,
    /// Kernel VA of the 512-byte FXSAVE area.
    pub fpu_va: u64,
    pub heap_bytes: u64,
}

const EMPTY: Process = Process {
    state: FREE,
    pid: 0,
    cpu: 0,
    workload: 0,
    pml4: 0,
    kstack_top: 0,
    mailbox_gpa: 0,
    fpu_va: 0,
    heap_bytes: 0,
};

static PROCS: Global<[Process; MAX_PROCS]> = Global::new([EMPTY; MAX_PROCS]);

/// Process `idx` (< MAX_PROCS).
#[inline(always)]
pub fn get(idx: usize) -> *mut Process {
    // SAFETY: idx < MAX_PROCS (callers index with queue entries set at boot); a process is
    // written by the BSP at boot and afterwards only by the vCPU it is pinned to.
    unsafe { addr_of_mut!((*PROCS.get())[idx]) }
}

/// The mailbox of `p` through the direct map.
pub fn mailbox(p: &Process) -> *mut Mailbox {
    phys(p.mailbox_gpa) as *mut Mailbox
}

/// Pool pages a process needs besides heap page tables.
pub const FIXED_POOL_PAGES: u64 = 16;

/// Pool pages for a process with a heap of `heap_bytes`.
pub fn pool_pages(heap_bytes: u64) -> u64 {
    FIXED_POOL_PAGES + heap_bytes.div_ceil(2 << 20) + heap_bytes.div_ceil(1 << 30) + 1
}

macro_rules! put {
    ($mb:expr, $field:ident, $v:expr) => {
        // SAFETY: `$mb` is this process's mailbox page (pool memory, direct-mapped); the
        // process has not started and the VMM reads it only after a doorbell.
        unsafe { addr_of_mut!((*$mb).$field).write_volatile($v) }
    };
}

/// Creates process `idx` from `spec`. BSP only, at boot.
pub fn create(
    idx: usize,
    spec: &ProcessSpec,
    boot_flags: u64,
    tsc_khz: u64,
    img: &Image,
    img_gpa: u64,
    blob: (u64, u64),
) -> Result<(), Oom> {
    let c = 0; // the BSP's PV records
    let pml4 = mm::pool_alloc(1)?;
    // The boot tables: farvm's at BOOT_PML4_GPA, or the PVH entry's.
    let boot_pml4 = crate::arch::read_cr3() & 0x000f_ffff_ffff_f000;
    for e in [256usize, 511] {
        // SAFETY: both tables are direct-mapped pages; e < 512.
        unsafe {
            let v = (phys(boot_pml4) as *const u64).add(e).read_volatile();
            (phys(pml4) as *mut u64).add(e).write_volatile(v);
        }
    }
    let kstack = mm::pool_alloc(2)?;
    let fpu = mm::pool_alloc(1)?;
    // Initial FPU image: FCW = 0x37F (all x87 exceptions masked), MXCSR = 0x1F80.
    // SAFETY: a fresh pool page, direct-mapped.
    unsafe {
        (phys(fpu) as *mut u16).write_volatile(0x37F);
        (phys(fpu + 24) as *mut u32).write_volatile(0x1F80);
    }
    let mbox = mm::pool_alloc(1)?;

    for s in &img.segs[..img.nsegs] {
        let mut leaf = PTE_U;
        if s.flags & 2 != 0 {
            leaf |= PTE_W;
        }
        if s.flags & 1 == 0 {
            leaf |= PTE_NX;
        }
        let mut page = s.vaddr & !(PAGE_SIZE - 1);
        while page < s.vaddr + s.memsz {
            let frame = match mm::lookup(pml4, page) {
                Some(f) => f, // page shared with the previous segment
                None => {
                    let f = mm::alloc_frame(c)?;
                    mm::map_page(pml4, page, f, leaf)?;
                    f
                }
            };
            let start = page.max(s.vaddr);
            let end = (page + PAGE_SIZE).min(s.vaddr + s.filesz);
            if start < end {
                let src = img_gpa + s.offset + (start - s.vaddr);
                let dst = frame + (start - page);
                if !pv::copy(c, dst, src, end - start) {
                    copy_slow(dst, src, end - start);
                }
            }
            page += PAGE_SIZE;
        }
    }
    mm::map_fresh(
        c,
        pml4,
        user::STACK_TOP - user::STACK_BYTES,
        user::STACK_BYTES,
        PTE_W | PTE_U | PTE_NX,
    )?;
    mm::map_page(pml4, user::MAILBOX_VA, mbox, PTE_W | PTE_U | PTE_NX)?;
    // The boot blob (a replay trace), read-only, for the processes that replay it.
    let (blob_gpa, blob_len) = blob;
    let blob_mapped = spec.workload == workload::REPLAY && blob_len > 0;
    if blob_mapped {
        let mut off = 0;
        while off < blob_len {
            mm::map_page(pml4, user::BLOB_VA + off, blob_gpa + off, PTE_U | PTE_NX)?;
            off += PAGE_SIZE;
        }
    }
    let heap_bytes = spec.ws_bytes.div_ceil(PAGE_SIZE) * PAGE_SIZE;
    if boot_flags & flags::PREMAP_HEAP != 0 && heap_bytes > 0 {
        mm::map_fresh(c, pml4, user::HEAP_BASE, heap_bytes, PTE_W | PTE_U | PTE_NX)?;
    }

    let pid = idx as u32 + 1;
    let mb = phys(mbox) as *mut Mailbox;
    put!(mb, magic, MAILBOX_MAGIC);
    put!(mb, pid, pid);
    put!(mb, cpu, spec.cpu);
    put!(mb, workload, spec.workload);
    put!(mb, state, state::STARTING);
    put!(mb, cr3, pml4);
    put!(mb, heap_va, user::HEAP_BASE);
    put!(mb, heap_bytes, heap_bytes);
    put!(mb, tsc_khz, tsc_khz);
    if blob_mapped {
        put!(mb, blob_va, user::BLOB_VA);
        put!(mb, blob_bytes, blob_len);
    }
    // Field by field: a struct copy would become an emulated `rep movsb`.
    // SAFETY: as in put!.
    unsafe {
        let sp = addr_of_mut!((*mb).spec);
        addr_of_mut!((*sp).cpu).write_volatile(spec.cpu);
        addr_of_mut!((*sp).workload).write_volatile(spec.workload);
        addr_of_mut!((*sp).ws_bytes).write_volatile(spec.ws_bytes);
        addr_of_mut!((*sp).seed).write_volatile(spec.seed);
        for i in 0..4 {
            addr_of_mut!((*sp).params[i]).write_volatile(spec.params[i]);
        }
    }

    let top = phys(kstack) + 2 * PAGE_SIZE;
    let f = (top - FRAME_SIZE) as *mut TrapFrame;
    // SAFETY: the frame lies at the top of the fresh (zeroed) kernel stack.
    unsafe {
        (*f).rip = img.entry;
        (*f).cs = cpu::USER_CS;
        (*f).rflags = 0x202; // IF
        (*f).rsp = user::STACK_TOP - 8; // as after a call: rsp + 8 is 16-byte aligned
        (*f).ss = cpu::USER_DS;
        (*f).rdi = user::MAILBOX_VA;
        (*f).r9 = user::MAILBOX_VA;
        (*f).rsi = mbox;
        (*f).r8 = mbox;
    }
    let p = get(idx);
    // SAFETY: boot-time single writer.
    unsafe {
        (*p).pid = pid;
        (*p).cpu = spec.cpu;
        (*p).workload = spec.workload;
        (*p).pml4 = pml4;
        (*p).kstack_top = top;
        (*p).mailbox_gpa = mbox;
        (*p).fpu_va = phys(fpu);
        (*p).heap_bytes = heap_bytes;
        (*p).state = RUNNABLE;
    }
    Ok(())
}

/// Copies guest-physical memory with emulated u64 moves (only when the VMM refuses COPY).
fn copy_slow(dst: u64, src: u64, len: u64) {
    let mut i = 0;
    while i < len {
        // SAFETY: both ranges are guest RAM (validated image bytes, a fresh frame), mapped by
        // the direct map; byte granularity at the unaligned tail.
        unsafe {
            if len - i >= 8 {
                let v = (phys(src + i) as *const u64).read_unaligned();
                (phys(dst + i) as *mut u64).write_unaligned(v);
                i += 8;
            } else {
                let v = (phys(src + i) as *const u8).read_volatile();
                (phys(dst + i) as *mut u8).write_volatile(v);
                i += 1;
            }
        }
    }
}
