//! Trap entry and exit: the IDT stubs (asm), the saved register frame, and the dispatcher that
//! decides what runs next.
//!
//! Every trap saves all general registers on the current kernel stack (a process's kernel stack:
//! TSS.RSP0) and calls [`trap_dispatch`], which returns the frame to resume. Switching process
//! is returning another process's frame (it sits at the top of that process's kernel stack).
//! About 40 emulated instructions on entry+exit; the dispatcher keeps its paths short.

use farvm_guest_agent::boot::user;

use crate::arch::read_cr2;
use crate::{pv, sched};

/// Registers as pushed by `trap_common` (lowest address first) and the CPU's interrupt frame.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct TrapFrame {
    pub r15: u64,
    pub r14: u64,
    pub r13: u64,
    pub r12: u64,
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rbp: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rbx: u64,
    pub rax: u64,
    pub vector: u64,
    pub error: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

pub const FRAME_SIZE: u64 = core::mem::size_of::<TrapFrame>() as u64;
const _: () = assert!(FRAME_SIZE == 176 && FRAME_SIZE.is_multiple_of(16));

pub const VEC_TIMER: u64 = 0x20;
/// COM1's receive interrupt (the PIC's IRQ 4), and the master PIC's spurious IRQ 7.
pub const VEC_CONSOLE: u64 = 0x2C;
const VEC_PIC_SPURIOUS: u64 = 0x2F;
pub const VEC_SYSCALL: u64 = 0x80;
pub const VEC_SPURIOUS: u64 = 0xFF;
const VEC_NMI: u64 = 2;
const VEC_BP: u64 = 3;
const VEC_UD: u64 = 6;
const VEC_PF: u64 = 14;

// Stubs: vectors without a CPU error code push a 0 so every frame has the same layout.
core::arch::global_asm!(
    r#"
.macro TRAP_STUB vec, has_err
    .section .text.trap_stubs, "ax"
    .global trap_stub_\vec
trap_stub_\vec:
    .if \has_err == 0
    push 0
    .endif
    push \vec
    jmp trap_common
    .section .rodata.trap_stub_table, "a"
    .quad \vec, trap_stub_\vec
.endm

    .section .rodata.trap_stub_table, "a"
    .balign 8
    .global TRAP_STUB_TABLE
TRAP_STUB_TABLE:
TRAP_STUB 0, 0
TRAP_STUB 1, 0
TRAP_STUB 2, 0
TRAP_STUB 3, 0
TRAP_STUB 4, 0
TRAP_STUB 5, 0
TRAP_STUB 6, 0
TRAP_STUB 7, 0
TRAP_STUB 8, 1
TRAP_STUB 9, 0
TRAP_STUB 10, 1
TRAP_STUB 11, 1
TRAP_STUB 12, 1
TRAP_STUB 13, 1
TRAP_STUB 14, 1
TRAP_STUB 15, 0
TRAP_STUB 16, 0
TRAP_STUB 17, 1
TRAP_STUB 18, 0
TRAP_STUB 19, 0
TRAP_STUB 20, 0
TRAP_STUB 21, 1
TRAP_STUB 32, 0
TRAP_STUB 44, 0
TRAP_STUB 47, 0
TRAP_STUB 128, 0
TRAP_STUB 255, 0
    .section .rodata.trap_stub_table, "a"
    .global TRAP_STUB_TABLE_END
TRAP_STUB_TABLE_END:

    .section .text.trap_stubs, "ax"
    .global trap_common
trap_common:
    cld
    push rax
    push rbx
    push rcx
    push rdx
    push rsi
    push rdi
    push rbp
    push r8
    push r9
    push r10
    push r11
    push r12
    push r13
    push r14
    push r15
    mov rdi, rsp
    call {dispatch}
    .global trap_restore
trap_restore:
    mov rsp, rax
    pop r15
    pop r14
    pop r13
    pop r12
    pop r11
    pop r10
    pop r9
    pop r8
    pop rbp
    pop rdi
    pop rsi
    pop rdx
    pop rcx
    pop rbx
    pop rax
    add rsp, 16
    iretq
"#,
    dispatch = sym trap_dispatch,
);

