//! KVM-facing state of a VM, as in Firecracker: [`vm`] (the KVM VM: fd, irqchip, memslots),
//! [`irq`] (device interrupts as irqfds, the PIT),
//! [`vcpu`] (vCPU creation, entry registers, the vCPU threads and their exit handling) and
//! [`memory`] (guest RAM and the one way the VMM accesses it), with the x86 details they use:
//! [`cpuid`], [`regs`] and KVM's per-vCPU statistics ([`kvm_stats`]).

pub mod cpuid;
pub mod irq;
pub mod kvm_stats;
pub mod memory;
pub mod regs;
pub mod vcpu;
pub mod vm;
