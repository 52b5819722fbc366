//! A built VM and its control surface — what `farvm run`, the tests, the lab's benchmarks and
//! an API server drive. [`crate::builder::build`] makes a [`Vm`] (guest RAM, KVM VM and vCPUs,
//! kernel and boot data, devices; nothing runs yet). [`Vm::start`] starts the vCPU threads and
//! returns a [`RunningVm`], which can be paused, resumed, asked to shut down, asked for its
//! [`VmState`] and [`VmCounters`], waited on, and finished into a [`VmReport`].
//!
//! [`VmShared`] is the state the control socket, the API and the metrics endpoint share; the
//! vCPU threads see it only as their [`VcpuExits`], the devices only through the
//! [`OutcomeLatch`] that ends the VM. A VM with remote memory owns its [`RemoteMemory`] and shuts it down after
//! its vCPU threads are joined and its KVM VM is closed.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use farvm_ept::translate::GuestPaging;
use kvm_ioctls::{VcpuFd, VmFd};
use serde::Serialize;

use crate::boot::linux::LinuxBootInfo;
use crate::boot::EntryState;
use crate::devices::board::Board;
use crate::devices::pvctl::{ProcessRecord, PvAction, PvCounterValues, PvCtl};
use crate::process_stats::{self, PerProcessStats};
use crate::remote::{RemoteMemory, RemoteStats, StatsSource};
use crate::signals;
use crate::stats::{ExitCounts, ExitStats};
use crate::vstate::kvm_stats::VcpuStats;
use crate::vstate::memory::GuestRam;
use crate::vstate::outcome::OutcomeLatch;
pub use crate::vstate::outcome::VmOutcome;
use crate::vstate::vcpu::{
    self, DeviceAction, SpawnError, VcpuError, VcpuExits, VcpuGroup, VcpuState,
};
use crate::vstate::vm::{KvmError, KvmVm};

/// How long [`RunningVm::pause`] waits for every vCPU to leave the guest.
pub const PAUSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a VM is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VmState {
    /// Built; no vCPU has run.
    Created,
    /// The vCPUs run the guest.
    Running,
    /// Every vCPU is parked outside the guest until [`RunningVm::resume`].
    Paused,
    /// An outcome is decided; the vCPUs are leaving the guest.
    Stopping,
}

impl std::fmt::Display for VmState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VmState::Created => "created",
            VmState::Running => "running",
            VmState::Paused => "paused",
            VmState::Stopping => "stopping",
        })
    }
}

/// Errors of the control surface.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// A control request that does not fit the VM's state (e.g. pausing a stopped VM).
    #[error("cannot {action} a VM that is {state}")]
    InvalidState {
        /// What was asked (start, pause ...).
        action: &'static str,
        /// The state the VM was in.
        state: VmState,
    },
    /// The vCPUs did not stop in time for a pause.
    #[error("the vCPUs did not leave the guest within {0:?}")]
    PauseTimeout(Duration),
    /// A vCPU thread could not be spawned.
    #[error("cannot start thread vcpu{index}: {source}")]
    Spawn {
        /// The vCPU.
        index: u32,
        /// The OS error.
        source: std::io::Error,
    },
    /// The signal handler that kicks vCPUs out of KVM_RUN could not be installed.
    #[error("cannot install the vCPU kick signal handler: {0}")]
    Signals(std::io::Error),
    /// No vCPU with this index.
    #[error("no vCPU {0}")]
    NoVcpu(usize),
    /// A KVM call failed.
    #[error(transparent)]
    Kvm(#[from] KvmError),
}

/// A VM's counters at one instant (what `farvm stats` and an API's `vm.counters` show).
#[derive(Clone, Debug, Serialize)]
pub struct VmCounters {
    /// Seconds since the VM started.
    pub uptime_secs: f64,
    /// vCPU exits by kind.
    pub exits: ExitCounts,
    /// All vCPU exits.
    pub exits_total: u64,
    /// Paravirtual device traffic.
    pub pv: PvCounterValues,
    /// Paging engine and memory-server statistics (remote memory only).
    pub paging: Option<RemoteStats>,
}

