//! `farvm-lab bench pool`: a memory pool under concurrent VMs. A local etcd, 1..N
//! `farvm-memserver --pool` processes (each its own rack) and 1..M concurrent `farvm run
//! --pool` VMs: the aggregate paging rate and the fault latency, scaled against one VM on one
//! server measured in the same run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use farvm_pool::local_etcd::LocalEtcd;
use farvm_pool::{Directory, DirectoryConfig, PoolView, RackId};
use serde::Serialize;

use crate::plot::{grouped_bars, RefLine, Series};

pub const POOL_ABOUT: &str = "\
A memory pool under load: for each memory-server count (--servers, default 1,2,4) a local
etcd and that many `farvm-memserver --pool` processes on loopback, each its own declared rack; for each
VM count (--vms, default 1,2,4,8) that many `farvm run --pool --replicas 1` VMs started
together, each running --workload (default seq:ws=24M,passes=4,write=1: every pass reads and
rewrites a 24 MiB working set through a 16 MiB local budget) with no prefetcher, so every
remote page is a demand fault. Slabs of --slab (4M) spread each VM's remote share over the
servers.

Columns: wall time from the first VM's start to the last one's exit; pages moved (bytes read
from and written to the servers by all VMs, in 4 KiB pages); the aggregate rate (pages moved
/ wall time); its ratio to 1 VM on 1 server in the same run; fault service time (fault to
page installed) p50 as the median of the VMs' p50s and p99 as the largest VM p99. Every VM
must exit 0 with its workload's native checksum. The host's other load shifts absolute
numbers: read the ratios.

Writes OUT/pool.md, OUT/pool.json, OUT/pool_pages_per_s.png and OUT/pool_fault_p99.png
(charts need a TrueType font). Needs etcd (Debian etcd-server) and the farvm and
farvm-memserver binaries next to farvm-lab.

EXAMPLES
  farvm-lab bench pool
  farvm-lab bench pool --vms 1,2 --servers 1,2 --workload seq:ws=16M,passes=2,write=1

EXIT STATUS
  0 every VM finished with its native checksum; 1 a VM failed, timed out or differed";

#[derive(Args, Debug)]
pub struct PoolArgs {
    /// Concurrent VM counts.
    #[arg(long, value_name = "N,...", default_value = "1,2,4,8")]
    pub vms: Counts,
    /// Memory-server counts.
    #[arg(long, value_name = "N,...", default_value = "1,2,4")]
    pub servers: Counts,
    /// The workload every VM runs (`farvm run --workload`).
    #[arg(long, default_value = "seq:ws=24M,passes=4,write=1")]
    pub workload: String,
    /// Guest RAM of each VM.
    #[arg(long, default_value = "64M")]
    pub memory: String,
    /// Local budget of each VM (`farvm run --local-memory`).
    #[arg(long, default_value = "25%")]
    pub local: String,
    /// Slab size: the pool's unit of placement (`farvm run --pool-slab`).
    #[arg(long, default_value = "4M")]
    pub slab: String,
    /// Output directory.
    #[arg(long, default_value = "docs/bench/pool")]
    pub out: PathBuf,
    /// Seconds a cell's VMs may take.
    #[arg(long, default_value_t = 900)]
    pub cell_timeout: u64,
}

/// A comma-separated list of counts, each at least 1 (`--vms`, `--servers`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts(pub Vec<usize>);

impl std::str::FromStr for Counts {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        s.split(',')
            .map(|p| {
                p.trim()
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n >= 1)
                    .ok_or_else(|| format!("`{p}` is not a count of at least 1 (e.g. 1,2,4)"))
            })
            .collect::<Result<_, _>>()
            .map(Counts)
    }
}

#[derive(Debug, Clone, Serialize)]
struct Row {
    vms: usize,
    servers: usize,
    wall_secs: f64,
    pages_moved: u64,
    pages_per_sec: f64,
    /// pages_per_sec over the 1 VM × 1 server cell's.
    scaling: f64,
    fault_p50_us: f64,
    fault_p99_us: f64,
    demand_faults: u64,
    checksums_ok: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    workload: String,
    memory: String,
    local: String,
    slab: String,
    rows: Vec<Row>,
    wall_secs: f64,
}

/// `name` next to this executable (or one directory up from `deps/`).
fn beside(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("executable without a directory")?;
    for d in [Some(dir), dir.parent().filter(|_| dir.ends_with("deps"))]
        .into_iter()
        .flatten()
    {
        if d.join(name).is_file() {
            return Ok(d.join(name));
        }
    }
    bail!(
        "{name} is not next to {} (cargo build --release --workspace --bins)",
        exe.display()
    )
}

/// Memory servers in the pool, killed on drop.
struct Servers(Vec<Child>);

