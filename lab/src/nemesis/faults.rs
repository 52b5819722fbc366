//! The fault actions: each drawn fault runs on a thread of its own, starts at its time, holds
//! its target (one fault at a time per etcd, rack, server or VM, so a fault's undo is never
//! undone by another's), and undoes itself after its duration; then [`Nemesis::heal`] makes
//! sure everything is back (links up, processes continued, etcd running, drain marks off) and
//! waits for the drain and rebalance commands it started. Every action is logged with its
//! time in the schedule's `events.log`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Child;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::cluster::Cluster;
use super::schedule::{Fault, Kind, Schedule, Target};
use super::vms::VmFlags;

/// How long a drain or rebalance command may wait for its moves (`--timeout`).
const COMMAND_TIMEOUT_S: u64 = 15;
/// A drain or rebalance still running this long after the faults ended has hung.
const COMMAND_BOUND: Duration = Duration::from_secs(COMMAND_TIMEOUT_S + 45);

/// What the faults changed that healing must undo or the checks must know.
#[derive(Default)]
struct State {
    /// Servers killed for good (`rK-msI`).
    dead: BTreeSet<String>,
    /// The pool id each server runs under (`rK-msI`, or a new one after restart-empty).
    ids: BTreeMap<String, String>,
    /// Restart-empty generations drawn so far.
    generation: u32,
    /// Pool ids with a drain mark.
    drained: BTreeSet<String>,
    /// Processes stopped with SIGSTOP.
    paused: BTreeSet<i32>,
    /// Namespaces whose link is down.
    down: BTreeSet<String>,
    /// Drain and rebalance commands (what, the process); their output goes to the schedule's
    /// folder.
    commands: Vec<(String, Child)>,
    events: Vec<String>,
}

pub struct Nemesis<'c> {
    cluster: &'c Cluster,
    vms: Vec<Arc<VmFlags>>,
    locks: BTreeMap<String, Mutex<()>>,
    state: Mutex<State>,
    t0: Instant,
    logs: std::path::PathBuf,
}

/// What the faults left for the checks.
pub struct Aftermath {
    /// Each running server's label (`rK-msI`) and pool id.
    pub servers: Vec<(String, String)>,
    /// Commands that did not end within their bound (killed).
    pub hung: Vec<String>,
    pub events: Vec<String>,
}

/// Spawning with stdout and stderr into one log file.
trait SpawnLogged {
    fn spawn_logged(&mut self, log: &std::fs::File) -> Result<Child>;
}

impl SpawnLogged for std::process::Command {
    fn spawn_logged(&mut self, log: &std::fs::File) -> Result<Child> {
        Ok(self
            .stdout(log.try_clone()?)
            .stderr(log.try_clone()?)
            .spawn()?)
    }
}

fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) on a PID the cluster or the nemesis started and has not reaped; no memory
    // is involved.
    unsafe { libc::kill(pid, sig) == 0 }
}

