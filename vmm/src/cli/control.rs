//! `farvm status|stats|shutdown --vm NAME`: clients of a running VM's control socket.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use farvm_vmm::control::{default_socket_path, request};
use farvm_vmm::exit_code;
use serde_json::Value;

use super::Failure;

/// Which VM to talk to.
#[derive(Args, Debug)]
pub struct Target {
    /// VM name (as given to `farvm run --name`).
    #[arg(long = "vm", value_name = "NAME", required_unless_present = "socket")]
    pub vm: Option<String>,
    /// Control socket path (overrides the default location derived from --vm).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Print the raw JSON reply.
    #[arg(long)]
    pub json: bool,
}

impl Target {
    /// The control socket's path.
    pub fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| default_socket_path(self.vm.as_deref().unwrap_or("")))
    }
}

pub const STATS_ABOUT: &str = "Print a running VM's statistics: exits by kind, PV traffic and every \
guest process's mailbox (workload, state, phase, time, checksum, host-timestamped phase events).\n\n\
With --per-process (VMs with remote memory): one line per guest process the paging engine has \
seen fault — pid, name (from the guest agent, or the test guest's workload), demand faults, zero \
fills, waits, prefetches issued, prefetch hits, wasted prefetches, estimated accuracy and \
coverage — counted exactly per process (by the page-table root and pid the guest agent publishes \
on every context switch), plus the faults no process could be given.\n\n\
EXAMPLE\n  farvm stats --vm test1\n  farvm stats --vm test1 --per-process\n  \
farvm stats --socket /tmp/vm.sock --json\n\n\
EXIT STATUS\n  0 success; 71 the control socket cannot be reached or refused the request \
(e.g. --per-process for a VM without remote memory)";

#[derive(Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub target: Target,
    /// Print per-process paging statistics instead (remote memory only).
    #[arg(long)]
    pub per_process: bool,
}

pub const STATUS_ABOUT: &str =
    "Print a running VM's status: state, uptime, memory, and per vCPU its \
thread id and the guest process running on it now (from the guest's agent slot).\n\n\
EXAMPLE\n  farvm status --vm test1 --json";

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub target: Target,
}

pub const SHUTDOWN_ABOUT: &str =
    "Ask a running VM to shut down cleanly (its `farvm run` exits 0).\n\n\
EXAMPLE\n  farvm shutdown --vm test1";

#[derive(Args, Debug)]
pub struct ShutdownArgs {
    #[command(flatten)]
    pub target: Target,
}

pub const ROTATE_KEY_ABOUT: &str = "Rotate a running VM's page key (the key its pages are \
sealed under on the memory servers, docs/sealing.md). A new key, drawn from the OS RNG, becomes \
current at once: every page written from then on is sealed under it, and pages under the \
previous key still open. The paging engine then re-seals, in the background and at a bounded \
rate, every page still stored under the previous key: it reads the page and writes it back \
under the new key, from the thread that writes pages back, so the guest's faults never wait \
for it. Once no page is left under the previous key, that key is dropped (zeroized): a page \
still sealed under it would no longer open, and is handled as a forged page.\n\n\
`farvm stats` shows the rotation: the current key id, the previous one while the rotation \
runs, and the pages left to re-seal (metric farvm_remote_pages_to_reseal). A rotation \
requested while one runs is refused. The new key exists only in the VMM: a VM restarted from \
a --memory-key-file cannot open pages sealed after a rotation (take a snapshot, which keeps \
the current key, instead).\n\n\
EXAMPLE\n  farvm rotate-key --vm test1\n  farvm stats --vm test1 --json | jq .paging.remote\n\n\
EXIT STATUS\n  0 the rotation started; 71 the control socket cannot be reached or refused \
(a rotation already runs, pages are not sealed, memory is not remote)";

#[derive(Args, Debug)]
pub struct RotateKeyArgs {
    #[command(flatten)]
    pub target: Target,
}

