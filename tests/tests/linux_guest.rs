//! A stock Linux guest under `farvm run`, on remote memory: the KVM lab's Debian kernel with
//! the test initramfs and ext4 data disk that `scripts/linux-guest-image.sh` builds, two vCPUs
//! (the kernel starts the second itself with INIT/SIPI from the MADT), 40% of guest RAM local.
//! Through the console (16550, interrupt-driven input from farvm's stdin) the test waits for the
//! guest's shell, copies a file from the virtio-blk disk and writes a 48 MiB file into tmpfs —
//! more than the local budget, so guest pages go to the memory server and come back — checks
//! both checksums against the host's, and powers the guest off: farvm must exit 0, having
//! written pages back and served demand faults.
//!
//! A stock kernel needs a host whose KVM runs guest ring 0 on the CPU (two-dimensional
//! paging); where guest ring 0 is emulated (PVM), booting it takes hours. There the test checks
//! the boot setup only (the same kernel, initrd, disk, vCPUs and remote memory, stopped at the
//! kernel's entry), says so, and fails if `FARVM_REQUIRE_LINUX_BOOT=1`: the KVM lab stage of CI
//! sets it (.ci/lab-tests), so the boot itself is proven there.
//!
//! The image comes from `FARVM_LINUX_GUEST=DIR` (a directory the script built; `scripts/kvm-lab
//! test` sets it) or, if unset, from running the script (which caches its result).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod linux_common;

use linux_common::*;

/// The tmpfs file: 48 MiB of `yes farvm` (with the 16 MiB blob, within tmpfs's default size,
/// half of the guest's RAM; with what the guest itself uses, beyond the local budget).
const FILE_BYTES: u64 = 48 << 20;

