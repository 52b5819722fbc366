//! Where the devices live by default: port numbers, the virtio-mmio window in the 32-bit MMIO
//! hole, interrupt lines, and the ACPI table area. The VMM may choose others; the ACPI tables
//! and the kernel command line are generated from whatever it chooses.

/// First port of COM1.
pub const COM1_PORT: u16 = 0x3f8;
/// Number of COM1 ports.
pub const COM1_PORTS: u16 = 8;
/// COM1's ISA interrupt line (identity-mapped to IOAPIC pin 4).
pub const COM1_GSI: u32 = 4;

/// First port of the ACPI power registers ([`crate::power::PowerDevice`]).
pub const POWER_PORT: u16 = 0x600;
/// Number of power-register ports.
pub const POWER_PORTS: u16 = 4;

/// Base of the first virtio-mmio device (inside the 3–4 GiB MMIO hole, below the IOAPIC).
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// Size of one virtio-mmio device window.
pub const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// Interrupt line of the first virtio-mmio device; device `i` uses `VIRTIO_GSI_BASE + i`.
/// Lines 5..=15 are free ISA lines (usable from the command line too); up to 23 with ACPI.
pub const VIRTIO_GSI_BASE: u32 = 5;
/// Last IOAPIC pin (KVM's in-kernel IOAPIC has 24).
pub const IOAPIC_MAX_GSI: u32 = 23;

/// Guest-physical address of the RSDP: the start of the BIOS area the kernel scans (0xE0000–
/// 0xFFFFF) when `boot_params.acpi_rsdp_addr` is not set.
pub const ACPI_RSDP_ADDR: u64 = 0x000e_0000;
/// Where the other ACPI tables start.
pub const ACPI_TABLES_ADDR: u64 = 0x000e_0040;
/// End (exclusive) of the ACPI table area.
pub const ACPI_AREA_END: u64 = 0x0010_0000;

/// One virtio-mmio device as the guest must learn of it: its window and interrupt line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MmioDeviceInfo {
    /// Guest-physical base of the register window.
    pub base: u64,
    /// Window size in bytes.
    pub size: u64,
    /// Its interrupt line.
    pub gsi: u32,
}

impl MmioDeviceInfo {
    /// The default slot `index`: `VIRTIO_MMIO_BASE + index * 4 KiB`, line `VIRTIO_GSI_BASE +
    /// index`. `None` past the last IOAPIC pin.
    pub fn slot(index: u32) -> Option<Self> {
        let gsi = VIRTIO_GSI_BASE.checked_add(index)?;
        (gsi <= IOAPIC_MAX_GSI).then(|| MmioDeviceInfo {
            base: VIRTIO_MMIO_BASE + u64::from(index) * VIRTIO_MMIO_SIZE,
            size: VIRTIO_MMIO_SIZE,
            gsi,
        })
    }

    /// The `virtio_mmio.device=<size>@<base>:<irq>` kernel parameter announcing this device.
    /// Only kernels built with `CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES` read it, and with ACPI the
    /// line must be an ISA line (< 16); otherwise describe the device in the DSDT instead
    /// ([`crate::acpi::AcpiConfig::virtio_mmio`]), never both.
    pub fn kernel_cmdline_arg(&self) -> String {
        format!(
            "virtio_mmio.device={}@{:#x}:{}",
            size_with_suffix(self.size),
            self.base,
            self.gsi
        )
    }
}

/// The `virtio_mmio.device=` parameters for `devices`, space-separated.
pub fn virtio_mmio_cmdline(devices: &[MmioDeviceInfo]) -> String {
    devices
        .iter()
        .map(MmioDeviceInfo::kernel_cmdline_arg)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `size` in the kernel's `memparse` syntax, with the largest exact K/M/G suffix.
fn size_with_suffix(size: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (unit, suffix) in UNITS {
        if size != 0 && size.is_multiple_of(unit) {
            return format!("{}{suffix}", size / unit);
        }
    }
    size.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdline_matches_the_kernels_syntax() {
        let d = MmioDeviceInfo::slot(0).unwrap();
        assert_eq!(d.kernel_cmdline_arg(), "virtio_mmio.device=4K@0xd0000000:5");
        let odd = MmioDeviceInfo {
            base: 0x1_0000_0000,
            size: 0x200,
            gsi: 17,
        };
        assert_eq!(
            virtio_mmio_cmdline(&[MmioDeviceInfo::slot(1).unwrap(), odd]),
            "virtio_mmio.device=4K@0xd0001000:6 virtio_mmio.device=512@0x100000000:17"
        );
        assert_eq!(size_with_suffix(2 << 20), "2M");
        assert_eq!(size_with_suffix(1 << 30), "1G");
    }

    #[test]
    fn slots_stop_at_the_last_ioapic_pin() {
        assert_eq!(MmioDeviceInfo::slot(18).unwrap().gsi, 23);
        assert_eq!(MmioDeviceInfo::slot(19), None);
        assert_eq!(MmioDeviceInfo::slot(u32::MAX), None);
    }

    #[test]
    fn acpi_area_fits_the_legacy_bios_window() {
        const { assert!(ACPI_RSDP_ADDR >= 0xe0000 && ACPI_RSDP_ADDR.is_multiple_of(16)) };
        const { assert!(ACPI_TABLES_ADDR >= ACPI_RSDP_ADDR + 36 && ACPI_AREA_END <= 0x100000) };
    }
}
