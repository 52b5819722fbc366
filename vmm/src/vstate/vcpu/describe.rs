//! What a vCPU was doing, in words: its position (RIP, CPL, CR3, CR2, RSP and the
//! instruction bytes there) for a crash or a timeout, its full state (MP state, RFLAGS,
//! pending events, the local APIC) for a stall report, and KVM's internal-error details.

use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress};

use super::super::memory::GuestRam;
use super::super::pagewalk;
use super::registers;

pub(super) fn describe_position(fd: &VcpuFd, ram: &GuestRam) -> String {
    let Ok((regs, sregs)) = registers(fd) else {
        return String::new();
    };
    let mut s = format!(
        " at RIP {:#x} (CPL {}, CR3 {:#x}, CR2 {:#x}, RSP {:#x})",
        regs.rip,
        sregs.cs.selector & 3,
        sregs.cr3,
        sregs.cr2,
        regs.rsp
    );
    if let Some(bytes) = instruction_bytes(ram, sregs.cr3, regs.rip) {
        s.push_str(&format!("; instruction bytes: {bytes}"));
    }
    s
}

/// A vCPU's state for a stall report: MP state, position, RFLAGS, pending events and the local
/// APIC's priority, service and request registers and timer.
pub(super) fn describe_state(fd: &VcpuFd, ram: &GuestRam) -> String {
    let mp_state = fd.get_mp_state().map_or(u32::MAX, |m| m.mp_state);
    let mut s = format!("mp_state {mp_state}{}", describe_position(fd, ram));
    if let Ok(regs) = fd.get_regs() {
        s.push_str(&format!(
            "; RFLAGS {:#x} (IF {})",
            regs.rflags,
            (regs.rflags >> 9) & 1
        ));
    }
    if let Ok(e) = fd.get_vcpu_events() {
        s.push_str(&format!(
            "; events: interrupt injected {} nr {} shadow {}, nmi injected {} pending {} \
             masked {}, exception injected {} pending {} nr {}",
            e.interrupt.injected,
            e.interrupt.nr,
            e.interrupt.shadow,
            e.nmi.injected,
            e.nmi.pending,
            e.nmi.masked,
            e.exception.injected,
            e.exception.pending,
            e.exception.nr
        ));
    }
    if let Ok(lapic) = fd.get_lapic() {
        let reg = |off: usize| {
            let b = &lapic.regs[off..off + 4];
            u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8])
        };
        // 256-bit registers: eight 32-bit words, 16 bytes apart; printed high word first.
        let bits = |base: usize| {
            (0..8)
                .rev()
                .map(|i| format!("{:08x}", reg(base + i * 0x10)))
                .collect::<Vec<_>>()
                .join("")
        };
        s.push_str(&format!(
            "; lapic: id {:#x} TPR {:#x} PPR {:#x} SVR {:#x} ISR {} IRR {} LVT timer {:#x} \
             TMICT {:#x} TMCCT {:#x} TDCR {:#x} LINT0 {:#x} LINT1 {:#x}",
            reg(0x20) >> 24,
            reg(0x80),
            reg(0xa0),
            reg(0xf0),
            bits(0x100),
            bits(0x200),
            reg(0x320),
            reg(0x380),
            reg(0x390),
            reg(0x3e0),
            reg(0x350),
            reg(0x360)
        ));
    }
    s
}

fn instruction_bytes(ram: &GuestRam, cr3: u64, rip: u64) -> Option<String> {
    let gpa = pagewalk::translate(ram, cr3, rip)?;
    let n = (0x1000 - (gpa & 0xfff)).min(15) as usize;
    let mut b = [0u8; 15];
    ram.read_slice(&mut b[..n], GuestAddress(gpa)).ok()?;
    Some(
        b[..n]
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

pub(super) fn describe_internal_error(fd: &mut VcpuFd, ram: &GuestRam) -> String {
    // SAFETY: exit_reason was KVM_EXIT_INTERNAL_ERROR, so `internal` is the active union field.
    let internal = unsafe { fd.get_kvm_run().__bindgen_anon_1.internal };
    let kind = match internal.suberror {
        1 => "emulation failure (an instruction KVM's emulator cannot execute)",
        2 => "exception while delivering an exception",
        3 => "event delivery failed",
        4 => "unexpected exit reason",
        _ => "unknown suberror",
    };
    let nd = (internal.ndata as usize).min(internal.data.len());
    let data: Vec<String> = internal.data[..nd]
        .iter()
        .map(|d| format!("{d:#x}"))
        .collect();
    format!(
        "KVM_EXIT_INTERNAL_ERROR suberror {} ({kind}){}{}",
        internal.suberror,
        describe_position(fd, ram),
        if data.is_empty() {
            String::new()
        } else {
            format!("; data [{}]", data.join(", "))
        }
    )
}
