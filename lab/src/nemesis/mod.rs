//! `farvm-lab nemesis`: the randomized fault tester of the memory pool. For each seed it brings
//! a `scripts/cluster.sh` cluster up, starts VMs with a checksum workload, runs the faults the
//! seed draws (`schedule.rs`, acted out by `faults.rs`), heals everything, waits a quiet
//! period and checks the invariants (`invariants.rs`); `report.rs` sums the run up. This file
//! holds the flags and runs one schedule after another.

mod cluster;
mod faults;
mod invariants;
mod report;
mod schedule;
mod vms;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Args;

use cluster::{Cluster, ClusterConfig};
use report::Outcome;
use schedule::{Kind, Shape};
use vms::VmConfig;

/// How long memory servers wait before dropping a gone VM's namespace
/// (`farvm-memserver --pool-gc-grace`, whose default `scripts/cluster.sh` keeps).
const GC_GRACE: Duration = Duration::from_secs(5);
/// How long the VMs may take to be admitted.
const ADMISSION_BOUND: Duration = Duration::from_secs(60);

pub const NEMESIS_ABOUT: &str = "\
A randomized fault tester of the memory pool. For each of --schedules seeds (--seed, --seed+1,
...) it brings up a cluster with scripts/cluster.sh (network namespaces: etcd, --racks racks of
--servers-per-rack memory servers, each with Prometheus metrics, and --hosts VM hosts), starts
--vms VMs (`farvm run --pool`, --memory of guest RAM, --local of it resident; VM i on host
i mod --hosts + 1) running --workload, a workload that checks its own data and ends with a
checksum, and once the pool has admitted them all, runs --faults faults drawn from the seed
at times spread over --span seconds:

  etcd-pause              SIGSTOP etcd, SIGCONT after 0.5-8 s
  etcd-restart            cluster.sh etcd-stop, etcd-start after 0.5-8 s (same data)
  partition               every namespace of a rack (servers and hosts) loses its link, 0.5-8 s
  server-kill             SIGKILL a memory server for good
  server-pause            SIGSTOP a memory server, SIGCONT after 0.5-8 s
  server-restart-empty    SIGKILL a memory server, start an empty one under a new pool id
  server-restart-same-id  SIGKILL a memory server, start it again (empty) under the same id
  vmm-pause               SIGSTOP a VMM past its lease TTL and the pool's grace, then SIGCONT
  vmm-kill                SIGKILL a VMM
  drain                   farvm-pool drain SERVER --timeout 15, the mark taken off at the end
  rebalance               farvm-pool rebalance --timeout 15

One fault at a time holds each target (etcd, a rack, a server, a VM); faults on different
targets overlap. The schedule is printed and written, with every action's time, every VM's
report and log and every cluster process's log, to LOGS/seed-S/ (schedule.txt, events.log,
vmN.json, vmN.log, etcd.log, rK-msI.log, ...).

After the faults everything heals (links up, processes continued, etcd running, drain marks
off), the VMs run to their end (at most --vm-timeout seconds more), and these invariants must
hold once a quiet period of the VMs' lease TTL plus the memory servers' grace (5 s) is over:

  1 every VM ended with its workload's native checksum (exit 0), or exit 74 (guest memory
    lost or reclaimed, documented by farvm run), or 137 when the nemesis SIGKILLed it
  2 no leak: no memory server stores a page (read from its own metrics), and the pool lists
    no VM, no namespace awaiting collection and no reserved bytes
  3 `farvm-pool status --json` agrees with the servers: it lists exactly the servers running,
    each up and with the bytes the server says it stores
  4 nothing hung: every VM ended within --vm-timeout, every drain and rebalance within 60 s

2 and 3 are polled from the moment the last VM ended until they hold, for at most the quiet
period plus --settle seconds (servers drop namespaces on their own schedule); what still fails
then is a violation. With every VM and command ended nothing can store a page any more, so
once they hold they keep holding. (Before the faults the servers' metrics must show the VMs'
pages: a check reading nothing would pass.) A schedule that fails prints its seed, the
invariant and the command that replays it: the same flags with --seed S --schedules 1.

