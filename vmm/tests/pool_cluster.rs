//! The memory pool across hosts and racks: `scripts/cluster.sh` builds network namespaces on a
//! private bridge (etcd in one, 3 racks × 2 `farvm-memserver --pool` in others, 4 VM hosts,
//! a delay proxy between racks; its addresses exist only inside the namespaces), and the
//! tests run `farvm run --pool` VMs in the host namespaces:
//! - 8 VMs (2 per host) at 25% local, guest RAM 4× the hosts' local budgets, compute native
//!   checksums while every memory server of one rack is killed; the pool re-replicates the
//!   lost replicas onto the other racks while they run (`farvm pool status` shows no
//!   degraded slab);
//! - 8 VMs likewise keep their native checksums while the pool is rebalanced (three servers
//!   that took no slab while they started get replicas moved onto them) and then its busiest
//!   server is drained, both racing the VMs' writes;
//! - a SIGKILLed VMM's namespaces are reclaimed when its lease expires (the servers' used
//!   bytes come back to where they were), and a drained server ends up holding nothing
//!   while the VMs finish correct;
//! - a VM migrates live from host1 to host2 (rack r1 to rack r2) with a write-heavy and a
//!   read-heavy workload: only its resident pages cross between the hosts, the pool then
//!   lists it on host2 alone, and it finishes there with its native checksum;
//! - an etcd restart leaves running VMs alone, and a VM started meanwhile waits, saying so,
//!   then starts; a wrong token, a memory server of a rack the pool does not declare and a
//!   server speaking an older wire version are refused with clear errors.
//!
//! Needs root (network namespaces, veth, a bridge), iproute2, etcd (etcd-server) and the
//! release binaries `farvm-memserver`, `farvm-pool`, `farvm-delay-proxy` next to `farvm`
//! (`cargo build --release --workspace --bins`; CI's `cargo test --workspace` builds them).
//! Each test tears its cluster down by the PIDs and names it created, also when it fails.

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{assert_native_report, kvm_available};
use farvm_workloads::lathist::counter::LONGEST_STALL_NS;
use serde_json::Value;

/// Bound for things that follow a lease TTL or a copy (never a timing assertion: the tests
/// wait for a condition and fail only if it never comes).
const PATIENCE: Duration = Duration::from_secs(240);
const ETCD: &str = "http://10.77.0.2:2379";

/// One cluster at a time: 8 VMs already load this machine's cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// The farvm binaries the cluster runs: this build's, or those in `FARVM_TEST_BIN_DIR` (a copy
/// looped over while the tree is rebuilt).
fn bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FARVM_TEST_BIN_DIR") {
        return PathBuf::from(d);
    }
    Path::new(env!("CARGO_BIN_EXE_farvm"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cluster.sh")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn require_root_and_netns() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "this test builds network namespaces, veth pairs and a bridge: run it as root (CI does)"
    );
    let ok = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok,
        "`ip netns` does not work here: this test needs iproute2 (apt-get install iproute2) \
         and network-namespace support in the kernel"
    );
}

/// A cluster brought up by `scripts/cluster.sh`; dropping it runs `cluster.sh down`.
struct Cluster {
    name: String,
    run: PathBuf,
    token: PathBuf,
}

impl Cluster {
    /// 3 racks × 2 memory servers (1 GiB each, one shared token), 4 VM hosts.
    fn up(tag: &str) -> Self {
        require_root_and_netns();
        let name = format!("{tag}{}", std::process::id() % 10_000);
        // One directory per cluster: the tests of this binary run one after another in one
        // process, and a failed test's logs must outlive the next test's cleanup.
        let run = std::env::temp_dir().join(format!("farvm-cluster-{name}"));
        std::fs::create_dir_all(&run).unwrap();
        let token = run.join(format!("{name}.token"));
        let gen = Command::new(bin_dir().join("farvm-memserver"))
            .arg("gen-token")
            .output()
            .expect("run farvm-memserver gen-token");
        assert!(gen.status.success(), "gen-token: {}", text(&gen));
        std::fs::write(&token, &gen.stdout).unwrap();
        let o = Command::new(script())
            .args([
                "up",
                "--name",
                &name,
                "--racks",
                "3",
                "--servers-per-rack",
                "2",
            ])
            .args(["--hosts", "4", "--capacity", "1G", "--delay-us", "100"])
            .arg("--token-file")
            .arg(&token)
            .env("FARVM_BIN", bin_dir())
            .env("FARVM_CLUSTER_RUN", &run)
            .output()
            .expect("run scripts/cluster.sh");
        assert!(o.status.success(), "cluster.sh up failed:\n{}", text(&o));
        eprintln!("{}", String::from_utf8_lossy(&o.stdout));
        let c = Self { name, run, token };
        c.wait("every memory server registered", |s| servers(s).len() == 6);
        c
    }

