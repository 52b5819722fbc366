//! Emulated devices on port I/O: the 16550 serial console and the paravirtual control device.

pub mod pvctl;
pub mod serial;
