//! The emulated board of a VM, from farvm-devices, on one I/O bus: the COM1 console (16550,
//! IRQ 4, output and input), the ACPI power registers (power-off ends the VM as a guest
//! shutdown with status 0, reset as [`VmOutcome::GuestReboot`]) and one virtio-blk disk per
//! `--disk` on virtio-mmio (slot i: window `0xd000_0000 + i * 4 KiB`, GSI 5 + i). Every
//! interrupt line is an eventfd the VMM registers as a KVM irqfd
//! ([`crate::vstate::irq::connect_irqfds`]). Port-I/O and MMIO exits reach the devices
//! through [`Board::bus`]; the PV control device stays outside it (its writes return actions
//! to the vCPU loop).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock, Weak};

use farvm_devices::bus::{BusError, IoBus};
use farvm_devices::interrupt::{EventFdInterrupts, IrqLine};
use farvm_devices::layout::{MmioDeviceInfo, COM1_GSI, COM1_PORT, COM1_PORTS};
use farvm_devices::layout::{POWER_PORT, POWER_PORTS};
use farvm_devices::power::{PowerDevice, PowerEvent};
use farvm_devices::serial::{SerialConsole, SerialError, SerialIn, SerialOut};
use farvm_devices::virtio::block::{Block, BlockConfig, BlockError};
use farvm_devices::virtio::mmio::{MmioError, VirtioMmio};
use vm_memory::GuestMemoryMmap;

use super::console::{self, EscapeFilter};
use crate::vm::{VmOutcome, VmShared};

/// A disk to attach (`farvm run --disk PATH[,ro]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskConfig {
    /// A raw image file or a host block device.
    pub path: PathBuf,
    /// The guest may not write it (`,ro`).
    pub read_only: bool,
}

impl std::str::FromStr for DiskConfig {
    type Err = String;
    /// `PATH`, `PATH,ro` or `PATH,rw`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (path, read_only) = match s.rsplit_once(',') {
            Some((p, "ro")) => (p, true),
            Some((p, "rw")) => (p, false),
            Some((_, opt)) => {
                return Err(format!(
                    "`{s}`: unknown disk option `{opt}` (expected PATH, PATH,ro or PATH,rw)"
                ))
            }
            None => (s, false),
        };
        if path.is_empty() {
            return Err("empty disk path".into());
        }
        Ok(DiskConfig {
            path: PathBuf::from(path),
            read_only,
        })
    }
}