    fn script(&self, cmd: &str) -> Output {
        Command::new(script())
            .args([cmd, "--name", &self.name])
            .env("FARVM_BIN", bin_dir())
            .env("FARVM_CLUSTER_RUN", &self.run)
            .output()
            .expect("run scripts/cluster.sh")
    }

    /// `prog` in namespace `ns` (`host1`, `r2-ms1`, ...); `ip netns exec` execs it, so the
    /// child's PID is the program's.
    fn exec(&self, ns: &str, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &format!("{}-{ns}", self.name)])
            .arg(bin_dir().join(prog));
        c
    }

    /// `farvm pool --etcd ETCD ARGS...` from host1.
    fn pool(&self, args: &[&str]) -> Output {
        self.exec("host1", "farvm")
            .args(["pool", "--etcd", ETCD])
            .args(args)
            .output()
            .expect("run farvm pool")
    }

    /// `farvm pool status --json` from host1, or None while etcd does not answer.
    fn status(&self) -> Option<Value> {
        let o = self
            .exec("host1", "farvm")
            .args(["pool", "--etcd", ETCD, "status", "--json"])
            .output()
            .ok()?;
        o.status
            .success()
            .then(|| serde_json::from_slice(&o.stdout).ok())
            .flatten()
    }

    fn wait(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        let mut last = Value::Null;
        loop {
            if let Some(s) = self.status() {
                if pred(&s) {
                    return s;
                }
                last = s;
            }
            assert!(
                Instant::now() < deadline,
                "never saw {what}; last status: {last:#}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// PIDs of the processes `cluster.sh` started whose label satisfies `pred`.
    fn pids(&self, pred: impl Fn(&str) -> bool) -> Vec<i32> {
        std::fs::read_to_string(self.run.join(&self.name).join("state"))
            .unwrap()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                (f.next() == Some("pid")).then_some(())?;
                let pid = f.next()?.parse().ok()?;
                pred(f.next()?).then_some(pid)
            })
            .collect()
    }

    /// `farvm run --pool` arguments of a VM on `host`: 64 MiB of guest RAM, 25% local,
    /// 8 MiB slabs.
    fn vm_args(&self, host: &str, workload: &str) -> Vec<String> {
        let token = self.token.to_string_lossy();
        [
            "run",
            "--pool",
            ETCD,
            "--pool-lease-ttl",
            "2",
            "--pool-slab",
            "8M",
            "--pool-host",
            host,
            "--memory",
            "64M",
            "--local-memory",
            "25%",
            "--memserver-token-file",
            &token,
            "--workload",
            workload,
            "--serial",
            "none",
            "--no-control-socket",
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Starts a VM on `host` (its log in the cluster's run directory).
    fn start_vm(&self, host: &str, workload: &str, tag: &str) -> Vm {
        self.start_vm_with(host, workload, tag, None)
    }

    /// Starts a VM on `host` with its control socket at `sock` (for `farvm migrate`).
    fn start_controlled_vm(&self, host: &str, workload: &str, tag: &str, sock: &Path) -> Vm {
        self.start_vm_with(host, workload, tag, Some(sock))
    }

    /// Starts a VM on `host`, with a control socket at `sock` if given.
    fn start_vm_with(&self, host: &str, workload: &str, tag: &str, sock: Option<&Path>) -> Vm {
        let log = self.run.join(format!("{}-vm-{host}-{tag}.log", self.name));
        let mut args = self.vm_args(host, workload);
        if let Some(sock) = sock {
            args.retain(|a| a != "--no-control-socket");
            args.push("--control-socket".into());
            args.push(sock.display().to_string());
        }
        let child = self
            .exec(host, "farvm")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(File::create(&log).unwrap())
            .spawn()
            .expect("spawn farvm run");
        Vm {
            child,
            workload: workload.to_string(),
            log,
        }
    }

    /// Starts two VMs running `workload` on each of the 4 hosts.
    fn start_two_per_host(&self, workload: &str) -> Vec<Vm> {
        (1..=4)
            .flat_map(|h| [0, 1].map(|i| (h, i)))
            .map(|(h, i)| self.start_vm(&format!("host{h}"), workload, &i.to_string()))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // `down` deletes the script's own run directory, servers' and etcd's logs with it:
            // keep them beside the VMs' logs, which are what a failure is read from.
            keep_logs(&self.run.join(&self.name), &self.run.join("cluster-logs"));
        }
        let o = self.script("down");
        if !o.status.success() {
            eprintln!("cluster.sh down: {}", text(&o));
        }
        let _ = std::fs::remove_file(&self.token);
        if std::thread::panicking() {
            eprintln!("the VMs' logs are in {}", self.run.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.run);
        }
    }
}

/// Copies every `*.log` in `from` (memory servers, proxies, etcd) into `to`; best effort, since
/// it runs while a failed test unwinds.
fn keep_logs(from: &Path, to: &Path) {
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    let _ = std::fs::create_dir_all(to);
    for e in entries.flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "log") {
            let _ = std::fs::copy(&p, to.join(e.file_name()));
        }
    }
}

