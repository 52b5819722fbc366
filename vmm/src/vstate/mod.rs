//! KVM-facing state of a VM, as in Firecracker: [`vm`] (the KVM VM: fd, irqchip, memslots),
//! [`irq`] (device interrupts as irqfds, the PIT),
//! [`vcpu`] (vCPU creation, entry registers, the vCPU threads behind their handles and their exit
//! handling), [`memory`] (guest RAM and the one way the VMM accesses it) and [`outcome`] (how a
//! VM ends, decided once), with the x86 details they use: [`cpuid`], [`regs`], [`pagewalk`] and
//! KVM's per-vCPU statistics ([`kvm_stats`]). Nothing here imports the VM above it.

pub mod cpuid;
pub mod irq;
pub mod kvm_stats;
pub mod memory;
pub mod outcome;
pub mod pagewalk;
pub mod regs;
pub mod vcpu;
pub mod vm;

/// Locks `m`, taking the data of a poisoned lock as it is: the state behind the VM's locks
/// (outcome, vCPU handles, the API's VM slot) stays consistent across a panic in another
/// thread, and a VM must still be stoppable after one.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
