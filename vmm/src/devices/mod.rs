//! The VM's devices: the board (farvm-devices' COM1 console, ACPI power registers and
//! virtio-blk disks on one I/O bus, interrupts as irqfds), the operator's terminal as console
//! input, and the paravirtual control device of the test guest and the guest agent.

pub mod board;
pub mod console;
pub mod pvctl;
