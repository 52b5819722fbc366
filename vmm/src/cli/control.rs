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
    fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| default_socket_path(self.vm.as_deref().unwrap_or("")))
    }
}

pub const STATS_ABOUT: &str = "Print a running VM's statistics: exits by kind, PV traffic and every \
guest process's mailbox (workload, state, phase, time, checksum, host-timestamped phase events).\n\n\
EXAMPLE\n  farvm stats --vm test1\n  farvm stats --socket /tmp/vm.sock --json\n\n\
EXIT STATUS\n  0 success; 71 the control socket cannot be reached or refused the request";

#[derive(Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub target: Target,
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

fn ask(t: &Target, cmd: &str) -> Result<Value> {
    request(&t.path(), cmd).map_err(|e| Failure::new(exit_code::HOST_ERROR, e.to_string()).into())
}

pub fn stats(a: StatsArgs) -> Result<()> {
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