pub fn rotate_key(a: RotateKeyArgs) -> Result<()> {
    let v = ask(&a.target, "rotate-key")?;
    if a.target.json {
        println!("{v}");
    } else {
        println!(
            "page key {} is current; re-sealing the pages under {} (farvm stats shows progress)",
            v["current"].as_str().unwrap_or("?"),
            v["previous"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

fn ask(t: &Target, cmd: &str) -> Result<Value> {
    request(&t.path(), cmd).map_err(|e| Failure::new(exit_code::HOST_ERROR, e.to_string()).into())
}

pub fn stats(a: StatsArgs) -> Result<()> {
    if a.per_process {
        let v = ask(&a.target, "processes")?;
        if a.target.json {
            println!("{v}");
        } else {
            print!("{}", render_per_process(&v));
        }
        return Ok(());
    }
    let v = ask(&a.target, "stats")?;
    if a.target.json {
        println!("{v}");
        return Ok(());
    }
    println!(
        "VM {}  up {:.1} s",
        v["name"].as_str().unwrap_or("?"),
        v["uptime_secs"].as_f64().unwrap_or(0.0)
    );
    for c in v["vcpu"].as_array().into_iter().flatten() {
        let pid = match c["current_pid"].as_u64() {
            Some(0) => "idle".to_string(),
            Some(p) => format!("pid {p}"),
            None => "no agent slot".to_string(),
        };
        println!(
            "  vcpu{}: {pid}, {} context switches{}",
            c["index"],
            c["context_switches"].as_u64().unwrap_or(0),
            if c["done"].as_bool() == Some(true) {
                ", done"
            } else {
                ""
            }
        );
    }
    println!("exits (total {}):", v["exits_total"]);
    if let Some(o) = v["exits"].as_object() {
        for (k, n) in o {
            if n.as_u64().unwrap_or(0) != 0 {
                println!("  {k:<16} {n}");
            }
        }
    }
    println!("pv:");
    if let Some(o) = v["pv"].as_object() {
        for (k, n) in o {
            println!("  {k:<16} {n}");
        }
    }
    if !v["paging"].is_null() {
        print!("{}", super::paging::render(&v["paging"]));
    }
    println!(
        "{:>4} {:<15} {:>3} {:<8} {:>5} {:>12} {:>18}",
        "pid", "workload", "cpu", "state", "phase", "time_ms", "checksum"
    );
    for p in v["processes"].as_array().into_iter().flatten() {
        println!(
            "{:>4} {:<15} {:>3} {:<8} {:>5} {:>12.3} {:>#18x}",
            p["pid"].as_u64().unwrap_or(0),
            p["name"].as_str().unwrap_or("?"),
            p["cpu"].as_u64().unwrap_or(0),
            super::run::state_name(p["state"].as_u64().unwrap_or(99) as u32),
            p["phase"].as_u64().unwrap_or(0),
            p["elapsed_ns"].as_f64().unwrap_or(0.0) / 1e6,
            p["checksum"].as_u64().unwrap_or(0)
        );
        if p["state"].as_u64() == Some(u64::from(farvm_guest_agent::pv::state::FAILED)) {
            println!(
                "       failed: {}",
                farvm_workloads::Error::describe_code(p["error"].as_u64().unwrap_or(0))
            );
        }
    }
    Ok(())
}

pub fn status(a: StatusArgs) -> Result<()> {
    let v = ask(&a.target, "status")?;
    if a.target.json {
        println!("{v}");
        return Ok(());
    }
    println!(
        "VM {}  {}  up {:.1} s  {} vCPUs  {} MiB",
        v["name"].as_str().unwrap_or("?"),
        v["state"].as_str().unwrap_or("?"),
        v["uptime_secs"].as_f64().unwrap_or(0.0),
        v["vcpus"],
        v["memory_bytes"].as_u64().unwrap_or(0) >> 20
    );
    for c in v["vcpu"].as_array().into_iter().flatten() {
        println!(
            "  {} tid {}  pid {}  switches {}",
            c["thread"].as_str().unwrap_or("?"),
            c["tid"],
            c["current_pid"],
            c["context_switches"]
        );
    }
    Ok(())
}

pub fn shutdown(a: ShutdownArgs) -> Result<()> {
    ask(&a.target, "shutdown")?;
    if !a.target.json {
        println!("shutdown requested");
    }
    Ok(())
}

/// The `processes` reply as a table (one line per process, then the attribution summary).
pub fn render_per_process(v: &Value) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>7} {:<16} {:>10} {:>9} {:>7} {:>10} {:>10} {:>8} {:>8} {:>8}",
        "pid",
        "name",
        "demand",
        "zero",
        "waits",
        "pf_issued",
        "hits_seen",
        "wasted",
        "accuracy",
        "coverage"
    );
    for p in v["processes"].as_array().into_iter().flatten() {
        let c = &p["counters"];
        let n = |k: &str| c[k].as_u64().unwrap_or(0);
        let mut name: String = p["name"].as_str().unwrap_or("?").chars().take(16).collect();
        if p["retired"].as_bool() == Some(true) {
            name = format!("{}†", name.chars().take(15).collect::<String>());
        }
        let _ = writeln!(
            out,
            "{:>7} {:<16} {:>10} {:>9} {:>7} {:>10} {:>10} {:>8} {:>8.3} {:>8.3}",
            p["pid"].as_u64().unwrap_or(0),
            name,
            n("demand_faults"),
            n("zero_fills"),
            n("wait_faults"),
            n("prefetch_issued"),
            p["prefetch_hits"].as_u64().unwrap_or(0),
            n("prefetch_wasted"),
            p["accuracy"].as_f64().unwrap_or(0.0),
            p["coverage"].as_f64().unwrap_or(0.0),
        );
    }
    let u = &v["unattributed"];
    let _ = writeln!(
        out,
        "attributed to processes: {:.4} of {} user faults; unattributed: {} on non-vCPU threads, \
         {} with an unreadable slot, {} before the guest agent registered; {} processes recycled \
         († = exited, its page tables reused)",
        v["attribution"].as_f64().unwrap_or(0.0),
        v["user_faults"].as_u64().unwrap_or(0),
        u["no_vcpu"].as_u64().unwrap_or(0),
        u["unreadable"].as_u64().unwrap_or(0),
        u["no_slot"].as_u64().unwrap_or(0),
        v["recycled"].as_u64().unwrap_or(0),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn per_process_table_names_every_process() {
        let v = json!({
            "processes": [
                {"pid": 2, "name": "seq", "retired": false, "prefetch_hits": 90,
                 "accuracy": 0.97, "coverage": 0.9,
                 "counters": {"demand_faults": 10, "zero_fills": 256, "wait_faults": 1,
                              "prefetch_issued": 95, "prefetch_wasted": 3}},
                {"pid": 0, "name": "kernel", "retired": false, "prefetch_hits": 0,
                 "accuracy": 0.0, "coverage": 0.0, "counters": {"zero_fills": 4}}
            ],
            "unattributed": {"no_vcpu": 0, "no_slot": 12, "unreadable": 0},
            "user_faults": 357, "attribution": 1.0, "recycled": 0
        });
        let t = render_per_process(&v);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        assert!(
            lines[1].contains("seq") && lines[1].contains(" 256 ") && lines[1].contains("0.970")
        );
        assert!(lines[2].contains("kernel"));
        assert!(lines[3].contains("1.0000 of 357 user faults") && lines[3].contains("12 before"));
    }
}