extern "C" {
    static TRAP_STUB_TABLE: [u64; 0];
    static TRAP_STUB_TABLE_END: [u64; 0];
}

/// `(vector, stub address)` pairs for the IDT.
pub fn stubs() -> &'static [[u64; 2]] {
    // SAFETY: the asm above emits the table as consecutive `.quad vec, addr` pairs between the
    // two symbols, in .rodata.
    unsafe {
        let start = core::ptr::addr_of!(TRAP_STUB_TABLE) as *const [u64; 2];
        let end = core::ptr::addr_of!(TRAP_STUB_TABLE_END) as *const [u64; 2];
        core::slice::from_raw_parts(start, end.offset_from(start) as usize)
    }
}

/// Resumes `frame` (a process's saved frame): never returns.
pub fn resume(frame: *mut TrapFrame) -> ! {
    // SAFETY: `frame` is a complete TrapFrame at the top of the kernel stack that TSS.RSP0
    // points to; trap_restore pops it and irets into ring 3.
    unsafe { core::arch::asm!("mov rax, {}", "jmp trap_restore", in(reg) frame, options(noreturn)) }
}

extern "C" fn trap_dispatch(f: *mut TrapFrame) -> *mut TrapFrame {
    // SAFETY: trap_common passes the frame it just built on this stack.
    let fr = unsafe { &mut *f };
    if fr.cs & 3 == 0 {
        return kernel_trap(f);
    }
    match fr.vector {
        VEC_TIMER => sched::timer_tick(f),
        VEC_CONSOLE => {
            crate::console::input_interrupt();
            f
        }
        // Spurious interrupts and NMIs are not the process's doing: resume it.
        VEC_SPURIOUS | VEC_PIC_SPURIOUS | VEC_NMI => f,
        VEC_BP | VEC_SYSCALL => sched::syscall(f),
        VEC_UD if is_int80(fr.rip) => {
            // PVM's emulator cannot do `int n` from ring 3 and raises #UD at the instruction.
            fr.rip += 2;
            sched::syscall(f)
        }
        VEC_PF => {
            let cr2 = read_cr2();
            // Not-present fault inside the heap: demand paging. Anything else kills.
            if fr.error & 1 == 0
                && (user::HEAP_BASE..user::HEAP_BASE + user::HEAP_MAX).contains(&cr2)
            {
                sched::heap_fault(f, cr2)
            } else {
                sched::kill(f, cr2)
            }
        }
        _ => sched::kill(f, 0),
    }
}

fn is_int80(rip: u64) -> bool {
    // Both bytes on one page (the fetch of the first one succeeded).
    if rip & 0xFFF == 0xFFF || rip >= 1 << 47 {
        return false;
    }
    // SAFETY: the #UD was raised at `rip`, so that page is mapped and readable in the current
    // address space (no SMAP); both bytes are on it.
    let (a, b) = unsafe {
        (
            (rip as *const u8).read_volatile(),
            ((rip + 1) as *const u8).read_volatile(),
        )
    };
    a == 0xCD && b == 0x80
}

/// A trap in ring 0 is a kernel bug (the kernel runs with interrupts off); report and stop.
fn kernel_trap(f: *mut TrapFrame) -> *mut TrapFrame {
    // SAFETY: as in trap_dispatch.
    let fr = unsafe { &*f };
    if fr.vector == VEC_SPURIOUS || fr.vector == VEC_PIC_SPURIOUS || fr.vector == VEC_NMI {
        return f;
    }
    pv::Msg::new(sched::cpu_index())
        .s(b"kernel trap vector ")
        .dec(fr.vector)
        .s(b" error ")
        .hex(fr.error)
        .s(b" rip ")
        .hex(fr.rip)
        .s(b" cr2 ")
        .hex(read_cr2())
        .panic()
}
