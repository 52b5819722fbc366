//! farvm under real libvirt: `scripts/libvirt-ch.sh` starts libvirt's Cloud Hypervisor driver
//! (virtchd 11.3, an unprivileged per-user daemon) with this build's `farvm` on its PATH as
//! `cloud-hypervisor`, and `virsh` drives domains booting the test guest on remote memory (the
//! embedded memory server, 25% local from the host config's per-domain section):
//! define → start → list → dominfo → suspend (the VM's metrics show it paused at 25% local,
//! paging from its memory server) → a line typed on the pty libvirt reports reaches the guest →
//! resume → the guest writes the line back, prints the native checksum and powers off, and
//! libvirt (following farvm's `--event-monitor` events) marks the domain shut off and ends its
//! VMM; a second domain running at the same time is shut down with `virsh shutdown` (shut off),
//! started again and destroyed mid-run, leaving no process or socket behind. A domain with an
//! `<interface type='ethernet'>` starts with the tap libvirt created and handed farvm. With
//! farvm at its default log level, a refused start says why where the operator looks. `virsh
//! save` and `virsh managedsave` of a domain on a memory pool mid-run, then `virsh restore` and
//! `virsh start`, finish with the native checksum; a failed save leaves the domain running
//! (libvirt 11.3 with farvm's two fixes to its ch driver, scripts/libvirt-ch.d/patches/trixie); a
//! domain without a pool saves a full copy (docs/libvirt.md).
//!
//! libvirt with the ch driver must have been built once (`scripts/libvirt-ch.sh build`, about
//! 10 minutes; `.ci/run` does it when the cache is missing): without it this test fails saying
//! so.

mod common;
#[path = "common/guest_console.rs"]
mod guest_console;
#[path = "common/libvirt.rs"]
mod libvirt_harness;
#[path = "common/pool.rs"]
mod pool_harness;

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{alive, kvm_available, memserver_children};
use farvm_httpd::client::get;
use farvm_httpd::BoundAddr;
use libvirt_harness::{metric, require_libvirt_built, Libvirt};

/// How long the guest may take to finish its workload on remote memory.
const GUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// Back-to-back `virsh start` + `virsh destroy` cycles of a domain that serves metrics.
const DESTROY_START_CYCLES: u32 = 50;

/// This build's farvm, which the daemon runs as `cloud-hypervisor`.
fn farvm() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_farvm"))
}

/// A fresh directory for one test, readable by the daemon's (unprivileged) user, which reads
/// everything a domain names; with `test_guest`, farvm's test guest exported into it
/// (`farvm-testguest.elf`).
fn shared_dir(tag: &str, test_guest: bool) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("farvm-libvirt{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    if test_guest {
        let out = Command::new(env!("CARGO_BIN_EXE_farvm"))
            .args(["image", "export"])
            .arg(&dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "farvm image export: {out:?}");
    }
    dir
}

/// A free TCP port on the loopback interface (for the VM's metrics endpoint).
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

fn domain_xml(name: &str, kernel: &Path, memory_mib: u64, workloads: &[&str]) -> String {
    let cmdline: Vec<String> = workloads
        .iter()
        .map(|w| format!("farvm.workload={w}"))
        .collect();
    format!(
        "<domain type='kvm'>
  <name>{name}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64'>hvm</type>
    <kernel>{}</kernel>
    <cmdline>{}</cmdline>
  </os>
  <devices>
    <console type='pty'><target type='virtio' port='0'/></console>
  </devices>
</domain>
",
        kernel.display(),
        cmdline.join(" ")
    )
}

