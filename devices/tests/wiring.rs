//! The devices wired the way the VMM wires them: eventfd interrupt lines (KVM irqfds in the
//! VMM), one I/O bus for port I/O and MMIO exits, COM1, the power registers, a virtio-blk
//! disk on virtio-mmio, and ACPI tables describing exactly those.

mod common;

use std::sync::Arc;

use farvm_devices::acpi::{write_acpi_tables, AcpiConfig, AcpiPlacement};
use farvm_devices::bus::{BusError, IoBus};
use farvm_devices::interrupt::{EventFdInterrupts, IrqLine};
use farvm_devices::layout::*;
use farvm_devices::power::{PowerDevice, PowerEvent};
use farvm_devices::serial::SerialConsole;
use farvm_devices::virtio::block::{Block, BlockConfig};
use farvm_devices::virtio::mmio::VirtioMmio;
use vm_memory::{Bytes, GuestAddress};

#[test]
fn a_vm_worth_of_devices_on_one_bus() {
    let mem = common::guest_memory();
    let disk = MmioDeviceInfo::slot(0).unwrap();
    let irqs = Arc::new(EventFdInterrupts::new(&[COM1_GSI, disk.gsi]).unwrap());

    let out = tempfile::NamedTempFile::new().unwrap();
    let serial = SerialConsole::new(
        &farvm_devices::serial::SerialOut::File(out.path().to_owned()),
        IrqLine::new(irqs.clone(), COM1_GSI),
    )
    .unwrap();
    let (power, power_events) = PowerDevice::with_channel();
    let image = common::image(4);
    let block = Block::open(&BlockConfig {
        path: image.path().to_owned(),
        read_only: false,
        serial: None,
    })
    .unwrap();
    let virtio = VirtioMmio::new(block, mem.clone(), IrqLine::new(irqs.clone(), disk.gsi)).unwrap();

    let mut bus = IoBus::new();
    bus.register_pio(COM1_PORT, COM1_PORTS, Arc::new(serial.clone()))
        .unwrap();
    bus.register_pio(POWER_PORT, POWER_PORTS, Arc::new(power))
        .unwrap();
    bus.register_mmio(disk.base, disk.size, Arc::new(virtio))
        .unwrap();

    // Console: enable THRE, print, and see the interrupt on the eventfd.
    bus.pio_write(COM1_PORT + 1, &[0x02]).unwrap();
    for b in b"ok\n" {
        bus.pio_write(COM1_PORT, &[*b]).unwrap();
    }
    assert!(irqs.eventfd(COM1_GSI).unwrap().read().unwrap() >= 1);
    assert_eq!(std::fs::read(out.path()).unwrap(), b"ok\n");

    // Disk: the identity registers answer through the bus.
    let mut magic = [0u8; 4];
    bus.mmio_read(disk.base, &mut magic).unwrap();
    assert_eq!(&magic, b"virt");
    let mut cap = [0u8; 8];
    bus.mmio_read(disk.base + 0x100, &mut cap).unwrap();
    assert_eq!(u64::from_le_bytes(cap), 4);

    // Unclaimed ports and addresses are misses the VMM answers itself.
    assert!(matches!(
        bus.pio_read(0x60, &mut [0u8; 1]),
        Err(BusError::NoDevice { .. })
    ));
    assert!(bus.mmio_write(disk.base + disk.size, &[0; 4]).is_err());

    // The guest powers off the ACPI way.
    bus.pio_write(POWER_PORT, &[0x34]).unwrap();
    assert_eq!(power_events.try_recv(), Ok(PowerEvent::PowerOff));

    // ACPI describes the same devices; the command line variant says the same thing.
    let mut acpi = AcpiConfig::new(2);
    acpi.virtio_mmio = vec![disk];
    let tables = write_acpi_tables(&*mem, &AcpiPlacement::default(), &acpi).unwrap();
    let mut sig = [0u8; 8];
    mem.read_slice(&mut sig, GuestAddress(tables.rsdp_addr))
        .unwrap();
    assert_eq!(&sig, b"RSD PTR ");
    assert_eq!(
        disk.kernel_cmdline_arg(),
        "virtio_mmio.device=4K@0xd0000000:5"
    );
}
