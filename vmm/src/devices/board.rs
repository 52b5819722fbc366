//! The emulated board of a VM, from farvm-devices, on one I/O bus: the COM1 console (16550,
//! IRQ 4, output and input), the ACPI power registers (power-off ends the VM as a guest
//! shutdown with status 0, reset as [`VmOutcome::GuestReboot`]), the i8042's reset command
//! (port 0x64, also a reboot), one virtio-blk disk per
//! `--disk` and then one virtio-net device per `--net` on virtio-mmio (slot i: window
//! `0xd000_0000 + i * 4 KiB`, GSI 5 + i). Each network device has a thread of its own that
//! polls its tap and fills the guest's receive buffers (`farvm_devices::virtio::net::run_rx`);
//! [`Board::stop_devices`] (also on drop) ends and joins them, which the VM does with its vCPUs,
//! before its remote memory goes. Every
//! interrupt line is an eventfd the VMM registers as a KVM irqfd
//! ([`crate::vstate::irq::connect_irqfds`]). A Linux guest also gets the farvm agent device
//! (ACPI `FARV0001` at [`AGENT_MMIO_BASE`]): the guest agent module registers its per-vCPU
//! slots there (they go to the PV control device's slot table, which the paging engine
//! follows) and its process events (names for per-process statistics). Port-I/O and MMIO exits reach the devices
//! through [`Board::bus`]; the PV control device stays outside it (its writes return actions
//! to the vCPU loop).

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use farvm_devices::agent::{AgentDevice, AgentHost, SlotArray};
use farvm_devices::bus::{BusError, IoBus};
use farvm_devices::i8042::{I8042Reset, I8042_COMMAND_PORT};
use farvm_devices::interrupt::{EventFdInterrupts, IrqLine};
use farvm_devices::layout::{MmioDeviceInfo, COM1_GSI, COM1_PORT, COM1_PORTS};
use farvm_devices::layout::{AGENT_MMIO_BASE, AGENT_MMIO_SIZE, POWER_PORT, POWER_PORTS};
use farvm_devices::power::{PowerDevice, PowerEvent};
use farvm_devices::serial::{SerialConsole, SerialError, SerialIn, SerialOut};
use farvm_devices::virtio::block::{Block, BlockConfig, BlockError};
use farvm_devices::virtio::mmio::{MmioError, VirtioMmio};
use farvm_devices::virtio::net::{self as vnet, MacAddr, Net, NetError, Tap};
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::console::{self, EscapeFilter};
use super::pty::Pty;
use super::pvctl::PvCtl;
use crate::vstate::outcome::{OutcomeLatch, VmOutcome};

/// A disk to attach (`farvm run --disk PATH[,ro]`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// A network interface to attach (`farvm run --net tap=NAME[,mac=MAC]`, a domain's
/// `<interface type='ethernet'>`, or the API's `vm.add-net` with the tap's descriptor).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetConfig {
    /// The host's tap device: opened by name (created if it does not exist), or, with `fd`,
    /// the name of the tap that descriptor is attached to.
    pub tap: String,
    /// The guest's MAC address [`None`: derived from the tap's name, see
    /// [`NetConfig::mac_or_derived`]].
    pub mac: Option<MacAddr>,
    /// The tap, attached by someone else (libvirt) and handed over: each boot of the VM uses
    /// a duplicate of it, so a reboot does not need to open the tap again. A descriptor does
    /// not outlive the process: a stored description (a snapshot's) has none.
    #[serde(skip)]
    pub fd: Option<TapFd>,
}

/// A tap descriptor the VMM was given, shared by the boots of its VM.
#[derive(Clone, Debug)]
pub struct TapFd(Arc<OwnedFd>);

impl PartialEq for TapFd {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for TapFd {}

impl NetConfig {
    /// The interface on `fd`, a tap someone else attached (with IFF_NO_PI and IFF_VNET_HDR,
    /// as libvirt does for a virtio model): its name is read from the descriptor; `name`, if
    /// given, must be it.
    pub fn from_tap_fd(
        fd: OwnedFd,
        name: Option<&str>,
        mac: Option<MacAddr>,
    ) -> Result<Self, String> {
        let dup = fd
            .try_clone()
            .map_err(|e| format!("duplicating the tap descriptor: {e}"))?;
        let tap = Tap::from_fd(dup).map_err(|e| e.to_string())?;
        if let Some(n) = name.filter(|n| *n != tap.name()) {
            return Err(format!(
                "the descriptor is tap {}, not the `{n}` the request names",
                tap.name()
            ));
        }
        Ok(NetConfig {
            tap: tap.name().to_string(),
            mac,
            fd: Some(TapFd(Arc::new(fd))),
        })
    }

