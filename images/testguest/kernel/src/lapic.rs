//! The local APIC timer in x2APIC mode (MSR access, no MMIO): periodic, vector 0x20, divide by
//! 1 (KVM's LAPIC bus runs at 1 GHz). Armed only while more than one process is runnable on the
//! vCPU, so a lone process runs without any timer interrupt.

use crate::arch::{rdmsr, wrmsr, MSR_APIC_BASE};
use crate::trap::VEC_TIMER;

const X2APIC_ENABLE: u64 = (1 << 10) | (1 << 11);
const MSR_EOI: u32 = 0x80B;
const MSR_SVR: u32 = 0x80F;
const MSR_LVT_TIMER: u32 = 0x832;
const MSR_LVT_LINT0: u32 = 0x835;
const LVT_EXTINT: u64 = 0x700;
const MSR_TIMER_INIT: u32 = 0x838;
const MSR_TIMER_DIV: u32 = 0x83E;
const LVT_PERIODIC: u64 = 1 << 17;
const LVT_MASKED: u64 = 1 << 16;
const BUS_HZ: u64 = 1_000_000_000;

/// Enables the x2APIC with the timer stopped.
pub fn init() {
    wrmsr(MSR_APIC_BASE, rdmsr(MSR_APIC_BASE) | X2APIC_ENABLE);
    wrmsr(MSR_SVR, 0x100 | 0xFF);
    wrmsr(MSR_TIMER_DIV, 0xB);
    wrmsr(MSR_LVT_TIMER, VEC_TIMER | LVT_PERIODIC | LVT_MASKED);
    wrmsr(MSR_TIMER_INIT, 0);
}

/// Starts the periodic timer at `hz` (> 0).
pub fn arm(hz: u32) {
    wrmsr(MSR_LVT_TIMER, VEC_TIMER | LVT_PERIODIC);
    wrmsr(MSR_TIMER_INIT, BUS_HZ / hz.max(1) as u64);
}

pub fn disarm() {
    wrmsr(MSR_TIMER_INIT, 0);
    wrmsr(MSR_LVT_TIMER, VEC_TIMER | LVT_PERIODIC | LVT_MASKED);
}

/// LINT0 as ExtINT, unmasked: the legacy PIC's interrupts reach this vCPU (the BSP).
pub fn route_extint() {
    wrmsr(MSR_LVT_LINT0, LVT_EXTINT);
}

pub fn eoi() {
    wrmsr(MSR_EOI, 0);
}
