//! farvm's test-guest kernel: a tiny ring-0 kernel that runs the test plan's ring-3 processes.
//!
//! On this host guest ring 0 is executed by KVM's instruction emulator (~1 µs per instruction)
//! while ring 3 runs natively, so this kernel keeps ring 0 minimal: no SSE and no `core::fmt`
//! (SSE code in libcore), no `int n`/`vmcall`/`cmpxchg16b`/`xsave`, no bulk `rep movs/stos`;
//! bulk memory work (zeroing, copying, page-table fills, shuffled frame lists) is done by the
//! VMM through the PV port; the LAPIC timer runs only when a vCPU has more than one runnable
//! process. See images/README.md for the whole design.
//!
//! Entry (every vCPU): 64-bit mode, paging on (boot tables), `rdi` = BootInfo GPA,
//! `rsi` = vCPU index; or, from VMMs other than farvm, the PVH entry (`pvh`), BSP only.
#![no_std]
#![no_main]

mod arch;
mod boot;
mod console;
mod cpu;
mod elf;
mod global;
mod lapic;
mod mm;
mod num;
mod proc;
mod pv;
mod pvh;
mod sched;
mod trap;

// Keep the runtime's memcpy & co. linked.
use farvm_testguest_rt as _;

/// Marks this ELF as the farvm test guest (see `farvm_guest_agent::boot::note`).
#[used]
#[link_section = ".note.farvm"]
static TEST_GUEST_NOTE: farvm_guest_agent::boot::note::TestGuestNote =
    farvm_guest_agent::boot::note::TestGuestNote::current();

pub const MAX_CPUS: usize = farvm_guest_agent::boot::MAX_CPUS;
pub const MAX_PROCS: usize = farvm_guest_agent::boot::MAX_PROCS;
const BOOT_STACK: usize = 16 << 10;

#[repr(C, align(4096))]
struct BootStacks([[u8; BOOT_STACK]; MAX_CPUS]);
#[no_mangle]
static BOOT_STACKS: global::Global<BootStacks> =
    global::Global::new(BootStacks([[0; BOOT_STACK]; MAX_CPUS]));

// Each vCPU starts on its own boot stack (an index past MAX_CPUS parks the vCPU).
core::arch::global_asm!(
    r#"
    .section .text._start, "ax"
    .global _start
_start:
    cmp rsi, {max}
    jae 2f
    lea rax, [rip + BOOT_STACKS]
    mov rcx, rsi
    inc rcx
    shl rcx, {shift}
    add rax, rcx
    mov rsp, rax
    call {kmain}
2:
    cli
    hlt
    jmp 2b
"#,
    max = const MAX_CPUS,
    shift = const 14,
    kmain = sym boot::kmain,
);
const _: () = assert!(BOOT_STACK == 1 << 14);

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    // Only file:line — formatting the message would run libcore's SSE code in ring 0.
    let mut m = pv::Msg::new(sched::cpu_index()).s(b"kernel panic at ");
    if let Some(loc) = info.location() {
        m = m.s(loc.file().as_bytes()).s(b":").dec(loc.line() as u64);
    }
    m.panic()
}
