//! The test guest's ring-3 program: one copy per process. It reads its plan entry from its
//! mailbox (the kernel copied it there), runs the workload over its heap at native speed, and
//! reports phases and results to the VMM with direct `out` doorbells (the TSS I/O bitmap opens
//! the PV ports to ring 3, so no kernel entry is needed). It enters the kernel only to yield and
//! to exit.
//!
//! Entry: `rdi` = `r9` = mailbox VA, `rsi` = `r8` = mailbox GPA, `rsp` = stack top - 8.
#![no_std]
#![no_main]

use core::ptr::{addr_of, addr_of_mut};

use farvm_guest_agent::boot::workload;
use farvm_guest_agent::pv::{self, state, Mailbox};
use farvm_testguest_rt::sys;
use farvm_workloads::{Env, Params};

// Keep the runtime's memcpy & co. linked.
#[allow(unused_imports)]
use farvm_testguest_rt as _;

/// The process's view of its mailbox and the clock.
struct Guest {
    mb: *mut Mailbox,
    gpa: u32,
    tsc_khz: u64,
}

impl Guest {
    fn doorbell(&self) {
        // SAFETY: port I/O to the PV mailbox port, opened to ring 3 by the TSS I/O bitmap; the
        // VMM only reads this process's mailbox. The asm is a compiler barrier for memory, so
        // the mailbox writes before it are visible to the VMM.
        unsafe {
            core::arch::asm!("out dx, eax", in("dx") pv::PORT_MAILBOX, in("eax") self.gpa,
                options(nostack, preserves_flags));
        }
    }
}

fn rdtsc() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: rdtsc is unprivileged (CR4.TSD is clear) and only writes edx:eax.
    unsafe { core::arch::asm!("rdtsc", out("eax") lo, out("edx") hi, options(nomem, nostack)) };
    (hi as u64) << 32 | lo as u64
}

/// Volatile store into a mailbox field.
macro_rules! put {
    ($g:expr, $field:ident, $v:expr) => {
        // SAFETY: `mb` points at this process's mapped, writable mailbox page for its whole
        // life; volatile because the VMM reads it concurrently.
        unsafe { addr_of_mut!((*$g.mb).$field).write_volatile($v) }
    };
}

impl Env for Guest {
    fn now_ns(&mut self) -> u64 {
        (rdtsc() as u128 * 1_000_000 / self.tsc_khz.max(1) as u128) as u64
    }

    fn counter(&mut self, index: usize, value: u64) {
        if index < 8 {
            // SAFETY: as in `put!`; `index` is inside the 8-entry `counters` array.
            unsafe {
                addr_of_mut!((*self.mb).counters)
                    .cast::<u64>()
                    .add(index)
                    .write_volatile(value)
            }
        }
    }

    fn phase(&mut self, phase: u32) {
        if phase == pv::phase::MEASURED {
            put!(self, tsc_end, rdtsc());
        }
        put!(self, phase, phase);
        self.doorbell();
        if phase == pv::phase::MEASURE {
            put!(self, tsc_begin, rdtsc());
        }
    }

    fn yield_now(&mut self) {
        syscall(sys::YIELD, 0);
    }
}

fn syscall(nr: u64, arg: u64) -> u64 {
    let ret: u64;
    // SAFETY: the kernel's int3 gate (DPL 3) implements the syscall; it preserves every
    // register except rax (the result).
    unsafe {
        core::arch::asm!("int3", inout("rax") nr => ret, in("rdi") arg, options(nostack));
    }
    ret
}

/// EXIT goes through `int 0x80` (YIELD through `int3`) so every run exercises both gates: on
/// this host `int 0x80` raises #UD and the kernel's fix-up treats it as a syscall; on a CPU
/// that executes it, the DPL-3 gate at vector 0x80 does.
fn exit() -> ! {
    loop {
        // SAFETY: as in `syscall`; EXIT does not return.
        unsafe {
            core::arch::asm!("int 0x80", in("rax") sys::EXIT, in("rdi") 0u64, options(nostack));
        }
    }
}

/// Faults on purpose (`workload::CRASH`); the kernel kills this process only.
fn crash(kind: u64) -> ! {
    // SAFETY: each arm executes an instruction that raises an exception in ring 3; the kernel
    // never returns to this process afterwards.
    unsafe {
        match kind {
            1 => core::arch::asm!("ud2", options(noreturn)),
            2 => core::arch::asm!(
                "xor edx, edx",
                "xor eax, eax",
                "xor ecx, ecx",
                "div rcx",
                options(noreturn)
            ),
            3 => core::arch::asm!("cli", "ud2", options(noreturn)),
            _ => {
                (0xdead_0000 as *mut u64).write_volatile(0xbad);
                core::arch::asm!("ud2", options(noreturn))
            }
        }
    }
}

#[no_mangle]
#[link_section = ".text._start"]
pub extern "C" fn _start(mailbox_va: u64, mailbox_gpa: u64) -> ! {
    let mb = mailbox_va as *mut Mailbox;
    // SAFETY: the kernel mapped the mailbox at `mailbox_va` and filled `spec`, `heap_*`,
    // `tsc_khz` and `blob_*` before starting the process; the VMM does not write these fields.
    let (spec, heap_va, heap_bytes, tsc_khz, blob_va, blob_bytes) = unsafe {
        (
            addr_of!((*mb).spec).read_volatile(),
            addr_of!((*mb).heap_va).read_volatile(),
            addr_of!((*mb).heap_bytes).read_volatile(),
            addr_of!((*mb).tsc_khz).read_volatile(),
            addr_of!((*mb).blob_va).read_volatile(),
            addr_of!((*mb).blob_bytes).read_volatile(),
        )
    };
    let mut g = Guest {
        mb,
        gpa: mailbox_gpa as u32,
        tsc_khz,
    };
    put!(g, state, state::RUNNING);
    if spec.workload == workload::CRASH {
        g.doorbell();
        crash(spec.params[0]);
    }
    // SAFETY: the kernel maps `heap_bytes` (a multiple of 4 KiB) at `heap_va` for this process
    // only, readable and writable (premapped or demand-paged); nothing else aliases it here.
    let heap =
        unsafe { core::slice::from_raw_parts_mut(heap_va as *mut u64, (heap_bytes / 8) as usize) };
    let params = Params {
        ws_bytes: spec.ws_bytes,
        seed: spec.seed,
        params: spec.params,
    };
    let blob: &[u8] = if blob_va != 0 && blob_bytes != 0 {
        // SAFETY: the kernel mapped the boot blob's `blob_bytes` (rounded up to 4 KiB)
        // read-only at `blob_va` for this process and wrote both fields before starting it;
        // nothing writes the blob while the guest runs.
        unsafe { core::slice::from_raw_parts(blob_va as *const u8, blob_bytes as usize) }
    } else {
        &[]
    };
    match farvm_workloads::run_blob(spec.workload, &params, heap, blob, &mut g) {
        Ok(o) => {
            put!(g, checksum, o.checksum);
            put!(g, ops, o.ops);
            put!(g, elapsed_ns, o.elapsed_ns);
            put!(g, state, state::DONE);
        }
        Err(e) => {
            put!(g, error, e.code());
            put!(g, state, state::FAILED);
        }
    }
    g.doorbell();
    exit()
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // A ring-3 panic is a bug in the workload: fault so the kernel reports it as KILLED (#UD).
    // SAFETY: ud2 only raises #UD.
    unsafe { core::arch::asm!("ud2", options(noreturn)) }
}
