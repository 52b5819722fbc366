//! The serial console (the 16550 UART at COM1): the kernel writes its boot line, one line per
//! process that ends (with its checksum) and its power-off line there, so the results can be
//! read by whoever holds the console — `farvm run`'s stdout, a file, or the pty a manager such
//! as libvirt gives the VM — without farvm's PV channel. Every byte is one emulated `out` (plus
//! an `in` for the transmitter status), so the kernel writes only these few short lines.
//!
//! Lines are whole: a spin lock keeps vCPUs from interleaving them.
//!
//! Console input: the UART's receive interrupt (IRQ 4, through the legacy PIC to vCPU 0's
//! LINT0) preempts whatever process vCPU 0 runs; the handler drains the receive FIFO and writes
//! each typed line back as `farvm-testguest: console LINE`, so a manager can see the guest
//! react to its console. Input reaches the guest while vCPU 0 has processes to run.

use core::hint::spin_loop;
use core::sync::atomic::{AtomicBool, Ordering};

use crate::arch::{inb, outb};
use crate::global::Global;

const COM1: u16 = 0x3f8;
/// Interrupt enable register, and its "received data available" bit.
const IER: u16 = COM1 + 1;
const IER_RX: u8 = 0x01;
/// Modem control register: OUT2 gates the UART's interrupt line on a PC.
const MCR: u16 = COM1 + 4;
const MCR_OUT2: u8 = 0x08;
/// Line status register, its "data ready" and "transmit holding register empty" bits.
const LSR: u16 = COM1 + 5;
const LSR_DATA_READY: u8 = 0x01;
const LSR_THR_EMPTY: u8 = 0x20;

/// The 8259 PICs: command and data ports, ICW1 (edge, cascade, ICW4 follows), ICW4 (8086
/// mode), the end-of-interrupt command.
const PIC1_CMD: u16 = 0x20;
const PIC1_DATA: u16 = 0x21;
const PIC2_CMD: u16 = 0xA0;
const PIC2_DATA: u16 = 0xA1;
const ICW1_INIT: u8 = 0x11;
const ICW4_8086: u8 = 0x01;
const PIC_EOI: u8 = 0x20;
/// The master PIC's vectors start here (above the CPU's exceptions and the LAPIC timer), so
/// COM1's IRQ 4 is [`crate::trap::VEC_CONSOLE`]; the slave's follow.
pub const PIC1_BASE: u8 = 0x28;
const PIC2_BASE: u8 = 0x30;
const COM1_IRQ: u8 = 4;
const _: () = assert!(crate::trap::VEC_CONSOLE == (PIC1_BASE + COM1_IRQ) as u64);

/// The line being typed (only vCPU 0 takes the interrupt; it runs with interrupts off).
struct Input {
    len: usize,
    bytes: [u8; 72],
}
static INPUT: Global<Input> = Global::new(Input {
    len: 0,
    bytes: [0; 72],
});
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

/// Routes COM1's receive interrupt to vCPU 0 (the BSP, once, before its first process runs):
/// the PICs remapped above the exceptions with every line but IRQ 4 masked (the PIT's IRQ 0
/// stays off), LINT0 as ExtINT, the UART's receive interrupt on.
pub fn init_input() {
    outb(PIC1_CMD, ICW1_INIT);
    outb(PIC2_CMD, ICW1_INIT);
    outb(PIC1_DATA, PIC1_BASE);
    outb(PIC2_DATA, PIC2_BASE);
    outb(PIC1_DATA, 1 << 2); // the slave on IRQ 2
    outb(PIC2_DATA, 2); // its cascade identity
    outb(PIC1_DATA, ICW4_8086);
    outb(PIC2_DATA, ICW4_8086);
    outb(PIC1_DATA, !(1 << COM1_IRQ));
    outb(PIC2_DATA, 0xFF);
    crate::lapic::route_extint();
    outb(MCR, MCR_OUT2);
    outb(IER, IER_RX);
}

/// The receive interrupt (vCPU 0, from ring 3): drains the receive FIFO; every complete line
/// is written back on the console.
pub fn input_interrupt() {
    // SAFETY: only vCPU 0 runs this, with interrupts off, so nothing else touches INPUT.
    let input = unsafe { &mut *INPUT.get() };
    while inb(LSR) & LSR_DATA_READY != 0 {
        match inb(COM1) {
            b'\r' | b'\n' => {
                if input.len > 0 {
                    Line::start()
                        .s(b"console ")
                        .s(&input.bytes[..input.len]);
                    input.len = 0;
                }
            }
            b @ 0x20..=0x7E if input.len < input.bytes.len() => {
                input.bytes[input.len] = b;
                input.len += 1;
            }
            _ => {}
        }
    }
    outb(PIC1_CMD, PIC_EOI);
}
