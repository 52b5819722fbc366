//! The ACPI power registers of a hardware-reduced platform, on four ports the FADT points at:
//! the sleep control register (offset 0), the sleep status register (1) and the reset register
//! (2). Writing `SLP_TYP = 5 | SLP_EN` (S5, as the DSDT's `_S5_` says) is a power-off; writing
//! [`RESET_VALUE`] to the reset register is a reboot. Both reach the VMM as a [`PowerEvent`].

use std::fmt;
use std::sync::mpsc;

use vm_device::bus::{PioAddress, PioAddressOffset};
use vm_device::DevicePio;

/// Offset of the sleep control register (FADT `SLEEP_CONTROL_REG`).
pub const SLEEP_CONTROL: u16 = 0;
/// Offset of the sleep status register (FADT `SLEEP_STATUS_REG`).
pub const SLEEP_STATUS: u16 = 1;
/// Offset of the reset register (FADT `RESET_REG`).
pub const RESET: u16 = 2;
/// The value the FADT tells the guest to write to the reset register.
pub const RESET_VALUE: u8 = 0x01;
/// The S5 (soft-off) sleep type the DSDT's `_S5_` package announces.
pub const S5_SLEEP_TYPE: u8 = 5;

/// Sleep control: SLP_TYPx in bits 4:2, SLP_EN in bit 5 (ACPI 6.5, 4.8.3.7).
const SLP_TYP_SHIFT: u8 = 2;
const SLP_TYP_MASK: u8 = 0x7;
const SLP_EN: u8 = 1 << 5;

/// What the guest asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PowerEvent {
    /// ACPI S5: the guest powered itself off.
    PowerOff,
    /// The ACPI reset register was written: the guest wants a reboot.
    Reboot,
}

/// The power registers; calls `on_event` from the vCPU thread that wrote the register.
pub struct PowerDevice {
    on_event: Box<dyn Fn(PowerEvent) + Send + Sync>,
}

impl fmt::Debug for PowerDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PowerDevice")
    }
}

impl PowerDevice {
    /// A device that reports events to `on_event` (which must not block: it runs on a vCPU
    /// thread; typically it asks the VMM to stop the VM).
    pub fn new(on_event: impl Fn(PowerEvent) + Send + Sync + 'static) -> Self {
        PowerDevice {
            on_event: Box::new(on_event),
        }
    }

    /// A device that sends events into a channel.
    pub fn with_channel() -> (Self, mpsc::Receiver<PowerEvent>) {
        let (tx, rx) = mpsc::channel();
        let tx = std::sync::Mutex::new(tx);
        let dev = PowerDevice::new(move |ev| {
            // A receiver that went away means nobody listens any more; nothing to do.
            let _ = tx.lock().unwrap_or_else(|p| p.into_inner()).send(ev);
        });
        (dev, rx)
    }

    /// A guest write of `value` to register `offset`.
    pub fn write_register(&self, offset: u16, value: u8) {
        let event = match offset {
            SLEEP_CONTROL if value & SLP_EN != 0 => {
                let sleep_type = (value >> SLP_TYP_SHIFT) & SLP_TYP_MASK;
                if sleep_type == S5_SLEEP_TYPE {
                    Some(PowerEvent::PowerOff)
                } else {
                    tracing::warn!("guest asked for unsupported ACPI sleep type {sleep_type}");
                    None
                }
            }
            RESET if value == RESET_VALUE => Some(PowerEvent::Reboot),
            // Clearing WAK_STS in the status register, or SLP_TYP without SLP_EN: no action.
            _ => None,
        };
        if let Some(ev) = event {
            tracing::info!("guest ACPI power event: {ev:?}");
            (self.on_event)(ev);
        }
    }

    /// A guest read of register `offset`: all registers read as zero (never woken from sleep).
    pub fn read_register(&self, _offset: u16) -> u8 {
        0
    }
}

impl DevicePio for PowerDevice {
    fn pio_read(&self, _base: PioAddress, offset: PioAddressOffset, data: &mut [u8]) {
        for (i, d) in data.iter_mut().enumerate() {
            *d = self.read_register(offset.saturating_add(i as u16));
        }
    }

    /// The registers are 8 bits wide; a wider write lands its low byte on `offset`.
    fn pio_write(&self, _base: PioAddress, offset: PioAddressOffset, data: &[u8]) {
        if let Some(&v) = data.first() {
            self.write_register(offset, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dev: &PowerDevice, offset: u16, v: u8) {
        dev.pio_write(PioAddress(0x600), offset, &[v]);
    }

    #[test]
    fn s5_with_slp_en_powers_off_and_reset_register_reboots() {
        let (dev, rx) = PowerDevice::with_channel();
        // Linux's acpi_hw_extended_sleep: clear WAK_STS, then SLP_TYP=5 | SLP_EN.
        write(&dev, SLEEP_STATUS, 0x80);
        write(&dev, SLEEP_CONTROL, S5_SLEEP_TYPE << 2);
        assert!(
            rx.try_recv().is_err(),
            "SLP_TYP without SLP_EN does nothing"
        );
        write(&dev, SLEEP_CONTROL, (S5_SLEEP_TYPE << 2) | SLP_EN);
        assert_eq!(rx.try_recv(), Ok(PowerEvent::PowerOff));
        write(&dev, SLEEP_CONTROL, (3 << 2) | SLP_EN); // S3: unsupported
        write(&dev, RESET, 0x06);
        assert!(rx.try_recv().is_err());
        write(&dev, RESET, RESET_VALUE);
        assert_eq!(rx.try_recv(), Ok(PowerEvent::Reboot));
        let mut b = [0xffu8; 2];
        dev.pio_read(PioAddress(0x600), SLEEP_STATUS, &mut b);
        assert_eq!(b, [0, 0]);
    }

    #[test]
    fn events_survive_a_dropped_receiver() {
        let (dev, rx) = PowerDevice::with_channel();
        drop(rx);
        write(&dev, RESET, RESET_VALUE);
    }
}
