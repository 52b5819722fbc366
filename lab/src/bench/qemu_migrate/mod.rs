//! `farvm-lab bench qemu-migrate`: QEMU's own pre-copy live migration and save to a file of the
//! test guest farvm runs, measured through QMP, as the QEMU half of
//! `scripts/migrate-compare-lab.sh` (farvm's half is `farvm migrate` and `farvm snapshot` in the
//! same lab run). The guest is booted as `bench compare` boots it ([`Qemu::command`]); the
//! procedures are in [`flows`], QMP in [`qmp`], one QEMU process in [`vm`].

mod flows;
mod qmp;
mod vm;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use farvm_units::{format_size, parse_size};
use farvm_vmm::workload_spec::{place, PlacedWorkload};
use serde::Serialize;

use super::compare::qemu::Qemu;
use flows::{LiveRow, SaveRow, Setup};

pub const QEMU_MIGRATE_ABOUT: &str = "\
QEMU's pre-copy live migration and save to a file of the test guest farvm runs, measured through
QMP: the QEMU half of scripts/migrate-compare-lab.sh, which runs farvm's live migration and
snapshot of the same guest in the same KVM-lab run and prints the tables side by side.

The guest is the one `farvm run --memory SIZE --workload SPEC` boots, under QEMU as `bench
compare` boots it (qemu-system-x86_64 -accel kvm -machine microvm, the test guest's PVH entry,
one vCPU, --memory of guest frames plus 8 MiB for QEMU's firmware tables, transparent huge
pages off); its result comes from its serial console and must be the workload's native
checksum (computed here, natively, before the runs). Before a migration QEMU's bandwidth cap is
lifted (migrate-set-parameters max-bandwidth 1 TiB/s: QEMU's default is 32 MiB/s and farvm's
stream has none); the downtime limit stays QEMU's default (300 ms). Each procedure starts
--settle seconds into the workload's measured phase, as farvm's side does (`farvm stats`): an
isa-debugcon on the guest's mailbox port counts its doorbells, and every workload rings SETUP,
WARMUP, then MEASURE.

  live   a second QEMU waits with -incoming tcp:127.0.0.1:PORT; `migrate` on the source; once
         query-migrate says completed the source quits and the destination's guest runs the
         workload to its end. Columns from QEMU's query-migrate: total-time, downtime, bytes
         sent (ram.transferred: page contents and headers; a zero page travels as a flag, its
         count is ram.duplicate), pages sent with content (ram.normal), dirty-bitmap syncs
         (pre-copy rounds, ram.dirty-sync-count); and by the bench's clock the time from
         `migrate` to the destination's guest finishing.
  save   `stop`, `migrate` to exec:cat > FILE (QEMU 7.2 has no file: URI), quit; a new QEMU
         with -S -incoming exec:cat FILE loads it and is continued (`cont`) once loaded.
         Columns: bytes written (the file's length), save s (from `migrate` to completion),
         restore-to-run s (from starting the new QEMU to `cont` returning), finish s (from
         starting it to its guest powering off after the workload).

Writes qemu-migrate.json (every number, per workload and procedure) into --out, with each
QEMU's console and stderr, and prints the rows as markdown.

EXAMPLES
  farvm-lab bench qemu-migrate --memory 64M --workload seq:ws=48M,passes=60,write=1,verify=1
  farvm-lab bench qemu-migrate --mode save --memory 512M --workload seq:ws=256M,passes=4,write=1,verify=1

EXIT STATUS
  0 every run completed with the native checksum; 1 a run failed (after all ran; its row says
  why) or the bench could not start";

#[derive(Args, Debug)]
pub struct QemuMigrateArgs {
    /// Workload (repeatable; NAME[:key=value,...], as `farvm run --workload`).
    #[arg(long = "workload", value_name = "SPEC", required = true)]
    pub workloads: Vec<String>,
    /// Guest frames, as `farvm run --memory` (QEMU gets 8 MiB more for its firmware tables).
    #[arg(long, value_name = "SIZE", default_value = "64M")]
    pub memory: String,
    /// Procedures: live (pre-copy to a second QEMU), save (to a file and back), or both.
    #[arg(long, value_name = "live|save|both", default_value = "both")]
    pub mode: String,
    /// Seconds into the workload's measured phase the migration or save starts.
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub settle: f64,
    /// Seconds each step (boot, migration, the workload's end) may take.
    #[arg(long, value_name = "SECS", default_value_t = 1800)]
    pub timeout: u64,
    /// QEMU (a path, or a name on PATH).
    #[arg(long, value_name = "PATH", default_value = "qemu-system-x86_64")]
    pub qemu: String,
    /// Directory for QMP sockets and saved state files (a local file system) [default:
    /// $TMPDIR].
    #[arg(long, value_name = "DIR")]
    pub work: Option<PathBuf>,
    /// Directory for qemu-migrate.json and the QEMUs' consoles.
    #[arg(long, value_name = "DIR", default_value = "qemu-migrate-out")]
    pub out: PathBuf,
}

/// One procedure's outcome for one workload.
#[derive(Debug, Serialize)]
struct Outcome<R> {
    workload: String,
    native_checksum: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<R>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failed: Option<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    qemu: String,
    memory_bytes: u64,
    settle_secs: f64,
    live: Vec<Outcome<LiveRow>>,
    save: Vec<Outcome<SaveRow>>,
}

fn outcome<R>(spec: &str, native: u64, r: Result<R>, checksum: impl Fn(&R) -> u64) -> Outcome<R> {
    let (result, failed) = match r {
        Ok(r) if checksum(&r) == native => (Some(r), None),
        Ok(r) => (
            None,
            Some(format!(
                "checksum {:#x}, the native run's is {native:#x}",
                checksum(&r)
            )),
        ),
        Err(e) => (None, Some(format!("{e:#}"))),
    };
    if let Some(f) = &failed {
        eprintln!("qemu-migrate: {spec}: {f}");
    }
    Outcome {
        workload: spec.to_string(),
        native_checksum: native,
        result,
        failed,
    }
}

fn native_checksum(w: &PlacedWorkload) -> Result<u64> {
    farvm_workloads::run_native(w.spec.workload.id, &w.spec.params())
        .map(|o| o.checksum)
        .map_err(|e| anyhow::anyhow!("the workload's native run: {e:?}"))
}

fn qemu_version(exe: &str) -> String {
    std::process::Command::new(exe)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().next().map(str::to_string))
        .unwrap_or_else(|| exe.to_string())
}

