//! The one part of a PC keyboard controller (i8042) a guest needs here: its reset line. A
//! Linux guest whose ACPI reset did not take effect falls back to pulsing the reset line
//! through the controller's command port (`0xFE` to port 0x64) before it tries the BIOS (a jump
//! to real mode, which never ends in a VM without firmware). Writing that command is a reboot;
//! reads say "nothing to read, ready for a command" (status 0), so the guest does not wait for
//! a controller that is not there. Nothing else of a keyboard controller is emulated (the FADT
//! says there is none, so the guest never probes for one).

use std::fmt;

use vm_device::bus::{PioAddress, PioAddressOffset};
use vm_device::DevicePio;

use crate::power::PowerEvent;

/// The controller's command/status port.
pub const I8042_COMMAND_PORT: u16 = 0x64;
/// The command that pulses the CPU reset line.
pub const PULSE_RESET: u8 = 0xfe;

/// The reset line; calls `on_event` (with [`PowerEvent::Reboot`]) from the vCPU thread.
pub struct I8042Reset {
    on_event: Box<dyn Fn(PowerEvent) + Send + Sync>,
}

impl fmt::Debug for I8042Reset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("I8042Reset")
    }
}

impl I8042Reset {
    /// A reset line that reports to `on_event` (which must not block).
    pub fn new(on_event: impl Fn(PowerEvent) + Send + Sync + 'static) -> Self {
        I8042Reset {
            on_event: Box::new(on_event),
        }
    }
}

impl DevicePio for I8042Reset {
    fn pio_read(&self, _base: PioAddress, _offset: PioAddressOffset, data: &mut [u8]) {
        data.fill(0);
    }

    fn pio_write(&self, _base: PioAddress, _offset: PioAddressOffset, data: &[u8]) {
        if data.first() == Some(&PULSE_RESET) {
            tracing::info!("guest pulsed the reset line through the i8042 command port");
            (self.on_event)(PowerEvent::Reboot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_pulse_reset_command_reboots_and_the_status_reads_ready() {
        let (tx, rx) = std::sync::mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let dev = I8042Reset::new(move |ev| {
            let _ = tx.lock().unwrap().send(ev);
        });
        let port = PioAddress(I8042_COMMAND_PORT);
        dev.pio_write(port, 0, &[0xad]); // disable keyboard: ignored
        assert!(rx.try_recv().is_err());
        let mut status = [0xff];
        dev.pio_read(port, 0, &mut status);
        assert_eq!(status, [0]);
        dev.pio_write(port, 0, &[PULSE_RESET, 0, 0, 0]);
        assert_eq!(rx.try_recv(), Ok(PowerEvent::Reboot));
    }
}
