//! The harness of the Linux-guest tests (`linux_guest.rs`, `linux_net.rs`): the guest image the
//! scripts build, the `farvm` binary, and a running `farvm run` driven through its console.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The guest's files (scripts/linux-guest-image.sh).
pub struct GuestImage {
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub disk: PathBuf,
    pub blob_sha256: String,
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Reads the `NAME=value` lines the image script prints (and keeps in DIR/env).
pub fn parse_image_env(text: &str) -> GuestImage {
    let get = |name: &str| described(text, name, "the guest image description");
    GuestImage {
        kernel: get("GUEST_KERNEL").into(),
        initrd: get("GUEST_INITRD").into(),
        disk: get("GUEST_DISK").into(),
        blob_sha256: get("GUEST_BLOB_SHA256"),
    }
}

pub fn guest_image() -> GuestImage {
    parse_image_env(&image_description(
        "FARVM_LINUX_GUEST",
        "scripts/linux-guest-image.sh",
        "the Linux guest image (the KVM lab's Debian kernel, from a Debian mirror)",
    ))
}

/// What an image script prints (`NAME=value` lines): the `env` file of the directory named by
/// the environment variable `var` (one the script built), or else the script's output (it
/// caches what it builds). `what` says what the script provides, for a failure.
pub fn image_description(var: &str, script: &str, what: &str) -> String {
    if let Some(dir) = std::env::var_os(var) {
        let env = Path::new(&dir).join("env");
        return std::fs::read_to_string(&env).unwrap_or_else(|e| {
            panic!(
                "{var}={}: cannot read {} ({e}); build it with {script}",
                Path::new(&dir).display(),
                env.display()
            )
        });
    }
    script_output(var, script, what)
}

/// What `script` (a path in the repository) prints on stdout; a failure says that `what` is
/// needed, and that `var` may name a directory the script built instead.
pub fn script_output(var: &str, script: &str, what: &str) -> String {
    let script = repo_root().join(script);
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed ({}): {what} is needed; or set {var} to a directory it built",
        script.display(),
        out.status
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The value of `NAME=value` (quotes removed) in an image script's description `text`
/// (`what` names the description, for a failure).
pub fn described(text: &str, name: &str, what: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")))
        .map(|v| v.trim_matches('\'').to_string())
        .unwrap_or_else(|| panic!("{what} has no {name}:\n{text}"))
}

/// The `farvm` binary of this build (beside the test binary's deps/ directory), or
/// `FARVM_BIN`.
pub fn farvm_bin() -> PathBuf {
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
pub struct Farvm {
    pub child: Child,
    pub stdin: Option<ChildStdin>,
    pub lines: Receiver<String>,
    pub transcript: Vec<String>,
    /// Its control socket, if it has one: a wait that times out reports the vCPUs' states.
    pub socket: Option<PathBuf>,
}

impl Farvm {
    pub fn spawn(args: &[String]) -> Self {
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
            socket: args
                .iter()
                .position(|a| a == "--control-socket")
                .and_then(|i| args.get(i + 1))
                .map(PathBuf::from),
        }
    }

    /// The next console line `pick` accepts (its value), or a panic with the transcript once
    /// `deadline` passes or farvm ends.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        deadline: Instant,
        pick: impl Fn(&str) -> Option<T>,
    ) -> T {
        match next_picked(&self.lines, &mut self.transcript, deadline, pick) {
            Ok(v) => v,
            Err(RecvTimeoutError::Timeout) => {
                let vcpus = self.vcpu_states();
                let _ = self.child.kill();
                panic!(
                    "timed out waiting for {what}; the console's last lines:\n{}\n{vcpus}",
                    self.tail()
                );
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().ok();
                panic!("farvm ended ({status:?}) before {what}:\n{}", self.tail());
            }
        }
    }

    /// Types `line` on the guest's console.
    pub fn type_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("console input open");
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|_| stdin.flush())
            .expect("write to farvm's stdin");
    }

    /// Waits for farvm to exit (killing it at `deadline`); returns its status and the rest of
    /// its output.
    pub fn finish(mut self, deadline: Instant) -> (Option<i32>, Vec<String>) {
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

    /// What the VM's vCPUs are doing (`vcpus` on the control socket) and KVM's counters of
    /// them, for a guest that stopped making progress.
    pub fn vcpu_states(&self) -> String {
        let Some(socket) = &self.socket else {
            return "(no control socket: vCPU states unknown)".into();
        };
        let mut s = String::from("vCPU states:\n");
        match farvm_vmm::control::request(socket, "vcpus") {
            Ok(v) => {
                for d in v["vcpus"].as_array().into_iter().flatten() {
                    s.push_str(&format!("  {}\n", d.as_str().unwrap_or("(no answer)")));
                }
            }
            Err(e) => s.push_str(&format!("  farvm vcpus: {e}\n")),
        }
        if let Ok(v) = farvm_vmm::control::request(socket, "stats") {
            s.push_str(&format!(
                "KVM vCPU counters: {}\nexits: {}\n",
                v["kvm"], v["exits"]
            ));
        }
        s
    }

    pub fn tail(&self) -> String {
        let n = self.transcript.len().saturating_sub(40);
        self.transcript[n..].join("\n")
    }
}

