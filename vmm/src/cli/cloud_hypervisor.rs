//! farvm started under the name `cloud-hypervisor`: libvirt's Cloud Hypervisor ("ch") driver
//! looks its VMM up as `cloud-hypervisor` on PATH and first asks it `--version`, expecting
//! `cloud-hypervisor vMAJOR.MINOR.MICRO` (anything may follow; MAJOR at least 15) at the very
//! start of stdout. farvm answers with the Cloud Hypervisor API level it speaks. Then it runs
//! each domain as `cloud-hypervisor --api-socket fd=N`: farvm's API server ([`super::api`]).

use std::ffi::OsString;
use std::path::Path;

use farvm_vmm::exit_code;

/// The name libvirt's ch driver looks for on PATH.
pub const PROGRAM_NAME: &str = "cloud-hypervisor";

/// The Cloud Hypervisor release whose REST API dialect farvm speaks.
pub const API_VERSION: &str = farvm_chapi::API_LEVEL;

/// The `--version` line, e.g. `cloud-hypervisor v27.0.0 (farvm 0.1.0)`.
pub fn version_line() -> String {
    format!(
        "{PROGRAM_NAME} v{API_VERSION} (farvm {})",
        env!("CARGO_PKG_VERSION")
    )
}

/// Was farvm started as `cloud-hypervisor` (argv[0]'s file name)?
pub fn invoked_as_cloud_hypervisor(argv0: &OsString) -> bool {
    Path::new(argv0).file_name() == Some(PROGRAM_NAME.as_ref())
}

/// When farvm runs as `cloud-hypervisor`, answers the command line and returns the exit status;
/// otherwise `None` (farvm's own command line follows).
pub fn answer(args: &[OsString]) -> Option<i32> {
    let (argv0, rest) = args.split_first()?;
    if !invoked_as_cloud_hypervisor(argv0) {
        return None;
    }
    if rest.len() == 1 && (rest[0] == "--version" || rest[0] == "-V") {
        println!("{}", version_line());
        return Some(exit_code::OK);
    }
    // A VMM: its sockets' peers may go away (see `signals::ignore_sigpipe`).
    farvm_vmm::signals::ignore_sigpipe();
    Some(super::api::run_as_cloud_hypervisor(args))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check libvirt's `chExtractVersion` makes: the prefix, then major.minor.micro with
    /// minor and micro below 1000, and at least v15.0.0.
    fn libvirt_accepts(out: &str) -> bool {
        let Some(rest) = out.strip_prefix("cloud-hypervisor v") else {
            return false;
        };
        let digits: Vec<&str> = rest
            .split(|c: char| !c.is_ascii_digit() && c != '.')
            .next()
            .unwrap_or("")
            .splitn(3, '.')
            .collect();
        let n: Vec<u64> = digits.iter().filter_map(|d| d.parse().ok()).collect();
        n.len() == 3 && n[1] < 1000 && n[2] < 1000 && n[0] >= 15
    }

    #[test]
    fn version_line_is_what_libvirt_parses() {
        let line = version_line();
        assert!(libvirt_accepts(&line), "{line}");
        assert!(line.ends_with(&format!("(farvm {})", env!("CARGO_PKG_VERSION"))));
    }

    #[test]
    fn only_the_cloud_hypervisor_name_is_answered() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(answer(&args(&["/usr/bin/farvm", "--version"])), None);
        assert_eq!(
            answer(&args(&["/x/cloud-hypervisor", "--version"])),
            Some(0)
        );
        assert_eq!(answer(&args(&["cloud-hypervisor", "-V"])), Some(0));
        assert_eq!(answer(&[]), None);
    }
}
