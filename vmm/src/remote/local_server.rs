//! The memory server `farvm run` starts when it is given none: the `farvm-memserver` binary
//! as a child process on `127.0.0.1:0` (the VMM links no server code).
//!
//! The binary is the one next to the running executable (or, for a test binary under
//! `target/*/deps/`, one directory up), unless `FARVM_MEMSERVER_BIN` names another. The child
//! prints its bound address as its first line (`listening ADDR`); it is killed with SIGKILL
//! if the thread that started it ends — which is when the [`LocalServer`] is dropped or the
//! VMM process dies, since a dedicated thread starts and reaps it (`PR_SET_PDEATHSIG` fires
//! when the *thread* that forked exits).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

/// Environment variable naming the `farvm-memserver` binary to start.
pub const BIN_ENV: &str = "FARVM_MEMSERVER_BIN";
const BIN_NAME: &str = "farvm-memserver";
/// How long the child may take to report its address.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Starting the local memory server failed.
#[derive(Debug, thiserror::Error)]
pub enum LocalServerError {
    /// No `farvm-memserver` binary where it was looked for.
    #[error(
        "the memory server binary {path} does not exist (build it with `cargo build --release \
         -p farvm-memserver`, install it next to farvm, or name it with {BIN_ENV})"
    )]
    Missing {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// `/proc/self/exe` could not be read (the binary is looked for next to it).
    #[error("cannot locate the running executable: {0}")]
    Exe(std::io::Error),
    /// The child process could not be started.
    #[error("cannot start {path}: {source}")]
    Spawn {
        /// The binary.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The child did not print its `listening ADDR` line in time (or exited).
    #[error("{path} did not report its address: {why}")]
    NotReady {
        /// The binary.
        path: PathBuf,
        /// What happened instead.
        why: String,
    },
}

/// The `farvm-memserver` binary to start: `FARVM_MEMSERVER_BIN`, else the one next to the
/// running executable (or one directory up from a `deps/` directory, where test binaries
/// live).
pub fn binary() -> Result<PathBuf, LocalServerError> {
    let exe = std::env::current_exe().map_err(LocalServerError::Exe)?;
    locate(std::env::var_os(BIN_ENV).map(PathBuf::from), &exe)
}

/// [`binary`] for a given `FARVM_MEMSERVER_BIN` value and running executable.
fn locate(named: Option<PathBuf>, exe: &Path) -> Result<PathBuf, LocalServerError> {
    if let Some(path) = named {
        return if path.is_file() {
            Ok(path)
        } else {
            Err(LocalServerError::Missing { path })
        };
    }
    let dir = exe.parent().unwrap_or(Path::new("."));
    let beside = dir.join(BIN_NAME);
    if beside.is_file() {
        return Ok(beside);
    }
    if dir.file_name().is_some_and(|n| n == "deps") {
        if let Some(up) = dir.parent().map(|d| d.join(BIN_NAME)) {
            if up.is_file() {
                return Ok(up);
            }
        }
    }
    Err(LocalServerError::Missing { path: beside })
}

/// A running child memory server (see the module docs). Dropping it kills and reaps it.
pub struct LocalServer {
    addr: SocketAddr,
    pid: u32,
    stop: Option<Sender<()>>,
    keeper: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LocalServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalServer")
            .field("addr", &self.addr)
            .field("pid", &self.pid)
            .finish()
    }
}

/// What the keeper thread reports while starting the child.
enum Started {
    Pid(u32),
    Ready(SocketAddr),
    Failed(LocalServerError),
}

