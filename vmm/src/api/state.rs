//! The API server's one VM and its life, as Cloud Hypervisor's API defines it:
//!
//! ```text
//!   (none) --vm.create--> Created --vm.boot--> Running <--vm.pause/vm.resume--> Paused
//!                            ^                    |  \--the guest stops by itself--> Shutdown
//!                            +----vm.shutdown-----+                                    |
//!                            +--------vm.boot (a fresh VM) / vm.shutdown--------------+
//!   vm.reboot: Running/Paused -> a fresh VM, Running.  vm.delete: any -> (none).
//!   vm.snapshot: Running/Paused -> saved, then Shutdown.  vm.restore: (none) -> Paused.
//!   vm.send-migration: Running/Paused -> migrated, then Shutdown ([`migration`]).
//!   vm.receive-migration: (none) -> Running.
//! ```
//!
//! `vm.create` only checks and remembers the configuration (the factory reads the kernel and
//! applies the host config); `vm.boot` builds the VM (guest RAM, remote memory, KVM, devices)
//! and starts its vCPUs. Each boot is a new [`Vm`](crate::vm::Vm) from the same configuration;
//! the pty, once opened, stays the same across boots until `vm.delete`. A watcher thread per
//! boot notices the guest stopping by itself (powering off, crashing, losing memory), finishes
//! the VM (its threads, KVM VM and remote memory are released) and keeps its report for
//! `vm.counters`. Requests are handled one at a time.

use std::os::fd::OwnedFd;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

use farvm_chapi::info::{self, Counters};
use farvm_chapi::{
    AddNetSpec, ApiError, ConsoleConfig, ConsoleMode, CreateSpec, SerialTarget, VmState,
};
use farvm_devices::serial::SerialOut;
use farvm_httpd::HttpServer;
use serde_json::Value;

use super::events::{EventMonitor, Source};
use super::{Prepared, VmFactory};
use crate::builder;
use crate::devices::board::NetConfig;
use crate::devices::pty::Pty;
use crate::snapshot::Snapshot;
use crate::vm::{RunningVm, VmError, VmOutcome, VmReport, VmShared};
use crate::vstate::lock;

mod migration;

/// How often the watcher checks that the API server is still there.
const WATCH_TICK: Duration = Duration::from_millis(500);

/// A created VM: its configuration, kept across boots.
struct Created {
    spec: CreateSpec,
    prepared: Prepared,
    pty: Option<Arc<Pty>>,
}

/// How long a boot waits for its metrics port while another process holds it: the VMM this
/// domain ran in a moment ago may still be exiting (libvirt reports a destroyed domain before
/// its VMM is gone, and a killed process frees its memory before its sockets: 3 s was seen
/// to be too short on a loaded host, once in about a hundred destroy/start cycles).
const METRICS_PORT_PATIENCE: Duration = Duration::from_secs(15);

/// Serves the VM's metrics on `listen`, retrying for [`METRICS_PORT_PATIENCE`] while the
/// address is in use.
fn serve_metrics(
    listen: &farvm_httpd::Listen,
    shared: &Arc<VmShared>,
) -> Result<HttpServer, farvm_httpd::HttpError> {
    let deadline = std::time::Instant::now() + METRICS_PORT_PATIENCE;
    loop {
        match crate::metrics::serve(listen, shared) {
            Err(farvm_httpd::HttpError::Bind { source, .. })
                if source.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            r => return r,
        }
    }
}

/// How [`ApiState::launch`] starts the VM it builds.
enum Launch<'a> {
    /// Afresh (`vm.boot`, `vm.reboot`).
    Boot,
    /// Loaded from a snapshot, paused (`vm.restore`).
    Restore(&'a Snapshot),
    /// Built while a migration's pre-copy arrives, loaded once the rest has (the arriving
    /// stream taken out of its option, the arrival left in the other), the source told once
    /// it is loaded (the arrival taken out), then run, as Cloud Hypervisor's destination
    /// resumes the VM it received (`vm.receive-migration`).
    Arrive {
        arriving: &'a mut Option<crate::migration::Arriving>,
        arrival: &'a mut Option<crate::migration::Arrival>,
    },
}

