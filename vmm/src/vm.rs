//! One virtual machine: builds guest RAM, KVM state and boot data from a [`VmConfig`], runs one
//! thread per vCPU (named `vcpu0`, `vcpu1`, … — libvirt and the memory engine rely on it), and
//! stops cleanly (kick every vCPU with a signal that sets `immediate_exit`).
//!
//! Integration points for the remote-memory engine, all available before [`Vm::start`]:
//! [`Vm::ram`] (host mapping of each region, [`GuestRam::set_access_hook`]),
//! [`Vm::vcpu_fds`] (feature detection such as KVM_PRE_FAULT_MEMORY), and after start
//! [`VmShared::vcpu_tids`] (UFFD_FEATURE_THREAD_ID → vCPU) and
//! [`crate::devices::pvctl::PvCtl::agent_slot_gpa`].

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvm_ioctls::{VcpuExit, VcpuFd};
use serde::Serialize;

use crate::boot::linux::{self, LinuxBootInfo};
use crate::boot::testguest::{self, TestPlan};
use crate::boot::{BootError, EntryState};
use crate::devices::pvctl::{ProcessRecord, PvAction, PvCtl};
use crate::devices::serial::{SerialConsole, SerialOut};
use crate::kvm::stats::VcpuStats;
use crate::kvm::{KvmError, KvmVm};
use crate::memory::{Backing, GuestRam, MemError};
use crate::stats::{ExitCounts, ExitStats};
use crate::{layout, signals};

/// Errors creating or starting a VM.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    #[error("invalid VM configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Mem(#[from] MemError),
    #[error(transparent)]
    Boot(#[from] BootError),
    #[error(transparent)]
    Kvm(#[from] KvmError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What to boot.
#[derive(Clone, Debug)]
pub enum BootSpec {
    /// The farvm test guest (ELF, direct 64-bit entry) with its test plan.
    TestGuest { kernel: Arc<[u8]>, plan: TestPlan },
    /// A Linux bzImage or vmlinux, per the x86 64-bit boot protocol.
    Linux {
        kernel: Arc<[u8]>,
        initrd: Option<Arc<[u8]>>,
        cmdline: String,
    },
}

/// Everything needed to create a VM.
#[derive(Clone, Debug)]
pub struct VmConfig {
    pub name: String,
    pub mem_bytes: u64,
    pub vcpus: u32,
    pub backing: Backing,
    pub serial: SerialOut,
    pub boot: BootSpec,
    /// Echo guest PV log lines on stderr.
    pub echo_guest_logs: bool,
    /// Keep KVM's async page faults (KVM's default). Off, a guest fault on remote memory is
    /// resolved on the vCPU thread, which is what lets the paging engine attribute it to a
    /// vCPU and guest process; it costs disabling HLT exits (see `kvm::KvmVm::new`).
    pub kvm_async_pf: bool,
}

/// How a VM run ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum VmOutcome {
    /// The guest wrote its exit status to the shutdown port.
    GuestShutdown { status: u32 },
    /// The guest kernel panicked.
    GuestPanic { message: String },
    /// SIGINT/SIGTERM.
    Signal { signal: i32 },
    /// A `shutdown` request on the control socket.
    ControlShutdown,
    /// The run exceeded its time limit.
    Timeout { secs: u64 },
    /// The guest crashed: internal emulation error, triple fault, failed entry, bad MMIO.
    Crash { cpu: u32, message: String },
    /// A host-side failure (ioctl error, ...).
    HostError { message: String },
    /// The guest needed a page of remote memory whose data the memory servers lost.
    MemoryLost { gpa: u64 },
}

impl std::fmt::Display for VmOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VmOutcome::GuestShutdown { status } => {
                write!(f, "guest shut down with status {status}")
            }
            VmOutcome::GuestPanic { message } => write!(f, "guest kernel panic: {message}"),
            VmOutcome::Signal { signal } => write!(f, "stopped by signal {signal}"),
            VmOutcome::ControlShutdown => write!(f, "shut down through the control socket"),
            VmOutcome::Timeout { secs } => write!(f, "timed out after {secs} s"),
            VmOutcome::Crash { cpu, message } => write!(f, "vCPU {cpu}: {message}"),
            VmOutcome::HostError { message } => write!(f, "host error: {message}"),
            VmOutcome::MemoryLost { gpa } => write!(
                f,
                "guest memory lost: the guest needed page {gpa:#x}, and every memory server \
                 that held it restarted empty"
            ),
        }
    }
}

