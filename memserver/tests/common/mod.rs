//! Shared helpers for the loopback integration tests.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use farvm_memclient::{Client, ClientConfig};
use farvm_memproto::PAGE_SIZE;
use farvm_memserver::server::{Server, ServerConfig, ServerHandle};

/// Deterministic page content for (namespace, page, version): every byte depends on all three,
/// so a stale or misplaced page is detected.
pub fn page_content(ns: u64, page: u64, version: u64, out: &mut [u8]) {
    let mut x = ns.wrapping_mul(0x9e3779b97f4a7c15)
        ^ page.wrapping_mul(0xc2b2ae3d27d4eb4f)
        ^ version.wrapping_mul(0x165667b19e3779f9)
        | 1;
    for chunk in out.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

pub fn page(ns: u64, p: u64, v: u64) -> Vec<u8> {
    let mut b = vec![0u8; PAGE_SIZE];
    page_content(ns, p, v, &mut b);
    b
}

pub fn start_servers(n: usize, pages: u64) -> Vec<ServerHandle> {
    (0..n)
        .map(|_| {
            Server::start(ServerConfig::loopback(pages * PAGE_SIZE as u64)).expect("server starts")
        })
        .collect()
}

pub fn config(servers: &[SocketAddr]) -> ClientConfig {
    let mut c = ClientConfig::new(servers.to_vec());
    c.slab_pages = 1024;
    c.timeout = Duration::from_secs(3);
    c
}

/// Waits up to `patience` for `done(c)`, failing the test with the client's stats if it
/// never holds (a bound, not a timing assertion).
pub fn wait_for(what: &str, c: &Client, patience: Duration, done: impl Fn(&Client) -> bool) {
    let deadline = Instant::now() + patience;
    while !done(c) {
        assert!(
            Instant::now() < deadline,
            "{what} never happened: {:?}",
            c.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn client(servers: &[SocketAddr]) -> Client {
    Client::connect(config(servers)).expect("client connects")
}

/// A `farvm-memserver` child process on an ephemeral loopback port.
pub struct ServerProc {
    pub child: Child,
    pub addr: SocketAddr,
}

impl ServerProc {
    pub fn spawn(capacity: &str) -> Self {
        Self::spawn_at("127.0.0.1:0", capacity)
    }

    /// A server listening on `listen` (e.g. the address of one that was killed).
    pub fn spawn_at(listen: &str, capacity: &str) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_farvm-memserver"))
            .args(["--listen", listen, "--capacity", capacity])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn farvm-memserver");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the listening line");
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .parse()
            .expect("address");
        Self { child, addr }
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        let _ = self.child.wait();
    }

    /// Sends `sig` (SIGSTOP / SIGCONT freeze and resume the server, its pages intact). Returns
    /// after a SIGSTOP only once every server thread has stopped.
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid (not yet reaped); no memory is involved.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        if sig == libc::SIGSTOP {
            wait_stopped(self.child.id());
        }
    }
}

/// Waits until every thread of `pid` is stopped (see [`farvm_memserver::process`]).
pub fn wait_stopped(pid: u32) {
    assert!(
        farvm_memserver::process::wait_all_threads_stopped(pid, std::time::Duration::from_secs(10)),
        "process {pid} did not stop within 10 s of SIGSTOP"
    );
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
