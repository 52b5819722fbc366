//! `farvm run --domain FILE.xml`: a libvirt domain run without libvirt. The domain decides the
//! VM (name, memory, vCPUs, kernel, workloads on the kernel command line) and, in farvm's
//! `<metadata>` element, its remote-memory settings; elements farvm does not have are warned
//! about by name and line; options the domain decides cannot be given as well.

mod common;
#[path = "common/guest_console.rs"]
mod guest_console;

use std::process::Command;

use common::kvm_available;
use farvm_vmm::exit_code;

const DOMAIN: &str = "<domain type='kvm'>
  <name>dr-1</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <metadata>
    <farvm:remote-memory xmlns:farvm=\"https://farvm.dev/xmlns/domain/1\">
      <farvm:local-memory>25%</farvm:local-memory>
    </farvm:remote-memory>
  </metadata>
  <os>
    <type arch='x86_64'>hvm</type>
    <kernel>KERNEL</kernel>
    <cmdline>farvm.workload=seq:ws=24M,passes=2</cmdline>
  </os>
  <devices>
    <console type='pty'><target type='virtio' port='0'/></console>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
  </devices>
</domain>
";

#[test]
fn a_domain_file_runs_the_guest_on_remote_memory() {
    if !kvm_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("farvm-domain-run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let kernel = dir.join("farvm-testguest.elf");
    std::fs::write(&kernel, farvm_vmm::builtin::test_guest_elf()).unwrap();
    let xml = dir.join("dr-1.xml");
    std::fs::write(&xml, DOMAIN.replace("KERNEL", kernel.to_str().unwrap())).unwrap();
    let config = dir.join("farvm.toml");
    std::fs::write(&config, "[defaults]\nlocal_memory = \"50%\"\n").unwrap();
    let farvm = || {
        let mut c = Command::new(env!("CARGO_BIN_EXE_farvm"));
        c.env("FARVM_CONFIG", &config).env("XDG_RUNTIME_DIR", &dir);
        c
    };

    let o = farvm()
        .args([
            "run",
            "--domain",
            xml.to_str().unwrap(),
            "--json",
            "--no-control-socket",
        ])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("line 17") && stderr.contains("<devices/rng>"),
        "the unsupported device is named: {stderr}"
    );
    // The pty console goes to stdout, then the JSON report.
    let (procs, end) = guest_console::parse(&stdout);
    assert_eq!(end, Some((1, 0, 0)), "{stdout}");
    guest_console::check_against_native(&["seq:ws=24M,passes=2"], 1, &procs);
    let report: serde_json::Value = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no JSON report in:\n{stdout}"));
    assert_eq!(report["name"], "dr-1");
    let engine = &report["paging"]["engine"];
    assert_eq!(engine["total_pages"], 64 * 256, "{engine}");
    assert_eq!(
        engine["budget_pages"],
        16 * 256,
        "the domain's metadata (25%) wins over the host config's defaults (50%)"
    );
    assert!(engine["counters"]["demand_faults"].as_u64().unwrap() > 0);

    // What the domain decides cannot be given on the command line too.
    let o = farvm()
        .args(["run", "--domain", xml.to_str().unwrap(), "--memory", "1G"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(exit_code::USAGE));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--domain"));

    // A disk the test guest cannot drive is refused naming the domain's <disk> and its line.
    let with_disk = dir.join("dr-1-disk.xml");
    std::fs::write(
        &with_disk,
        DOMAIN.replace("KERNEL", kernel.to_str().unwrap()).replace(
            "<rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>",
            "<disk type='file' device='disk'><source file='/var/lib/dr-1.img'/><target dev='vda'/></disk>",
        ),
    )
    .unwrap();
    let o = farvm()
        .args(["run", "--domain", with_disk.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(exit_code::USAGE), "{stderr}");
    assert!(
        stderr.contains("<disk> (line 17): disks need a Linux guest"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
