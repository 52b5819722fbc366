//! The schedule's VMs: `farvm run --pool` in the cluster's host namespaces, each with a
//! checksum workload, its JSON report and log in the schedule's folder; waiting for them with
//! a bound (a VM still running past it is killed and counted as hung); and what each ended
//! with, checked against the workload's native checksum and `farvm run`'s documented exit
//! statuses.

use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use farvm_vmm::exit_code;
use serde_json::Value;

use super::cluster::{Cluster, ETCD};

/// How every VM of a schedule runs.
#[derive(Debug, Clone)]
pub struct VmConfig {
    pub workload: String,
    pub memory: String,
    pub local: String,
    pub lease_ttl: u64,
    /// The workload's checksum when run natively.
    pub native: u64,
}

/// Flags shared with the fault threads: a VM's PID must not be signalled once it was reaped
/// (the PID may be reused), and a SIGKILL the nemesis sent makes 137 expected.
#[derive(Debug)]
pub struct VmFlags {
    pub pid: u32,
    pub exited: AtomicBool,
    pub killed_by_nemesis: AtomicBool,
}

pub struct Vm {
    child: Child,
    report: PathBuf,
    pub flags: Arc<VmFlags>,
}

/// How a VM ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// Exit 0 with the native checksum.
    Native,
    /// Exit 74: memory lost or reclaimed, as documented.
    MemoryLost,
    /// 137 after the nemesis's SIGKILL.
    Killed,
    /// Still running at the bound: killed by the nemesis, a violation.
    Hung,
    /// Anything else: a violation, with what was seen.
    Wrong(String),
}

impl Ending {
    pub fn label(&self) -> &'static str {
        match self {
            Ending::Native => "native",
            Ending::MemoryLost => "lost(74)",
            Ending::Killed => "killed(137)",
            Ending::Hung => "HUNG",
            Ending::Wrong(_) => "WRONG",
        }
    }

    pub fn is_violation(&self) -> bool {
        matches!(self, Ending::Hung | Ending::Wrong(_))
    }
}

/// Starts VM `index` on `host` (round-robin over the cluster's hosts).
pub fn start(c: &Cluster, cfg: &VmConfig, index: usize, dir: &Path) -> Result<Vm> {
    let host = format!("host{}", index as u32 % c.cfg.hosts + 1);
    let report = dir.join(format!("vm{index}.json"));
    let log = dir.join(format!("vm{index}.log"));
    let child = c
        .exec(&host, "farvm")
        .args(["run", "--pool", ETCD, "--pool-host", &host])
        .args(["--name", &format!("nemesis-vm{index}")])
        .args(["--pool-lease-ttl", &cfg.lease_ttl.to_string()])
        .args(["--memory", &cfg.memory, "--local-memory", &cfg.local])
        .args(["--workload", &cfg.workload])
        .args(["--serial", "none", "--no-control-socket", "--json"])
        .stdout(File::create(&report)?)
        .stderr(File::create(&log)?)
        .spawn()
        .context("starting farvm run")?;
    let flags = Arc::new(VmFlags {
        pid: child.id(),
        exited: AtomicBool::new(false),
        killed_by_nemesis: AtomicBool::new(false),
    });
    Ok(Vm {
        child,
        report,
        flags,
    })
}

/// Waits for every VM until `deadline`; kills those still running then. Returns each VM's
/// ending, in index order.
pub fn finish(mut vms: Vec<Vm>, deadline: Instant, native: u64) -> Vec<Ending> {
    let mut endings: Vec<Option<Ending>> = vec![None; vms.len()];
    loop {
        for (vm, end) in vms.iter_mut().zip(endings.iter_mut()) {
            if end.is_some() {
                continue;
            }
            match vm.child.try_wait() {
                Ok(Some(st)) => {
                    vm.flags.exited.store(true, Ordering::SeqCst);
                    let code = st.code().or_else(|| st.signal().map(|s| 128 + s));
                    *end = Some(classify(vm, code, native));
                }
                Ok(None) => {}
                Err(e) => *end = Some(Ending::Wrong(format!("cannot wait for it: {e}"))),
            }
        }
        if endings.iter().all(Option::is_some) {
            break;
        }
        if Instant::now() >= deadline {
            for (vm, end) in vms.iter_mut().zip(endings.iter_mut()) {
                if end.is_none() {
                    let _ = vm.child.kill();
                    let _ = vm.child.wait();
                    vm.flags.exited.store(true, Ordering::SeqCst);
                    *end = Some(Ending::Hung);
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    endings.into_iter().flatten().collect()
}

fn classify(vm: &Vm, code: Option<i32>, native: u64) -> Ending {
    let killed = vm.flags.killed_by_nemesis.load(Ordering::SeqCst);
    match code {
        Some(137) if killed => Ending::Killed,
        Some(exit_code::MEMORY_LOST) => Ending::MemoryLost,
        Some(exit_code::OK) => {
            let report: Option<Value> = std::fs::read(&vm.report)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok());
            let p = report.as_ref().map(|r| &r["processes"][0]);
            match p {
                None => Ending::Wrong("exit 0 without a JSON report".into()),
                Some(p) if p["state_name"] != "done" => {
                    Ending::Wrong(format!("exit 0 but its workload ended {}", p["state_name"]))
                }
                Some(p) if p["checksum"].as_u64() != Some(native) => Ending::Wrong(format!(
                    "checksum {} where the native run gives {native}",
                    p["checksum"]
                )),
                Some(_) => Ending::Native,
            }
        }
        Some(c) => Ending::Wrong(format!("exit status {c}, not one the nemesis allows")),
        None => Ending::Wrong("no exit status".into()),
    }
}
