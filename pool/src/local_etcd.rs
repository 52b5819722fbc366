//! A private, single-member etcd on loopback for tests and demos: a temporary data directory,
//! ports picked free, stopped by its PID. Uses the `etcd` binary on `PATH` (Debian package
//! `etcd-server`), or the one named by `FARVM_ETCD`.

use std::io::Read as _;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// Why a local etcd did not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalEtcdError {
    /// The binary is not there.
    #[error(
        "the etcd binary `{0}` was not found: install Debian's etcd-server package \
         (scripts/setup.sh does) or point FARVM_ETCD at an etcd binary"
    )]
    Missing(String),
    /// It exited or did not listen in time.
    #[error("etcd did not start: {0}")]
    Failed(String),
    /// Filesystem or process error.
    #[error("etcd: {0}")]
    Io(#[from] std::io::Error),
}

/// A running etcd. Dropping it kills the process and removes its data directory.
#[derive(Debug)]
pub struct LocalEtcd {
    binary: String,
    dir: PathBuf,
    client: SocketAddr,
    peer: SocketAddr,
    child: Option<Child>,
}

/// Tries of [`LocalEtcd::start`] with fresh ports when etcd finds one taken.
const PORT_ATTEMPTS: u32 = 5;

fn free_port() -> std::io::Result<SocketAddr> {
    TcpListener::bind("127.0.0.1:0")?.local_addr()
}

impl LocalEtcd {
    /// Starts etcd (`$FARVM_ETCD`, else `etcd` on `PATH`) with a fresh data directory and
    /// waits until it accepts clients.
    pub fn start() -> Result<Self, LocalEtcdError> {
        Self::start_with(&std::env::var("FARVM_ETCD").unwrap_or_else(|_| "etcd".to_owned()))
    }

    /// Like [`LocalEtcd::start`] with this etcd binary.
    pub fn start_with(binary: &str) -> Result<Self, LocalEtcdError> {
        static SEQ: AtomicU32 = AtomicU32::new(0);
        let binary = binary.to_owned();
        let dir = std::env::temp_dir().join(format!(
            "farvm-etcd-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut me = Self {
            binary,
            dir,
            client: free_port()?,
            peer: free_port()?,
            child: None,
        };
        // A port picked free may be taken before etcd binds it (another test's listener, or
        // the source port of an outgoing connection): pick others and try again.
        let mut attempts = 1;
        loop {
            match me.spawn() {
                Err(LocalEtcdError::Failed(why))
                    if why.contains("address already in use") && attempts < PORT_ATTEMPTS =>
                {
                    attempts += 1;
                    let _ = std::fs::remove_dir_all(me.dir.join("data"));
                    me.client = free_port()?;
                    me.peer = free_port()?;
                }
                r => return r.map(|()| me),
            }
        }
    }

    /// The client URL, e.g. `http://127.0.0.1:40123`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.client)
    }

    /// The client address.
    pub fn client_addr(&self) -> SocketAddr {
        self.client
    }

    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.dir
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Kills the process (SIGKILL, by PID) and reaps it; the data directory stays.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports and data (after [`LocalEtcd::stop`]).
    pub fn restart(&mut self) -> Result<(), LocalEtcdError> {
        self.stop();
        self.spawn()
    }

    fn spawn(&mut self) -> Result<(), LocalEtcdError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))?;
        let client = format!("http://{}", self.client);
        let peer = format!("http://{}", self.peer);
        let child = Command::new(&self.binary)
            .arg("--name=farvm-test")
            .arg(format!("--data-dir={}", self.dir.join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=farvm-test={peer}"))
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => LocalEtcdError::Missing(self.binary.clone()),
                _ => LocalEtcdError::Io(e),
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(c) = self.child.as_mut() {
                if let Some(status) = c.try_wait()? {
                    self.child = None;
                    return Err(LocalEtcdError::Failed(format!(
                        "exited with {status}; log: {}",
                        self.log_tail()
                    )));
                }
            }
            if TcpStream::connect_timeout(&self.client, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.stop();
                return Err(LocalEtcdError::Failed(format!(
                    "not listening on {} after 30 s; log: {}",
                    self.client,
                    self.log_tail()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_tail(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.join("etcd.log")) {
            let _ = f.read_to_string(&mut s);
        }
        let start = s.len().saturating_sub(2000);
        let start = (start..s.len())
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(s.len());
        s[start..].to_owned()
    }
}

impl Drop for LocalEtcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
