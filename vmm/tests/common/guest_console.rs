//! The test guest's serial-console lines (one per ended process, then the power-off line) and
//! their check against the native build of the same workloads (used by the API and libvirt
//! tests through `#[path]`, so only they compile it), read from a pty as libvirt's console is.
#![allow(dead_code)]

use std::io::Read;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use farvm_vmm::workload_spec::place;

/// One `farvm-testguest: process ...` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessLine {
    pub pid: u32,
    pub workload: u32,
    pub cpu: u32,
    pub ws: u64,
    pub seed: u64,
    /// `done`, `killed`, `failed`.
    pub outcome: String,
    pub ops: u64,
    pub checksum: u64,
}

/// The process lines in `text`, and the power-off line's (processes, failed, status) if
/// the guest got that far.
pub fn parse(text: &str) -> (Vec<ProcessLine>, Option<(u32, u32, u32)>) {
    let mut procs = Vec::new();
    let mut end = None;
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("farvm-testguest: ") else {
            continue;
        };
        let w: Vec<&str> = rest.split_whitespace().collect();
        let num = |key: &str| -> Option<u64> {
            let i = w.iter().position(|x| *x == key)?;
            let v = w.get(i + 1)?;
            match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => v.parse().ok(),
            }
        };
        if w.first() == Some(&"process") {
            let outcome = ["done", "killed", "failed"]
                .into_iter()
                .find(|o| w.contains(o))
                .unwrap_or("?");
            procs.push(ProcessLine {
                pid: num("process").unwrap_or(0) as u32,
                workload: num("workload").unwrap_or(0) as u32,
                cpu: num("cpu").unwrap_or(0) as u32,
                ws: num("ws").unwrap_or(0),
                seed: num("seed").unwrap_or(0),
                outcome: outcome.to_string(),
                ops: num("ops").unwrap_or(0),
                checksum: num("checksum").unwrap_or(0),
            });
        } else if w.first() == Some(&"all") {
            let failed = w
                .iter()
                .position(|x| *x == "ended,")
                .and_then(|i| w.get(i + 1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(u32::MAX);
            end = Some((
                num("all").unwrap_or(0) as u32,
                failed,
                num("status").unwrap_or(u64::MAX) as u32,
            ));
        }
    }
    (procs, end)
}

/// Checks every process of `specs` (as `--workload`/`farvm.workload=` give them, placed on
/// `vcpus`) ended `done` with the checksum and op count of the native run of the same
/// workload; returns one line per process for the log. Panics naming the first mismatch.
pub fn check_against_native(specs: &[&str], vcpus: u32, lines: &[ProcessLine]) -> Vec<String> {
    let specs: Vec<String> = specs.iter().map(|s| s.to_string()).collect();
    let placed = place(&specs, vcpus).expect("valid workload specs");
    assert_eq!(lines.len(), placed.len(), "process lines: {lines:#?}");
    let mut log = Vec::new();
    for (i, w) in placed.iter().enumerate() {
        let pid = i as u32 + 1;
        let l = lines
            .iter()
            .find(|l| l.pid == pid)
            .unwrap_or_else(|| panic!("no console line for pid {pid}: {lines:#?}"));
        let want = w.process_spec();
        assert_eq!(
            (l.workload, l.cpu, l.ws, l.seed),
            (want.workload, want.cpu, want.ws_bytes, want.seed),
            "pid {pid} is not {}",
            specs[i]
        );
        assert_eq!(l.outcome, "done", "pid {pid} ({}): {l:?}", specs[i]);
        let native = farvm_workloads::run_native(w.spec.workload.id, &w.spec.params())
            .unwrap_or_else(|e| panic!("native {}: {e}", specs[i]));
        assert_eq!(
            (l.checksum, l.ops),
            (native.checksum, native.ops),
            "pid {pid} ({}): guest checksum {:#x} ops {} != native {:#x} ops {}",
            specs[i],
            l.checksum,
            l.ops,
            native.checksum,
            native.ops
        );
        log.push(format!(
            "pid {pid} {:<24} checksum {:#018x} == native",
            specs[i], l.checksum
        ));
    }
    log
}

/// Reads a pty from a thread; lines arrive on the channel.
pub fn read_pty(path: &Path) -> mpsc::Receiver<String> {
    let mut f = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        let mut line = Vec::new();
        while let Ok(n) = f.read(&mut buf) {
            if n == 0 {
                break;
            }
            for &b in &buf[..n] {
                if b == b'\n' {
                    let _ = tx.send(String::from_utf8_lossy(&line).into_owned());
                    line.clear();
                } else {
                    line.push(b);
                }
            }
        }
    });
    rx
}

/// Collects console lines until the guest's power-off line.
pub fn console_until_poweroff(rx: &mpsc::Receiver<String>, timeout: Duration) -> String {
    let mut text = String::new();
    console_until(rx, &mut text, "powering off", timeout);
    text
}

/// Appends console lines to `text` until one contains `needle`.
pub fn console_until(
    rx: &mpsc::Receiver<String>,
    text: &mut String,
    needle: &str,
    timeout: Duration,
) {
    let t0 = Instant::now();
    loop {
        let left = timeout.saturating_sub(t0.elapsed());
        match rx.recv_timeout(left) {
            Ok(l) => {
                text.push_str(&l);
                text.push('\n');
                if l.contains(needle) {
                    return;
                }
            }
            Err(e) => panic!("console ({e}) before `{needle}`; so far:\n{text}"),
        }
    }
}

/// Types `line` and Enter (a carriage return, as a terminal sends it) on the pty at `path`:
/// the test guest writes it back as `farvm-testguest: console LINE`.
pub fn type_line(path: &Path, line: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    f.write_all(format!("{line}\r").as_bytes())
        .unwrap_or_else(|e| panic!("typing on {}: {e}", path.display()));
}
