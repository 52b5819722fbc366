//! A built VM and its control surface — what `farvm run`, the tests, the lab's benchmarks and
//! an API server drive. [`crate::builder::build`] makes a [`Vm`] (guest RAM, KVM VM and vCPUs,
//! kernel and boot data, devices; nothing runs yet). [`Vm::start`] starts the vCPU threads and
//! returns a [`RunningVm`], which can be paused, resumed, asked to shut down, asked for its
//! [`VmState`] and [`VmCounters`], waited on, and finished into a [`VmReport`].
//!
//! [`VmShared`] is the state the vCPU threads, the devices, the control socket and the metrics
//! endpoint share. A VM with remote memory owns its [`RemoteMemory`] and shuts it down after
//! its vCPU threads are joined and its KVM VM is closed.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use farvm_ept::translate::GuestPaging;
use kvm_ioctls::VcpuFd;
use serde::Serialize;

use crate::boot::linux::LinuxBootInfo;
use crate::boot::EntryState;
use crate::devices::board::Board;
use crate::devices::pvctl::{ProcessRecord, PvCounterValues, PvCtl};
use crate::remote::{RemoteMemory, RemoteStats, StatsSource};
use crate::signals;
use crate::stats::{ExitCounts, ExitStats};
use crate::vstate::kvm_stats::VcpuStats;
use crate::vstate::memory::GuestRam;
use crate::vstate::vcpu;
use crate::vstate::vm::{KvmError, KvmVm};

/// How long [`RunningVm::pause`] waits for every vCPU to leave the guest.
pub const PAUSE_TIMEOUT: Duration = Duration::from_secs(10);

/// How a VM run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum VmOutcome {
    /// The guest wrote its exit status to the shutdown port, or powered off (ACPI S5:
    /// status 0).
    GuestShutdown {
        /// The status written.
        status: u32,
    },
    /// The guest asked for a reset (the ACPI reset register): farvm does not restart guests,
    /// the VM stops.
    GuestReboot,
    /// The guest kernel panicked.
    GuestPanic {
        /// The panic location and message from the guest's record.
        message: String,
    },
    /// SIGINT/SIGTERM.
    Signal {
        /// The signal number.
        signal: i32,
    },
    /// The operator typed the console's escape sequence (Ctrl-A x).
    ConsoleEscape,
    /// A shutdown request (control socket, API).
    ControlShutdown,
    /// The run exceeded its time limit.
    Timeout {
        /// The limit, in seconds.
        secs: u64,
    },
    /// The guest crashed: internal emulation error, triple fault, failed entry, bad MMIO.
    Crash {
        /// The vCPU that crashed.
        cpu: u32,
        /// What KVM reported.
        message: String,
    },
    /// A host-side failure (ioctl error, ...).
    HostError {
        /// What failed.
        message: String,
    },
    /// The guest needed a page of remote memory whose data the memory servers lost.
    MemoryLost {
        /// Guest-physical address of the page.
        gpa: u64,
    },
}

impl std::fmt::Display for VmOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmOutcome::GuestShutdown { status } => {
                write!(f, "guest shut down with status {status}")
            }
            VmOutcome::GuestReboot => write!(f, "the guest rebooted (the VM stops)"),
            VmOutcome::GuestPanic { message } => write!(f, "guest kernel panic: {message}"),
            VmOutcome::Signal { signal } => write!(f, "stopped by signal {signal}"),
            VmOutcome::ConsoleEscape => write!(f, "stopped from the console (Ctrl-A x)"),
            VmOutcome::ControlShutdown => write!(f, "shut down through the control socket"),
            VmOutcome::Timeout { secs } => write!(f, "timed out after {secs} s"),
            VmOutcome::Crash { cpu, message } => write!(f, "vCPU {cpu}: {message}"),
            VmOutcome::HostError { message } => write!(f, "host error: {message}"),
            VmOutcome::MemoryLost { gpa } => write!(
                f,
                "guest memory lost: the guest needed page {gpa:#x}, whose data exists nowhere \
                 it can be trusted (every memory server holding it lost it or returned a wrong \
                 copy, or its local frame was not where the engine left it; the log says which)"
            ),
        }
    }
}

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

/// Looks up a guest process's name by pid (see [`VmShared::set_process_names`]).
pub type ProcessNamesFn = Box<dyn Fn(u64) -> Option<String> + Send + Sync>;