/// On a host without two-dimensional paging: the same VM, stopped at the kernel's entry.
fn check_boot_setup(img: &GuestImage, disk: &Path) {
    let mut args = run_args(img, disk, Duration::from_secs(60));
    args.push("--stop-at-entry".into());
    let out = Command::new(farvm_bin())
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn farvm");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "farvm --stop-at-entry: {stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "--json output: {e}: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(v["linux"]["kind"], "bzImage", "{v}");
    assert!(
        v["linux"]["acpi_rsdp_addr"].as_u64().is_some(),
        "ACPI tables: {v}"
    );
    assert!(v["linux"]["initrd_len"].as_u64().unwrap_or(0) > 0, "{v}");
}

#[test]
fn linux_boots_on_remote_memory_runs_programs_on_the_console_and_powers_off() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let img = guest_image();
    let dir = std::env::temp_dir().join(format!("farvm-linux-guest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The guest writes to its disk: a copy, never the cached image.
    let disk = dir.join("disk.img");
    std::fs::copy(&img.disk, &disk).expect("copy the data disk");

    if !farvm_vmm::vstate::vm::two_dimensional_paging() {
        check_boot_setup(&img, &disk);
        let msg = "this host's KVM emulates guest ring 0 (no two-dimensional paging, e.g. PVM): \
                   a stock Linux kernel cannot boot here in useful time, so only its boot setup \
                   (kernel, initrd, disk, 2 vCPUs, ACPI tables, remote memory) was checked; the \
                   boot to userspace runs in the KVM lab (scripts/kvm-lab test)";
        std::fs::remove_dir_all(&dir).ok();
        assert!(
            std::env::var("FARVM_REQUIRE_LINUX_BOOT").as_deref() != Ok("1"),
            "FARVM_REQUIRE_LINUX_BOOT=1: {msg}"
        );
        eprintln!("{msg}");
        return;
    }

    let timeout = farvm_tests::vm_timeout(Duration::from_secs(600));
    let deadline = Instant::now() + timeout + Duration::from_secs(30);
    let t0 = Instant::now();
    let mut vm = Farvm::spawn(&run_args(&img, &disk, timeout));
    let cpus = vm.wait_for("the guest's shell", deadline, |l| {
        let rest = l.split("farvm-guest: ready (").nth(1)?;
        rest.split(' ').next()?.parse::<u32>().ok()
    });
    eprintln!("guest ready after {:.1} s", t0.elapsed().as_secs_f64());
    assert_eq!(cpus, 2, "the kernel brought up both vCPUs");

    vm.type_line(&format!(
        "cd /tmp && cp /mnt/blob b && yes farvm | head -c {FILE_BYTES} > y && \
         set -- $(sha256sum b) && echo BLOB $1 && set -- $(sha256sum y) && echo FILE $1"
    ));
    let blob = vm.wait_for("the blob's checksum", deadline, |l| marked_sum(l, "BLOB"));
    let file = vm.wait_for("the file's checksum", deadline, |l| marked_sum(l, "FILE"));
    assert_eq!(
        blob, img.blob_sha256,
        "the blob read from the virtio-blk disk"
    );
    assert_eq!(
        file,
        host_sha256(&format!("yes farvm | head -c {FILE_BYTES}")),
        "the tmpfs file written and read back on remote memory"
    );
    vm.type_line("cat /sys/devices/system/clocksource/clocksource0/current_clocksource");
    vm.wait_for("the clock source", deadline, |l| {
        (l.trim() == "kvm-clock").then_some(())
    });
    vm.type_line("poweroff");
    let (status, rest) = vm.finish(deadline);
    eprintln!("boot to power-off: {:.1} s", t0.elapsed().as_secs_f64());
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        status,
        Some(0),
        "farvm's exit status after the guest's poweroff"
    );

    let report: serde_json::Value = json_report(&rest);
    assert_eq!(report["exit_status"], 0, "{report}");
    let c = &report["paging"]["engine"]["counters"];
    let n = |k: &str| {
        c[k].as_u64()
            .unwrap_or_else(|| panic!("no counter {k}: {report}"))
    };
    assert!(
        n("remote_writes") > 0,
        "pages went to the memory server: {c}"
    );
    assert!(n("demand_faults") > 0, "and came back on demand: {c}");
    assert_eq!(n("lost_accesses"), 0, "{c}");
    assert_eq!(n("store_errors"), 0, "{c}");
    // No guest agent: one global history. No fault could be given to a process (no vCPU has
    // an agent slot) and the prefetcher saw no fault as a process's virtual page.
    let pp = &report["per_process"];
    assert_eq!(
        pp["processes"].as_array().map(Vec::len),
        Some(0),
        "no process without an agent: {pp}"
    );
    assert!(
        pp["unattributed"]["no_slot"].as_u64().unwrap_or(0) > 0
            && pp["unattributed"]["unreadable"] == 0,
        "the vCPUs' faults went unattributed for want of a slot: {pp}"
    );
    assert_eq!(n("faults_seen_virtual"), 0, "the global history only: {c}");
}

/// A Linux guest that reboots (busybox `reboot -f`: the kernel writes the ACPI reset register)
/// and one whose kernel panics with `panic=-1` (it reboots at once) each end the VM with exit
/// status 75 ("the guest rebooted"), within a minute of the command — never spinning until
/// `--timeout` (600 s here).
#[test]
fn linux_guest_reboot_and_panic_end_the_vm_with_the_documented_status() {
    if !linux_test_can_run("the reboot and panic run in the KVM lab") {
        return;
    }
    let img = guest_image();
    let (dir, disk) = scratch_disk("reboot", &img);
    for (what, command) in [
        ("reboot", "reboot -f"),
        ("panic", "echo c > /proc/sysrq-trigger"),
    ] {
        let timeout = farvm_tests::vm_timeout(Duration::from_secs(600));
        let boot_deadline = Instant::now() + timeout;
        // A control socket, to say what the vCPUs do if the VM does not end; the power
        // device's events in the log.
        let socket = dir.join(format!("{what}.sock"));
        let mut args: Vec<String> = run_args(&img, &disk, timeout)
            .into_iter()
            .filter(|a| a != "--no-control-socket")
            .collect();
        args.extend([
            "--control-socket".into(),
            socket.display().to_string(),
            "--log".into(),
            "info".into(),
        ]);
        let mut vm = Farvm::spawn(&args);
        vm.wait_for("the guest's shell", boot_deadline, |l| {
            l.contains("farvm-guest: ready (").then_some(())
        });
        let t0 = Instant::now();
        vm.type_line(command);
        // Still running 30 s after the command: what its vCPUs do, before the bound kills it.
        let mut states = String::new();
        while vm.child.try_wait().ok().flatten().is_none() {
            if t0.elapsed() > Duration::from_secs(30) {
                states = vm.vcpu_states();
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let (status, rest) = vm.finish(t0 + Duration::from_secs(60));
        eprintln!(
            "{what}: the VM ended {:.1} s after `{command}`",
            t0.elapsed().as_secs_f64()
        );
        assert_eq!(
            status,
            Some(farvm_vmm::exit_code::GUEST_REBOOT),
            "{what}: farvm's exit status after `{command}` (killed after 60 s if None); its \
             last lines:\n{}\n{states}",
            rest.join("\n")
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The Linux guest agent's files (guest-agent/linux/build.sh): `FARVM_GUEST_AGENT=DIR` (a
/// directory the script built; `scripts/kvm-lab test` sets it) or, if unset, the script's
/// output (which it caches).
fn guest_agent_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FARVM_GUEST_AGENT") {
        return dir.into();
    }
    let out = script_output(
        "FARVM_GUEST_AGENT",
        "guest-agent/linux/build.sh",
        "the guest agent module, built against the lab kernel's Debian headers (from a Debian \
         mirror),",
    );
    PathBuf::from(out.trim())
}

/// An ext4 image holding the agent module, its daemon and two copies of the workload program
/// (their file names are the guest process names).
fn agent_disk(dir: &Path) -> PathBuf {
    let agent = guest_agent_dir();
    let root = dir.join("agent-root");
    std::fs::create_dir_all(&root).unwrap();
    for (from, to) in [
        ("farvm_agent.ko", "farvm_agent.ko"),
        ("farvm-agentd", "farvm-agentd"),
        ("farvm-workload", "wl-seq"),
        ("farvm-workload", "wl-kv"),
    ] {
        std::fs::copy(agent.join(from), root.join(to))
            .unwrap_or_else(|e| panic!("{}: {e}", agent.join(from).display()));
    }
    let img = dir.join("agent.img");
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&root)
        .arg(&img)
        .arg("48M")
        .output()
        .expect("mkfs.ext4 (e2fsprogs)");
    assert!(
        out.status.success(),
        "mkfs.ext4: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    img
}

/// A paging-engine counter of a running VM, from its control socket (`farvm stats`). A
/// failed request says whether the VMM is still running, and how it ended if not.
fn paging_counter(vm: &mut Farvm, socket: &Path, name: &str) -> u64 {
    let v = farvm_vmm::control::request(socket, "stats").unwrap_or_else(|e| {
        std::thread::sleep(Duration::from_secs(2));
        let state = match vm.child.try_wait() {
            Ok(Some(status)) => format!("farvm has ended: {status}"),
            Ok(None) => "farvm is still running".to_string(),
            Err(e) => format!("farvm's state is unknown: {e}"),
        };
        panic!("farvm stats on {}: {e} ({state})", socket.display())
    });
    v["paging"]["engine"]["counters"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no paging counter {name} in the stats: {v}"))
}

/// The frames a workload reported (`farvm-workload --frames`), read from the ext4 image after
/// the run: (its pid, its heap's guest-physical frames).
fn reported_frames(disk: &Path, file: &str) -> (u64, Vec<u64>) {
    let out = Command::new("debugfs")
        .args(["-R", &format!("cat /{file}")])
        .arg(disk)
        .output()
        .expect("debugfs (e2fsprogs)");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    let pid = lines
        .next()
        .and_then(|l| l.strip_prefix("pid "))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "/{file} on the data disk has no `pid N` line: {text:?} ({})",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let frames = lines
        .map(|l| u64::from_str_radix(l.trim(), 16).expect("a hex frame number"))
        .collect();
    (pid, frames)
}

/// One fault of `farvm run --fault-log`: (guest page, attributed, pid).
fn fault_log(path: &Path) -> Vec<(u64, bool, u64)> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("the fault log {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let w: Vec<&str> = l.split(' ').collect();
            assert_eq!(w.len(), 4, "fault log line {l:?}");
            (
                u64::from_str_radix(w[0], 16).expect("gpn"),
                w[2] == "1",
                w[3].parse().expect("pid"),
            )
        })
        .collect()
}

/// A Linux guest with the agent attached, at a shell: 25% local memory, a control socket, the
/// agent disk as /dev/vdb (mounted at /a), the module loaded and the daemon running.
struct AgentVm {
    vm: Farvm,
    dir: PathBuf,
    disk: PathBuf,
    socket: PathBuf,
    deadline: Instant,
    t0: Instant,
}

/// Boots [`AgentVm`] named `tag` with `extra` arguments for `farvm run`; on a host without
/// two-dimensional paging checks the boot setup only and returns None (a failure with
/// `FARVM_REQUIRE_LINUX_BOOT=1`).
fn agent_vm(tag: &str, extra: &[String]) -> Option<AgentVm> {
    let img = guest_image();
    let dir = std::env::temp_dir().join(format!("farvm-linux-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let disk = dir.join("disk.img");
    std::fs::copy(&img.disk, &disk).expect("copy the data disk");
    let agent_img = agent_disk(&dir);
    let socket = dir.join("control.sock");
    if !farvm_vmm::vstate::vm::two_dimensional_paging() {
        // The boot setup with the agent disk and the agent device's ACPI table.
        let mut args = run_args(&img, &disk, Duration::from_secs(60));
        args.extend(["--disk".into(), agent_img.to_str().unwrap().into()]);
        args.push("--stop-at-entry".into());
        let out = Command::new(farvm_bin())
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::remove_dir_all(&dir).ok();
        let msg = "this host's KVM emulates guest ring 0: the guest agent runs in the KVM lab";
        assert!(
            std::env::var("FARVM_REQUIRE_LINUX_BOOT").as_deref() != Ok("1"),
            "FARVM_REQUIRE_LINUX_BOOT=1: {msg}"
        );
        eprintln!("{msg}");
        return None;
    }
    let timeout = farvm_tests::vm_timeout(Duration::from_secs(900));
    let deadline = Instant::now() + timeout + Duration::from_secs(30);
    let mut args = run_args(&img, &disk, timeout);
    let local = args.iter().position(|a| a == "--local-memory").unwrap();
    args[local + 1] = "25%".into();
    let no_socket = args
        .iter()
        .position(|a| a == "--no-control-socket")
        .unwrap();
    args[no_socket] = "--control-socket".into();
    args.insert(no_socket + 1, socket.to_str().unwrap().into());
    args.extend(["--disk".into(), agent_img.to_str().unwrap().into()]);
    args.extend(extra.iter().cloned());
    let t0 = Instant::now();
    let mut vm = Farvm::spawn(&args);
    // A boot that has not reached the shell by then has stalled (it took 110-180 s in the
    // lab): the timeout reports the vCPUs' states while the guest is still there.
    let boot_deadline = deadline.min(t0 + Duration::from_secs(600));
    vm.wait_for("the guest's shell", boot_deadline, |l| {
        l.contains("farvm-guest: ready (").then_some(())
    });
    eprintln!("guest ready after {:.1} s", t0.elapsed().as_secs_f64());
    vm.type_line(
        "mkdir -p /a && mount -o ro /dev/vdb /a && insmod /a/farvm_agent.ko && echo AGENT_OK",
    );
    vm.wait_for("the agent module", deadline, |l| {
        (l.trim() == "AGENT_OK").then_some(())
    });
    vm.type_line("/a/farvm-agentd --interval-ms 20 & sleep 1; echo DAEMON_OK");
    vm.wait_for("the agent daemon", deadline, |l| {
        (l.trim() == "DAEMON_OK").then_some(())
    });
    Some(AgentVm {
        vm,
        dir,
        disk,
        socket,
        deadline,
        t0,
    })
}

impl AgentVm {
    /// Powers the guest off; farvm must exit 0. Returns its `--json` report.
    fn power_off(self) -> (serde_json::Value, PathBuf, PathBuf) {
        let AgentVm {
            mut vm,
            dir,
            disk,
            deadline,
            t0,
            ..
        } = self;
        vm.type_line("poweroff");
        let (status, rest) = vm.finish(deadline);
        eprintln!("boot to power-off: {:.1} s", t0.elapsed().as_secs_f64());
        assert_eq!(
            status,
            Some(0),
            "farvm's exit status after the guest's poweroff"
        );
        let report = json_report(&rest);
        (report, dir, disk)
    }
}

/// `PIDS a b` on a console line.
fn two_pids(l: &str, mark: &str) -> Option<(u64, u64)> {
    let mut w = l.trim().strip_prefix(mark)?.trim().split(' ');
    Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
}

/// The pages a per-process entry touched that were not resident: demand faults, zero fills,
/// waits and prefetch hits.
fn pages_touched(p: &serde_json::Value) -> u64 {
    let c = &p["counters"];
    let n = |k: &str| c[k].as_u64().unwrap_or(0);
    n("demand_faults")
        + n("zero_fills")
        + n("wait_faults")
        + p["prefetch_hits"].as_u64().unwrap_or(0)
}

/// The per-process entry of `pid` in a `--json` report.
fn process_entry(report: &serde_json::Value, pid: u64) -> &serde_json::Value {
    report["per_process"]["processes"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["pid"] == pid))
        .unwrap_or_else(|| panic!("no per-process entry for pid {pid}: {report}"))
}

/// The guest agent attached in a Linux guest on remote memory (25% local): two processes
/// touching memory are counted apart, by the name and pid the agent reported, with exact
/// per-process demand faults and prefetch counts — live (`farvm stats --per-process`) and in
/// the final report — and the attribution is checked against the guest's own ground truth.
///
/// The ground truth: each workload process (`farvm-workload --frames`) touches its heap, reads
/// the guest-physical frame of every heap page from `/proc/self/pagemap`, says so on the
/// console, runs, reads its frames again and writes the ones that did not move to the data
/// disk — and keeps its memory until told to exit. Between the moment both have said they
/// populated their heaps and the moment both have written their frames, each of those frames
/// belongs to its process alone; farvm's fault log (`--fault-log`) records, for every fault,
/// the guest page and the pid the faulting vCPU's agent slot named. Of the faults in that
/// window on either process's frames, at least 99% must name that process.
#[test]
fn linux_guest_agent_attributes_two_processes_by_name() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let log = std::env::temp_dir().join(format!("farvm-fault-log-{}", std::process::id()));
    let Some(mut g) = agent_vm(
        "agent",
        &[
            "--no-kvm-async-pf".into(),
            "--fault-log".into(),
            log.to_str().unwrap().into(),
        ],
    ) else {
        return;
    };
    let deadline = g.deadline;
    let vm = &mut g.vm;
    vm.type_line(
        "/a/wl-seq --frames /mnt/f-seq --hold /tmp/go seq:ws=24M,passes=2 & P1=$!; \
         /a/wl-kv --frames /mnt/f-kv --hold /tmp/go kv:ws=24M & P2=$!; echo PIDS $P1 $P2",
    );
    let pids = vm.wait_for("the workloads' pids", deadline, |l| two_pids(l, "PIDS"));
    let said = |what: &'static str| {
        move |l: &str| {
            l.split(&format!("farvm-frames: {what} pid "))
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        }
    };
    let mut populated = [
        vm.wait_for("a workload's heap", deadline, said("populated")),
        vm.wait_for("the other's heap", deadline, said("populated")),
    ];
    populated.sort_unstable();
    let mut want = [pids.0, pids.1];
    want.sort_unstable();
    assert_eq!(populated, want, "both workloads populated their heaps");
    let from = paging_counter(&mut g.vm, &g.socket, "fault_log_records");
    let vm = &mut g.vm;
    vm.wait_for("a workload's frames", deadline, said("held"));
    vm.wait_for("the other's frames", deadline, said("held"));
    let to = paging_counter(&mut g.vm, &g.socket, "fault_log_records");
    eprintln!("fault log window: records {from}..{to}");

    // Live, through the control socket.
    let out = Command::new(farvm_bin())
        .args(["stats", "--per-process", "--socket"])
        .arg(&g.socket)
        .output()
        .expect("farvm stats");
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    eprintln!("{table}");
    assert!(
        out.status.success(),
        "farvm stats --per-process: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (pid, name) in [(pids.0, "wl-seq"), (pids.1, "wl-kv")] {
        assert!(
            table.lines().any(|l| {
                let mut w = l.split_whitespace();
                w.next() == Some(&pid.to_string()) && w.next() == Some(name)
            }),
            "no line for {name} (pid {pid}) in:\n{table}"
        );
    }
    let vm = &mut g.vm;
    vm.type_line("touch /tmp/go; wait $P1 $P2; sync; echo WORK_DONE");
    vm.wait_for("the workloads", deadline, |l| {
        (l.trim() == "WORK_DONE").then_some(())
    });
    let (report, dir, disk) = g.power_off();
    for (pid, name) in [(pids.0, "wl-seq"), (pids.1, "wl-kv")] {
        let p = process_entry(&report, pid);
        assert_eq!(p["name"], name, "{p}");
        let touched = pages_touched(p);
        // 24 MiB each at 25% local of 192 MiB: part of each working set came from remote.
        assert!(touched > 100, "{name} faulted on its pages: {p}");
        for k in ["accuracy", "coverage"] {
            let v = p[k].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v), "{name} {k} {v}");
        }
    }
    eprintln!("per-process: {}", report["per_process"]);

    // Attribution against the guest's own ground truth.
    let mut owner = std::collections::HashMap::new();
    for file in ["f-seq", "f-kv"] {
        let (pid, frames) = reported_frames(&disk, file);
        assert!(
            pid == pids.0 || pid == pids.1,
            "/{file} names pid {pid}, not a workload's ({pids:?})"
        );
        assert!(
            frames.len() > 3000,
            "{file}: pid {pid} reported only {} stable frames of its 24 MiB heap",
            frames.len()
        );
        for f in frames {
            // A frame both reported (impossible while both held their heaps) counts for none.
            if owner.insert(f, pid).is_some() {
                owner.insert(f, 0);
            }
        }
    }
    let faults = fault_log(&log);
    std::fs::remove_file(&log).ok();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        to as usize <= faults.len() && from < to,
        "the fault log holds {} records; the window was {from}..{to}",
        faults.len()
    );
    let (mut total, mut right) = (0u64, 0u64);
    let mut wrong: std::collections::BTreeMap<u64, u64> = Default::default();
    for &(gpn, attributed, pid) in &faults[from as usize..to as usize] {
        match owner.get(&gpn) {
            Some(&o) if o != 0 => {
                total += 1;
                if attributed && pid == o {
                    right += 1;
                } else {
                    *wrong
                        .entry(if attributed { pid } else { u64::MAX })
                        .or_default() += 1;
                }
            }
            _ => {}
        }
    }
    let share = right as f64 / total.max(1) as f64;
    eprintln!(
        "attribution: {right} of {total} faults on the workloads' own frames named the right \
         pid ({share:.4}); the others by the pid named (u64::MAX: unattributed): {wrong:?}"
    );
    assert!(
        total >= 500,
        "only {total} faults in the window on the workloads' frames: nothing to check"
    );
    assert!(
        share >= 0.99,
        "attribution {share:.4} < 0.99 ({right} of {total}; wrong: {wrong:?})"
    );
}

