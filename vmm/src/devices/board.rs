//! The emulated board of a VM, from farvm-devices, on one I/O bus: the COM1 console (16550,
//! IRQ 4, output and input), the ACPI power registers (power-off ends the VM as a guest
//! shutdown with status 0, reset as [`VmOutcome::GuestReboot`]) and one virtio-blk disk per
//! `--disk` on virtio-mmio (slot i: window `0xd000_0000 + i * 4 KiB`, GSI 5 + i). Every
//! interrupt line is an eventfd the VMM registers as a KVM irqfd
//! ([`crate::vstate::irq::connect_irqfds`]). A Linux guest also gets the farvm agent device
//! (ACPI `FARV0001` at [`AGENT_MMIO_BASE`]): the guest agent module registers its per-vCPU
//! slots there (they go to the PV control device's slot table, which the paging engine
//! follows) and its process events (names for per-process statistics). Port-I/O and MMIO exits reach the devices
//! through [`Board::bus`]; the PV control device stays outside it (its writes return actions
//! to the vCPU loop).

use std::path::PathBuf;
use std::sync::Arc;

use farvm_devices::agent::{AgentDevice, AgentHost, SlotArray};
use farvm_devices::bus::{BusError, IoBus};
use farvm_devices::interrupt::{EventFdInterrupts, IrqLine};
use farvm_devices::layout::{MmioDeviceInfo, COM1_GSI, COM1_PORT, COM1_PORTS};
use farvm_devices::layout::{AGENT_MMIO_BASE, AGENT_MMIO_SIZE, POWER_PORT, POWER_PORTS};
use farvm_devices::power::{PowerDevice, PowerEvent};
use farvm_devices::serial::{SerialConsole, SerialError, SerialIn, SerialOut};
use farvm_devices::virtio::block::{Block, BlockConfig, BlockError};
use farvm_devices::virtio::mmio::{MmioError, VirtioMmio};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::console::{self, EscapeFilter};
use super::pty::Pty;
use super::pvctl::PvCtl;
use crate::vstate::outcome::{OutcomeLatch, VmOutcome};

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
    /// Disks or the agent device were asked for without guest memory to DMA into.
    #[error("disks and the agent device need a memory view")]
    NoMemory,
}

/// Disks the interrupt lines allow (GSI 5..=23).
pub const MAX_DISKS: usize = 19;

/// What the board is built from.
#[derive(Clone, Debug)]
pub struct BoardConfig {
    /// Where the console's output goes.
    pub serial_out: SerialOut,
    /// Where the console's input comes from.
    pub serial_in: SerialIn,
    /// A pseudo-terminal for the console's output and input instead of `serial_out` and
    /// `serial_in`.
    pub pty: Option<Arc<Pty>>,
    /// The virtio-blk disks, in order.
    pub disks: Vec<DiskConfig>,
    /// Add the farvm agent device, for a guest of this many vCPUs (Linux guests).
    pub agent_vcpus: Option<u32>,
}

/// Where the agent device's slot registrations go: the PV control device's slot table (the
/// paging engine follows it; an unregistration is passed on before the guest's write
/// returns, so the engine stops reading pages the guest is about to free).
struct AgentLink {
    pv: Arc<PvCtl>,
    ncpus: u32,
}

impl AgentHost for AgentLink {
    fn slots_changed(&self, slots: Option<SlotArray>) {
        for cpu in 0..self.ncpus {
            let gpa = slots.and_then(|s| s.slot(cpu));
            if !self.pv.set_agent_slot(cpu, gpa) {
                tracing::warn!(cpu, "agent slot {gpa:x?} refused");
            }
        }
    }
}

/// The agent device as the board holds it.
pub type Agent = AgentDevice<GuestMemoryMmap>;

/// The devices of one VM (module doc).
pub struct Board {
    bus: IoBus,
    console: SerialConsole,
    irqs: Arc<EventFdInterrupts>,
    disks: Vec<MmioDeviceInfo>,
    agent: Option<Arc<Agent>>,
    stop: Arc<OutcomeLatch>,
}

