//! A vCPU's architectural state as KVM holds it — what a snapshot saves and a restore puts
//! back: MP state, general and special registers, the XSAVE area (FPU, SSE, AVX), XCRs, debug
//! registers, the local APIC, every MSR KVM lists and the pending events. Read on the vCPU's
//! own thread while it is parked ([`super::VcpuEvent::SaveState`]), written before its thread
//! starts ([`VcpuState::apply`]); the order of the writes is Firecracker's (the APIC before
//! the MSRs, so a TSC-deadline timer lands on a configured APIC; events last).

use std::sync::OnceLock;

use kvm_bindings::{
    kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs,
    kvm_vcpu_events, kvm_xcrs, kvm_xsave, Msrs,
};
use kvm_ioctls::{Kvm, VcpuFd};
use serde::{Deserialize, Serialize};

use super::super::vm::{ioctl, KvmError};

/// One vCPU's state (module doc). The KVM structures serialise as their bytes.
#[derive(Serialize, Deserialize)]
pub struct VcpuState {
    /// Runnable, halted, waiting for SIPI.
    pub mp_state: kvm_mp_state,
    /// General registers, RIP, RFLAGS.
    pub regs: kvm_regs,
    /// Segments, control registers, EFER, the APIC base, pending interrupt bitmap.
    pub sregs: kvm_sregs,
    /// The XSAVE area: x87, SSE, AVX state (4 KiB).
    pub xsave: kvm_xsave,
    /// Extended control registers (XCR0).
    pub xcrs: kvm_xcrs,
    /// DR0..DR7.
    pub debug_regs: kvm_debugregs,
    /// The local APIC's registers (timer included).
    pub lapic: kvm_lapic_state,
    /// `(index, value)` of every MSR of KVM's index list this vCPU could read.
    pub msrs: Vec<(u32, u64)>,
    /// Pending exceptions, interrupts, NMIs, interrupt shadow.
    pub events: kvm_vcpu_events,
}

impl std::fmt::Debug for VcpuState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VcpuState")
            .field("mp_state", &self.mp_state.mp_state)
            .field("rip", &format_args!("{:#x}", self.regs.rip))
            .field("cr3", &format_args!("{:#x}", self.sregs.cr3))
            .field("msrs", &self.msrs.len())
            .finish_non_exhaustive()
    }
}

/// The MSR indices KVM saves and restores (`KVM_GET_MSR_INDEX_LIST`), read once per process
/// (first by [`super::group::VcpuGroup::spawn`], off the vCPU threads).
pub(super) fn msr_index_list() -> Result<&'static [u32], KvmError> {
    static LIST: OnceLock<Vec<u32>> = OnceLock::new();
    if let Some(l) = LIST.get() {
        return Ok(l);
    }
    let kvm = Kvm::new().map_err(KvmError::Open)?;
    let list = kvm
        .get_msr_index_list()
        .map_err(ioctl("KVM_GET_MSR_INDEX_LIST"))?;
    Ok(LIST.get_or_init(|| list.as_slice().to_vec()))
}

fn msrs_of(entries: &[kvm_msr_entry]) -> Result<Msrs, KvmError> {
    Msrs::from_entries(entries).map_err(|e| {
        KvmError::Unsupported(format!(
            "{} MSRs do not fit KVM's list: {e:?}",
            entries.len()
        ))
    })
}

/// Reads every MSR of `indices` KVM lets this vCPU read. KVM_GET_MSRS stops at the first one
/// it refuses (one the CPU lacks): that one is skipped and the read goes on after it.
fn read_msrs(fd: &VcpuFd, indices: &[u32]) -> Result<Vec<(u32, u64)>, KvmError> {
    let mut out = Vec::with_capacity(indices.len());
    let mut rest = indices;
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> = rest
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                ..Default::default()
            })
            .collect();
        let mut msrs = msrs_of(&entries)?;
        let n = fd.get_msrs(&mut msrs).map_err(ioctl("KVM_GET_MSRS"))?;
        out.extend(msrs.as_slice()[..n].iter().map(|e| (e.index, e.data)));
        // Entry `n` was refused: skip it.
        rest = rest.get(n + 1..).unwrap_or(&[]);
    }
    Ok(out)
}

/// Writes `msrs`; one KVM refuses is skipped (logged) and the write goes on after it.
pub(crate) fn write_msrs(fd: &VcpuFd, msrs: &[(u32, u64)]) -> Result<(), KvmError> {
    let mut rest = msrs;
    while !rest.is_empty() {
        let entries: Vec<kvm_msr_entry> = rest
            .iter()
            .map(|&(index, data)| kvm_msr_entry {
                index,
                data,
                ..Default::default()
            })
            .collect();
        let n = fd
            .set_msrs(&msrs_of(&entries)?)
            .map_err(ioctl("KVM_SET_MSRS"))?;
        if let Some((index, _)) = rest.get(n) {
            tracing::debug!("KVM refused to restore MSR {index:#x}; skipped");
        }
        rest = rest.get(n + 1..).unwrap_or(&[]);
    }
    Ok(())
}

impl VcpuState {
    /// Reads the state of `fd` (its thread must be outside KVM_RUN).
    pub fn read(fd: &VcpuFd) -> Result<Self, KvmError> {
        Ok(VcpuState {
            mp_state: fd.get_mp_state().map_err(ioctl("KVM_GET_MP_STATE"))?,
            regs: fd.get_regs().map_err(ioctl("KVM_GET_REGS"))?,
            sregs: fd.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?,
            xsave: fd.get_xsave().map_err(ioctl("KVM_GET_XSAVE"))?,
            xcrs: fd.get_xcrs().map_err(ioctl("KVM_GET_XCRS"))?,
            debug_regs: fd.get_debug_regs().map_err(ioctl("KVM_GET_DEBUGREGS"))?,
            lapic: fd.get_lapic().map_err(ioctl("KVM_GET_LAPIC"))?,
            msrs: read_msrs(fd, msr_index_list()?)?,
            events: fd.get_vcpu_events().map_err(ioctl("KVM_GET_VCPU_EVENTS"))?,
        })
    }

    /// Puts this state on `fd` (a vCPU whose thread has not run yet).
    pub fn apply(&self, fd: &VcpuFd) -> Result<(), KvmError> {
        fd.set_mp_state(self.mp_state)
            .map_err(ioctl("KVM_SET_MP_STATE"))?;
        fd.set_regs(&self.regs).map_err(ioctl("KVM_SET_REGS"))?;
        fd.set_sregs(&self.sregs).map_err(ioctl("KVM_SET_SREGS"))?;
        // SAFETY: KVM_SET_XSAVE reads the guest FPU's user-ABI size from the buffer, which is
        // at most the 4 KiB of `kvm_xsave` unless the VMM asked for dynamic XSTATE features
        // (AMX) with arch_prctl(ARCH_REQ_XCOMP_GUEST_PERM); farvm never does.
        unsafe { fd.set_xsave(&self.xsave) }.map_err(ioctl("KVM_SET_XSAVE"))?;
        fd.set_xcrs(&self.xcrs).map_err(ioctl("KVM_SET_XCRS"))?;
        fd.set_debug_regs(&self.debug_regs)
            .map_err(ioctl("KVM_SET_DEBUGREGS"))?;
        fd.set_lapic(&self.lapic).map_err(ioctl("KVM_SET_LAPIC"))?;
        write_msrs(fd, &self.msrs)?;
        fd.set_vcpu_events(&self.events)
            .map_err(ioctl("KVM_SET_VCPU_EVENTS"))?;
        Ok(())
    }
}