/// One run of the two-program mix: the two processes' pids and completion times (ms, as each
/// measured itself).
struct MixRun {
    history: &'static str,
    pids: (u64, u64),
    ms: (f64, f64),
}

/// Per-process prefetch histories against one global history, on one guest in one run: the
/// same two-program mix (a sequential scan and a key-value workload, 24 MiB each, at 25% local)
/// three times, switching the engine's history over the control socket between runs in the
/// order per-process, global, per-process (the global run between the two per-process ones,
/// so a drift over the run shows as a difference between those two). Prints, per program and history, coverage (the engine's per-process estimate) and
/// completion time, and their ratios per-process / global. Performance is reported, not
/// asserted; what is asserted is that every run completed with the same checksums and that
/// the switch took (the per-process runs' faults went to virtual-page histories).
#[test]
fn linux_guest_per_process_histories_against_one_global_history() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let Some(mut g) = agent_vm("history", &["--no-kvm-async-pf".into()]) else {
        return;
    };
    let deadline = g.deadline;
    let mut runs = Vec::new();
    let mut sums: Vec<(String, String)> = Vec::new();
    for (i, history) in ["per-process", "global", "per-process"]
        .into_iter()
        .enumerate()
    {
        let v = farvm_vmm::control::request(&g.socket, &format!("history {history}"))
            .expect("history over the control socket");
        assert_eq!(v["history"], history, "{v}");
        let vm = &mut g.vm;
        vm.type_line(&format!(
            "/a/wl-seq seq:ws=24M,passes=2 >/tmp/s{i} & P1=$!; /a/wl-kv kv:ws=24M >/tmp/k{i} & \
             P2=$!; wait $P1 $P2; echo RUN{i} $P1 $P2; tail -n1 /tmp/s{i}; tail -n1 /tmp/k{i}"
        ));
        let pids = vm.wait_for("the mix", deadline, |l| two_pids(l, &format!("RUN{i}")));
        // `NAME TIME_MS OPS CHECKSUM` of each program.
        let result = |name: &'static str| {
            move |l: &str| {
                let w: Vec<&str> = l.split_whitespace().collect();
                (w.len() == 4 && w[0] == name)
                    .then(|| (w[1].parse::<f64>().ok(), w[3].to_string()))
                    .and_then(|(t, c)| Some((t?, c)))
            }
        };
        let (seq_ms, seq_sum) = vm.wait_for("seq's result", deadline, result("seq"));
        let (kv_ms, kv_sum) = vm.wait_for("kv's result", deadline, result("kv"));
        sums.push((seq_sum, kv_sum));
        runs.push(MixRun {
            history,
            pids,
            ms: (seq_ms, kv_ms),
        });
    }
    let (report, dir, _) = g.power_off();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        sums.windows(2).all(|w| w[0] == w[1]),
        "every run computed the same results: {sums:?}"
    );
    // Coverage and time per (history, program), averaged over the runs of each history.
    let mut table = std::collections::BTreeMap::<(&str, &str), (f64, f64, u32)>::new();
    for r in &runs {
        for (name, pid, ms) in [("seq", r.pids.0, r.ms.0), ("kv", r.pids.1, r.ms.1)] {
            let p = process_entry(&report, pid);
            let cov = p["coverage"].as_f64().expect("coverage");
            eprintln!(
                "{:<12} {name:<4} pid {pid:<5} coverage {cov:.3} time {ms:>10.1} ms  {}",
                r.history, p["counters"]
            );
            let e = table.entry((r.history, name)).or_default();
            e.0 += cov;
            e.1 += ms;
            e.2 += 1;
        }
    }
    println!("| program | history | coverage | completion time (ms) |");
    println!("|---|---|---|---|");
    for ((history, name), (cov, ms, n)) in &table {
        let n = f64::from(*n);
        println!("| {name} | {history} | {:.3} | {:.0} |", cov / n, ms / n);
    }
    for name in ["seq", "kv"] {
        let (pc, pt, pn) = table[&("per-process", name)];
        let (gc, gt, gn) = table[&("global", name)];
        println!(
            "{name}: coverage per-process / global = {:.2}; completion time per-process / \
             global = {:.2}",
            (pc / f64::from(pn)) / (gc / f64::from(gn)).max(1e-9),
            (pt / f64::from(pn)) / (gt / f64::from(gn)).max(1e-9)
        );
    }
    let c = &report["paging"]["engine"]["counters"];
    assert!(
        c["faults_seen_virtual"].as_u64().unwrap_or(0) > 0,
        "per-process runs learned over virtual pages: {c}"
    );
}

