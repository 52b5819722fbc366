//! Emulated devices on port I/O: the 16550 serial console (with its pseudo-terminal backend)
//! and the paravirtual control device.

pub mod pty;
pub mod pvctl;
pub mod serial;