/// State shared by the vCPU threads, the devices, the control socket and the caller.
pub struct VmShared {
    /// The VM's name.
    pub name: String,
    /// The UUID the VM was created with, if any (libvirt gives one).
    pub uuid: Option<String>,
    /// Guest RAM.
    pub ram: Arc<GuestRam>,
    /// The paravirtual control device.
    pub pv: PvCtl,
    /// The emulated devices behind the port-I/O and MMIO exits.
    pub board: Board,
    /// vCPU exit counters.
    pub exits: ExitStats,
    /// vCPUs.
    pub ncpus: u32,
    /// When the VM was created.
    pub started: Instant,
    stop: AtomicBool,
    outcome: Mutex<Option<VmOutcome>>,
    cond: Condvar,
    threads: OnceLock<Vec<libc::pthread_t>>,
    tids: Vec<AtomicI32>,
    kvm_stats: Vec<Option<VcpuStats>>,
    /// Paging statistics of remote memory (set by the builder when RAM is remote).
    paging: OnceLock<StatsSource>,
    /// Guest process names from the guest agent ([`VmShared::set_process_names`]).
    guest_process_names: OnceLock<ProcessNamesFn>,
    /// How the guest's page tables look, for the paging engine's page space (remote memory
    /// only); learnt from a vCPU's CR4 when the guest agent registers its slot.
    guest_paging: OnceLock<Arc<GuestPaging>>,
    /// Opened by `Vm::start` once every vCPU thread has published its tid: no guest
    /// instruction runs before the memory engine can map uffd thread ids to vCPUs.
    go: Mutex<bool>,
    go_cond: Condvar,
    pause_requested: AtomicBool,
    /// vCPU threads parked by a pause.
    parked: Mutex<u32>,
    park_cond: Condvar,
    /// vCPU state reports asked for by [`VmShared::dump_vcpus`]: one flag per vCPU, and the
    /// reports its thread wrote.
    dump_wanted: Vec<AtomicBool>,
    dumps: Mutex<Vec<Option<String>>>,
    dump_cond: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl VmShared {
    pub(crate) fn new(
        name: String,
        uuid: Option<String>,
        ram: Arc<GuestRam>,
        pv: PvCtl,
        board: Board,
        ncpus: u32,
        kvm_stats: Vec<Option<VcpuStats>>,
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
            stop: AtomicBool::new(false),
            outcome: Mutex::new(None),
            cond: Condvar::new(),
            threads: OnceLock::new(),
            tids: (0..ncpus).map(|_| AtomicI32::new(0)).collect(),
            kvm_stats,
            paging: OnceLock::new(),
            guest_process_names: OnceLock::new(),
            guest_paging: OnceLock::new(),
            go: Mutex::new(false),
            go_cond: Condvar::new(),
            pause_requested: AtomicBool::new(false),
            parked: Mutex::new(0),
            park_cond: Condvar::new(),
            dump_wanted: (0..ncpus).map(|_| AtomicBool::new(false)).collect(),
            dumps: Mutex::new(vec![None; ncpus as usize]),
            dump_cond: Condvar::new(),
        }
    }

    /// Each vCPU's state — what its thread reads from KVM once kicked out of KVM_RUN: MP state,
    /// registers, pending events, local APIC — for a VM that seems stuck (control command
    /// `vcpus`). A vCPU that does not answer within `timeout` (its thread blocked in the host,
    /// e.g. in a fault on a page not yet fetched) is `None`.
    pub fn dump_vcpus(&self, timeout: Duration) -> Vec<Option<String>> {
        lock(&self.dumps).iter_mut().for_each(|d| *d = None);
        for w in &self.dump_wanted {
            w.store(true, Ordering::SeqCst);
        }
        self.kick_all();
        let d = lock(&self.dumps);
        let (d, _) = self
            .dump_cond
            .wait_timeout_while(d, timeout, |d| d.iter().any(Option::is_none))
            .unwrap_or_else(|p| p.into_inner());
        d.clone()
    }

    /// Whether a state report of vCPU `index` is wanted (clears the request).
    pub(crate) fn take_dump_request(&self, index: u32) -> bool {
        self.dump_wanted
            .get(index as usize)
            .is_some_and(|w| w.swap(false, Ordering::SeqCst))
    }

    /// vCPU `index`'s state report (see [`VmShared::dump_vcpus`]).
    pub(crate) fn put_dump(&self, index: u32, report: String) {
        if let Some(d) = lock(&self.dumps).get_mut(index as usize) {
            *d = Some(report);
        }
        self.dump_cond.notify_all();
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
        {
            let mut o = lock(&self.outcome);
            if o.is_none() {
                *o = Some(outcome);
            }
        }
        self.stop.store(true, Ordering::SeqCst);
        self.cond.notify_all();
        // Parked vCPUs re-check `stopping` under this lock: no lost wake-up.
        drop(lock(&self.parked));
        self.park_cond.notify_all();
        self.kick_all();
    }

