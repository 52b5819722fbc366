//! The kernel's side of the paravirtual device: log lines, panics, shutdown, and bulk memory
//! operations done by the VMM (ring-0 loops are emulated at ~1 µs per instruction here).
//!
//! The records a port refers to live in the kernel image (.bss, guest-physical < 1 GiB) so their
//! GPA fits the 32-bit port value. One record of each kind per vCPU: no locking.

use core::ptr::{addr_of, addr_of_mut};

use farvm_guest_agent::pv::{self, bulk, status, BulkOp, LogRecord, LOG_MAX};

use crate::arch::{image_gpa, outl};
use crate::global::Global;
use crate::MAX_CPUS;

static LOGS: Global<[LogRecord; MAX_CPUS]> = Global::new(
    [LogRecord {
        len: 0,
        cpu: 0,
        bytes: [0; LOG_MAX],
    }; MAX_CPUS],
);

#[repr(C, align(64))]
struct BulkSlot(BulkOp);
static BULK: Global<[BulkSlot; MAX_CPUS]> = Global::new(
    [const {
        BulkSlot(BulkOp {
            op: 0,
            status: 0,
            dst: 0,
            src: 0,
            len: 0,
            pte_flags: 0,
            aux: [0; 4],
        })
    }; MAX_CPUS],
);

/// A log line being built in this vCPU's record (no `core::fmt`: its code uses SSE).
pub struct Msg {
    rec: *mut LogRecord,
    len: usize,
}

impl Msg {
    pub fn new(cpu: usize) -> Msg {
        let cpu = cpu.min(MAX_CPUS - 1);
        // SAFETY: each vCPU only uses its own record, so there is no concurrent access.
        let rec = unsafe { addr_of_mut!((*LOGS.get())[cpu]) };
        // SAFETY: as above.
        unsafe { (*rec).cpu = cpu as u32 };
        Msg { rec, len: 0 }
    }

    pub fn s(mut self, text: &[u8]) -> Msg {
        for &b in text {
            if self.len == LOG_MAX {
                break;
            }
            // SAFETY: len < LOG_MAX; the record belongs to this vCPU.
            unsafe { (*self.rec).bytes[self.len] = b };
            self.len += 1;
        }
        self
    }

    pub fn dec(self, v: u64) -> Msg {
        let mut buf = [0u8; 20];
        self.s(crate::num::dec(v, &mut buf))
    }

    pub fn hex(self, v: u64) -> Msg {
        let mut buf = [0u8; 18];
        self.s(crate::num::hex(v, &mut buf))
    }

    fn finish(&self) -> u32 {
        // SAFETY: the record belongs to this vCPU.
        unsafe { (*self.rec).len = self.len as u32 };
        image_gpa(self.rec) as u32
    }

    /// Sends the line to the VMM's log (to the serial console without the PV device).
    pub fn log(self) {
        if crate::pvh::booted() {
            self.to_console();
            return;
        }
        outl(pv::PORT_LOG, self.finish());
    }

    /// Reports a kernel panic with this text; the VMM stops the VM.
    pub fn panic(self) -> ! {
        if crate::pvh::booted() {
            self.to_console();
            shutdown(PANIC_STATUS);
        }
        outl(pv::PORT_PANIC, self.finish());
        crate::arch::halt_forever()
    }

    /// Writes the line on the serial console.
    fn to_console(&self) {
        let mut line = crate::console::Line::start();
        for i in 0..self.len {
            // SAFETY: i < len <= LOG_MAX; the record belongs to this vCPU.
            line = line.s(&[unsafe { (*self.rec).bytes[i] }]);
        }
    }
}

/// QEMU's `isa-debug-exit` device (`-device isa-debug-exit,iobase=0xf4,iosize=4`): QEMU exits
/// with status `(value << 1) | 1` when the guest writes `value` here.
pub const DEBUG_EXIT_PORT: u16 = 0xf4;
/// The power-off status of a kernel panic without the PV device (above every `boot::exit`).
pub const PANIC_STATUS: u32 = 64;

/// Powers the VM off with `status` (`farvm_guest_agent::boot::exit::*`): through the PV device,
/// or, entered through PVH, through `isa-debug-exit`.
pub fn shutdown(status: u32) -> ! {
    if crate::pvh::booted() {
        outl(DEBUG_EXIT_PORT, status);
    } else {
        outl(pv::PORT_SHUTDOWN, status);
    }
    crate::arch::halt_forever()
}

/// Performs a bulk operation through the VMM; returns its status (`pv::status::*`).
pub fn bulk_op(
    cpu: usize,
    op: u32,
    dst: u64,
    src: u64,
    len: u64,
    pte_flags: u64,
    aux: [u64; 4],
) -> u32 {
    let cpu = cpu.min(MAX_CPUS - 1);
    // SAFETY: each vCPU only uses its own record; volatile so every field is in memory when
    // the VMM reads it at the `out`, and `status` is re-read after it.
    unsafe {
        let b = addr_of_mut!((*BULK.get())[cpu].0);
        addr_of_mut!((*b).op).write_volatile(op);
        addr_of_mut!((*b).status).write_volatile(status::PENDING);
        addr_of_mut!((*b).dst).write_volatile(dst);
        addr_of_mut!((*b).src).write_volatile(src);
        addr_of_mut!((*b).len).write_volatile(len);
        addr_of_mut!((*b).pte_flags).write_volatile(pte_flags);
        addr_of_mut!((*b).aux).write_volatile(aux);
        outl(pv::PORT_BULK, image_gpa(b) as u32);
        addr_of!((*b).status).read_volatile()
    }
}

/// Zeroes `len` bytes of guest-physical memory at `gpa` (through the VMM). Returns false if
/// the VMM refused.
pub fn zero(cpu: usize, gpa: u64, len: u64) -> bool {
    bulk_op(cpu, bulk::ZERO, gpa, 0, len, 0, [0; 4]) == status::OK
}

/// Copies `len` bytes between guest-physical ranges (through the VMM).
pub fn copy(cpu: usize, dst: u64, src: u64, len: u64) -> bool {
    bulk_op(cpu, bulk::COPY, dst, src, len, 0, [0; 4]) == status::OK
}
