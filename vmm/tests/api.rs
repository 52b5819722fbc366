//! The Cloud-Hypervisor-compatible API server (`farvm api`, the same code libvirt runs as
//! `cloud-hypervisor --api-socket fd=N`), driven over its Unix socket as libvirt drives it:
//! Cloud Hypervisor's status codes and error bodies in every wrong state, a pty console whose
//! path vm.info reports and on which the test guest prints its results, pause/resume, the
//! host config's per-domain section and defaults, shutdown/reboot/delete, vmm.shutdown and
//! SIGTERM, the `--event-monitor` records of each transition (on a file, and on a FIFO as
//! libvirt gives it), and live migration of a pool VM between two API servers
//! (`vm.send-migration`, `vm.receive-migration`, against a real etcd and memory servers).

mod common;
#[path = "common/guest_console.rs"]
mod guest_console;
#[path = "common/pool.rs"]
mod pool_harness;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::kvm_available;
use farvm_httpd::client::{request, Response};
use farvm_httpd::BoundAddr;
use serde_json::{json, Value};

fn scratch_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("farvm-api-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `farvm api` process on `dir/<name>.sock`, with `config` as its host config.
struct Api {
    child: Child,
    addr: BoundAddr,
    sock: PathBuf,
}

impl Api {
    /// With `events`, farvm writes its `--event-monitor` records there (a FIFO's reader must
    /// be opening it already: farvm's open waits for one, as Cloud Hypervisor's does).
    fn start(dir: &Path, name: &str, config: &Path, events: Option<&Path>) -> Api {
        let sock = dir.join(format!("{name}.sock"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_farvm"));
        cmd.args(["api", "--api-socket", &format!("path={}", sock.display())]);
        if let Some(ev) = events {
            cmd.arg("--event-monitor")
                .arg(format!("path={}", ev.display()));
        }
        let child = cmd
            .env("FARVM_CONFIG", config)
            .env("FARVM_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join(format!("{name}.log"))).unwrap())
            .spawn()
            .expect("spawn farvm api");
        let t0 = Instant::now();
        while !sock.exists() {
            assert!(t0.elapsed() < Duration::from_secs(30), "no API socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        Api {
            child,
            addr: BoundAddr::Unix(sock.clone()),
            sock,
        }
    }

    fn call(&self, method: &str, endpoint: &str, body: Option<&Value>) -> Response {
        let body = body.map(|b| b.to_string());
        request(
            &self.addr,
            method,
            &format!("/api/v1/{endpoint}"),
            body.as_deref().map(str::as_bytes),
        )
        .unwrap_or_else(|e| panic!("{method} {endpoint}: {e}"))
    }

    /// `PUT endpoint` must answer `status`; returns the body.
    fn put(&self, endpoint: &str, body: Option<&Value>, status: u16) -> String {
        let r = self.call("PUT", endpoint, body);
        assert_eq!(r.status, status, "PUT {endpoint}: {}", r.body);
        r.body
    }

    fn get(&self, endpoint: &str) -> (u16, Value) {
        let r = self.call("GET", endpoint, None);
        (
            r.status,
            serde_json::from_str(&r.body).unwrap_or(Value::Null),
        )
    }

    fn state(&self) -> String {
        let (s, v) = self.get("vm.info");
        assert_eq!(s, 200, "{v}");
        v["state"].as_str().unwrap_or_default().to_string()
    }

    fn wait_state(&self, want: &str, timeout: Duration) {
        let t0 = Instant::now();
        loop {
            let s = self.state();
            if s == want {
                return;
            }
            assert!(t0.elapsed() < timeout, "state {s}, never {want}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Api {
    /// Waits (bounded) for the process to exit after a SIGTERM.
    fn exited_on_sigterm(&mut self) -> std::process::ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "SIGTERM ignored");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Api {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Cloud Hypervisor's error body: a JSON array of messages.
fn error_messages(body: &str) -> Vec<String> {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("error body {body:?}: {e}"))
}

/// The `--event-monitor` records in `text` (pretty-printed JSON objects, one after another) as
/// `source:event`, as libvirt's ch driver names them; checks each record's shape and that the
/// timestamps never go back.
fn events(text: &str) -> Vec<String> {
    let mut last = (0, 0);
    serde_json::Deserializer::from_str(text)
        .into_iter::<Value>()
        .map(|r| {
            let r = r.unwrap_or_else(|e| panic!("event record: {e}\n{text}"));
            assert_eq!(r["properties"], Value::Null, "{r}");
            let t = (
                r["timestamp"]["secs"].as_u64().expect("timestamp.secs"),
                r["timestamp"]["nanos"].as_u64().expect("timestamp.nanos"),
            );
            assert!(t >= last, "timestamps go back: {text}");
            last = t;
            format!(
                "{}:{}",
                r["source"].as_str().expect("source"),
                r["event"].as_str().expect("event")
            )
        })
        .collect()
}

fn export_guest(dir: &Path) -> PathBuf {
    let kernel = dir.join("farvm-testguest.elf");
    std::fs::write(&kernel, farvm_vmm::builtin::test_guest_elf()).unwrap();
    kernel
}

fn create_body(kernel: &Path, workloads: &[&str], memory: u64) -> Value {
    let cmdline: Vec<String> = workloads
        .iter()
        .map(|w| format!("farvm.workload={w}"))
        .collect();
    // What libvirt 9.0 sends for a domain with <console type='pty'><target type='virtio'/>.
    json!({
        "console": {"mode": "Pty"},
        "cpus": {"boot_vcpus": 1, "max_vcpus": 1},
        "memory": {"size": memory},
        "kernel": {"path": kernel},
        "cmdline": {"args": cmdline.join(" ")},
    })
}

#[test]
fn the_api_follows_cloud_hypervisors_states_and_runs_the_guest() {
    if !kvm_available() {
        return;
    }
    let dir = scratch_dir("life");
    let kernel = export_guest(&dir);
    let config = dir.join("farvm.toml");
    std::fs::write(
        &config,
        "[defaults]\nlocal_only = true\n\n[domain.\"web-1\"]\nlocal_only = false\nlocal_memory = \"25%\"\n",
    )
    .unwrap();
    let event_file = dir.join("events");
    let api = Api::start(&dir, "web-1", &config, Some(&event_file));

    let (s, ping) = api.get("vmm.ping");
    assert_eq!(
        (s, ping["version"].as_str()),
        (200, Some("27.0.0")),
        "{ping}"
    );
    // Nothing created yet: 404 with Cloud Hypervisor's error body.
    let (s, _) = api.get("vm.info");
    assert_eq!(s, 404);
    for e in [
        "vm.boot",
        "vm.pause",
        "vm.resume",
        "vm.shutdown",
        "vm.reboot",
    ] {
        let m = error_messages(&api.put(e, None, 404));
        assert!(
            m.iter().any(|m| m.contains("no VM is created")),
            "{e}: {m:?}"
        );
    }
    api.put("vm.delete", None, 204);
    // Unknown endpoint, wrong method.
    assert_eq!(api.call("GET", "vm.migrate", None).status, 404);
    assert_eq!(api.call("GET", "vm.send-migration", None).status, 400);
    assert_eq!(api.call("GET", "vm.snapshot", None).status, 400);
    assert_eq!(api.call("PUT", "vm.info", None).status, 400);
    assert_eq!(api.call("GET", "vm.boot", None).status, 400);
    // What farvm cannot do is refused, naming the field: a disk or a network interface the
    // test guest cannot drive, tap descriptors.
    let mut with_disk = create_body(&kernel, &["seq:ws=8M"], 64 << 20);
    with_disk["disks"] = json!([{"path": "/var/lib/disk.img"}]);
    let m = error_messages(&api.put("vm.create", Some(&with_disk), 400));
    assert!(
        m.iter()
            .any(|m| m.starts_with("disks: disks need a Linux guest")),
        "{m:?}"
    );
    let mut with_net = create_body(&kernel, &["seq:ws=8M"], 64 << 20);
    with_net["net"] = json!([{"tap": "tap0"}]);
    let m = error_messages(&api.put("vm.create", Some(&with_net), 400));
    assert!(
        m.iter()
            .any(|m| m.starts_with("net: network interfaces need a Linux guest")),
        "{m:?}"
    );
    // Tap descriptors come over SCM_RIGHTS, which the API does not take yet.
    with_net["net"] = json!([{"fds": [3]}]);
    let m = error_messages(&api.put("vm.create", Some(&with_net), 400));
    assert!(m.iter().any(|m| m.contains("`net[0].fds`")), "{m:?}");
    let m = error_messages(&api.put("vm.create", None, 400));
    assert!(m.iter().any(|m| m.contains("JSON body")), "{m:?}");
    let missing = create_body(&dir.join("no-such-kernel"), &[], 64 << 20);
    let m = error_messages(&api.put("vm.create", Some(&missing), 400));
    assert!(m.iter().any(|m| m.contains("no-such-kernel")), "{m:?}");
    assert_eq!(
        api.get("vm.info").0,
        404,
        "a refused create creates nothing"
    );

    // Long enough to pause it mid-run (remote memory at 25% local: the host config's section).
    let workloads = ["seq:ws=32M,passes=40"];
    let body = create_body(&kernel, &workloads, 128 << 20);
    api.put("vm.create", Some(&body), 204);
    let m = error_messages(&api.put("vm.create", Some(&body), 405));
    assert!(m.iter().any(|m| m.contains("already created")), "{m:?}");
    assert_eq!(api.state(), "Created");
    api.put("vm.pause", None, 405);
    api.put("vm.resume", None, 405);
    api.put("vm.shutdown", None, 405);

    api.put("vm.boot", None, 204);
    let (_, info) = api.get("vm.info");
    assert_eq!(info["state"], "Running", "{info}");
    assert_eq!(info["config"]["memory"]["size"], 128 << 20);
    assert_eq!(info["memory_actual_size"], 128 << 20);
    let pty = PathBuf::from(
        info["config"]["console"]["file"]
            .as_str()
            .expect("pty path"),
    );
    assert!(pty.starts_with("/dev/pts"), "{info}");
    let console = guest_console::read_pty(&pty);
    api.put("vm.boot", None, 405);
    api.put("vm.resume", None, 405);

    api.put("vm.pause", None, 204);
    assert_eq!(api.state(), "Paused");
    api.put("vm.pause", None, 405);
    let (s, counters) = api.get("vm.counters");
    assert_eq!(s, 200, "{counters}");
    let paging = &counters["paging"];
    assert_eq!(
        paging["budget_pages"].as_u64().unwrap() * 4,
        paging["total_pages"].as_u64().unwrap(),
        "the domain's section gives 25% local: {paging}"
    );
    std::thread::sleep(Duration::from_millis(300));
    // What is typed on the pty reaches the guest, which writes the line back (typed while the
    // VM is paused, so its process is certainly still running to be interrupted).
    guest_console::type_line(&pty, "hello from the pty");
    api.put("vm.resume", None, 204);
    assert_eq!(api.state(), "Running");
    let mut text = String::new();
    guest_console::console_until(
        &console,
        &mut text,
        "farvm-testguest: console hello from the pty",
        Duration::from_secs(60),
    );
    // The guest prints its results on the pty and powers off by itself.
    text += &guest_console::console_until_poweroff(&console, Duration::from_secs(300));
    let (procs, end) = guest_console::parse(&text);
    assert_eq!(end, Some((1, 0, 0)), "{text}");
    for l in guest_console::check_against_native(&workloads, 1, &procs) {
        eprintln!("{l}");
    }
    api.wait_state("Shutdown", Duration::from_secs(30));
    let (_, counters) = api.get("vm.counters");
    assert_eq!(
        counters["process.1"]["checksum"].as_u64(),
        Some(procs[0].checksum),
        "{counters}"
    );
    assert!(
        counters["paging"]["counters.demand_faults"]
            .as_u64()
            .unwrap()
            > 0
    );
    api.put("vm.pause", None, 405);
    // A guest that powered off is shut down already; then the VM is Created again.
    api.put("vm.shutdown", None, 204);
    assert_eq!(api.state(), "Created");

    // Boot a fresh VM from the same configuration; reboot it; the pty stays the same.
    api.put("vm.boot", None, 204);
    api.put("vm.reboot", None, 204);
    let (_, info) = api.get("vm.info");
    assert_eq!(info["state"], "Running");
    assert_eq!(info["config"]["console"]["file"], pty.to_str().unwrap());
    api.put("vm.shutdown", None, 204);
    assert_eq!(api.state(), "Created");
    api.put("vm.delete", None, 204);
    assert_eq!(api.get("vm.info").0, 404);

    // vmm.shutdown ends the process, which removes the socket it bound.
    let mut api = api;
    api.put("vmm.shutdown", None, 204);
    let status = api.child.wait().unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(!api.sock.exists(), "socket left behind");
    // Every transition above, in order, as Cloud Hypervisor's event monitor reports it.
    let text = std::fs::read_to_string(&event_file).unwrap();
    assert_eq!(
        events(&text),
        [
            "vmm:starting",
            "vm:booting",
            "vm:booted",
            "vm:pausing",
            "vm:paused",
            "vm:resuming",
            "vm:resumed",
            "vm:shutdown", // the guest powered off
            "vm:booting",
            "vm:booted",
            "vm:rebooting",
            "vm:booting",
            "vm:booted",
            "vm:rebooted",
            "vm:shutdown", // vm.shutdown
            "vm:deleted",
            "vmm:shutdown",
        ],
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_domain_without_a_section_gets_the_defaults_and_sigterm_stops_it() {
    if !kvm_available() {
        return;
    }
    let dir = scratch_dir("defaults");
    let kernel = export_guest(&dir);
    let config = dir.join("farvm.toml");
    std::fs::write(
        &config,
        "[defaults]\nlocal_only = true\n\n[domain.\"other\"]\nlocal_memory = \"25%\"\n",
    )
    .unwrap();
    // The event monitor on a FIFO, as libvirt gives it: its reader opens it while farvm starts.
    let fifo = dir.join("events.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).expect("read the event FIFO"))
    };
    let mut api = Api::start(&dir, "plain", &config, Some(&fifo));
    let body = create_body(&kernel, &["seq:ws=32M,passes=1000"], 128 << 20);
    api.put("vm.create", Some(&body), 204);
    api.put("vm.boot", None, 204);
    let (_, counters) = api.get("vm.counters");
    assert!(
        counters.get("paging").is_none(),
        "[defaults] keeps all RAM local: {counters}"
    );
    assert!(counters["vm"]["uptime_ms"].is_u64(), "{counters}");
    // SIGTERM (what libvirt's destroy sends first) stops the VM and the process.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(api.child.id() as i32, libc::SIGTERM) };
    let status = api.exited_on_sigterm();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    assert!(!api.sock.exists(), "socket left behind");
    // The FIFO ends with the process; vm:shutdown then vmm:shutdown is what makes libvirt mark
    // the domain shut off.
    let text = reader.join().unwrap();
    assert_eq!(
        events(&text),
        [
            "vmm:starting",
            "vm:booting",
            "vm:booted",
            "vm:shutdown",
            "vmm:shutdown"
        ],
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_vmm_ends_when_its_event_monitor_reader_closes_it() {
    // libvirt's ch driver daemonizes the VMM, so it cannot signal it; it closes the event
    // monitor's FIFO when it is done with the domain (shut off, destroyed), and farvm ends.
    let dir = scratch_dir("evclose");
    let config = dir.join("farvm.toml");
    std::fs::write(&config, "[defaults]\nlocal_only = true\n").unwrap();
    let fifo = dir.join("events.fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            use std::io::Read;
            let mut f = std::fs::File::open(fifo).expect("open the event FIFO");
            let mut text = Vec::new();
            let mut buf = [0u8; 256];
            while !text.ends_with(b"}\n\n") {
                let n = f.read(&mut buf).expect("read the event FIFO");
                assert!(n > 0, "the event FIFO ended early");
                text.extend_from_slice(&buf[..n]);
            }
            String::from_utf8(text).unwrap()
            // The reader's end closes here.
        })
    };
    let mut api = Api::start(&dir, "watched", &config, Some(&fifo));
    let text = reader.join().unwrap();
    assert_eq!(events(&text), ["vmm:starting"], "{text}");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = api.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the VMM outlived its event monitor's reader"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
    assert!(!api.sock.exists(), "socket left behind");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A tap attached in a network namespace of its own, the way libvirt attaches one for a
/// `<interface type='ethernet'>` with a virtio model: IFF_TAP | IFF_NO_PI | IFF_VNET_HDR.
struct TapInNetns {
    ns: String,
}

impl Drop for TapInNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.ns]).output();
    }
}

/// Attaches tap `tap` in a new namespace; the namespace (deleted on drop) and the descriptor.
fn tap_in_netns(tap: &str) -> (TapInNetns, std::os::fd::OwnedFd) {
    use std::os::fd::{AsRawFd, OwnedFd};
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "this test attaches a tap in a network namespace: run it as root (CI does)"
    );
    let ns = format!("farvm-api-net-{}", std::process::id());
    let o = Command::new("ip")
        .args(["netns", "add", &ns])
        .output()
        .unwrap();
    assert!(o.status.success(), "ip netns add: {o:?}");
    let guard = TapInNetns { ns: ns.clone() };
    let fd = std::thread::scope(|s| {
        s.spawn(|| {
            let nsf = std::fs::File::open(format!("/run/netns/{ns}")).unwrap();
            // SAFETY: setns on a namespace file held open; only this thread moves.
            let rc = unsafe { libc::setns(nsf.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            let tun = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/net/tun")
                .unwrap();
            // struct ifreq: the name, then the flags (a short) at offset 16.
            let mut req = [0u8; 40];
            req[..tap.len()].copy_from_slice(tap.as_bytes());
            let flags: u16 = 0x0002 | 0x1000 | 0x4000; // IFF_TAP | IFF_NO_PI | IFF_VNET_HDR
            req[16..18].copy_from_slice(&flags.to_ne_bytes());
            const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
            // SAFETY: TUNSETIFF reads and writes the ifreq `req` points at, 40 bytes.
            let rc = unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF as _, req.as_mut_ptr()) };
            assert_eq!(rc, 0, "TUNSETIFF: {}", std::io::Error::last_os_error());
            OwnedFd::from(tun)
        })
        .join()
        .unwrap()
    });
    (guard, fd)
}

/// `PUT vm.add-net` as libvirt's driver sends it: the whole request in one `sendmsg` with the
/// descriptors, on a connection of its own; the response's status line.
fn add_net(api: &Api, body: &str, fds: &[std::os::fd::RawFd]) -> String {
    use std::io::Read;
    let c = std::os::unix::net::UnixStream::connect(&api.sock).unwrap();
    let req = format!(
        "PUT /api/v1/vm.add-net HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    farvm_httpd::fdpass::send_with_fds(&c, req.as_bytes(), fds).unwrap();
    let mut buf = [0u8; 1024];
    let n = (&c).read(&mut buf).unwrap();
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn vm_add_net_takes_the_tap_descriptor_libvirt_sends_before_boot_and_refuses_the_rest() {
    use std::os::fd::AsRawFd;
    if !kvm_available() {
        return;
    }
    let dir = scratch_dir("addnet");
    let config = dir.join("farvm.toml");
    std::fs::write(&config, "").unwrap();
    // A Linux-kind kernel (network devices need one); it is never run here.
    let kernel = dir.join("bzImage");
    std::fs::write(&kernel, common::bzimage(4, 0x1000, 5 * 512 + 0x10000)).unwrap();
    let api = Api::start(&dir, "addnet", &config, None);
    let body = r#"{"id":"net_0","mac":"52:54:00:12:34:56","num_queues":2}"#;
    let (ns, tap) = tap_in_netns("fvapi0");

    // Before vm.create there is no VM to add it to.
    let r = add_net(&api, body, &[tap.as_raw_fd()]);
    assert!(r.starts_with("HTTP/1.1 404"), "{r}");
    api.put(
        "vm.create",
        Some(&json!({"kernel": {"path": kernel}, "memory": {"size": 64u64 << 20}})),
        204,
    );
    // Refused, naming why: no descriptor, two, one that is not a tap, more queues.
    let null = std::fs::File::open("/dev/null").unwrap();
    for (fds, b, why) in [
        (vec![], body, "without a tap descriptor"),
        (
            vec![tap.as_raw_fd(), tap.as_raw_fd()],
            body,
            "came with 2 descriptors",
        ),
        (vec![null.as_raw_fd()], body, "not an attached tap"),
        (
            vec![tap.as_raw_fd()],
            r#"{"num_queues":4}"#,
            "one queue pair",
        ),
    ] {
        let r = add_net(&api, b, &fds);
        assert!(
            r.starts_with("HTTP/1.1 400") && r.contains(why),
            "{why}: {r}"
        );
    }
    let r = add_net(&api, body, &[tap.as_raw_fd()]);
    assert!(r.starts_with("HTTP/1.1 204"), "{r}");
    // The VMM holds the tap now: this side's descriptor goes, and the tap (not persistent:
    // it would vanish with its last descriptor) stays, with its carrier up once set up.
    drop(tap);
    let ip = |args: &[&str]| {
        let o = Command::new("ip")
            .args(["-n", &ns.ns])
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "ip {args:?}: {o:?}");
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    ip(&["link", "set", "fvapi0", "up"]);
    let link = ip(&["link", "show", "fvapi0"]);
    assert!(
        link.contains(",UP") && !link.contains("NO-CARRIER"),
        "{link}"
    );
    let log = std::fs::read_to_string(dir.join("addnet.log")).unwrap();
    assert!(
        log.contains("network device added") && log.contains("fvapi0"),
        "{log}"
    );
}

/// Process 1 of the API's VM finished its workload `workload` with the native checksum.
fn assert_finished_natively(api: &Api, workload: &str) {
    let (_, c) = api.get("vm.counters");
    assert_eq!(
        c["process.1"]["state"],
        farvm_guest_agent::pv::state::DONE,
        "{c}"
    );
    assert_eq!(
        c["process.1"]["checksum"].as_u64(),
        Some(common::native_checksum(workload)),
        "{c}"
    );
}

/// Waits (bounded) until process 1 of the API's VM runs its measured phase.
fn wait_for_measured_phase(api: &Api) {
    let t0 = Instant::now();
    loop {
        let (_, c) = api.get("vm.counters");
        let p = &c["process.1"];
        if p["state"] == farvm_guest_agent::pv::state::RUNNING
            && p["phase"] == farvm_guest_agent::pv::phase::MEASURE
        {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(300),
            "the workload never reached its measured phase: {c}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn vm_snapshot_and_vm_restore_resume_the_guest_in_another_vmm() {
    if !kvm_available() {
        return;
    }
    let dir = scratch_dir("snapshot");
    let kernel = export_guest(&dir);
    let config = dir.join("farvm.toml");
    // The host's snapshot key seals what vm.snapshot writes (`virsh save`).
    let key = dir.join("snapshot.key");
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&key)
            .unwrap();
        f.write_all(&[0x5a; 32]).unwrap();
    }
    let plain = "[defaults]\nlocal_memory = \"25%\"\n";
    let keyed = format!("{plain}snapshot_key_file = \"{}\"\n", key.display());
    std::fs::write(&config, &keyed).unwrap();
    let snap = dir.join("saved");
    let url = json!({ "destination_url": format!("file://{}", snap.display()) });
    let workload = "seq:ws=32M,passes=40,write=1,verify=1";

    let log = dir.join("events-1");
    let api = Api::start(&dir, "web-2", &config, Some(&log));
    // Nothing to save yet.
    api.put("vm.snapshot", Some(&url), 404);
    api.put(
        "vm.create",
        Some(&create_body(&kernel, &[workload], 96 << 20)),
        204,
    );
    api.put("vm.snapshot", Some(&url), 405);
    // Only file:// URLs: a snapshot is a directory on this host.
    let bad = json!({ "destination_url": "tcp://10.0.0.1:7000" });
    let m = error_messages(&api.put("vm.snapshot", Some(&bad), 400));
    assert!(m.iter().any(|m| m.contains("file://")), "{m:?}");
    api.put("vm.boot", None, 204);
    wait_for_measured_phase(&api);
    api.put("vm.snapshot", Some(&url), 204);
    // Saved, the VM stops; its workload had not finished.
    api.wait_state("Shutdown", Duration::from_secs(30));
    let (_, c) = api.get("vm.counters");
    assert_ne!(
        c["process.1"]["state"],
        farvm_guest_agent::pv::state::DONE,
        "{c}"
    );
    api.put("vmm.shutdown", None, 204);
    drop(api);
    let ev = events(&std::fs::read_to_string(&log).unwrap());
    assert!(
        ev.windows(2)
            .any(|w| w == ["vm:snapshotting", "vm:snapshotted"]),
        "{ev:?}"
    );
    // The saved VM's last event is `vm:snapshotted`, as with Cloud Hypervisor: a `vm:shutdown`
    // after it would turn libvirt's "shut off (saved)" into "shut off (shutdown)".
    assert!(
        !ev.iter()
            .skip_while(|e| *e != "vm:snapshotted")
            .any(|e| e == "vm:shutdown"),
        "{ev:?}"
    );

    let manifest: Value =
        serde_json::from_slice(&std::fs::read(snap.join("manifest.json")).unwrap()).unwrap();
    assert!(manifest["sealed"]["key_id"].is_string(), "{manifest}");

    // Another VMM restores it, paused, under its own name; resumed, the guest finishes. A
    // host without the snapshot key cannot.
    std::fs::write(&config, plain).unwrap();
    let log = dir.join("events-2");
    let api = Api::start(&dir, "web-3", &config, Some(&log));
    let from = json!({ "source_url": format!("file://{}", snap.display()) });
    let missing = json!({ "source_url": format!("file://{}", dir.join("none").display()) });
    let m = error_messages(&api.put("vm.restore", Some(&missing), 500));
    assert!(m.iter().any(|m| m.contains("no snapshot at")), "{m:?}");
    let m = error_messages(&api.put("vm.restore", Some(&from), 500));
    assert!(
        m.iter()
            .any(|m| m.contains("is sealed") && m.contains("snapshot_key_file")),
        "{m:?}"
    );
    std::fs::write(&config, &keyed).unwrap();
    api.put("vm.restore", Some(&from), 204);
    assert_eq!(api.state(), "Paused");
    api.put("vm.restore", Some(&from), 405);
    api.put("vm.resume", None, 204);
    api.wait_state("Shutdown", Duration::from_secs(300));
    assert_finished_natively(&api, workload);
    api.put("vmm.shutdown", None, 204);
    drop(api);
    let ev = events(&std::fs::read_to_string(&log).unwrap());
    assert!(
        ev.windows(2).any(|w| w == ["vm:restoring", "vm:restored"]),
        "{ev:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The pool VM's host config: its RAM at 25% local on `pool`, migrations sealed with `key`
/// (none: the host has no migration key).
fn pool_config(path: &Path, pool: &pool_harness::Pool, key: Option<&Path>) {
    let mut text = format!(
        "[defaults]\npool = {{ endpoints = [\"{}\"] }}\nlocal_memory = \"25%\"\n",
        pool.url()
    );
    if let Some(k) = key {
        text.push_str(&format!("migration_key_file = \"{}\"\n", k.display()));
    }
    std::fs::write(path, text).unwrap();
}

/// `vm.receive-migration` on `dst` and `vm.send-migration` on `src`; their answers. The
/// destination listens once its request runs: until then the source's connection is refused,
/// which leaves its VM running, and the source asks again.
fn migrate_between(src: &Api, dst: &Api, to: &Value, at: &Value) -> (Response, Response) {
    std::thread::scope(|scope| {
        let receiving = scope.spawn(|| dst.call("PUT", "vm.receive-migration", Some(at)));
        let t0 = Instant::now();
        let sent = loop {
            let r = src.call("PUT", "vm.send-migration", Some(to));
            if !(r.status == 500 && r.body.contains("connecting to the destination")) {
                break r;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(60),
                "the destination never listened: {}",
                r.body
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        (sent, receiving.join().unwrap())
    })
}

#[test]
fn vm_send_migration_moves_a_pool_vm_to_the_api_server_receiving_it() {
    use std::os::unix::fs::PermissionsExt;
    if !kvm_available() {
        return;
    }
    let dir = scratch_dir("migrate");
    let kernel = export_guest(&dir);
    let pool = pool_harness::Pool::start(&["r1", "r2", "r3"], "512M");
    let key = dir.join("migration.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = dir.join("farvm.toml");
    pool_config(&config, &pool, None);
    let dst_config = dir.join("farvm-dst.toml");
    pool_config(&dst_config, &pool, None);
    // Read-modify-write passes over 96 MiB of a 128 MiB guest, 32 MiB of it local.
    let workload = "seq:ws=96M,passes=6,write=1,verify=1";

    let src_events = dir.join("events-src");
    let dst_events = dir.join("events-dst");
    let src = Api::start(&dir, "mig-src", &config, Some(&src_events));
    let dst = Api::start(&dir, "mig-dst", &dst_config, Some(&dst_events));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let to = json!({ "destination_url": format!("tcp:127.0.0.1:{port}"), "local": false });
    let at = json!({ "receiver_url": format!("tcp:127.0.0.1:{port}") });

    // Nothing to migrate yet; farvm migrates over TCP only.
    src.put("vm.send-migration", Some(&to), 404);
    for (api, endpoint, field) in [
        (&src, "vm.send-migration", "destination_url"),
        (&dst, "vm.receive-migration", "receiver_url"),
    ] {
        let unix = json!({ field: "unix:/run/migration.sock" });
        let m = error_messages(&api.put(endpoint, Some(&unix), 400));
        assert!(
            m.iter().any(|m| m.contains("TCP only: tcp:HOST:PORT")),
            "{endpoint}: {m:?}"
        );
    }
    src.put(
        "vm.create",
        Some(&create_body(&kernel, &[workload], 128 << 20)),
        204,
    );
    src.put("vm.boot", None, 204);
    let admitted = pool.wait("the VM admitted", |v| v.vms.len() == 1);
    let id = *admitted.vms.keys().next().unwrap();
    wait_for_measured_phase(&src);
    // A host without a migration key refuses both ends; the VM runs on.
    for (api, endpoint, body) in [
        (&src, "vm.send-migration", &to),
        (&dst, "vm.receive-migration", &at),
    ] {
        let m = error_messages(&api.put(endpoint, Some(body), 500));
        assert!(
            m.iter().any(|m| m.contains("set migration_key_file")),
            "{endpoint}: {m:?}"
        );
    }
    assert_eq!(src.state(), "Running");

    // A destination under another key: nothing moves, both fail, the VM runs on here.
    let other_key = dir.join("other.key");
    std::fs::write(&other_key, [8u8; 32]).unwrap();
    std::fs::set_permissions(&other_key, std::fs::Permissions::from_mode(0o600)).unwrap();
    pool_config(&config, &pool, Some(&key));
    pool_config(&dst_config, &pool, Some(&other_key));
    let (sent, received) = migrate_between(&src, &dst, &to, &at);
    assert_eq!(sent.status, 500, "{}", sent.body);
    assert!(sent.body.contains("not authentic"), "{}", sent.body);
    assert_eq!(received.status, 500, "{}", received.body);
    assert_eq!(src.state(), "Running");
    assert_eq!(dst.get("vm.info").0, 404, "no VM at the destination");

    pool_config(&dst_config, &pool, Some(&key));
    let (sent, received) = migrate_between(&src, &dst, &to, &at);
    assert_eq!(sent.status, 204, "vm.send-migration: {}", sent.body);
    assert_eq!(
        received.status, 204,
        "vm.receive-migration: {}",
        received.body
    );
    // The source stopped its VM; the destination runs it, one VM in the pool on the same id.
    assert_eq!(src.state(), "Shutdown");
    let (_, c) = src.get("vm.counters");
    assert_ne!(
        c["process.1"]["state"],
        farvm_guest_agent::pv::state::DONE,
        "the workload finished before the migration: {c}"
    );
    let v = pool.dir.view().unwrap();
    assert_eq!(v.vms.len(), 1, "{:?}", v.vms);
    assert!(v.vms.contains_key(&id), "{:?}", v.vms);
    // A second VM is not received on top of it.
    dst.put("vm.receive-migration", Some(&at), 405);
    dst.wait_state("Shutdown", Duration::from_secs(300));
    assert_finished_natively(&dst, workload);
    src.put("vmm.shutdown", None, 204);
    dst.put("vmm.shutdown", None, 204);
    drop((src, dst));
    let ev = events(&std::fs::read_to_string(&src_events).unwrap());
    assert!(
        ev.windows(2)
            .any(|w| w == ["vm:migration-started", "vm:migration-finished"]),
        "{ev:?}"
    );
    assert!(
        !ev.iter()
            .skip_while(|e| *e != "vm:migration-finished")
            .any(|e| e == "vm:shutdown"),
        "{ev:?}"
    );
    pool.wait("the migrated VM's pages dropped at its exit", |v| {
        v.vms.is_empty() && v.slabs.is_empty() && pool_harness::Pool::used(v) == 0
    });
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_vmm_waiting_for_a_migrating_vm_still_stops_on_sigterm() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch_dir("receive-term");
    let key = dir.join("migration.key");
    std::fs::write(&key, [7u8; 32]).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = dir.join("farvm.toml");
    std::fs::write(
        &config,
        format!("[defaults]\nmigration_key_file = \"{}\"\n", key.display()),
    )
    .unwrap();
    let mut api = Api::start(&dir, "mig-wait", &config, None);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let at = json!({ "receiver_url": format!("tcp:127.0.0.1:{port}") });
    let pid = api.child.id() as i32;
    let log = dir.join("mig-wait.log");
    let answer = std::thread::scope(|scope| {
        let waiting = scope.spawn(|| api.call("PUT", "vm.receive-migration", Some(&at)));
        let t0 = Instant::now();
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("waiting for a migrating VM")
        {
            assert!(t0.elapsed() < Duration::from_secs(30), "never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        waiting.join().unwrap()
    });
    assert_eq!(answer.status, 500, "{}", answer.body);
    assert!(
        answer.body.contains("the VMM is stopping (signal 15)"),
        "{}",
        answer.body
    );
    let status = api.exited_on_sigterm();
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    let _ = std::fs::remove_dir_all(&dir);
}
