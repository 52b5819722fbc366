//! A snapshot's VM-wide state besides the vCPUs: KVM's in-kernel irqchip (both PICs and the
//! IOAPIC) and clock, and the devices that hold guest-visible state — the COM1 UART and the
//! PV control device. The ACPI power registers hold none. Devices that cannot be saved yet
//! (virtio disks and network devices, the Linux guest's agent device) are refused before
//! anything is paused ([`check_saveable`]).

use farvm_devices::serial::SerialState;
use kvm_bindings::{kvm_clock_data, kvm_irqchip};
use kvm_ioctls::VmFd;
use serde::{Deserialize, Serialize};

use super::SnapshotError;
use crate::devices::pvctl::PvState;
use crate::spec::VmSpec;
use crate::vm::VmShared;
use crate::vstate::vm::{ioctl, KvmError};

/// KVM's irqchip ids: the master PIC, the slave PIC, the IOAPIC.
const IRQCHIPS: [u32; 3] = [
    kvm_bindings::KVM_IRQCHIP_PIC_MASTER,
    kvm_bindings::KVM_IRQCHIP_PIC_SLAVE,
    kvm_bindings::KVM_IRQCHIP_IOAPIC,
];

/// KVM's VM-wide state.
#[derive(Clone, Serialize, Deserialize)]
pub struct KvmState {
    /// The master PIC, the slave PIC and the IOAPIC, in that order.
    pub irqchips: Vec<kvm_irqchip>,
    /// kvmclock's time base.
    pub clock: kvm_clock_data,
}

impl KvmState {
    /// Reads the VM-wide state of `vm`.
    pub fn read(vm: &VmFd) -> Result<Self, KvmError> {
        let irqchips = IRQCHIPS
            .iter()
            .map(|&chip_id| {
                let mut chip = kvm_irqchip {
                    chip_id,
                    ..Default::default()
                };
                vm.get_irqchip(&mut chip)
                    .map(|()| chip)
                    .map_err(ioctl("KVM_GET_IRQCHIP"))
            })
            .collect::<Result<_, _>>()?;
        let clock = vm.get_clock().map_err(ioctl("KVM_GET_CLOCK"))?;
        Ok(KvmState { irqchips, clock })
    }

    /// Puts this state on `vm` (before its vCPUs run).
    pub fn apply(&self, vm: &VmFd) -> Result<(), KvmError> {
        for chip in &self.irqchips {
            vm.set_irqchip(chip).map_err(ioctl("KVM_SET_IRQCHIP"))?;
        }
        // KVM_SET_CLOCK takes the time and only the flags it knows as inputs; the ones
        // KVM_GET_CLOCK reports about the host (TSC stable, realtime) it refuses.
        let clock = kvm_clock_data {
            flags: 0,
            ..self.clock
        };
        vm.set_clock(&clock).map_err(ioctl("KVM_SET_CLOCK"))
    }
}

/// The 16550's registers and receive FIFO (vm-superio's `SerialState`, stored).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct UartRecord {
    pub baud_divisor_low: u8,
    pub baud_divisor_high: u8,
    pub interrupt_enable: u8,
    pub interrupt_identification: u8,
    pub line_control: u8,
    pub line_status: u8,
    pub modem_control: u8,
    pub modem_status: u8,
    pub scratch: u8,
    pub in_buffer: Vec<u8>,
}

impl From<&SerialState> for UartRecord {
    fn from(s: &SerialState) -> Self {
        UartRecord {
            baud_divisor_low: s.baud_divisor_low,
            baud_divisor_high: s.baud_divisor_high,
            interrupt_enable: s.interrupt_enable,
            interrupt_identification: s.interrupt_identification,
            line_control: s.line_control,
            line_status: s.line_status,
            modem_control: s.modem_control,
            modem_status: s.modem_status,
            scratch: s.scratch,
            in_buffer: s.in_buffer.clone(),
        }
    }
}

impl From<&UartRecord> for SerialState {
    fn from(r: &UartRecord) -> Self {
        SerialState {
            baud_divisor_low: r.baud_divisor_low,
            baud_divisor_high: r.baud_divisor_high,
            interrupt_enable: r.interrupt_enable,
            interrupt_identification: r.interrupt_identification,
            line_control: r.line_control,
            line_status: r.line_status,
            modem_control: r.modem_control,
            modem_status: r.modem_status,
            scratch: r.scratch,
            in_buffer: r.in_buffer.clone(),
        }
    }
}

/// The devices' state.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceState {
    /// COM1.
    pub serial: UartRecord,
    /// The PV control device.
    pub pv: PvState,
}

impl DeviceState {
    /// Reads the devices of `vm` (paused).
    pub fn read(vm: &VmShared) -> Self {
        DeviceState {
            serial: UartRecord::from(&vm.board.console().state()),
            pv: vm.pv.save_state(),
        }
    }

    /// Loads this state into the devices of `vm` (built, not started).
    pub fn apply(&self, vm: &VmShared) -> Result<(), SnapshotError> {
        vm.board
            .console()
            .restore(&SerialState::from(&self.serial))
            .map_err(|e| SnapshotError::Device(e.to_string()))?;
        vm.pv.restore_state(&self.pv).map_err(SnapshotError::Device)
    }
}

/// Refuses a VM with a device whose state cannot be saved yet, naming it.
pub fn check_saveable(spec: &VmSpec, linux: bool) -> Result<(), SnapshotError> {
    let refuse = |what: String| Err(SnapshotError::Unsupported(what));
    if let Some(d) = spec.disks.first() {
        return refuse(format!("the virtio-blk disk {}", d.path.display()));
    }
    if let Some(n) = spec.nets.first() {
        return refuse(format!("the virtio-net device on tap {}", n.tap));
    }
    if linux {
        return refuse(
            "a Linux guest's agent device, PIT and kvmclock (the test guest can be saved)".into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::board::{DiskConfig, NetConfig};

    #[test]
    fn devices_that_cannot_be_saved_are_named() {
        let mut spec = VmSpec::default();
        check_saveable(&spec, false).unwrap();
        let refused = |spec: &VmSpec, linux| match check_saveable(spec, linux) {
            Err(SnapshotError::Unsupported(what)) => what,
            other => panic!("not refused: {other:?}"),
        };
        assert!(refused(&spec, true).contains("Linux guest"));
        spec.nets.push(NetConfig {
            tap: "vnet7".into(),
            mac: None,
            fd: None,
        });
        assert!(refused(&spec, true).contains("tap vnet7"));
        spec.disks.push(DiskConfig {
            path: "/images/root.img".into(),
            read_only: false,
        });
        let what = refused(&spec, true);
        assert!(what.contains("virtio-blk disk /images/root.img"), "{what}");
        let e = SnapshotError::Unsupported(what).to_string();
        assert!(e.starts_with("cannot save the virtio-blk disk") && e.ends_with("left running"));
    }
}
