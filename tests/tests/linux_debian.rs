//! An operator's Debian VM from its domain XML, run by farvm itself and by libvirt: the example
//! domain `vmconfig/tests/fixtures/debian.xml` (its paths and tap name replaced) with the image
//! of `scripts/debian-guest-image.sh`: the lab's Debian kernel, `root=/dev/vda` on a raw ext4
//! disk holding Debian's minbase, eth0 on a host tap, two vCPUs at 25% local memory (the rest on
//! the local memory server). The guest's /sbin/init loads the farvm agent module, takes its
//! static address and serves a page it generated (its boot id) with busybox httpd.
//!
//! First `farvm run --domain`: the host's HTTP GET over the tap returns the guest's page, the
//! agent runs, and a file written in the guest and `sync`ed survives a SIGKILL of the VMM.
//! Then the same domain through libvirt's Cloud Hypervisor driver (`scripts/libvirt-ch.sh`:
//! virtchd as `nobody`, farvm as its `cloud-hypervisor`, 25% local from the host config):
//! `virsh define` + `virsh start` boot it on the tap libvirt created, the page comes back over
//! it, the file from the killed run is whole, the VM pages to its memory server (its metrics);
//! a second synced file survives `virsh destroy` + `virsh start`, and `virsh shutdown` ends the
//! domain "shut off (shutdown)".
//!
//! Like the other Linux-guest tests it needs two-dimensional paging (the KVM lab stage of CI,
//! `.ci/lab-tests-linux`, with the `tun` module loaded); elsewhere it says so, and fails if
//! `FARVM_REQUIRE_LINUX_BOOT=1`. It needs root (it creates the tap) and libvirt built by
//! `scripts/libvirt-ch.sh build` (`FARVM_LIBVIRT_CACHE` names its cache inside the lab).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

// The harness is shared with the tests of scripts/linux-guest-image.sh's guest, whose image
// helpers this test does not use.
#[allow(dead_code)]
mod linux_common;
#[path = "linux_common/tap.rs"]
mod tap;

#[path = "../../vmm/tests/common/guest_console.rs"]
mod guest_console;
#[path = "../../vmm/tests/common/libvirt.rs"]
mod libvirt_harness;

use libvirt_harness::{require_libvirt_built, Libvirt};
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
/// The fixture's domain name, and its `<emulator>` (libvirt runs the daemon's own
/// `cloud-hypervisor`, farvm, when the domain names none).
const DOMAIN: &str = "debian-1";
const FIXTURE_EMULATOR: &str = "<emulator>/usr/local/bin/cloud-hypervisor</emulator>";

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

/// The guest's console on the pty libvirt reports, line by line.
struct PtyConsole {
    pty: PathBuf,
    lines: Receiver<String>,
    transcript: Vec<String>,
}

impl PtyConsole {
    fn open(lv: &Libvirt) -> PtyConsole {
        let pty = lv.console_pty(DOMAIN);
        PtyConsole {
            lines: guest_console::read_pty(&pty),
            pty,
            transcript: Vec::new(),
        }
    }

    /// The next line `pick` accepts (its value), or a panic with the console's last lines.
    fn wait_for<T>(
        &mut self,
        what: &str,
        deadline: Instant,
        pick: impl Fn(&str) -> Option<T>,
    ) -> T {
        next_picked(&self.lines, &mut self.transcript, deadline, pick).unwrap_or_else(|e| {
            panic!(
                "no {what} on the console ({e}); its last lines:\n{}",
                self.transcript[self.transcript.len().saturating_sub(40)..].join("\n")
            )
        })
    }

    fn type_line(&self, line: &str) {
        guest_console::type_line(&self.pty, line);
    }
}

/// The tap libvirt created for the domain (`virsh domiflist`; libvirt 11.3's ch driver names
/// it anew, `vnetN`, on a later start), given the host side of the fixture's network.
fn libvirt_tap(lv: &Libvirt) -> String {
    let list = lv.virsh(&["domiflist", DOMAIN]);
    let tap = list
        .lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.get(1) == Some(&"ethernet")).then(|| w[0].to_string())
        })
        .unwrap_or_else(|| panic!("no ethernet interface in:\n{list}"));
    tap::address_tap(&tap, HOST_CIDR);
    tap
}

/// `virsh start`: the tap libvirt made, addressed on the host side, and the console once the
/// guest is ready; the boot id.
fn libvirt_boot(lv: &Libvirt, deadline: Instant) -> (PtyConsole, String) {
    let t0 = Instant::now();
    lv.virsh(&["start", DOMAIN]);
    let tap = libvirt_tap(lv);
    let mut console = PtyConsole::open(lv);
    let boot_id = console.wait_for("the Debian guest's init", deadline, ready_line);
    eprintln!(
        "libvirt: ready after {:.1} s (boot {boot_id}, tap {tap})",
        t0.elapsed().as_secs_f64()
    );
    (console, boot_id)
}

/// The guest's page over the tap names this boot.
fn assert_page_of(boot_id: &str, deadline: Instant) {
    let page = http_get(SocketAddr::from((GUEST_IP, 80)), "/", deadline);
    let page = String::from_utf8_lossy(&page);
    assert!(
        page.contains(&format!("boot {boot_id}")) && page.contains("farvm-debian"),
        "the guest's page over the tap names its host name and this boot: {page}"
    );
}

/// The command that writes `file` with random data, syncs it and prints `MARK <sha256>`.
fn write_synced(file: &str, mark: &str) -> String {
    format!(
        "head -c {SYNCED_BYTES} /dev/urandom > {file} && sync && \
         set -- $(sha256sum {file}) && echo {mark} $1"
    )
}