/// State shared by the vCPU threads, the devices, the control socket and the caller.
pub struct VmShared {
    /// The VM's name.
    pub name: String,
    /// The UUID the VM was created with, if any (libvirt gives one).
    pub uuid: Option<String>,
    /// Guest RAM.
    pub ram: Arc<GuestRam>,
    /// The paravirtual control device.
    pub pv: Arc<PvCtl>,
    /// The emulated devices behind the port-I/O and MMIO exits.
    pub board: Board,
    /// vCPU exit counters.
    pub exits: ExitStats,
    /// vCPUs.
    pub ncpus: u32,
    /// When the VM was created.
    pub started: Instant,
    /// How the VM ends (its vCPUs, devices, paging engine and owner decide it).
    latch: Arc<OutcomeLatch>,
    /// The vCPU threads, once [`Vm::start`] spawned them.
    vcpus: OnceLock<VcpuGroup>,
    kvm_stats: Vec<Option<VcpuStats>>,
    /// Paging statistics of remote memory (set by the builder when RAM is remote).
    paging: OnceLock<StatsSource>,
    /// How the guest's page tables look, for the paging engine's page space (remote memory
    /// only); learnt from a vCPU's CR4 when the guest agent registers its slot.
    guest_paging: OnceLock<Arc<GuestPaging>>,
    /// A pool VM's remote memory, for a snapshot that leaves remote pages on the servers.
    remote_saving: OnceLock<crate::remote::RemoteSaving>,
    /// The KVM VM (its irqchip and clock are VM-wide state a snapshot saves); weak, so the VM
    /// fd still closes when the VM drops it.
    kvm_vm: OnceLock<Weak<VmFd>>,
}

/// The agent device's command register (a write there may register the vCPU's slot).
const AGENT_COMMAND_GPA: u64 =
    farvm_devices::layout::AGENT_MMIO_BASE + farvm_guest_agent::device::reg::COMMAND;