/// The real programs' disk (`scripts/linux-guest-programs.sh`): (the unpacked tree, the ext4
/// image of it). From `FARVM_LINUX_PROGRAMS=DIR` (a directory the script built; `scripts/kvm-lab
/// test` sets it) or, if unset, from running the script (which caches its result).
fn programs_image() -> (PathBuf, PathBuf) {
    let text = image_description(
        "FARVM_LINUX_PROGRAMS",
        "scripts/linux-guest-programs.sh",
        "the programs' disk (Debian packages from a Debian mirror, apt-get, root)",
    );
    let what = "the programs' description";
    (
        described(&text, "PROGRAMS_ROOT", what).into(),
        described(&text, "PROGRAMS_DISK", what).into(),
    )
}

/// The real programs, each named by its process name, and what `/farvm/run-programs` prints.
const PROGRAMS: [&str; 4] = ["sort", "xz", "sqlite3", "python3"];

/// `farvm-prog NAME SHA256` on a line: (NAME, SHA256).
fn program_sum(line: &str) -> Option<(String, String)> {
    let mut w = line.trim().strip_prefix("farvm-prog ")?.split(' ');
    let (name, sum) = (w.next()?, w.next()?);
    (sum.len() == 64 && sum.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| (name.to_string(), sum.to_string()))
}

