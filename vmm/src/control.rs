//! The per-VM control socket: a Unix stream socket taking one JSON request per line
//! (`{"cmd":"status"}`, `{"cmd":"stats"}`, `{"cmd":"processes"}` (per-process paging
//! statistics), `{"cmd":"vcpus"}` (each vCPU's MP state, registers, pending events and local
//! APIC, for a guest that seems stuck), `{"cmd":"shutdown"}`, `{"cmd":"rotate-key"}` (a new
//! page key, the stored pages re-sealed under it in the background, docs/sealing.md),
//! `{"cmd":"history global"}` / `{"cmd":"history
//! per-process"}` (one prefetch history for the guest, or one per guest process, from the next
//! fault on; `history` alone says which), `{"cmd":"snapshot /DIR"}` (save the VM into the
//! snapshot directory DIR, an absolute path, and stop it: [`crate::snapshot`]; `snapshot /DIR
//! --key-file /KEYFILE` seals it under the snapshot key in KEYFILE),
//! `{"cmd":"migrate HOST:PORT /KEYFILE [DOWNTIME_MS]"}` (live-migrate the VM to the farvm waiting at
//! HOST:PORT, the stream sealed with the key in KEYFILE: [`crate::migration`]); a bare word
//! works too) and answering one JSON line (`{"ok":true,"result":...}` or `{"ok":false,"error":"..."}`).
//!
//! Default path: `$XDG_RUNTIME_DIR/farvm/NAME.sock`, else `/run/farvm/NAME.sock`.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::{json, Value};

use crate::spec::VmSpec;
use crate::vm::{VmOutcome, VmShared};
use crate::workload_spec::workload_name;

/// Errors of the control socket.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The socket could not be created, connected to, read or written.
    #[error("control socket {path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Another live VM owns the socket path.
    #[error("a VM named `{0}` is already running (its control socket answers)")]
    InUse(String),
    /// The VM's reply did not parse.
    #[error("bad reply from {path}: {msg}")]
    BadReply {
        /// The socket path.
        path: PathBuf,
        /// What is wrong with the reply.
        msg: String,
    },
    /// The VM refused the request (its reason).
    #[error("{0}")]
    Refused(String),
}

/// The directory holding control sockets.
pub fn socket_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("farvm"),
        _ => PathBuf::from("/run/farvm"),
    }
}

/// The default control-socket path of VM `name`.
pub fn default_socket_path(name: &str) -> PathBuf {
    socket_dir().join(format!("{name}.sock"))
}

/// A running control-socket server; stops and removes the socket on drop.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Binds `path` (creating its directory) and serves `vm` from a thread named `control`;
    /// `spec`, the description `vm` was made from, is what a snapshot saves (without it the
    /// `snapshot` command is refused).
    pub fn start(
        path: &Path,
        vm: Arc<VmShared>,
        spec: Option<VmSpec>,
    ) -> Result<Self, ControlError> {
        let ioerr = |source| ControlError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(ioerr)?;
        }
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(ControlError::InUse(vm.name.clone()));
            }
            // A stale socket of a VMM that died: replace it.
            std::fs::remove_file(path).map_err(ioerr)?;
        }
        let listener = UnixListener::bind(path).map_err(ioerr)?;
        listener.set_nonblocking(true).map_err(ioerr)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || serve(listener, vm, spec, stop2))
            .map_err(ioerr)?;
        Ok(ControlServer {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }

    /// Where the socket is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(listener: UnixListener, vm: Arc<VmShared>, spec: Option<VmSpec>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                // One client at a time is plenty for status/stats; a slow client cannot wedge
                // the server for long thanks to the timeouts.
                if let Err(e) = handle_client(stream, &vm, spec.as_ref()) {
                    tracing::debug!("control client: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                tracing::warn!("control socket accept failed: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

fn handle_client(stream: UnixStream, vm: &VmShared, spec: Option<&VmSpec>) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut w = stream;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        if line.trim().is_empty() {
            continue;
        }
        let reply = match parse_request(&line) {
            Ok(cmd) => match answer(&cmd, vm, spec) {
                Ok(v) => json!({"ok": true, "result": v}),
                Err(e) => json!({"ok": false, "error": e}),
            },
            Err(e) => json!({"ok": false, "error": e}),
        };
        writeln!(w, "{reply}")?;
    }
}

fn parse_request(line: &str) -> Result<String, String> {
    let t = line.trim();
    if t.starts_with('{') {
        let v: Value = serde_json::from_str(t).map_err(|e| format!("malformed JSON: {e}"))?;
        v.get("cmd")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| "request has no string field \"cmd\"".to_string())
    } else {
        Ok(t.to_string())
    }
}