impl VmShared {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: String,
        uuid: Option<String>,
        ram: Arc<GuestRam>,
        pv: Arc<PvCtl>,
        board: Board,
        ncpus: u32,
        kvm_stats: Vec<Option<VcpuStats>>,
        latch: Arc<OutcomeLatch>,
    ) -> Self {
        VmShared {
            name,
            uuid,
            ram,
            pv,
            board,
            exits: ExitStats::default(),
            ncpus,
            started: Instant::now(),
            latch,
            vcpus: OnceLock::new(),
            kvm_stats,
            paging: OnceLock::new(),
            guest_paging: OnceLock::new(),
            remote_saving: OnceLock::new(),
            kvm_vm: OnceLock::new(),
        }
    }

    /// The KVM VM, while the VM holds it.
    pub(crate) fn kvm_vm(&self) -> Option<Arc<VmFd>> {
        self.kvm_vm.get().and_then(Weak::upgrade)
    }

    /// Every vCPU's full state (the VM must be paused).
    pub(crate) fn save_vcpus(&self, timeout: Duration) -> Result<Vec<VcpuState>, VcpuError> {
        self.vcpus
            .get()
            .ok_or(VcpuError::NotPaused)?
            .save_states(timeout)
    }

    /// Each vCPU's state — what its thread reads from KVM once kicked out of KVM_RUN: MP state,
    /// registers, pending events, local APIC — for a VM that seems stuck (control command
    /// `vcpus`). A vCPU that does not answer within `timeout` (its thread blocked in the host,
    /// e.g. in a fault on a page not yet fetched) is `None`.
    pub fn dump_vcpus(&self, timeout: Duration) -> Vec<Option<String>> {
        match self.vcpus.get() {
            Some(g) => g.dump(timeout),
            None => vec![None; self.ncpus as usize],
        }
    }

    /// KVM's own per-vCPU counters (`KVM_GET_STATS_FD`), non-zero ones only; `None` for a vCPU
    /// whose stats fd could not be opened.
    pub fn kvm_stats(&self) -> Vec<Option<Vec<(String, u64)>>> {
        self.kvm_stats
            .iter()
            .map(|s| {
                s.as_ref()
                    .and_then(|s| s.read().ok())
                    .map(|v| v.into_iter().filter(|(_, n)| *n != 0).collect())
            })
            .collect()
    }

    /// Records `outcome` (the first one wins) and stops every vCPU.
    pub fn request_stop(&self, outcome: VmOutcome) {
        self.latch.decide(outcome);
    }

    /// Whether a stop was requested.
    pub fn stopping(&self) -> bool {
        self.latch.stopping()
    }

    /// The outcome, once decided.
    pub fn outcome(&self) -> Option<VmOutcome> {
        self.latch.outcome()
    }

    /// Waits up to `timeout` for the outcome, without asking the VM to stop (a supervisor's
    /// view; [`RunningVm::wait`] is the owner's).
    pub fn wait_outcome(&self, timeout: Duration) -> Option<VmOutcome> {
        self.latch.wait(timeout)
    }

    /// Where the VM ends: what a component below the VM holds to stop it.
    pub fn latch(&self) -> &Arc<OutcomeLatch> {
        &self.latch
    }

    /// Where the VM is in its life.
    pub fn state(&self) -> VmState {
        match self.vcpus.get() {
            _ if self.stopping() => VmState::Stopping,
            None => VmState::Created,
            Some(g) if g.is_paused() => VmState::Paused,
            Some(_) => VmState::Running,
        }
    }

    /// Host thread ids of the vCPU threads (all set once [`Vm::start`] returned; the guest runs
    /// only after they are; zeros before).
    pub fn vcpu_tids(&self) -> Vec<i32> {
        match self.vcpus.get() {
            Some(g) => g.tids().to_vec(),
            None => vec![0; self.ncpus as usize],
        }
    }

    /// The pid each vCPU runs now, from the agent slots.
    pub fn current_pids(&self) -> Vec<Option<u64>> {
        (0..self.ncpus).map(|c| self.pv.current_pid(c)).collect()
    }

    /// Paging statistics (remote memory only; `None` once the engine is gone).
    pub fn paging_stats(&self) -> Option<RemoteStats> {
        self.paging.get().and_then(StatsSource::stats)
    }

    /// A pool VM's remote memory as a snapshot needs it (set by the builder; None for any
    /// other VM).
    pub fn remote_saving(&self) -> Option<&crate::remote::RemoteSaving> {
        self.remote_saving.get()
    }

    /// Sets [`VmShared::remote_saving`] (once).
    pub(crate) fn set_remote_saving(&self, saving: crate::remote::RemoteSaving) {
        let _ = self.remote_saving.set(saving);
    }

    /// Starts a page-key rotation (`farvm rotate-key`; remote memory with sealed pages only).
    pub fn rotate_key(&self) -> Result<crate::remote::KeyRotation, String> {
        let source = self.paging.get().ok_or_else(|| {
            "no page key: the VM's memory is not remote (--local-only)".to_string()
        })?;
        source.rotate_key().map_err(|e| e.to_string())
    }

    /// The paging engine, while it runs (remote memory only).
    pub fn paging_engine(&self) -> Option<Arc<farvm_ept::Engine>> {
        self.paging.get().and_then(StatsSource::engine)
    }

    /// The name of guest process `pid`, from what the guest told the VMM: `kernel` for pid 0,
    /// else the Linux guest agent's process table, else the test guest's process mailboxes
    /// (the workload's name).
    pub fn process_name(&self, pid: u64) -> Option<String> {
        if pid == 0 {
            return Some("kernel".into());
        }
        let from_agent = || self.board.agent()?.process_name(u32::try_from(pid).ok()?);
        if let Some(name) = from_agent() {
            return Some(name);
        }
        self.pv
            .processes()
            .iter()
            .find(|p| u64::from(p.pid) == pid)
            .map(|p| crate::workload_spec::workload_name(p.workload).to_string())
    }

    /// The names guest process `pid` ran under, newest first: the Linux guest agent's (its
    /// name now, then those before its renames), else [`Self::process_name`]'s one.
    pub fn process_names(&self, pid: u64) -> Vec<String> {
        let from_agent = || {
            let names = self.board.agent()?.process_names(u32::try_from(pid).ok()?);
            (!names.is_empty()).then_some(names)
        };
        if pid != 0 {
            if let Some(names) = from_agent() {
                return names;
            }
        }
        self.process_name(pid).into_iter().collect()
    }

    /// Per-process paging statistics (`None` without remote memory, or once the engine is
    /// gone).
    pub fn per_process(&self) -> Option<PerProcessStats> {
        let engine = self.paging_engine()?;
        Some(process_stats::per_process(&engine, |pid| {
            self.process_names(pid)
        }))
    }

    pub(crate) fn set_paging_source(&self, source: StatsSource) {
        let _ = self.paging.set(source);
    }

    pub(crate) fn set_guest_paging(&self, paging: Arc<GuestPaging>) {
        let _ = self.guest_paging.set(paging);
    }

    /// The VM's counters now.
    pub fn counters(&self) -> VmCounters {
        let exits = self.exits.snapshot();
        VmCounters {
            uptime_secs: self.started.elapsed().as_secs_f64(),
            exits_total: exits.total(),
            exits,
            pv: self.pv.counters.snapshot(),
            paging: self.paging_stats(),
        }
    }

    pub(crate) fn pause(&self, timeout: Duration) -> Result<(), VmError> {
        let refuse = |state| VmError::InvalidState {
            action: "pause",
            state,
        };
        match self.state() {
            VmState::Running | VmState::Paused => {}
            other => return Err(refuse(other)),
        }
        let group = self.vcpus.get().ok_or(refuse(VmState::Created))?;
        group.pause(timeout).map_err(|e| match e {
            VcpuError::PauseTimeout(t) => VmError::PauseTimeout(t),
            _ => refuse(VmState::Stopping),
        })
    }

    /// Lets paused vCPUs run the guest again.
    pub(crate) fn resume(&self) -> Result<(), VmError> {
        match self.state() {
            VmState::Paused => {
                if let Some(g) = self.vcpus.get() {
                    g.resume(PAUSE_TIMEOUT);
                }
                Ok(())
            }
            state => Err(VmError::InvalidState {
                action: "resume",
                state,
            }),
        }
    }

    fn count_port(&self, port: u16) {
        ExitStats::bump(if Board::is_console_port(port) {
            &self.exits.io_serial
        } else {
            &self.exits.io_other
        });
    }
}