    fn kick_all(&self) {
        if let Some(threads) = self.threads.get() {
            for t in threads {
                signals::kick(*t);
            }
        }
    }

    /// Whether a stop was requested.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The outcome, once decided.
    pub fn outcome(&self) -> Option<VmOutcome> {
        lock(&self.outcome).clone()
    }

    /// Waits up to `timeout` for the outcome, without asking the VM to stop (a supervisor's
    /// view; [`RunningVm::wait`] is the owner's).
    pub fn wait_outcome(&self, timeout: Duration) -> Option<VmOutcome> {
        let o = lock(&self.outcome);
        let (o, _) = self
            .cond
            .wait_timeout_while(o, timeout, |o| o.is_none())
            .unwrap_or_else(|p| p.into_inner());
        o.clone()
    }

    /// Where the VM is in its life.
    pub fn state(&self) -> VmState {
        if self.stopping() {
            VmState::Stopping
        } else if self.threads.get().is_none() {
            VmState::Created
        } else if self.pause_requested.load(Ordering::SeqCst) && *lock(&self.parked) == self.ncpus {
            VmState::Paused
        } else {
            VmState::Running
        }
    }

    /// Host thread ids of the vCPU threads (all set once [`Vm::start`] returned; the guest runs
    /// only after they are).
    pub fn vcpu_tids(&self) -> Vec<i32> {
        self.tids
            .iter()
            .map(|t| t.load(Ordering::Acquire))
            .collect()
    }

    /// The pid each vCPU runs now, from the agent slots.
    pub fn current_pids(&self) -> Vec<Option<u64>> {
        (0..self.ncpus).map(|c| self.pv.current_pid(c)).collect()
    }

    /// Paging statistics (remote memory only; `None` once the engine is gone).
    pub fn paging_stats(&self) -> Option<RemoteStats> {
        self.paging.get().and_then(StatsSource::stats)
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
        if let Some(name) = self.guest_process_names.get().and_then(|f| f(pid)) {
            return Some(name);
        }
        self.pv
            .processes()
            .iter()
            .find(|p| u64::from(p.pid) == pid)
            .map(|p| crate::workload_spec::workload_name(p.workload).to_string())
    }

    /// Makes [`VmShared::process_name`] ask `f` first (the guest agent's process table).
    /// Returns false if a source was already set.
    pub fn set_process_names(&self, f: ProcessNamesFn) -> bool {
        self.guest_process_names.set(f).is_ok()
    }

    pub(crate) fn set_paging_source(&self, source: StatsSource) {
        let _ = self.paging.set(source);
    }

    pub(crate) fn set_guest_paging(&self, paging: Arc<GuestPaging>) {
        let _ = self.guest_paging.set(paging);
    }

