//! Stage-2 injection with KVM_PRE_FAULT_MEMORY (`farvm_ept::stage2::StageTwo`).
//!
//! After the engine installs a prefetched page in the host mapping it asks KVM to build the
//! guest-physical (EPT/NPT) entry too, so the guest's first touch takes no exit at all.
//!
//! Feature detection: `KVM_CHECK_EXTENSION(KVM_CAP_PRE_FAULT_MEMORY)` on the VM fd. It is 0 on
//! this host (PVM uses shadow paging; the ioctl answers EOPNOTSUPP), and then no vCPU is created
//! and every call answers `Unsupported` at once (the engine stops calling after the first).
//!
//! Where it is supported, the ioctl runs on a dedicated *pre-fault vCPU*, created with an id
//! above the guest's and never run: KVM_PRE_FAULT_MEMORY takes the vCPU's mutex, which a running
//! vCPU holds for the whole of KVM_RUN, so issuing it on a guest vCPU's fd from the engine's
//! completion thread would stall the injection until that vCPU exits.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use farvm_ept::stage2::{PreFaultError, StageTwo};
use kvm_bindings::{kvm_pre_fault_memory, KVM_CAP_PRE_FAULT_MEMORY};
use vmm_sys_util::ioctl::{ioctl_with_mut_ref, ioctl_with_val};

use ioctls::{KVM_CHECK_EXTENSION, KVM_CREATE_VCPU, KVM_PRE_FAULT_MEMORY};

/// The ioctl numbers this file issues (kvm-ioctls has no KVM_PRE_FAULT_MEMORY).
mod ioctls {
    use kvm_bindings::{kvm_pre_fault_memory, KVMIO};
    use vmm_sys_util::{ioctl_io_nr, ioctl_iowr_nr};

    ioctl_iowr_nr!(KVM_PRE_FAULT_MEMORY, KVMIO, 0xd5, kvm_pre_fault_memory);
    ioctl_io_nr!(KVM_CHECK_EXTENSION, KVMIO, 0x03);
    ioctl_io_nr!(KVM_CREATE_VCPU, KVMIO, 0x41);
}

/// Whether the VM's KVM supports KVM_PRE_FAULT_MEMORY.
pub fn pre_fault_supported(vm_fd: RawFd) -> bool {
    struct Borrowed(RawFd);
    impl AsRawFd for Borrowed {
        fn as_raw_fd(&self) -> RawFd {
            self.0
        }
    }
    // SAFETY: KVM_CHECK_EXTENSION takes an integer argument and only reads it; a bad fd gives
    // an error return, which counts as "unsupported".
    let r = unsafe {
        ioctl_with_val(
            &Borrowed(vm_fd),
            KVM_CHECK_EXTENSION(),
            KVM_CAP_PRE_FAULT_MEMORY as libc::c_ulong,
        )
    };
    r > 0
}

/// Whether this host's KVM supports KVM_PRE_FAULT_MEMORY (asked of /dev/kvm; false if it
/// cannot be opened). On x86 the answer is the same for every VM: two-dimensional paging.
pub fn host_supports_pre_fault() -> bool {
    kvm_ioctls::Kvm::new()
        .map(|k| k.check_extension_raw(u64::from(KVM_CAP_PRE_FAULT_MEMORY)) > 0)
        .unwrap_or(false)
}

/// KVM_PRE_FAULT_MEMORY through a dedicated, never-run vCPU (see the module docs).
#[derive(Debug)]
pub struct KvmPreFault {
    vcpu: Option<OwnedFd>,
}

impl KvmPreFault {
    /// Detects support on `vm_fd`; if supported, creates the pre-fault vCPU with id
    /// `vcpu_id` (one above the guest's highest). Call before the guest runs.
    pub fn new(vm_fd: RawFd, vcpu_id: u32) -> Self {
        if !pre_fault_supported(vm_fd) {
            tracing::info!("KVM_CAP_PRE_FAULT_MEMORY is 0: prefetched pages are injected into the host mapping only");
            return Self { vcpu: None };
        }
        // SAFETY: KVM_CREATE_VCPU takes the id by value and returns a new fd or -1.
        let fd = unsafe { libc::ioctl(vm_fd, KVM_CREATE_VCPU() as _, vcpu_id as libc::c_ulong) };
        if fd < 0 {
            tracing::warn!(
                "cannot create the pre-fault vCPU: {}; stage-2 injection off",
                std::io::Error::last_os_error()
            );
            return Self { vcpu: None };
        }
        // SAFETY: `fd` was just returned by KVM_CREATE_VCPU and is owned by nobody else.
        let vcpu = unsafe { OwnedFd::from_raw_fd(fd) };
        Self { vcpu: Some(vcpu) }
    }

    /// A stage-2 injector that is never supported (`--stage2-prefault off`, tests).
    pub fn disabled() -> Self {
        Self { vcpu: None }
    }

    /// Whether pre-faulting is available.
    pub fn supported(&self) -> bool {
        self.vcpu.is_some()
    }
}

impl StageTwo for KvmPreFault {
    fn pre_fault(&self, gpa: u64, len: u64) -> Result<(), PreFaultError> {
        let Some(vcpu) = &self.vcpu else {
            return Err(PreFaultError::Unsupported);
        };
        let mut range = kvm_pre_fault_memory {
            gpa,
            size: len,
            ..Default::default()
        };
        // The kernel advances gpa/size as it goes and may stop early (EINTR/EAGAIN): loop.
        for _ in 0..16 {
            // SAFETY: `range` is a valid, exclusively borrowed kvm_pre_fault_memory the kernel
            // reads and updates; the fd is a vCPU fd we own.
            let r = unsafe { ioctl_with_mut_ref(vcpu, KVM_PRE_FAULT_MEMORY(), &mut range) };
            if r >= 0 && range.size == 0 {
                return Ok(());
            }
            if r < 0 {
                let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
                match e {
                    libc::EOPNOTSUPP | libc::ENOTTY | libc::EINVAL => {
                        return Err(PreFaultError::Unsupported)
                    }
                    libc::EINTR | libc::EAGAIN => continue,
                    other => return Err(PreFaultError::Failed(other)),
                }
            }
        }
        Err(PreFaultError::Failed(libc::EAGAIN))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detection_matches_the_capability_and_unsupported_answers_at_once() {
        if std::env::var("FARVM_SKIP_KVM").as_deref() == Ok("1") {
            return;
        }
        let kvm = kvm_ioctls::Kvm::new()
            .expect("this test needs /dev/kvm (set FARVM_SKIP_KVM=1 to skip it)");
        let vm = kvm.create_vm().expect("KVM_CREATE_VM");
        let cap = kvm.check_extension_raw(KVM_CAP_PRE_FAULT_MEMORY as u64) > 0;
        let s = KvmPreFault::new(vm.as_raw_fd(), 1);
        assert_eq!(s.supported(), cap);
        assert_eq!(host_supports_pre_fault(), cap);
        if !cap {
            assert_eq!(s.pre_fault(0, 4096), Err(PreFaultError::Unsupported));
        }
        assert_eq!(
            KvmPreFault::disabled().pre_fault(0, 4096),
            Err(PreFaultError::Unsupported)
        );
    }
}
