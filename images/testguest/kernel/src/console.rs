//! The serial console (the 16550 UART at COM1): the kernel writes its boot line, one line per
//! process that ends (with its checksum) and its power-off line there, so the results can be
//! read by whoever holds the console — `farvm run`'s stdout, a file, or the pty a manager such
//! as libvirt gives the VM — without farvm's PV channel. Every byte is one emulated `out` (plus
//! an `in` for the transmitter status), so the kernel writes only these few short lines.
//!
//! Lines are whole: a spin lock keeps vCPUs from interleaving them.

use core::hint::spin_loop;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::arch::{inb, outb};

const COM1: u16 = 0x3f8;
/// Line status register, and its "transmit holding register empty" bit.
const LSR: u16 = COM1 + 5;
const LSR_THR_EMPTY: u8 = 0x20;
/// Status polls before a byte is sent anyway (an emulated UART is always ready).
const MAX_POLLS: u32 = 1000;

static LOCK: AtomicBool = AtomicBool::new(false);

/// A line being written; the console is this vCPU's until it is dropped (after its newline).
pub struct Line(());

impl Line {
    pub fn start() -> Line {
        while LOCK.swap(true, Ordering::Acquire) {
            spin_loop();
        }
        Line(()).s(b"farvm-testguest: ")
    }

    pub fn s(self, text: &[u8]) -> Line {
        for &b in text {
            put(b);
        }
        self
    }

    pub fn dec(self, v: u64) -> Line {
        let mut buf = [0u8; 20];
        self.s(crate::num::dec(v, &mut buf))
    }

    pub fn hex(self, v: u64) -> Line {
        let mut buf = [0u8; 18];
        self.s(crate::num::hex(v, &mut buf))
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        put(b'\n');
        LOCK.store(false, Ordering::Release);
    }
}

fn put(b: u8) {
    let mut polls = 0;
    while inb(LSR) & LSR_THR_EMPTY == 0 && polls < MAX_POLLS {
        polls += 1;
        spin_loop();
    }
    outb(COM1, b);
}