pub fn run(a: QemuMigrateArgs) -> Result<()> {
    let mem = parse_size(&a.memory).map_err(|e| anyhow::anyhow!("--memory {}: {e}", a.memory))?;
    let (live, save) = match a.mode.as_str() {
        "live" => (true, false),
        "save" => (false, true),
        "both" => (true, true),
        m => bail!("--mode {m}: expected live, save or both"),
    };
    if !(a.settle.is_finite() && a.settle >= 0.0) {
        bail!("--settle {}: expected a number of seconds >= 0", a.settle);
    }
    let placed = place(&a.workloads, 1).map_err(|e| anyhow::anyhow!("--workload: {e}"))?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let work = a.work.clone().unwrap_or_else(std::env::temp_dir);
    let qemu = Qemu::new(
        &a.qemu,
        &format!("migrate-{}", std::process::id()),
        Duration::from_secs(a.timeout),
    )?;
    let mut report = Report {
        qemu: qemu_version(&a.qemu),
        memory_bytes: mem,
        settle_secs: a.settle,
        live: Vec::new(),
        save: Vec::new(),
    };
    for (i, (spec, w)) in a.workloads.iter().zip(&placed).enumerate() {
        eprintln!("qemu-migrate: {spec}: the native checksum");
        let native = native_checksum(w)?;
        let setup = Setup {
            qemu: &qemu,
            w,
            mem,
            dir: &a.out,
            work: &work,
            settle: Duration::from_secs_f64(a.settle),
            timeout: Duration::from_secs(a.timeout),
        };
        if live {
            eprintln!("qemu-migrate: {spec}: live migration");
            let r = flows::live(&setup, &format!("live{i}"));
            report.live.push(outcome(spec, native, r, |r| r.checksum));
        }
        if save {
            eprintln!("qemu-migrate: {spec}: save and restore");
            let r = flows::save_restore(&setup, &format!("save{i}"));
            report.save.push(outcome(spec, native, r, |r| r.checksum));
        }
    }
    let json = a.out.join("qemu-migrate.json");
    std::fs::write(&json, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("writing {}", json.display()))?;
    print_markdown(&report);
    let failed = report.live.iter().filter(|o| o.failed.is_some()).count()
        + report.save.iter().filter(|o| o.failed.is_some()).count();
    if failed > 0 {
        bail!("{failed} run(s) failed (see their rows)");
    }
    Ok(())
}

/// A failure's text for a table cell (the guest's console lines joined).
fn one_line(text: &str) -> String {
    text.lines().map(str::trim).collect::<Vec<_>>().join(" / ")
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn print_markdown(r: &Report) {
    println!(
        "{}, guest {} (+8 MiB firmware tables)",
        r.qemu,
        format_size(r.memory_bytes)
    );
    if !r.live.is_empty() {
        println!();
        println!("| workload | total s | downtime s | bytes sent | pages with content | zero pages | dirty syncs | finish s | checksum |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
        for o in &r.live {
            match (&o.result, &o.failed) {
                (Some(l), _) => println!(
                    "| `{}` | {:.2} | {:.3} | {} | {} | {} | {} | {:.2} | {:#x} |",
                    o.workload,
                    l.stats.total_secs,
                    l.stats.downtime_secs,
                    mib(l.stats.bytes_sent),
                    l.stats.normal_pages,
                    l.stats.zero_pages,
                    l.stats.dirty_syncs,
                    l.finish_secs,
                    l.checksum
                ),
                (None, f) => println!(
                    "| `{}` | failed: {} | | | | | | | |",
                    o.workload,
                    one_line(f.as_deref().unwrap_or_default())
                ),
            }
        }
    }
    if !r.save.is_empty() {
        println!();
        println!("| workload | bytes written | save s | restore→run s | finish s | checksum |");
        println!("|---|---:|---:|---:|---:|---|");
        for o in &r.save {
            match (&o.result, &o.failed) {
                (Some(s), _) => println!(
                    "| `{}` | {} | {:.2} | {:.2} | {:.2} | {:#x} |",
                    o.workload,
                    mib(s.bytes_written),
                    s.save_secs,
                    s.restore_to_run_secs,
                    s.finish_secs,
                    s.checksum
                ),
                (None, f) => println!(
                    "| `{}` | failed: {} | | | | |",
                    o.workload,
                    one_line(f.as_deref().unwrap_or_default())
                ),
            }
        }
    }
}