    /// The MAC the guest gets: the one given, else `52:54:00` followed by three bytes of a
    /// hash of the tap's name (locally administered, unicast, the same at every boot).
    pub fn mac_or_derived(&self) -> MacAddr {
        if let Some(m) = self.mac {
            return m;
        }
        // FNV-1a: stable across builds and Rust versions, unlike std's hasher.
        let h = self.tap.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        let b = h.to_le_bytes();
        [0x52, 0x54, 0x00, b[0], b[1], b[2]]
    }
}

impl std::str::FromStr for NetConfig {
    type Err = String;
    /// `tap=NAME` or `tap=NAME,mac=MAC`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (mut tap, mut mac) = (None, None);
        for opt in s.split(',') {
            match opt.split_once('=') {
                Some(("tap", v)) => {
                    farvm_vmconfig::domain::check_tap_name(v)?;
                    tap = Some(v.to_string());
                }
                Some(("mac", v)) => mac = Some(farvm_vmconfig::domain::parse_mac(v)?),
                _ => {
                    return Err(format!(
                        "`{s}`: unknown network option `{opt}` (expected tap=NAME[,mac=MAC])"
                    ))
                }
            }
        }
        let tap = tap.ok_or_else(|| format!("`{s}`: no tap=NAME"))?;
        Ok(NetConfig { tap, mac, fd: None })
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
    /// A network device could not be attached.
    #[error("network device on tap {tap}: {source}")]
    Net {
        /// The tap.
        tap: String,
        /// Why.
        #[source]
        source: NetError,
    },
    /// More disks and network devices than interrupt lines.
    #[error(
        "{disks} disks and {nets} network devices: at most {max} virtio-mmio devices fit the \
         interrupt lines",
        max = MAX_VIRTIO_DEVICES
    )]
    TooManyDevices {
        /// Disks asked for.
        disks: usize,
        /// Network devices asked for.
        nets: usize,
    },
    /// A network device's receive thread could not be started.
    #[error("network device on tap {tap}: cannot start its thread: {source}")]
    NetThread {
        /// The tap.
        tap: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The virtio-mmio transport refused the device.
    #[error("virtio transport: {0}")]
    Transport(#[from] MmioError),
    /// Two devices overlap on the bus.
    #[error("device layout: {0}")]
    Bus(#[from] BusError),
    /// An interrupt eventfd could not be created or registered.
    #[error("interrupt lines: {0}")]
    Interrupts(#[source] std::io::Error),
    /// Disks, network devices or the agent device were asked for without guest memory to
    /// DMA into.
    #[error("disks, network devices and the agent device need a memory view")]
    NoMemory,
}

/// Virtio devices (disks and network devices together) the interrupt lines allow (GSI
/// 5..=23).
pub const MAX_VIRTIO_DEVICES: usize = 19;

/// A network device as the board holds it.
pub type NetDevice = VirtioMmio<Net<Tap>, Arc<GuestMemoryMmap>>;

/// A network device and its receive thread.
struct NetPort {
    dev: Arc<NetDevice>,
    stop: Arc<EventFd>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl NetPort {
    /// Opens the tap, builds the device and starts its receive thread.
    fn start(
        cfg: &NetConfig,
        mem: Arc<GuestMemoryMmap>,
        irq: IrqLine,
    ) -> Result<Self, DeviceError> {
        let net_err = |source| DeviceError::Net {
            tap: cfg.tap.clone(),
            source,
        };
        let thread_err = |source| DeviceError::NetThread {
            tap: cfg.tap.clone(),
            source,
        };
        let tap = match &cfg.fd {
            Some(TapFd(fd)) => {
                let dup = fd.try_clone().map_err(|source| {
                    net_err(NetError::Configure {
                        name: cfg.tap.clone(),
                        what: "dup of the tap descriptor",
                        source,
                    })
                })?;
                Tap::from_fd(dup)
            }
            None => Tap::open(&cfg.tap),
        }
        .map_err(net_err)?;
        let net = Net::new(tap, cfg.mac_or_derived()).map_err(net_err)?;
        let dev = Arc::new(VirtioMmio::new(net, mem, irq)?);
        let stop = Arc::new(EventFd::new(EFD_NONBLOCK).map_err(thread_err)?);
        let (d, s, name) = (dev.clone(), stop.clone(), cfg.tap.clone());
        let thread = std::thread::Builder::new()
            .name(format!("net-{name}"))
            .spawn(move || {
                farvm_sandbox::enter(farvm_sandbox::ThreadClass::Device);
                match vnet::run_rx(&d, &s) {
                    Ok(()) if d.with_device(|n| n.gone()) => {
                        tracing::warn!(tap = %name, "tap gone: the guest's link is down")
                    }
                    Ok(()) => {}
                    Err(e) => tracing::error!(tap = %name, "network receive thread: {e}"),
                }
            })
            .map_err(thread_err)?;
        Ok(NetPort {
            dev,
            stop,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Ends and joins the receive thread and closes the tap (idempotent).
    fn stop(&self) {
        let handle = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            if let Err(e) = self.stop.write(1) {
                tracing::error!("stopping a network receive thread: {e}");
                return;
            }
            let _ = h.join();
            // The VM's shared state (and so this device) may outlive the VM in a watcher's
            // hands; the tap must not: a reboot opens it again, and a second open of a
            // single-queue tap is refused.
            self.dev.with_device_mut(|n| n.close_backend());
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
    /// A pseudo-terminal for the console's output and input instead of `serial_out` and
    /// `serial_in`.
    pub pty: Option<Arc<Pty>>,
    /// The virtio-blk disks, in order.
    pub disks: Vec<DiskConfig>,
    /// The virtio-net devices, in order (after the disks).
    pub nets: Vec<NetConfig>,
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
    /// The virtio-mmio slots: disks, then network devices.
    virtio: Vec<MmioDeviceInfo>,
    nets: Vec<NetPort>,
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
        let too_many = DeviceError::TooManyDevices {
            disks: cfg.disks.len(),
            nets: cfg.nets.len(),
        };
        let count = cfg.disks.len() + cfg.nets.len();
        if count > MAX_VIRTIO_DEVICES {
            return Err(too_many);
        }
        let slots: Vec<MmioDeviceInfo> = (0..count as u32)
            .map(MmioDeviceInfo::slot)
            .collect::<Option<_>>()
            .ok_or(too_many)?;
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
        // A guest's fallback reboot (Linux tries it when the ACPI reset did not stop it).
        let target = stop.clone();
        let reset_line = I8042Reset::new(move |_| target.decide(VmOutcome::GuestReboot));
        bus.register_pio(I8042_COMMAND_PORT, 1, Arc::new(reset_line))?;

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

        let mut nets = Vec::with_capacity(cfg.nets.len());
        if !slots.is_empty() {
            let mem = Arc::new(mem.ok_or(DeviceError::NoMemory)?);
            let (disk_slots, net_slots) = slots.split_at(cfg.disks.len());
            for (disk, slot) in cfg.disks.iter().zip(disk_slots) {
                let block = Block::open(&BlockConfig {
                    path: disk.path.clone(),
                    read_only: disk.read_only,
                    serial: None,
                })?;
                let virtio =
                    VirtioMmio::new(block, mem.clone(), IrqLine::new(irqs.clone(), slot.gsi))?;
                bus.register_mmio(slot.base, slot.size, Arc::new(virtio))?;
            }
            for (net, slot) in cfg.nets.iter().zip(net_slots) {
                let port = NetPort::start(net, mem.clone(), IrqLine::new(irqs.clone(), slot.gsi))?;
                bus.register_mmio(slot.base, slot.size, port.dev.clone())?;
                nets.push(port);
            }
        }

        let board = Board {
            bus,
            console,
            irqs,
            virtio: slots,
            nets,
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

    /// The COM1 console (its UART state is a snapshot's).
    pub fn console(&self) -> &SerialConsole {
        &self.console
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
        &self.virtio
    }

    /// The network devices, in order.
    pub fn nets(&self) -> impl Iterator<Item = &NetDevice> {
        self.nets.iter().map(|p| &*p.dev)
    }

    /// Ends and joins the devices' own threads (the network devices' receive threads), so
    /// nothing touches guest memory after the vCPUs are joined, and closes the taps. Idempotent.
    pub fn stop_devices(&self) {
        for p in &self.nets {
            p.stop();
        }
    }

    /// Whether `port` is COM1's (for the exit counters).
    pub fn is_console_port(port: u16) -> bool {
        (COM1_PORT..COM1_PORT + COM1_PORTS).contains(&port)
    }
}

impl Drop for Board {
    fn drop(&mut self) {
        self.stop_devices();
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
            nets: Vec::new(),
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
    fn net_arguments_parse() {
        let n: NetConfig = "tap=vnet0".parse().unwrap();
        assert_eq!((n.tap.as_str(), n.mac), ("vnet0", None));
        let n: NetConfig = "tap=t1,mac=52:54:00:01:02:03".parse().unwrap();
        assert_eq!(n.mac, Some([0x52, 0x54, 0, 1, 2, 3]));
        assert_eq!(n.mac_or_derived(), [0x52, 0x54, 0, 1, 2, 3]);
        for (bad, want) in [
            ("vnet0", "unknown network option `vnet0`"),
            ("mac=52:54:00:01:02:03", "no tap=NAME"),
            ("tap=t0,mac=52:54", "not a MAC address"),
            ("tap=t0,mac=03:54:00:01:02:03", "multicast"),
            ("tap=a-name-longer-than-15", "not a network interface name"),
            ("tap=t0,queues=4", "unknown network option `queues=4`"),
        ] {
            let e = bad.parse::<NetConfig>().unwrap_err();
            assert!(e.contains(want), "{bad}: {e}");
        }
        // Without a MAC: locally administered, unicast, the same for the same tap.
        let a = "tap=vnet0".parse::<NetConfig>().unwrap().mac_or_derived();
        let b = "tap=vnet1".parse::<NetConfig>().unwrap().mac_or_derived();
        assert_eq!(
            a,
            "tap=vnet0".parse::<NetConfig>().unwrap().mac_or_derived()
        );
        assert_ne!(a, b);
        assert_eq!(a[0] & 3, 2);
    }

    /// A network device takes the slot after the disks, answers as virtio-net on the bus, and
    /// its receive thread ends with the board. Needs root: it creates a tap (in this
    /// namespace, under a name of its own; the tap goes when its file is closed).
    #[test]
    fn network_devices_follow_the_disks_and_stop_with_the_board() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        assert_eq!(
            uid, 0,
            "this test creates a tap device: run it as root (CI does)"
        );
        let dir = std::env::temp_dir().join(format!("farvm-board-net-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("d.img");
        std::fs::write(&img, vec![0u8; 4096]).unwrap();
        let tap = format!("fvb{}", std::process::id() % 1_000_000);
        let mut c = cfg(vec![DiskConfig {
            path: img,
            read_only: false,
        }]);
        c.nets = vec![NetConfig {
            tap: tap.clone(),
            mac: Some([0x52, 0x54, 0, 9, 8, 7]),
            fd: None,
        }];
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let b = Board::new(&c, Some(mem), latch(), pv()).unwrap();
        let slots = b.virtio_mmio();
        assert_eq!(slots.len(), 2);
        assert_eq!((slots[1].base, slots[1].gsi), (0xd000_1000, 6));
        let mut id = [0u8; 4];
        b.bus().mmio_read(slots[1].base + 8, &mut id).unwrap();
        assert_eq!(u32::from_le_bytes(id), 1, "virtio-net");
        let mut mac = [0u8; 6];
        b.bus().mmio_read(slots[1].base + 0x100, &mut mac).unwrap();
        assert_eq!(mac, [0x52, 0x54, 0, 9, 8, 7]);
        assert!(std::path::Path::new(&format!("/sys/class/net/{tap}")).exists());
        assert_eq!(b.nets().count(), 1);
        b.stop_devices();
        b.stop_devices();
        // Stopped, the board no longer holds the tap (even before it is dropped): a tap farvm
        // created is gone, and the next boot may open the name again.
        assert!(
            !std::path::Path::new(&format!("/sys/class/net/{tap}")).exists(),
            "the tap farvm created goes when the devices stop"
        );
        assert!(b.nets().all(|n| n.with_device(|n| n.gone())));
        // A new board opens the same name while the old one is still alive (the disk is left
        // out: its image stays locked by the old board until that is dropped).
        let mut c2 = cfg(Vec::new());
        c2.nets = c.nets.clone();
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let again = Board::new(&c2, Some(mem), latch(), pv()).unwrap();
        drop(again);
        drop(b);
        // Too many devices: counted together.
        let mut c = cfg(Vec::new());
        c.nets = vec![
            NetConfig {
                tap,
                mac: None,
                fd: None
            };
            MAX_VIRTIO_DEVICES + 1
        ];
        let e = Board::new(&c, None, latch(), pv()).err().unwrap();
        assert!(
            e.to_string().contains("0 disks and 20 network devices"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
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