fn answer(cmd: &str, vm: &VmShared, spec: Option<&VmSpec>) -> Result<Value, String> {
    if let Some(args) = cmd.strip_prefix("migrate ") {
        return migrate(args, vm, spec);
    }
    if let Some(args) = cmd.strip_prefix("snapshot ") {
        // `snapshot /DIR` or `snapshot /DIR --key-file /KEYFILE` (a sealed snapshot).
        let (dir, key) = match args.rsplit_once(" --key-file ") {
            Some((dir, key)) => (dir, Some(key.trim())),
            None => (args, None),
        };
        let key = match key.map(Path::new) {
            Some(k) if !k.is_absolute() => {
                return Err(format!(
                    "snapshot: the key file `{}` is not an absolute path (the VMM's working \
                     directory is not the client's)",
                    k.display()
                ))
            }
            Some(k) => Some(
                farvm_seal::PageKey::from_file(k)
                    .map_err(|e| crate::snapshot::SnapshotError::Key(e.to_string()).to_string())?,
            ),
            None => None,
        };
        let dir = Path::new(dir.trim());
        if !dir.is_absolute() {
            return Err(format!(
                "snapshot: `{}` is not an absolute path (the VMM's working directory is not \
                 the client's)",
                dir.display()
            ));
        }
        let spec = spec.ok_or_else(|| crate::snapshot::SnapshotError::NoDescription.to_string())?;
        return crate::snapshot::save(vm, spec, dir, key.as_ref())
            .map(|s| serde_json::to_value(s).unwrap_or(Value::Null))
            .map_err(|e| e.to_string());
    }
    match cmd {
        "status" => Ok(status(vm)),
        "stats" => Ok(stats(vm)),
        "processes" => vm
            .per_process()
            .map(|p| serde_json::to_value(p).unwrap_or(Value::Null))
            .ok_or_else(|| {
                "no per-process paging statistics: the VM's memory is not remote (or its \
                 paging engine has stopped)"
                    .to_string()
            }),
        "vcpus" => Ok(json!({
            "vcpus": vm.dump_vcpus(Duration::from_secs(2)),
        })),
        "shutdown" => {
            vm.request_stop(VmOutcome::ControlShutdown);
            Ok(json!({"stopping": true}))
        }
        "rotate-key" => vm
            .rotate_key()
            .map(|r| serde_json::to_value(r).unwrap_or(Value::Null)),
        "history" | "history global" | "history per-process" => {
            let engine = vm.paging_engine().ok_or_else(|| {
                "no prefetch history: the VM's memory is not remote (or its paging engine has \
                 stopped)"
                    .to_string()
            })?;
            match cmd {
                "history global" => engine.set_global_history(true),
                "history per-process" => engine.set_global_history(false),
                _ => {}
            }
            let now = if engine.global_history() {
                "global"
            } else {
                "per-process"
            };
            Ok(json!({ "history": now }))
        }
        other => Err(format!(
            "unknown command `{other}` (known: status, stats, processes, vcpus, shutdown, \
             rotate-key, history, history global, history per-process, snapshot DIR \
             [--key-file KEYFILE], migrate HOST:PORT KEYFILE)"
        )),
    }
}

/// The `status` reply.
pub fn status(vm: &VmShared) -> Value {
    let tids = vm.vcpu_tids();
    let vcpus: Vec<Value> = (0..vm.ncpus)
        .map(|c| {
            let slot = vm.pv.read_agent_slot(c);
            json!({
                "index": c,
                "thread": format!("vcpu{c}"),
                "tid": tids.get(c as usize).copied().unwrap_or(0),
                "agent_slot_gpa": vm.pv.agent_slot_gpa(c),
                "current_pid": slot.map(|s| s.pid),
                "cr3": slot.map(|s| s.cr3),
                "context_switches": slot.map(|s| s.switches),
                "done": vm.pv.cpu_done(c),
            })
        })
        .collect();
    json!({
        "name": vm.name,
        "uuid": vm.uuid,
        "state": match vm.outcome() { None => vm.state().to_string(), Some(o) => format!("stopping: {o}") },
        "uptime_secs": vm.started.elapsed().as_secs_f64(),
        "vcpus": vm.ncpus,
        "memory_bytes": vm.ram.total_bytes(),
        "memory_backing": format!("{:?}", vm.ram.backing()),
        "regions": vm.ram.regions().iter().map(|r| json!({"gpa": r.gpa(), "len": r.len()})).collect::<Vec<_>>(),
        "vcpu": vcpus,
    })
}

