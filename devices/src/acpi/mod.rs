//! ACPI tables for a stock kernel on a hardware-reduced platform: RSDP → XSDT → FADT (HW_REDUCED,
//! sleep control/status and reset registers on the [`crate::power`] ports), DSDT (COM1, the
//! virtio-mmio devices, `_S5_`) and MADT (one local APIC per vCPU, the IOAPIC, LINT1 NMI).
//! Built with rust-vmm's `acpi_tables`; [`write_acpi_tables`] places them in guest memory.

mod dsdt;
mod fadt;
mod madt;

use acpi_tables::rsdp::Rsdp;
use acpi_tables::xsdt::XSDT;
use acpi_tables::Aml;
use vm_memory::{Bytes, GuestAddress, GuestMemory};

pub use madt::InterruptOverride;

use crate::layout::{
    MmioDeviceInfo, ACPI_AREA_END, ACPI_RSDP_ADDR, ACPI_TABLES_ADDR, COM1_GSI, COM1_PORT,
    POWER_PORT,
};

/// OEM ID in every table.
pub const OEM_ID: [u8; 6] = *b"FARVM ";
/// Local APIC base address.
pub const LAPIC_ADDR: u32 = 0xfee0_0000;
/// IOAPIC base address (KVM's in-kernel IOAPIC).
pub const IOAPIC_ADDR: u32 = 0xfec0_0000;
/// Largest vCPU count describable with xAPIC entries (APIC IDs 0..=254; 255 is broadcast).
pub const MAX_VCPUS: u32 = 255;
/// Table alignment inside the table area.
const TABLE_ALIGN: u64 = 16;
const PAGE: u64 = 4096;

/// A legacy port device as the DSDT describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SerialPortInfo {
    /// First I/O port.
    pub port: u16,
    /// Its interrupt line.
    pub gsi: u32,
}

/// What the tables describe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcpiConfig {
    /// vCPUs, with APIC IDs and ACPI processor UIDs `0..vcpus`.
    pub vcpus: u32,
    /// The 16550 UART (PNP0501 in the DSDT), if any.
    pub serial: Option<SerialPortInfo>,
    /// virtio-mmio devices (LNRO0005 in the DSDT). Do not also announce them on the command
    /// line.
    pub virtio_mmio: Vec<MmioDeviceInfo>,
    /// First of the four power-register ports ([`crate::power::PowerDevice`]).
    pub power_port: u16,
    /// MADT interrupt source overrides. None are needed with KVM's default GSI routing, which
    /// maps ISA IRQ n to IOAPIC pin n (IRQ 0 included), as the kernel assumes without them.
    pub interrupt_overrides: Vec<InterruptOverride>,
}

impl AcpiConfig {
    /// `vcpus` vCPUs, COM1 at 0x3F8 / IRQ 4, the power registers at [`POWER_PORT`], no
    /// virtio devices.
    pub fn new(vcpus: u32) -> Self {
        AcpiConfig {
            vcpus,
            serial: Some(SerialPortInfo {
                port: COM1_PORT,
                gsi: COM1_GSI,
            }),
            virtio_mmio: Vec::new(),
            power_port: POWER_PORT,
            interrupt_overrides: Vec::new(),
        }
    }
}

/// Where the tables go in guest-physical memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AcpiPlacement {
    /// The RSDP (16-byte aligned; below 1 MiB if the kernel is to find it by scanning).
    pub rsdp: u64,
    /// Start of the area for the other tables.
    pub tables: u64,
    /// End (exclusive) of that area.
    pub tables_end: u64,
}

impl Default for AcpiPlacement {
    /// The BIOS area 0xE0000–0xFFFFF (already reserved in a PC e820 map).
    fn default() -> Self {
        AcpiPlacement {
            rsdp: ACPI_RSDP_ADDR,
            tables: ACPI_TABLES_ADDR,
            tables_end: ACPI_AREA_END,
        }
    }
}

/// One table as placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacedTable {
    /// `RSD ` for the RSDP, else the table's signature (`XSDT`, `FACP`, `DSDT`, `APIC`).
    pub signature: [u8; 4],
    /// Guest-physical address.
    pub addr: u64,
    /// The table as written, checksum included.
    pub bytes: Vec<u8>,
}

/// The result of [`write_acpi_tables`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcpiTables {
    /// For `boot_params.acpi_rsdp_addr`.
    pub rsdp_addr: u64,
    /// `(addr, len)` ranges, whole pages, that the e820 map must mark reserved (not RAM).
    pub reserved: Vec<(u64, u64)>,
    /// Every table with its address, RSDP first.
    pub tables: Vec<PlacedTable>,
}

