//! The DSDT: `\_S5_` (the soft-off sleep type the power device recognises), the COM1 UART
//! (PNP0501), each virtio-mmio device (LNRO0005, the ID Linux's virtio_mmio driver binds
//! to from ACPI) with its register window and edge-triggered, active-high interrupt, and the
//! farvm agent device (FARV0001) if the VM has one.

use acpi_tables::aml::{
    self, Device, EISAName, Interrupt, Memory32Fixed, Name, Package, Path, ResourceTemplate, IO,
};
use acpi_tables::sdt::Sdt;
use acpi_tables::Aml;

use super::{AcpiConfig, AcpiError, OEM_ID};
use crate::layout::IOAPIC_MAX_GSI;
use crate::power::S5_SLEEP_TYPE;

/// Most virtio-mmio devices the DSDT names (`V000`..`VFFF`).
const MAX_VIRTIO_DEVICES: usize = 0x1000;

fn check_gsi(gsi: u32) -> Result<(), AcpiError> {
    if gsi > IOAPIC_MAX_GSI {
        return Err(AcpiError::Gsi { gsi });
    }
    Ok(())
}

/// An extended interrupt descriptor: consumer, edge-triggered, active-high, exclusive.
fn edge_interrupt(gsi: u32) -> Interrupt {
    Interrupt::new(true, true, false, false, gsi)
}

/// A 32-bit MMIO window, or [`AcpiError::MmioAbove4G`].
fn window32(base: u64, size: u64) -> Result<(u32, u32), AcpiError> {
    match (u32::try_from(base), u32::try_from(size)) {
        (Ok(b), Ok(s)) if u64::from(b) + u64::from(s) <= 1 << 32 => Ok((b, s)),
        _ => Err(AcpiError::MmioAbove4G { base, size }),
    }
}

/// `\_SB.FARV`: the farvm agent device (`farvm_guest_agent::device::ACPI_HID`), its register
/// window as the only resource. An AML device the guest's module binds to by `_HID`; it has no
/// interrupt (the guest rings it, never the other way).
fn agent_device(base: u64, size: u64, body: &mut Vec<u8>) -> Result<(), AcpiError> {
    let (base, size) = window32(base, size)?;
    let mem = Memory32Fixed::new(true, base, size);
    let crs = ResourceTemplate::new(vec![&mem]);
    let uid = 0u8;
    Device::new(
        Path::new("_SB_.FARV"),
        vec![
            &Name::new(Path::new("_HID"), &farvm_guest_agent::device::ACPI_HID),
            &Name::new(Path::new("_UID"), &uid),
            &Name::new(Path::new("_CRS"), &crs),
        ],
    )
    .to_aml_bytes(body);
    Ok(())
}

pub(super) fn build(cfg: &AcpiConfig) -> Result<Vec<u8>, AcpiError> {
    let mut body = Vec::new();
    let s5 = S5_SLEEP_TYPE;
    Name::new(Path::new("_S5_"), &Package::new(vec![&s5, &s5])).to_aml_bytes(&mut body);

    if let Some(serial) = &cfg.serial {
        check_gsi(serial.gsi)?;
        let io = IO::new(serial.port, serial.port, 1, 8);
        let irq = edge_interrupt(serial.gsi);
        let crs = ResourceTemplate::new(vec![&io, &irq]);
        let hid = EISAName::new("PNP0501");
        let uid = 0u8;
        Device::new(
            Path::new("_SB_.COM1"),
            vec![
                &Name::new(Path::new("_HID"), &hid),
                &Name::new(Path::new("_UID"), &uid),
                &Name::new(Path::new("_CRS"), &crs),
            ],
        )
        .to_aml_bytes(&mut body);
    }

    if cfg.virtio_mmio.len() > MAX_VIRTIO_DEVICES {
        return Err(AcpiError::TooManyDevices {
            count: cfg.virtio_mmio.len(),
        });
    }
    for (i, dev) in cfg.virtio_mmio.iter().enumerate() {
        check_gsi(dev.gsi)?;
        let (base, size) = window32(dev.base, dev.size)?;
        let mem = Memory32Fixed::new(true, base, size);
        let irq = edge_interrupt(dev.gsi);
        let crs = ResourceTemplate::new(vec![&mem, &irq]);
        let uid = i as u32;
        Device::new(
            Path::new(&format!("_SB_.V{i:03X}")),
            vec![
                &Name::new(Path::new("_HID"), &"LNRO0005"),
                &Name::new(Path::new("_UID"), &uid),
                // DMA is cache-coherent.
                &Name::new(Path::new("_CCA"), &aml::ONE),
                &Name::new(Path::new("_CRS"), &crs),
            ],
        )
        .to_aml_bytes(&mut body);
    }

    if let Some((base, size)) = cfg.agent {
        agent_device(base, size, &mut body)?;
    }

    let mut dsdt = Sdt::new(*b"DSDT", 36, 2, OEM_ID, *b"FARVMDSD", 1);
    dsdt.append_slice(&body);
    Ok(dsdt.as_slice().to_vec())
}