    /// Tells the paging engine the guest's paging depth from vCPU `cpu`'s CR4 (read when the
    /// guest agent registers that vCPU's slot: from then on its CR3 values are walked).
    pub(crate) fn note_guest_cr4(&self, cpu: u32, cr4: u64) {
        if let Some(p) = self.guest_paging.get() {
            let before = p.levels();
            p.set_from_cr4(cr4);
            if p.levels() != before || cpu == 0 {
                tracing::info!(cpu, levels = p.levels(), "guest paging");
            }
        }
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

    pub(crate) fn publish_tid(&self, index: u32, tid: i32) {
        self.tids[index as usize].store(tid, Ordering::Release);
    }

    fn open_gate(&self) {
        *lock(&self.go) = true;
        self.go_cond.notify_all();
    }

    pub(crate) fn wait_gate(&self) {
        let mut g = lock(&self.go);
        while !*g {
            g = self.go_cond.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether a pause is requested (checked by each vCPU thread before every KVM_RUN).
    pub(crate) fn pause_requested(&self) -> bool {
        self.pause_requested.load(Ordering::SeqCst)
    }

    /// Parks the calling vCPU thread until the VM is resumed or stopped.
    pub(crate) fn park_while_paused(&self) {
        let mut n = lock(&self.parked);
        *n += 1;
        self.park_cond.notify_all();
        while self.pause_requested() && !self.stopping() {
            n = self.park_cond.wait(n).unwrap_or_else(|p| p.into_inner());
        }
        *n -= 1;
        self.park_cond.notify_all();
    }

    fn pause(&self, timeout: Duration) -> Result<(), VmError> {
        let refuse = |state| VmError::InvalidState {
            action: "pause",
            state,
        };
        match self.state() {
            VmState::Running => {}
            VmState::Paused => return Ok(()),
            other => return Err(refuse(other)),
        }
        self.pause_requested.store(true, Ordering::SeqCst);
        // A vCPU in KVM_RUN leaves at once; one between exits sees the request before its
        // next KVM_RUN (the kick sets immediate_exit, so even that race returns at once).
        self.kick_all();
        let deadline = Instant::now() + timeout;
        let mut n = lock(&self.parked);
        while *n < self.ncpus {
            if self.stopping() {
                return Err(refuse(VmState::Stopping));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(n);
                self.resume_vcpus();
                return Err(VmError::PauseTimeout(timeout));
            }
            n = self
                .park_cond
                .wait_timeout(n, left.min(Duration::from_millis(50)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }

    fn resume_vcpus(&self) {
        let n = lock(&self.parked);
        self.pause_requested.store(false, Ordering::SeqCst);
        drop(n);
        self.park_cond.notify_all();
    }
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
        signals::install_kick_handler().map_err(VmError::Signals)?;
        let Vm {
            shared,
            vcpus,
            kvm,
            remote,
            ..
        } = self;
        let mut handles = Vec::with_capacity(vcpus.len());
        let mut threads = Vec::with_capacity(vcpus.len());
        for (i, fd) in vcpus.into_iter().enumerate() {
            match vcpu::spawn(i as u32, fd, shared.clone(), kvm.hlt_in_guest) {
                Ok((h, t)) => {
                    handles.push(h);
                    threads.push(t);
                }
                Err(source) => {
                    shared.request_stop(VmOutcome::HostError {
                        message: format!("cannot spawn vcpu{i}: {source}"),
                    });
                    shared.open_gate();
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(VmError::Spawn {
                        index: i as u32,
                        source,
                    });
                }
            }
        }
        let _ = shared.threads.set(threads);
        // Every thread publishes its tid first thing; wait for that (bounded), then let the
        // guest run.
        let t0 = Instant::now();
        while shared.tids.iter().any(|t| t.load(Ordering::Acquire) == 0)
            && t0.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_micros(100));
        }
        shared.open_gate();
        // A stop requested before the thread ids were known kicked nobody: kick now.
        if shared.stopping() {
            shared.kick_all();
        }
        Ok(RunningVm {
            shared,
            handles,
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
    pub per_process: Option<crate::process_stats::PerProcessStats>,
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
    handles: Vec<JoinHandle<()>>,
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
        match self.state() {
            VmState::Paused => {
                self.shared.resume_vcpus();
                Ok(())
            }
            state => Err(VmError::InvalidState {
                action: "resume",
                state,
            }),
        }
    }

    /// Asks the VM to stop (outcome [`VmOutcome::ControlShutdown`] unless one is decided).
    pub fn request_shutdown(&self) {
        self.shared.request_stop(VmOutcome::ControlShutdown);
    }

    /// Blocks until the VM stops by itself, a termination signal arrives (when
    /// `watch_signals`), or `timeout` passes. Returns the outcome.
    pub fn wait(&self, timeout: Option<Duration>, watch_signals: bool) -> VmOutcome {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut o = lock(&self.shared.outcome);
        loop {
            if let Some(out) = o.clone() {
                return out;
            }
            let (g, _) = self
                .shared
                .cond
                .wait_timeout(o, Duration::from_millis(50))
                .unwrap_or_else(|p| p.into_inner());
            o = g;
            if o.is_some() {
                continue;
            }
            let stop =
                if let Some(sig) = watch_signals.then(signals::termination_requested).flatten() {
                    Some(VmOutcome::Signal { signal: sig })
                } else if deadline.is_some_and(|d| Instant::now() >= d) {
                    Some(VmOutcome::Timeout {
                        secs: timeout.unwrap_or_default().as_secs(),
                    })
                } else {
                    None
                };
            if let Some(s) = stop {
                drop(o);
                self.shared.request_stop(s);
                o = lock(&self.shared.outcome);
            }
        }
    }

    fn stop_and_join(&mut self, outcome_if_running: VmOutcome) {
        self.shared.request_stop(outcome_if_running);
        for h in self.handles.drain(..) {
            let _ = h.join();
        }
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
            per_process: crate::process_stats::per_process(&self.shared),
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