/// Produces the paging statistics of a VM with remote memory (JSON, Prometheus text).
pub type PagingStatsFn = Arc<dyn Fn() -> (serde_json::Value, String) + Send + Sync>;

/// State shared by the vCPU threads, the control socket and the caller.
pub struct VmShared {
    pub name: String,
    pub ram: Arc<GuestRam>,
    pub pv: PvCtl,
    pub serial: SerialConsole,
    pub exits: ExitStats,
    pub ncpus: u32,
    pub started: Instant,
    stop: AtomicBool,
    outcome: Mutex<Option<VmOutcome>>,
    cond: Condvar,
    threads: OnceLock<Vec<libc::pthread_t>>,
    tids: Vec<AtomicI32>,
    kvm_stats: Vec<Option<VcpuStats>>,
    /// Paging statistics of remote memory (set by `farvm run` when RAM is remote), for the
    /// control socket's `stats` and the Prometheus endpoint.
    pub paging_stats: OnceLock<PagingStatsFn>,
    /// Opened by `Vm::start` once every vCPU thread has published its tid: no guest
    /// instruction runs before the memory engine can map uffd thread ids to vCPUs.
    go: Mutex<bool>,
    go_cond: Condvar,
}

impl VmShared {
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
            let mut o = self.outcome.lock().unwrap_or_else(|p| p.into_inner());
            if o.is_none() {
                *o = Some(outcome);
            }
        }
        self.stop.store(true, Ordering::SeqCst);
        self.cond.notify_all();
        if let Some(threads) = self.threads.get() {
            for t in threads {
                signals::kick(*t);
            }
        }
    }

    fn open_gate(&self) {
        *self.go.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.go_cond.notify_all();
    }

    fn wait_gate(&self) {
        let mut g = self.go.lock().unwrap_or_else(|p| p.into_inner());
        while !*g {
            g = self.go_cond.wait(g).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Whether a stop was requested.
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The outcome, once decided.
    pub fn outcome(&self) -> Option<VmOutcome> {
        self.outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
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
}

/// A created, not yet running VM.
pub struct Vm {
    shared: Arc<VmShared>,
    kvm: KvmVm,
    entry: EntryState,
    linux: Option<LinuxBootInfo>,
}

impl Vm {
    /// Maps RAM, creates the KVM VM and vCPUs, loads the kernel and sets entry registers.
    pub fn create(cfg: VmConfig) -> Result<Vm, VmError> {
        Self::create_inner(cfg, None)
    }

    /// Like [`Vm::create`], but on guest RAM provided by the caller (e.g. a paging engine that
    /// owns the host mapping: [`GuestRam::from_external`]). Its regions must be
    /// `layout::ram_ranges(cfg.mem_bytes)`.
    pub fn create_with_ram(cfg: VmConfig, ram: Arc<GuestRam>) -> Result<Vm, VmError> {
        let want = layout::ram_ranges(cfg.mem_bytes);
        let have: Vec<(u64, u64)> = ram.regions().iter().map(|r| (r.gpa(), r.len())).collect();
        if want != have {
            return Err(VmError::Config(format!(
                "provided guest RAM {have:x?} does not match the layout for --memory: {want:x?}"
            )));
        }
        Self::create_inner(cfg, Some(ram))
    }

    fn create_inner(cfg: VmConfig, ram: Option<Arc<GuestRam>>) -> Result<Vm, VmError> {
        if cfg.vcpus == 0 {
            return Err(VmError::Config("--vcpus must be at least 1".into()));
        }
        if cfg.mem_bytes < layout::MIN_RAM {
            return Err(VmError::Config(format!(
                "--memory must be at least {} MiB",
                layout::MIN_RAM >> 20
            )));
        }
        if cfg.mem_bytes > layout::MAX_RAM {
            return Err(VmError::Config(format!(
                "--memory must be at most {} GiB",
                layout::MAX_RAM >> 30
            )));
        }
        let ram = match ram {
            Some(r) => r,
            None => Arc::new(GuestRam::new(
                &layout::ram_ranges(cfg.mem_bytes),
                cfg.backing,
            )?),
        };
        let kvm = KvmVm::new(&ram, cfg.vcpus, cfg.kvm_async_pf)?;
        let (entry, per_cpu_rsi, linux) = match &cfg.boot {
            BootSpec::TestGuest { kernel, plan } => {
                for p in &plan.procs {
                    if p.cpu >= cfg.vcpus {
                        return Err(VmError::Config(format!(
                            "a workload is placed on cpu {} but the VM has {} vCPUs",
                            p.cpu, cfg.vcpus
                        )));
                    }
                }
                let e = testguest::setup(&ram, kernel, cfg.vcpus, kvm.tsc_khz, plan)?;
                (e, true, None)
            }
            BootSpec::Linux {
                kernel,
                initrd,
                cmdline,
            } => {
                let (e, info) = linux::setup(&ram, kernel, initrd.as_deref(), cmdline)?;
                (e, false, Some(info))
            }
        };
        kvm.set_entry(&entry, per_cpu_rsi)?;
        let kvm_stats = kvm
            .vcpus
            .iter()
            .map(|v| {
                VcpuStats::open(v)
                    .map_err(|e| tracing::debug!("KVM stats unavailable: {e}"))
                    .ok()
            })
            .collect();
        let shared = Arc::new(VmShared {
            name: cfg.name.clone(),
            pv: PvCtl::new(ram.clone(), cfg.vcpus, cfg.echo_guest_logs),
            serial: SerialConsole::new(&cfg.serial)?,
            ram,
            exits: ExitStats::default(),
            ncpus: cfg.vcpus,
            started: Instant::now(),
            stop: AtomicBool::new(false),
            outcome: Mutex::new(None),
            cond: Condvar::new(),
            threads: OnceLock::new(),
            tids: (0..cfg.vcpus).map(|_| AtomicI32::new(0)).collect(),
            kvm_stats,
            paging_stats: OnceLock::new(),
            go: Mutex::new(false),
            go_cond: Condvar::new(),
        });
        Ok(Vm {
            shared,
            kvm,
            entry,
            linux,
        })
    }

    /// Shared state (RAM, PV device, counters).
    pub fn shared(&self) -> &Arc<VmShared> {
        &self.shared
    }

    /// Guest RAM (for the memory engine: regions, host addresses, access hook).
    pub fn ram(&self) -> &Arc<GuestRam> {
        &self.shared.ram
    }

    /// Raw fds of the vCPUs, in index order.
    pub fn vcpu_fds(&self) -> Vec<RawFd> {
        self.kvm.vcpus.iter().map(|v| v.as_raw_fd()).collect()
    }

    /// The VM fd.
    pub fn vm_fd(&self) -> RawFd {
        self.kvm.vm.as_raw_fd()
    }

    /// The KVM VM (e.g. to create an extra, never-run vCPU for KVM_PRE_FAULT_MEMORY).
    pub fn kvm_vm(&self) -> &kvm_ioctls::VmFd {
        &self.kvm.vm
    }

    /// vCPU 0's entry state.
    pub fn entry(&self) -> EntryState {
        self.entry
    }

    /// Linux boot details (boot_params placement etc.), for a Linux boot.
    pub fn linux_boot(&self) -> Option<&LinuxBootInfo> {
        self.linux.as_ref()
    }

    /// Registers of vCPU `i` as KVM holds them (for stop-at-entry checks).
    pub fn vcpu_regs(
        &self,
        i: usize,
    ) -> Result<(kvm_bindings::kvm_regs, kvm_bindings::kvm_sregs), VmError> {
        let v = self
            .kvm
            .vcpus
            .get(i)
            .ok_or_else(|| VmError::Config(format!("no vCPU {i}")))?;
        let regs = v.get_regs().map_err(|source| KvmError::Ioctl {
            what: "KVM_GET_REGS",
            source,
        })?;
        let sregs = v.get_sregs().map_err(|source| KvmError::Ioctl {
            what: "KVM_GET_SREGS",
            source,
        })?;
        Ok((regs, sregs))
    }

    /// Starts one thread per vCPU.
    pub fn start(mut self) -> Result<RunningVm, VmError> {
        signals::install_kick_handler()?;
        let mut handles = Vec::with_capacity(self.kvm.vcpus.len());
        for (i, fd) in self.kvm.vcpus.drain(..).enumerate() {
            let shared = self.shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("vcpu{i}"))
                .spawn(move || vcpu_main(i as u32, fd, shared));
            match h {
                Ok(h) => handles.push(h),
                Err(e) => {
                    self.shared.request_stop(VmOutcome::HostError {
                        message: format!("cannot spawn vcpu{i}: {e}"),
                    });
                    self.shared.open_gate();
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(VmError::Io(e));
                }
            }
        }
        let ids = handles.iter().map(|h| h.as_pthread_t()).collect();
        let _ = self.shared.threads.set(ids);
        // Every thread publishes its tid first thing; wait for that (bounded), then let the
        // guest run.
        let t0 = Instant::now();
        while self
            .shared
            .tids
            .iter()
            .any(|t| t.load(Ordering::Acquire) == 0)
            && t0.elapsed() < Duration::from_secs(10)
        {
            std::thread::sleep(Duration::from_micros(100));
        }
        self.shared.open_gate();
        // A stop requested before the ids were published kicked nobody: kick now.
        if self.shared.stopping() {
            if let Some(o) = self.shared.outcome() {
                self.shared.request_stop(o);
            }
        }
        Ok(RunningVm {
            shared: self.shared,
            handles,
            _kvm: self.kvm,
        })
    }
}

/// The final account of a run.
#[derive(Clone, Debug, Serialize)]
pub struct VmReport {
    pub name: String,
    pub outcome: VmOutcome,
    pub uptime_secs: f64,
    pub exits: ExitCounts,
    /// KVM's per-vCPU counters at the end (non-zero ones).
    pub kvm_stats: Vec<Option<Vec<(String, u64)>>>,
    pub processes: Vec<ProcessRecord>,
}

/// A running VM.
pub struct RunningVm {
    shared: Arc<VmShared>,
    handles: Vec<JoinHandle<()>>,
    // Dropped after the vCPU threads are joined (their fds first, then the VM fd).
    _kvm: KvmVm,
}

impl RunningVm {
    pub fn shared(&self) -> &Arc<VmShared> {
        &self.shared
    }

    /// Blocks until the VM stops by itself, a termination signal arrives (when
    /// `watch_signals`), or `timeout` passes. Returns the outcome.
    pub fn wait(&self, timeout: Option<Duration>, watch_signals: bool) -> VmOutcome {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut o = self
            .shared
            .outcome
            .lock()
            .unwrap_or_else(|p| p.into_inner());
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
                o = self
                    .shared
                    .outcome
                    .lock()
                    .unwrap_or_else(|p| p.into_inner());
            }
        }
    }

    /// Stops the VM (if still running), joins the vCPU threads and returns the report.
    pub fn finish(self, outcome_if_running: VmOutcome) -> VmReport {
        self.shared.request_stop(outcome_if_running);
        for h in self.handles {
            let _ = h.join();
        }
        let outcome = self.shared.outcome().unwrap_or(VmOutcome::HostError {
            message: "no outcome recorded".into(),
        });
        VmReport {
            name: self.shared.name.clone(),
            outcome,
            uptime_secs: self.shared.started.elapsed().as_secs_f64(),
            exits: self.shared.exits.snapshot(),
            kvm_stats: self.shared.kvm_stats(),
            processes: self.shared.pv.processes(),
        }
    }
}