/// Where the created VM is.
enum Run {
    /// Not booted (or shut down through the API).
    Idle,
    Running {
        vm: Box<RunningVm>,
        generation: u64,
        /// Its metrics endpoint, closed before the VM is torn down: a VMM told to stop frees
        /// its port at once, though finishing the VM takes a moment more (libvirt's destroy
        /// returns before the VMM has exited, and a start right after binds the port again).
        metrics: Option<HttpServer>,
    },
    /// The guest stopped by itself; its final report.
    Stopped(Box<VmReport>),
}

struct Slot {
    created: Option<Created>,
    run: Run,
    /// Incremented on every boot, so a watcher never finishes a later boot's VM.
    generation: u64,
}

impl Slot {
    /// Ends the pty console's input to a VM that stopped (its input thread ends).
    fn retire_console_input(&self) {
        if let Some(pty) = self.created.as_ref().and_then(|c| c.pty.as_ref()) {
            pty.retire_readers();
        }
    }

    /// Finishes the running VM, if one runs, leaving the slot idle: its metrics endpoint is
    /// closed first (a VMM told to stop frees its port at once), then the VM is torn down and
    /// the console's input retired.
    fn finish_running(&mut self) -> Option<VmReport> {
        let Run::Running { vm, metrics, .. } = std::mem::replace(&mut self.run, Run::Idle) else {
            return None;
        };
        drop(metrics);
        let report = vm.finish(VmOutcome::ControlShutdown);
        self.retire_console_input();
        Some(report)
    }
}

/// The API's VM and what serves it.
pub struct ApiState {
    name: String,
    factory: Box<dyn VmFactory>,
    events: Option<EventMonitor>,
    slot: Mutex<Slot>,
    exit: Mutex<bool>,
    exit_cond: Condvar,
    me: Weak<ApiState>,
}

fn state_of(run: &Run) -> VmState {
    match run {
        Run::Idle => VmState::Created,
        Run::Stopped(_) => VmState::Shutdown,
        Run::Running { vm, .. } => match vm.state() {
            crate::vm::VmState::Paused => VmState::Paused,
            crate::vm::VmState::Stopping => VmState::Shutdown,
            crate::vm::VmState::Created | crate::vm::VmState::Running => VmState::Running,
        },
    }
}

fn vm_error(action: &'static str, e: VmError) -> ApiError {
    match e {
        VmError::InvalidState { state, .. } => ApiError::wrong_state(
            action,
            match state {
                crate::vm::VmState::Paused => VmState::Paused,
                crate::vm::VmState::Stopping => VmState::Shutdown,
                _ => VmState::Running,
            },
        ),
        other => ApiError::Failed {
            action,
            reason: other.to_string(),
        },
    }
}

impl ApiState {
    /// The state of an API server for the VM called `name`.
    pub fn new(
        name: String,
        factory: Box<dyn VmFactory>,
        events: Option<EventMonitor>,
    ) -> Arc<Self> {
        Arc::new_cyclic(|me| ApiState {
            name,
            factory,
            events,
            slot: Mutex::new(Slot {
                created: None,
                run: Run::Idle,
                generation: 0,
            }),
            exit: Mutex::new(false),
            exit_cond: Condvar::new(),
            me: me.clone(),
        })
    }