impl<'c> Nemesis<'c> {
    pub fn new(cluster: &'c Cluster, vms: Vec<Arc<VmFlags>>, logs: &std::path::Path) -> Self {
        let mut targets = vec!["etcd".to_string(), "pool".to_string()];
        let mut ids = BTreeMap::new();
        for k in 1..=cluster.cfg.racks {
            targets.push(format!("r{k}"));
            for i in 1..=cluster.cfg.servers_per_rack {
                let s = format!("r{k}-ms{i}");
                ids.insert(s.clone(), s.clone());
                targets.push(s);
            }
        }
        targets.extend((0..vms.len()).map(|i| format!("vm{i}")));
        Self {
            cluster,
            vms,
            locks: targets.into_iter().map(|t| (t, Mutex::new(()))).collect(),
            state: Mutex::new(State {
                ids,
                ..State::default()
            }),
            t0: Instant::now(),
            logs: logs.to_path_buf(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn event(&self, f: &Fault, what: impl std::fmt::Display) {
        let line = format!(
            "t+{:>6.2}s  {} {}: {what}",
            self.t0.elapsed().as_secs_f64(),
            f.kind.name(),
            f.target
        );
        eprintln!("farvm-lab nemesis:   {line}");
        self.state().events.push(line);
    }

    /// Runs every fault of `s` at its time (from now) and returns when all have undone
    /// themselves.
    pub fn run(&mut self, s: &Schedule) {
        self.t0 = Instant::now();
        let this = &*self;
        std::thread::scope(|scope| {
            for f in &s.faults {
                scope.spawn(move || {
                    std::thread::sleep(f.at.saturating_sub(this.t0.elapsed()));
                    let lock = &this.locks[&f.target.to_string()];
                    let _held = lock.lock().unwrap_or_else(|e| e.into_inner());
                    if let Err(e) = this.apply(f) {
                        this.event(f, format_args!("failed: {e:#}"));
                    }
                });
            }
        });
    }

    fn apply(&self, f: &Fault) -> Result<()> {
        let c = self.cluster;
        match (&f.target, f.kind) {
            (Target::Etcd, Kind::EtcdPause) => {
                let Some(pid) = c.pid("etcd") else {
                    self.event(f, "skipped: etcd is not running");
                    return Ok(());
                };
                self.pause(f, pid)
            }
            (Target::Etcd, Kind::EtcdRestart) => {
                c.script("etcd-stop", None, &[])?;
                self.event(f, "etcd stopped");
                std::thread::sleep(f.lasts);
                c.script("etcd-start", None, &[])?;
                self.event(f, "etcd started");
                Ok(())
            }
            (Target::Rack(k), Kind::Partition) => {
                let nss = c.rack_namespaces(*k);
                for ns in &nss {
                    c.link(ns, false)?;
                    self.state().down.insert(ns.clone());
                }
                self.event(f, format_args!("links down: {}", nss.join(" ")));
                std::thread::sleep(f.lasts);
                for ns in &nss {
                    c.link(ns, true)?;
                    self.state().down.remove(ns);
                }
                self.event(f, "links up");
                Ok(())
            }
            (Target::Server { .. }, kind) => self.server(f, kind),
            (Target::Vm(i), kind) => self.vmm(f, *i, kind),
            (Target::Pool, Kind::Rebalance) => {
                let child = c
                    .pool(&["rebalance", "--timeout", &COMMAND_TIMEOUT_S.to_string()])
                    .spawn_logged(&self.log_file("rebalance")?)?;
                self.event(
                    f,
                    format_args!("farvm-pool rebalance started (pid {})", child.id()),
                );
                self.state().commands.push(("rebalance".into(), child));
                Ok(())
            }
            (t, k) => anyhow::bail!("no action for {} on {t}", k.name()),
        }
    }

    /// A new file NAME-MS.log in the schedule's folder (MS: milliseconds since the start).
    fn log_file(&self, name: &str) -> Result<std::fs::File> {
        let p = self
            .logs
            .join(format!("{name}-{}.log", self.t0.elapsed().as_millis()));
        Ok(std::fs::File::create(p)?)
    }

    fn pause(&self, f: &Fault, pid: i32) -> Result<()> {
        if !signal(pid, libc::SIGSTOP) {
            self.event(f, format_args!("skipped: pid {pid} is gone"));
            return Ok(());
        }
        self.state().paused.insert(pid);
        self.event(f, format_args!("SIGSTOP pid {pid}"));
        std::thread::sleep(f.lasts);
        signal(pid, libc::SIGCONT);
        self.state().paused.remove(&pid);
        self.event(f, format_args!("SIGCONT pid {pid}"));
        Ok(())
    }

    fn server(&self, f: &Fault, kind: Kind) -> Result<()> {
        let c = self.cluster;
        let label = f.target.to_string();
        if self.state().dead.contains(&label) {
            self.event(f, "skipped: killed for good earlier");
            return Ok(());
        }
        match kind {
            Kind::ServerPause => {
                let Some(pid) = c.pid(&label) else {
                    anyhow::bail!("no PID recorded for {label}");
                };
                self.pause(f, pid)
            }
            Kind::ServerKill => {
                c.script("server-stop", Some(&label), &[])?;
                self.state().dead.insert(label.clone());
                self.event(f, "SIGKILL, for good");
                Ok(())
            }
            Kind::ServerRestartEmpty | Kind::ServerRestartSameId => {
                c.script("server-stop", Some(&label), &[])?;
                self.event(f, "SIGKILL");
                let id = if kind == Kind::ServerRestartEmpty {
                    let mut st = self.state();
                    st.generation += 1;
                    format!("{label}-g{}", st.generation)
                } else {
                    self.state().ids[&label].clone()
                };
                c.script("server-start", Some(&label), &["--pool-id", &id])?;
                self.state().ids.insert(label, id.clone());
                self.event(f, format_args!("started again, empty, as {id}"));
                Ok(())
            }
            Kind::Drain => {
                let id = self.state().ids[&label].clone();
                let child = c
                    .pool(&["drain", &id, "--timeout", &COMMAND_TIMEOUT_S.to_string()])
                    .spawn_logged(&self.log_file(&format!("drain-{id}"))?)?;
                self.event(
                    f,
                    format_args!("farvm-pool drain {id} started (pid {})", child.id()),
                );
                let mut st = self.state();
                st.drained.insert(id.clone());
                st.commands.push((format!("drain {id}"), child));
                Ok(())
            }
            k => anyhow::bail!("no action for {} on a server", k.name()),
        }
    }

    fn vmm(&self, f: &Fault, i: usize, kind: Kind) -> Result<()> {
        let vm = &self.vms[i];
        if vm.exited.load(Ordering::SeqCst) {
            self.event(f, "skipped: the VM has exited");
            return Ok(());
        }
        let pid = vm.pid as i32;
        match kind {
            Kind::VmmPause => self.pause(f, pid),
            Kind::VmmKill => {
                vm.killed_by_nemesis.store(true, Ordering::SeqCst);
                signal(pid, libc::SIGKILL);
                self.event(f, format_args!("SIGKILL pid {pid}"));
                Ok(())
            }
            k => anyhow::bail!("no action for {} on a VM", k.name()),
        }
    }

    /// Undoes whatever is still in effect, waits for the commands the faults started (killing
    /// those past their bound), and hands over what the checks need.
    pub fn heal(self) -> Aftermath {
        let c = self.cluster;
        let mut st = self.state.into_inner().unwrap_or_else(|e| e.into_inner());
        let mut lines = Vec::new();
        for pid in std::mem::take(&mut st.paused) {
            signal(pid, libc::SIGCONT);
            lines.push(format!("SIGCONT pid {pid}"));
        }
        for ns in std::mem::take(&mut st.down) {
            if let Err(e) = c.link(&ns, true) {
                lines.push(format!("link of {ns}: {e:#}"));
            }
        }
        if c.pid("etcd").is_none() {
            match c.script("etcd-start", None, &[]) {
                Ok(_) => lines.push("etcd started".into()),
                Err(e) => lines.push(format!("{e:#}")),
            }
        }
        let deadline = Instant::now() + COMMAND_BOUND;
        let mut hung = Vec::new();
        for (what, mut child) in std::mem::take(&mut st.commands) {
            let mut ended = None;
            while ended.is_none() && Instant::now() < deadline {
                ended = child.try_wait().ok().flatten();
                if ended.is_none() {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            match ended {
                Some(s) => lines.push(format!("farvm-pool {what} ended: {s}")),
                None => {
                    let _ = child.kill();
                    let _ = child.wait();
                    hung.push(format!("farvm-pool {what}"));
                    lines.push(format!("farvm-pool {what} HUNG: killed"));
                }
            }
        }
        // The drain marks of servers still running come off once etcd answers again, and only
        // after the commands ended: a drain still starting would set its mark after the undo.
        let live: BTreeSet<String> = st
            .ids
            .iter()
            .filter(|(label, _)| !st.dead.contains(*label))
            .map(|(_, id)| id.clone())
            .collect();
        for id in std::mem::take(&mut st.drained)
            .into_iter()
            .filter(|id| live.contains(id))
        {
            let undone = c
                .wait(Duration::from_secs(30), || {
                    c.pool(&["drain", "--undo", &id])
                        .output()
                        .is_ok_and(|o| o.status.success())
                })
                .is_ok();
            lines.push(format!(
                "drain mark of {id} {}",
                if undone {
                    "taken off"
                } else {
                    "NOT taken off (etcd?)"
                }
            ));
        }
        for l in lines {
            eprintln!("farvm-lab nemesis:   heal: {l}");
            st.events.push(format!("heal: {l}"));
        }
        let servers = st
            .ids
            .iter()
            .filter(|(label, _)| !st.dead.contains(*label))
            .map(|(l, id)| (l.clone(), id.clone()))
            .collect();
        Aftermath {
            servers,
            hung,
            events: st.events,
        }
    }
}
