//! ACPI tables of a Linux guest: farvm-devices builds them for this VM's vCPUs and devices
//! (MADT: one local APIC per vCPU, the IOAPIC; DSDT: COM1, the virtio-mmio disks, `_S5_`;
//! FADT: hardware-reduced, the power registers) and they are written here through
//! [`GuestRam`], so local and paged RAM alike. The result gives the RSDP address for
//! `boot_params.acpi_rsdp_addr` and the ranges the e820 map reserves.

use farvm_devices::acpi::{build_acpi_tables, AcpiConfig, AcpiPlacement, AcpiTables};
use farvm_devices::layout::MmioDeviceInfo;
use vm_memory::{Bytes, GuestAddress};

use super::BootError;
use crate::vstate::memory::GuestRam;

/// Builds the tables for `vcpus` vCPUs and the virtio-mmio devices `virtio` at the default
/// placement (the BIOS area 0xE0000–0xFFFFF) and writes them into `ram`.
pub fn write_tables(
    ram: &GuestRam,
    vcpus: u32,
    virtio: &[MmioDeviceInfo],
) -> Result<AcpiTables, BootError> {
    let mut cfg = AcpiConfig::new(vcpus);
    cfg.virtio_mmio = virtio.to_vec();
    let tables = build_acpi_tables(&AcpiPlacement::default(), &cfg)
        .map_err(|e| BootError::Setup(format!("ACPI tables: {e}")))?;
    for t in &tables.tables {
        ram.write_slice(&t.bytes, GuestAddress(t.addr))?;
    }
    Ok(tables)
}
