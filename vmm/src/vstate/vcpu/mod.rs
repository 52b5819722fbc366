//! vCPUs: creation with per-vCPU CPUID and their entry registers (here), the threads that run
//! them (`run.rs`), each behind a [`VcpuHandle`] ([`handle`]) and all of a VM's together in a
//! [`VcpuGroup`] ([`group`]), their full state for snapshots ([`state`]), and the seam to the VM's devices ([`VcpuExits`], [`exits`]).
//! Nothing here knows the VM above it: a vCPU hands device exits to [`VcpuExits`] and ends the
//! VM through its [`OutcomeLatch`](super::outcome::OutcomeLatch).

mod describe;
pub mod exits;
pub mod group;
pub mod handle;
mod run;
pub mod state;

use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;

pub use exits::{DeviceAction, VcpuExits};
pub use group::{SpawnError, VcpuError, VcpuGroup};
pub use handle::{SavedState, VcpuEvent, VcpuHandle, VcpuResponse};
pub use state::VcpuState;

use super::cpuid;
use super::regs::{self, EntryState};
use super::vm::{ioctl, KvmError, KvmVm};

/// How the guest brings up its vCPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApStart {
    /// Every vCPU enters the kernel at the same entry point, `rsi` = its index (the test
    /// guest, which has no INIT/SIPI code).
    AllAtEntry,
    /// Only vCPU 0 (the bootstrap processor) runs at the entry point; the others wait for
    /// INIT/SIPI from the guest, which finds them in the MADT (Linux).
    WaitForSipi,
}

/// Creates `ncpus` vCPUs with CPUID set (KVM's supported set, this vCPU's APIC id patched in,
/// and without KVM's paravirtual async page faults if `hide_pv_async_pf`: see
/// [`cpuid::hide_async_pf`]).
pub fn create(vm: &KvmVm, ncpus: u32, hide_pv_async_pf: bool) -> Result<Vec<VcpuFd>, KvmError> {
    let max = vm.kvm.get_max_vcpus();
    if ncpus == 0 || ncpus as usize > max {
        return Err(KvmError::Unsupported(format!(
            "{ncpus} vCPUs requested; KVM supports 1..={max}"
        )));
    }
    let supported = vm
        .kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(ioctl("KVM_GET_SUPPORTED_CPUID"))?;
    if hide_pv_async_pf && !cpuid::has_kvmclock(&supported) {
        tracing::warn!(
            "KVM offers no kvmclock here: a Linux guest falls back to calibrating its clocks \
             against the PIT"
        );
    }
    let mut vcpus = Vec::with_capacity(ncpus as usize);
    for i in 0..ncpus {
        let vcpu = vm
            .fd
            .create_vcpu(u64::from(i))
            .map_err(ioctl("KVM_CREATE_VCPU"))?;
        let mut c = supported.clone();
        cpuid::patch(&mut c, i, ncpus);
        if hide_pv_async_pf {
            cpuid::hide_async_pf(&mut c);
        }
        vcpu.set_cpuid2(&c).map_err(ioctl("KVM_SET_CPUID2"))?;
        vcpus.push(vcpu);
    }
    Ok(vcpus)
}

/// KVM_GET_TSC_KHZ of a vCPU.
pub fn tsc_khz(vcpu: &VcpuFd) -> Result<u64, KvmError> {
    Ok(u64::from(
        vcpu.get_tsc_khz().map_err(ioctl("KVM_GET_TSC_KHZ"))?,
    ))
}

/// Sets the entry registers per `start`: every vCPU's (vCPU `i` gets `rsi = i`) and the APs
/// made runnable, or the bootstrap processor's only, the APs left in KVM's wait-for-SIPI state.
pub fn set_entry(vcpus: &[VcpuFd], entry: &EntryState, start: ApStart) -> Result<(), KvmError> {
    for (i, vcpu) in vcpus.iter().enumerate() {
        let mut e = *entry;
        match start {
            ApStart::AllAtEntry => e.rsi = i as u64,
            // With the in-kernel irqchip KVM creates APs in "wait for SIPI"
            // (KVM_MP_STATE_UNINITIALIZED); the guest's INIT/SIPI starts them in real mode.
            ApStart::WaitForSipi if i > 0 => break,
            ApStart::WaitForSipi => {}
        }
        regs::set_entry(vcpu, &e)?;
        if i > 0 {
            // With an in-kernel irqchip APs start in "wait for SIPI"; the test guest has no
            // INIT/SIPI code, so the VMM starts them directly.
            vcpu.set_mp_state(kvm_bindings::kvm_mp_state {
                mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
            })
            .map_err(ioctl("KVM_SET_MP_STATE"))?;
        }
    }
    Ok(())
}

/// The registers of a vCPU as KVM holds them.
pub fn registers(vcpu: &VcpuFd) -> Result<(kvm_regs, kvm_sregs), KvmError> {
    let r = vcpu.get_regs().map_err(ioctl("KVM_GET_REGS"))?;
    let s = vcpu.get_sregs().map_err(ioctl("KVM_GET_SREGS"))?;
    Ok((r, s))
}