/// Why the tables could not be built or written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AcpiError {
    /// No vCPU, or more than the MADT describes.
    #[error("{vcpus} vCPUs: the MADT describes 1..={MAX_VCPUS}")]
    VcpuCount {
        /// vCPUs asked for.
        vcpus: u32,
    },
    /// The RSDP must be 16-byte aligned.
    #[error("RSDP address {0:#x} is not 16-byte aligned")]
    RsdpAlignment(u64),
    /// The tables do not fit the area.
    #[error("ACPI tables need {need} bytes from {start:#x}; the area ends at {end:#x}")]
    DoesNotFit {
        /// Start of the table area.
        start: u64,
        /// Bytes the tables take.
        need: u64,
        /// End of the area.
        end: u64,
    },
    /// The RSDP lies inside the table area.
    #[error("the RSDP at {rsdp:#x} overlaps the table area {start:#x}..{end:#x}")]
    RsdpOverlap {
        /// The RSDP's address.
        rsdp: u64,
        /// Start of the table area.
        start: u64,
        /// End of the area.
        end: u64,
    },
    /// A device window above 4 GiB (the DSDT's resources are 32-bit).
    #[error("virtio-mmio device at {base:#x}+{size:#x} does not fit the 32-bit address space the DSDT describes")]
    MmioAbove4G {
        /// The device's base address.
        base: u64,
        /// Its window size.
        size: u64,
    },
    /// An interrupt line the IOAPIC does not have.
    #[error("interrupt line {gsi} is not an IOAPIC pin (0..=23)")]
    Gsi {
        /// The line asked for.
        gsi: u32,
    },
    /// More devices than the DSDT has names for.
    #[error("{count} virtio-mmio devices: the DSDT names at most 4096")]
    TooManyDevices {
        /// Devices given.
        count: usize,
    },
    /// Guest memory refused the write.
    #[error("writing ACPI table {table} at {addr:#x} into guest memory failed")]
    GuestMemory {
        /// The table's signature.
        table: String,
        /// Where it was written.
        addr: u64,
    },
}

fn to_bytes(t: &dyn Aml) -> Vec<u8> {
    let mut v = Vec::new();
    t.to_aml_bytes(&mut v);
    v
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(TABLE_ALIGN) * TABLE_ALIGN
}

/// Builds every table for `cfg` at `placement` without touching guest memory.
pub fn build_acpi_tables(
    placement: &AcpiPlacement,
    cfg: &AcpiConfig,
) -> Result<AcpiTables, AcpiError> {
    if cfg.vcpus == 0 || cfg.vcpus > MAX_VCPUS {
        return Err(AcpiError::VcpuCount { vcpus: cfg.vcpus });
    }
    if !placement.rsdp.is_multiple_of(16) {
        return Err(AcpiError::RsdpAlignment(placement.rsdp));
    }
    let dsdt = dsdt::build(cfg)?;
    let madt = madt::build(cfg);

    // DSDT, FADT, MADT, then the XSDT pointing at FADT and MADT.
    let dsdt_addr = align_up(placement.tables);
    let fadt_addr = align_up(dsdt_addr + dsdt.len() as u64);
    let fadt = fadt::build(cfg, dsdt_addr);
    let madt_addr = align_up(fadt_addr + fadt.len() as u64);
    let xsdt_addr = align_up(madt_addr + madt.len() as u64);
    let mut xsdt = XSDT::new(OEM_ID, *b"FARVMXSD", 1);
    xsdt.add_entry(fadt_addr);
    xsdt.add_entry(madt_addr);
    let xsdt = to_bytes(&xsdt);
    let end = xsdt_addr + xsdt.len() as u64;
    if end > placement.tables_end {
        return Err(AcpiError::DoesNotFit {
            start: placement.tables,
            need: end - placement.tables,
            end: placement.tables_end,
        });
    }
    let rsdp = to_bytes(&Rsdp::new(OEM_ID, xsdt_addr));
    let rsdp_end = placement.rsdp + rsdp.len() as u64;
    if placement.rsdp < end && rsdp_end > placement.tables {
        return Err(AcpiError::RsdpOverlap {
            rsdp: placement.rsdp,
            start: placement.tables,
            end,
        });
    }

    // Whole pages, so no RAM shares a page with a table; adjacent ranges become one.
    let mut reserved = [(placement.rsdp, rsdp_end), (placement.tables, end)]
        .map(|(a, e)| (a & !(PAGE - 1), e.div_ceil(PAGE) * PAGE));
    reserved.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (a, e) in reserved {
        match merged.last_mut() {
            Some((_, me)) if a <= *me => *me = (*me).max(e),
            _ => merged.push((a, e)),
        }
    }
    let merged = merged.into_iter().map(|(a, e)| (a, e - a)).collect();
    let placed = |signature: &[u8; 4], addr, bytes| PlacedTable {
        signature: *signature,
        addr,
        bytes,
    };
    Ok(AcpiTables {
        rsdp_addr: placement.rsdp,
        reserved: merged,
        tables: vec![
            placed(b"RSD ", placement.rsdp, rsdp),
            placed(b"DSDT", dsdt_addr, dsdt),
            placed(b"FACP", fadt_addr, fadt),
            placed(b"APIC", madt_addr, madt),
            placed(b"XSDT", xsdt_addr, xsdt),
        ],
    })
}

/// Builds the tables and writes them into `mem`; returns the RSDP address (for
/// `boot_params.acpi_rsdp_addr`) and the ranges to reserve in the e820 map.
pub fn write_acpi_tables<M: GuestMemory>(
    mem: &M,
    placement: &AcpiPlacement,
    cfg: &AcpiConfig,
) -> Result<AcpiTables, AcpiError> {
    let tables = build_acpi_tables(placement, cfg)?;
    for t in &tables.tables {
        mem.write_slice(&t.bytes, GuestAddress(t.addr))
            .map_err(|_| AcpiError::GuestMemory {
                table: String::from_utf8_lossy(&t.signature).trim().to_string(),
                addr: t.addr,
            })?;
    }
    Ok(tables)
}
