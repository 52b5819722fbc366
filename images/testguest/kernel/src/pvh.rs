//! The PVH entry, for VMMs other than farvm (QEMU `-kernel` on `-machine microvm` or `pc`).
//!
//! The ELF note `XEN_ELFNOTE_PHYS32_ENTRY` names `_pvh_start`, which such a VMM enters in
//! 32-bit protected mode with paging off and `ebx` = the guest-physical address of the
//! `hvm_start_info` block. The BootInfo is the first module in that block's list (QEMU:
//! `-initrd FILE`, a file farvm-lab writes). The entry loads page tables that are static data of
//! this image (guest-physical 0..4 GiB identity-mapped and at `DIRECT_MAP_BASE`, 0..1 GiB at
//! `KERNEL_WINDOW_BASE`, 2 MiB pages), switches to 64-bit mode with the control registers
//! farvm's VMM gives the test guest (CR0 0x80050033, CR4 0x620, EFER LME|NXE) and enters
//! `_start` as farvm does: `rdi` = the BootInfo GPA (0 if there is no module), `rsi` = 0.
//! Only the BSP enters here (no AP start-up): such a VM has one vCPU.
//!
//! A kernel entered here has no paravirtual device: [`booted`] tells `pv` to send its log lines
//! and panics to the serial console and to power off through QEMU's `isa-debug-exit` port.

use core::sync::atomic::{AtomicBool, Ordering};

/// `hvm_start_info::magic`.
const HVM_START_MAGIC: u32 = 0x336e_c578;
/// `XEN_ELFNOTE_PHYS32_ENTRY`.
const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;
/// The kernel window's base: image VA - this = guest-physical address.
const KOFF: u64 = farvm_guest_agent::boot::KERNEL_WINDOW_BASE;

/// Set by the PVH entry before `_start`.
#[no_mangle]
static PVH_BOOTED: AtomicBool = AtomicBool::new(false);

/// True when this kernel was entered through the PVH note (no farvm paravirtual device).
pub fn booted() -> bool {
    PVH_BOOTED.load(Ordering::Relaxed)
}

core::arch::global_asm!(
    r#"
    .pushsection .note.Xen, "a"
    .p2align 2
    .long 4, 4, {note_type}
    .asciz "Xen"
    .long _pvh_start - {koff}
    .popsection

    .pushsection .data.pvh_tables, "aw"
    .p2align 12
PVH_PML4:
    .quad PVH_PDPT - {koff} + 0x23
    .fill 255, 8, 0
    .quad PVH_PDPT - {koff} + 0x23
    .fill 254, 8, 0
    .quad PVH_WPDPT - {koff} + 0x23
PVH_PDPT:
    .quad PVH_PD - {koff} + 0x23
    .quad PVH_PD + 0x1000 - {koff} + 0x23
    .quad PVH_PD + 0x2000 - {koff} + 0x23
    .quad PVH_PD + 0x3000 - {koff} + 0x23
    .fill 508, 8, 0
PVH_WPDPT:
    .fill 510, 8, 0
    .quad PVH_PD - {koff} + 0x23
    .quad 0
PVH_PD:
    .set pvh_i, 0
    .rept 2048
    .quad (pvh_i << 21) + 0xe3
    .set pvh_i, pvh_i + 1
    .endr
    .p2align 3
PVH_GDT:
    .quad 0, 0x00af9a000000ffff, 0x00cf92000000ffff
PVH_GDTR:
    .word 23
    .long PVH_GDT - {koff}
    .popsection

    .pushsection .text.pvh, "ax"
    .code32
    .global _pvh_start
_pvh_start:
    cli
    cld
    xor edi, edi
    cmp dword ptr [ebx], {magic}
    jne 2f
    cmp dword ptr [ebx + 12], 0
    je 2f
    mov eax, dword ptr [ebx + 16]
    mov edi, dword ptr [eax]
2:
    mov eax, offset PVH_PML4 - {koff}
    mov cr3, eax
    mov eax, 0x620
    mov cr4, eax
    mov ecx, 0xc0000080
    rdmsr
    or eax, 0x900
    wrmsr
    mov eax, 0x80050033
    mov cr0, eax
    lgdt [PVH_GDTR - {koff}]
    .byte 0xea
    .long pvh_long - {koff}
    .word 0x08
    .code64
pvh_long:
    mov eax, 0x10
    mov ds, eax
    mov es, eax
    mov ss, eax
    movabs rax, offset pvh_high
    jmp rax
pvh_high:
    mov byte ptr [rip + PVH_BOOTED], 1
    mov edi, edi
    xor esi, esi
    jmp _start
    .popsection
"#,
    koff = const KOFF,
    magic = const HVM_START_MAGIC,
    note_type = const XEN_ELFNOTE_PHYS32_ENTRY,
);
