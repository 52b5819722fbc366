//! One VM's settings, merged from its three sources, field by field:
//!
//! 1. the domain XML's farvm metadata element (`<farvm:remote-memory>`), then
//! 2. the host config's `[domain."NAME"]` section, then
//! 3. the host config's `[defaults]`, then
//! 4. farvm's built-in defaults (those of `farvm run`).
//!
//! The first source that sets a field decides it; the memory-server choice (a list of servers,
//! a pool, or the embedded server) counts as one field. The domain's own elements (name, memory,
//! vCPUs, kernel ...) come from the domain XML only. The VMM turns [`VmSettings`] into its VM
//! description (`farvm_vmm::spec::VmSpec::apply_domain`).

use std::path::PathBuf;

use crate::domain::{CharBackend, Domain, LifecycleAction, Uuid};
use crate::host::HostConfig;
use crate::remote::{LocalShare, PageSpace, Servers};

/// Where the guest's serial console goes (`farvm run --serial`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Serial {
    /// The VMM's standard output (`--serial stdout`).
    Stdout,
    /// A file (`--serial FILE`).
    File(PathBuf),
    /// Nowhere (`--serial none`): also what a domain without serial or console gets.
    Null,
    /// A pseudo-terminal, for libvirt's `<serial type='pty'>`/`<console type='pty'>` (under
    /// `farvm run`: its standard output).
    Pty,
}

/// Remote-memory settings after the merge.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteSettings {
    /// `--local-only`: all RAM local, no memory server (the other fields then do not apply).
    pub local_only: bool,
    /// `--memserver` (repeated), or the embedded server (no `--memserver`), or a pool.
    pub servers: Servers,
    /// `--local-memory` [default 50%].
    pub local_memory: LocalShare,
    /// `--prefetcher` [default `farvm_prefetch::registry::DEFAULT`].
    pub prefetcher: String,
    /// `--replicas` [`None`: farvm run's default, 2 with two or more servers, else 1].
    pub replicas: Option<u32>,
    /// `--memserver-token-file`.
    pub token_file: Option<PathBuf>,
    /// `--memory-key-file` (from the host config only).
    pub memory_key_file: Option<PathBuf>,
    /// `--page-space` [default virtual].
    pub page_space: PageSpace,
    /// `--probe-every` [`None`: farvm run's default].
    pub probe_every: Option<u32>,
    /// `--metrics ADDR:PORT`.
    pub metrics: Option<String>,
}

/// Everything farvm needs to run one domain.
#[derive(Clone, Debug, PartialEq)]
pub struct VmSettings {
    /// `--name`.
    pub name: String,
    /// The domain's UUID (no `farvm run` option; reported to libvirt).
    pub uuid: Option<Uuid>,
    /// `--memory`, bytes.
    pub memory: u64,
    /// `--vcpus`.
    pub vcpus: u32,
    /// `--kernel` [`None`: the built-in test guest].
    pub kernel: Option<PathBuf>,
    /// `--initrd`.
    pub initrd: Option<PathBuf>,
    /// `--cmdline` (for the test guest: its `farvm.workload=SPEC` words).
    pub cmdline: Option<String>,
    /// `--serial`: from `<serial>`, else `<console>`, else none.
    pub serial: Serial,
    /// `<disk>`s, in document order.
    pub disks: Vec<crate::domain::Disk>,
    /// `<interface>`s, in document order.
    pub interfaces: Vec<crate::domain::Interface>,
    /// What the manager does when the guest powers off, reboots or crashes (libvirt's defaults:
    /// destroy, restart, destroy).
    pub on_poweroff: LifecycleAction,
    /// See `on_poweroff`.
    pub on_reboot: LifecycleAction,
    /// See `on_poweroff`.
    pub on_crash: LifecycleAction,
    /// Remote memory: servers, local share, prefetcher.
    pub remote: RemoteSettings,
}

/// Merges a domain with the host config (see the module doc for the order).
pub fn merge(domain: &Domain, host: &HostConfig) -> VmSettings {
    let host_layer = host.for_domain(&domain.name);
    let o = match &domain.farvm {
        Some(d) => d.or(&host_layer),
        None => host_layer,
    };
    let serial = match domain.serial.as_ref().or(domain.console.as_ref()) {
        None => Serial::Null,
        Some(dev) => match &dev.backend {
            CharBackend::Pty => Serial::Pty,
            CharBackend::File(p) => Serial::File(p.clone()),
            CharBackend::Null => Serial::Null,
            CharBackend::Stdio => Serial::Stdout,
        },
    };
    VmSettings {
        name: domain.name.clone(),
        uuid: domain.uuid,
        memory: domain.memory,
        vcpus: domain.vcpus,
        kernel: domain.os.kernel.clone(),
        initrd: domain.os.initrd.clone(),
        cmdline: domain.os.cmdline.clone(),
        serial,
        disks: domain.disks.clone(),
        interfaces: domain.interfaces.clone(),
        on_poweroff: domain.on_poweroff.unwrap_or(LifecycleAction::Destroy),
        on_reboot: domain.on_reboot.unwrap_or(LifecycleAction::Restart),
        on_crash: domain.on_crash.unwrap_or(LifecycleAction::Destroy),
        remote: RemoteSettings {
            local_only: o.local_only.unwrap_or(false),
            servers: o.servers.unwrap_or(Servers::Embedded),
            local_memory: o.local_memory.unwrap_or(LocalShare::Percent(50.0)),
            prefetcher: o
                .prefetcher
                .unwrap_or_else(|| farvm_prefetch::registry::DEFAULT.to_string()),
            replicas: o.replicas,
            token_file: o.token_file,
            memory_key_file: o.memory_key_file,
            page_space: o.page_space.unwrap_or(PageSpace::Virtual),
            probe_every: o.probe_every,
            metrics: o.metrics,
        },
    }
}
