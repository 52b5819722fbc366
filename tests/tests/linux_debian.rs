//! An operator's Debian VM from its domain XML: `farvm run --domain` boots the example domain
//! `vmconfig/tests/fixtures/debian.xml` (its paths and tap name replaced) with the image of
//! `scripts/debian-guest-image.sh`: the lab's Debian kernel, `root=/dev/vda` on a raw ext4 disk
//! holding Debian's minbase, eth0 on a host tap, two vCPUs at 25% local memory (the rest on
//! the local memory server). The guest's /sbin/init loads the farvm agent module, takes its
//! static address and serves a page it generated (its boot id) with busybox httpd; the host's
//! HTTP GET over the tap returns that page. A file written in the guest and `sync`ed survives
//! a SIGKILL of the VMM: the next boot of the same domain reads it back with the same
//! SHA-256, and a `poweroff` ends that VM with exit status 0.
//!
//! Like the other Linux-guest tests it needs two-dimensional paging (the KVM lab stage of CI,
//! `.ci/lab-tests-linux`, with the `tun` module loaded); elsewhere it says so, and fails if
//! `FARVM_REQUIRE_LINUX_BOOT=1`. It needs root (it creates the tap).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

// The harness is shared with the tests of scripts/linux-guest-image.sh's guest, whose image
// helpers this test does not use.
#[allow(dead_code)]
mod linux_common;
#[path = "linux_common/tap.rs"]
mod tap;

use linux_common::*;
use tap::{http_get, HostTap};

/// The fixture's tap network: the host side the test gives its tap, the guest's `farvm_ip`.
const HOST_CIDR: &str = "192.168.100.1/24";
const GUEST_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 100, 2);
/// The fixture's tap name and the directory its paths name.
const FIXTURE_TAP: &str = "<target dev='deb0'/>";
const FIXTURE_DIR: &str = "/var/lib/farvm/debian/";
/// Bytes of random data the guest writes and syncs before the VMM is killed.
const SYNCED_BYTES: u64 = 4 << 20;

/// The files `scripts/debian-guest-image.sh` prints (`FARVM_DEBIAN_GUEST=DIR`: a directory
/// it built).
struct DebianImage {
    kernel: PathBuf,
    initrd: PathBuf,
    root: PathBuf,
}

fn debian_image() -> DebianImage {
    let text = image_description(
        "FARVM_DEBIAN_GUEST",
        "scripts/debian-guest-image.sh",
        "the Debian guest image (mmdebstrap from a Debian mirror, the lab kernel, the agent)",
    );
    let what = "the Debian image's description";
    DebianImage {
        kernel: described(&text, "DEBIAN_KERNEL", what).into(),
        initrd: described(&text, "DEBIAN_INITRD", what).into(),
        root: described(&text, "DEBIAN_ROOT", what).into(),
    }
}

/// The example domain with the image's kernel and initramfs, the scratch copy `root` of its
/// root disk and the tap `tap`.
fn domain_xml(img: &DebianImage, root: &Path, tap: &str) -> String {
    let path = repo_root().join("vmconfig/tests/fixtures/debian.xml");
    let mut xml = std::fs::read_to_string(&path).expect("the example domain");
    for (from, to) in [
        (
            format!("{FIXTURE_DIR}vmlinuz"),
            img.kernel.display().to_string(),
        ),
        (
            format!("{FIXTURE_DIR}initrd.img"),
            img.initrd.display().to_string(),
        ),
        (format!("{FIXTURE_DIR}root.img"), root.display().to_string()),
        (FIXTURE_TAP.to_string(), format!("<target dev='{tap}'/>")),
    ] {
        assert!(
            xml.contains(&from),
            "{} no longer names {from}: update this test",
            path.display()
        );
        xml = xml.replace(&from, &to);
    }
    xml
}

/// `farvm-debian: ready BOOT_ID ADDRESS` on the console: the boot id (the command the test
/// types never prints this line).
fn ready_line(line: &str) -> Option<String> {
    let mut w = line.trim().strip_prefix("farvm-debian: ready ")?.split(' ');
    let boot_id = w.next()?.to_string();
    (w.next()? == GUEST_IP.to_string()).then_some(boot_id)
}