/// The `stats` reply.
pub fn stats(vm: &VmShared) -> Value {
    let counters = vm.counters();
    let procs: Vec<Value> = vm
        .pv
        .processes()
        .into_iter()
        .map(|p| {
            let mut v = serde_json::to_value(&p).unwrap_or(Value::Null);
            if let Some(o) = v.as_object_mut() {
                o.insert("name".into(), json!(workload_name(p.workload)));
            }
            v
        })
        .collect();
    let vcpus: Vec<Value> = (0..vm.ncpus)
        .map(|c| {
            let slot = vm.pv.read_agent_slot(c);
            json!({
                "index": c,
                "current_pid": slot.map(|s| s.pid),
                "context_switches": slot.map(|s| s.switches),
                "done": vm.pv.cpu_done(c),
            })
        })
        .collect();
    json!({
        "name": vm.name,
        "uptime_secs": counters.uptime_secs,
        "vcpu": vcpus,
        "exits": counters.exits,
        "exits_total": counters.exits_total,
        "pv": counters.pv,
        "processes": procs,
        "kvm": vm.kvm_stats().into_iter().map(|s| s.map(|v| v.into_iter().map(|(k, n)| (k, Value::from(n))).collect::<serde_json::Map<String, Value>>())).collect::<Vec<_>>(),
        "paging": counters.paging,
    })
}

/// Sends one request to a control socket and returns the `result` (or the server's error).
pub fn request(path: &Path, cmd: &str) -> Result<Value, ControlError> {
    request_within(path, cmd, Duration::from_secs(10))
}

/// [`request`], waiting up to `timeout` for the reply (a snapshot takes as long as copying
/// guest RAM).
pub fn request_within(path: &Path, cmd: &str, timeout: Duration) -> Result<Value, ControlError> {
    let ioerr = |source| ControlError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut s = UnixStream::connect(path).map_err(ioerr)?;
    s.set_read_timeout(Some(timeout)).map_err(ioerr)?;
    writeln!(s, "{}", json!({"cmd": cmd})).map_err(ioerr)?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).map_err(ioerr)?;
    let v: Value = serde_json::from_str(line.trim()).map_err(|e| ControlError::BadReply {
        path: path.to_path_buf(),
        msg: e.to_string(),
    })?;
    if v.get("ok").and_then(Value::as_bool) == Some(true) {
        Ok(v.get("result").cloned().unwrap_or(Value::Null))
    } else {
        Err(ControlError::Refused(
            v.get("error")
                .and_then(Value::as_str)
                .unwrap_or("unknown error")
                .to_string(),
        ))
    }
}

/// `migrate HOST:PORT /KEYFILE [DOWNTIME_MS]`: live-migrates the VM (it stops here once it
/// runs there), the pre-copy aiming for a pause of DOWNTIME_MS on this side (default
/// [`crate::migration::DEFAULT_DOWNTIME_LIMIT`]).
fn migrate(args: &str, vm: &VmShared, spec: Option<&VmSpec>) -> Result<Value, String> {
    let mut words = args.split_whitespace();
    let (Some(to), Some(key), limit, None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err("migrate: expected `migrate HOST:PORT /KEYFILE [DOWNTIME_MS]`".into());
    };
    let limit = match limit {
        None => crate::migration::DEFAULT_DOWNTIME_LIMIT,
        Some(ms) => ms
            .parse::<u64>()
            .map(std::time::Duration::from_millis)
            .map_err(|_| {
                format!("migrate: the downtime limit `{ms}` is not a whole number of milliseconds")
            })?,
    };
    let key = Path::new(key);
    if !key.is_absolute() {
        return Err(format!(
            "migrate: the key file `{}` is not an absolute path (the VMM's working directory \
             is not the client's)",
            key.display()
        ));
    }
    let key = farvm_seal::PageKey::from_file(key).map_err(|e| format!("migration key: {e}"))?;
    let spec = spec.ok_or_else(|| crate::snapshot::SnapshotError::NoDescription.to_string())?;
    crate::migration::migrate(vm, spec, to, &key, limit)
        .map(|m| serde_json::to_value(m).unwrap_or(Value::Null))
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse() {
        assert_eq!(parse_request("status\n").unwrap(), "status");
        assert_eq!(parse_request(r#"{"cmd":"stats"}"#).unwrap(), "stats");
        assert!(parse_request("{not json")
            .unwrap_err()
            .contains("malformed JSON"));
        assert!(parse_request(r#"{"cmd":5}"#)
            .unwrap_err()
            .contains("\"cmd\""));
    }

    #[test]
    fn default_path_uses_runtime_dir() {
        let p = default_socket_path("vm1");
        assert!(p.ends_with("farvm/vm1.sock"), "{}", p.display());
    }
}
