//! The seam between a vCPU thread and the VM it runs in. A vCPU thread knows KVM (KVM_RUN, the
//! exit reasons, the registers); what a port or an MMIO address means, and what the guest
//! has told the VMM, belongs to the VM's devices. The thread hands each device exit to a
//! [`VcpuExits`] and acts on the [`DeviceAction`] it returns.

use super::super::memory::GuestRam;
use super::super::outcome::VmOutcome;
use crate::stats::ExitStats;

/// What a vCPU thread does after a device handled its exit.
#[derive(Debug, PartialEq, Eq)]
pub enum DeviceAction {
    /// Run the guest again.
    Continue,
    /// The guest agent registered this vCPU's slot: report its CR4
    /// ([`VcpuExits::guest_cr4`]), then run the guest again.
    AgentRegistered,
    /// The VM ends with this outcome.
    Stop(VmOutcome),
}

/// The VM side of a vCPU's exits (module doc).
pub trait VcpuExits: Send + Sync {
    /// Guest RAM, to show the instruction a crashed or stuck vCPU is at.
    fn ram(&self) -> &GuestRam;
    /// The VM's exit counters: the thread counts the exits it handles itself (kicks,
    /// crashes), the devices count port I/O and MMIO.
    fn exit_stats(&self) -> &ExitStats;
    /// A port write.
    fn port_out(&self, cpu: u32, port: u16, data: &[u8]) -> DeviceAction;
    /// A port read: `data` gets the value.
    fn port_in(&self, cpu: u32, port: u16, data: &mut [u8]);
    /// An MMIO read: `data` gets the value.
    fn mmio_read(&self, cpu: u32, addr: u64, data: &mut [u8]) -> DeviceAction;
    /// An MMIO write.
    fn mmio_write(&self, cpu: u32, addr: u64, data: &[u8]) -> DeviceAction;
    /// The guest has nothing more to run on vCPU `cpu` (the test guest says so per vCPU).
    fn cpu_done(&self, cpu: u32) -> bool;
    /// vCPU `cpu`'s CR4 after [`DeviceAction::AgentRegistered`]: the guest's paging depth.
    fn guest_cr4(&self, cpu: u32, cr4: u64);
}
