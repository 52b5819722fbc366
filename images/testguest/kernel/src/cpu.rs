//! Per-vCPU descriptor tables: GDT (kernel and user segments, TSS), the TSS with its I/O
//! permission bitmap (ports 0x500-0x50F open to ring 3 so processes ring the PV doorbells
//! without entering the kernel) and IST stack, and the shared IDT.

use core::ptr::addr_of_mut;

use crate::arch::{wrmsr, MSR_GS_BASE};
use crate::global::Global;
use crate::{trap, MAX_CPUS};

pub const KERNEL_CS: u16 = 0x08;
pub const KERNEL_DS: u16 = 0x10;
pub const USER_DS: u64 = 0x18 | 3;
pub const USER_CS: u64 = 0x20 | 3;
const TSS_SEL: u16 = 0x28;

const TSS_SIZE: usize = 104;
/// I/O bitmap bytes covering ports 0..=0x50F, plus the required trailing 0xFF byte.
const IOMAP_BYTES: usize = 0x50F / 8 + 1 + 1;
const TSS_LIMIT: u64 = (TSS_SIZE + IOMAP_BYTES - 1) as u64;

#[repr(C, align(4096))]
struct CpuTables {
    gdt: [u64; 8],
    tss: [u8; 512],
}

#[repr(C, align(4096))]
struct Stack([u8; 4096]);

static TABLES: Global<[CpuTables; MAX_CPUS]> = Global::new(
    [const {
        CpuTables {
            gdt: [0; 8],
            tss: [0; 512],
        }
    }; MAX_CPUS],
);
static IST: Global<[Stack; MAX_CPUS]> = Global::new([const { Stack([0; 4096]) }; MAX_CPUS]);

#[repr(C, align(4096))]
struct Idt([u64; 512]);
static IDT: Global<Idt> = Global::new(Idt([0; 512]));

#[repr(C, packed)]
struct DescPtr {
    limit: u16,
    base: u64,
}

/// Builds the IDT from the trap stubs. BSP only, before the APs start.
pub fn build_idt() {
    for &[vec, addr] in trap::stubs() {
        let dpl3 = vec == 3 || vec == trap::VEC_SYSCALL;
        let kind: u64 = if dpl3 { 0xEE } else { 0x8E };
        // NMI, #DF and #MC run on the IST stack: the current stack may be unusable.
        let ist: u64 = if matches!(vec, 2 | 8 | 18) { 1 } else { 0 };
        let lo = (addr & 0xFFFF)
            | (KERNEL_CS as u64) << 16
            | ist << 32
            | kind << 40
            | ((addr >> 16) & 0xFFFF) << 48;
        // SAFETY: single writer at boot; vec < 256 so 2*vec+1 < 512.
        unsafe {
            let idt = addr_of_mut!((*IDT.get()).0);
            (*idt)[2 * vec as usize] = lo;
            (*idt)[2 * vec as usize + 1] = addr >> 32;
        }
    }
}

/// Loads this vCPU's GDT, TSS and the IDT, and points GS at its per-CPU block.
pub fn init(cpu: usize, percpu: u64) {
    // SAFETY: each vCPU initialises only its own tables; `cpu < MAX_CPUS` (checked by the
    // caller).
    unsafe {
        let t = addr_of_mut!((*TABLES.get())[cpu]);
        let tss = addr_of_mut!((*t).tss) as *mut u8;
        let ist_top = addr_of_mut!((*IST.get())[cpu]) as u64 + 4096;
        (tss.add(36) as *mut u64).write_unaligned(ist_top);
        (tss.add(102) as *mut u16).write_unaligned(TSS_SIZE as u16);
        // Deny every port up to 0x4FF, allow 0x500-0x50F, and the terminating 0xFF byte.
        let map = tss.add(TSS_SIZE) as *mut u64;
        for i in 0..(0x500 / 64) {
            map.add(i).write_unaligned(u64::MAX);
        }
        *tss.add(TSS_SIZE + IOMAP_BYTES - 1) = 0xFF;
        let base = tss as u64;
        let gdt = addr_of_mut!((*t).gdt) as *mut u64;
        gdt.add(1).write(0x00AF_9A00_0000_FFFF); // 0x08 kernel code, 64-bit
        gdt.add(2).write(0x00CF_9200_0000_FFFF); // 0x10 kernel data
        gdt.add(3).write(0x00CF_F200_0000_FFFF); // 0x18 user data (DPL 3)
        gdt.add(4).write(0x00AF_FA00_0000_FFFF); // 0x20 user code, 64-bit (DPL 3)
        gdt.add(5).write(
            (TSS_LIMIT & 0xFFFF)
                | (base & 0xFF_FFFF) << 16
                | 0x89 << 40
                | ((TSS_LIMIT >> 16) & 0xF) << 48
                | ((base >> 24) & 0xFF) << 56,
        );
        gdt.add(6).write(base >> 32);
        let gp = DescPtr {
            limit: 8 * 8 - 1,
            base: gdt as u64,
        };
        let ip = DescPtr {
            limit: 4096 - 1,
            base: IDT.get() as u64,
        };
        core::arch::asm!(
            "lgdt [{gp}]",
            "mov ds, {ds:x}",
            "mov es, {ds:x}",
            "mov ss, {ds:x}",
            "ltr {tss:x}",
            "lidt [{ip}]",
            gp = in(reg) &gp,
            ip = in(reg) &ip,
            ds = in(reg) KERNEL_DS,
            tss = in(reg) TSS_SEL,
            options(nostack, preserves_flags),
        );
    }
    wrmsr(MSR_GS_BASE, percpu);
}

/// Sets the stack the CPU switches to on a trap from ring 3 (TSS.RSP0).
#[inline(always)]
pub fn set_rsp0(cpu: usize, top: u64) {
    // SAFETY: this vCPU's own TSS; offset 4 is RSP0.
    unsafe {
        let tss = addr_of_mut!((*TABLES.get())[cpu].tss) as *mut u8;
        (tss.add(4) as *mut u64).write_unaligned(top);
    }
}
