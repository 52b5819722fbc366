//! The I/O bus: port-I/O and MMIO ranges mapped to devices (rust-vmm's `vm-device`
//! `IoManager`), with the VMM's exit handler as its only caller. Devices implement
//! [`DevicePio`] / [`DeviceMmio`] with interior locking, so one bus is shared by all vCPU
//! threads without a bus-wide lock.

use std::sync::Arc;

pub use vm_device::bus::{MmioAddress, PioAddress};
pub use vm_device::{DeviceMmio, DevicePio};

use vm_device::bus::{MmioRange, PioRange};
use vm_device::device_manager::{IoManager, MmioManager, PioManager};

/// Why a bus registration or access failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BusError {
    /// The range is empty or wraps around the address space.
    #[error("invalid {space} range {base:#x}+{len:#x}")]
    InvalidRange {
        /// `port-I/O` or `MMIO`.
        space: &'static str,
        /// First address.
        base: u64,
        /// Length (zero, or wrapping past the end of the address space).
        len: u64,
    },
    /// The range overlaps a device already registered.
    #[error("{space} range {base:#x}+{len:#x} overlaps a registered device")]
    Overlap {
        /// `port-I/O` or `MMIO`.
        space: &'static str,
        /// First address.
        base: u64,
        /// Length.
        len: u64,
    },
    /// No device covers the whole access (the VMM reads all-ones and ignores writes).
    #[error("no {space} device at {addr:#x} for a {len}-byte access")]
    NoDevice {
        /// `port-I/O` or `MMIO`.
        space: &'static str,
        /// The address accessed.
        addr: u64,
        /// Bytes accessed.
        len: usize,
    },
}

fn map_err(e: vm_device::bus::Error, space: &'static str, addr: u64, len: u64) -> BusError {
    use vm_device::bus::Error as E;
    match e {
        E::DeviceOverlap => BusError::Overlap {
            space,
            base: addr,
            len,
        },
        E::InvalidRange => BusError::InvalidRange {
            space,
            base: addr,
            len,
        },
        E::DeviceNotFound | E::InvalidAccessLength(_) => BusError::NoDevice {
            space,
            addr,
            len: len as usize,
        },
    }
}

/// The port-I/O and MMIO buses of one VM.
#[derive(Default)]
pub struct IoBus {
    io: IoManager,
}

impl IoBus {
    /// An empty bus.
    pub fn new() -> Self {
        IoBus::default()
    }

    /// Maps ports `base..base + len` to `device` (it sees offsets from `base`).
    pub fn register_pio(
        &mut self,
        base: u16,
        len: u16,
        device: Arc<dyn DevicePio + Send + Sync>,
    ) -> Result<(), BusError> {
        let err = |e| map_err(e, "port-I/O", u64::from(base), u64::from(len));
        let range = PioRange::new(PioAddress(base), len).map_err(err)?;
        self.io.register_pio(range, device).map_err(err)
    }

    /// Maps guest-physical `base..base + len` to `device` (it sees offsets from `base`).
    pub fn register_mmio(
        &mut self,
        base: u64,
        len: u64,
        device: Arc<dyn DeviceMmio + Send + Sync>,
    ) -> Result<(), BusError> {
        let err = |e| map_err(e, "MMIO", base, len);
        let range = MmioRange::new(MmioAddress(base), len).map_err(err)?;
        self.io.register_mmio(range, device).map_err(err)
    }

    /// A guest `in` of `data.len()` bytes from `port`.
    pub fn pio_read(&self, port: u16, data: &mut [u8]) -> Result<(), BusError> {
        let len = data.len() as u64;
        self.io
            .pio_read(PioAddress(port), data)
            .map_err(|e| map_err(e, "port-I/O", u64::from(port), len))
    }

    /// A guest `out` of `data` to `port`.
    pub fn pio_write(&self, port: u16, data: &[u8]) -> Result<(), BusError> {
        self.io
            .pio_write(PioAddress(port), data)
            .map_err(|e| map_err(e, "port-I/O", u64::from(port), data.len() as u64))
    }

    /// A guest load of `data.len()` bytes from `addr`.
    pub fn mmio_read(&self, addr: u64, data: &mut [u8]) -> Result<(), BusError> {
        let len = data.len() as u64;
        self.io
            .mmio_read(MmioAddress(addr), data)
            .map_err(|e| map_err(e, "MMIO", addr, len))
    }

    /// A guest store of `data` to `addr`.
    pub fn mmio_write(&self, addr: u64, data: &[u8]) -> Result<(), BusError> {
        self.io
            .mmio_write(MmioAddress(addr), data)
            .map_err(|e| map_err(e, "MMIO", addr, data.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use vm_device::bus::{MmioAddressOffset, PioAddressOffset};

    /// Records the offsets it sees and answers reads with the offset's low byte.
    #[derive(Default)]
    struct Probe {
        seen: Mutex<Vec<(u64, usize)>>,
    }
    impl DevicePio for Probe {
        fn pio_read(&self, _: PioAddress, off: PioAddressOffset, data: &mut [u8]) {
            data.fill(off as u8);
        }
        fn pio_write(&self, _: PioAddress, off: PioAddressOffset, data: &[u8]) {
            self.seen.lock().unwrap().push((u64::from(off), data.len()));
        }
    }
    impl DeviceMmio for Probe {
        fn mmio_read(&self, _: MmioAddress, off: MmioAddressOffset, data: &mut [u8]) {
            data.fill(off as u8);
        }
        fn mmio_write(&self, _: MmioAddress, off: MmioAddressOffset, data: &[u8]) {
            self.seen.lock().unwrap().push((off, data.len()));
        }
    }

    #[test]
    fn dispatches_by_offset_and_rejects_misses_and_overlaps() {
        let mut bus = IoBus::new();
        let probe = Arc::new(Probe::default());
        bus.register_pio(0x3f8, 8, probe.clone()).unwrap();
        bus.register_mmio(0xd000_0000, 0x1000, probe.clone())
            .unwrap();

        let mut b = [0u8; 1];
        bus.pio_read(0x3fd, &mut b).unwrap();
        assert_eq!(b[0], 5);
        bus.mmio_write(0xd000_0070, &[1, 2, 3, 4]).unwrap();
        assert_eq!(*probe.seen.lock().unwrap(), vec![(0x70, 4)]);

        assert_eq!(
            bus.pio_read(0x2f8, &mut b),
            Err(BusError::NoDevice {
                space: "port-I/O",
                addr: 0x2f8,
                len: 1
            })
        );
        // An access running past the end of the range is a miss, not a partial hit.
        assert!(bus.mmio_read(0xd000_0ffe, &mut [0u8; 4]).is_err());
        assert!(matches!(
            bus.register_pio(0x3fc, 2, probe.clone()),
            Err(BusError::Overlap { .. })
        ));
        assert!(matches!(
            bus.register_mmio(u64::MAX, 2, probe),
            Err(BusError::InvalidRange { .. })
        ));
    }
}
