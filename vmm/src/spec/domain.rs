//! A libvirt domain (with the host config merged in, `farvm_vmconfig::merge`) as a
//! [`VmSpec`]: the fields a domain decides, and how its errors name them (element and line,
//! or the host-config key).

use farvm_devices::serial::SerialOut;
use farvm_vmconfig::domain::{Disk, Interface, Lines};
use farvm_vmconfig::{Domain, HostConfig, LocalShare, Serial, Servers, VmSettings};

use super::{CliNames, Endpoint, Field, FieldNames, SpecError, VmSpec};
use crate::devices::board::{DiskConfig, NetConfig};

/// Names fields as the domain XML (and the host config under it) spells them.
#[derive(Clone, Debug, Default)]
pub struct DomainNames {
    lines: Lines,
}

impl DomainNames {
    /// Names for `domain` (its elements' lines, where it was parsed from text).
    pub fn of(domain: &Domain) -> Self {
        Self {
            lines: domain.lines.clone(),
        }
    }
}

fn element(tag: &str, line: Option<u32>) -> String {
    match line {
        Some(l) => format!("{tag} (line {l})"),
        None => tag.to_string(),
    }
}

impl FieldNames for DomainNames {
    fn name(&self, field: Field) -> String {
        let l = &self.lines;
        // The remote-memory settings come from farvm's metadata element or, below it, the
        // host config: both spellings are named.
        let remote = |xml: &str, toml: &str| {
            format!(
                "{} or the host config's {toml}",
                element(&format!("<farvm:{xml}>"), l.remote_memory)
            )
        };
        match field {
            Field::Name => element("<name>", l.name),
            Field::Memory => element("<memory>", l.memory),
            Field::Vcpus => element("<vcpu>", l.vcpu),
            Field::Kernel => element("<os><kernel>", l.kernel),
            Field::Initrd => element("<os><initrd>", l.initrd),
            Field::Cmdline => element("<os><cmdline>", l.cmdline),
            Field::Workloads => element("<os><cmdline> farvm.workload= words", l.cmdline),
            Field::Disks => match l.disks.first() {
                Some(first) => format!("<disk> (line {first})"),
                None => "<disk>".into(),
            },
            Field::Nets => match l.interfaces.first() {
                Some(first) => format!("<interface> (line {first})"),
                None => "<interface>".into(),
            },
            Field::LocalMemory => remote("local-memory", "local_memory"),
            Field::Prefetcher => remote("prefetcher", "prefetcher"),
            Field::Servers => remote("memserver>/<farvm:pool", "memservers/pool"),
            Field::Metrics => remote("metrics", "metrics"),
            // Not the domain's: farvm run's flags give them.
            Field::PoolSlab | Field::FaultPathCpu => CliNames.name(field),
        }
    }
}

fn budget(s: LocalShare) -> farvm_ept::Budget {
    match s {
        LocalShare::All => farvm_ept::Budget::Unlimited,
        LocalShare::Percent(p) => farvm_ept::Budget::Percent(p),
        LocalShare::Bytes(b) => farvm_ept::Budget::Bytes(b),
    }
}

/// The domain's disks in guest order (`vda`, `vdb`, ...): farvm attaches them in that order,
/// so the targets must run from `vda` without a gap.
fn disks(list: &[Disk]) -> Result<Vec<DiskConfig>, SpecError> {
    if Disk::target_of(list.len().saturating_sub(1)).is_none() {
        return Err(SpecError::invalid(
            Field::Disks,
            format!(
                "{} disks: farvm attaches at most 26 (vda to vdz)",
                list.len()
            ),
        ));
    }
    let mut sorted: Vec<&Disk> = list.iter().collect();
    sorted.sort_by(|a, b| a.target.cmp(&b.target));
    for (i, d) in sorted.iter().enumerate() {
        let want = Disk::target_of(i).unwrap_or_default();
        if d.target != want {
            return Err(SpecError::invalid(
                Field::Disks,
                format!(
                    "target {}: farvm attaches disks in order as vda, vdb, ...; this domain's \
                     targets need {want} {}",
                    d.target,
                    if i > 0 && sorted[i - 1].target == d.target {
                        "instead of a second one"
                    } else {
                        "first"
                    }
                ),
            ));
        }
    }
    Ok(sorted
        .into_iter()
        .map(|d| DiskConfig {
            path: d.source.clone(),
            read_only: d.readonly,
        })
        .collect())
}

