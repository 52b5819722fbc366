//! [`VmSpec::to_config`]: the description checked and made concrete — files read, the kernel
//! sniffed (test guest or Linux), the test guest's workloads planned, remote memory's settings
//! resolved — into the [`VmConfig`] the builder makes a VM of. No KVM yet.

use std::path::Path;
use std::sync::Arc;

use farvm_devices::serial::SerialIn;
use farvm_guest_agent::boot::flags;

use super::{AsyncPf, Field, SpecError, VmSpec};
use crate::boot::testguest::TestPlan;
use crate::boot::testguest_file::{is_test_guest, workloads_from_cmdline};
use crate::boot::{sniff_kernel, KernelKind};
use crate::builder::{BootConfig, VmConfig};
use crate::remote::{PoolSpec, RemoteSpec};
use crate::workload_spec::plan;
use farvm_units::format_size;

/// Faults a fault log keeps at most (16 bytes each).
pub const FAULT_LOG_RECORDS: usize = 1 << 22;

fn read_input(path: &Path, field: Field) -> Result<Arc<[u8]>, SpecError> {
    std::fs::read(path)
        .map(Arc::from)
        .map_err(|e| SpecError::unreadable(field, format!("cannot read {}: {e}", path.display())))
}

impl VmSpec {
    /// The VM's name: the given one, or `farvm-PID`.
    pub fn vm_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("farvm-{}", std::process::id()))
    }

    /// Checks the description and makes it concrete (see the module doc).
    pub fn to_config(&self) -> Result<VmConfig, SpecError> {
        let name = self.vm_name();
        if name.is_empty() || name.contains('/') {
            return Err(SpecError::invalid(
                Field::Name,
                format!("`{name}` must be non-empty and contain no `/`"),
            ));
        }
        let kernel: Arc<[u8]> = match &self.kernel {
            Some(p) => read_input(p, Field::Kernel)?,
            None => {
                if crate::builtin::test_guest_elf().is_empty() {
                    return Err(SpecError::bad_kernel(
                        Field::Kernel,
                        "the built-in test guest is empty in this build; give a kernel file",
                    ));
                }
                Arc::from(crate::builtin::test_guest_elf())
            }
        };
        let kind = sniff_kernel(&kernel).ok_or_else(|| {
            SpecError::bad_kernel(
                Field::Kernel,
                format!(
                    "{}: not a kernel image (neither ELF nor a Linux bzImage)",
                    self.kernel
                        .as_ref()
                        .map_or("built-in test guest".into(), |p| p.display().to_string())
                ),
            )
        })?;
        // A kernel file carrying the test guest's ELF note is the test guest even with a
        // command line: its workloads may come from `farvm.workload=` words (how libvirt names
        // them).
        let test_guest_file =
            kind == KernelKind::Elf && !self.force_linux && is_test_guest(&kernel);
        let linux = !test_guest_file
            && (kind == KernelKind::BzImage
                || self.force_linux
                || self.initrd.is_some()
                || self.cmdline.is_some());
        let boot = if linux {
            self.linux_boot(kernel)?
        } else {
            self.test_guest_boot(kernel, test_guest_file)?
        };
        let mut cfg = VmConfig::new(&name, self.memory, self.vcpus, boot);
        cfg.uuid = self.uuid.clone();
        cfg.serial = self.serial.clone();
        cfg.serial_in = self.serial_in.clone().unwrap_or(if linux {
            SerialIn::Stdin
        } else {
            SerialIn::None
        });
        cfg.disks = self.disks.clone();
        cfg.nets = self.nets.clone();
        cfg.echo_guest_logs = self.echo_guest_logs;
        // Local RAM has no userfaultfd pages: KVM's default is harmless there. The test guest
        // from a file pages like the built-in one.
        cfg.kvm_async_pf = match self.async_pf {
            AsyncPf::Keep => true,
            AsyncPf::Off => false,
            AsyncPf::Auto => self.local_only || (self.kernel.is_some() && !test_guest_file),
        };
        cfg.remote = self.remote_spec(&cfg)?;
        Ok(cfg)
    }

    fn linux_boot(&self, kernel: Arc<[u8]>) -> Result<BootConfig, SpecError> {
        if !self.workloads.is_empty() {
            return Err(SpecError::invalid(
                Field::Workloads,
                "workloads need the test guest; a Linux kernel runs its own programs",
            ));
        }
        let initrd = self
            .initrd
            .as_ref()
            .map(|p| read_input(p, Field::Initrd))
            .transpose()?;
        Ok(BootConfig::Linux {
            kernel,
            initrd,
            cmdline: self
                .cmdline
                .clone()
                .unwrap_or_else(|| "console=ttyS0 panic=1".into()),
        })
    }

    fn test_guest_boot(
        &self,
        kernel: Arc<[u8]>,
        test_guest_file: bool,
    ) -> Result<BootConfig, SpecError> {
        let max_cpus = farvm_guest_agent::boot::MAX_CPUS as u32;
        if self.vcpus > max_cpus {
            return Err(SpecError::invalid(
                Field::Vcpus,
                format!(
                    "{} vCPUs is more than the test guest supports ({max_cpus})",
                    self.vcpus
                ),
            ));
        }
        if self.initrd.is_some() {
            return Err(SpecError::invalid(
                Field::Initrd,
                "the test guest takes no initial ramdisk",
            ));
        }
        if !self.disks.is_empty() {
            return Err(SpecError::invalid(
                Field::Disks,
                "disks need a Linux guest: the test guest has no disk driver",
            ));
        }
        if !self.nets.is_empty() {
            return Err(SpecError::invalid(
                Field::Nets,
                "network interfaces need a Linux guest: the test guest has no network driver",
            ));
        }
        let mut specs = self.workloads.clone();
        if let Some(cmdline) = &self.cmdline {
            specs.extend(
                workloads_from_cmdline(cmdline)
                    .map_err(|e| SpecError::invalid(Field::Cmdline, e))?,
            );
        }
        if specs.is_empty() {
            specs = self.default_workloads();
        }
        // farvm's test guest with nothing to run would boot and power off at once, exit 0: a
        // domain without a kernel looks like it ran. (A size the builder refuses anyway is
        // left to its own message; another ELF kernel may well run without workloads.)
        if specs.is_empty() && self.builder_takes_sizes() {
            if self.kernel.is_none() {
                return Err(SpecError::invalid(
                    Field::Kernel,
                    "none given, so farvm would boot its built-in test guest, which has no \
                     workload to run: boot a kernel, or give the test guest workloads",
                ));
            }
            if test_guest_file {
                return Err(SpecError::invalid(
                    Field::Workloads,
                    "farvm's test guest has no workload to run (farvm.workload=SPEC words on \
                     the kernel command line, or --workload)",
                ));
            }
        }
        let placement =
            plan(&specs, self.vcpus).map_err(|e| SpecError::invalid(Field::Workloads, e))?;
        let placed = &placement.workloads;
        let total_ws: u64 = placed.iter().map(|p| p.spec.ws_bytes).sum();
        if total_ws >= self.memory {
            return Err(SpecError::invalid(
                Field::Memory,
                format!(
                    "the workloads' working sets add up to {} but the guest has {}; give it \
                     more memory (working sets + page tables + ~32M)",
                    format_size(total_ws),
                    format_size(self.memory)
                ),
            ));
        }
        let t = &self.test_guest;
        let mut f = flags::RAM_IS_ZERO;
        if t.premap {
            f |= flags::PREMAP_HEAP;
        }
        if t.demand_4k {
            f |= flags::DEMAND_4K;
        }
        Ok(BootConfig::TestGuest {
            kernel,
            plan: TestPlan {
                procs: placed.iter().map(|p| p.process_spec()).collect(),
                timer_hz: t.timer_hz,
                flags: f,
                frame_shuffle_seed: t.frame_shuffle_seed,
                frame_run_shift: t
                    .frame_run_shift
                    .unwrap_or(if self.local_only { 0 } else { 9 }),
                blob: placement.blob,
            },
        })
    }

    /// Whether the builder accepts this vCPU count and RAM size. Where it does not, checks
    /// that would fail only because of them are skipped, so the builder reports the size with
    /// its own message.
    fn builder_takes_sizes(&self) -> bool {
        self.vcpus >= 1 && (crate::layout::MIN_RAM..=crate::layout::MAX_RAM).contains(&self.memory)
    }

    /// The workloads of a bare `farvm run` (test guest, none given, no kernel file): a
    /// sequential scan larger than the default local budget plus a random-access one, so the
    /// run pages.
    fn default_workloads(&self) -> Vec<String> {
        if self.kernel.is_some() || self.memory < (384 << 20) {
            return Vec::new();
        }
        vec!["seq:ws=192M".into(), "random:ws=64M".into()]
    }

    /// The remote-memory settings, or `None` when guest RAM stays local.
    fn remote_spec(&self, cfg: &VmConfig) -> Result<Option<RemoteSpec>, SpecError> {
        let r = &self.remote;
        if self.local_only {
            if r.fault_path_cpu.is_some() {
                return Err(SpecError::invalid(
                    Field::FaultPathCpu,
                    "the fault path needs remote memory, but all of this VM's RAM is local",
                ));
            }
            return Ok(None);
        }
        if !self.builder_takes_sizes() {
            return Ok(None);
        }
        if !farvm_prefetch::registry::names().contains(&r.prefetcher.as_str()) {
            return Err(SpecError::invalid(
                Field::Prefetcher,
                format!(
                    "unknown prefetcher `{}` (known: {})",
                    r.prefetcher,
                    farvm_prefetch::registry::names().join(", ")
                ),
            ));
        }
        if let Some(c) = r.fault_path_cpu {
            crate::affinity::check_cpu(c)
                .map_err(|e| SpecError::invalid(Field::FaultPathCpu, e))?;
        }
        let mut spec = RemoteSpec::new(&cfg.name);
        // `--rdma-pages` says how every RDMA server's pages move.
        spec.servers = r
            .servers
            .iter()
            .map(|e| e.with_rdma_pages(r.rdma_one_sided))
            .collect();
        if !r.pool.is_empty() {
            let p = &r.pool_options;
            if let Some(slab) = p.slab_bytes {
                if slab < 4096 || !slab.is_multiple_of(4096) {
                    return Err(SpecError::invalid(
                        Field::PoolSlab,
                        format!("{slab} bytes: a size of whole 4 KiB pages, e.g. 1G or 64M"),
                    ));
                }
            }
            let mut ps = PoolSpec::new(r.pool.clone());
            ps.lease_ttl = p.lease_ttl.max(std::time::Duration::from_secs(1));
            ps.wait = p.wait;
            ps.slab_bytes = p.slab_bytes;
            if let Some(h) = &p.host {
                ps.host = h.clone();
            }
            ps.transport = p.transport.with_rdma_pages(r.rdma_one_sided);
            spec.pool = Some(ps);
        }
        spec.replicas = r.replicas;
        spec.token_file = r.token_file.clone();
        spec.page_encryption = r.page_encryption;
        spec.memory_key_file = r.memory_key_file.clone();
        spec.budget = r.local_memory;
        spec.prefetcher = r.prefetcher.clone();
        spec.probe_every = r.probe_every;
        spec.guest_memory = r.guest_memory;
        spec.fault_path_cpu = r.fault_path_cpu;
        spec.page_space = r.page_space;
        spec.stage2_prefault = r.stage2_prefault;
        spec.global_history = r.global_history;
        spec.fault_log_records = if r.fault_log { FAULT_LOG_RECORDS } else { 0 };
        Ok(Some(spec))
    }
}