/// The VM's side of its vCPUs' exits: the PV control device's ports, the board's I/O bus (a
/// port nobody owns reads all-ones and drops writes, as an empty ISA bus does; an MMIO
/// address nobody owns stops the VM), and the guest's paging depth for the paging engine.
impl VcpuExits for VmShared {
    fn ram(&self) -> &GuestRam {
        &self.ram
    }

    fn exit_stats(&self) -> &ExitStats {
        &self.exits
    }

    fn port_out(&self, cpu: u32, port: u16, data: &[u8]) -> DeviceAction {
        if !PvCtl::owns(port) {
            self.count_port(port);
            let _ = self.board.bus().pio_write(port, data);
            return DeviceAction::Continue;
        }
        ExitStats::bump(&self.exits.io_pv);
        match self.pv.write(cpu, port, le_value(data)) {
            PvAction::Continue if port == farvm_guest_agent::pv::PORT_AGENT_SLOT => {
                DeviceAction::AgentRegistered
            }
            PvAction::Continue => DeviceAction::Continue,
            PvAction::Shutdown(status) => DeviceAction::Stop(VmOutcome::GuestShutdown { status }),
            PvAction::Panic(message) => DeviceAction::Stop(VmOutcome::GuestPanic { message }),
        }
    }

    fn port_in(&self, _cpu: u32, port: u16, data: &mut [u8]) {
        if PvCtl::owns(port) {
            ExitStats::bump(&self.exits.io_pv);
            let v = self.pv.read(port).to_le_bytes();
            for (i, d) in data.iter_mut().enumerate() {
                *d = v.get(i).copied().unwrap_or(0);
            }
        } else {
            self.count_port(port);
            if self.board.bus().pio_read(port, data).is_err() {
                data.fill(0xff);
            }
        }
    }

    fn mmio_read(&self, cpu: u32, addr: u64, data: &mut [u8]) -> DeviceAction {
        ExitStats::bump(&self.exits.mmio);
        match self.board.bus().mmio_read(addr, data) {
            Ok(()) => DeviceAction::Continue,
            Err(_) => unmapped(cpu, addr),
        }
    }