enum ExitAction {
    Continue,
    Interrupted,
    Stop(VmOutcome),
    InternalError,
    TripleFault,
    FailEntry(u64),
}

fn vcpu_main(index: u32, mut fd: VcpuFd, shared: Arc<VmShared>) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    shared.tids[index as usize].store(tid, Ordering::Release);
    shared.wait_gate();
    signals::set_thread_kvm_run(fd.get_kvm_run() as *mut _);
    loop {
        if shared.stopping() {
            break;
        }
        let action = match fd.run() {
            Ok(exit) => handle_exit(index, exit, &shared),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                ExitAction::Interrupted
            }
            Err(e) => ExitAction::Stop(VmOutcome::HostError {
                message: format!("vCPU {index}: KVM_RUN failed: {e}"),
            }),
        };
        match action {
            ExitAction::Continue => {}
            ExitAction::Interrupted => {
                ExitStats::bump(&shared.exits.interrupted);
                fd.set_kvm_immediate_exit(0);
            }
            ExitAction::Stop(o) => {
                shared.request_stop(o);
                break;
            }
            ExitAction::InternalError => {
                ExitStats::bump(&shared.exits.internal_error);
                let message = describe_internal_error(&mut fd, &shared);
                shared.request_stop(VmOutcome::Crash {
                    cpu: index,
                    message,
                });
                break;
            }
            ExitAction::TripleFault => {
                ExitStats::bump(&shared.exits.shutdown);
                let message = format!(
                    "the guest triple-faulted (KVM_EXIT_SHUTDOWN){}",
                    describe_position(&fd, &shared)
                );
                shared.request_stop(VmOutcome::Crash {
                    cpu: index,
                    message,
                });
                break;
            }
            ExitAction::FailEntry(reason) => {
                ExitStats::bump(&shared.exits.fail_entry);
                let message = format!(
                    "KVM_EXIT_FAIL_ENTRY, hardware entry failure reason {reason:#x}{}",
                    describe_position(&fd, &shared)
                );
                shared.request_stop(VmOutcome::Crash {
                    cpu: index,
                    message,
                });
                break;
            }
        }
    }
    signals::set_thread_kvm_run(std::ptr::null_mut());
}