/// The domain's interfaces, in document order (the guest's eth0, eth1, ...).
fn nets(list: &[Interface]) -> Vec<NetConfig> {
    list.iter()
        .map(|i| NetConfig {
            tap: i.tap.clone(),
            mac: i.mac,
            fd: None,
        })
        .collect()
}

impl VmSpec {
    /// Sets every field a domain decides from `domain` merged with `host`: name, UUID,
    /// memory, vCPUs, kernel, initrd, command line, console output, disks, network
    /// interfaces, metrics, and remote
    /// memory's servers (or pool, or local only), local share, prefetcher, replicas, token,
    /// page space, probes and the page key file (unless the caller already named one). The rest (workloads, timeouts, the engine's A/B knobs, a pool's
    /// lease and slab) stays as the caller set it.
    pub fn apply_domain(&mut self, domain: &Domain, host: &HostConfig) -> Result<(), SpecError> {
        self.apply_settings(&farvm_vmconfig::merge(domain, host))
    }

    /// [`VmSpec::apply_domain`] from already merged settings.
    pub fn apply_settings(&mut self, s: &VmSettings) -> Result<(), SpecError> {
        self.name = Some(s.name.clone());
        self.uuid = s.uuid.map(|u| u.to_string());
        self.memory = s.memory;
        self.vcpus = s.vcpus;
        self.kernel = s.kernel.clone();
        self.initrd = s.initrd.clone();
        self.cmdline = s.cmdline.clone();
        self.serial = match &s.serial {
            Serial::Null => SerialOut::None,
            Serial::File(p) => SerialOut::File(p.clone()),
            // farvm run has no pty of its own: a console meant for a terminal goes to its
            // standard output (the API server gives its VMs a real pty).
            Serial::Stdout | Serial::Pty => SerialOut::Stdout,
        };
        self.disks = disks(&s.disks)?;
        self.nets = nets(&s.interfaces);
        let r = &s.remote;
        self.metrics = r
            .metrics
            .as_deref()
            .map(|m| {
                m.parse().map_err(|_| {
                    SpecError::invalid(Field::Metrics, format!("`{m}` is not an ADDR:PORT"))
                })
            })
            .transpose()?;
        self.local_only = r.local_only;
        let remote = &mut self.remote;
        match &r.servers {
            Servers::Embedded => {
                remote.servers.clear();
                remote.pool.clear();
            }
            Servers::Memservers(list) => {
                remote.servers = list
                    .iter()
                    .map(|a| Endpoint::parse(a))
                    .collect::<Result<_, _>>()
                    .map_err(|e| SpecError::invalid(Field::Servers, e.to_string()))?;
                remote.pool.clear();
            }
            Servers::Pool(p) => {
                if let Some(n) = &p.name {
                    return Err(SpecError::invalid(
                        Field::Servers,
                        format!(
                            "pool name `{n}`: farvm's pools are not named (one per etcd \
                             cluster); give its endpoints only"
                        ),
                    ));
                }
                // The domain says which pool; how to join it (lease, slab, wait) stays the
                // caller's (farvm run's flags).
                remote.servers.clear();
                remote.pool = p.endpoints.clone();
            }
        }
        remote.local_memory = budget(r.local_memory);
        remote.prefetcher = r.prefetcher.clone();
        remote.replicas = r.replicas.map(|n| n as usize);
        remote.token_file = r.token_file.clone();
        // `--memory-key-file` on the command line wins over the host config's key file, which
        // applies only where pages are sealed.
        if remote.memory_key_file.is_none() && remote.page_encryption {
            remote.memory_key_file = r.memory_key_file.clone();
        }
        remote.page_space = r.page_space;
        remote.probe_every = r.probe_every.unwrap_or(crate::remote::DEFAULT_PROBE_EVERY);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farvm_vmconfig::Pool;

    fn domain(metadata: &str, devices: &str) -> Domain {
        let xml = format!(
            "<domain type='kvm'>\n<name>web-1</name>\n<memory unit='MiB'>256</memory>\n\
             <vcpu>2</vcpu>\n<os><type>hvm</type><kernel>/k.elf</kernel></os>\n\
             <devices>{devices}</devices>\n<metadata>{metadata}</metadata>\n</domain>\n"
        );
        Domain::parse(&xml).unwrap().domain
    }

    const NS: &str = "xmlns:farvm='https://farvm.dev/xmlns/domain/1'";

    /// The domain decides its fields, the caller keeps the rest (here: a pool's slab and
    /// workloads), and a pty console goes to stdout.
    #[test]
    fn a_domain_sets_what_it_decides_and_keeps_the_rest() {
        let mut spec = VmSpec {
            workloads: vec!["seq".into()],
            ..VmSpec::default()
        };
        spec.remote.pool = vec!["http://old:2379".into()];
        spec.remote.pool_options.slab_bytes = Some(64 << 20);
        spec.remote.probe_every = 7;
        let d = domain(
            &format!(
                "<farvm:remote-memory {NS}><farvm:pool><farvm:endpoint>http://e:2379</farvm:endpoint>\
                 </farvm:pool><farvm:local-memory>25%</farvm:local-memory>\
                 <farvm:metrics address='127.0.0.1:9300'/></farvm:remote-memory>"
            ),
            "<console type='pty'><target type='virtio'/></console>",
        );
        spec.apply_domain(&d, &HostConfig::default()).unwrap();
        assert_eq!(spec.name.as_deref(), Some("web-1"));
        assert_eq!((spec.memory, spec.vcpus), (256 << 20, 2));
        assert_eq!(spec.workloads, ["seq"]);
        assert_eq!(spec.serial, SerialOut::Stdout);
        assert_eq!(spec.metrics, Some("127.0.0.1:9300".parse().unwrap()));
        assert_eq!(spec.remote.pool, ["http://e:2379"]);
        assert_eq!(spec.remote.pool_options.slab_bytes, Some(64 << 20));
        assert_eq!(spec.remote.local_memory, farvm_ept::Budget::Percent(25.0));
        assert_eq!(spec.remote.probe_every, crate::remote::DEFAULT_PROBE_EVERY);
        assert!(spec.remote.servers.is_empty());
    }

    /// A domain without a kernel and nothing for the test guest to run is refused, naming
    /// <os><kernel> (where it is missing: the <os> line).
    #[test]
    fn a_domain_without_a_kernel_or_workloads_is_refused() {
        let d = Domain::parse(
            "<domain type='kvm'>\n<name>x</name>\n<memory unit='MiB'>128</memory>\n\
             <os>\n<type>hvm</type>\n</os>\n</domain>\n",
        )
        .unwrap()
        .domain;
        let mut spec = VmSpec::default();
        spec.apply_domain(&d, &HostConfig::default()).unwrap();
        let e = spec.to_config().unwrap_err();
        assert_eq!(
            e.render(&DomainNames::of(&d)),
            "<os><kernel> (line 4): none given, so farvm would boot its built-in test guest, \
             which has no workload to run: boot a kernel, or give the test guest workloads"
        );
        spec.workloads = vec!["seq:ws=8M".into()];
        spec.to_config().unwrap();
    }

    /// The host config's page key file applies where the caller named none and pages are
    /// sealed; `--memory-key-file` wins; with sealing off the host's key file is not used.
    #[test]
    fn the_host_key_file_applies_unless_the_command_line_names_one() {
        let host = HostConfig::parse(
            "[defaults]\nmemory_key_file = \"/etc/farvm/keys/default\"\n",
            std::path::Path::new("/etc/farvm/farvm.toml"),
        )
        .unwrap();
        let d = domain("", "");
        let mut spec = VmSpec::default();
        spec.apply_domain(&d, &host).unwrap();
        assert_eq!(
            spec.remote.memory_key_file.as_deref(),
            Some(std::path::Path::new("/etc/farvm/keys/default"))
        );
        let mut flagged = VmSpec::default();
        flagged.remote.memory_key_file = Some("/run/key".into());
        flagged.apply_domain(&d, &host).unwrap();
        assert_eq!(
            flagged.remote.memory_key_file.as_deref(),
            Some(std::path::Path::new("/run/key"))
        );
        let mut clear = VmSpec::default();
        clear.remote.page_encryption = false;
        clear.apply_domain(&d, &host).unwrap();
        assert_eq!(clear.remote.memory_key_file, None);
    }

    /// Disks go to the guest in target order; a gap in the targets is refused naming the
    /// first <disk>.
    #[test]
    fn disks_follow_their_targets() {
        let disk = |file: &str, dev: &str, ro: &str| {
            format!("<disk type='file'><source file='{file}'/><target dev='{dev}'/>{ro}</disk>")
        };
        let d = domain(
            "",
            &format!(
                "{}{}",
                disk("/b.img", "vdb", "<readonly/>"),
                disk("/a.img", "vda", "")
            ),
        );
        let mut spec = VmSpec::default();
        spec.apply_domain(&d, &HostConfig::default()).unwrap();
        assert_eq!(
            spec.disks,
            [
                DiskConfig {
                    path: "/a.img".into(),
                    read_only: false
                },
                DiskConfig {
                    path: "/b.img".into(),
                    read_only: true
                },
            ]
        );
        let d = domain(
            "",
            &format!("{}{}", disk("/a.img", "vda", ""), disk("/c.img", "vdc", "")),
        );
        let e = VmSpec::default()
            .apply_domain(&d, &HostConfig::default())
            .unwrap_err();
        assert_eq!(
            e.render(&DomainNames::of(&d)),
            "<disk> (line 6): target vdc: farvm attaches disks in order as vda, vdb, ...; this \
             domain's targets need vdb first"
        );
    }

    /// Interfaces become the VM's network devices in document order, with their MACs; the
    /// same from the API body's `net`; the test guest refuses them naming <interface>; an
    /// unsupported interface type is refused at parse time with its element and line.
    #[test]
    fn interfaces_become_network_devices() {
        let nic = |tap: &str, mac: &str| {
            format!("<interface type='ethernet'>{mac}<target dev='{tap}'/><model type='virtio'/></interface>")
        };
        let d = domain(
            "",
            &format!(
                "{}{}",
                nic("vnet3", "<mac address='52:54:00:0a:0b:0c'/>"),
                nic("vnet1", "")
            ),
        );
        let mut spec = VmSpec::default();
        spec.apply_domain(&d, &HostConfig::default()).unwrap();
        assert_eq!(
            spec.nets,
            [
                NetConfig {
                    tap: "vnet3".into(),
                    mac: Some([0x52, 0x54, 0, 0x0a, 0x0b, 0x0c]),
                    fd: None,
                },
                NetConfig {
                    tap: "vnet1".into(),
                    mac: None,
                    fd: None,
                },
            ]
        );
        // The built-in test guest has no network driver: refused, naming the first element.
        spec.kernel = None;
        spec.workloads = vec!["seq".into()];
        let e = spec.to_config().unwrap_err();
        assert_eq!(
            e.render(&DomainNames::of(&d)),
            "<interface> (line 6): network interfaces need a Linux guest: the test guest has no \
             network driver"
        );
        assert_eq!(CliNames.name(e.field), "--net");
        // The API body's net entries take the same road.
        let body = farvm_chapi::CreateSpec::parse(
            br#"{"kernel":{"path":"/k"},"net":[{"tap":"vnet7","mac":"52:54:00:00:00:07"}]}"#,
        )
        .unwrap();
        let mut spec = VmSpec::default();
        spec.apply_domain(&body.to_domain("x"), &HostConfig::default())
            .unwrap();
        assert_eq!(
            spec.nets,
            [NetConfig {
                tap: "vnet7".into(),
                mac: Some([0x52, 0x54, 0, 0, 0, 7]),
                fd: None,
            }]
        );
        // A bridge (or any type but a tap) is refused where the domain is read.
        let xml = "<domain type='kvm'>\n<name>x</name>\n<memory unit='MiB'>64</memory>\n\
                   <os><type>hvm</type><kernel>/k</kernel></os>\n<devices>\n\
                   <interface type='bridge'><source bridge='br0'/></interface>\n\
                   </devices>\n</domain>\n";
        let e = Domain::parse(xml).unwrap_err().to_string();
        assert!(
            e.starts_with(
                "domain XML line 6: <interface>: type='bridge': farvm attaches existing tap"
            ),
            "{e}"
        );
    }

    /// More disks than targets is refused by count, from the domain and from the API body.
    #[test]
    fn at_most_26_disks() {
        let d = domain(
            "",
            &(0..27)
                .map(|i| {
                    let t = Disk::target_of(i).unwrap_or_else(|| "vdz".into());
                    format!("<disk type='file'><source file='/{i}.img'/><target dev='{t}'/></disk>")
                })
                .collect::<String>(),
        );
        let e = VmSpec::default()
            .apply_domain(&d, &HostConfig::default())
            .unwrap_err();
        assert_eq!(
            e.problem,
            "27 disks: farvm attaches at most 26 (vda to vdz)"
        );
        let body = format!(
            r#"{{"kernel":{{"path":"/k"}},"disks":[{}]}}"#,
            (0..27)
                .map(|i| format!(r#"{{"path":"/{i}.img"}}"#))
                .collect::<Vec<_>>()
                .join(",")
        );
        let body = farvm_chapi::CreateSpec::parse(body.as_bytes()).unwrap();
        let e = VmSpec::default()
            .apply_domain(&body.to_domain("x"), &HostConfig::default())
            .unwrap_err();
        assert_eq!(
            e.problem,
            "27 disks: farvm attaches at most 26 (vda to vdz)"
        );
    }

    #[test]
    fn a_named_pool_and_a_bad_server_are_refused_by_the_domains_names() {
        let names = DomainNames::default();
        let mut s = VmSettings::clone(&farvm_vmconfig::merge(
            &domain("", ""),
            &HostConfig::default(),
        ));
        s.remote.servers = Servers::Pool(Pool {
            name: Some("rack-1".into()),
            endpoints: vec!["http://e:2379".into()],
        });
        let e = VmSpec::default().apply_settings(&s).unwrap_err();
        assert_eq!(e.field, Field::Servers);
        assert!(e.render(&names).contains("pool name `rack-1`"), "{e}");
        s.remote.servers = Servers::Memservers(vec!["no-port".into()]);
        let e = VmSpec::default().apply_settings(&s).unwrap_err();
        assert!(
            e.render(&names).starts_with(
                "<farvm:memserver>/<farvm:pool> or the host config's memservers/pool: `no-port`"
            ),
            "{}",
            e.render(&names)
        );
        let d = domain(&format!("<farvm:remote-memory {NS}><farvm:prefetcher>leap</farvm:prefetcher></farvm:remote-memory>"), "");
        assert_eq!(
            DomainNames::of(&d).name(Field::Prefetcher),
            "<farvm:prefetcher> (line 7) or the host config's prefetcher"
        );
        assert_eq!(DomainNames::of(&d).name(Field::Vcpus), "<vcpu> (line 4)");
    }
}