    fn mmio_write(&self, cpu: u32, addr: u64, data: &[u8]) -> DeviceAction {
        ExitStats::bump(&self.exits.mmio);
        match self.board.bus().mmio_write(addr, data) {
            // A guest agent command (slot registration among them): learn the guest's paging
            // from this vCPU's CR4, as for the test guest's slot port.
            Ok(()) if addr == AGENT_COMMAND_GPA => DeviceAction::AgentRegistered,
            Ok(()) => DeviceAction::Continue,
            Err(_) => unmapped(cpu, addr),
        }
    }

    fn cpu_done(&self, cpu: u32) -> bool {
        self.pv.cpu_done(cpu)
    }

    /// Tells the paging engine the guest's paging depth from vCPU `cpu`'s CR4 (read when the
    /// guest agent registers that vCPU's slot: from then on its CR3 values are walked).
    fn guest_cr4(&self, cpu: u32, cr4: u64) {
        if let Some(p) = self.guest_paging.get() {
            let before = p.levels();
            p.set_from_cr4(cr4);
            if p.levels() != before || cpu == 0 {
                tracing::info!(cpu, levels = p.levels(), "guest paging");
            }
        }
    }
}

fn le_value(data: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    let n = data.len().min(4);
    b[..n].copy_from_slice(&data[..n]);
    u32::from_le_bytes(b)
}

fn unmapped(cpu: u32, addr: u64) -> DeviceAction {
    DeviceAction::Stop(VmOutcome::Crash {
        cpu,
        message: format!(
            "access to unmapped guest-physical address {addr:#x} (MMIO; no device there)"
        ),
    })
}

/// Remote memory owned by a VM, shut down (engine, store, embedded memory server) when the VM
/// goes. Declared last in [`Vm`] and [`RunningVm`] so it drops after the vCPUs and the KVM VM.
#[derive(Default)]
struct RemoteOwner(Option<RemoteMemory>);

impl Drop for RemoteOwner {
    fn drop(&mut self) {
        if let Some(r) = self.0.take() {
            r.shutdown();
        }
    }
}

/// A built VM whose vCPUs have not run yet.
pub struct Vm {
    shared: Arc<VmShared>,
    vcpus: Vec<VcpuFd>,
    kvm: KvmVm,
    entry: EntryState,
    linux: Option<LinuxBootInfo>,
    remote: RemoteOwner,
}

impl Vm {
    pub(crate) fn new(
        shared: Arc<VmShared>,
        kvm: KvmVm,
        vcpus: Vec<VcpuFd>,
        entry: EntryState,
        linux: Option<LinuxBootInfo>,
    ) -> Self {
        let _ = shared.kvm_vm.set(Arc::downgrade(&kvm.fd));
        Vm {
            shared,
            vcpus,
            kvm,
            entry,
            linux,
            remote: RemoteOwner::default(),
        }
    }

    /// Hands `remote` (already attached with [`RemoteMemory::attach_vm`]) to the VM.
    pub(crate) fn own_remote(&mut self, remote: RemoteMemory) {
        self.shared.set_paging_source(remote.stats_source());
        self.remote.0 = Some(remote);
    }

    /// Shared state (RAM, PV device, counters).
    pub fn shared(&self) -> &Arc<VmShared> {
        &self.shared
    }

    /// Guest RAM.
    pub fn ram(&self) -> &Arc<GuestRam> {
        &self.shared.ram
    }

    /// The VM's remote memory, if its RAM is remote.
    pub fn remote(&self) -> Option<&RemoteMemory> {
        self.remote.0.as_ref()
    }

    /// The vCPUs, in index order (a restore puts their saved state on them before the start).
    pub(crate) fn vcpus(&self) -> &[VcpuFd] {
        &self.vcpus
    }

    /// Raw fds of the vCPUs, in index order.
    pub fn vcpu_fds(&self) -> Vec<RawFd> {
        self.vcpus.iter().map(|v| v.as_raw_fd()).collect()
    }

    /// The VM fd.
    pub fn vm_fd(&self) -> RawFd {
        self.kvm.fd.as_raw_fd()
    }

    /// The KVM VM (e.g. to create an extra, never-run vCPU for KVM_PRE_FAULT_MEMORY).
    pub fn kvm_vm(&self) -> &kvm_ioctls::VmFd {
        &self.kvm.fd
    }