/// The command that prints `MARK <sha256 of file>`.
fn checksum_of(file: &str, mark: &str) -> String {
    format!("set -- $(sha256sum {file}) && echo {mark} $1")
}

#[test]
fn debian_domain_serves_http_on_its_tap_and_keeps_a_synced_file_across_a_vmm_kill() {
    if !linux_test_can_run("the Debian domain is tested in the KVM lab") {
        return;
    }
    let built = require_libvirt_built();
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
    let host_tap = HostTap::create(&tap_name, HOST_CIDR);
    let xml = dir.join("debian.xml");
    std::fs::write(&xml, domain_xml(&img, &root, &tap_name)).unwrap();

    let timeout = farvm_tests::vm_timeout(Duration::from_secs(900));
    let deadline = Instant::now() + 3 * timeout + Duration::from_secs(60);

    // farvm run --domain: the page the guest generated, the agent, a synced file; then SIGKILL.
    let (mut vm, boot_id) = boot(&xml, timeout, deadline);
    assert_page_of(&boot_id, deadline);
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
    vm.type_line(&write_synced("/root/synced", "SYNCED"));
    let synced = vm.wait_for("the synced file", deadline, |l| marked_sum(l, "SYNCED"));
    vm.child.kill().expect("SIGKILL farvm");
    let status = vm.child.wait().expect("wait for farvm");
    eprintln!("farvm killed: {status}");
    drop(host_tap);

    // The same domain through libvirt. Its daemon runs as an unprivileged user, which reads
    // the kernel and initramfs and writes the root disk; the host config sets 25% local memory
    // (libvirt drops <metadata>) and a metrics address.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let boot_files = DebianImage {
        kernel: dir.join("vmlinuz"),
        initrd: dir.join("initrd.img"),
        root: img.root.clone(),
    };
    for (from, to) in [
        (&img.kernel, &boot_files.kernel),
        (&img.initrd, &boot_files.initrd),
    ] {
        std::fs::copy(from, to).expect("copy the kernel and initramfs");
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let user = std::env::var("FARVM_LIBVIRT_USER").unwrap_or_else(|_| "nobody".into());
    let chown = std::process::Command::new("chown")
        .arg(&user)
        .arg(&root)
        .status()
        .expect("chown");
    assert!(chown.success(), "give the root disk to {user}");
    let metrics = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap();
    let config = dir.join("farvm.toml");
    std::fs::write(
        &config,
        format!("[domain.\"{DOMAIN}\"]\nlocal_memory = \"25%\"\nmetrics = \"{metrics}\"\n"),
    )
    .unwrap();
    let lv_xml = dir.join("debian-libvirt.xml");
    let fixture = domain_xml(
        &boot_files,
        &root,
        &format!("fvl{}", std::process::id() % 100_000),
    );
    assert!(
        fixture.contains(FIXTURE_EMULATOR),
        "the fixture names no {FIXTURE_EMULATOR}"
    );
    std::fs::write(&lv_xml, fixture.replace(FIXTURE_EMULATOR, "")).unwrap();
    let lv = Libvirt::start(&farvm_bin(), &dir, &config, built);
    lv.virsh(&["define", lv_xml.to_str().unwrap()]);

    // virsh start: the page over libvirt's tap, the file from the killed run, remote memory.
    let (mut console, lv_boot) = libvirt_boot(&lv, deadline);
    assert_ne!(lv_boot, boot_id, "a new boot");
    assert_page_of(&lv_boot, deadline);
    console.type_line(&checksum_of("/root/synced", "AGAIN"));
    let again = console.wait_for("the file after the kill", deadline, |l| {
        marked_sum(l, "AGAIN")
    });
    assert_eq!(
        again, synced,
        "the synced file after a SIGKILL of the VMM, booted by libvirt"
    );
    console.type_line(&write_synced("/root/synced2", "SYNCED2"));
    let synced2 = console.wait_for("the second synced file", deadline, |l| {
        marked_sum(l, "SYNCED2")
    });
    let m = http_get(metrics, "/metrics", deadline);
    let m = String::from_utf8_lossy(&m);
    let total = libvirt_harness::metric(&m, "farvm_ept_total_pages");
    let budget = libvirt_harness::metric(&m, "farvm_ept_budget_pages");
    assert_eq!(budget * 4.0, total, "25% local memory from the host config");
    assert!(
        libvirt_harness::metric(&m, "farvm_ept_remote_writes_total") > 0.0,
        "the guest's pages went to the memory server"
    );
    assert_eq!(
        libvirt_harness::metric(&m, "farvm_ept_lost_accesses_total"),
        0.0
    );

    // virsh destroy + virsh start: the second file is whole; virsh shutdown ends the domain.
    lv.virsh(&["destroy", DOMAIN]);
    let (mut console, third) = libvirt_boot(&lv, deadline);
    assert_ne!(third, lv_boot, "a new boot");
    assert_page_of(&third, deadline);
    console.type_line(&checksum_of("/root/synced2", "AGAIN2"));
    let again2 = console.wait_for("the file after virsh destroy", deadline, |l| {
        marked_sum(l, "AGAIN2")
    });
    assert_eq!(again2, synced2, "the synced file after virsh destroy");
    lv.virsh(&["shutdown", DOMAIN]);
    lv.wait_domstate(DOMAIN, "shut off (shutdown)");
    drop(lv);
    std::fs::remove_dir_all(&dir).ok();
}
