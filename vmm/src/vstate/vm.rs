//! The KVM VM: the `/dev/kvm` handle, the VM fd with its in-kernel irqchip, one memslot per
//! guest RAM region, and (with remote memory) KVM's async page faults turned off.

use std::sync::Arc;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VmFd};

use super::memory::GuestRam;

/// Errors from KVM setup and vCPU ioctls.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    /// `/dev/kvm` cannot be opened.
    #[error("cannot open /dev/kvm: {0} (is KVM available and are you allowed to use it?)")]
    Open(kvm_ioctls::Error),
    /// A KVM ioctl failed.
    #[error("{what}: {source}")]
    Ioctl {
        /// What was being done.
        what: &'static str,
        /// KVM's error.
        source: kvm_ioctls::Error,
    },
    /// This KVM lacks a capability farvm needs.
    #[error("{0}")]
    Unsupported(String),
}

pub(crate) fn ioctl(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> KvmError {
    move |source| KvmError::Ioctl { what, source }
}

/// Turns off KVM's async page faults for this VM, so a guest fault on a page the host must
/// fault in (a userfaultfd page) is resolved on the vCPU thread itself.
///
/// For a guest without PV async PF, KVM otherwise parks the vCPU in an artificial halt and has
/// a worker thread fault the page in: userfaultfd then reports the worker's thread id (no
/// vCPU, so no guest-process attribution) and every fault costs two more thread hand-offs
/// (measured here: all 40,629 faults of a stride run unattributed; with this off, none, and
/// the run 24% faster). KVM does not do async PF for a VM whose HLT exits are disabled, so
/// that is how it is turned off (KVM_CAP_X86_DISABLE_EXITS, HLT). On VMX/SVM a guest HLT then
/// halts in guest mode and keeps its host CPU; the vCPU thread parks a test-guest vCPU that has
/// nothing left to run in KVM's halted state instead (`vcpu.rs`). Returns whether HLT exits are
/// now off.
fn disable_async_page_faults(kvm: &Kvm, vm: &VmFd) -> Result<bool, KvmError> {
    let hlt = kvm_bindings::KVM_X86_DISABLE_EXITS_HLT;
    let supported = kvm.check_extension_raw(u64::from(kvm_bindings::KVM_CAP_X86_DISABLE_EXITS));
    if supported < 0 || supported as u32 & hlt == 0 {
        tracing::warn!(
            "KVM cannot disable HLT exits here: async page faults stay on, and guest faults \
             on remote memory are seen on KVM's worker threads (no per-process attribution)"
        );
        return Ok(false);
    }
    let mut cap = kvm_bindings::kvm_enable_cap {
        cap: kvm_bindings::KVM_CAP_X86_DISABLE_EXITS,
        ..Default::default()
    };
    cap.args[0] = u64::from(hlt);
    vm.enable_cap(&cap)
        .map_err(ioctl("KVM_ENABLE_CAP(X86_DISABLE_EXITS)"))?;
    Ok(true)
}

/// Address for KVM_SET_TSS_ADDRESS (three pages inside the MMIO hole, below the IOAPIC).
const TSS_ADDRESS: usize = 0xfffb_d000;

/// A created KVM VM with guest RAM registered.
pub struct KvmVm {
    /// The `/dev/kvm` handle.
    pub kvm: Kvm,
    /// The VM's fd, shared weakly with whoever reads VM-wide state while the VM runs (a
    /// snapshot); closed when the VM drops its one strong handle.
    pub fd: Arc<VmFd>,
    /// HLT exits are disabled: a guest HLT halts in guest mode (see
    /// `disable_async_page_faults`).
    pub hlt_in_guest: bool,
}

impl KvmVm {
    /// Opens KVM, creates the VM, the in-kernel irqchip and one memslot per RAM region.
    /// `async_pf`: keep KVM's async page faults (see `builder::VmConfig::kvm_async_pf`).
    ///
    /// The caller keeps `ram` alive until the VM fd is closed.
    pub fn new(ram: &GuestRam, async_pf: bool) -> Result<Self, KvmError> {
        let kvm = Kvm::new().map_err(KvmError::Open)?;
        let fd = kvm.create_vm().map_err(ioctl("KVM_CREATE_VM"))?;
        fd.set_tss_address(TSS_ADDRESS)
            .map_err(ioctl("KVM_SET_TSS_ADDR"))?;
        fd.create_irq_chip().map_err(ioctl("KVM_CREATE_IRQCHIP"))?;
        let hlt_in_guest = !async_pf && disable_async_page_faults(&kvm, &fd)?;
        for (slot, r) in ram.regions().iter().enumerate() {
            let region = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: r.gpa(),
                memory_size: r.len(),
                userspace_addr: r.host_addr(),
            };
            // SAFETY: the host range is a live mapping of `ram` (the VMM's own or the paging
            // engine's guest view), which the caller keeps alive until the VM fd is closed.
            unsafe { fd.set_user_memory_region(region) }
                .map_err(ioctl("KVM_SET_USER_MEMORY_REGION"))?;
        }
        Ok(KvmVm {
            kvm,
            fd: Arc::new(fd),
            hlt_in_guest,
        })
    }
}

/// Whether this host's KVM runs guest kernels on the CPU with two-dimensional paging (AMD NPT
/// or Intel EPT: `kvm_amd`'s `npt` or `kvm_intel`'s `ept` parameter is on). Where it does not
/// (PVM, shadow paging), guest ring 0 is emulated and a stock Linux kernel boots too slowly to
/// be useful.
pub fn two_dimensional_paging() -> bool {
    [
        "/sys/module/kvm_amd/parameters/npt",
        "/sys/module/kvm_intel/parameters/ept",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .any(|v| matches!(v.trim(), "Y" | "y" | "1"))
}

/// Fails with a clear message when /dev/kvm cannot be used.
pub fn check_available() -> Result<(), KvmError> {
    Kvm::new().map(|_| ()).map_err(KvmError::Open)
}