/// farvm's `--json` report: the last line of `rest` (what [`Farvm::finish`] returns) that is
/// JSON.
/// The value of the next line of `lines` that `pick` accepts, every line read echoed and kept
/// in `transcript`; the channel's error if none comes before `deadline`.
pub fn next_picked<T>(
    lines: &Receiver<String>,
    transcript: &mut Vec<String>,
    deadline: Instant,
    pick: impl Fn(&str) -> Option<T>,
) -> Result<T, RecvTimeoutError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = lines.recv_timeout(left)?;
        eprintln!("| {line}");
        let got = pick(&line);
        transcript.push(line);
        if let Some(v) = got {
            return Ok(v);
        }
    }
}

pub fn json_report(rest: &[String]) -> serde_json::Value {
    rest.iter()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .expect("farvm's --json report")
}

/// SHA-256 of what `command` (sh) writes, on the host.
pub fn host_sha256(command: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("{command} | sha256sum")])
        .output()
        .expect("sh");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)[..64].to_string()
}

/// `MARK <64 hex digits>` on a console line: the digits. (The echo of the typed command has
/// `$1` where the digits go, so it never matches.)
pub fn marked_sum(line: &str, mark: &str) -> Option<String> {
    let rest = line.trim().strip_prefix(mark)?.trim();
    (rest.len() == 64 && rest.bytes().all(|b| b.is_ascii_hexdigit())).then(|| rest.to_string())
}

/// Whether a stock Linux guest can boot here (two-dimensional paging). Where it cannot (PVM
/// emulates guest ring 0), says so, naming `where_instead`, and fails if
/// `FARVM_REQUIRE_LINUX_BOOT=1` (the KVM lab stage of CI sets it).
pub fn linux_can_boot(where_instead: &str) -> bool {
    if farvm_vmm::vstate::vm::two_dimensional_paging() {
        return true;
    }
    let msg = format!(
        "this host's KVM emulates guest ring 0 (PVM): a stock Linux kernel cannot boot here in \
         useful time; {where_instead}"
    );
    assert!(
        std::env::var("FARVM_REQUIRE_LINUX_BOOT").as_deref() != Ok("1"),
        "FARVM_REQUIRE_LINUX_BOOT=1: {msg}"
    );
    eprintln!("{msg}");
    false
}

/// Whether this host has /dev/kvm ([`farvm_tests::kvm_available`]) and can boot a stock
/// Linux guest ([`linux_can_boot`], which says where the test runs instead).
pub fn linux_test_can_run(where_instead: &str) -> bool {
    farvm_tests::kvm_available() && linux_can_boot(where_instead)
}

/// A fresh scratch directory `farvm-linux-TAG-PID` with a copy of the image's data disk (the
/// guest writes to its disk, never to the cached image): (directory, disk).
pub fn scratch_disk(tag: &str, img: &GuestImage) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("farvm-linux-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let disk = dir.join("disk.img");
    std::fs::copy(&img.disk, &disk).expect("copy the data disk");
    (dir, disk)
}

/// Guest RAM of the Linux-guest tests, and the share of it kept local (the rest pages to the
/// memory server).
pub const MEMORY: &str = "192M";
pub const LOCAL: &str = "40%";

/// `farvm run` for the test image with `disk`: two vCPUs, [`MEMORY`] at [`LOCAL`], the console
/// on stdio, the JSON report at the end, bounded by `timeout`.
pub fn run_args(img: &GuestImage, disk: &Path, timeout: Duration) -> Vec<String> {
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
