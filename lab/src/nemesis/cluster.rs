//! The nemesis's cluster: `scripts/cluster.sh` brought up with metrics on every memory server,
//! the processes it records (PIDs by label), commands run inside its namespaces, the pool's
//! `status --json` and each server's own count of stored pages. Dropping it keeps every log
//! of the cluster's processes in the schedule's folder, then tears the cluster down.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use farvm_pool::status::ServerStatus;
use farvm_pool::PoolStatus;

/// The etcd client URL inside the cluster (scripts/cluster.sh's layout).
pub const ETCD: &str = "http://10.77.0.2:2379";
/// The port each memory server serves its metrics on, at its in-rack address.
const METRICS_PORT: u16 = 9370;

/// How the cluster is laid out and where its pieces are.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub script: PathBuf,
    /// Directory of the farvm binaries (farvm, farvm-memserver, farvm-pool, farvm-delay-proxy).
    pub bin: PathBuf,
    pub racks: u32,
    pub servers_per_rack: u32,
    pub hosts: u32,
    pub capacity: String,
    pub delay_us: u32,
}

pub struct Cluster {
    pub name: String,
    pub cfg: ClusterConfig,
    /// `FARVM_CLUSTER_RUN`: the script keeps its state and logs in `run/name`.
    run: PathBuf,
    /// Where the logs go when the cluster is dropped.
    keep: PathBuf,
    /// One `cluster.sh` command at a time: they rewrite its state file (`sed -i`), and two at
    /// once could lose a recorded PID.
    serial: Mutex<()>,
}

/// Text of a finished command, stdout then stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

impl Cluster {
    /// Brings the cluster up as `name`, its state under `run`; its logs end up in `keep`.
    pub fn up(cfg: ClusterConfig, name: &str, run: &Path, keep: &Path) -> Result<Self> {
        std::fs::create_dir_all(run).with_context(|| format!("creating {}", run.display()))?;
        let c = Self {
            name: name.to_string(),
            cfg,
            run: run.to_path_buf(),
            keep: keep.to_path_buf(),
            serial: Mutex::new(()),
        };
        let o = c
            .script_cmd("up")
            .args(["--racks", &c.cfg.racks.to_string()])
            .args(["--servers-per-rack", &c.cfg.servers_per_rack.to_string()])
            .args(["--hosts", &c.cfg.hosts.to_string()])
            .args(["--capacity", &c.cfg.capacity])
            .args(["--delay-us", &c.cfg.delay_us.to_string()])
            .args(["--metrics-port", &METRICS_PORT.to_string()])
            .output()
            .with_context(|| format!("running {}", c.cfg.script.display()))?;
        ensure!(o.status.success(), "cluster.sh up failed: {}", text(&o));
        let want = (c.cfg.racks * c.cfg.servers_per_rack) as usize;
        c.wait(Duration::from_secs(60), || {
            c.status().is_some_and(|s| servers(&s).count() == want)
        })
        .context("not every memory server registered in the pool within 60 s")?;
        Ok(c)
    }

    fn script_cmd(&self, cmd: &str) -> Command {
        let mut c = Command::new(&self.cfg.script);
        c.args([cmd, "--name", &self.name])
            .env("FARVM_BIN", &self.cfg.bin)
            .env("FARVM_CLUSTER_RUN", &self.run)
            .stdin(Stdio::null());
        c
    }

    /// `cluster.sh CMD [NS] [ARGS]`; fails with the script's words.
    pub fn script(&self, cmd: &str, ns: Option<&str>, args: &[&str]) -> Result<String> {
        let _one = self.serial.lock().unwrap_or_else(|e| e.into_inner());
        let mut c = Command::new(&self.cfg.script);
        c.arg(cmd);
        if let Some(ns) = ns {
            c.arg(ns);
        }
        let o = c
            .args(["--name", &self.name])
            .args(args)
            .env("FARVM_BIN", &self.cfg.bin)
            .env("FARVM_CLUSTER_RUN", &self.run)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running {}", self.cfg.script.display()))?;
        ensure!(o.status.success(), "cluster.sh {cmd}: {}", text(&o).trim());
        Ok(text(&o).trim().to_string())
    }

    /// The namespace of `short` (`etcd`, `host1`, `r2-ms1`).
    pub fn ns(&self, short: &str) -> String {
        format!("{}-{short}", self.name)
    }

