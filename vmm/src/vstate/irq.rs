//! Interrupt delivery into KVM's in-kernel irqchip (PIC + IOAPIC + LAPICs, created with the VM):
//! every device line is an eventfd registered with `KVM_IRQFD`, so a device raising an edge is
//! one `write(2)` and KVM injects it without a VM exit; and the in-kernel PIT, for a guest
//! that calibrates or ticks with it.
//!
//! KVM's default GSI routing sends GSI n to IOAPIC pin n (and GSIs 0–15 to the PIC too), which
//! is what an MADT without interrupt source overrides tells the guest.

use farvm_devices::interrupt::EventFdInterrupts;
use kvm_bindings::{kvm_pit_config, KVM_PIT_SPEAKER_DUMMY};
use kvm_ioctls::VmFd;

use super::vm::{ioctl, KvmError};

/// Registers every line of `lines` as an irqfd on its GSI.
pub fn connect_irqfds(vm: &VmFd, lines: &EventFdInterrupts) -> Result<(), KvmError> {
    for (gsi, fd) in lines.lines() {
        vm.register_irqfd(fd, gsi).map_err(ioctl("KVM_IRQFD"))?;
    }
    Ok(())
}

/// Creates the in-kernel i8254 PIT (`KVM_CREATE_PIT2`) with a dummy speaker port (0x61), as
/// a PC has: a kernel that cannot use the TSC-deadline timer calibrates against it, and its
/// channel 0 is IRQ 0. Must follow the irqchip.
pub fn create_pit(vm: &VmFd) -> Result<(), KvmError> {
    let cfg = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(cfg).map_err(ioctl("KVM_CREATE_PIT2"))
}
