//! The 64-bit entry register state: long mode with paging, flat segments, SSE enabled; what
//! the boot path decides ([`EntryState`]) and how a vCPU is set to it.

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_segment};
use kvm_ioctls::VcpuFd;

use super::vm::KvmError;

/// The initial register state of one vCPU, as the boot path decided it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntryState {
    /// Instruction pointer.
    pub rip: u64,
    /// `rsi` (Linux: `boot_params`; test guest: the vCPU index).
    pub rsi: u64,
    /// `rdi` (test guest: `BootInfo`).
    pub rdi: u64,
    /// Stack pointer.
    pub rsp: u64,
    /// Page-table root.
    pub cr3: u64,
    /// Code and data selectors loaded in the hidden segment state.
    pub code_selector: u16,
    /// See `code_selector`.
    pub data_selector: u16,
    /// Base of the boot GDT.
    pub gdt_base: u64,
    /// Its limit.
    pub gdt_limit: u16,
}

/// PG|AM|WP|NE|ET|MP|PE: paging on, FPU native (EM=0, TS=0).
pub const CR0: u64 = 0x8005_0033;
/// PAE|OSFXSR|OSXMMEXCPT: SSE usable in ring 3 (the guest may set OSXSAVE itself).
pub const CR4: u64 = 0x620;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
const EFER_NXE: u64 = 1 << 11;
/// EFER for 64-bit mode with NX: LME, LMA, NXE.
pub const EFER: u64 = EFER_LME | EFER_LMA | EFER_NXE;

fn code_segment(selector: u16) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: 0xb,
        present: 1,
        dpl: 0,
        db: 0,
        s: 1,
        l: 1,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

fn data_segment(selector: u16) -> kvm_segment {
    kvm_segment {
        type_: 0x3,
        db: 1,
        l: 0,
        ..code_segment(selector)
    }
}

/// Programs sregs, regs and FPU of `vcpu` for `entry`.
pub fn set_entry(vcpu: &VcpuFd, entry: &EntryState) -> Result<(), KvmError> {
    let err = |what| move |source| KvmError::Ioctl { what, source };
    let mut sregs = vcpu.get_sregs().map_err(err("KVM_GET_SREGS"))?;
    sregs.cs = code_segment(entry.code_selector);
    let data = data_segment(entry.data_selector);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.gdt.base = entry.gdt_base;
    sregs.gdt.limit = entry.gdt_limit;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr0 = CR0;
    sregs.cr3 = entry.cr3;
    sregs.cr4 = CR4;
    sregs.efer = EFER;
    vcpu.set_sregs(&sregs).map_err(err("KVM_SET_SREGS"))?;
    let regs = kvm_regs {
        rip: entry.rip,
        rsi: entry.rsi,
        rdi: entry.rdi,
        rsp: entry.rsp,
        rflags: 0x2,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(err("KVM_SET_REGS"))?;
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(err("KVM_SET_FPU"))?;
    Ok(())
}
