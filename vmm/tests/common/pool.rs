//! A memory pool for the VMM's tests: a private etcd with racks declared, and real
//! `farvm-memserver --pool` processes (short lease, no collection grace), one per rack, on
//! loopback; waits on the pool's view bounded by [`PATIENCE`].
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use farvm_pool::local_etcd::LocalEtcd;
use farvm_pool::{Directory, DirectoryConfig, PoolView, RackId, ServerId};

/// Bound for things that happen after a lease TTL or a copy (never a timing assertion: the
/// tests wait for a condition and fail only if it never comes).
pub const PATIENCE: Duration = Duration::from_secs(120);

pub struct Member {
    /// The server's process.
    pub child: Child,
    /// Its pool id.
    pub id: ServerId,
}

impl Member {
    /// A memory server of the pool at `url`, listening.
    pub fn start(url: &str, rack: &str, id: &str, capacity: &str) -> Self {
        let mut child = memserver(url, rack, id, capacity)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn farvm-memserver");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("listening "), "{line:?}");
        Member {
            child,
            id: ServerId::new(id).unwrap(),
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Pool {
    /// The etcd.
    pub etcd: LocalEtcd,
    /// A directory on it.
    pub dir: Directory,
    /// The memory servers.
    pub members: Vec<Member>,
}

impl Pool {
    /// etcd with `racks` declared, plus one memory server per entry of `racks` (`capacity`
    /// each).
    pub fn start(racks: &[&str], capacity: &str) -> Self {
        let etcd = LocalEtcd::start().unwrap_or_else(|e| panic!("{e}"));
        let dir = Directory::connect(DirectoryConfig::new(vec![etcd.endpoint()])).unwrap();
        let declared: Vec<RackId> = racks.iter().map(|r| RackId::new(*r).unwrap()).collect();
        dir.declare_racks(&declared).unwrap();
        let members: Vec<Member> = racks
            .iter()
            .enumerate()
            .map(|(i, rack)| {
                Member::start(&etcd.endpoint(), rack, &format!("ms{i}-{rack}"), capacity)
            })
            .collect();
        let pool = Self { etcd, dir, members };
        pool.wait("every server registered", |v| {
            pool.members.iter().all(|m| v.servers.contains_key(&m.id))
        });
        pool
    }

    pub fn url(&self) -> String {
        self.etcd.endpoint()
    }

    pub fn wait(&self, what: &str, pred: impl Fn(&PoolView) -> bool) -> PoolView {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(v) = self.dir.view() {
                if pred(&v) {
                    return v;
                }
                assert!(Instant::now() < deadline, "never saw {what}: {v:#?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Bytes stored on every server.
    pub fn used(v: &PoolView) -> u64 {
        v.servers.values().map(|s| s.used_bytes).sum()
    }
}

/// `farvm-memserver --pool URL --rack RACK --pool-id ID` on loopback.
pub fn memserver(url: &str, rack: &str, id: &str, capacity: &str) -> Command {
    let bin = farvm_vmm::remote::local_server::binary().expect("farvm-memserver binary");
    let mut c = Command::new(bin);
    c.args([
        "--listen",
        "127.0.0.1:0",
        "--capacity",
        capacity,
        "--pool",
        url,
    ])
    .args(["--rack", rack, "--pool-id", id])
    .args(["--pool-ttl", "2", "--pool-gc-grace", "0"]);
    c
}
