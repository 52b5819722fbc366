//! `farvm run --domain FILE.xml`: the domain file read (its warnings printed), the host config
//! merged, and the fields a domain decides set on the VM's description
//! (`VmSpec::apply_domain`). Errors found later in the description name the domain's elements
//! ([`DomainNames`]).

use std::path::Path;

use farvm_vmconfig::{Domain, HostConfig};
use farvm_vmm::exit_code;
use farvm_vmm::spec::domain::DomainNames;
use farvm_vmm::spec::VmSpec;

use super::Failure;

fn usage(m: String) -> Failure {
    Failure::new(exit_code::USAGE, m)
}

/// Reads the domain XML file `path` (printing its warnings), merges the host config and
/// applies both to `spec`; returns how the domain names the fields.
pub fn apply(spec: &mut VmSpec, path: &Path) -> Result<DomainNames, Failure> {
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
    let names = DomainNames::of(&parsed.domain);
    spec.apply_domain(&parsed.domain, &host)
        .map_err(|e| usage(format!("{}: {}", path.display(), e.render(&names))))?;
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Args, Command, Parser};

    use crate::cli::run::{spec_failure, RunArgs, VmArgs};

    #[derive(Parser)]
    #[command(no_binary_name = true)]
    struct Cli {
        #[command(flatten)]
        run: RunArgs,
    }

    /// Every option describing the VM conflicts with --domain on the command line (clap names
    /// both); the others apply with it.
    #[test]
    fn options_describing_the_vm_conflict_with_a_domain() {
        let described = VmArgs::augment_args(Command::new("vm"));
        let mut checked = 0;
        for arg in described.get_arguments() {
            let long = format!("--{}", arg.get_long().unwrap());
            let mut argv = vec!["--domain".to_string(), "d.xml".into(), long.clone()];
            if arg.get_action().takes_values() {
                argv.push(
                    match arg.get_id().as_str() {
                        "memory" => "1G",
                        "vcpus" | "replicas" | "probe_every" => "1",
                        "memservers" | "metrics" => "127.0.0.1:1",
                        "page_space" => "virtual",
                        "page_encryption" => "on",
                        "local_memory" => "25%",
                        "pool" => "http://127.0.0.1:2379",
                        "nets" => "tap=t0",
                        _ => "x",
                    }
                    .into(),
                );
            }
            let e = Cli::try_parse_from(&argv)
                .err()
                .unwrap_or_else(|| panic!("{long} accepted"));
            assert_eq!(
                e.kind(),
                clap::error::ErrorKind::ArgumentConflict,
                "{long}: {e}"
            );
            assert!(e.to_string().contains("--domain"), "{e}");
            checked += 1;
        }
        assert!(checked >= 15, "only {checked} options describe the VM");
        Cli::try_parse_from([
            "--domain",
            "d.xml",
            "--workload",
            "seq",
            "--json",
            "--timeout",
            "9",
        ])
        .unwrap();
    }

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// A problem found in the description after the domain was read names the element and
    /// its line; one in the file itself names its line too; a file that cannot be read is
    /// exit status 66.
    #[test]
    fn domain_errors_name_the_element_and_line() {
        let dir = std::env::temp_dir().join(format!("farvm-domain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kernel = write(&dir, "guest.elf", "");
        std::fs::write(&kernel, farvm_vmm::builtin::test_guest_elf()).unwrap();
        let many = write(
            &dir,
            "many.xml",
            &format!(
                "<domain type='kvm'>\n<name>x</name>\n<memory unit='MiB'>256</memory>\n\
                 <vcpu>32</vcpu>\n<os><type>hvm</type>\n<kernel>{}</kernel>\n</os>\n</domain>\n",
                kernel.display()
            ),
        );
        let mut spec = Cli::try_parse_from(["--domain", "many.xml"])
            .unwrap()
            .run
            .to_spec();
        let names = apply(&mut spec, &many).unwrap();
        assert_eq!((spec.vcpus, spec.memory), (32, 256 << 20));
        let e = spec_failure(&spec.to_config().unwrap_err(), &names);
        assert_eq!(e.code, exit_code::USAGE);
        assert!(
            e.message
                .starts_with("<vcpu> (line 4): 32 vCPUs is more than the test guest"),
            "{e}"
        );
        let missing = write(
            &dir,
            "missing-kernel.xml",
            "<domain type='kvm'>\n<name>x</name>\n<memory>65536</memory>\n<os>\n<type>hvm</type>\n\
             <kernel>/nonexistent/k.elf</kernel>\n</os>\n</domain>\n",
        );
        let mut spec = VmSpec::default();
        let names = apply(&mut spec, &missing).unwrap();
        let e = spec_failure(&spec.to_config().unwrap_err(), &names);
        assert_eq!(e.code, exit_code::NO_INPUT);
        assert!(
            e.message
                .starts_with("<os><kernel> (line 6): cannot read /nonexistent/k.elf"),
            "{e}"
        );
        let bad = write(
            &dir,
            "bad.xml",
            "<domain type='kvm'>\n<name>x</name>\n<memory>65536</memory>\n<vcpu>0</vcpu>\n</domain>\n",
        );
        let e = apply(&mut VmSpec::default(), &bad).unwrap_err();
        assert_eq!(e.code, exit_code::USAGE);
        assert!(
            e.message.contains("line 4") && e.message.contains("<vcpu>"),
            "{e}"
        );
        let e = apply(&mut VmSpec::default(), &dir.join("none.xml")).unwrap_err();
        assert_eq!(e.code, exit_code::NO_INPUT);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