/// Real programs from Debian packages — sort, xz, sqlite3 and python3 with numpy — in a Linux
/// guest with two vCPUs at 25% local memory, the guest agent attached: each program's output
/// (its SHA-256, printed by the disk's runner) equals the same program's output on the host,
/// run from the same unpacked packages (a chroot of the tree the disk was made from); the guest
/// powers off cleanly (exit 0), and the per-process statistics name the programs.
#[test]
fn linux_guest_runs_real_programs_on_remote_memory_like_the_host() {
    if !farvm_tests::kvm_available() {
        return;
    }
    let (root, disk) = programs_image();
    // On the host: the same runner over the same tree.
    let host = Command::new("chroot")
        .arg(&root)
        .args(["/farvm/busybox", "sh", "/farvm/run-programs"])
        .output()
        .unwrap_or_else(|e| panic!("chroot (needs root) into {}: {e}", root.display()));
    let host_out = String::from_utf8_lossy(&host.stdout).to_string();
    assert!(
        host.status.success(),
        "the programs on the host (chroot {} /farvm/busybox sh /farvm/run-programs; needs \
         root): {}\n{host_out}{}",
        root.display(),
        host.status,
        String::from_utf8_lossy(&host.stderr)
    );
    let want: std::collections::BTreeMap<String, String> =
        host_out.lines().filter_map(program_sum).collect();
    for p in PROGRAMS {
        assert!(
            want.contains_key(p),
            "the host run printed no {p}:\n{host_out}"
        );
    }
    let Some(mut g) = agent_vm(
        "programs",
        &[
            "--no-kvm-async-pf".into(),
            "--disk".into(),
            format!("{},ro", disk.display()),
        ],
    ) else {
        return;
    };
    let deadline = g.deadline;
    let vm = &mut g.vm;
    vm.type_line(
        "mkdir -p /p && mount -o ro /dev/vdc /p && chroot /p /farvm/busybox sh \
         /farvm/run-programs; echo PROGRAMS_EXIT $?",
    );
    let mut got = std::collections::BTreeMap::new();
    let t = Instant::now();
    let status = vm.wait_for("the programs", deadline, |l| {
        l.trim()
            .strip_prefix("PROGRAMS_EXIT ")
            .and_then(|s| s.parse::<i32>().ok())
    });
    eprintln!("the programs ran in {:.1} s", t.elapsed().as_secs_f64());
    for l in &vm.transcript {
        if let Some((name, sum)) = program_sum(l) {
            got.insert(name, sum);
        }
    }
    assert_eq!(status, 0, "the runner's exit status in the guest");
    let (report, dir, _) = g.power_off();
    std::fs::remove_dir_all(&dir).ok();
    for p in PROGRAMS {
        assert_eq!(
            got.get(p),
            want.get(p),
            "{p}'s output in the guest (at 25% local memory) against the host's"
        );
    }
    let procs = report["per_process"]["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no per-process statistics: {report}"));
    let mut touched_all = 0;
    for p in PROGRAMS {
        let entries: Vec<_> = procs.iter().filter(|e| e["name"] == p).collect();
        assert!(
            !entries.is_empty(),
            "no per-process entry named {p}: {}",
            report["per_process"]
        );
        for e in entries {
            let touched = pages_touched(e);
            touched_all += touched;
            eprintln!(
                "{p:<8} pid {:<5} pages touched {touched:>6}  {}",
                e["pid"], e["counters"]
            );
        }
    }
    assert!(
        touched_all > 1000,
        "the programs faulted on remote memory: {touched_all} pages"
    );
}