impl LocalServer {
    /// Starts `farvm-memserver` on `127.0.0.1:0` with `capacity_bytes` of arena, its
    /// connection threads pinned to `connection_cpu` if given, and waits for its address.
    pub fn start(
        capacity_bytes: u64,
        connection_cpu: Option<usize>,
    ) -> Result<Self, LocalServerError> {
        let path = binary()?;
        let mut cmd = Command::new(&path);
        cmd.args(["--listen", "127.0.0.1:0", "--capacity"])
            .arg(capacity_bytes.to_string())
            // The server filters itself as this VMM does (it inherits the VMM's process
            // filter across exec either way).
            .args(["--seccomp", farvm_sandbox::mode().as_str()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(cpu) = connection_cpu {
            cmd.arg("--connection-cpu").arg(cpu.to_string());
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "error");
        }
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec and calls only
        // async-signal-safe functions (prctl, getppid, _exit).
        unsafe {
            cmd.pre_exec(move || {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                // The parent may have died before the line above: then nobody would kill us.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let (started_tx, started_rx) = crossbeam_channel::bounded(2);
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(1);
        let keeper = std::thread::Builder::new()
            .name("memserver-child".into())
            .spawn({
                let path = path.clone();
                move || keep(cmd, path, started_tx, stop_rx)
            })
            .map_err(|source| LocalServerError::Spawn {
                path: path.clone(),
                source,
            })?;
        let mut server = Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            pid: 0,
            stop: Some(stop_tx),
            keeper: Some(keeper),
        };
        let deadline = std::time::Instant::now() + READY_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match started_rx.recv_timeout(left) {
                Ok(Started::Pid(pid)) => server.pid = pid,
                Ok(Started::Ready(addr)) => {
                    server.addr = addr;
                    tracing::debug!(%addr, pid = server.pid, "local memserver started");
                    return Ok(server);
                }
                Ok(Started::Failed(e)) => return Err(e),
                Err(_) => {
                    // The keeper waits for its first line: kill the child so it sees the end.
                    if server.pid != 0 {
                        // SAFETY: kill(2) on our own child, not reaped yet (its keeper
                        // reaps it); no memory is involved.
                        unsafe { libc::kill(server.pid as libc::pid_t, libc::SIGKILL) };
                    }
                    return Err(LocalServerError::NotReady {
                        path,
                        why: format!("nothing within {READY_TIMEOUT:?}"),
                    });
                }
            }
        }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Kernel thread ids of the server's connection threads (named `memserver-conn-N`).
    pub fn connection_thread_ids(&self) -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else {
            return Vec::new();
        };
        let mut tids: Vec<i32> = dir
            .flatten()
            .filter(|t| {
                std::fs::read_to_string(t.path().join("comm"))
                    .is_ok_and(|c| c.starts_with("memserver-conn"))
            })
            .filter_map(|t| t.file_name().to_str()?.parse().ok())
            .collect();
        tids.sort_unstable();
        tids
    }

    /// Kills the server and reaps it.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        drop(self.stop.take());
        if let Some(k) = self.keeper.take() {
            let _ = k.join();
        }
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// The keeper thread: starts the child, reports its pid and address, then waits until told to
/// stop (or the handle is dropped) and kills and reaps it. Its life bounds the child's.
fn keep(mut cmd: Command, path: PathBuf, started: Sender<Started>, stop: Receiver<()>) {
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(source) => {
            let _ = started.send(Started::Failed(LocalServerError::Spawn { path, source }));
            return;
        }
    };
    let _ = started.send(Started::Pid(child.id()));
    // Keep the pipe open: a later line (`metrics ...`) must not fail the child's write.
    let mut out = child.stdout.take().map(BufReader::new);
    let mut line = String::new();
    let read = out.as_mut().map(|o| o.read_line(&mut line));
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .and_then(|a| a.parse::<SocketAddr>().ok());
    match addr {
        Some(addr) => {
            let _ = started.send(Started::Ready(addr));
            // Until the handle says stop (a message or its end).
            let _ = stop.recv();
        }
        None => {
            // It is probably exiting: give it a moment so the message can say how.
            let mut status = None;
            for _ in 0..100 {
                status = child.try_wait().ok().flatten();
                if status.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let why = match (read, status) {
                (Some(Err(e)), _) => format!("reading its output: {e}"),
                (_, Some(st)) => format!("it exited ({st}) before listening"),
                _ if line.is_empty() => "it closed its output".into(),
                _ => format!("unexpected first line {:?}", line.trim()),
            };
            let _ = started.send(Started::Failed(LocalServerError::NotReady { path, why }));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    drop(out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_binary_is_found_beside_the_executable_or_above_deps() {
        let dir = std::env::temp_dir().join(format!("farvm-locate-{}", std::process::id()));
        let deps = dir.join("deps");
        std::fs::create_dir_all(&deps).unwrap();
        let exe = deps.join("some-test");
        // Nothing there: the error names where it looked.
        let e = locate(None, &exe).unwrap_err();
        assert!(
            e.to_string()
                .contains(&*deps.join(BIN_NAME).to_string_lossy()),
            "{e}"
        );
        assert!(e.to_string().contains(BIN_ENV), "{e}");
        // One directory up from deps/ (a test binary's place).
        std::fs::write(dir.join(BIN_NAME), b"").unwrap();
        assert_eq!(locate(None, &exe).unwrap(), dir.join(BIN_NAME));
        // Beside the executable wins.
        std::fs::write(deps.join(BIN_NAME), b"").unwrap();
        assert_eq!(locate(None, &exe).unwrap(), deps.join(BIN_NAME));
        // The variable wins, and must name a file.
        let named = dir.join("elsewhere");
        let e = locate(Some(named.clone()), &exe).unwrap_err();
        assert!(e.to_string().contains(&*named.to_string_lossy()), "{e}");
        std::fs::write(&named, b"").unwrap();
        assert_eq!(locate(Some(named.clone()), &exe).unwrap(), named);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn alive(pid: u32) -> bool {
        // A reaped process has no /proc entry; a zombie is not alive either.
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| !r.trim_start().starts_with('Z'))
        })
    }

    /// Needs the `farvm-memserver` binary (built by `cargo test --workspace`); without it the
    /// error names the path it looked at.
    #[test]
    fn a_local_server_listens_pins_its_connections_and_is_reaped_with_its_handle() {
        let cpu = crate::affinity::allowed_cpus().unwrap()[0];
        let server = LocalServer::start(16 << 20, Some(cpu)).unwrap_or_else(|e| panic!("{e}"));
        let pid = server.pid();
        assert!(alive(pid));
        let _conn = std::net::TcpStream::connect(server.addr()).expect("it listens");
        // The connection thread pins itself before the handshake it then sends.
        let mut hello = [0u8; 8];
        std::io::Read::read_exact(&mut &_conn, &mut hello).expect("challenge");
        let tids = server.connection_thread_ids();
        assert_eq!(tids.len(), 1, "{tids:?}");
        assert_eq!(crate::affinity::thread_cpus(tids[0]).unwrap(), vec![cpu]);
        server.shutdown();
        assert!(!alive(pid), "the server outlived its handle");
    }
}