/// Waits for every process in `pids` to be gone.
fn wait_gone(pids: &[u32], what: &str) {
    let t0 = Instant::now();
    while let Some(p) = pids.iter().find(|&&p| alive(p)) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{what}: process {p} still runs"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn virsh_runs_the_test_guest_on_remote_memory() {
    if !kvm_available() {
        return;
    }
    let built = require_libvirt_built();
    eprintln!("libvirt: {built}");
    let dir = shared_dir("", true);
    let kernel = dir.join("farvm-testguest.elf");
    let metrics = free_port();
    let config = dir.join("farvm.toml");
    std::fs::write(
        &config,
        format!(
            "[defaults]\nlocal_memory = \"50%\"\n\n[domain.\"lv-a\"]\nlocal_memory = \"25%\"\n\
             metrics = \"{metrics}\"\n"
        ),
    )
    .unwrap();
    let lv = Libvirt::start(farvm(), &dir, &config, built);

    // lv-a: long enough to be suspended mid-run; remote memory, 48 MiB working set in 128 MiB.
    let workloads_a = ["seq:ws=48M,passes=12"];
    let xml_a = dir.join("lv-a.xml");
    std::fs::write(&xml_a, domain_xml("lv-a", &kernel, 128, &workloads_a)).unwrap();
    // lv-b: runs until it is shut down or destroyed.
    let xml_b = dir.join("lv-b.xml");
    std::fs::write(
        &xml_b,
        domain_xml("lv-b", &kernel, 64, &["seq:ws=16M,passes=100000"]),
    )
    .unwrap();
    lv.virsh(&["define", xml_a.to_str().unwrap()]);
    lv.virsh(&["define", xml_b.to_str().unwrap()]);
    assert_eq!(lv.domstate("lv-a"), "shut off");

    lv.virsh(&["start", "lv-a"]);
    // Suspended once it pages from its memory server (its working set is over its local share,
    // so every pass after the first faults remotely and the workload is far from its end).
    let t0 = Instant::now();
    loop {
        let m = get(&BoundAddr::Tcp(metrics), "/metrics").expect("lv-a's metrics endpoint");
        if metric(&m.body, "farvm_ept_demand_faults_total") > 0.0 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no demand fault yet:\n{}",
            m.body
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    lv.virsh(&["suspend", "lv-a"]);
    assert_eq!(lv.domstate("lv-a"), "paused");
    let pty_a = lv.console_pty("lv-a");
    let console = guest_console::read_pty(&pty_a);
    let list = lv.virsh(&["list"]);
    assert!(
        list.lines()
            .any(|l| l.contains("lv-a") && l.contains("paused")),
        "{list}"
    );
    assert_eq!(lv.dominfo("lv-a", "State"), "paused");
    assert_eq!(lv.dominfo("lv-a", "CPU(s)"), "1");
    assert_eq!(lv.dominfo("lv-a", "Max memory"), "131072 KiB");
    let pid_a: u32 = lv.dominfo("lv-a", "Id").parse().unwrap();
    assert!(alive(pid_a), "libvirt's domain id is the VMM's pid");
    // libvirt pins and reports vCPUs by their threads' names.
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{pid_a}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .collect();
    assert!(threads.iter().any(|t| t == "vcpu0"), "{threads:?}");
    let memserver_a = memserver_children(pid_a);
    assert!(!memserver_a.is_empty(), "lv-a's embedded memory server");
    // The host config's section for lv-a: remote memory at 25% local, metrics served.
    let m = get(&BoundAddr::Tcp(metrics), "/metrics").expect("lv-a's metrics endpoint");
    assert_eq!(m.status, 200);
    let (total, budget) = (
        metric(&m.body, "farvm_ept_total_pages"),
        metric(&m.body, "farvm_ept_budget_pages"),
    );
    assert_eq!(total, 128.0 * 256.0, "{}", m.body);
    assert_eq!(budget * 4.0, total, "25% local");
    eprintln!(
        "lv-a paused: {total} guest pages, {budget} local, {} demand faults from its memory server",
        metric(&m.body, "farvm_ept_demand_faults_total")
    );
    let sock_a = lv.runtime().join("runtime/libvirt/ch/run/lv-a-socket");
    assert!(sock_a.exists(), "{} while lv-a runs", sock_a.display());
    // Console input through libvirt: a line typed on the pty it reports reaches the guest
    // (typed while paused, so the guest's process is certainly still running).
    guest_console::type_line(&pty_a, "hello through libvirt");

    // Two domains at once: lv-b runs while lv-a is paused and after it resumes.
    lv.virsh(&["start", "lv-b"]);
    let pid_b: u32 = lv.dominfo("lv-b", "Id").parse().unwrap();
    let list = lv.virsh(&["list"]);
    assert!(
        list.contains("lv-a")
            && list
                .lines()
                .any(|l| l.contains("lv-b") && l.contains("running")),
        "{list}"
    );
    lv.virsh(&["resume", "lv-a"]);
    assert_eq!(lv.domstate("lv-a"), "running");

    // lv-a's guest writes the typed line back, prints its results on the console libvirt
    // reports and powers off.
    let mut text = String::new();
    guest_console::console_until(
        &console,
        &mut text,
        "farvm-testguest: console hello through libvirt",
        Duration::from_secs(60),
    );
    text += &guest_console::console_until_poweroff(&console, GUEST_TIMEOUT);
    eprintln!("lv-a console:\n{text}");
    let (procs, end) = guest_console::parse(&text);
    assert_eq!(end, Some((1, 0, 0)), "{text}");
    for l in guest_console::check_against_native(&workloads_a, 1, &procs) {
        eprintln!("{l}");
    }
    // The guest powered off: farvm reports vm:shutdown on its event monitor, libvirt marks the
    // domain shut off and ends its VMM; the memory server and the socket go with it.
    lv.wait_domstate("lv-a", "shut off (shutdown)");
    let mut procs_a = memserver_a;
    procs_a.push(pid_a);
    wait_gone(
        &procs_a,
        "lv-a's VMM and memory server after the guest powered off",
    );
    assert!(!sock_a.exists(), "{} left behind", sock_a.display());
    eprintln!("{}", lv.domain_log("lv-a"));

    // lv-b shut down through libvirt (vm.shutdown): shut off, its VMM ended.
    assert_eq!(lv.domstate("lv-b"), "running");
    let sock_b = lv.runtime().join("runtime/libvirt/ch/run/lv-b-socket");
    assert!(sock_b.exists(), "{} while lv-b runs", sock_b.display());
    let mut procs_b = memserver_children(pid_b);
    assert!(!procs_b.is_empty(), "lv-b's embedded memory server");
    procs_b.push(pid_b);
    lv.virsh(&["shutdown", "lv-b"]);
    lv.wait_domstate("lv-b", "shut off (shutdown)");
    wait_gone(&procs_b, "virsh shutdown lv-b (its VMM and memory server)");
    assert!(!sock_b.exists(), "{} left behind", sock_b.display());

    // lv-b started again and destroyed mid-run: its VMM and socket are gone.
    lv.virsh(&["start", "lv-b"]);
    let pid_b: u32 = lv.dominfo("lv-b", "Id").parse().unwrap();
    let mut procs_b = memserver_children(pid_b);
    assert!(!procs_b.is_empty(), "lv-b's embedded memory server");
    procs_b.push(pid_b);
    lv.virsh(&["destroy", "lv-b"]);
    lv.wait_domstate("lv-b", "shut off (destroyed)");
    wait_gone(&procs_b, "virsh destroy lv-b (its VMM and memory server)");
    assert!(!sock_b.exists(), "{} left behind", sock_b.display());

    // lv-a, whose host-config section serves metrics, destroyed and started back to back:
    // libvirt reports a destroyed domain before its VMM has exited, and every start must
    // still get the metrics port (it failed every other time while the old VMM held it).
    for cycle in 1..=DESTROY_START_CYCLES {
        lv.virsh(&["start", "lv-a"]);
        let m = get(&BoundAddr::Tcp(metrics), "/metrics").expect("lv-a's metrics endpoint");
        assert_eq!(m.status, 200, "cycle {cycle}");
        lv.virsh(&["destroy", "lv-a"]);
    }
    lv.wait_domstate("lv-a", "shut off (destroyed)");

    // A domain farvm refuses: `virsh start` fails, and farvm's reason, naming the field, is
    // in the domain log at the default log level.
    let xml_c = dir.join("lv-c.xml");
    std::fs::write(
        &xml_c,
        domain_xml("lv-c", &kernel, 64, &["seq:ws=8M"])
            .replace("<vcpu>1</vcpu>", "<vcpu>32</vcpu>"),
    )
    .unwrap();
    lv.virsh(&["define", xml_c.to_str().unwrap()]);
    let o = lv.script(&["virsh", "start", "lv-c"]);
    assert!(!o.status.success(), "virsh start lv-c succeeded");
    let log = lv.domain_log("lv-c");
    assert!(
        log.contains("cpus.boot_vcpus: 32 vCPUs is more than the test guest supports (16)"),
        "the domain log says why:\n{log}"
    );

    assert!(lv.virsh(&["list", "--name"]).trim().is_empty());
    for name in lv.virsh(&["list", "--all", "--name"]).split_whitespace() {
        lv.virsh(&["undefine", name]);
    }
    drop(lv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// libvirt's driver creates the tap of an `<interface type='ethernet'>` itself and hands farvm
/// its descriptor with `PUT vm.add-net` (SCM_RIGHTS) between `vm.create` and `vm.boot`: farvm
/// takes it, and the guest's network device is that tap. The kernel here is a Linux-kind image
/// that is never meant to run far (network devices need a Linux guest; this checks the hand-over,
/// the KVM lab runs real Linux guests).
#[test]
fn virsh_starts_a_domain_whose_interface_is_the_tap_libvirt_created() {
    if !kvm_available() {
        return;
    }
    let built = require_libvirt_built();
    let dir = shared_dir("-net", false);
    let kernel = dir.join("bzImage");
    std::fs::write(&kernel, common::bzimage(4, 0x1000, 5 * 512 + 0x10000)).unwrap();
    let config = dir.join("farvm.toml");
    std::fs::write(&config, "[defaults]\nlocal_memory = \"50%\"\n").unwrap();
    let lv = Libvirt::start(farvm(), &dir, &config, built);
    let xml = dir.join("lv-net.xml");
    std::fs::write(
        &xml,
        format!(
            "<domain type='kvm'>
  <name>lv-net</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64'>hvm</type>
    <kernel>{}</kernel>
    <cmdline>console=ttyS0</cmdline>
  </os>
  <devices>
    <interface type='ethernet'>
      <target dev='fvlv0'/>
      <mac address='52:54:00:aa:bb:cc'/>
      <model type='virtio'/>
    </interface>
  </devices>
</domain>
",
            kernel.display()
        ),
    )
    .unwrap();
    lv.virsh(&["define", xml.to_str().unwrap()]);
    lv.virsh(&["start", "lv-net"]);
    let log = lv.domain_log("lv-net");
    assert!(
        log.contains("network device added (tap descriptor from the API)") && log.contains("fvlv0"),
        "farvm never took libvirt's tap:\n{log}\nvirtchd log:\n{}",
        lv.daemon_log()
    );
    let _ = lv.script(&["virsh", "destroy", "lv-net"]);
    // The daemon stops before its state file goes with the directory.
    drop(lv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// What an operator sees when farvm (or libvirt) refuses a domain, with farvm at its default log
/// level: `virsh start` fails, and the reason is in the domain log (farvm's refusals: a host
/// config with an unknown field, a disk image that is not raw) or in virtchd's log (a domain
/// without a kernel, which libvirt's driver refuses before it asks farvm anything).
#[test]
fn virsh_start_refusals_say_why_at_the_default_log_level() {
    if !kvm_available() {
        return;
    }
    let built = require_libvirt_built();
    let dir = shared_dir("-refuse", true);
    let guest = dir.join("farvm-testguest.elf");
    let bzimage = dir.join("bzImage");
    std::fs::write(&bzimage, common::bzimage(4, 0x1000, 5 * 512 + 0x10000)).unwrap();
    // A qcow2 image as far as its header goes (the magic and version 3): what libvirt's driver
    // hands farvm for `<driver type='qcow2'/>` is its path alone.
    let qcow2 = dir.join("root.qcow2");
    let mut image = vec![0u8; 1 << 16];
    image[..8].copy_from_slice(b"QFI\xfb\0\0\0\x03");
    std::fs::write(&qcow2, image).unwrap();
    // The daemon's user opens it for writing.
    std::fs::set_permissions(
        &qcow2,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o666),
    )
    .unwrap();
    let config = dir.join("farvm.toml");
    let good_config = "[defaults]\nlocal_memory = \"50%\"\n";
    std::fs::write(&config, good_config).unwrap();
    let lv = Libvirt::start_logging(farvm(), &dir, &config, built, None);

    let define = |name: &str, os: &str, devices: &str| {
        let xml = dir.join(format!("{name}.xml"));
        std::fs::write(
            &xml,
            format!(
                "<domain type='kvm'>
  <name>{name}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64'>hvm</type>
    {os}
  </os>
  <devices>{devices}</devices>
</domain>
"
            ),
        )
        .unwrap();
        lv.virsh(&["define", xml.to_str().unwrap()]);
    };
    let start_fails = |name: &str| {
        let o = lv.script(&["virsh", "start", name]);
        assert!(!o.status.success(), "virsh start {name} succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };

    // The operator's host config has a misspelt field: every domain is refused, naming it.
    let test_guest = format!(
        "<kernel>{}</kernel><cmdline>farvm.workload=seq:ws=8M</cmdline>",
        guest.display()
    );
    define("lv-config", &test_guest, "");
    std::fs::write(&config, "[defaults]\nlocal_memroy = \"50%\"\n").unwrap();
    start_fails("lv-config");
    let log = lv.domain_log("lv-config");
    assert!(
        log.contains("local_memroy") && log.contains("farvm.toml"),
        "the domain log names the host config's unknown field:\n{log}"
    );
    std::fs::write(&config, good_config).unwrap();

    // A qcow2 root disk: libvirt's driver sends the path without the format; farvm reads the
    // header and refuses the image instead of showing the guest qcow2's metadata as its disk.
    define(
        "lv-qcow2",
        &format!(
            "<kernel>{}</kernel><cmdline>console=ttyS0 root=/dev/vda</cmdline>",
            bzimage.display()
        ),
        &format!(
            "<disk type='file' device='disk'><driver name='qemu' type='qcow2'/>\
             <source file='{}'/><target dev='vda' bus='virtio'/></disk>",
            qcow2.display()
        ),
    );
    start_fails("lv-qcow2");
    let log = lv.domain_log("lv-qcow2");
    assert!(
        log.contains("is a qcow2 image, but farvm reads raw images only"),
        "the domain log says the disk is not raw:\n{log}"
    );

    // No kernel: libvirt's driver refuses before it sends farvm the VM; its own reason is in
    // virtchd's log (virsh says only "failed to create guest VM").
    define("lv-nokernel", "", "");
    start_fails("lv-nokernel");
    let daemon = lv.daemon_log();
    assert!(
        daemon.contains("Kernel image path in this domain is not defined"),
        "virtchd's log says the kernel is missing:\n{daemon}"
    );

    // The same good domain starts once the config is mended.
    lv.virsh(&["start", "lv-config"]);
    lv.wait_domstate("lv-config", "shut off (shutdown)");

    for name in lv.virsh(&["list", "--all", "--name"]).split_whitespace() {
        lv.virsh(&["undefine", name]);
    }
    drop(lv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits until the domain's VMM (metrics at `metrics`) has faulted pages in from remote memory:
/// its working set is over its local share, so the workload is far from its end.
fn wait_for_demand_faults(metrics: SocketAddr) {
    let t0 = Instant::now();
    loop {
        let m = get(&BoundAddr::Tcp(metrics), "/metrics").expect("the VM's metrics endpoint");
        if metric(&m.body, "farvm_ept_demand_faults_total") > 0.0 {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "no demand fault yet:\n{}",
            m.body
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Reads the domain's console (the pty libvirt reports now) until the guest powers off, and
/// checks its processes ended with the native checksums of `workloads`.
fn finishes_with_native_checksum(lv: &Libvirt, name: &str, workloads: &[&str]) {
    let console = guest_console::read_pty(&lv.console_pty(name));
    let text = guest_console::console_until_poweroff(&console, GUEST_TIMEOUT);
    eprintln!("{name} console:\n{text}");
    let (procs, end) = guest_console::parse(&text);
    assert_eq!(end, Some((1, 0, 0)), "{text}");
    for l in guest_console::check_against_native(workloads, 1, &procs) {
        eprintln!("{l}");
    }
    lv.wait_domstate(name, "shut off (shutdown)");
}

/// Restores the snapshot libvirt's save left in `dir` with `farvm run --restore` (outside
/// libvirt) and checks the guest finishes with the native checksum of `workload`.
fn farvm_restores_with_native_checksum(dir: &Path, workload: &str) {
    let o = Command::new(env!("CARGO_BIN_EXE_farvm"))
        .args(["run", "--restore"])
        .arg(dir)
        .args(["--serial", "none", "--json", "--no-control-socket"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "farvm run --restore {}: {err}",
        dir.display()
    );
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    common::assert_native_report(&report, workload);
}

/// The VMMs (farvm as libvirt's `cloud-hypervisor`) running for the domain `name` under the
/// host config `config`.
fn vmms_of(config: &Path, name: &str) -> Vec<u32> {
    let fifo = format!("{name}-event-monitor-fifo");
    let env = format!("FARVM_CONFIG={}", config.display());
    let has = |pid: u32, what: &str, want: &str| {
        std::fs::read(format!("/proc/{pid}/{what}"))
            .unwrap_or_default()
            .split(|&b| b == 0)
            .any(|part| String::from_utf8_lossy(part).contains(want))
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| has(pid, "cmdline", &fifo) && has(pid, "environ", &env))
        .collect()
}

/// `virsh save`, `virsh managedsave` of a test-guest domain on a memory pool at 25% local, each
/// mid-run: farvm saves a pool snapshot into the directory libvirt names (next to libvirt's
/// own header), the domain is shut off (saved); `virsh restore` of the save, and `virsh start`
/// after the managed save, run it on through libvirt to the checksum of an uninterrupted
/// (native) run (libvirt 11.3 with farvm's fix to its restore, scripts/libvirt-ch.d/patches/trixie).
/// A save that fails (its directory cannot be created; the disk fills while farvm writes)
/// leaves the domain running (with farvm's fix to libvirt's failed save), and it finishes
/// with the same checksum. A domain without a pool is saved as a full copy, which `farvm run
/// --restore` restores to the same checksum.
#[test]
fn virsh_save_and_managedsave_of_a_pool_domain_keep_the_checksum() {
    if !kvm_available() {
        return;
    }
    let built = require_libvirt_built();
    let pool = pool_harness::Pool::start(&["r1", "r2", "r3"], "512M");
    let dir = shared_dir("-save", true);
    let kernel = dir.join("farvm-testguest.elf");
    let metrics = free_port();
    let metrics_full = free_port();
    let config = dir.join("farvm.toml");
    std::fs::write(
        &config,
        format!(
            "[defaults]\nlocal_memory = \"50%\"\n\n[domain.\"lv-save\"]\nlocal_memory = \"25%\"\n\
             metrics = \"{metrics}\"\npool = {{ endpoints = [\"{}\"] }}\n\n\
             [domain.\"lv-full\"]\nlocal_memory = \"25%\"\nmetrics = \"{metrics_full}\"\n",
            pool.url()
        ),
    )
    .unwrap();
    // Where the daemon's (unprivileged) user may create save directories.
    let saves = dir.join("saves");
    std::fs::create_dir(&saves).unwrap();
    std::fs::set_permissions(
        &saves,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o777),
    )
    .unwrap();
    let lv = Libvirt::start(farvm(), &dir, &config, built);
    // Read-modify-write passes that check every word they read, 48 MiB in 128 MiB; long
    // enough (about 6 s of guest time) that the test reads the console libvirt reports after
    // a restore before the resumed guest powers off and its pty closes.
    let workload = "seq:ws=48M,passes=64,write=1,verify=1";
    let define = |name: &str| {
        let xml = dir.join(format!("{name}.xml"));
        std::fs::write(&xml, domain_xml(name, &kernel, 128, &[workload])).unwrap();
        lv.virsh(&["define", xml.to_str().unwrap()]);
    };
    // `virsh start NAME`, then `virsh save` once it pages remotely: the save's directory.
    let save_mid_run = |name: &str, metrics: SocketAddr| {
        lv.virsh(&["start", name]);
        wait_for_demand_faults(metrics);
        let image = saves.join(format!("{name}.save"));
        lv.virsh(&["save", name, image.to_str().unwrap()]);
        assert_eq!(
            lv.virsh(&["domstate", "--reason", name]).trim(),
            "shut off (saved)"
        );
        wait_gone(&vmms_of(&config, name), "the saved domain's VMM");
        image
    };
    define("lv-save");

    // virsh save mid-run: a pool snapshot beside libvirt's header.
    let image = save_mid_run("lv-save", metrics);
    for file in ["libvirt-save.xml", "manifest.json", "remote.pages"] {
        assert!(
            image.join(file).exists(),
            "no {file} in {}",
            image.display()
        );
    }
    // virsh restore: libvirt starts farvm on the snapshot (vm.restore) and resumes it; it
    // pages its remote part back from the pool and finishes as if never stopped.
    lv.virsh(&["restore", image.to_str().unwrap()]);
    assert_eq!(
        lv.virsh(&["domstate", "--reason", "lv-save"]).trim(),
        "running (restored)"
    );
    finishes_with_native_checksum(&lv, "lv-save", &[workload]);

    // virsh managedsave mid-run: the snapshot in libvirt's save directory, which the next
    // `virsh start` restores.
    lv.virsh(&["start", "lv-save"]);
    wait_for_demand_faults(metrics);
    lv.virsh(&["managedsave", "lv-save"]);
    assert_eq!(
        lv.virsh(&["domstate", "--reason", "lv-save"]).trim(),
        "shut off (saved)"
    );
    wait_gone(&vmms_of(&config, "lv-save"), "the saved domain's VMM");
    let managed = find_dir(&lv.runtime(), "lv-save.save")
        .unwrap_or_else(|| panic!("no managed save under {}", lv.runtime().display()));
    assert!(
        managed.join("manifest.json").exists(),
        "{}",
        managed.display()
    );
    lv.virsh(&["start", "lv-save"]);
    assert_eq!(
        lv.virsh(&["domstate", "--reason", "lv-save"]).trim(),
        "running (restored)"
    );
    finishes_with_native_checksum(&lv, "lv-save", &[workload]);

    // A save that fails: its directory cannot be created (under a file). The domain runs on.
    lv.virsh(&["start", "lv-save"]);
    wait_for_demand_faults(metrics);
    let blocker = saves.join("not-a-directory");
    std::fs::write(&blocker, b"").unwrap();
    let o = lv.script(&[
        "virsh",
        "save",
        "lv-save",
        blocker.join("x").to_str().unwrap(),
    ]);
    assert!(
        !o.status.success(),
        "virsh save into a file's child succeeded"
    );
    assert_eq!(lv.domstate("lv-save"), "running");
    // A save that fails in farvm: the disk fills (a 1 MiB tmpfs holds libvirt's header but
    // not the guest's resident pages). farvm answers 500, leaving the VM paused as libvirt
    // paused it, and libvirt resumes it.
    let full = SmallTmpfs::mount(&saves.join("full"));
    let o = lv.script(&[
        "virsh",
        "save",
        "lv-save",
        full.0.join("lv-save").to_str().unwrap(),
    ]);
    assert!(!o.status.success(), "virsh save onto a full disk succeeded");
    let log = lv.domain_log("lv-save");
    assert!(
        log.contains("No space left on device"),
        "farvm's refusal in the domain log:\n{log}"
    );
    drop(full);
    assert_eq!(lv.domstate("lv-save"), "running");
    finishes_with_native_checksum(&lv, "lv-save", &[workload]);

    // Without a pool (an embedded memory server): `virsh save` writes a full copy, every
    // page, which restores to the same checksum.
    define("lv-full");
    let image = save_mid_run("lv-full", metrics_full);
    assert!(
        image.join("memory.pages").exists() && !image.join("remote.pages").exists(),
        "a full copy in {}",
        image.display()
    );
    farvm_restores_with_native_checksum(&image, workload);

    lv.virsh(&["undefine", "lv-full"]);
    lv.virsh(&["undefine", "--managed-save", "lv-save"]);
    drop(lv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A 1 MiB tmpfs mounted (as root) at a new directory, writable by everyone; unmounted on drop.
struct SmallTmpfs(PathBuf);

impl SmallTmpfs {
    fn mount(at: &Path) -> SmallTmpfs {
        std::fs::create_dir_all(at).unwrap();
        let o = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m,mode=0777", "farvm-full"])
            .arg(at)
            .output()
            .expect("run mount");
        assert!(
            o.status.success(),
            "mount a tmpfs on {} (this test runs as root): {}",
            at.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        SmallTmpfs(at.to_path_buf())
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// The first directory named `name` under `root` (depth first).
fn find_dir(root: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(root).ok()?.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if entry.file_name() == name {
                return Some(path);
            }
            if let Some(found) = find_dir(&path, name) {
                return Some(found);
            }
        }
    }
    None
}
