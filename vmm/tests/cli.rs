//! The `farvm` binary: documented exit statuses and messages for bad `farvm run` inputs, a
//! clean shutdown on SIGINT, and the control socket (`farvm status|stats|shutdown`).

mod common;

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use farvm_guest_agent::pv;
use farvm_vmm::exit_code;

fn farvm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_farvm"));
    c.env("XDG_RUNTIME_DIR", scratch_dir());
    c
}

fn scratch_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("farvm-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(args: &[&str]) -> Output {
    farvm().args(args).output().expect("spawn farvm")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn write_file(name: &str, bytes: &[u8]) -> PathBuf {
    let p = scratch_dir().join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn bad_arguments_exit_64() {
    for (args, needle) in [
        (vec!["run", "--memory", "12X"], "unknown unit"),
        (vec!["run", "--memory", "lots"], "not a number"),
        (vec!["run", "--vcpus", "0"], "0 is not in 1..=255"),
        (
            vec!["run", "--vcpus", "17"],
            "more than the test guest supports (16)",
        ),
        (
            vec!["run", "--workload", "nosuch"],
            "unknown workload `nosuch`",
        ),
        (
            vec!["run", "--workload", "seq:cpu=4", "--vcpus", "2"],
            "cpu=4",
        ),
        (
            vec!["run", "--workload", "seq:ws=lots"],
            "not a number or size",
        ),
        (vec!["run", "--bogus-flag"], "--bogus-flag"),
        (vec!["run", "--memory", "1M"], "at least 16 MiB"),
        (vec!["run", "--memory", "100T"], "at most 240 GiB"),
        (
            vec!["run", "--memory", "64M", "--workload", "seq:ws=64M"],
            "working sets add up",
        ),
    ] {
        let o = run(&args);
        assert_eq!(
            o.status.code(),
            Some(exit_code::USAGE),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn missing_kernel_exits_66() {
    let o = run(&["run", "--kernel", "/nonexistent/kernel.elf"]);
    assert_eq!(o.status.code(), Some(exit_code::NO_INPUT), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--kernel: cannot read /nonexistent/kernel.elf"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn malformed_kernels_exit_65() {
    if !kvm_available() {
        return;
    }
    let garbage = write_file("garbage.bin", &[0x42; 4096]);
    let o = run(&["run", "--kernel", garbage.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(exit_code::BAD_KERNEL),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("not a kernel image"), "{}", stderr(&o));

    let good = kernel_with(&[0xf4], &[]);
    let truncated = write_file("truncated.elf", &good[..0x1000]);
    let o = run(&["run", "--kernel", truncated.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(exit_code::BAD_KERNEL),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("truncated"), "{}", stderr(&o));

    let mut bad_entry = good.clone();
    bad_entry[24..32].copy_from_slice(&0x1234u64.to_le_bytes());
    let p = write_file("badentry.elf", &bad_entry);
    let o = run(&["run", "--kernel", p.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(exit_code::BAD_KERNEL),
        "{}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("entry point"), "{}", stderr(&o));
}

/// `farvm run --kernel KERNEL [--initrd INITRD] --stop-at-entry`.
fn boot_to_entry(kernel: &std::path::Path, initrd: Option<&std::path::Path>) -> Output {
    let mut args = vec![
        "run",
        "--kernel",
        kernel.to_str().unwrap(),
        "--stop-at-entry",
    ];
    if let Some(rd) = initrd {
        args.extend(["--initrd", rd.to_str().unwrap()]);
    }
    run(&args)
}

#[test]
fn a_truncated_bzimage_and_an_initrd_no_kernel_could_use_exit_65() {
    if !kvm_available() {
        return;
    }
    let refused = |o: &Output, why: &str| {
        let err = stderr(o);
        assert_eq!(o.status.code(), Some(exit_code::BAD_KERNEL), "{err}");
        assert!(err.contains(why), "{err}");
    };
    let (sects, paragraphs) = (4u8, 0x1000u32);
    let full = 5 * 512 + paragraphs as usize * 16;
    let cut = write_file("cut.bzImage", &bzimage(sects, paragraphs, full - 4096));
    refused(
        &boot_to_entry(&cut, None),
        &format!(
            "bzImage is truncated: its setup header says {full} bytes, the file has {}",
            full - 4096
        ),
    );
    let kernel = write_file("whole.bzImage", &bzimage(sects, paragraphs, full));
    let junk = write_file("junk.initrd", b"this is not an initramfs\n");
    refused(
        &boot_to_entry(&kernel, Some(&junk)),
        "initrd is unusable: it is neither an initramfs",
    );
    // The same kernel with a (gzip) initramfs gets to its entry point.
    let gz = write_file("ok.initrd", b"\x1f\x8b\x08\x00\x00\x00\x00\x00");
    let o = boot_to_entry(&kernel, Some(&gz));
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
}

/// A guest that pulses the reset line through the keyboard controller (what Linux tries after
/// the ACPI reset register) ends the VM as a reboot: exit 75, not a spin in real mode.
#[test]
fn the_i8042_reset_command_is_a_reboot() {
    if !kvm_available() {
        return;
    }
    let mut a = Asm::default();
    // outb, as Linux writes the controller's command port.
    a.mov_dx(0x64)
        .mov_al(0xad)
        .out8()
        .mov_al(0xfe)
        .out8()
        .spin();
    let k = write_file("i8042.elf", &kernel_with(&a.code, &[]));
    let o = run(&[
        "run",
        "--kernel",
        k.to_str().unwrap(),
        "--no-control-socket",
        "--timeout",
        "60",
    ]);
    assert_eq!(
        o.status.code(),
        Some(exit_code::GUEST_REBOOT),
        "{}",
        stderr(&o)
    );
}

/// A running VMM ignores SIGPIPE: a memory server, etcd or API client that closes its end makes
/// a write fail, where the default action killed the VMM (exit 141, seen under
/// `farvm-lab nemesis` seed 73). Other commands keep the default (`farvm stats | head`).
#[test]
fn a_running_vmm_ignores_sigpipe() {
    if !kvm_available() {
        return;
    }
    let mut a = Asm::default();
    a.spin();
    let k = write_file("sigpipe.elf", &kernel_with(&a.code, &[]));
    let mut child = farvm()
        .args([
            "run",
            "--kernel",
            k.to_str().unwrap(),
            "--no-control-socket",
        ])
        .args(["--timeout", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let t0 = Instant::now();
    let ignored = loop {
        // The disposition is set right after the arguments are parsed; the process may still
        // be exec'ing when first looked at.
        let text = std::fs::read_to_string(&status).unwrap_or_default();
        let mask = text
            .lines()
            .find_map(|l| l.strip_prefix("SigIgn:"))
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .unwrap_or(0);
        let ignored = mask & (1 << (libc::SIGPIPE - 1)) != 0;
        if ignored || t0.elapsed() > Duration::from_secs(10) {
            break ignored;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(ignored, "farvm run does not ignore SIGPIPE");
}

#[test]
fn guest_status_and_crash_statuses() {
    if !kvm_available() {
        return;
    }
    let mut a = Asm::default();
    a.out_port(pv::PORT_SHUTDOWN, 7).spin();
    let k = write_file("status7.elf", &kernel_with(&a.code, &[]));
    let o = run(&[
        "run",
        "--kernel",
        k.to_str().unwrap(),
        "--no-control-socket",
    ]);
    assert_eq!(o.status.code(), Some(7), "{}", stderr(&o));

    let mut a = Asm::default();
    a.raw(&[0x66, 0x0f, 0x6e, 0xc0]);
    let k = write_file("sse.elf", &kernel_with(&a.code, &[]));
    let o = run(&[
        "run",
        "--kernel",
        k.to_str().unwrap(),
        "--no-control-socket",
    ]);
    assert_eq!(
        o.status.code(),
        Some(exit_code::GUEST_CRASH),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("KVM_EXIT_INTERNAL_ERROR"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn sigint_shuts_down_cleanly_and_control_socket_answers() {
    if !kvm_available() {
        return;
    }
    let mut a = Asm::default();
    a.out_port(pv::PORT_CPU_DONE, 0).spin();
    let k = write_file("spin.elf", &kernel_with(&a.code, &[]));
    let sock = scratch_dir().join("spin.sock");
    let mut child = farvm()
        .args([
            "run",
            "--kernel",
            k.to_str().unwrap(),
            "--vcpus",
            "2",
            "--name",
            "spin",
        ])
        .args(["--control-socket", sock.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "control socket never appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = farvm()
        .args(["status", "--socket", sock.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(status.status.success(), "{}", stderr(&status));
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["name"], "spin");
    assert_eq!(v["vcpus"], 2);
    assert_eq!(v["vcpu"][1]["thread"], "vcpu1");
    let stats = farvm()
        .args(["stats", "--socket", sock.to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert!(stats.status.success(), "{}", stderr(&stats));
    let v: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert!(v["exits"]["io_pv"].as_u64().is_some(), "{v}");
    // Both vCPUs report CPU-done right after entry; the text table shows it per vCPU.
    let t = Instant::now();
    loop {
        let o = farvm()
            .args(["stats", "--socket", sock.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        if text.contains("vcpu1: no agent slot, 0 context switches, done") {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "{text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Each vCPU reports its own state, read by its thread once kicked out of KVM_RUN (here
    // also out of KVM's halted state, where a finished vCPU waits).
    let v = farvm_vmm::control::request(&sock, "vcpus").expect("the vcpus command");
    let states = v["vcpus"].as_array().expect("an array of vCPU states");
    assert_eq!(states.len(), 2, "{v}");
    for (i, s) in states.iter().enumerate() {
        let s = s
            .as_str()
            .unwrap_or_else(|| panic!("vCPU {i} did not answer: {v}"));
        assert!(s.starts_with("mp_state "), "{s}");
        assert!(s.contains(" at RIP 0x"), "{s}");
        assert!(s.contains(&format!("lapic: id {i:#x} ")), "{s}");
        assert!(s.contains(" IRR ") && s.contains(" TMICT "), "{s}");
    }

    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let t1 = Instant::now();
    let out = loop {
        if let Some(_s) = child.try_wait().unwrap() {
            break child.wait_with_output().unwrap();
        }
        assert!(
            t1.elapsed() < Duration::from_secs(20),
            "farvm did not stop on SIGINT"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(
        out.status.code(),
        Some(exit_code::SIGINT),
        "{}",
        stderr(&out)
    );
    assert!(!sock.exists(), "control socket left behind");
}

#[test]
fn control_socket_shutdown() {
    if !kvm_available() {
        return;
    }
    let mut a = Asm::default();
    a.spin();
    let k = write_file("spin2.elf", &kernel_with(&a.code, &[]));
    let child = farvm()
        .args(["run", "--kernel", k.to_str().unwrap(), "--name", "spin2"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = scratch_dir().join("farvm").join("spin2.sock");
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{} never appeared",
            sock.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = farvm()
        .args(["shutdown", "--vm", "spin2"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn help_documents_exit_status() {
    let o = run(&["run", "--help"]);
    assert!(o.status.success());
    let s = String::from_utf8_lossy(&o.stdout);
    for needle in ["EXIT STATUS", "EXAMPLES", "--workload", "130/143"] {
        assert!(s.contains(needle), "missing {needle}");
    }
}

/// `farvm rotate-key --help` says what a rotation does, how to follow it and when it is
/// refused; without a VM it fails naming the socket.
#[test]
fn rotate_key_is_documented_and_needs_a_running_vm() {
    let o = run(&["rotate-key", "--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "re-seals",
        "dropped",
        "farvm stats",
        "refused",
        "EXAMPLE",
        "EXIT STATUS",
    ] {
        assert!(s.contains(needle), "missing {needle}: {s}");
    }
    let o = run(&[
        "rotate-key",
        "--socket",
        "/nonexistent/farvm-keys-test.sock",
    ]);
    assert_eq!(
        o.status.code(),
        Some(exit_code::HOST_ERROR),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("farvm-keys-test.sock"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn help_lists_only_the_operator_commands() {
    let o = run(&["--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    let commands: Vec<&str> = s
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        commands,
        [
            "run",
            "stats",
            "status",
            "shutdown",
            "rotate-key",
            "snapshot",
            "migrate",
            "pool",
            "image",
            "api",
            "help"
        ],
        "{s}"
    );
    // The lab's commands are the lab binary's, not the operator's.
    for gone in [vec!["bench", "local"], vec!["trace", "report"]] {
        let o = run(&gone);
        assert_eq!(o.status.code(), Some(exit_code::USAGE), "{gone:?}");
    }
}

#[test]
fn builtin_guest_runs_workloads_and_reports_json() {
    if !kvm_available() {
        return;
    }
    let o = run(&[
        "run",
        "--memory",
        "256M",
        "--vcpus",
        "2",
        "--workload",
        "seq:ws=16M,seed=3",
        "--workload",
        "kv:ws=16M,seed=4,ops=100000",
        "--serial",
        "none",
        "--no-control-socket",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
    assert_eq!(v["outcome"]["kind"], "guest_shutdown");
    let procs = v["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    for (p, (spec, cpu)) in procs
        .iter()
        .zip([("seq:ws=16M,seed=3", 0), ("kv:ws=16M,seed=4,ops=100000", 1)])
    {
        let placed = farvm_vmm::workload_spec::place(&[spec.to_string()], 1).unwrap();
        let w = &placed[0];
        let native = farvm_workloads::run_native(w.spec.workload.id, &w.spec.params()).unwrap();
        assert_eq!(p["state_name"], "done", "{p}");
        assert_eq!(p["cpu"], cpu, "{p}");
        assert_eq!(p["checksum"].as_u64(), Some(native.checksum), "{p}");
        assert!(p["time_ms"].as_f64().unwrap() > 0.0);
        // Host timestamps of the phases: setup, warm-up, measure, measured, done.
        assert!(p["events"].as_array().unwrap().len() >= 4, "{p}");
    }
}

#[test]
fn serial_console_goes_to_a_file() {
    if !kvm_available() {
        return;
    }
    let mut a = Asm::default();
    for b in b"farvm!\n" {
        a.mov_dx(0x3f8).mov_al(*b).out8();
    }
    a.out_port(pv::PORT_SHUTDOWN, 0).spin();
    let k = write_file("serial.elf", &kernel_with(&a.code, &[]));
    let log = scratch_dir().join("console.log");
    let o = run(&[
        "run",
        "--kernel",
        k.to_str().unwrap(),
        "--serial",
        log.to_str().unwrap(),
        "--no-control-socket",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "farvm!\n");
    assert!(!String::from_utf8_lossy(&o.stdout).contains("farvm!"));
}
