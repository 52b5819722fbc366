//! x86-64 privileged instructions used by the kernel, each one a single (emulated) instruction,
//! and address conversions between guest-physical and the kernel's two mappings.

use farvm_guest_agent::boot::{DIRECT_MAP_BASE, KERNEL_WINDOW_BASE};

pub const MSR_APIC_BASE: u32 = 0x1B;
pub const MSR_GS_BASE: u32 = 0xC000_0101;

/// Kernel VA of guest-physical `gpa` (direct map: all RAM, 2 MiB pages).
#[inline(always)]
pub fn phys(gpa: u64) -> u64 {
    DIRECT_MAP_BASE + gpa
}

/// Guest-physical address of a kernel-image VA (kernel window: physical 0..1 GiB).
#[inline(always)]
pub fn image_gpa<T>(p: *const T) -> u64 {
    p as u64 - KERNEL_WINDOW_BASE
}

#[inline(always)]
pub fn outl(port: u16, val: u32) {
    // SAFETY: port I/O to the VMM's PV device (or LAPIC-free legacy ports); no memory effects
    // beyond what the VMM does, which the "memory" clobber (default) orders.
    unsafe {
        core::arch::asm!("out dx, eax", in("dx") port, in("eax") val, options(nostack, preserves_flags))
    };
}

#[inline(always)]
pub fn outb(port: u16, val: u8) {
    // SAFETY: port I/O to an emulated device (the serial console); no memory effects.
    unsafe {
        core::arch::asm!("out dx, al", in("dx") port, in("al") val, options(nostack, preserves_flags))
    };
}

#[inline(always)]
pub fn inb(port: u16) -> u8 {
    let v: u8;
    // SAFETY: port I/O from an emulated device (the serial console's status register).
    unsafe {
        core::arch::asm!("in al, dx", in("dx") port, out("al") v, options(nostack, preserves_flags))
    };
    v
}

#[inline(always)]
pub fn rdmsr(msr: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: reading an architectural MSR the kernel knows exists (APIC base, x2APIC regs).
    unsafe {
        core::arch::asm!("rdmsr", in("ecx") msr, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
    };
    (hi as u64) << 32 | lo as u64
}

#[inline(always)]
pub fn wrmsr(msr: u32, v: u64) {
    // SAFETY: writing an MSR the kernel owns (GS base, x2APIC registers); callers pass valid
    // values for that MSR.
    unsafe {
        core::arch::asm!("wrmsr", in("ecx") msr, in("eax") v as u32, in("edx") (v >> 32) as u32,
            options(nostack, preserves_flags))
    };
}

#[inline(always)]
pub fn read_cr2() -> u64 {
    let v;
    // SAFETY: reading CR2 has no side effects.
    unsafe {
        core::arch::asm!("mov {}, cr2", out(reg) v, options(nomem, nostack, preserves_flags))
    };
    v
}

/// The current CR3 (at boot: the boot page tables, farvm's or the PVH entry's).
#[inline(always)]
pub fn read_cr3() -> u64 {
    let v;
    // SAFETY: reading CR3 has no side effects.
    unsafe {
        core::arch::asm!("mov {}, cr3", out(reg) v, options(nomem, nostack, preserves_flags))
    };
    v
}

/// Loads `pml4_gpa` into CR3 (flushes non-global TLB entries).
#[inline(always)]
pub fn write_cr3(pml4_gpa: u64) {
    // SAFETY: callers pass a PML4 whose kernel half is a copy of the boot tables' (direct map
    // and kernel window), so the kernel's code, data and stack stay mapped across the switch.
    unsafe { core::arch::asm!("mov cr3, {}", in(reg) pml4_gpa, options(nostack, preserves_flags)) };
}

/// Saves the FPU/SSE state into the 512-byte, 16-byte-aligned area at `va`.
#[inline(always)]
pub fn fxsave(va: u64) {
    // SAFETY: `va` is a process's FPU page (kernel-mapped, 4 KiB aligned, 512 bytes used).
    unsafe { core::arch::asm!("fxsave64 [{}]", in(reg) va, options(nostack, preserves_flags)) };
}

#[inline(always)]
pub fn fxrstor(va: u64) {
    // SAFETY: `va` holds a valid FXSAVE image: written by fxsave, or the kernel's initial image
    // (FCW 0x37F, MXCSR 0x1F80, rest zero).
    unsafe { core::arch::asm!("fxrstor64 [{}]", in(reg) va, options(nostack, preserves_flags)) };
}

/// Stops this vCPU for good (interrupts off).
pub fn halt_forever() -> ! {
    loop {
        // SAFETY: cli; hlt parks the vCPU; nothing else runs on it.
        unsafe { core::arch::asm!("cli", "hlt", options(nomem, nostack)) };
    }
}

#[inline(always)]
pub fn pause() {
    // SAFETY: a spin-loop hint.
    unsafe { core::arch::asm!("pause", options(nomem, nostack, preserves_flags)) };
}
