//! libvirt domains into `farvm run` arguments — one translation for `farvm run --domain
//! FILE.xml` and for the VMs the API server creates (libvirt's `vm.create` bodies, turned into
//! a domain by `farvm_chapi`): domain + host config → `VmSettings` (farvm-vmconfig's merge) →
//! the `farvm run` command line it stands for (`VmSettings::to_run_args`) → [`RunArgs`].
//!
//! With `--domain`, the domain decides the options in [`DOMAIN_DECIDES`]; giving one of them on
//! the command line as well is an error (clap's conflict message names both). Every other
//! option applies as usual.

use std::path::Path;

use clap::Parser;
use farvm_vmconfig::{merge, Domain, HostConfig, VmSettings};
use farvm_vmm::exit_code;

use super::run::RunArgs;
use super::Failure;

/// The `farvm run` options a domain decides (clap ids of [`RunArgs`] fields).
pub const DOMAIN_DECIDES: &[&str] = &[
    "name",
    "memory",
    "vcpus",
    "kernel",
    "initrd",
    "cmdline",
    "serial",
    "metrics",
    "local_only",
    "memservers",
    "replicas",
    "memserver_token_file",
    "prefetcher",
    "probe_every",
    "page_space",
    "local_memory",
];

/// `farvm run`'s options alone, to parse a domain's arguments.
#[derive(Parser, Debug)]
#[command(name = "farvm run", no_binary_name = true)]
struct RunOnly {
    #[command(flatten)]
    args: RunArgs,
}

fn usage(m: String) -> Failure {
    Failure::new(exit_code::USAGE, m)
}

/// The `farvm run` arguments that run `settings`.
pub fn run_args(settings: &VmSettings) -> Result<RunArgs, Failure> {
    let args = settings.to_run_args().map_err(|e| usage(e.to_string()))?;
    RunOnly::try_parse_from(&args).map(|r| r.args).map_err(|e| {
        usage(format!(
            "the domain's settings are not valid farvm options ({}): {}",
            args.join(" "),
            e.render().to_string().trim()
        ))
    })
}

/// Reads the domain XML file `path` (printing its warnings) and merges the host config.
pub fn load(path: &Path) -> Result<VmSettings, Failure> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        Failure::new(
            exit_code::NO_INPUT,
            format!("cannot read domain XML {}: {e}", path.display()),
        )
    })?;
    let parsed = Domain::parse(&text).map_err(|e| usage(format!("{}: {e}", path.display())))?;
    for w in &parsed.warnings {
        eprintln!("farvm: warning: {}: {w}", path.display());
    }
    let host = HostConfig::load_default().map_err(|e| usage(format!("host config: {e}")))?;
    Ok(merge(&parsed.domain, &host))
}

/// `user`'s arguments with the domain in `path` deciding [`DOMAIN_DECIDES`]; also the domain's
/// UUID.
pub fn resolve(user: RunArgs, path: &Path) -> Result<(RunArgs, Option<String>), Failure> {
    let settings = load(path)?;
    let from_domain = run_args(&settings)?;
    let args = overlay(user, from_domain)?;
    Ok((args, settings.uuid.map(|u| u.to_string())))
}

