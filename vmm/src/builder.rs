//! Building a VM from one [`VmConfig`] — the only way a VM is made, whether by `farvm run`,
//! the tests, the lab's benchmarks or an API server (`vm.create` carries a config, `vm.boot`
//! builds and starts it).
//!
//! [`build`] checks the configuration, then assembles, in order: guest RAM (local, or remote:
//! the paging engine and its memory servers start first because the engine owns the mapping
//! KVM is given), the KVM VM with its in-kernel irqchip (and, for Linux, the PIT) and one
//! memslot per RAM region, the vCPUs, the devices (their interrupt lines as irqfds), the
//! kernel and its boot data (for Linux, ACPI tables describing those vCPUs and devices), and —
//! with remote memory — the wiring of the engine to the VM (stage-2 injection, vCPU thread and
//! agent-slot attribution, lost pages stop the VM). The result is a [`Vm`] ready to
//! [`Vm::start`].

use std::sync::Arc;

use farvm_devices::serial::{SerialIn, SerialOut};

use crate::boot::linux::{self, LinuxBootInfo};
use crate::boot::testguest::{self, TestPlan};
use crate::boot::{acpi, BootError, EntryState};
use crate::devices::board::{Board, BoardConfig, DeviceError, DiskConfig, NetConfig};
use crate::devices::pty::Pty;
use crate::devices::pvctl::PvCtl;
use crate::layout;
use crate::remote::{RemoteError, RemoteMemory, RemoteSpec};
use crate::vm::{Vm, VmShared};
use crate::vstate::irq;
use crate::vstate::kvm_stats::VcpuStats;
use crate::vstate::memory::{GuestRam, MemError};
use crate::vstate::outcome::OutcomeLatch;
use crate::vstate::vcpu::{self, ApStart};
use crate::vstate::vm::{KvmError, KvmVm};