/// Why the board could not be built.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    /// The serial console could not be set up.
    #[error(transparent)]
    Serial(#[from] SerialError),
    /// A disk image could not be opened.
    #[error(transparent)]
    Disk(#[from] BlockError),
    /// More disks than interrupt lines.
    #[error("{0} disks: at most {max} virtio-mmio devices fit the interrupt lines", max = MAX_DISKS)]
    TooManyDisks(usize),
    /// The virtio-mmio transport refused the device.
    #[error("virtio transport: {0}")]
    Transport(#[from] MmioError),
    /// Two devices overlap on the bus.
    #[error("device layout: {0}")]
    Bus(#[from] BusError),
    /// An interrupt eventfd could not be created or registered.
    #[error("interrupt lines: {0}")]
    Interrupts(#[source] std::io::Error),
    /// Disks were asked for without guest memory to DMA into.
    #[error("disks need a memory view for device DMA")]
    NoMemory,
}

/// Disks the interrupt lines allow (GSI 5..=23).
pub const MAX_DISKS: usize = 19;

/// Where device events stop the VM: the VM's shared state, bound once it exists (the devices
/// are built before it). An event before that is logged and dropped.
#[derive(Clone, Default)]
pub struct StopTarget(Arc<OnceLock<Weak<VmShared>>>);

impl StopTarget {
    /// Binds the VM that device events stop (once; later calls are ignored).
    pub fn bind(&self, shared: &Arc<VmShared>) {
        let _ = self.0.set(Arc::downgrade(shared));
    }

    fn stop(&self, outcome: VmOutcome) {
        match self.0.get().and_then(Weak::upgrade) {
            Some(s) => s.request_stop(outcome),
            None => tracing::warn!("device asked to stop a VM that is not running: {outcome}"),
        }
    }
}

/// What the board is built from.
#[derive(Clone, Debug)]
pub struct BoardConfig {
    /// Where the console's output goes.
    pub serial_out: SerialOut,
    /// Where the console's input comes from.
    pub serial_in: SerialIn,
    /// The virtio-blk disks, in order.
    pub disks: Vec<DiskConfig>,
}

/// The devices of one VM (module doc).
pub struct Board {
    bus: IoBus,
    console: SerialConsole,
    irqs: Arc<EventFdInterrupts>,
    disks: Vec<MmioDeviceInfo>,
    stop: StopTarget,
}

impl Board {
    /// Builds the devices; `mem` is the guest-memory view disks do DMA through (needed only
    /// with disks).
    pub fn new(cfg: &BoardConfig, mem: Option<GuestMemoryMmap>) -> Result<Self, DeviceError> {
        if cfg.disks.len() > MAX_DISKS {
            return Err(DeviceError::TooManyDisks(cfg.disks.len()));
        }
        let slots: Vec<MmioDeviceInfo> = (0..cfg.disks.len() as u32)
            .map(MmioDeviceInfo::slot)
            .collect::<Option<_>>()
            .ok_or(DeviceError::TooManyDisks(cfg.disks.len()))?;
        let gsis: Vec<u32> = std::iter::once(COM1_GSI)
            .chain(slots.iter().map(|d| d.gsi))
            .collect();
        let irqs = Arc::new(EventFdInterrupts::new(&gsis).map_err(DeviceError::Interrupts)?);
        let stop = StopTarget::default();
        let mut bus = IoBus::new();

        let console = SerialConsole::new(&cfg.serial_out, IrqLine::new(irqs.clone(), COM1_GSI))?;
        bus.register_pio(COM1_PORT, COM1_PORTS, Arc::new(console.clone()))?;

        let target = stop.clone();
        let power = PowerDevice::new(move |ev| {
            target.stop(match ev {
                PowerEvent::PowerOff => VmOutcome::GuestShutdown { status: 0 },
                PowerEvent::Reboot => VmOutcome::GuestReboot,
            })
        });
        bus.register_pio(POWER_PORT, POWER_PORTS, Arc::new(power))?;

        if !slots.is_empty() {
            let mem = Arc::new(mem.ok_or(DeviceError::NoMemory)?);
            for (disk, slot) in cfg.disks.iter().zip(&slots) {
                let block = Block::open(&BlockConfig {
                    path: disk.path.clone(),
                    read_only: disk.read_only,
                    serial: None,
                })?;
                let virtio =
                    VirtioMmio::new(block, mem.clone(), IrqLine::new(irqs.clone(), slot.gsi))?;
                bus.register_mmio(slot.base, slot.size, Arc::new(virtio))?;
            }
        }

        let board = Board {
            bus,
            console,
            irqs,
            disks: slots,
            stop,
        };
        board.attach_input(&cfg.serial_in)?;
        Ok(board)
    }

    /// Starts the console's input thread. Input from stdin on a terminal goes through the
    /// escape filter (Ctrl-A x stops the VM as an interrupt from the operator would).
    fn attach_input(&self, input: &SerialIn) -> Result<(), DeviceError> {
        let Some(reader) = input.open()? else {
            return Ok(());
        };
        let reader = if *input == SerialIn::Stdin && console::stdin_is_terminal() {
            let stop = self.stop.clone();
            Box::new(EscapeFilter::new(reader, move || {
                stop.stop(VmOutcome::ConsoleEscape)
            }))
        } else {
            reader
        };
        // The thread ends with its input (stdin's at process exit).
        drop(self.console.attach_input(reader)?);
        Ok(())
    }

    /// Binds power and console events to the VM's shared state.
    pub fn bind(&self, shared: &Arc<VmShared>) {
        self.stop.bind(shared);
    }

    /// The I/O bus port-I/O and MMIO exits go to.
    pub fn bus(&self) -> &IoBus {
        &self.bus
    }

    /// The interrupt lines (to register as irqfds).
    pub fn interrupts(&self) -> &EventFdInterrupts {
        &self.irqs
    }

    /// The virtio-mmio devices, for the ACPI tables.
    pub fn virtio_mmio(&self) -> &[MmioDeviceInfo] {
        &self.disks
    }

    /// Whether `port` is COM1's (for the exit counters).
    pub fn is_console_port(port: u16) -> bool {
        (COM1_PORT..COM1_PORT + COM1_PORTS).contains(&port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestAddress;

    fn cfg(disks: Vec<DiskConfig>) -> BoardConfig {
        BoardConfig {
            serial_out: SerialOut::None,
            serial_in: SerialIn::None,
            disks,
        }
    }

    #[test]
    fn disk_arguments_parse() {
        let d: DiskConfig = "/a/b.img".parse().unwrap();
        assert_eq!((d.path, d.read_only), ("/a/b.img".into(), false));
        let d: DiskConfig = "/a,b.img,ro".parse().unwrap();
        assert_eq!((d.path, d.read_only), ("/a,b.img".into(), true));
        assert!(!"x,rw".parse::<DiskConfig>().unwrap().read_only);
        assert!("x,rx".parse::<DiskConfig>().unwrap_err().contains("rx"));
        assert!(",ro".parse::<DiskConfig>().is_err());
    }

    #[test]
    fn disks_get_consecutive_slots_on_the_bus() {
        let dir = std::env::temp_dir().join(format!("farvm-board-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let disks: Vec<DiskConfig> = (0..2)
            .map(|i| {
                let p = dir.join(format!("d{i}.img"));
                std::fs::write(&p, vec![0u8; 4096]).unwrap();
                DiskConfig {
                    path: p,
                    read_only: i == 1,
                }
            })
            .collect();
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let b = Board::new(&cfg(disks.clone()), Some(mem)).unwrap();
        let slots = b.virtio_mmio();
        assert_eq!(slots.len(), 2);
        assert_eq!((slots[0].base, slots[0].gsi), (0xd000_0000, 5));
        assert_eq!((slots[1].base, slots[1].gsi), (0xd000_1000, 6));
        let lines: Vec<u32> = b.interrupts().lines().map(|(g, _)| g).collect();
        assert_eq!(lines, [4, 5, 6]);
        // Each window answers with the virtio magic; the hole after them is nobody's.
        let mut magic = [0u8; 4];
        for s in slots {
            b.bus().mmio_read(s.base, &mut magic).unwrap();
            assert_eq!(&magic, b"virt");
        }
        assert!(b.bus().mmio_read(0xd000_2000, &mut magic).is_err());
        // COM1 and the power registers are on the port bus.
        let mut lsr = [0u8];
        b.bus().pio_read(COM1_PORT + 5, &mut lsr).unwrap();
        assert_ne!(lsr[0] & 0x20, 0, "transmitter empty");
        b.bus().pio_read(POWER_PORT, &mut lsr).unwrap();
        // Without a memory view disks are refused; a missing image is a clear error.
        assert!(matches!(
            Board::new(&cfg(disks), None),
            Err(DeviceError::NoMemory)
        ));
        let missing = DiskConfig {
            path: dir.join("missing.img"),
            read_only: false,
        };
        let e = Board::new(&cfg(vec![missing]), Some(GuestMemoryMmap::new()))
            .err()
            .unwrap();
        assert!(e.to_string().contains("missing.img"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
