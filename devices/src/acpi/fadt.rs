//! The FADT of a hardware-reduced platform (ACPI 6.5): no legacy PM blocks, no SCI, no 8042,
//! no VGA, no CMOS RTC; power-off through the sleep control register and reboot through the
//! reset register, both on the power device's ports.

use acpi_tables::fadt::{FADTBuilder, Flags, PmProfile};
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::Aml;

use super::{AcpiConfig, OEM_ID};
use crate::power::{RESET, RESET_VALUE, SLEEP_CONTROL, SLEEP_STATUS};

/// IA-PC boot architecture flags (ACPI 6.5, table 5.11).
const IAPC_VGA_NOT_PRESENT: u16 = 1 << 2;
const IAPC_CMOS_RTC_NOT_PRESENT: u16 = 1 << 5;

/// "FARVM" as the FADT's hypervisor vendor identity.
const HYPERVISOR_VENDOR: u64 = u64::from_le_bytes(*b"FARVM\0\0\0");

fn port_register(port: u16) -> GAS {
    GAS::new(
        AddressSpace::SystemIo,
        8,
        0,
        AccessSize::ByteAccess,
        u64::from(port),
    )
}

pub(super) fn build(cfg: &AcpiConfig, dsdt_addr: u64) -> Vec<u8> {
    let mut fadt = FADTBuilder::new(OEM_ID, *b"FARVMFAC", 1)
        .dsdt_64(dsdt_addr)
        .preferred_pm_profile(PmProfile::EnterpriseServer)
        .flag(Flags::HwReducedAcpi)
        .flag(Flags::ResetRegSup)
        // No fixed-feature power or sleep button.
        .flag(Flags::PwrButton)
        .flag(Flags::SlpButton);
    // No i8042 (bit 1 clear): the kernel does not probe ports 0x60/0x64.
    fadt.iapc_boot_arch = (IAPC_VGA_NOT_PRESENT | IAPC_CMOS_RTC_NOT_PRESENT).into();
    fadt.reset_reg = port_register(cfg.power_port + RESET);
    fadt.reset_value = RESET_VALUE;
    fadt.sleep_control_reg = port_register(cfg.power_port + SLEEP_CONTROL);
    fadt.sleep_status_reg = port_register(cfg.power_port + SLEEP_STATUS);
    fadt.hypervisor_vendor_identity = HYPERVISOR_VENDOR.into();
    let mut bytes = Vec::new();
    fadt.finalize().to_aml_bytes(&mut bytes);
    bytes
}