    /// The VM's name (every VM this server creates has it).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn emit(&self, source: Source, event: &str) {
        if let Some(m) = &self.events {
            m.emit(source, event);
        }
    }

    /// `vmm.ping`.
    pub fn ping(&self) -> Value {
        info::vmm_ping(env!("CARGO_PKG_VERSION"), std::process::id())
    }

    /// `vm.create`.
    pub fn create(&self, body: &[u8]) -> Result<(), ApiError> {
        let mut slot = lock(&self.slot);
        if slot.created.is_some() {
            return Err(ApiError::WrongState {
                action: "create",
                state: farvm_chapi::error::StateName::AlreadyCreated,
            });
        }
        let spec = CreateSpec::parse(body)?;
        let prepared = self.factory.prepare(&self.name, &spec)?;
        prepared
            .config
            .validate()
            .map_err(|e| ApiError::BadConfig(e.to_string()))?;
        for note in &prepared.notes {
            tracing::info!(vm = self.name, "{note}");
        }
        slot.created = Some(Created {
            spec,
            prepared,
            pty: None,
        });
        slot.run = Run::Idle;
        Ok(())
    }

    /// `vm.add-net`: a virtio-net device on the tap whose descriptor came with the request,
    /// added to the created VM before it boots (farvm has no device hotplug).
    pub fn add_net(&self, body: &[u8], fds: Vec<OwnedFd>) -> Result<(), ApiError> {
        let spec = AddNetSpec::parse(body, fds.len())?;
        let mut slot = lock(&self.slot);
        if slot.created.is_none() {
            return Err(ApiError::NotCreated { action: "add-net" });
        }
        if !matches!(slot.run, Run::Idle) {
            return Err(ApiError::BadConfig(
                "vm.add-net: farvm adds devices only before the VM boots (no hotplug)".into(),
            ));
        }
        let mac = spec
            .mac
            .as_deref()
            .map(farvm_vmconfig::domain::parse_mac)
            .transpose()
            .map_err(|e| ApiError::BadConfig(format!("`mac`: {e}")))?;
        let fd = fds.into_iter().next().ok_or(ApiError::BadConfig(
            "vm.add-net came without a tap descriptor".into(),
        ))?;
        let net = NetConfig::from_tap_fd(fd, spec.tap.as_deref(), mac)
            .map_err(|e| ApiError::BadConfig(format!("vm.add-net: {e}")))?;
        let created = slot
            .created
            .as_mut()
            .ok_or(ApiError::NotCreated { action: "add-net" })?;
        let mut cfg = created.prepared.config.clone();
        cfg.nets.push(net);
        cfg.validate()
            .map_err(|e| ApiError::BadConfig(format!("vm.add-net: {e}")))?;
        tracing::info!(vm = self.name, tap = %cfg.nets[cfg.nets.len() - 1].tap, "network device added (tap descriptor from the API)");
        created.prepared.config = cfg;
        Ok(())
    }

    /// `vm.boot`.
    pub fn boot(&self) -> Result<(), ApiError> {
        let mut slot = lock(&self.slot);
        match (&slot.created, &slot.run) {
            (None, _) => Err(ApiError::NotCreated { action: "boot" }),
            (Some(_), r @ Run::Running { .. }) => Err(ApiError::wrong_state("boot", state_of(r))),
            _ => self.start_vm(&mut slot),
        }
    }

    /// Builds and starts a VM from the created configuration.
    fn start_vm(&self, slot: &mut Slot) -> Result<(), ApiError> {
        self.launch(slot, Launch::Boot)
    }

    /// Builds a VM from the created configuration and starts it, or loads a snapshot into it
    /// first ([`Launch`]).
    fn launch(&self, slot: &mut Slot, mut how: Launch<'_>) -> Result<(), ApiError> {
        let action = match &how {
            Launch::Boot => "boot",
            Launch::Restore(_) => "restore",
            Launch::Arrive { .. } => migration::RECEIVE,
        };
        let booting = matches!(how, Launch::Boot);
        let failed = |reason: String| ApiError::Failed { action, reason };
        let created = slot
            .created
            .as_mut()
            .ok_or(ApiError::NotCreated { action: "boot" })?;
        let mut cfg = created.prepared.config.clone();
        match created.spec.serial_target() {
            SerialTarget::Null => cfg.serial = SerialOut::None,
            SerialTarget::Tty => cfg.serial = SerialOut::Stdout,
            SerialTarget::File(p) => cfg.serial = SerialOut::File(p),
            SerialTarget::Pty => {
                let pty = match &created.pty {
                    Some(p) => p.clone(),
                    None => {
                        let p = Arc::new(
                            Pty::open().map_err(|e| failed(format!("cannot open a pty: {e}")))?,
                        );
                        tracing::info!(vm = self.name, "console on {}", p.path().display());
                        created.pty = Some(p.clone());
                        p
                    }
                };
                cfg.console_pty = Some(pty);
            }
        }
        if booting {
            self.emit(Source::Vm, "booting");
        }
        let vm = builder::build(&cfg).map_err(|e| failed(e.to_string()))?;
        match &mut how {
            Launch::Boot => {}
            Launch::Restore(snap) => snap.restore_into(&vm).map_err(|e| failed(e.to_string()))?,
            Launch::Arrive { arriving, arrival } => migration::load(&vm, arriving, arrival)?,
        }
        let metrics = match &created.prepared.metrics {
            Some(listen) => Some(
                serve_metrics(listen, vm.shared())
                    .map_err(|e| failed(format!("cannot serve metrics on {listen}: {e}")))?,
            ),
            None => None,
        };
        if let Launch::Arrive { arrival, .. } = &mut how {
            if let Some(arrival) = arrival.take() {
                migration::arrived(&self.name, arrival);
            }
        }
        let vm = match how {
            Launch::Restore(_) => vm.start_paused(),
            Launch::Boot | Launch::Arrive { .. } => vm.start(),
        }
        .map_err(|e| failed(e.to_string()))?;
        slot.generation += 1;
        let generation = slot.generation;
        self.watch(vm.shared().clone(), generation);
        slot.run = Run::Running {
            vm: Box::new(vm),
            generation,
            metrics,
        };
        if booting {
            self.emit(Source::Vm, "booted");
        }
        Ok(())
    }

    /// `vm.snapshot`: saves the running or paused VM into the body's directory
    /// ([`crate::snapshot::save`]); once saved the VM stops (`vm:snapshotted` is its last
    /// event, as with Cloud Hypervisor). A save that fails leaves the VM as it was. Sealed
    /// under the host config's `snapshot_key_file` if it sets one.
    pub fn snapshot(&self, body: &[u8]) -> Result<(), ApiError> {
        let dir = farvm_chapi::snapshot::destination(body)?;
        let slot = lock(&self.slot);
        let vm = Self::running(&slot, "snapshot")?;
        let spec = &slot
            .created
            .as_ref()
            .ok_or(ApiError::NotCreated { action: "snapshot" })?
            .prepared
            .spec;
        let key = self.snapshot_key("snapshot")?;
        self.emit(Source::Vm, "snapshotting");
        crate::snapshot::save(vm.shared(), spec, &dir, key.as_ref()).map_err(|e| {
            ApiError::Failed {
                action: "snapshot",
                reason: e.to_string(),
            }
        })?;
        self.emit(Source::Vm, "snapshotted");
        Ok(())
    }

    /// The host config's snapshot key (`snapshot_key_file`), if it has one: it seals
    /// `vm.snapshot`'s snapshots and opens `vm.restore`'s.
    fn snapshot_key(&self, action: &'static str) -> Result<Option<farvm_seal::PageKey>, ApiError> {
        let Some(path) = self.factory.snapshot_key_file(&self.name)? else {
            return Ok(None);
        };
        farvm_seal::PageKey::from_file(&path)
            .map(Some)
            .map_err(|e| ApiError::Failed {
                action,
                reason: format!("the host config's snapshot_key_file: {e}"),
            })
    }

    /// `vm.restore`: builds the VM saved in the body's directory, named as this server's VM,
    /// and leaves it paused (`vm.resume` runs it), as Cloud Hypervisor does. Only a server
    /// with no VM created restores one. Its console is a pty, as libvirt's domains have.
    pub fn restore(&self, body: &[u8]) -> Result<(), ApiError> {
        let dir = farvm_chapi::snapshot::source(body)?;
        let mut slot = lock(&self.slot);
        if slot.created.is_some() {
            return Err(ApiError::WrongState {
                action: "restore",
                state: farvm_chapi::error::StateName::AlreadyCreated,
            });
        }
        let failed = |reason: String| ApiError::Failed {
            action: "restore",
            reason,
        };
        let key = self.snapshot_key("restore")?;
        let snap = Snapshot::open(&dir, key.as_ref()).map_err(|e| failed(e.to_string()))?;
        self.adopt(&mut slot, snap.spec(), "restore", |cfg| {
            snap.prepare(cfg).map_err(|e| e.to_string())
        })?;
        self.emit(Source::Vm, "restoring");
        if let Err(e) = self.launch(&mut slot, Launch::Restore(&snap)) {
            slot.created = None;
            return Err(e);
        }
        drop(slot);
        self.emit(Source::Vm, "restored");
        Ok(())
    }

    /// Makes the VM `spec` describes (a snapshot's or a migrating VM's) this server's created
    /// VM, named as this server's VM, its configuration readied by `prepare`; it is not built
    /// yet. Its console is a pty, as libvirt's domains have.
    fn adopt(
        &self,
        slot: &mut Slot,
        mut spec: crate::spec::VmSpec,
        action: &'static str,
        prepare: impl FnOnce(&mut builder::VmConfig) -> Result<(), String>,
    ) -> Result<(), ApiError> {
        let failed = |reason: String| ApiError::Failed { action, reason };
        spec.name = Some(self.name.clone());
        let mut config = spec
            .to_config()
            .map_err(|e| failed(e.render(&super::factory::ApiNames)))?;
        prepare(&mut config).map_err(failed)?;
        let create = CreateSpec {
            vcpus: spec.vcpus,
            memory: spec.memory,
            kernel: spec.kernel.clone().unwrap_or_default(),
            cmdline: spec.cmdline.clone(),
            initramfs: spec.initrd.clone(),
            // The one pty reported as both: after a restore, libvirt reads the `file` of the
            // console or of the serial port, whichever its domain has.
            console: ConsoleConfig::mode(ConsoleMode::Pty),
            serial: ConsoleConfig::mode(ConsoleMode::Pty),
            disks: Vec::new(),
            net: Vec::new(),
        };
        slot.created = Some(Created {
            spec: create,
            prepared: Prepared {
                metrics: spec.metrics.map(farvm_httpd::Listen::Tcp),
                notes: Vec::new(),
                config,
                spec,
            },
            pty: None,
        });
        Ok(())
    }

    /// Starts the thread that notices the guest of boot `generation` stopping by itself.
    fn watch(&self, shared: Arc<VmShared>, generation: u64) {
        let me = self.me.clone();
        let spawned = std::thread::Builder::new()
            .name("vm-watch".into())
            .spawn(move || loop {
                if shared.wait_outcome(WATCH_TICK).is_some() {
                    if let Some(state) = me.upgrade() {
                        state.guest_stopped(generation);
                    }
                    return;
                }
                if me.strong_count() == 0 {
                    return;
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("cannot start the VM watcher (a guest power-off will show as running until vm.shutdown): {e}");
        }
    }

    /// The guest of boot `generation` stopped by itself: finish its VM, keep the report.
    fn guest_stopped(&self, generation: u64) {
        let mut slot = lock(&self.slot);
        let current = matches!(&slot.run, Run::Running { generation: g, .. } if *g == generation);
        if !current {
            return; // Stopped through the API meanwhile.
        }
        let Some(report) = slot.finish_running() else {
            return;
        };
        tracing::info!(vm = self.name, "the guest stopped: {}", report.outcome);
        // A VM that stopped because `vm.snapshot` saved it already said `vm:snapshotted`, and
        // Cloud Hypervisor says nothing more: libvirt marks the domain "shut off (saved)" and
        // would overwrite that with "shut off (shutdown)" on a `vm:shutdown`.
        let saved = matches!(report.outcome, VmOutcome::Snapshotted { .. });
        slot.run = Run::Stopped(Box::new(report));
        drop(slot);
        if !saved {
            self.emit(Source::Vm, "shutdown");
        }
    }

    /// Stops a running VM (returns whether one was running).
    fn stop_vm(&self, slot: &mut Slot) -> bool {
        let Some(report) = slot.finish_running() else {
            return false;
        };
        tracing::info!(vm = self.name, "stopped: {}", report.outcome);
        true
    }

    /// The running VM for `action`, or the error for the state it is in.
    fn running<'a>(slot: &'a Slot, action: &'static str) -> Result<&'a RunningVm, ApiError> {
        match (&slot.created, &slot.run) {
            (None, _) => Err(ApiError::NotCreated { action }),
            (_, Run::Running { vm, .. }) => Ok(vm),
            (_, r) => Err(ApiError::wrong_state(action, state_of(r))),
        }
    }

    /// `vm.pause`.
    pub fn pause(&self) -> Result<(), ApiError> {
        let slot = lock(&self.slot);
        let vm = Self::running(&slot, "pause")?;
        match state_of(&slot.run) {
            VmState::Running => {}
            s => return Err(ApiError::wrong_state("pause", s)),
        }
        self.emit(Source::Vm, "pausing");
        vm.pause().map_err(|e| vm_error("pause", e))?;
        self.emit(Source::Vm, "paused");
        Ok(())
    }

    /// `vm.resume`.
    pub fn resume(&self) -> Result<(), ApiError> {
        let slot = lock(&self.slot);
        let vm = Self::running(&slot, "resume")?;
        match state_of(&slot.run) {
            VmState::Paused => {}
            s => return Err(ApiError::wrong_state("resume", s)),
        }
        self.emit(Source::Vm, "resuming");
        vm.resume().map_err(|e| vm_error("resume", e))?;
        self.emit(Source::Vm, "resumed");
        Ok(())
    }

    /// `vm.shutdown`: the VM stops and can be booted again. A guest that already stopped by
    /// itself is shut down already: that succeeds too.
    pub fn shutdown(&self) -> Result<(), ApiError> {
        let mut slot = lock(&self.slot);
        match (&slot.created, &slot.run) {
            (None, _) => Err(ApiError::NotCreated {
                action: "shut down",
            }),
            (_, Run::Idle) => Err(ApiError::wrong_state("shut down", VmState::Created)),
            (_, Run::Stopped(_)) => {
                slot.run = Run::Idle;
                Ok(())
            }
            (_, Run::Running { .. }) => {
                self.stop_vm(&mut slot);
                drop(slot);
                self.emit(Source::Vm, "shutdown");
                Ok(())
            }
        }
    }

    /// `vm.reboot`: a fresh VM from the same configuration.
    pub fn reboot(&self) -> Result<(), ApiError> {
        let mut slot = lock(&self.slot);
        Self::running(&slot, "reboot")?;
        self.emit(Source::Vm, "rebooting");
        self.stop_vm(&mut slot);
        self.start_vm(&mut slot).map_err(|e| match e {
            ApiError::Failed { reason, .. } => ApiError::Failed {
                action: "reboot",
                reason,
            },
            other => other,
        })?;
        self.emit(Source::Vm, "rebooted");
        Ok(())
    }

    /// `vm.delete`: stop the VM, if running, and forget it (also when none was created).
    pub fn delete(&self) {
        let mut slot = lock(&self.slot);
        self.stop_vm(&mut slot);
        let had = slot.created.take().is_some();
        drop(slot);
        if had {
            self.emit(Source::Vm, "deleted");
        }
    }

    /// `vm.info`.
    pub fn info(&self) -> Result<Value, ApiError> {
        let slot = lock(&self.slot);
        let c = slot.created.as_ref().ok_or(ApiError::NotCreated {
            action: "report the VM",
        })?;
        let pty = c.pty.as_ref().map(|p| p.path());
        Ok(info::vm_info(&c.spec, pty, state_of(&slot.run)))
    }

    /// `vm.counters`.
    pub fn counters(&self) -> Result<Counters, ApiError> {
        let slot = lock(&self.slot);
        if slot.created.is_none() {
            return Err(ApiError::NotCreated {
                action: "report counters",
            });
        }
        Ok(match &slot.run {
            Run::Idle => Counters::new(),
            Run::Running { vm, .. } => {
                super::counters::live(&vm.counters(), &vm.shared().pv.processes())
            }
            Run::Stopped(report) => super::counters::finished(report),
        })
    }

    /// `vmm.shutdown`: stop the VM and let [`ApiState::wait_exit`] return.
    pub fn request_exit(&self) {
        {
            let mut slot = lock(&self.slot);
            self.stop_vm(&mut slot);
        }
        *lock(&self.exit) = true;
        self.exit_cond.notify_all();
    }

    /// Blocks until `vmm.shutdown` (true) or `timeout` (false).
    pub fn wait_exit(&self, timeout: Duration) -> bool {
        let g = lock(&self.exit);
        let (g, _) = self
            .exit_cond
            .wait_timeout_while(g, timeout, |e| !*e)
            .unwrap_or_else(|p| p.into_inner());
        *g
    }

    /// Stops the VM, if any (the VMM is exiting).
    pub fn stop(&self) {
        let mut slot = lock(&self.slot);
        if self.stop_vm(&mut slot) {
            drop(slot);
            self.emit(Source::Vm, "shutdown");
        }
    }

    /// Whether the event monitor's reader closed it (see [`EventMonitor::reader_gone`]).
    pub fn event_reader_gone(&self) -> bool {
        self.events.as_ref().is_some_and(EventMonitor::reader_gone)
    }

    /// [`EventMonitor::keepalive`], if there is an event monitor.
    pub fn event_keepalive(&self) {
        if let Some(m) = &self.events {
            m.keepalive();
        }
    }

    pub(super) fn emit_vmm(&self, event: &str) {
        self.emit(Source::Vmm, event);
    }
}