    /// vCPU 0's entry state.
    pub fn entry(&self) -> EntryState {
        self.entry
    }

    /// Linux boot details (boot_params placement etc.), for a Linux boot.
    pub fn linux_boot(&self) -> Option<&LinuxBootInfo> {
        self.linux.as_ref()
    }

    /// Always [`VmState::Created`].
    pub fn state(&self) -> VmState {
        self.shared.state()
    }

    /// Registers of vCPU `i` as KVM holds them (for stop-at-entry checks).
    pub fn vcpu_regs(
        &self,
        i: usize,
    ) -> Result<(kvm_bindings::kvm_regs, kvm_bindings::kvm_sregs), VmError> {
        let v = self.vcpus.get(i).ok_or(VmError::NoVcpu(i))?;
        Ok(vcpu::registers(v)?)
    }

    /// KVM's multiprocessing state of vCPU `i` (`KVM_MP_STATE_*`): a Linux guest's APs are
    /// `UNINITIALIZED` (waiting for INIT/SIPI) until the kernel starts them.
    pub fn vcpu_mp_state(&self, i: usize) -> Result<u32, VmError> {
        let v = self.vcpus.get(i).ok_or(VmError::NoVcpu(i))?;
        v.get_mp_state()
            .map(|m| m.mp_state)
            .map_err(|e| VmError::from(crate::vstate::vm::ioctl("KVM_GET_MP_STATE")(e)))
    }

    /// Starts one thread per vCPU; the guest runs once every thread has published its id.
    pub fn start(self) -> Result<RunningVm, VmError> {
        self.start_as(false)
    }

    /// Starts the vCPU threads paused: no guest instruction runs before
    /// [`RunningVm::resume`] (a restored snapshot, as Cloud Hypervisor's `vm.restore` leaves
    /// it).
    pub fn start_paused(self) -> Result<RunningVm, VmError> {
        self.start_as(true)
    }

    fn start_as(self, paused: bool) -> Result<RunningVm, VmError> {
        signals::install_kick_handler().map_err(VmError::Signals)?;
        let Vm {
            shared,
            vcpus,
            kvm,
            remote,
            ..
        } = self;
        let exits: Arc<dyn VcpuExits> = shared.clone();
        let group = VcpuGroup::spawn(vcpus, exits, shared.latch.clone(), kvm.hlt_in_guest)
            .map_err(|SpawnError { index, source }| VmError::Spawn { index, source })?;
        // The thread ids are known before any guest instruction runs, so the memory engine
        // can map uffd thread ids to vCPUs.
        let group = shared.vcpus.get_or_init(|| group);
        if paused {
            // A thread not started yet parks on the pause and waits for the resume after its
            // start.
            group.pause(PAUSE_TIMEOUT).map_err(|e| match e {
                VcpuError::PauseTimeout(t) => VmError::PauseTimeout(t),
                _ => VmError::InvalidState {
                    action: "start",
                    state: VmState::Stopping,
                },
            })?;
        }
        group.start();
        Ok(RunningVm {
            shared,
            _kvm: kvm,
            remote,
        })
    }
}

/// The final account of a run.
#[derive(Clone, Debug, Serialize)]
pub struct VmReport {
    /// The VM's name.
    pub name: String,
    /// How it ended.
    pub outcome: VmOutcome,
    /// How long it ran.
    pub uptime_secs: f64,
    /// vCPU exits by kind.
    pub exits: ExitCounts,
    /// KVM's per-vCPU counters at the end (non-zero ones).
    pub kvm_stats: Vec<Option<Vec<(String, u64)>>>,
    /// The test guest's processes, by pid.
    pub processes: Vec<ProcessRecord>,
    /// Paging statistics at the end (remote memory only).
    pub paging: Option<RemoteStats>,
    /// Errors the paging engine kept (its first 256), as text.
    pub paging_errors: Vec<String>,
    /// Per-process paging statistics at the end (remote memory only).
    pub per_process: Option<PerProcessStats>,
    /// The engine's fault log (`farvm run --fault-log`; empty when off), written to its own
    /// file rather than into the report.
    #[serde(skip)]
    pub fault_log: Vec<farvm_ept::faultlog::FaultRecord>,
    /// Faults the log had no room for.
    #[serde(skip)]
    pub fault_log_dropped: u64,
}