/// A running `farvm run --pool`.
struct Vm {
    child: Child,
    workload: String,
    log: PathBuf,
}

impl Vm {
    /// Waits for the VM; asserts it exited 0 with its workload's native checksum; returns
    /// its JSON report.
    fn finish(self) -> Value {
        let o = self.child.wait_with_output().unwrap();
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        // The report first: it says what went wrong (a wrong word, the paging counters).
        let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            panic!(
                "{}: no JSON report ({e}), exit {:?}: {log}",
                self.log.display(),
                o.status.code()
            )
        });
        assert_native_report(&v, &self.workload);
        assert_eq!(o.status.code(), Some(0), "{}: {log}", self.log.display());
        v
    }
}

fn servers(s: &Value) -> Vec<&Value> {
    s["racks"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["servers"].as_array().into_iter().flatten())
        .collect()
}

fn server<'a>(s: &'a Value, id: &str) -> Option<&'a Value> {
    servers(s).into_iter().find(|v| v["id"] == id)
}

fn used(s: &Value) -> u64 {
    s["fleet"]["used_bytes"].as_u64().unwrap_or(0)
}

fn vms(s: &Value) -> usize {
    s["vms"].as_array().map_or(0, Vec::len)
}

fn has_rack(s: &Value, rack: &str) -> bool {
    s["racks"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|r| r["rack"] == rack && r["servers"].as_array().is_some_and(|v| !v.is_empty()))
}

fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a PID this test (or its cluster) started; no memory is involved.
    unsafe { libc::kill(pid, sig) };
}