impl Board {
    /// Builds the devices; `mem` is the guest-memory view disks and the agent device do DMA
    /// through (needed only with them), `stop` ends the VM (power-off, reset, the console's
    /// escape), `pv` gets the agent device's slot registrations.
    pub fn new(
        cfg: &BoardConfig,
        mem: Option<GuestMemoryMmap>,
        stop: Arc<OutcomeLatch>,
        pv: Arc<PvCtl>,
    ) -> Result<Self, DeviceError> {
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
        let mut bus = IoBus::new();

        let com1 = IrqLine::new(irqs.clone(), COM1_GSI);
        let console = match &cfg.pty {
            Some(pty) => SerialConsole::with_writer(Box::new(pty.writer()), com1),
            None => SerialConsole::new(&cfg.serial_out, com1)?,
        };
        bus.register_pio(COM1_PORT, COM1_PORTS, Arc::new(console.clone()))?;

        let target = stop.clone();
        let power = PowerDevice::new(move |ev| {
            target.decide(match ev {
                PowerEvent::PowerOff => VmOutcome::GuestShutdown { status: 0 },
                PowerEvent::Reboot => VmOutcome::GuestReboot,
            })
        });
        bus.register_pio(POWER_PORT, POWER_PORTS, Arc::new(power))?;

        let agent = match cfg.agent_vcpus {
            Some(ncpus) => {
                let mem = mem.clone().ok_or(DeviceError::NoMemory)?;
                let ram = mem.iter().map(|r| (r.start_addr().0, r.len())).collect();
                let host = AgentLink { pv, ncpus };
                let agent = Arc::new(AgentDevice::new(mem, ram, ncpus, Box::new(host)));
                bus.register_mmio(AGENT_MMIO_BASE, AGENT_MMIO_SIZE, agent.clone())?;
                Some(agent)
            }
            None => None,
        };

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
            agent,
            stop,
        };
        match &cfg.pty {
            // The thread ends when the pty retires this boot's reader.
            Some(pty) => drop(board.console.attach_input(Box::new(pty.reader()))?),
            None => board.attach_input(&cfg.serial_in)?,
        }
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
                stop.decide(VmOutcome::ConsoleEscape)
            }))
        } else {
            reader
        };
        // The thread ends with its input (stdin's at process exit).
        drop(self.console.attach_input(reader)?);
        Ok(())
    }

    /// The agent device, if the VM has one.
    pub fn agent(&self) -> Option<&Agent> {
        self.agent.as_deref()
    }

    /// The agent device's register window `(base, size)`, for the ACPI tables.
    pub fn agent_window(&self) -> Option<(u64, u64)> {
        self.agent
            .as_ref()
            .map(|_| (AGENT_MMIO_BASE, AGENT_MMIO_SIZE))
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
    use crate::vstate::memory::GuestRam;
    use vm_memory::GuestAddress;

    fn latch() -> Arc<OutcomeLatch> {
        Arc::new(OutcomeLatch::default())
    }

    fn pv() -> Arc<PvCtl> {
        let ram = Arc::new(GuestRam::local(&[(0, 1 << 20)]).unwrap());
        Arc::new(PvCtl::new(ram, 1, false))
    }

    /// The ACPI power registers end the VM through its latch: power-off as a guest shutdown
    /// with status 0.
    #[test]
    fn power_off_decides_the_outcome() {
        let stop = latch();
        let b = Board::new(&cfg(Vec::new()), None, stop.clone(), pv()).unwrap();
        assert_eq!(stop.outcome(), None);
        // Sleep control: SLP_TYP 5 (S5) in bits 4:2, SLP_EN (bit 5).
        let s5 = (farvm_devices::power::S5_SLEEP_TYPE << 2) | (1 << 5);
        b.bus()
            .pio_write(POWER_PORT + farvm_devices::power::SLEEP_CONTROL, &[s5])
            .unwrap();
        assert_eq!(stop.outcome(), Some(VmOutcome::GuestShutdown { status: 0 }));
    }

    fn cfg(disks: Vec<DiskConfig>) -> BoardConfig {
        BoardConfig {
            serial_out: SerialOut::None,
            serial_in: SerialIn::None,
            pty: None,
            disks,
            agent_vcpus: None,
        }
    }

    /// The agent device on a Linux board, driven through the bus as the guest module drives
    /// it: its slot registration reaches the PV control device's slot table (which the paging
    /// engine follows) and its process events name processes for the statistics.
    #[test]
    fn the_agent_device_feeds_the_slot_table_and_process_names() {
        use farvm_guest_agent::device::ring::{self, kind, ProcEvent, RingHeader, RING_MAGIC};
        use farvm_guest_agent::device::{cmd, reg, result, AGENT_VERSION};
        use vm_memory::Bytes;

        let ram = Arc::new(GuestRam::local(&[(0, 4 << 20)]).unwrap());
        // SAFETY: local RAM: the view is a clone of the same mapping, alive as long as `ram`.
        let mem = unsafe { ram.device_view() }.unwrap();
        let mut c = cfg(Vec::new());
        c.agent_vcpus = Some(2);
        let pv = Arc::new(PvCtl::new(ram.clone(), 2, false));
        assert!(matches!(
            Board::new(&c, None, latch(), pv.clone()),
            Err(DeviceError::NoMemory)
        ));
        let board = Board::new(&c, Some(mem), latch(), pv.clone()).unwrap();
        assert_eq!(
            board.agent_window(),
            Some((AGENT_MMIO_BASE, AGENT_MMIO_SIZE))
        );
        let bus = board.bus();
        let name = |pid| board.agent().unwrap().process_name(pid);
        let rd = |r: u64| {
            let mut b = [0u8; 4];
            bus.mmio_read(AGENT_MMIO_BASE + r, &mut b).unwrap();
            u32::from_le_bytes(b)
        };
        let wr = |r: u64, v: u32| {
            bus.mmio_write(AGENT_MMIO_BASE + r, &v.to_le_bytes())
                .unwrap()
        };
        assert_eq!(rd(reg::NCPUS), 2);
        wr(reg::VERSION, AGENT_VERSION);
        assert_eq!(rd(reg::RESULT), result::OK);
        wr(reg::SLOTS_LO, 0x10_0000);
        wr(reg::SLOTS_COUNT, 2);
        wr(reg::COMMAND, cmd::REGISTER_SLOTS);
        assert_eq!(rd(reg::RESULT), result::OK);
        assert_eq!(pv.agent_slot_gpa(0), Some(0x10_0000));
        assert_eq!(pv.agent_slot_gpa(1), Some(0x10_1000));

        let base = 0x20_0000u64;
        let header = RingHeader {
            magic: RING_MAGIC,
            version: ring::RING_VERSION,
            capacity: 3,
            head: 1,
            ..RingHeader::default()
        };
        let mut e = ProcEvent {
            kind: kind::START,
            pid: 77,
            ..ProcEvent::default()
        };
        e.set_name("sqlite3");
        ram.write_obj(header, GuestAddress(base)).unwrap();
        ram.write_obj(e, GuestAddress(ring::record_gpa(base, 3, 0)))
            .unwrap();
        wr(reg::RING_LO, base as u32);
        wr(reg::RING_BYTES, 4096);
        wr(reg::COMMAND, cmd::REGISTER_RING);
        assert_eq!(rd(reg::RESULT), result::OK);
        assert_eq!(name(77).as_deref(), Some("sqlite3"));
        assert_eq!(name(78), None);

        // Unloading the module: the slot table forgets the slots before the write returns.
        wr(reg::COMMAND, cmd::RESET);
        assert_eq!(pv.agent_slot_gpa(0), None);
        assert_eq!(pv.agent_slot_gpa(1), None);
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
        let b = Board::new(&cfg(disks.clone()), Some(mem), latch(), pv()).unwrap();
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
            Board::new(&cfg(disks), None, latch(), pv()),
            Err(DeviceError::NoMemory)
        ));
        let missing = DiskConfig {
            path: dir.join("missing.img"),
            read_only: false,
        };
        let e = Board::new(
            &cfg(vec![missing]),
            Some(GuestMemoryMmap::new()),
            latch(),
            pv(),
        )
        .err()
        .unwrap();
        assert!(e.to_string().contains("missing.img"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
