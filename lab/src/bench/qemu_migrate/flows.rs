//! The two measured QEMU procedures on one workload: pre-copy live migration to a second QEMU
//! over loopback TCP, and save to a file (`stop`, `migrate` to `exec:cat > FILE`) then restore
//! from it into a new QEMU (`-incoming exec:cat FILE`, `cont`). Each returns its row or the
//! reason it failed.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use farvm_vmm::workload_spec::PlacedWorkload;
use serde::Serialize;
use serde_json::{json, Value};

use super::qmp::Qmp;
use super::vm::QemuVm;
use crate::bench::compare::qemu::Qemu;

/// How often `query-migrate` is polled.
const POLL: Duration = Duration::from_millis(20);

/// What one run is given.
pub struct Setup<'a> {
    pub qemu: &'a Qemu,
    pub w: &'a PlacedWorkload,
    pub mem: u64,
    /// Where consoles go.
    pub dir: &'a Path,
    /// Where QMP sockets and saved state files go.
    pub work: &'a Path,
    /// After the workload entered its measured phase, how long it runs before the migration
    /// or save.
    pub settle: Duration,
    pub timeout: Duration,
}

impl Setup<'_> {
    /// A QEMU of this setup named `name`, with `extra` arguments.
    fn start(&self, extra: &[&str], name: &str) -> Result<QemuVm> {
        QemuVm::start(
            self.qemu,
            self.w,
            self.mem,
            extra,
            (self.dir, self.work),
            name,
        )
    }

    /// The QEMU to migrate or save: started, its workload --settle seconds into its measured
    /// phase, its migration unthrottled.
    fn source(&self, name: &str) -> Result<QemuVm> {
        let mut src = self.start(&[], name)?;
        src.wait_measuring(self.timeout)?;
        std::thread::sleep(self.settle);
        src.ensure_running("the migration")?;
        unthrottle(&mut src.qmp)?;
        Ok(src)
    }
}

/// `query-migrate`'s numbers at the end of a migration (QEMU's own accounting).
#[derive(Clone, Debug, Serialize)]
pub struct MigrateStats {
    /// `total-time`: from `migrate` to completion, s.
    pub total_secs: f64,
    /// `downtime`: the guest stopped for the last round, s (live), or 0 (already stopped).
    pub downtime_secs: f64,
    /// `setup-time`, s.
    pub setup_secs: f64,
    /// `ram.transferred`: bytes of the RAM section sent (page data and headers).
    pub bytes_sent: u64,
    /// `ram.total`: guest RAM, bytes.
    pub ram_bytes: u64,
    /// `ram.normal`: pages sent with their content.
    pub normal_pages: u64,
    /// `ram.duplicate`: zero pages, sent as a flag without content.
    pub zero_pages: u64,
    /// `ram.dirty-sync-count`: dirty-bitmap syncs (pre-copy rounds).
    pub dirty_syncs: u64,
}

impl MigrateStats {
    fn from_query(q: &Value) -> Self {
        let ram = &q["ram"];
        let secs = |v: &Value| v.as_f64().unwrap_or(0.0) / 1e3;
        let n = |v: &Value| v.as_u64().unwrap_or(0);
        MigrateStats {
            total_secs: secs(&q["total-time"]),
            downtime_secs: secs(&q["downtime"]),
            setup_secs: secs(&q["setup-time"]),
            bytes_sent: n(&ram["transferred"]),
            ram_bytes: n(&ram["total"]),
            normal_pages: n(&ram["normal"]),
            zero_pages: n(&ram["duplicate"]),
            dirty_syncs: n(&ram["dirty-sync-count"]),
        }
    }
}

/// A live migration's row.
#[derive(Clone, Debug, Serialize)]
pub struct LiveRow {
    pub stats: MigrateStats,
    /// From `migrate` until the source reported completion, by the bench's clock, s.
    pub wall_secs: f64,
    /// From `migrate` until the destination's guest powered off after the workload, s.
    pub finish_secs: f64,
    pub checksum: u64,
}

/// A save and restore's row.
#[derive(Clone, Debug, Serialize)]
pub struct SaveRow {
    pub stats: MigrateStats,
    /// The file's length, bytes.
    pub bytes_written: u64,
    /// From `migrate` (the guest already stopped) until the file was complete, s.
    pub save_secs: f64,
    /// From starting the new QEMU until `cont` returned (the file loaded, the vCPU running), s.
    pub restore_to_run_secs: f64,
    /// From starting the new QEMU until its guest powered off after the workload, s.
    pub finish_secs: f64,
    pub checksum: u64,
}