#[test]
fn eight_vms_on_four_hosts_keep_native_checksums_when_a_rack_dies_and_the_pool_re_replicates() {
    if !kvm_available() {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("fa");
    // Each pass rewrites and re-reads the 24 MiB working set through a 16 MiB budget.
    let workload = "seq:ws=24M,passes=150,write=1,verify=1";
    let vms_started = c.start_two_per_host(workload);
    let s = c.wait(
        "8 VMs admitted on 4 hosts, with pages on the servers",
        |s| {
            vms(s) == 8 && s["hosts"].as_array().is_some_and(|h| h.len() == 4) && used(s) > 64 << 20
        },
    );
    let guest = s["fleet"]["guest_ram_bytes"].as_u64().unwrap();
    let local = s["fleet"]["local_ram_bytes"].as_u64().unwrap();
    eprintln!(
        "8 VMs: guest RAM {} MiB over host-local budgets of {} MiB (oversubscription {:.1}); \
         pool used {} MiB",
        guest >> 20,
        local >> 20,
        guest as f64 / local as f64,
        used(&s) >> 20
    );
    assert!(guest >= 2 * local, "{:#}", s["fleet"]);
    for r in s["racks"].as_array().unwrap() {
        assert_eq!(r["servers"].as_array().unwrap().len(), 2, "{r:#}");
    }
    let on_r1: usize = ["r1-ms1", "r1-ms2"]
        .iter()
        .map(|id| server(&s, id).unwrap()["vms"].as_array().unwrap().len())
        .sum();
    assert!(on_r1 > 0, "no VM has a replica in rack r1: {s:#}");

    // Rack r1 dies: its memory servers and the links to them.
    let r1 = c.pids(|l| l.starts_with("r1-"));
    assert_eq!(r1.len(), 4, "r1's servers and delay proxies");
    for pid in r1 {
        kill(pid, libc::SIGKILL);
    }
    let s = c.wait(
        "rack r1 gone and every VM's slabs re-replicated onto the racks left",
        |s| {
            !has_rack(s, "r1")
                && vms(s) == 8
                && s["vms"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|v| v["degraded_slabs"] == 0)
        },
    );
    eprintln!(
        "after losing r1: {} racks, every VM's slabs at R=2 again; pool used {} MiB",
        s["fleet"]["racks"],
        used(&s) >> 20
    );
    let mut rereplicated = 0;
    for vm in vms_started {
        let v = vm.finish();
        let r = &v["paging"]["remote"];
        rereplicated += r["slabs_rereplicated"].as_u64().unwrap_or(0)
            + r["replicas_moved"].as_u64().unwrap_or(0);
    }
    assert!(rereplicated > 0, "no client copied a slab");
    c.wait("nothing stored after the VMs exited", |s| {
        vms(s) == 0 && used(s) == 0
    });
}

#[test]
fn eight_vms_keep_native_checksums_while_the_pool_is_rebalanced_and_a_server_drained() {
    if !kvm_available() {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("fr");
    // One server per rack takes no slab while the VMs start, so the other three hold every
    // replica and the pool is as unbalanced as it gets.
    let idle = ["r1-ms2", "r2-ms2", "r3-ms2"];
    for id in idle {
        let o = c.pool(&["drain", id, "--no-wait"]);
        assert!(o.status.success(), "drain --no-wait {id}: {}", text(&o));
    }
    // Each pass rewrites and re-reads the 24 MiB working set through a 16 MiB budget.
    let workload = "seq:ws=24M,passes=200,write=1,verify=1";
    let vms_started = c.start_two_per_host(workload);
    let s = c.wait("8 VMs with pages on three servers", |s| {
        vms(s) == 8 && used(s) > 64 << 20
    });
    for id in idle {
        assert_eq!(server(&s, id).unwrap()["used_bytes"], 0, "{s:#}");
    }

    // The idle servers take slabs again; rebalancing moves replicas onto them while every VM
    // rewrites its pages.
    for id in idle {
        let o = c.pool(&["drain", "--undo", id]);
        assert!(o.status.success(), "drain --undo {id}: {}", text(&o));
    }
    let o = c.pool(&["rebalance", "--timeout", "300"]);
    assert!(o.status.success(), "rebalance: {}", text(&o));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("move(s) done"), "{said}");
    let took = |s: &Value| {
        idle.iter()
            .filter(|id| server(s, id).is_some_and(|v| v["used_bytes"].as_u64() > Some(0)))
            .count()
    };
    let s = c.wait("the idle servers holding replicas", |s| took(s) > 0);
    eprintln!(
        "rebalanced: {} move(s), onto {} of the idle servers",
        said.lines().filter(|l| l.starts_with("move ")).count(),
        took(&s)
    );

    // Then the busiest server is drained while they still write.
    let drained = servers(&s)
        .into_iter()
        .max_by_key(|v| v["used_bytes"].as_u64())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let o = c.pool(&["drain", &drained, "--timeout", "300"]);
    assert!(o.status.success(), "drain {drained}: {}", text(&o));
    let s = c.wait("the drained server holding nothing", |s| {
        server(s, &drained).is_some_and(|v| v["used_bytes"] == 0)
    });
    assert_eq!(
        vms(&s),
        8,
        "a VM finished before the drain did (lengthen its workload): {s:#}"
    );
    let mut moved = 0;
    for vm in vms_started {
        moved += vm.finish()["paging"]["remote"]["replicas_moved"]
            .as_u64()
            .unwrap_or(0);
    }
    assert!(moved > 0, "no client moved a replica");
    c.wait("nothing stored after the VMs exited", |s| {
        vms(s) == 0 && used(s) == 0
    });
}

#[test]
fn a_killed_vmm_is_reclaimed_and_a_drained_server_ends_empty_across_hosts() {
    if !kvm_available() {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("fb");

    // SIGKILL: the lease expires and every server drops the VM's pages by itself.
    let before = used(&c.status().unwrap());
    let mut victim = c.start_vm("host2", "seq:ws=24M,passes=100000", "killed");
    let s = c.wait("the VM's pages on the servers", |s| {
        vms(s) == 1 && used(s) > before + (16 << 20)
    });
    let holding: Vec<&Value> = servers(&s)
        .into_iter()
        .filter(|v| v["used_bytes"].as_u64() > Some(0))
        .collect();
    assert!(holding.len() >= 2, "R=2: {s:#}");
    victim.child.kill().unwrap(); // SIGKILL
    victim.child.wait().unwrap();
    c.wait("the killed VM's namespaces reclaimed", |s| {
        vms(s) == 0 && s["orphans"].as_array().is_some_and(Vec::is_empty) && used(s) == before
    });

    // Drain: two VMs on two hosts run while a server of theirs is emptied.
    let workload = "seq:ws=24M,passes=300,write=1,verify=1";
    let a = c.start_vm("host3", workload, "a");
    let b = c.start_vm("host4", workload, "b");
    let s = c.wait("both VMs with pages on their servers", |s| {
        vms(s) == 2 && used(s) > 48 << 20
    });
    let drained = servers(&s)
        .into_iter()
        .filter(|v| v["vms"].as_array().is_some_and(|x| !x.is_empty()))
        .max_by_key(|v| v["used_bytes"].as_u64())
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let d = c
        .exec("host1", "farvm")
        .args(["pool", "--etcd", ETCD, "drain", &drained])
        .output()
        .unwrap();
    assert!(d.status.success(), "drain {drained}: {}", text(&d));
    let said = String::from_utf8_lossy(&d.stdout);
    assert!(said.contains("move slab"), "{said}");
    let s = c.wait("the drained server holding nothing", |s| {
        server(s, &drained).is_some_and(|v| v["used_bytes"] == 0)
    });
    assert_eq!(
        vms(&s),
        2,
        "a VM finished before the drain did (lengthen its workload): {s:#}"
    );
    let moved: u64 = [a, b]
        .map(|vm| {
            vm.finish()["paging"]["remote"]["replicas_moved"]
                .as_u64()
                .unwrap_or(0)
        })
        .iter()
        .sum();
    assert!(moved >= 1, "no replica moved");
    let s = c.wait("nothing stored after the VMs exited", |s| {
        vms(s) == 0 && used(s) == 0
    });
    assert_eq!(server(&s, &drained).unwrap()["used_bytes"], 0);
}

#[test]
fn etcd_restarts_under_running_vms_and_bad_tokens_unknown_racks_and_old_servers_are_refused() {
    if !kvm_available() {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("fc");

    // A VM runs through an etcd restart; one started meanwhile waits, says why, then starts.
    let running = c.start_vm("host1", "seq:ws=24M,passes=200,write=1,verify=1", "through");
    c.wait("the running VM registered", |s| vms(s) == 1);
    let o = c.script("etcd-stop");
    assert!(o.status.success(), "{}", text(&o));
    let workload = "seq:ws=24M,passes=2";
    let mut waiting = c
        .exec("host2", "farvm")
        .args(c.vm_args("host2", workload))
        .args(["--pool-wait", "300"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(waiting.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("waiting") {
        let mut l = String::new();
        if err.read_line(&mut l).unwrap() == 0 {
            break;
        }
        said.push_str(&l);
    }
    assert!(said.contains("etcd unreachable"), "{said}");
    assert!(said.contains("waiting"), "{said}");
    let o = c.script("etcd-start");
    assert!(o.status.success(), "{}", text(&o));
    let rest = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
        rest
    });
    let mut out = Vec::new();
    waiting
        .stdout
        .take()
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    let status = waiting.wait().unwrap();
    let rest = rest.join().unwrap();
    assert_eq!(status.code(), Some(0), "{said}{rest}");
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_native_report(&v, workload);
    running.finish();

    // A wrong token: the servers refuse the VM's connections and farvm says so.
    let wrong = c.run.join(format!("{}.wrong-token", c.name));
    let gen = Command::new(bin_dir().join("farvm-memserver"))
        .arg("gen-token")
        .output()
        .unwrap();
    std::fs::write(&wrong, &gen.stdout).unwrap();
    let mut args = c.vm_args("host3", "seq:ws=4M");
    let i = args
        .iter()
        .position(|a| a == "--memserver-token-file")
        .unwrap();
    args[i + 1] = wrong.to_string_lossy().into_owned();
    let o = c.exec("host3", "farvm").args(&args).output().unwrap();
    let _ = std::fs::remove_file(&wrong);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("authentication"), "{err}");

    // A memory server whose rack the pool does not declare (a typo, r01 for r1) is refused:
    // it exits with the racks the pool declares and never shows in the pool.
    let o = c
        .exec("r1-ms1", "farvm-memserver")
        .args(["--listen", "10.77.1.11:7071", "--capacity", "64M"])
        .args(["--pool", ETCD, "--rack", "r01", "--pool-id", "r01-ms9"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(78), "{err}");
    assert!(
        err.contains("rack r01 is not declared in the pool (declared racks: r1, r2, r3)"),
        "{err}"
    );
    assert!(server(&c.status().unwrap(), "r01-ms9").is_none());

    // A server of an older wire version in a fourth rack: it gets no slab, and a VM that
    // needs it (4 replicas on 4 racks) is refused, naming it.
    let add = c
        .exec("host1", "farvm")
        .args(["pool", "--etcd", ETCD, "racks", "add", "r4"])
        .output()
        .unwrap();
    assert!(add.status.success(), "{}", text(&add));
    let mut old = c
        .exec("host1", "farvm-pool")
        .args(["--etcd", ETCD, "announce-server", "--id", "r4-old"])
        .args([
            "--address",
            "10.77.1.11:7070",
            "--rack",
            "r4",
            "--capacity",
            "1G",
        ])
        .args(["--wire-version", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    c.wait("the old server registered", |s| {
        server(s, "r4-old").is_some()
    });
    let mut args = c.vm_args("host3", "seq:ws=4M");
    args.extend(["--replicas".to_string(), "4".to_string()]);
    let o = c.exec("host3", "farvm").args(&args).output().unwrap();
    let _ = old.kill();
    let _ = old.wait();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("cannot admit VM"), "{err}");
    let why = format!(
        "r4-old speaks wire version 1 < {}",
        farvm_memproto::PROTOCOL_VERSION
    );
    assert!(err.contains(&why), "{err}");
    c.wait("nothing stored, no VM", |s| vms(s) == 0 && used(s) == 0);
}

#[test]
fn a_vm_migrates_between_hosts_moving_only_its_resident_pages() {
    if !kvm_available() {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Cluster::up("fm");
    let key = c.run.join("migration.key");
    std::fs::write(&key, [0x5a; 32]).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // host2 is in rack r2 (cluster.sh: host N in rack ((N-1) mod 3) + 1, at 10.77.K.10N).
    let to = "10.77.2.102:7000";
    for (tag, workload) in [
        ("write", "seq:ws=48M,passes=60,write=1,verify=1"),
        ("read", "seq:ws=48M,passes=200,write=0"),
    ] {
        let sock = c.run.join(format!("{tag}.sock"));
        let src = c.start_controlled_vm("host1", workload, tag, &sock);
        let s = c.wait("the VM admitted on host1 with pages in the pool", |s| {
            vms(s) == 1 && used(s) > 16 << 20
        });
        assert_eq!(s["vms"][0]["host"], "host1", "{s:#}");
        let dlog = c.run.join(format!("{}-dst-{tag}.log", c.name));
        let mut dst = c
            .exec("host2", "farvm")
            .args(["run", "--incoming", to, "--migration-key-file"])
            .arg(&key)
            .args(["--pool-host", "host2", "--serial", "none", "--json"])
            .args(["--no-control-socket", "--name", &format!("dst-{tag}")])
            .stdout(Stdio::piped())
            .stderr(File::create(&dlog).unwrap())
            .spawn()
            .expect("spawn the destination");
        // The destination listens once it has printed so.
        let deadline = Instant::now() + PATIENCE;
        while !std::fs::read_to_string(&dlog)
            .unwrap_or_default()
            .contains("waiting for a migrating VM")
        {
            assert!(Instant::now() < deadline, "the destination never listened");
            if let Some(st) = dst.try_wait().unwrap() {
                panic!(
                    "the destination exited {st}: {}",
                    std::fs::read_to_string(&dlog).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_secs(2)); // let the workload run a while
        let o = c
            .exec("host1", "farvm")
            .args(["migrate", "--json", "--socket"])
            .arg(&sock)
            .args(["--to", to, "--key-file"])
            .arg(&key)
            .output()
            .unwrap();
        assert!(o.status.success(), "farvm migrate: {}", text(&o));
        let m: Value = serde_json::from_slice(&o.stdout).unwrap();
        let resident = m["resident_pages"].as_u64().unwrap() * 4096;
        let sent = m["bytes_sent"].as_u64().unwrap();
        eprintln!(
            "{tag}-heavy ({workload}): resident {} KiB, remote {} KiB, sent {} KiB ({:.2}x the \
             resident pages), rounds {:?}, paused {:.0} ms (final phase {:.0} ms, estimated \
             {:.0} ms; destination {:.0} ms), total {:.0} ms",
            resident >> 10,
            m["remote_pages"].as_u64().unwrap() * 4,
            sent >> 10,
            sent as f64 / resident.max(1) as f64,
            m["pages_per_round"],
            m["paused_secs"].as_f64().unwrap() * 1e3,
            m["final_phase_secs"].as_f64().unwrap() * 1e3,
            m["pause_estimate_secs"].as_f64().unwrap() * 1e3,
            m["destination_secs"].as_f64().unwrap() * 1e3,
            m["total_secs"].as_f64().unwrap() * 1e3
        );
        assert_eq!(m["confirmed"], true, "{m}");
        // Far less than guest RAM (64 MiB) crosses between the hosts.
        assert!(sent < 48 << 20, "{m}");
        let s = c.status().unwrap();
        assert_eq!(vms(&s), 1, "{s:#}");
        assert_eq!(s["vms"][0]["host"], "host2", "{s:#}");
        let v = src.child.wait_with_output().unwrap();
        let report: Value = serde_json::from_slice(&v.stdout).unwrap();
        assert_eq!(report["outcome"]["kind"], "migrated", "{report}");
        let o = dst.wait_with_output().unwrap();
        let report: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            panic!(
                "the destination: no report ({e}): {}",
                std::fs::read_to_string(&dlog).unwrap_or_default()
            )
        });
        assert_native_report(&report, workload);
        // The guest's own clock saw the pause: the destination moved it forward by the time
        // the VM was paused, so the scan's longest step from one page to the next spans it.
        let stall_ns = report["processes"][0]["counters"][LONGEST_STALL_NS]
            .as_u64()
            .unwrap();
        let paused_ns = (m["paused_secs"].as_f64().unwrap() * 1e9) as u64;
        eprintln!(
            "{tag}-heavy: guest-visible pause (the longest the guest's scan went from one page \
             to the next, its own clock) {:.1} ms; the source counted {:.1} ms paused",
            stall_ns as f64 / 1e6,
            paused_ns as f64 / 1e6
        );
        assert!(
            stall_ns >= paused_ns / 2,
            "the guest's clock did not see the pause: longest stall {stall_ns} ns, paused \
             {paused_ns} ns"
        );
        c.wait("the VM gone from the pool, no page left", |s| {
            vms(s) == 0 && used(s) == 0
        });
    }
}