impl Drop for Servers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn start_servers(etcd: &LocalEtcd, dir: &Directory, n: usize) -> Result<Servers> {
    let bin = beside("farvm-memserver")?;
    let racks = (0..n)
        .map(|i| RackId::new(format!("r{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    dir.declare_racks(&racks)?;
    let mut servers = Servers(Vec::new());
    for i in 0..n {
        let child = Command::new(&bin)
            .args(["--listen", "127.0.0.1:0", "--capacity", "2G", "--pool"])
            .arg(etcd.endpoint())
            .args([
                "--rack",
                &format!("r{i}"),
                "--pool-id",
                &format!("bench-ms{i}"),
            ])
            .args(["--pool-ttl", "2", "--pool-gc-grace", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        servers.0.push(child);
    }
    wait_pool(dir, "every memory server registered", |v| {
        v.servers.len() == n
    })?;
    Ok(servers)
}

fn wait_pool(dir: &Directory, what: &str, pred: impl Fn(&PoolView) -> bool) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if dir.view().is_ok_and(|v| pred(&v)) {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "the pool never showed {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn native_checksum(workload: &str) -> Result<u64> {
    let placed = farvm_vmm::workload_spec::place(&[workload.to_string()], 1)
        .map_err(|e| anyhow::anyhow!(e))?;
    let w = &placed[0];
    Ok(
        farvm_workloads::run_native(w.spec.workload.id, &w.spec.params())
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .checksum,
    )
}

/// Runs `nvms` VMs at once; returns the row (scaling left for the caller).
fn cell(a: &PoolArgs, etcd: &str, nvms: usize, servers: usize, native: u64) -> Result<Row> {
    let farvm = beside("farvm")?;
    let logs = std::env::temp_dir();
    let t0 = Instant::now();
    let mut children = Vec::new();
    for i in 0..nvms {
        let log = logs.join(format!("farvm-lab-pool-{}-{i}.log", std::process::id()));
        let child = Command::new(&farvm)
            .args([
                "run",
                "--pool",
                etcd,
                "--replicas",
                "1",
                "--pool-lease-ttl",
                "2",
            ])
            .args(["--pool-slab", &a.slab, "--pool-host", &format!("bench{i}")])
            .args(["--memory", &a.memory, "--local-memory", &a.local])
            .args(["--prefetcher", "none", "--workload", &a.workload])
            .args(["--serial", "none", "--no-control-socket", "--json"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", farvm.display()))?;
        children.push((child, log));
    }
    let deadline = t0 + Duration::from_secs(a.cell_timeout);
    let mut reports = Vec::new();
    for (mut child, log) in children {
        while child.try_wait()?.is_none() {
            if Instant::now() >= deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let o = child.wait_with_output()?;
        let err = std::fs::read_to_string(&log).unwrap_or_default();
        let _ = std::fs::remove_file(&log);
        ensure!(
            o.status.success(),
            "{nvms} VMs on {servers} server(s): a VM failed ({}): {err}",
            o.status
        );
        let v: serde_json::Value = serde_json::from_slice(&o.stdout)
            .with_context(|| format!("a VM's JSON report; its log: {err}"))?;
        reports.push(v);
    }
    let wall = t0.elapsed().as_secs_f64();
    let mut p50s = Vec::new();
    let (mut bytes, mut p99, mut faults, mut ok) = (0u64, 0f64, 0u64, true);
    for v in &reports {
        ok &= v["processes"][0]["checksum"].as_u64() == Some(native);
        let e = &v["paging"]["engine"];
        let c = &e["counters"];
        bytes += c["bytes_read"].as_u64().unwrap_or(0) + c["bytes_written"].as_u64().unwrap_or(0);
        faults += c["demand_faults"].as_u64().unwrap_or(0);
        p50s.push(e["fault_service"]["p50"].as_f64().unwrap_or(f64::NAN) / 1e3);
        p99 = p99.max(e["fault_service"]["p99"].as_f64().unwrap_or(f64::NAN) / 1e3);
    }
    p50s.sort_by(f64::total_cmp);
    let pages = bytes / 4096;
    Ok(Row {
        vms: nvms,
        servers,
        wall_secs: wall,
        pages_moved: pages,
        pages_per_sec: pages as f64 / wall,
        scaling: f64::NAN,
        fault_p50_us: p50s[p50s.len() / 2],
        fault_p99_us: p99,
        demand_faults: faults,
        checksums_ok: ok,
    })
}

pub fn run(a: PoolArgs) -> Result<()> {
    let t0 = Instant::now();
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let native = native_checksum(&a.workload)?;
    let etcd = LocalEtcd::start().map_err(|e| anyhow::anyhow!("{e}"))?;
    let dir = Directory::connect(DirectoryConfig::new(vec![etcd.endpoint()]))?;
    let mut rows = Vec::new();
    for &s in &a.servers.0 {
        let servers = start_servers(&etcd, &dir, s)?;
        for &n in &a.vms.0 {
            eprintln!("farvm-lab: {n} VM(s) on {s} memory server(s) ...");
            let row = cell(&a, &etcd.endpoint(), n, s, native)?;
            eprintln!(
                "farvm-lab: {n} VM(s) on {s} server(s): {:.0} pages/s, fault p50 {:.0} µs p99 {:.0} µs",
                row.pages_per_sec, row.fault_p50_us, row.fault_p99_us
            );
            rows.push(row);
            wait_pool(&dir, "the VMs' pages dropped", |v| {
                v.vms.is_empty() && v.servers.values().all(|r| r.used_bytes == 0)
            })?;
        }
        drop(servers);
        wait_pool(&dir, "the servers gone", |v| v.servers.is_empty())?;
    }
    let base = rows
        .iter()
        .find(|r| r.vms == 1 && r.servers == 1)
        .map(|r| r.pages_per_sec);
    for r in &mut rows {
        r.scaling = base.map_or(f64::NAN, |b| r.pages_per_sec / b);
    }
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        workload: a.workload.clone(),
        memory: a.memory.clone(),
        local: a.local.clone(),
        slab: a.slab.clone(),
        rows,
        wall_secs: t0.elapsed().as_secs_f64(),
    };
    let md = markdown(&report);
    std::fs::write(a.out.join("pool.md"), &md)?;
    std::fs::write(
        a.out.join("pool.json"),
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    print!("{md}");
    match charts(&report, &a.out, &a.vms.0, &a.servers.0) {
        Ok(files) => files.iter().for_each(|f| println!("wrote {}", f.display())),
        Err(e) => eprintln!("farvm-lab: charts skipped: {e:#}"),
    }
    if report.rows.iter().any(|r| !r.checksums_ok) {
        bail!("a VM's checksum differs from its workload's native checksum");
    }
    Ok(())
}

fn markdown(r: &Report) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Each VM: {} of guest RAM, {} local, `{}`, no prefetcher, slabs of {} (replication 1, \
         every server its own rack).\n",
        r.memory, r.local, r.workload, r.slab
    );
    s.push_str("| VMs | servers | wall s | pages moved | aggregate pages/s | vs 1 VM × 1 server | fault p50 µs | fault p99 µs | demand faults | checksums |\n");
    s.push_str("|---|---|---|---|---|---|---|---|---|---|\n");
    for row in &r.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {} | {:.0} | {:.2} | {:.0} | {:.0} | {} | {} |",
            row.vms,
            row.servers,
            row.wall_secs,
            row.pages_moved,
            row.pages_per_sec,
            row.scaling,
            row.fault_p50_us,
            row.fault_p99_us,
            row.demand_faults,
            if row.checksums_ok { "native" } else { "DIFFER" },
        );
    }
    let _ = writeln!(
        s,
        "\nCommand: `{}` ({:.0} s). Ratios hold within this run only.",
        r.command, r.wall_secs
    );
    s
}

fn charts(r: &Report, out: &Path, vms: &[usize], servers: &[usize]) -> Result<Vec<PathBuf>> {
    let cats: Vec<String> = vms.iter().map(|n| format!("{n} VM(s)")).collect();
    let pick = |get: &dyn Fn(&Row) -> f64| -> Vec<Series> {
        servers
            .iter()
            .map(|&s| Series {
                name: format!("{s} server(s)"),
                values: vms
                    .iter()
                    .map(|&n| {
                        r.rows
                            .iter()
                            .find(|x| x.vms == n && x.servers == s)
                            .map_or(f64::NAN, get)
                    })
                    .collect(),
                failed: Vec::new(),
            })
            .collect()
    };
    let base = r
        .rows
        .iter()
        .find(|x| x.vms == 1 && x.servers == 1)
        .map(|x| x.pages_per_sec);
    let mut files = Vec::new();
    let p = out.join("pool_pages_per_s.png");
    grouped_bars(
        &p,
        "Aggregate paging rate of concurrent pool VMs",
        "pages/s (read + written)",
        &cats,
        &pick(&|x| x.pages_per_sec),
        &base
            .map(|b| RefLine {
                label: "1 VM, 1 server".into(),
                value: b,
            })
            .into_iter()
            .collect::<Vec<_>>(),
        false,
    )?;
    files.push(p);
    let p = out.join("pool_fault_p99.png");
    grouped_bars(
        &p,
        "Fault service time p99 (largest VM's)",
        "µs",
        &cats,
        &pick(&|x| x.fault_p99_us),
        &[],
        false,
    )?;
    files.push(p);
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::Counts;

    #[test]
    fn counts_are_positive_and_comma_separated() {
        assert_eq!("1,2, 4".parse(), Ok(Counts(vec![1, 2, 4])));
        assert_eq!("8".parse(), Ok(Counts(vec![8])));
        for bad in ["", "1,0", "1,,2", "two"] {
            let e = bad.parse::<Counts>().unwrap_err();
            assert!(e.contains("count of at least 1"), "{bad}: {e}");
        }
    }
}