/// Polls `query-migrate` on `qmp` until the migration has completed; its numbers.
fn wait_migrated(qmp: &mut Qmp, timeout: Duration) -> Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let q = qmp.execute("query-migrate", json!({}))?;
        match q["status"].as_str() {
            Some("completed") => return Ok(q),
            Some("failed") | Some("cancelled") => bail!(
                "the migration {}: {}",
                q["status"].as_str().unwrap_or_default(),
                q["error-desc"].as_str().unwrap_or("(QEMU gave no reason)")
            ),
            _ if Instant::now() >= deadline => {
                bail!("the migration had not completed after {timeout:?}: {q}")
            }
            _ => std::thread::sleep(POLL),
        }
    }
}

/// QEMU's migration parameters for the bench: no bandwidth cap (QEMU's default caps a
/// migration at 32 MiB/s; farvm's stream has none), the default downtime limit.
fn unthrottle(qmp: &mut Qmp) -> Result<()> {
    qmp.execute(
        "migrate-set-parameters",
        json!({ "max-bandwidth": 1u64 << 40 }),
    )?;
    Ok(())
}

/// A free TCP port on 127.0.0.1 (bound and released: the destination binds it next).
fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// Pre-copy live migration of the running guest to a second QEMU waiting on loopback TCP.
pub fn live(s: &Setup, tag: &str) -> Result<LiveRow> {
    let port = free_port()?;
    let uri = format!("tcp:127.0.0.1:{port}");
    let mut dst = s.start(&["-incoming", &uri], &format!("{tag}-dst"))?;
    let mut src = s.source(&format!("{tag}-src"))?;
    let t0 = Instant::now();
    src.qmp.execute("migrate", json!({ "uri": uri }))?;
    let q = wait_migrated(&mut src.qmp, s.timeout).context("the source")?;
    let wall_secs = t0.elapsed().as_secs_f64();
    src.quit()?;
    let status = dst.wait_exit(s.timeout)?;
    let finish_secs = t0.elapsed().as_secs_f64();
    Ok(LiveRow {
        stats: MigrateStats::from_query(&q),
        wall_secs,
        finish_secs,
        checksum: dst.checksum(status)?,
    })
}

/// Save to a file and restore from it: the running guest is stopped, its state written to
/// `WORK/TAG.state` through `exec:cat`, QEMU quits; a new QEMU loads the file paused (`-S`)
/// and is continued.
pub fn save_restore(s: &Setup, tag: &str) -> Result<SaveRow> {
    let file = s.work.join(format!("{tag}.state"));
    let _ = std::fs::remove_file(&file);
    let mut src = s.source(&format!("{tag}-save"))?;
    src.qmp.execute("stop", json!({}))?;
    let t0 = Instant::now();
    src.qmp.execute(
        "migrate",
        json!({ "uri": format!("exec:cat > '{}'", file.display()) }),
    )?;
    let q = wait_migrated(&mut src.qmp, s.timeout).context("the save")?;
    let save_secs = t0.elapsed().as_secs_f64();
    src.quit()?;
    let bytes_written = std::fs::metadata(&file)
        .with_context(|| format!("{}", file.display()))?
        .len();

    let incoming = format!("exec:cat '{}'", file.display());
    let t1 = Instant::now();
    let mut dst = s.start(&["-S", "-incoming", &incoming], &format!("{tag}-restore"))?;
    // `-S`: the loaded VM stays paused; `cont` while the state still loads would only mark it
    // to start later, so wait for the load to end first.
    let deadline = Instant::now() + s.timeout;
    loop {
        let st = dst.qmp.execute("query-status", json!({}))?;
        if st["status"] != "inmigrate" {
            break;
        }
        if Instant::now() >= deadline {
            bail!("the restore had not loaded after {:?}", s.timeout);
        }
        std::thread::sleep(POLL);
    }
    dst.qmp.execute("cont", json!({}))?;
    let restore_to_run_secs = t1.elapsed().as_secs_f64();
    let status = dst.wait_exit(s.timeout)?;
    let finish_secs = t1.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&file);
    Ok(SaveRow {
        stats: MigrateStats::from_query(&q),
        bytes_written,
        save_secs,
        restore_to_run_secs,
        finish_secs,
        checksum: dst.checksum(status)?,
    })
}