/// `user` with every option in [`DOMAIN_DECIDES`] taken from `d`.
fn overlay(user: RunArgs, d: RunArgs) -> Result<RunArgs, Failure> {
    if d.local_only && user.fault_path_cpu.is_some() {
        return Err(usage(
            "--fault-path-cpu needs remote memory, but the domain keeps all its RAM local \
             (local-only)"
                .into(),
        ));
    }
    Ok(RunArgs {
        name: d.name,
        memory: d.memory,
        vcpus: d.vcpus,
        kernel: d.kernel,
        initrd: d.initrd,
        cmdline: d.cmdline,
        serial: d.serial,
        metrics: d.metrics,
        local_only: d.local_only,
        memservers: d.memservers,
        replicas: d.replicas,
        memserver_token_file: d.memserver_token_file,
        prefetcher: d.prefetcher,
        probe_every: d.probe_every,
        page_space: d.page_space,
        local_memory: d.local_memory,
        ..user
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use farvm_vmconfig::{LocalShare, PageSpace, RemoteSettings, Serial, Servers};

    fn settings(local_only: bool) -> VmSettings {
        VmSettings {
            name: "web-1".into(),
            uuid: None,
            memory: 3 << 30,
            vcpus: 3,
            kernel: Some("/k".into()),
            initrd: Some("/i".into()),
            cmdline: Some("console=ttyS0".into()),
            serial: Serial::File("/log".into()),
            on_poweroff: farvm_vmconfig::domain::LifecycleAction::Destroy,
            on_reboot: farvm_vmconfig::domain::LifecycleAction::Restart,
            on_crash: farvm_vmconfig::domain::LifecycleAction::Destroy,
            remote: RemoteSettings {
                local_only,
                servers: Servers::Memservers(vec!["127.0.0.1:7070".into()]),
                local_memory: LocalShare::Percent(25.0),
                prefetcher: "stride".into(),
                replicas: Some(1),
                token_file: Some("/t".into()),
                page_space: PageSpace::Physical,
                probe_every: Some(7),
                metrics: Some("127.0.0.1:9300".into()),
            },
        }
    }

    /// Every option the domain decides is copied: overlaying a domain onto a bare command
    /// line gives exactly the domain's own arguments.
    #[test]
    fn the_domain_decides_every_option_it_sets() {
        for local_only in [false, true] {
            let d = run_args(&settings(local_only)).unwrap();
            let bare = RunOnly::try_parse_from(["--domain", "x.xml"]).unwrap().args;
            let mut got = overlay(bare, run_args(&settings(local_only)).unwrap()).unwrap();
            got.domain = None;
            assert_eq!(format!("{got:?}"), format!("{d:?}"));
        }
    }

    /// Each of those options conflicts with --domain on the command line.
    #[test]
    fn options_the_domain_decides_conflict_with_it() {
        let cmd = RunOnly::command();
        for id in DOMAIN_DECIDES {
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_id() == *id)
                .unwrap_or_else(|| panic!("no option {id}"));
            let long = format!("--{}", arg.get_long().unwrap());
            let mut argv = vec!["--domain".to_string(), "d.xml".into(), long.clone()];
            if arg.get_action().takes_values() {
                argv.push(
                    match *id {
                        "memory" => "1G",
                        "vcpus" | "replicas" | "probe_every" => "1",
                        "memservers" | "metrics" => "127.0.0.1:1",
                        "page_space" => "virtual",
                        _ => "x",
                    }
                    .into(),
                );
            }
            let e = RunOnly::try_parse_from(&argv).unwrap_err();
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{long}: {e}"
            );
            assert!(e.to_string().contains("--domain"), "{e}");
        }
        RunOnly::try_parse_from(["--domain", "d.xml", "--workload", "seq", "--json"]).unwrap();
    }

    #[test]
    fn a_local_only_domain_refuses_a_fault_path_cpu() {
        let user = RunOnly::try_parse_from(["--fault-path-cpu", "0"])
            .unwrap()
            .args;
        let e = overlay(user, run_args(&settings(true)).unwrap()).unwrap_err();
        assert!(e.message.contains("local-only"), "{e}");
    }

    #[test]
    fn domain_files_give_settings_or_errors_naming_the_line() {
        let dir = std::env::temp_dir().join(format!("farvm-domain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.xml");
        std::fs::write(
            &bad,
            "<domain type='kvm'>\n<name>x</name>\n<memory>65536</memory>\n<vcpu>0</vcpu>\n</domain>\n",
        )
        .unwrap();
        let e = load(&bad).unwrap_err();
        assert_eq!(e.code, exit_code::USAGE);
        assert!(
            e.message.contains("line 4") && e.message.contains("<vcpu>"),
            "{e}"
        );
        let e = load(&dir.join("missing.xml")).unwrap_err();
        assert_eq!(e.code, exit_code::NO_INPUT);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