fn le_value(data: &[u8]) -> u32 {
    let mut b = [0u8; 4];
    let n = data.len().min(4);
    b[..n].copy_from_slice(&data[..n]);
    u32::from_le_bytes(b)
}

fn handle_exit(cpu: u32, exit: VcpuExit<'_>, shared: &VmShared) -> ExitAction {
    match exit {
        VcpuExit::IoOut(port, data) => {
            if SerialConsole::owns(port) {
                ExitStats::bump(&shared.exits.io_serial);
                for b in data {
                    shared.serial.write(port, *b);
                }
            } else if PvCtl::owns(port) {
                ExitStats::bump(&shared.exits.io_pv);
                match shared.pv.write(cpu, port, le_value(data)) {
                    PvAction::Continue => {}
                    PvAction::Shutdown(status) => {
                        return ExitAction::Stop(VmOutcome::GuestShutdown { status })
                    }
                    PvAction::Panic(message) => {
                        return ExitAction::Stop(VmOutcome::GuestPanic { message })
                    }
                }
            } else {
                ExitStats::bump(&shared.exits.io_other);
            }
            ExitAction::Continue
        }
        VcpuExit::IoIn(port, data) => {
            if SerialConsole::owns(port) {
                ExitStats::bump(&shared.exits.io_serial);
                let v = shared.serial.read(port);
                data.fill(v);
            } else if PvCtl::owns(port) {
                ExitStats::bump(&shared.exits.io_pv);
                let v = shared.pv.read(port).to_le_bytes();
                for (i, d) in data.iter_mut().enumerate() {
                    *d = v.get(i).copied().unwrap_or(0);
                }
            } else {
                ExitStats::bump(&shared.exits.io_other);
                data.fill(0xff);
            }
            ExitAction::Continue
        }
        VcpuExit::MmioRead(addr, _) | VcpuExit::MmioWrite(addr, _) => {
            ExitStats::bump(&shared.exits.mmio);
            ExitAction::Stop(VmOutcome::Crash {
                cpu,
                message: format!(
                    "access to unmapped guest-physical address {addr:#x} (MMIO; no device there)"
                ),
            })
        }
        VcpuExit::Hlt => {
            // Only without an in-kernel irqchip; nothing will wake this vCPU but a stop.
            ExitStats::bump(&shared.exits.hlt);
            std::thread::sleep(Duration::from_millis(1));
            ExitAction::Continue
        }
        VcpuExit::Intr => ExitAction::Interrupted,
        VcpuExit::Shutdown => ExitAction::TripleFault,
        VcpuExit::InternalError => ExitAction::InternalError,
        VcpuExit::FailEntry(reason, _) => ExitAction::FailEntry(reason),
        other => {
            ExitStats::bump(&shared.exits.other);
            ExitAction::Stop(VmOutcome::Crash {
                cpu,
                message: format!("unexpected KVM exit {other:?}"),
            })
        }
    }
}