/// Boots the domain file `xml`; waits for the guest's init to be ready; returns the VM and its
/// boot id.
fn boot(xml: &Path, timeout: Duration, deadline: Instant) -> (Farvm, String) {
    let t0 = Instant::now();
    let mut vm = Farvm::spawn(&[
        "run".into(),
        "--domain".into(),
        xml.display().to_string(),
        "--no-control-socket".into(),
        "--json".into(),
        "--timeout".into(),
        timeout.as_secs().to_string(),
    ]);
    let boot_id = vm.wait_for("the Debian guest's init", deadline, ready_line);
    eprintln!(
        "ready after {:.1} s (boot {boot_id})",
        t0.elapsed().as_secs_f64()
    );
    (vm, boot_id)
}

#[test]
fn debian_domain_serves_http_on_its_tap_and_keeps_a_synced_file_across_a_vmm_kill() {
    if !linux_test_can_run("the Debian domain is tested in the KVM lab") {
        return;
    }
    let img = debian_image();
    let dir = std::env::temp_dir().join(format!("farvm-linux-debian-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The guest writes its root disk: a sparse copy, never the cached image.
    let root = dir.join("root.img");
    let cp = std::process::Command::new("cp")
        .arg("--sparse=always")
        .arg(&img.root)
        .arg(&root)
        .status()
        .expect("cp");
    assert!(cp.success(), "copy the root disk");
    let tap_name = format!("fvd{}", std::process::id() % 100_000);
    let _tap = HostTap::create(&tap_name, HOST_CIDR);
    let xml = dir.join("debian.xml");
    std::fs::write(&xml, domain_xml(&img, &root, &tap_name)).unwrap();

    let timeout = farvm_tests::vm_timeout(Duration::from_secs(900));
    let deadline = Instant::now() + 2 * timeout + Duration::from_secs(60);

    // First boot: the page the guest generated, the agent, a synced file; then SIGKILL.
    let (mut vm, boot_id) = boot(&xml, timeout, deadline);
    let page = http_get(SocketAddr::from((GUEST_IP, 80)), "/", deadline);
    let page = String::from_utf8_lossy(&page);
    assert!(
        page.contains(&format!("boot {boot_id}")) && page.contains("farvm-debian"),
        "the guest's page over the tap names its host name and this boot: {page}"
    );
    vm.type_line(
        "echo AGENT $(grep -c '^farvm_agent ' /proc/modules) $(busybox pidof farvm-agentd | wc -w)",
    );
    let agent = vm.wait_for("the agent's state", deadline, |l| {
        let rest = l.trim().strip_prefix("AGENT ")?;
        (!rest.contains('$')).then(|| rest.to_string())
    });
    assert_eq!(
        agent, "1 1",
        "farvm_agent.ko loaded and farvm-agentd running at boot"
    );
    vm.type_line(&format!(
        "head -c {SYNCED_BYTES} /dev/urandom > /root/synced && sync && \
         set -- $(sha256sum /root/synced) && echo SYNCED $1"
    ));
    let synced = vm.wait_for("the synced file", deadline, |l| marked_sum(l, "SYNCED"));
    vm.child.kill().expect("SIGKILL farvm");
    let status = vm.child.wait().expect("wait for farvm");
    eprintln!("farvm killed: {status}");

    // Second boot of the same domain: the file is there, whole.
    let (mut vm, again_id) = boot(&xml, timeout, deadline);
    assert_ne!(again_id, boot_id, "a new boot");
    vm.type_line("set -- $(sha256sum /root/synced) && echo AGAIN $1");
    let again = vm.wait_for("the file after the kill", deadline, |l| {
        marked_sum(l, "AGAIN")
    });
    assert_eq!(
        again, synced,
        "the synced file after a SIGKILL of the VMM and a new boot"
    );
    vm.type_line("poweroff");
    let (status, rest) = vm.finish(deadline);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        status,
        Some(0),
        "farvm's exit status after the guest's poweroff"
    );
    let report: serde_json::Value = json_report(&rest);
    let c = &report["paging"]["engine"]["counters"];
    assert!(
        c["remote_writes"].as_u64().unwrap_or(0) > 0,
        "the guest ran on remote memory: {c}"
    );
    assert_eq!(c["lost_accesses"], 0, "{c}");
}
