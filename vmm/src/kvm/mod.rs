//! KVM VM and vCPU setup: the VM fd, in-kernel irqchip, memslots for guest RAM, vCPU creation
//! with per-vCPU CPUID and the 64-bit entry register state.

pub mod cpuid;
pub mod regs;
pub mod stats;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuFd, VmFd};

use crate::boot::EntryState;
use crate::memory::GuestRam;

/// Errors from KVM setup.
#[derive(Debug, thiserror::Error)]
pub enum KvmError {
    #[error("cannot open /dev/kvm: {0} (is KVM available and are you allowed to use it?)")]
    Open(kvm_ioctls::Error),
    #[error("{what}: {source}")]
    Ioctl {
        what: &'static str,
        source: kvm_ioctls::Error,
    },
    #[error("{0}")]
    Unsupported(String),
}

fn ioctl(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> KvmError {
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
/// that is how it is turned off (KVM_CAP_X86_DISABLE_EXITS, HLT). On VMX/SVM a halted vCPU
/// then keeps its physical CPU; on PVM (this host) an idle vCPU measured no extra CPU time.
fn disable_async_page_faults(kvm: &Kvm, vm: &VmFd) -> Result<(), KvmError> {
    let hlt = kvm_bindings::KVM_X86_DISABLE_EXITS_HLT;
    let supported = kvm.check_extension_raw(u64::from(kvm_bindings::KVM_CAP_X86_DISABLE_EXITS));
    if supported < 0 || supported as u32 & hlt == 0 {
        tracing::warn!(
            "KVM cannot disable HLT exits here: async page faults stay on, and guest faults \
             on remote memory are seen on KVM's worker threads (no per-process attribution)"
        );
        return Ok(());
    }
    let mut cap = kvm_bindings::kvm_enable_cap {
        cap: kvm_bindings::KVM_CAP_X86_DISABLE_EXITS,
        ..Default::default()
    };
    cap.args[0] = u64::from(hlt);
    vm.enable_cap(&cap)
        .map_err(ioctl("KVM_ENABLE_CAP(X86_DISABLE_EXITS)"))
}

/// Address for KVM_SET_TSS_ADDRESS (three pages inside the MMIO hole, below the IOAPIC).
const TSS_ADDRESS: usize = 0xfffb_d000;

/// A created VM with its vCPUs (not yet running).
pub struct KvmVm {
    pub kvm: Kvm,
    pub vm: VmFd,
    pub vcpus: Vec<VcpuFd>,
    /// KVM_GET_TSC_KHZ of vCPU 0.
    pub tsc_khz: u64,
}

impl KvmVm {
    /// Opens KVM, creates the VM, the in-kernel irqchip, one memslot per RAM region and `ncpus`
    /// vCPUs with CPUID set. `async_pf`: see [`crate::vm::VmConfig::kvm_async_pf`].
    pub fn new(ram: &GuestRam, ncpus: u32, async_pf: bool) -> Result<Self, KvmError> {
        let kvm = Kvm::new().map_err(KvmError::Open)?;
        let max = kvm.get_max_vcpus();
        if ncpus == 0 || ncpus as usize > max {
            return Err(KvmError::Unsupported(format!(
                "{ncpus} vCPUs requested; KVM supports 1..={max}"
            )));
        }
        let vm = kvm.create_vm().map_err(ioctl("KVM_CREATE_VM"))?;
        vm.set_tss_address(TSS_ADDRESS)
            .map_err(ioctl("KVM_SET_TSS_ADDR"))?;
        vm.create_irq_chip().map_err(ioctl("KVM_CREATE_IRQCHIP"))?;
        if !async_pf {
            disable_async_page_faults(&kvm, &vm)?;
        }
        for (slot, r) in ram.regions().iter().enumerate() {
            let region = kvm_userspace_memory_region {
                slot: slot as u32,
                flags: 0,
                guest_phys_addr: r.gpa(),
                memory_size: r.len(),
                userspace_addr: r.host_addr(),
            };
            // SAFETY: the host range is a live mapping owned by `ram`, which outlives the VM
            // (the caller keeps the `Arc<GuestRam>` alive until the VM fd is closed).
            unsafe { vm.set_user_memory_region(region) }
                .map_err(ioctl("KVM_SET_USER_MEMORY_REGION"))?;
        }
        let supported = kvm
            .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
            .map_err(ioctl("KVM_GET_SUPPORTED_CPUID"))?;
        let mut vcpus = Vec::with_capacity(ncpus as usize);
        for i in 0..ncpus {
            let vcpu = vm
                .create_vcpu(u64::from(i))
                .map_err(ioctl("KVM_CREATE_VCPU"))?;
            let mut cpuid = supported.clone();
            cpuid::patch(&mut cpuid, i, ncpus);
            vcpu.set_cpuid2(&cpuid).map_err(ioctl("KVM_SET_CPUID2"))?;
            vcpus.push(vcpu);
        }
        let tsc_khz = u64::from(vcpus[0].get_tsc_khz().map_err(ioctl("KVM_GET_TSC_KHZ"))?);
        Ok(KvmVm {
            kvm,
            vm,
            vcpus,
            tsc_khz,
        })
    }

    /// Sets every vCPU's registers for `entry` (vCPU `i` gets `rsi = entry.rsi + i` when
    /// `per_cpu_rsi`, the test-guest convention) and makes the APs runnable.
    pub fn set_entry(&self, entry: &EntryState, per_cpu_rsi: bool) -> Result<(), KvmError> {
        for (i, vcpu) in self.vcpus.iter().enumerate() {
            let mut e = *entry;
            if per_cpu_rsi {
                e.rsi = i as u64;
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
}

/// Fails with a clear message when /dev/kvm cannot be used.
pub fn check_available() -> Result<(), KvmError> {
    Kvm::new().map(|_| ()).map_err(KvmError::Open)
}
