//! `farvm-memserver --pool` against a real etcd (Debian's etcd-server on loopback, or
//! `$FARVM_ETCD`): the server registers itself with its rack, capacity, instance id and wire
//! version, keeps its used bytes current, drops the namespace of a VM whose lease expired and
//! of a VM that released its placement and refuses it from then on, drops by itself a
//! namespace nothing in the pool owns, and leaves the pool when killed.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use farvm_memclient::{Client, ClientConfig, ClientError};
use farvm_memproto::{PAGE_SIZE, PROTOCOL_VERSION};
use farvm_pool::local_etcd::LocalEtcd;
use farvm_pool::{
    AdmissionRequest, Directory, DirectoryConfig, PoolView, RackId, ServerHealth, ServerId, VmId,
};

const PATIENCE: Duration = Duration::from_secs(30);

struct Member {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Member {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn member(etcd: &LocalEtcd, id: &str, rack: &str) -> Member {
    let mut child = Command::new(env!("CARGO_BIN_EXE_farvm-memserver"))
        .args(["--listen", "127.0.0.1:0", "--capacity", "256M", "--pool"])
        .arg(etcd.endpoint())
        .args(["--rack", rack, "--pool-id", id, "--pool-ttl", "2"])
        .args(["--pool-gc-grace", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn farvm-memserver");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    Member { child, addr }
}

fn directory(etcd: &LocalEtcd) -> Directory {
    Directory::connect(DirectoryConfig::new(vec![etcd.endpoint()])).unwrap()
}

fn wait_view(dir: &Directory, what: &str, pred: impl Fn(&PoolView) -> bool) -> PoolView {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Ok(v) = dir.view() {
            if pred(&v) {
                return v;
            }
            assert!(
                Instant::now() < deadline,
                "never saw {what}; last view: {v:#?}"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn used(view: &PoolView, id: &ServerId) -> Option<u64> {
    view.servers.get(id).map(|s| s.used_bytes)
}

#[test]
fn a_pool_member_registers_reports_usage_collects_dead_vms_and_leaves_when_killed() {
    let etcd = LocalEtcd::start().unwrap_or_else(|e| panic!("{e}"));
    let dir = directory(&etcd);
    dir.declare_racks(&[RackId::new("r1").unwrap()]).unwrap();
    let mut m = member(&etcd, "ms-a", "r1");
    let id = ServerId::new("ms-a").unwrap();
    let view = wait_view(&dir, "ms-a registered", |v| v.servers.contains_key(&id));
    let rec = &view.servers[&id];
    assert_eq!(rec.address, m.addr);
    assert_eq!(rec.rack, RackId::new("r1").unwrap());
    assert_eq!(rec.capacity_bytes, 256 << 20);
    assert_eq!(rec.wire_version, PROTOCOL_VERSION);
    assert_eq!(rec.health, ServerHealth::Up);
    assert_ne!(rec.instance, 0);

    // A VM admitted onto it writes 100 pages; the record's used bytes follow.
    let mut cfg = ClientConfig::new(vec![m.addr]);
    cfg.slab_pages = 1024;
    let client = Client::connect(cfg).unwrap();
    let req = |vm| AdmissionRequest {
        vm,
        name: "vm".into(),
        host: "h1".into(),
        guest_ram_bytes: 64 << 20,
        local_budget_bytes: 32 << 20,
        replication: 1,
        slab_bytes: 16 << 20,
        min_wire_version: PROTOCOL_VERSION,
    };
    let vm1 = VmId::random();
    let reg1 = dir.admit_vm(&req(vm1), Duration::from_secs(1)).unwrap();
    let data = vec![7u8; 100 * PAGE_SIZE];
    client.write(vm1.namespace(), 0, &data).unwrap();
    wait_view(&dir, "used bytes of 100 pages", |v| {
        used(v, &id) == Some(100 * PAGE_SIZE as u64)
    });

    // Its VMM dies (the lease is no longer renewed): the server drops its namespace.
    reg1.abandon();
    wait_view(&dir, "the dead VM's namespace dropped", |v| {
        used(v, &id) == Some(0) && v.gc_marks.is_empty() && v.slabs.is_empty()
    });
    // Its namespace is refused from now on: a VMM that was only paused past its lease learns
    // that its memory was reclaimed, and its late write-backs cannot recreate the namespace.
    let mut page = vec![0u8; PAGE_SIZE];
    assert_eq!(
        client.read(vm1.namespace(), 0, &mut page),
        Err(ClientError::Reclaimed)
    );
    assert_eq!(
        client.write(vm1.namespace(), 0, &data[..PAGE_SIZE]),
        Err(ClientError::Reclaimed)
    );
    assert_eq!(used(&dir.view().unwrap(), &id), Some(0));

    // A VM that exits cleanly releases its placement: dropped at once, no grace.
    let vm2 = VmId::random();
    let reg2 = dir.admit_vm(&req(vm2), Duration::from_secs(30)).unwrap();
    client
        .write(vm2.namespace(), 5, &data[..PAGE_SIZE * 3])
        .unwrap();
    wait_view(&dir, "3 pages used", |v| {
        used(v, &id) == Some(3 * PAGE_SIZE as u64)
    });
    reg2.release().unwrap();
    assert!(dir.wait_reclaimed(vm2, PATIENCE).unwrap());
    wait_view(&dir, "the released VM's namespace dropped", |v| {
        used(v, &id) == Some(0)
    });
    // A namespace that nothing in the pool owns (no VM record, placement or collector mark
    // names it: a copy no record lists) is dropped by the server itself, then refused.
    let stray = VmId::random().namespace();
    client.write(stray, 0, &data[..PAGE_SIZE * 2]).unwrap();
    wait_view(&dir, "2 stray pages stored", |v| {
        used(v, &id) == Some(2 * PAGE_SIZE as u64)
    });
    wait_view(&dir, "the stray namespace dropped", |v| {
        used(v, &id) == Some(0)
    });
    assert_eq!(
        client.write(stray, 0, &data[..PAGE_SIZE]),
        Err(ClientError::Reclaimed)
    );
    client.close();

    // Killed: its record goes with its lease.
    let _ = m.child.kill();
    let _ = m.child.wait();
    wait_view(&dir, "ms-a gone", |v| !v.servers.contains_key(&id));
}

#[test]
fn pool_flags_are_checked_before_serving() {
    let out = Command::new(env!("CARGO_BIN_EXE_farvm-memserver"))
        .args(["--listen", "0.0.0.0:0", "--capacity", "16M"])
        .args(["--pool", "http://127.0.0.1:1", "--rack", "r1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--advertise"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_farvm-memserver"))
        .args(["--listen", "127.0.0.1:0", "--capacity", "16M"])
        .args(["--pool", "http://127.0.0.1:1", "--rack", "bad/rack"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("rack name"), "{err}");
}
