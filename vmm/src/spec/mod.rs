//! One typed description of a VM, whichever front door it came through: `farvm run`'s flags
//! (the binary's `RunArgs::to_spec`), a libvirt domain merged with the host config
//! ([`VmSpec::apply_domain`], for `farvm run --domain` and for the API server's `vm.create`
//! bodies, which libvirt's driver derives from a domain), each converting into a [`VmSpec`]
//! without going through another's text. [`VmSpec::to_config`] is the one place it is checked
//! and turned into the [`crate::builder::VmConfig`] the builder makes a VM of (files read,
//! workloads planned, remote memory set up).
//!
//! A problem is a [`SpecError`] naming a [`Field`]; each front door spells the field its own
//! way ([`FieldNames`]: [`CliNames`], [`domain::DomainNames`], the API's JSON paths), so an
//! operator reads the name of the thing they wrote.

mod config;
pub mod domain;
mod field;
mod stored;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use farvm_devices::serial::{SerialIn, SerialOut};
pub use farvm_memclient::{Endpoint, Transport};
use serde::{Deserialize, Serialize};

pub use field::{CliNames, Field, FieldNames, SpecError, SpecErrorKind};

use crate::devices::board::{DiskConfig, NetConfig};
use crate::remote::PageSpace;

/// Everything that describes one VM. [`Default`] is `farvm run` with no options: the built-in
/// test guest, 512 MiB, one vCPU, console on stdout, remote memory at 50% local on an embedded
/// memory server. A snapshot's manifest stores it as JSON (`crate::snapshot`); memory
/// servers are their URL text there (farvm-transport's serde form, which the pool enables).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct VmSpec {
    /// The VM's name [`None`: `farvm-PID`].
    pub name: Option<String>,
    /// A UUID to report back (libvirt's); farvm does not use it.
    pub uuid: Option<String>,
    /// Guest RAM, bytes.
    pub memory: u64,
    /// vCPUs.
    pub vcpus: u32,
    /// The kernel file [`None`: the built-in test guest].
    pub kernel: Option<PathBuf>,
    /// Linux's initial ramdisk.
    pub initrd: Option<PathBuf>,
    /// The kernel command line (for the test guest, `farvm.workload=SPEC` words add
    /// workloads).
    pub cmdline: Option<String>,
    /// Boot an ELF kernel as Linux (implied by an initrd or command line unless the ELF is the
    /// test guest).
    pub force_linux: bool,
    /// The test guest's workloads, one process each (`NAME[:key=value,...]`).
    pub workloads: Vec<String>,
    /// The test guest's own knobs.
    pub test_guest: TestGuestOptions,
    /// Where the console's output goes.
    pub serial: SerialOut,
    /// Where its input comes from [`None`: stdin for Linux, nothing for the test guest].
    pub serial_in: Option<SerialIn>,
    /// Disks (Linux guests; virtio-blk, `/dev/vda`, ... in order).
    pub disks: Vec<DiskConfig>,
    /// Network interfaces (Linux guests; virtio-net on taps, after the disks).
    pub nets: Vec<NetConfig>,
    /// Echo the guest's PV log lines on stderr.
    pub echo_guest_logs: bool,
    /// KVM's async page faults.
    pub async_pf: AsyncPf,
    /// Serve Prometheus metrics here.
    pub metrics: Option<SocketAddr>,
    /// All guest RAM local: no paging engine, no memory server (`remote` then does not
    /// apply).
    pub local_only: bool,
    /// Remote memory.
    pub remote: RemoteOptions,
}

impl Default for VmSpec {
    fn default() -> Self {
        Self {
            name: None,
            uuid: None,
            memory: 512 << 20,
            vcpus: 1,
            kernel: None,
            initrd: None,
            cmdline: None,
            force_linux: false,
            workloads: Vec::new(),
            test_guest: TestGuestOptions::default(),
            serial: SerialOut::Stdout,
            serial_in: None,
            disks: Vec::new(),
            nets: Vec::new(),
            echo_guest_logs: false,
            async_pf: AsyncPf::Auto,
            metrics: None,
            local_only: false,
            remote: RemoteOptions::default(),
        }
    }
}

/// The built-in test guest's knobs (ignored for Linux).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TestGuestOptions {
    /// LAPIC timer frequency for preemption (0: cooperative only).
    pub timer_hz: u32,
    /// Seed of the physical-frame free-list shuffle (0: ascending).
    pub frame_shuffle_seed: u64,
    /// Hand out frames in runs of 2^SHIFT [`None`: 9 with remote memory, else 0].
    pub frame_run_shift: Option<u32>,
    /// Premap each process's heap at start.
    pub premap: bool,
    /// Demand-page the heap 4 KiB per fault instead of 2 MiB.
    pub demand_4k: bool,
}

