//! The factory `farvm`'s API server runs: a `vm.create` body becomes a libvirt-style domain
//! (`CreateSpec::to_domain`), the host config's remote-memory settings are merged in, and the
//! result is the VM's [`VmSpec`]; its errors name the body's JSON fields ([`ApiNames`]).

use farvm_chapi::{ApiError, CreateSpec};
use farvm_httpd::Listen;
use farvm_vmconfig::HostConfig;

use super::{Prepared, VmFactory};
use crate::spec::{Field, FieldNames, VmSpec};

/// Names fields as the `vm.create` body spells them (Cloud Hypervisor's `VmConfig`); what the
/// body cannot set comes from the host config and is named there.
pub struct ApiNames;

impl FieldNames for ApiNames {
    fn name(&self, field: Field) -> String {
        match field {
            Field::Name => "the VM's name (its API socket's)",
            Field::Memory => "memory.size",
            Field::Vcpus => "cpus.boot_vcpus",
            Field::Kernel => "kernel.path",
            Field::Initrd => "initramfs.path",
            Field::Cmdline => "cmdline.args",
            Field::Workloads => "cmdline.args (its farvm.workload= words)",
            Field::Disks => "disks",
            Field::Nets => "net",
            Field::LocalMemory => "the host config's local_memory",
            Field::Prefetcher => "the host config's prefetcher",
            Field::Servers => "the host config's memservers/pool",
            Field::Metrics => "the host config's metrics",
            Field::PoolSlab => "the pool's slab size",
            Field::FaultPathCpu => "the fault-path CPU",
        }
        .to_string()
    }
}

/// Turns `vm.create` bodies into VMs through the host config (`/etc/farvm/farvm.toml` or
/// `$FARVM_CONFIG`, read at each create).
pub struct HostFactory;

impl VmFactory for HostFactory {
    fn migration_key_file(&self, name: &str) -> Result<Option<std::path::PathBuf>, ApiError> {
        Ok(host_config("migrate")?.for_domain(name).migration_key_file)
    }

    fn snapshot_key_file(&self, name: &str) -> Result<Option<std::path::PathBuf>, ApiError> {
        Ok(host_config("snapshot")?.for_domain(name).snapshot_key_file)
    }

    fn prepare(&self, name: &str, body: &CreateSpec) -> Result<Prepared, ApiError> {
        let host = HostConfig::load_default().map_err(|e| ApiError::Failed {
            action: "create",
            reason: format!("the host config: {e}"),
        })?;
        let mut spec = VmSpec::default();
        // A kernel or initrd the body names but this host cannot read is still the body's to
        // fix (400), as a malformed one is.
        let bad = |e: crate::spec::SpecError| ApiError::BadConfig(e.render(&ApiNames));
        spec.apply_domain(&body.to_domain(name), &host)
            .map_err(bad)?;
        let config = spec.to_config().map_err(bad)?;
        let file = host
            .path
            .as_ref()
            .map_or("built-in defaults".into(), |p| p.display().to_string());
        let section = if host.domains.contains_key(name) {
            format!("[domain.\"{name}\"]")
        } else {
            "[defaults]".into()
        };
        let remote = match &config.remote {
            None => "all RAM local".to_string(),
            Some(r) => format!(
                "remote memory, local {}, prefetcher {}, {}",
                spec.remote.local_memory,
                r.prefetcher,
                if let Some(p) = &r.pool {
                    format!("pool {}", p.endpoints.join(","))
                } else if r.servers.is_empty() {
                    "embedded memory server".to_string()
                } else {
                    format!("{} memory server(s)", r.servers.len())
                }
            ),
        };
        Ok(Prepared {
            metrics: spec.metrics.map(Listen::Tcp),
            notes: vec![format!("host config {file}, section {section}: {remote}")],
            config,
            spec,
        })
    }
}

/// The host config, read now (for `action`'s error).
fn host_config(action: &'static str) -> Result<HostConfig, ApiError> {
    HostConfig::load_default().map_err(|e| ApiError::Failed {
        action,
        reason: format!("the host config: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The description a body makes, checked: a problem names the body's JSON field.
    fn prepare_with_defaults(body: &str) -> Result<crate::builder::VmConfig, String> {
        let body = CreateSpec::parse(body.as_bytes()).map_err(|e| e.to_string())?;
        let mut spec = VmSpec::default();
        spec.apply_domain(&body.to_domain("web-1"), &HostConfig::default())
            .map_err(|e| e.render(&ApiNames))?;
        spec.to_config().map_err(|e| e.render(&ApiNames))
    }

    #[test]
    fn api_errors_name_the_bodys_fields() {
        let dir = std::env::temp_dir().join(format!("farvm-factory-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let k = dir.join("guest.elf");
        std::fs::write(&k, crate::builtin::test_guest_elf()).unwrap();
        let k = k.display();
        let body = |extra: &str| {
            format!(r#"{{"kernel":{{"path":"{k}"}},"memory":{{"size":268435456}}{extra}}}"#)
        };
        let cfg = prepare_with_defaults(&body(
            r#","cpus":{"boot_vcpus":2,"max_vcpus":2},"cmdline":{"args":"farvm.workload=seq:ws=8M"}"#,
        ))
        .unwrap();
        assert_eq!(
            (cfg.vcpus, cfg.mem_bytes, cfg.name.as_str()),
            (2, 256 << 20, "web-1")
        );
        let e = prepare_with_defaults(&body(r#","cpus":{"boot_vcpus":32,"max_vcpus":32}"#))
            .unwrap_err();
        assert!(
            e.starts_with("cpus.boot_vcpus: 32 vCPUs is more than the test guest"),
            "{e}"
        );
        let e = prepare_with_defaults(&body(r#","cmdline":{"args":"farvm.workload=seq:ws=1G"}"#))
            .unwrap_err();
        assert!(
            e.starts_with("memory.size: the workloads' working sets add up to 1G"),
            "{e}"
        );
        let e = prepare_with_defaults(&body(r#","disks":[{"path":"/d.img"}]"#)).unwrap_err();
        assert!(e.starts_with("disks: disks need a Linux guest"), "{e}");
        let e = prepare_with_defaults(&body(r#","net":[{"tap":"vnet0"}]"#)).unwrap_err();
        assert!(
            e.starts_with("net: network interfaces need a Linux guest"),
            "{e}"
        );
        let e = prepare_with_defaults(&body(r#","net":[{"fds":[5]}]"#)).unwrap_err();
        assert!(e.contains("net[0].fds"), "{e}");
        let e = prepare_with_defaults(&body("")).unwrap_err();
        assert!(
            e.starts_with("cmdline.args (its farvm.workload= words): farvm's test guest has no"),
            "{e}"
        );
        let e = prepare_with_defaults(r#"{"kernel":{"path":"/nonexistent/k"}}"#).unwrap_err();
        assert!(
            e.starts_with("kernel.path: cannot read /nonexistent/k"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