/// A running VM. Dropping it without [`RunningVm::finish`] stops it the same way.
pub struct RunningVm {
    shared: Arc<VmShared>,
    // Dropped after the vCPU threads are joined (their fds first, then the VM fd), then the
    // remote memory.
    _kvm: KvmVm,
    remote: RemoteOwner,
}

impl RunningVm {
    /// What the vCPU threads, devices and control socket share.
    pub fn shared(&self) -> &Arc<VmShared> {
        &self.shared
    }

    /// The VM's remote memory, if its RAM is remote.
    pub fn remote(&self) -> Option<&RemoteMemory> {
        self.remote.0.as_ref()
    }

    /// Where the VM is in its life.
    pub fn state(&self) -> VmState {
        self.shared.state()
    }

    /// The VM's counters now.
    pub fn counters(&self) -> VmCounters {
        self.shared.counters()
    }

    /// Parks every vCPU outside the guest; returns once all are parked (at most
    /// [`PAUSE_TIMEOUT`]). Pausing a paused VM does nothing.
    pub fn pause(&self) -> Result<(), VmError> {
        self.shared.pause(PAUSE_TIMEOUT)
    }

    /// Lets paused vCPUs run the guest again.
    pub fn resume(&self) -> Result<(), VmError> {
        self.shared.resume()
    }

    /// Asks the VM to stop (outcome [`VmOutcome::ControlShutdown`] unless one is decided).
    pub fn request_shutdown(&self) {
        self.shared.request_stop(VmOutcome::ControlShutdown);
    }

    /// Blocks until the VM stops by itself, a termination signal arrives (when
    /// `watch_signals`), or `timeout` passes. Returns the outcome.
    pub fn wait(&self, timeout: Option<Duration>, watch_signals: bool) -> VmOutcome {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(out) = self.shared.latch.wait(Duration::from_millis(50)) {
                return out;
            }
            if let Some(sig) = watch_signals.then(signals::termination_requested).flatten() {
                self.shared.request_stop(VmOutcome::Signal { signal: sig });
            } else if deadline.is_some_and(|d| Instant::now() >= d) {
                self.shared.request_stop(VmOutcome::Timeout {
                    secs: timeout.unwrap_or_default().as_secs(),
                });
            }
        }
    }

    fn stop_and_join(&mut self, outcome_if_running: VmOutcome) {
        self.shared.request_stop(outcome_if_running);
        if let Some(g) = self.shared.vcpus.get() {
            g.join();
        }
        // Devices with threads of their own (network receive) touch guest memory too: they
        // end here, before the remote memory this VM owns is shut down.
        self.shared.board.stop_devices();
    }

    /// Stops the VM (if still running), joins the vCPU threads and returns the report; then
    /// closes the KVM VM and shuts its remote memory down.
    pub fn finish(mut self, outcome_if_running: VmOutcome) -> VmReport {
        self.stop_and_join(outcome_if_running);
        let outcome = self.shared.outcome().unwrap_or(VmOutcome::HostError {
            message: "no outcome recorded".into(),
        });
        let (paging, paging_errors) = match self.remote() {
            Some(r) => (
                Some(r.stats()),
                r.engine()
                    .take_errors()
                    .iter()
                    .map(|e| e.to_string())
                    .collect(),
            ),
            None => (None, Vec::new()),
        };
        VmReport {
            name: self.shared.name.clone(),
            outcome,
            uptime_secs: self.shared.started.elapsed().as_secs_f64(),
            exits: self.shared.exits.snapshot(),
            kvm_stats: self.shared.kvm_stats(),
            processes: self.shared.pv.processes(),
            paging,
            paging_errors,
            per_process: self.shared.per_process(),
            fault_log: self
                .remote()
                .map(|r| r.engine().fault_log().records())
                .unwrap_or_default(),
            fault_log_dropped: self
                .remote()
                .map_or(0, |r| r.engine().fault_log().dropped()),
        }
    }
}

impl Drop for RunningVm {
    fn drop(&mut self) {
        self.stop_and_join(VmOutcome::HostError {
            message: "the running VM was dropped".into(),
        });
    }
}