At the end a table gives, per fault kind, how many were drawn, and per schedule how its VMs
ended and its violations; it is also written to LOGS/summary.md.

Needs root (network namespaces), iproute2, etcd (Debian etcd-server), /dev/kvm and the
binaries farvm, farvm-memserver, farvm-pool and farvm-delay-proxy in --bin-dir.

EXAMPLES
  farvm-lab nemesis --seed 1 --schedules 25
  farvm-lab nemesis --seed 1 --schedules 1 --faults 4 --vms 3 --span 10 \\
      --workload seq:ws=24M,passes=40,write=1,verify=1
  farvm-lab nemesis --seed 7 --schedules 5 --kinds server-kill,drain,rebalance

EXIT STATUS
  0 every schedule kept every invariant; 1 a schedule violated one (or could not run);
  64 bad arguments";

#[derive(Args, Debug, Clone)]
pub struct NemesisArgs {
    /// The first schedule's seed; schedule i uses seed + i.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How many schedules to run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub schedules: u64,
    /// Faults per schedule.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(0..=100))]
    pub faults: u64,
    /// VMs per schedule.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=32))]
    pub vms: u64,
    /// Seconds over which the faults start (from the moment every VM is admitted).
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub span: u64,
    /// The workload every VM runs (`farvm run --workload`); it must check its data and end
    /// with a checksum.
    #[arg(long, default_value = "seq:ws=24M,passes=40,write=1,verify=1")]
    pub workload: String,
    /// Guest RAM of each VM.
    #[arg(long, default_value = "64M")]
    pub memory: String,
    /// Resident share of each VM (`farvm run --local-memory`); the rest is in the pool.
    #[arg(long, default_value = "25%")]
    pub local: String,
    /// The VMs' lease TTL in seconds (`farvm run --pool-lease-ttl`).
    #[arg(long, value_name = "SECONDS", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub lease_ttl: u64,
    /// Racks in the cluster.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub racks: u32,
    /// Memory servers per rack.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub servers_per_rack: u32,
    /// VM hosts (VMs go round-robin onto them).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=99))]
    pub hosts: u32,
    /// Arena size of each memory server.
    #[arg(long, default_value = "1G")]
    pub capacity: String,
    /// The fault kinds to draw from, comma-separated (names as listed above) [default: all].
    #[arg(long, value_name = "KIND,...", value_delimiter = ',', value_parser = parse_kind)]
    pub kinds: Vec<Kind>,
    /// Seconds each VM may run after the faults ended before it counts as hung.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    pub vm_timeout: u64,
    /// Seconds invariants 2 and 3 may take to hold after the quiet period is over.
    #[arg(long, value_name = "SECONDS", default_value_t = 30)]
    pub settle: u64,
    /// Where each schedule's folder (seed-S/) and summary.md go.
    #[arg(long, value_name = "DIR", default_value = "nemesis-logs")]
    pub logs: PathBuf,
    /// The cluster script.
    #[arg(long, value_name = "FILE", default_value = "scripts/cluster.sh")]
    pub cluster_script: PathBuf,
    /// Directory of the farvm binaries [default: the one farvm-lab is in].
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
}

fn parse_kind(s: &str) -> Result<Kind, String> {
    Kind::parse(s).ok_or_else(|| {
        let all: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown fault kind `{s}` (kinds: {})", all.join(", "))
    })
}

impl NemesisArgs {
    fn kinds(&self) -> Vec<Kind> {
        if self.kinds.is_empty() {
            Kind::ALL.to_vec()
        } else {
            self.kinds.clone()
        }
    }

    /// The command that runs `seed` alone with these flags.
    fn replay(&self, seed: u64) -> String {
        let mut s = format!(
            "farvm-lab nemesis --seed {seed} --schedules 1 --faults {} --vms {} --span {} \
             --workload {} --memory {} --local {} --lease-ttl {} --racks {} \
             --servers-per-rack {} --hosts {} --capacity {}",
            self.faults,
            self.vms,
            self.span,
            self.workload,
            self.memory,
            self.local,
            self.lease_ttl,
            self.racks,
            self.servers_per_rack,
            self.hosts,
            self.capacity
        );
        if !self.kinds.is_empty() {
            let k: Vec<&str> = self.kinds.iter().map(|k| k.name()).collect();
            s += &format!(" --kinds {}", k.join(","));
        }
        s
    }
}

fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    ensure!(
        uid == 0,
        "the nemesis builds network namespaces, veth pairs and a bridge (scripts/cluster.sh): \
         run it as root"
    );
    let ok = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .is_ok_and(|o| o.status.success());
    ensure!(
        ok,
        "`ip netns` does not work here: the nemesis needs iproute2 and network-namespace \
         support in the kernel"
    );
    Ok(())
}

fn bin_dir(a: &NemesisArgs) -> Result<PathBuf> {
    let dir = match &a.bin_dir {
        Some(d) => d.clone(),
        None => {
            let exe = std::env::current_exe()?;
            exe.parent()
                .context("executable without a directory")?
                .to_path_buf()
        }
    };
    for b in [
        "farvm",
        "farvm-memserver",
        "farvm-pool",
        "farvm-delay-proxy",
    ] {
        ensure!(
            dir.join(b).is_file(),
            "{b} is not in {} (cargo build --release --workspace --bins, or --bin-dir)",
            dir.display()
        );
    }
    Ok(dir)
}

fn native_checksum(workload: &str) -> Result<u64> {
    let placed = farvm_vmm::workload_spec::place(&[workload.to_string()], 1)
        .map_err(|e| anyhow::anyhow!("--workload {workload}: {e}"))?;
    let w = &placed[0];
    Ok(
        farvm_workloads::run_native(w.spec.workload.id, &w.spec.params())
            .map_err(|e| anyhow::anyhow!("--workload {workload} natively: {e}"))?
            .checksum,
    )
}

