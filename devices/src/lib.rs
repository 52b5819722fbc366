//! farvm's emulated devices, independent of the VMM: the I/O bus the exit handler dispatches
//! through ([`bus`]), the interrupt seam ([`interrupt`]), the COM1 console ([`serial`]),
//! virtio-blk on virtio-mmio ([`virtio`]), the ACPI tables a stock kernel needs ([`acpi`]),
//! the power registers they point at ([`power`]), the keyboard controller's reset line
//! ([`i8042`]) and the farvm agent device a guest agent
//! registers its per-vCPU slots and process events with ([`agent`]). Default addresses are in
//! [`layout`].

pub mod acpi;
pub mod agent;
pub mod bus;
pub mod i8042;
pub mod interrupt;
pub mod layout;
pub mod power;
pub mod serial;
pub mod virtio;