    /// `prog` (a farvm binary) in namespace `short`; `ip netns exec` execs it, so the child's
    /// PID is the program's.
    pub fn exec(&self, short: &str, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(short)])
            .arg(self.cfg.bin.join(prog))
            .stdin(Stdio::null());
        c
    }

    /// `farvm-pool --etcd ETCD ARGS` from etcd's namespace (never partitioned).
    pub fn pool(&self, args: &[&str]) -> Command {
        let mut c = self.exec("etcd", "farvm-pool");
        c.args(["--etcd", ETCD]).args(args);
        c
    }

    /// The pool's status, or None while etcd does not answer.
    pub fn status(&self) -> Option<PoolStatus> {
        let o = self.pool(&["status", "--json"]).output().ok()?;
        o.status
            .success()
            .then(|| serde_json::from_slice(&o.stdout).ok())
            .flatten()
    }

    /// Polls `ok` every 250 ms until it holds or `bound` passes.
    pub fn wait(&self, bound: Duration, mut ok: impl FnMut() -> bool) -> Result<()> {
        let deadline = Instant::now() + bound;
        loop {
            if ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("timed out after {} s", bound.as_secs());
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The PID `cluster.sh` recorded last for `label` (`etcd`, `r1-ms2`), if any.
    pub fn pid(&self, label: &str) -> Option<i32> {
        let state = std::fs::read_to_string(self.run.join(&self.name).join("state")).ok()?;
        state.lines().rev().find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some("pid")).then_some(())?;
            let pid = f.next()?.parse().ok()?;
            (f.next() == Some(label)).then_some(pid)
        })
    }

    /// The namespaces of rack `k`: its memory servers and its VM hosts.
    pub fn rack_namespaces(&self, k: u32) -> Vec<String> {
        let servers = (1..=self.cfg.servers_per_rack).map(|i| format!("r{k}-ms{i}"));
        let hosts = (1..=self.cfg.hosts)
            .filter(|n| (n - 1) % self.cfg.racks + 1 == k)
            .map(|n| format!("host{n}"));
        servers.chain(hosts).map(|s| self.ns(&s)).collect()
    }

    /// Sets eth0 of namespace `ns` (full name) up or down.
    pub fn link(&self, ns: &str, up: bool) -> Result<()> {
        let o = Command::new("ip")
            .args([
                "-n",
                ns,
                "link",
                "set",
                "eth0",
                if up { "up" } else { "down" },
            ])
            .output()?;
        ensure!(o.status.success(), "ip -n {ns} link set eth0: {}", text(&o));
        Ok(())
    }

    /// Pages memory server `rK-msI` says it stores (`farvm_memserver_pages_stored`), read
    /// from its metrics endpoint inside its namespace.
    pub fn pages_stored(&self, rack: u32, index: u32) -> Result<u64> {
        let addr: SocketAddr = format!("10.77.{rack}.1{index}:{METRICS_PORT}").parse()?;
        let body = http_get_in(&self.ns(&format!("r{rack}-ms{index}")), addr, "/metrics")?;
        body.lines()
            .find_map(|l| {
                l.strip_prefix("farvm_memserver_pages_stored ")
                    .and_then(|v| v.trim().parse().ok())
            })
            .with_context(|| {
                format!("no farvm_memserver_pages_stored in r{rack}-ms{index}'s metrics")
            })
    }

    /// Pages stored by every memory server that answers.
    pub fn pages_stored_total(&self) -> u64 {
        (1..=self.cfg.racks)
            .flat_map(|k| (1..=self.cfg.servers_per_rack).map(move |i| (k, i)))
            .filter_map(|(k, i)| self.pages_stored(k, i).ok())
            .sum()
    }

    fn keep_logs(&self) {
        let from = self.run.join(&self.name);
        let Ok(entries) = std::fs::read_dir(&from) else {
            return;
        };
        let _ = std::fs::create_dir_all(&self.keep);
        for e in entries.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "log") {
                let _ = std::fs::copy(&p, self.keep.join(e.file_name()));
            }
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // `down` deletes the script's run directory, the servers' and etcd's logs with it.
        self.keep_logs();
        if !self.run.join(&self.name).join("state").exists() {
            return; // `up` failed and removed what it had made
        }
        match self.script_cmd("down").output() {
            Ok(o) if !o.status.success() => {
                eprintln!("farvm-lab nemesis: cluster.sh down: {}", text(&o))
            }
            Err(e) => eprintln!("farvm-lab nemesis: cluster.sh down: {e}"),
            Ok(_) => {}
        }
    }
}

/// `GET path` from `addr` as seen from network namespace `ns`: on a thread of its own, which
/// alone enters the namespace (setns changes the calling thread's only) and ends with it.
fn http_get_in(ns: &str, addr: SocketAddr, path: &str) -> Result<String> {
    let file = std::fs::File::open(format!("/run/netns/{ns}"))
        .with_context(|| format!("opening network namespace {ns}"))?;
    // HTTP/1.0: the answer's body is delimited by the connection's close, never chunked.
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let t = std::thread::spawn(move || -> std::io::Result<String> {
        // SAFETY: setns(2) with a namespace fd that `file` keeps open for the call; it changes
        // only this thread's network namespace, and the thread ends right after.
        if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let timeout = Duration::from_secs(3);
        let mut s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_read_timeout(Some(timeout))?;
        s.write_all(request.as_bytes())?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    });
    let out = t
        .join()
        .map_err(|_| anyhow::anyhow!("the metrics reader thread panicked"))?
        .with_context(|| format!("GET http://{addr}{path} in {ns}"))?;
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    ensure!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "GET http://{addr}{path}: {}",
        head.lines().next().unwrap_or("no answer")
    );
    Ok(body.to_string())
}

/// Every server the status lists, rack by rack.
pub fn servers(s: &PoolStatus) -> impl Iterator<Item = &ServerStatus> {
    s.racks.iter().flat_map(|r| &r.servers)
}
