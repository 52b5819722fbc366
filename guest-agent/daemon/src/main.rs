//! farvm-agentd: the guest-side process-table daemon of farvm's Linux guest agent.
//!
//! Scans `/proc` every interval and sends what changed (processes present, started, renamed by
//! exec, exited) to the farvm agent kernel module's device file, which queues the records on the
//! process ring the VMM reads. The VMM names its per-process paging statistics with them.

mod proctable;
mod sink;

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use proctable::Tracker;

/// Reports the guest's processes to farvm (per-process paging statistics by name).
///
/// Needs the farvm_agent kernel module loaded (it creates /dev/farvm-agent when it finds
/// farvm's agent device). Runs until killed; with --once, scans once and exits. Exit status:
/// 0 after --once, 1 when the device cannot be opened or written.
#[derive(Parser, Debug)]
#[command(version, about, long_about)]
struct Args {
    /// The agent module's device file.
    #[arg(long, default_value = "/dev/farvm-agent")]
    device: PathBuf,
    /// Milliseconds between two scans of /proc (a process living less than this may be missed;
    /// its faults are then counted under its pid without a name).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    interval_ms: u64,
    /// Scan once, send, and exit.
    #[arg(long)]
    once: bool,
    /// Print the events on standard output instead of sending them (no device needed).
    #[arg(long)]
    print: bool,
    /// The proc file system to read.
    #[arg(long, default_value = "/proc", hide = true)]
    proc_root: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let mut device = if args.print {
        None
    } else {
        Some(
            OpenOptions::new()
                .write(true)
                .open(&args.device)
                .with_context(|| {
                    format!(
                        "opening {} (is the farvm_agent module loaded, on a farvm VM?)",
                        args.device.display()
                    )
                })?,
        )
    };
    let mut tracker = Tracker::default();
    loop {
        let procs = proctable::scan(&args.proc_root)
            .with_context(|| format!("reading {}", args.proc_root.display()))?;
        let now = proctable::uptime_ns(&args.proc_root).unwrap_or(0);
        let events = tracker.update(procs, now);
        match device.as_mut() {
            Some(d) if !events.is_empty() => sink::write_events(d, &events)
                .with_context(|| format!("writing to {}", args.device.display()))?,
            Some(_) => {}
            None => {
                for e in &events {
                    println!("{}", sink::describe(e));
                }
            }
        }
        if args.once {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(args.interval_ms));
    }
}
