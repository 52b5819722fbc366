//! A stock Linux guest under `farvm run`, on remote memory: the KVM lab's Debian kernel with
//! the test initramfs and ext4 data disk that `scripts/linux-guest-image.sh` builds, two vCPUs
//! (the kernel starts the second itself with INIT/SIPI from the MADT), half of guest RAM local.
//! Through the console (16550, interrupt-driven input from farvm's stdin) the test waits for the
//! guest's shell, copies a file from the virtio-blk disk and writes a 64 MiB file into tmpfs —
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

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The guest's files (scripts/linux-guest-image.sh).
struct GuestImage {
    kernel: PathBuf,
    initrd: PathBuf,
    disk: PathBuf,
    blob_sha256: String,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Reads the `NAME=value` lines the image script prints (and keeps in DIR/env).
fn parse_image_env(text: &str) -> GuestImage {
    let get = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .map(|v| v.trim_matches('\'').to_string())
            .unwrap_or_else(|| panic!("the guest image description has no {name}:\n{text}"))
    };
    GuestImage {
        kernel: get("GUEST_KERNEL").into(),
        initrd: get("GUEST_INITRD").into(),
        disk: get("GUEST_DISK").into(),
        blob_sha256: get("GUEST_BLOB_SHA256"),
    }
}

fn guest_image() -> GuestImage {
    if let Some(dir) = std::env::var_os("FARVM_LINUX_GUEST") {
        let env = Path::new(&dir).join("env");
        let text = std::fs::read_to_string(&env).unwrap_or_else(|e| {
            panic!(
                "FARVM_LINUX_GUEST={}: cannot read {} ({e}); build the image with \
                 scripts/linux-guest-image.sh",
                Path::new(&dir).display(),
                env.display()
            )
        });
        return parse_image_env(&text);
    }
    let script = repo_root().join("scripts/linux-guest-image.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed ({}): the Linux guest image (the KVM lab's Debian kernel, from a Debian \
         mirror) is needed; or set FARVM_LINUX_GUEST to a directory it built",
        script.display(),
        out.status
    );
    parse_image_env(&String::from_utf8_lossy(&out.stdout))
}

/// The `farvm` binary of this build (beside the test binary's deps/ directory), or
/// `FARVM_BIN`.
fn farvm_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("FARVM_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("the test's own path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/");
    let bin = dir.join("farvm");
    assert!(
        bin.is_file(),
        "no farvm binary at {} (build it: cargo build --release -p farvm-vmm -p \
         farvm-memserver; or set FARVM_BIN)",
        bin.display()
    );
    bin
}

/// A running `farvm run`: its console (stdout) read line by line, its stdin the guest's console
/// input.
struct Farvm {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    transcript: Vec<String>,
}

impl Farvm {
    fn spawn(args: &[String]) -> Self {
        eprintln!("farvm {}", args.join(" "));
        let mut child = Command::new(farvm_bin())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn farvm");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).split(b'\n') {
                let Ok(line) = line else { break };
                let line = String::from_utf8_lossy(&line).trim_end().to_string();
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Farvm {
            stdin: child.stdin.take(),
            child,
            lines,
            transcript: Vec::new(),
        }
    }

    /// The next console line `pick` accepts (its value), or a panic with the transcript once
    /// `deadline` passes or farvm ends.
    fn wait_for<T>(
        &mut self,
        what: &str,
        deadline: Instant,
        pick: impl Fn(&str) -> Option<T>,
    ) -> T {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    eprintln!("| {line}");
                    let got = pick(&line);
                    self.transcript.push(line);
                    if let Some(v) = got {
                        return v;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!(
                        "timed out waiting for {what}; the console's last lines:\n{}",
                        self.tail()
                    );
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().ok();
                    panic!("farvm ended ({status:?}) before {what}:\n{}", self.tail());
                }
            }
        }
    }

    /// Types `line` on the guest's console.
    fn type_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("console input open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|_| stdin.flush())
            .expect("write to farvm's stdin");
    }

    /// Waits for farvm to exit (killing it at `deadline`); returns its status and the rest of
    /// its output.
    fn finish(mut self, deadline: Instant) -> (Option<i32>, Vec<String>) {
        drop(self.stdin.take());
        let mut rest = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    eprintln!("| {line}");
                    rest.push(line);
                }
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    break;
                }
            }
        }
        let status = self.child.wait().expect("wait for farvm");
        (status.code(), rest)
    }

    fn tail(&self) -> String {
        let n = self.transcript.len().saturating_sub(40);
        self.transcript[n..].join("\n")
    }
}

/// SHA-256 of what `command` (sh) writes, on the host.
fn host_sha256(command: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("{command} | sha256sum")])
        .output()
        .expect("sh");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)[..64].to_string()
}

/// `MARK <64 hex digits>` on a console line: the digits. (The echo of the typed command has
/// `$1` where the digits go, so it never matches.)
fn marked_sum(line: &str, mark: &str) -> Option<String> {
    let rest = line.trim().strip_prefix(mark)?.trim();
    (rest.len() == 64 && rest.bytes().all(|b| b.is_ascii_hexdigit())).then(|| rest.to_string())
}

const MEMORY: &str = "192M";
const LOCAL: &str = "50%";
/// The tmpfs file: 64 MiB of `yes farvm`.
const FILE_BYTES: u64 = 64 << 20;

fn run_args(img: &GuestImage, disk: &Path, timeout: Duration) -> Vec<String> {
    [
        "run",
        "--kernel",
        img.kernel.to_str().unwrap(),
        "--initrd",
        img.initrd.to_str().unwrap(),
        "--disk",
        disk.to_str().unwrap(),
        "--vcpus",
        "2",
        "--memory",
        MEMORY,
        "--local-memory",
        LOCAL,
        "--cmdline",
        "console=ttyS0 panic=-1",
        "--no-control-socket",
        "--json",
        "--timeout",
        &timeout.as_secs().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

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

    let report: serde_json::Value = rest
        .iter()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("farvm's --json report");
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
}