impl Default for TestGuestOptions {
    fn default() -> Self {
        Self {
            timer_hz: 100,
            frame_shuffle_seed: 1,
            frame_run_shift: None,
            premap: false,
            demand_4k: false,
        }
    }
}

/// KVM's async page faults (see `farvm run --help`, `--kvm-async-pf`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AsyncPf {
    /// Off for a paged test guest (its faults are attributed to guest processes), KVM's
    /// default for local RAM and Linux guests (which idle with HLT).
    Auto,
    /// KVM's default: on.
    Keep,
    /// Off, for a Linux guest too.
    Off,
}

/// Remote memory: where the pages live and how the engine pages them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteOptions {
    /// Memory servers, each with its transport [empty, and no `pool`: an embedded server on
    /// loopback].
    pub servers: Vec<Endpoint>,
    /// A memory pool's etcd endpoints, instead of a server list [empty: no pool].
    pub pool: Vec<String>,
    /// How a VM joins a pool (used when `pool` is not empty).
    pub pool_options: PoolOptions,
    /// RDMA servers' pages move by one-sided READ/WRITE, else as SEND/RECV.
    pub rdma_one_sided: bool,
    /// Copies of each remote page [`None`: 2 with two or more servers or a pool, else 1].
    pub replicas: Option<usize>,
    /// The tenant secret for the memory servers.
    pub token_file: Option<PathBuf>,
    /// How much of guest RAM may be resident locally.
    pub local_memory: farvm_ept::Budget,
    /// Prefetcher name (`farvm_prefetch::registry::names()`).
    pub prefetcher: String,
    /// Every N-th injected prefetch stays a probe (0: none).
    pub probe_every: u32,
    /// Page numbers the prefetcher learns from.
    pub page_space: PageSpace,
    /// Guest RAM's backing [`None`: the engine's default].
    pub guest_memory: Option<farvm_ept::GuestMemory>,
    /// Stage-2 pre-fault of injected pages.
    pub stage2_prefault: bool,
    /// One prefetch history for the whole guest even with an agent.
    pub global_history: bool,
    /// Pin the fault path to this host CPU.
    pub fault_path_cpu: Option<usize>,
    /// Record resolved faults (for `--fault-log`).
    pub fault_log: bool,
    /// Seal pages before they leave the VMM (docs/sealing.md).
    pub page_encryption: bool,
    /// The page key's file [`None`: a key drawn for this run].
    pub memory_key_file: Option<PathBuf>,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        Self {
            servers: Vec::new(),
            pool: Vec::new(),
            pool_options: PoolOptions::default(),
            rdma_one_sided: true,
            replicas: None,
            token_file: None,
            local_memory: farvm_ept::Budget::Percent(50.0),
            prefetcher: farvm_prefetch::registry::DEFAULT.to_string(),
            probe_every: crate::remote::DEFAULT_PROBE_EVERY,
            page_space: PageSpace::Virtual,
            guest_memory: None,
            stage2_prefault: true,
            global_history: false,
            fault_path_cpu: None,
            fault_log: false,
            page_encryption: true,
            memory_key_file: None,
        }
    }
}

/// How a VM joins a memory pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolOptions {
    /// The VM's lease TTL.
    pub lease_ttl: Duration,
    /// The slab size, bytes: a multiple of 4 KiB [`None`: fitted to the VM's remote share].
    pub slab_bytes: Option<u64>,
    /// How long to wait for etcd at start.
    pub wait: Duration,
    /// This host's name in the pool [`None`: the kernel's host name].
    pub host: Option<String>,
    /// The transport to reach the pool's servers by, where a server offers it (TCP
    /// otherwise); RDMA's page mode is [`RemoteOptions::rdma_one_sided`].
    #[serde(with = "stored::transport")]
    pub transport: Transport,
}

impl Default for PoolOptions {
    /// `farvm run --pool`'s: a 10 s lease, slabs fitted to the VM, up to 300 s waiting for
    /// etcd.
    fn default() -> Self {
        Self {
            lease_ttl: Duration::from_secs(10),
            slab_bytes: None,
            wait: Duration::from_secs(300),
            host: None,
            transport: Transport::Tcp,
        }
    }
}