/// Errors building a VM.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The configuration is invalid.
    #[error("invalid VM configuration: {0}")]
    Config(String),
    /// Guest RAM could not be set up.
    #[error(transparent)]
    Memory(#[from] MemError),
    /// The kernel could not be loaded.
    #[error(transparent)]
    Boot(#[from] BootError),
    /// A KVM call failed.
    #[error(transparent)]
    Kvm(#[from] KvmError),
    /// Remote memory could not be set up.
    #[error(transparent)]
    Remote(#[from] RemoteError),
    /// A device could not be set up.
    #[error(transparent)]
    Devices(#[from] DeviceError),
    /// Another host error.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What the VM boots.
#[derive(Clone, Debug)]
pub enum BootConfig {
    /// A farvm test-guest kernel (ELF, direct 64-bit entry) with its test plan: the processes
    /// (workloads) it runs, its timer, its frame allocator settings.
    TestGuest {
        /// The kernel ELF.
        kernel: Arc<[u8]>,
        /// Its processes, timer and frame allocator settings.
        plan: TestPlan,
    },
    /// A Linux bzImage or vmlinux, per the x86 64-bit boot protocol, with ACPI tables; the
    /// APs wait for the kernel's INIT/SIPI.
    Linux {
        /// The bzImage or vmlinux.
        kernel: Arc<[u8]>,
        /// The initrd, if any.
        initrd: Option<Arc<[u8]>>,
        /// The kernel command line.
        cmdline: String,
    },
}

/// Everything a VM is built from.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// Name: the control socket's, the logs', the memory servers' namespace.
    pub name: String,
    /// A UUID to report back (libvirt assigns one); farvm itself does not use it.
    pub uuid: Option<String>,
    /// vCPUs (threads `vcpu0`, `vcpu1`, …).
    pub vcpus: u32,
    /// Guest RAM in bytes (4 KiB multiple; above 3 GiB it continues at 4 GiB).
    pub mem_bytes: u64,
    /// What to boot.
    pub boot: BootConfig,
    /// Remote memory: guest RAM behind the paging engine and memory servers, with this local
    /// budget, prefetcher and servers. `None`: all RAM local. (Its `vm_name` is taken from
    /// [`VmConfig::name`].)
    pub remote: Option<RemoteSpec>,
    /// Where the serial console goes.
    pub serial: SerialOut,
    /// Where the serial console's input comes from (stdin on a terminal: through the escape
    /// filter, see `devices::console`).
    pub serial_in: SerialIn,
    /// A pseudo-terminal as the console (output and input) instead of `serial` and
    /// `serial_in`: the API server's `Pty` console, kept across the boots of one created VM.
    pub console_pty: Option<Arc<Pty>>,
    /// Disks, virtio-blk on virtio-mmio in this order (Linux guests: `/dev/vda`, `/dev/vdb`,
    /// …).
    pub disks: Vec<DiskConfig>,
    /// Network interfaces, virtio-net on virtio-mmio after the disks (Linux guests: eth0,
    /// eth1, … in this order, as the guest's driver probes them).
    pub nets: Vec<NetConfig>,
    /// Echo guest PV log lines on stderr.
    pub echo_guest_logs: bool,
    /// Keep KVM's async page faults (KVM's default). Off, a guest fault on remote memory is
    /// resolved on the vCPU thread, which is what lets the paging engine attribute it to a
    /// vCPU and guest process; it costs disabling HLT exits (see `vstate::vm`).
    pub kvm_async_pf: bool,
    /// The VM is loaded from a snapshot before it runs: the boot path writes its images into
    /// scratch memory, not guest RAM. The snapshot supplies every page the guest had; a pool
    /// VM's guest RAM is already the snapshot's namespace, which a boot page evicted before
    /// the snapshot's pages are adopted would overwrite.
    pub restoring: bool,
}

impl VmConfig {
    /// A VM named `name` with `mem_bytes` of local RAM and `vcpus` vCPUs booting `boot`; no
    /// serial output, KVM's async page faults on. Set the other fields as needed.
    pub fn new(name: &str, mem_bytes: u64, vcpus: u32, boot: BootConfig) -> Self {
        VmConfig {
            name: name.to_string(),
            uuid: None,
            vcpus,
            mem_bytes,
            boot,
            remote: None,
            serial: SerialOut::None,
            serial_in: SerialIn::None,
            console_pty: None,
            disks: Vec::new(),
            nets: Vec::new(),
            echo_guest_logs: false,
            kvm_async_pf: true,
            restoring: false,
        }
    }

    /// [`VmConfig::new`] booting the built-in test guest with `plan`.
    pub fn test_guest(name: &str, mem_bytes: u64, vcpus: u32, plan: TestPlan) -> Self {
        let kernel = Arc::from(crate::builtin::test_guest_elf());
        Self::new(
            name,
            mem_bytes,
            vcpus,
            BootConfig::TestGuest { kernel, plan },
        )
    }

    /// Checks what can be checked without touching the host.
    pub fn validate(&self) -> Result<(), BuildError> {
        let bad = |m: String| Err(BuildError::Config(m));
        if self.name.is_empty() || self.name.contains('/') {
            return bad(format!(
                "invalid name `{}`: must be non-empty and contain no `/`",
                self.name
            ));
        }
        if let Some(u) = &self.uuid {
            if !is_uuid(u) {
                return bad(format!(
                    "invalid uuid `{u}` (expected 8-4-4-4-12 hex digits)"
                ));
            }
        }
        if self.vcpus == 0 {
            return bad("--vcpus must be at least 1".into());
        }
        if self.mem_bytes < layout::MIN_RAM {
            return bad(format!(
                "--memory must be at least {} MiB",
                layout::MIN_RAM >> 20
            ));
        }
        if self.mem_bytes > layout::MAX_RAM {
            return bad(format!(
                "--memory must be at most {} GiB",
                layout::MAX_RAM >> 30
            ));
        }
        match &self.boot {
            BootConfig::TestGuest { plan, .. } => {
                if let Some(p) = plan.procs.iter().find(|p| p.cpu >= self.vcpus) {
                    return bad(format!(
                        "a workload is placed on cpu {} but the VM has {} vCPUs",
                        p.cpu, self.vcpus
                    ));
                }
            }
            BootConfig::Linux { .. } => {}
        }
        if !self.disks.is_empty() && !self.is_linux() {
            return bad("--disk needs a Linux guest: the test guest has no disk driver".into());
        }
        if !self.nets.is_empty() && !self.is_linux() {
            return bad("--net needs a Linux guest: the test guest has no network driver".into());
        }
        Ok(())
    }
}

impl VmConfig {
    /// Whether the guest is Linux.
    pub fn is_linux(&self) -> bool {
        matches!(self.boot, BootConfig::Linux { .. })
    }
}

fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Builds the VM `cfg` describes (see the module doc). On error everything started so far
/// (remote memory included) is stopped again.
pub fn build(cfg: &VmConfig) -> Result<Vm, BuildError> {
    cfg.validate()?;
    let Some(spec) = &cfg.remote else {
        let ram = GuestRam::local(&layout::ram_ranges(cfg.mem_bytes))?;
        return assemble(cfg, Arc::new(ram));
    };
    let mut spec = spec.clone();
    spec.vm_name = cfg.name.clone();
    spec.linux_guest = cfg.is_linux();
    let mut remote = RemoteMemory::start(&spec, cfg.mem_bytes)?;
    let vm = remote
        .guest_ram()
        .map_err(BuildError::from)
        .and_then(|ram| {
            let want = layout::ram_ranges(cfg.mem_bytes);
            let have: Vec<(u64, u64)> = ram.regions().iter().map(|r| (r.gpa(), r.len())).collect();
            if want != have {
                return Err(BuildError::Config(format!(
                    "the paging engine's guest RAM {have:x?} does not match the layout for \
                     {} bytes: {want:x?}",
                    cfg.mem_bytes
                )));
            }
            assemble(cfg, ram)
        });
    match vm {
        Ok(mut vm) => {
            let shared = Arc::downgrade(vm.shared());
            remote.attach_vm(
                vm.vm_fd(),
                &vm.shared().pv,
                vm.shared().latch(),
                move || shared.upgrade().map(|s| s.vcpu_tids()).unwrap_or_default(),
            );
            vm.shared().set_guest_paging(remote.guest_paging().clone());
            if let Some(saving) = remote.saving() {
                vm.shared().set_remote_saving(saving);
            }
            if cfg.is_linux() {
                tracing::info!(
                    "Linux guest on remote memory: until a guest agent registers its slots, \
                     faults have no process and the prefetcher learns one global \
                     guest-physical history"
                );
            }
            vm.own_remote(remote);
            Ok(vm)
        }
        Err(e) => {
            remote.shutdown();
            Err(e)
        }
    }
}

/// The KVM VM, vCPUs, devices and boot data on `ram`.
fn assemble(cfg: &VmConfig, ram: Arc<GuestRam>) -> Result<Vm, BuildError> {
    let linux = cfg.is_linux();
    let kvm = KvmVm::new(&ram, cfg.kvm_async_pf)?;
    if linux {
        irq::create_pit(&kvm.fd)?;
    }
    // Linux brings its APs up itself and, without PV async page faults, keeps a fault on a
    // remote page on the faulting vCPU.
    let start = if linux {
        ApStart::WaitForSipi
    } else {
        ApStart::AllAtEntry
    };
    let vcpus = vcpu::create(&kvm, cfg.vcpus, linux)?;
    let latch = Arc::new(OutcomeLatch::default());
    let pv = Arc::new(PvCtl::new(ram.clone(), cfg.vcpus, cfg.echo_guest_logs));
    let board = build_board(cfg, &ram, &latch, &pv)?;
    irq::connect_irqfds(&kvm.fd, board.interrupts())?;
    // A VM to be restored still computes its entry state and Linux boot details (reported as
    // for a fresh boot), from images written into memory that is dropped at once.
    let boot_ram = if cfg.restoring {
        Arc::new(GuestRam::local(&layout::ram_ranges(cfg.mem_bytes))?)
    } else {
        ram.clone()
    };
    let (entry, linux_info) = load_kernel(cfg, &boot_ram, &board, vcpu::tsc_khz(&vcpus[0])?)?;
    drop(boot_ram);
    vcpu::set_entry(&vcpus, &entry, start)?;
    let kvm_stats = vcpus
        .iter()
        .map(|v| {
            VcpuStats::open(v)
                .map_err(|e| tracing::debug!("KVM stats unavailable: {e}"))
                .ok()
        })
        .collect();
    let shared = Arc::new(VmShared::new(
        cfg.name.clone(),
        cfg.uuid.clone(),
        ram,
        pv,
        board,
        cfg.vcpus,
        kvm_stats,
        latch,
    ));
    Ok(Vm::new(shared, kvm, vcpus, entry, linux_info))
}

/// The devices: console, power registers, and the disks and network devices with a DMA view
/// of `ram`.
fn build_board(
    cfg: &VmConfig,
    ram: &GuestRam,
    latch: &Arc<OutcomeLatch>,
    pv: &Arc<PvCtl>,
) -> Result<Board, BuildError> {
    let agent_vcpus = cfg.is_linux().then_some(cfg.vcpus);
    let mem = if cfg.disks.is_empty() && cfg.nets.is_empty() && agent_vcpus.is_none() {
        None
    } else {
        // SAFETY: the view is used by the disks and the agent device on vCPU threads (their
        // registers are MMIO exits), and by the network devices' receive threads; the vCPU
        // threads are joined, and the receive threads stopped and joined
        // (`Board::stop_devices`, in `RunningVm`'s stop), before the VM's remote memory shuts
        // down: the VM owns its RemoteMemory and drops it last (`vm::RemoteOwner`). A VM
        // never started has no active device: its receive threads never touch the view.
        Some(unsafe { ram.device_view() }?)
    };
    let board_cfg = BoardConfig {
        serial_out: cfg.serial.clone(),
        serial_in: cfg.serial_in.clone(),
        pty: cfg.console_pty.clone(),
        disks: cfg.disks.clone(),
        nets: cfg.nets.clone(),
        agent_vcpus,
    };
    Ok(Board::new(&board_cfg, mem, latch.clone(), pv.clone())?)
}

/// Loads the kernel and writes its boot data; returns vCPU 0's entry state and Linux boot
/// details.
fn load_kernel(
    cfg: &VmConfig,
    ram: &GuestRam,
    board: &Board,
    tsc_khz: u64,
) -> Result<(EntryState, Option<LinuxBootInfo>), BuildError> {
    Ok(match &cfg.boot {
        BootConfig::TestGuest { kernel, plan } => {
            let e = testguest::setup(ram, kernel, cfg.vcpus, tsc_khz, plan)?;
            (e, None)
        }
        BootConfig::Linux {
            kernel,
            initrd,
            cmdline,
        } => {
            let tables =
                acpi::write_tables(ram, cfg.vcpus, board.virtio_mmio(), board.agent_window())?;
            let (e, info) = linux::setup(ram, kernel, initrd.as_deref(), cmdline, Some(&tables))?;
            (e, Some(info))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configs_are_checked_before_anything_is_built() {
        let ok = VmConfig::test_guest("t", 64 << 20, 1, TestPlan::default());
        ok.validate().unwrap();
        let err = |f: &dyn Fn(&mut VmConfig)| {
            let mut c = ok.clone();
            f(&mut c);
            match build(&c) {
                Err(BuildError::Config(m)) => m,
                Err(e) => panic!("not a config error: {e}"),
                Ok(_) => panic!("accepted"),
            }
        };
        assert!(err(&|c| c.vcpus = 0).contains("at least 1"));
        assert!(err(&|c| c.mem_bytes = 1 << 20).contains("at least 16 MiB"));
        assert!(err(&|c| c.mem_bytes = 1 << 50).contains("at most 240 GiB"));
        assert!(err(&|c| c.name = "a/b".into()).contains("no `/`"));
        assert!(err(&|c| c.uuid = Some("xyz".into())).contains("invalid uuid"));
        let mut c = ok.clone();
        c.uuid = Some("4dea22b3-1d52-d8f3-2516-782e98ab3fa0".into());
        c.validate().unwrap();
        let mut big = ok.clone();
        big.remote = Some(RemoteSpec::new("t"));
        big.mem_bytes = 64 << 30;
        big.validate().unwrap();
        // Linux on remote memory is a valid configuration (the kernel is checked later).
        let mut linux = ok.clone();
        linux.remote = Some(RemoteSpec::new("t"));
        linux.boot = BootConfig::Linux {
            kernel: Arc::from(vec![0u8; 16]),
            initrd: None,
            cmdline: String::new(),
        };
        linux.disks = vec!["/nonexistent.img".parse().unwrap()];
        linux.validate().unwrap();
        assert!(err(&|c| c.disks = vec!["/x.img".parse().unwrap()]).contains("needs a Linux guest"));
        assert!(err(&|c| c.nets = vec!["tap=t0".parse().unwrap()])
            .contains("--net needs a Linux guest"));
        let mut plan = TestPlan::default();
        plan.procs.push(farvm_guest_agent::boot::ProcessSpec {
            cpu: 1,
            ..Default::default()
        });
        assert!(err(&|c| {
            c.boot = BootConfig::TestGuest {
                kernel: Arc::from(vec![0u8; 16]),
                plan: plan.clone(),
            }
        })
        .contains("placed on cpu 1"));
    }
}