fn describe_position(fd: &VcpuFd, shared: &VmShared) -> String {
    let (Ok(regs), Ok(sregs)) = (fd.get_regs(), fd.get_sregs()) else {
        return String::new();
    };
    let mut s = format!(
        " at RIP {:#x} (CPL {}, CR3 {:#x}, CR2 {:#x}, RSP {:#x})",
        regs.rip,
        sregs.cs.selector & 3,
        sregs.cr3,
        sregs.cr2,
        regs.rsp
    );
    if let Some(bytes) = instruction_bytes(shared, sregs.cr3, regs.rip) {
        s.push_str(&format!("; instruction bytes: {bytes}"));
    }
    s
}

fn instruction_bytes(shared: &VmShared, cr3: u64, rip: u64) -> Option<String> {
    let gpa = testguest::translate(&shared.ram, cr3, rip)?;
    let n = (0x1000 - (gpa & 0xfff)).min(15) as usize;
    let mut b = [0u8; 15];
    shared.ram.read(gpa, &mut b[..n]).ok()?;
    Some(
        b[..n]
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn describe_internal_error(fd: &mut VcpuFd, shared: &VmShared) -> String {
    // SAFETY: exit_reason was KVM_EXIT_INTERNAL_ERROR, so `internal` is the active union field.
    let internal = unsafe { fd.get_kvm_run().__bindgen_anon_1.internal };
    let kind = match internal.suberror {
        1 => "emulation failure (an instruction KVM's emulator cannot execute)",
        2 => "exception while delivering an exception",
        3 => "event delivery failed",
        4 => "unexpected exit reason",
        _ => "unknown suberror",
    };
    let nd = (internal.ndata as usize).min(internal.data.len());
    let data: Vec<String> = internal.data[..nd]
        .iter()
        .map(|d| format!("{d:#x}"))
        .collect();
    format!(
        "KVM_EXIT_INTERNAL_ERROR suberror {} ({kind}){}{}",
        internal.suberror,
        describe_position(fd, shared),
        if data.is_empty() {
            String::new()
        } else {
            format!("; data [{}]", data.join(", "))
        }
    )
}