pub fn run(a: NemesisArgs) -> Result<()> {
    require_root()?;
    let bin = bin_dir(&a)?;
    ensure!(
        a.cluster_script.is_file(),
        "{} does not exist: run from the repository's root or pass --cluster-script",
        a.cluster_script.display()
    );
    let script = std::fs::canonicalize(&a.cluster_script)?;
    farvm_vmm::vstate::vm::check_available()
        .map_err(|e| anyhow::anyhow!("the nemesis runs VMs and needs a usable /dev/kvm: {e}"))?;
    let native = native_checksum(&a.workload)?;
    std::fs::create_dir_all(&a.logs).with_context(|| format!("creating {}", a.logs.display()))?;
    let logs = std::fs::canonicalize(&a.logs)?;
    let cfg = ClusterConfig {
        script,
        bin,
        racks: a.racks,
        servers_per_rack: a.servers_per_rack,
        hosts: a.hosts,
        capacity: a.capacity.clone(),
        delay_us: 100,
    };
    let vm = VmConfig {
        workload: a.workload.clone(),
        memory: a.memory.clone(),
        local: a.local.clone(),
        lease_ttl: a.lease_ttl,
        native,
    };
    let mut outcomes = Vec::new();
    for seed in a.seed..a.seed + a.schedules {
        let t = Instant::now();
        let dir = logs.join(format!("seed-{seed}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let shape = Shape {
            racks: a.racks,
            servers_per_rack: a.servers_per_rack,
            vms: a.vms as usize,
            lease_ttl: Duration::from_secs(a.lease_ttl),
            gc_grace: GC_GRACE,
        };
        let s = schedule::draw(
            seed,
            a.faults as usize,
            Duration::from_secs(a.span),
            &a.kinds(),
            shape,
        );
        eprint!("farvm-lab nemesis: {s}");
        std::fs::write(dir.join("schedule.txt"), s.to_string())?;
        let mut o = Outcome {
            schedule: s,
            endings: Vec::new(),
            violations: Vec::new(),
            error: None,
            secs: 0.0,
            replay: a.replay(seed),
            phases: String::new(),
        };
        if let Err(e) = one(&a, &cfg, &vm, &dir, &mut o) {
            o.error = Some(format!("{e:#}"));
        }
        o.secs = t.elapsed().as_secs_f64();
        let verdict = match (&o.error, o.violations.len()) {
            (Some(e), _) => format!("ERROR: {e}"),
            (None, 0) => "pass".to_string(),
            (None, n) => format!("FAIL: {n} violation(s)"),
        };
        eprintln!(
            "farvm-lab nemesis: seed {seed}: {verdict} ({:.0} s: {}; VMs: {})",
            o.secs,
            o.phases,
            o.endings
                .iter()
                .map(|e| e.label())
                .collect::<Vec<_>>()
                .join(" ")
        );
        for v in &o.violations {
            eprintln!("farvm-lab nemesis: seed {seed}: {v}");
        }
        if !o.passed() {
            eprintln!(
                "farvm-lab nemesis: seed {seed}: logs in {}; replay: {}",
                dir.display(),
                o.replay
            );
        }
        std::fs::write(
            dir.join("result.txt"),
            format!(
                "{verdict}\n{}\nreplay: {}\n",
                o.violations
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n"),
                o.replay
            ),
        )?;
        outcomes.push(o);
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let md = report::markdown(&command, &outcomes);
    std::fs::write(logs.join("summary.md"), &md)?;
    print!("{md}");
    let failed = outcomes.iter().filter(|o| !o.passed()).count();
    if failed > 0 {
        bail!(
            "{failed} of {} schedule(s) failed (see above; logs in {})",
            outcomes.len(),
            logs.display()
        );
    }
    Ok(())
}

/// One schedule: cluster up, VMs, faults, heal, quiet period, checks; the cluster goes down
/// (its logs kept) when this returns.
fn one(
    a: &NemesisArgs,
    cfg: &ClusterConfig,
    vm: &VmConfig,
    dir: &Path,
    o: &mut Outcome,
) -> Result<()> {
    let name = format!("nm{}", std::process::id() % 10_000);
    let t0 = Instant::now();
    let c = Cluster::up(cfg.clone(), &name, &dir.join("cluster-run"), dir)?;
    let up = t0.elapsed();
    let mut started = Vec::new();
    for i in 0..a.vms as usize {
        started.push(vms::start(&c, vm, i, dir)?);
    }
    let flags: Vec<_> = started.iter().map(|v| v.flags.clone()).collect();
    let want = a.vms as usize;
    c.wait(ADMISSION_BOUND, || {
        c.status().is_some_and(|s| s.vms.len() == want)
    })
    .with_context(|| {
        format!(
            "the pool did not admit the {want} VM(s) within {} s (see {}/vm*.log)",
            ADMISSION_BOUND.as_secs(),
            dir.display()
        )
    })?;
    // The leak check reads the servers' own counts: they must be seen to count the VMs' pages
    // before the faults, or a check that reads nothing would pass.
    c.wait(ADMISSION_BOUND, || c.pages_stored_total() > 0)
        .context("the memory servers' metrics never showed the VMs' pages")?;
    let admitted = t0.elapsed();
    let mut nemesis = faults::Nemesis::new(&c, flags, dir);
    nemesis.run(&o.schedule);
    let after = nemesis.heal();
    let healed = t0.elapsed();
    std::fs::write(dir.join("events.log"), after.events.join("\n") + "\n")?;
    let deadline = Instant::now() + Duration::from_secs(a.vm_timeout);
    o.endings = vms::finish(started, deadline, vm.native);
    let ended = t0.elapsed();
    o.violations = invariants::endings(&o.endings, &after.hung);
    // The quiet period (a dead VM's lease runs out, then the servers' grace), and the settle.
    let quiet = Duration::from_secs(a.lease_ttl) + GC_GRACE;
    o.violations.extend(invariants::storage(
        &c,
        &after.servers,
        quiet + Duration::from_secs(a.settle),
    ));
    let checked = t0.elapsed();
    drop(c);
    let _ = std::fs::remove_dir_all(dir.join("cluster-run"));
    let s = |d: Duration| d.as_secs_f64();
    o.phases = format!(
        "up {:.1} s, admitted {:.1}, faults healed {:.1}, VMs ended {:.1}, checked {:.1}, down {:.1}",
        s(up),
        s(admitted),
        s(healed),
        s(ended),
        s(checked),
        s(t0.elapsed())
    );
    Ok(())
}
