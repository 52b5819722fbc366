//! The MADT: the local APIC address with PCAT_COMPAT (KVM's in-kernel irqchip has the dual
//! 8259), one enabled local APIC per vCPU (APIC ID = ACPI UID = vCPU index), the IOAPIC at
//! GSI base 0, optional interrupt source overrides, and LINT1 as NMI on every CPU.

use acpi_tables::sdt::Sdt;

use super::{AcpiConfig, IOAPIC_ADDR, LAPIC_ADDR, OEM_ID};

const TYPE_LOCAL_APIC: u8 = 0;
const TYPE_IO_APIC: u8 = 1;
const TYPE_INTERRUPT_OVERRIDE: u8 = 2;
const TYPE_LOCAL_APIC_NMI: u8 = 4;
const LOCAL_APIC_ENABLED: u32 = 1;
const PCAT_COMPAT: u32 = 1;
const ALL_PROCESSORS: u8 = 0xff;
/// The IOAPIC's ID (KVM's in-kernel IOAPIC resets to 0).
const IOAPIC_ID: u8 = 0;

/// A MADT interrupt source override: ISA IRQ `source` is GSI `gsi` with MPS INTI `flags`
/// (bits 1:0 polarity, 3:2 trigger mode; 0 = bus default, i.e. edge / active-high on ISA).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterruptOverride {
    /// ISA IRQ.
    pub source: u8,
    /// The IOAPIC line it arrives on.
    pub gsi: u32,
    /// MPS INTI flags.
    pub flags: u16,
}

pub(super) fn build(cfg: &AcpiConfig) -> Vec<u8> {
    let mut madt = Sdt::new(*b"APIC", 44, 5, OEM_ID, *b"FARVMAPI", 1);
    madt.write_u32(36, LAPIC_ADDR);
    madt.write_u32(40, PCAT_COMPAT);
    let mut entries = Vec::new();
    for cpu in 0..cfg.vcpus {
        let id = cpu as u8;
        entries.extend_from_slice(&[TYPE_LOCAL_APIC, 8, id, id]);
        entries.extend_from_slice(&LOCAL_APIC_ENABLED.to_le_bytes());
    }
    entries.extend_from_slice(&[TYPE_IO_APIC, 12, IOAPIC_ID, 0]);
    entries.extend_from_slice(&IOAPIC_ADDR.to_le_bytes());
    entries.extend_from_slice(&0u32.to_le_bytes());
    for o in &cfg.interrupt_overrides {
        entries.extend_from_slice(&[TYPE_INTERRUPT_OVERRIDE, 10, 0, o.source]);
        entries.extend_from_slice(&o.gsi.to_le_bytes());
        entries.extend_from_slice(&o.flags.to_le_bytes());
    }
    entries.extend_from_slice(&[TYPE_LOCAL_APIC_NMI, 6, ALL_PROCESSORS, 0, 0, 1]);
    madt.append_slice(&entries);
    madt.as_slice().to_vec()
}
