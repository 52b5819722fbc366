//! The directory against a real etcd (Debian's etcd-server, started on loopback per test):
//! registration and lease expiry, admission, garbage collection, drains, watches, and an etcd
//! restart in the middle.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use farvm_pool::gc::sweep;
use farvm_pool::local_etcd::{LocalEtcd, LocalEtcdError};
use farvm_pool::placement::drain_plan;
use farvm_pool::{
    AdmissionRequest, Connectivity, Directory, DirectoryConfig, NamespaceReclaimer, PlacementError,
    PoolError, PoolStatus, RackId, RegistrationState, ServerHealth, ServerId, ServerRecord, VmId,
};

const GIB: u64 = 1 << 30;
const TTL: Duration = Duration::from_secs(2);
/// Generous bound for things that happen after a lease TTL (never a timing assertion: tests
/// wait for a condition and fail only if it never comes).
const PATIENCE: Duration = Duration::from_secs(30);

fn etcd() -> LocalEtcd {
    LocalEtcd::start().unwrap_or_else(|e| panic!("{e}"))
}

/// A directory on `etcd` declaring no rack.
fn bare_dir(etcd: &LocalEtcd) -> Directory {
    let mut cfg = DirectoryConfig::new(vec![etcd.endpoint()]);
    cfg.request_timeout = Duration::from_secs(2);
    Directory::connect(cfg).unwrap()
}

/// A directory on `etcd` declaring racks r1, r2 and r3.
fn dir(etcd: &LocalEtcd) -> Directory {
    let d = bare_dir(etcd);
    d.declare_racks(&racks(&["r1", "r2", "r3"])).unwrap();
    d
}

fn racks(names: &[&str]) -> Vec<RackId> {
    names.iter().map(|r| RackId::new(*r).unwrap()).collect()
}

fn pool_cli(etcd: &LocalEtcd, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_farvm-pool"))
        .args(["--etcd", &etcd.endpoint()])
        .args(args)
        .output()
        .unwrap()
}

fn record(id: &str, rack: &str, port: u16, capacity: u64) -> ServerRecord {
    ServerRecord {
        id: ServerId::new(id).unwrap(),
        address: SocketAddr::from(([127, 0, 0, 1], port)),
        endpoints: Vec::new(),
        rack: RackId::new(rack).unwrap(),
        capacity_bytes: capacity,
        used_bytes: 0,
        instance: 42,
        wire_version: 2,
        health: ServerHealth::Up,
    }
}

fn vm_request(guest: u64, local: u64, replication: u8) -> AdmissionRequest {
    AdmissionRequest {
        vm: VmId::random(),
        name: "test-vm".into(),
        host: "host1".into(),
        guest_ram_bytes: guest,
        local_budget_bytes: local,
        replication,
        slab_bytes: GIB,
        min_wire_version: 2,
    }
}

/// A plain etcd client on `etcd` (to act behind the directory's back), with its runtime.
fn raw_client(etcd: &LocalEtcd) -> (tokio::runtime::Runtime, etcd_client::Client) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let raw = rt
        .block_on(etcd_client::Client::connect([etcd.endpoint()], None))
        .unwrap();
    (rt, raw)
}

fn wait_until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "gave up waiting for: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Records every discard; fails for the servers listed in `fail`.
#[derive(Default, Clone)]
struct Recorder {
    seen: Arc<Mutex<Vec<(ServerId, SocketAddr, u64)>>>,
    fail: Vec<ServerId>,
}

impl NamespaceReclaimer for Recorder {
    fn discard(
        &mut self,
        server: &ServerId,
        address: SocketAddr,
        namespace: u64,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        if self.fail.contains(server) {
            return Err(format!("{server} refused the discard").into());
        }
        self.seen
            .lock()
            .unwrap()
            .push((server.clone(), address, namespace));
        Ok(())
    }
}

#[test]
fn missing_etcd_binary_fails_clearly() {
    let e = LocalEtcd::start_with("/nonexistent/etcd").unwrap_err();
    assert!(matches!(e, LocalEtcdError::Missing(_)));
    assert!(e.to_string().contains("etcd-server"), "{e}");
}

#[test]
fn server_registration_updates_and_lease_expiry_removes_dead_servers() {
    let etcd = etcd();
    let d = dir(&etcd);
    let a = d
        .register_server(record("ms-a", "r1", 7001, 8 * GIB), TTL)
        .unwrap();
    let b = d
        .register_server(record("ms-b", "r2", 7002, 4 * GIB), TTL)
        .unwrap();
    let view = d.view().unwrap();
    assert_eq!(view.servers.len(), 2);
    assert_eq!(
        view.servers[&ServerId::new("ms-b").unwrap()].capacity_bytes,
        4 * GIB
    );
    assert!(matches!(a.state(), RegistrationState::Live { .. }));

    // Usage updates reach etcd in the background.
    a.update(|r| r.used_bytes = 3 * GIB);
    wait_until("ms-a's usage update", || {
        let v = d.view().ok()?;
        (v.servers[&ServerId::new("ms-a").unwrap()].used_bytes == 3 * GIB).then_some(())
    });

    // The lease outlives several TTLs while kept alive...
    std::thread::sleep(TTL * 2);
    assert_eq!(d.view().unwrap().servers.len(), 2);

    // ...and a server that stops renewing (as a dead process does) disappears after it.
    b.abandon();
    let view = wait_until("ms-b's record to expire", || {
        let v = d.view().ok()?;
        (v.servers.len() == 1).then_some(v)
    });
    assert!(view.servers.contains_key(&ServerId::new("ms-a").unwrap()));

    // Deregistering removes the record at once.
    a.deregister();
    assert!(d.view().unwrap().servers.is_empty());
}

#[test]
fn killed_announcer_process_leaves_the_pool_after_its_ttl() {
    let etcd = etcd();
    let d = dir(&etcd);
    let add = pool_cli(&etcd, &["racks", "add", "r9", "r1"]);
    assert!(add.status.success(), "{add:?}");
    let said = String::from_utf8_lossy(&add.stdout);
    assert!(said.contains("rack r9: declared\n"), "{said}");
    assert!(said.contains("rack r1: declared already"), "{said}");
    // Something listening, for the announcer's probe.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_farvm-pool"))
        .args([
            "--etcd",
            &etcd.endpoint(),
            "announce-server",
            "--id",
            "ms-x",
        ])
        .args([
            "--address",
            &addr.to_string(),
            "--rack",
            "r9",
            "--capacity",
            "2G",
        ])
        .args(["--ttl", "2"])
        .spawn()
        .unwrap();
    wait_until("the announcer to register ms-x", || {
        let v = d.view().ok()?;
        v.servers
            .contains_key(&ServerId::new("ms-x").unwrap())
            .then_some(())
    });
    // A rack with a live server cannot be removed.
    let rm = pool_cli(&etcd, &["racks", "remove", "r9"]);
    assert!(!rm.status.success());
    let err = String::from_utf8_lossy(&rm.stderr);
    assert!(
        err.contains("rack r9 still has 1 live memory server(s) (ms-x)"),
        "{err}"
    );
    let list = pool_cli(&etcd, &["racks", "--json"]);
    let list: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let r9 = list
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["rack"] == "r9")
        .unwrap_or_else(|| panic!("{list:#}"));
    assert_eq!(r9["declared"], true);
    assert_eq!(r9["servers"], serde_json::json!(["ms-x"]));
    // SIGKILL: no chance to deregister; only the lease TTL removes it.
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(d
        .view()
        .unwrap()
        .servers
        .contains_key(&ServerId::new("ms-x").unwrap()));
    wait_until("ms-x to expire", || {
        let v = d.view().ok()?;
        v.servers.is_empty().then_some(())
    });
}

#[test]
fn servers_register_only_in_declared_racks_and_a_rack_in_use_stays() {
    let etcd = etcd();
    let d = bare_dir(&etcd);
    // A pool that declares no rack refuses every server, saying how to declare them.
    let e = d
        .register_server(record("ms-a", "r1", 7701, GIB), TTL)
        .unwrap_err();
    assert!(
        matches!(&e, PoolError::UnknownRack { rack, declared } if rack.as_str() == "r1" && declared.is_empty()),
        "{e:?}"
    );
    let text = e.to_string();
    assert!(text.contains("declares no racks yet"), "{text}");
    assert!(text.contains("farvm pool racks add r1"), "{text}");
    assert!(d.view().unwrap().servers.is_empty());

    assert_eq!(
        d.declare_racks(&racks(&["r2", "r1"])).unwrap(),
        racks(&["r1", "r2"])
    );
    assert_eq!(
        d.declare_racks(&racks(&["r2", "r3"])).unwrap(),
        racks(&["r3"])
    );
    assert_eq!(d.declared_racks().unwrap(), racks(&["r1", "r2", "r3"]));

    // A misspelt rack is refused, naming it and the declared racks; nothing is registered.
    let e = d
        .register_server(record("ms-a", "r01", 7701, GIB), TTL)
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("rack r01 is not declared in the pool (declared racks: r1, r2, r3)"),
        "{text}"
    );
    assert!(d.view().unwrap().servers.is_empty());

    // Declared racks show in the status also with no server.
    let a = d
        .register_server(record("ms-a", "r1", 7701, GIB), TTL)
        .unwrap();
    let st = d.status().unwrap();
    assert_eq!((st.fleet.racks, st.fleet.declared_racks), (1, 3));
    let shown: Vec<(&str, bool, usize)> = st
        .racks
        .iter()
        .map(|r| (r.rack.as_str(), r.declared, r.servers.len()))
        .collect();
    assert_eq!(
        shown,
        vec![("r1", true, 1), ("r2", true, 0), ("r3", true, 0)]
    );
    assert!(st.render_table().contains("r2         (no server)"));

    // A rack with a live server stays; empty or unknown ones go or are refused.
    let e = d.remove_rack(&RackId::new("r1").unwrap()).unwrap_err();
    assert!(
        matches!(&e, PoolError::RackInUse { servers, .. } if servers == &[ServerId::new("ms-a").unwrap()]),
        "{e:?}"
    );
    d.remove_rack(&RackId::new("r2").unwrap()).unwrap();
    let e = d.remove_rack(&RackId::new("r2").unwrap()).unwrap_err();
    assert!(
        e.to_string()
            .contains("rack r2 is not declared in the pool (declared racks: r1, r3)"),
        "{e}"
    );
    a.deregister();
    d.remove_rack(&RackId::new("r1").unwrap()).unwrap();
    assert_eq!(d.declared_racks().unwrap(), racks(&["r3"]));
}

#[test]
fn a_server_whose_rack_went_while_its_lease_lapsed_is_not_registered_again() {
    let etcd = etcd();
    let d = dir(&etcd);
    let reg = d
        .register_server(record("ms-a", "r1", 7801, GIB), TTL)
        .unwrap();
    let lease = reg.lease().unwrap();
    // What an etcd outage longer than the TTL, during which the operator removed the empty
    // rack, leaves behind: the server's lease gone, and its rack with it.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = etcd_client::Client::connect([etcd.endpoint()], None)
            .await
            .unwrap();
        c.delete(d.keys().rack(&RackId::new("r1").unwrap()), None)
            .await
            .unwrap();
        c.lease_revoke(lease).await.unwrap();
    });
    let reason = wait_until("the registration to be lost", || match reg.state() {
        RegistrationState::Lost { reason } => Some(reason),
        _ => None,
    });
    assert!(
        reason.contains("rack r1 was removed from the pool"),
        "{reason}"
    );
    assert!(d.view().unwrap().servers.is_empty());
}

fn three_racks(d: &Directory) -> Vec<farvm_pool::ServerRegistration> {
    [("ms-1", "r1"), ("ms-2", "r2"), ("ms-3", "r3")]
        .iter()
        .enumerate()
        .map(|(i, (id, rack))| {
            d.register_server(
                record(id, rack, 7100 + i as u16, 4 * GIB),
                Duration::from_secs(10),
            )
            .unwrap()
        })
        .collect()
}

#[test]
fn dead_vm_record_expires_and_gc_discards_its_namespaces() {
    let etcd = etcd();
    let d = dir(&etcd);
    let _servers = three_racks(&d);
    let req = vm_request(4 * GIB, GIB, 2); // 3 GiB remote: 3 slabs × 2 replicas
    let vm = d.admit_vm(&req, TTL).unwrap();
    assert_eq!(vm.placement().slabs.len(), 3);
    assert_eq!(vm.record().namespace, req.vm.namespace());
    let live = d.view().unwrap();
    assert!(live.vms.contains_key(&req.vm));
    assert_eq!(live.vm_slabs(req.vm).count(), 3);
    assert!(
        sweep(&live).is_empty(),
        "a live VM's namespaces are not garbage"
    );
    let expected: Vec<ServerId> = vm.placement().servers();

    // The holder dies without cleaning up.
    vm.abandon();
    let view = wait_until("the VM record to expire", || {
        let v = d.view().ok()?;
        (!v.vms.contains_key(&req.vm)).then_some(v)
    });
    assert_eq!(
        view.vm_slabs(req.vm).count(),
        3,
        "placement outlives the lease"
    );
    let orphans = sweep(&view);
    let servers: Vec<ServerId> = orphans.iter().map(|o| o.server.clone()).collect();
    assert_eq!(servers, expected);
    assert!(orphans
        .iter()
        .all(|o| o.namespace == req.vm.namespace() && o.address.is_some()));
    assert_eq!(orphans.iter().map(|o| o.slabs.len()).sum::<usize>(), 6);

    // With a grace period, the first sweep only marks.
    let mut rec = Recorder::default();
    let report = d
        .collect_garbage(&mut rec, Duration::from_secs(3600))
        .unwrap();
    assert_eq!(report.waiting.len(), orphans.len());
    assert!(report.reclaimed.is_empty() && rec.seen.lock().unwrap().is_empty());
    assert!(d.view().unwrap().gc_marks.contains_key(&req.vm));

    // A failing server keeps its pair for the next sweep; the placement is claimed anyway.
    let failing = expected[0].clone();
    let mut flaky = Recorder {
        fail: vec![failing.clone()],
        ..Recorder::default()
    };
    let report = d.collect_garbage(&mut flaky, Duration::ZERO).unwrap();
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].0.server, failing);
    assert!(report.failed[0].1.contains("refused the discard"));
    assert_eq!(report.reclaimed.len(), expected.len() - 1);
    let view = d.view().unwrap();
    assert_eq!(
        view.vm_slabs(req.vm).count(),
        0,
        "claimed: placement deleted"
    );
    let left = sweep(&view);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].server, failing);

    let report = d.collect_garbage(&mut rec, Duration::ZERO).unwrap();
    assert_eq!(report.vms_reclaimed, vec![req.vm]);
    let seen = rec.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, failing);
    assert_eq!(seen[0].2, req.vm.namespace());
    let view = d.view().unwrap();
    assert!(sweep(&view).is_empty() && view.gc_marks.is_empty());
}

#[test]
fn retire_discards_everywhere_and_leaves_nothing() {
    let etcd = etcd();
    let d = dir(&etcd);
    let _servers = three_racks(&d);
    let req = vm_request(3 * GIB, GIB, 2);
    let vm = d.admit_vm(&req, TTL).unwrap();
    let servers = vm.placement().servers();
    let mut rec = Recorder::default();
    vm.retire(&mut rec).unwrap();
    let seen: Vec<ServerId> = rec
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.0.clone())
        .collect();
    assert_eq!(seen, servers);
    let view = d.view().unwrap();
    assert!(view.vms.is_empty() && view.slabs.is_empty() && sweep(&view).is_empty());
}

#[test]
fn vm_lease_lost_in_an_outage_is_renewed_unless_reclaimed() {
    let etcd = etcd();
    let d = dir(&etcd);
    let _servers = three_racks(&d);
    let req = vm_request(3 * GIB, GIB, 2);
    let vm = d.admit_vm(&req, TTL).unwrap();
    let first = vm.lease().unwrap();

    let (rt, mut raw) = raw_client(&etcd);

    // The lease vanishes (as after an outage longer than its TTL): the VM registers again.
    rt.block_on(raw.lease_revoke(first)).unwrap();
    let second = wait_until("the VM to register under a new lease", || {
        match vm.state() {
            RegistrationState::Live { lease } if lease != first => Some(lease),
            _ => None,
        }
    });
    wait_until("the VM record to be back", || {
        d.view().ok()?.vms.contains_key(&req.vm).then_some(())
    });

    // Now the collector claims its placement while the lease is gone: the VM must learn that
    // its remote pages are gone instead of registering again.
    let prefix = d.keys().vm_placement(&req.vm);
    rt.block_on(raw.delete(
        prefix,
        Some(etcd_client::DeleteOptions::new().with_prefix()),
    ))
    .unwrap();
    rt.block_on(raw.lease_revoke(second)).unwrap();
    let reason = wait_until("the VM registration to be lost", || match vm.state() {
        RegistrationState::Lost { reason } => Some(reason),
        _ => None,
    });
    assert!(reason.contains("reclaimed"), "{reason}");
    assert!(!d.view().unwrap().vms.contains_key(&req.vm));
}

#[test]
fn admission_refuses_what_does_not_fit_and_names_the_shortfall() {
    let etcd = etcd();
    let d = dir(&etcd);
    let _a = d
        .register_server(record("ms-a", "r1", 7201, 8 * GIB), Duration::from_secs(10))
        .unwrap();
    let _b = d
        .register_server(record("ms-b", "r2", 7202, 2 * GIB), Duration::from_secs(10))
        .unwrap();
    let _c = d
        .register_server(record("ms-c", "r3", 7203, 8 * GIB), Duration::from_secs(10))
        .unwrap();

    // Three racks cannot hold replication 4.
    let e = d.admit_vm(&vm_request(2 * GIB, GIB, 4), TTL).unwrap_err();
    assert!(
        matches!(e, PoolError::Placement(PlacementError::Shortfall(_))),
        "{e}"
    );
    assert!(e.to_string().contains("only 3 rack(s) have room"), "{e}");

    // With r3 draining, 5 GiB × 2 needs 10 GiB on r1 + r2 but r2 holds 2 GiB.
    d.set_draining(&ServerId::new("ms-c").unwrap(), true)
        .unwrap();
    let e = d.admit_vm(&vm_request(6 * GIB, GIB, 2), TTL).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("short by 3 GiB"), "{msg}");
    assert!(
        msg.contains("r2 has room for 2 GiB, could take 3 GiB more"),
        "{msg}"
    );
    assert!(msg.contains("ms-c draining"), "{msg}");
    assert!(
        d.view().unwrap().vms.is_empty(),
        "a refused VM registers nothing"
    );

    // Same id twice.
    d.set_draining(&ServerId::new("ms-c").unwrap(), false)
        .unwrap();
    let req = vm_request(2 * GIB, GIB, 2);
    let _vm = d.admit_vm(&req, TTL).unwrap();
    let e = d.admit_vm(&req, TTL).unwrap_err();
    assert!(
        matches!(e, PoolError::AlreadyRegistered(id) if id == req.vm),
        "{e}"
    );

    // More slabs than one etcd transaction can commit.
    let mut big = vm_request(200 * GIB, 0, 1);
    big.slab_bytes = GIB;
    let e = d.admit_vm(&big, TTL).unwrap_err();
    assert!(matches!(e, PoolError::TooManyOps { .. }), "{e}");
}

#[test]
fn concurrent_admissions_never_overcommit() {
    let etcd = etcd();
    let d = dir(&etcd);
    // Room for exactly two 2-slab VMs at replication 2 (4 GiB per rack, 2 racks).
    let _a = d
        .register_server(record("ms-a", "r1", 7301, 4 * GIB), Duration::from_secs(10))
        .unwrap();
    let _b = d
        .register_server(record("ms-b", "r2", 7302, 4 * GIB), Duration::from_secs(10))
        .unwrap();
    let results: Vec<Result<farvm_pool::VmRegistration, PoolError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let d = d.clone();
                s.spawn(move || d.admit_vm(&vm_request(2 * GIB, 0, 2), TTL))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(
        admitted,
        2,
        "{:?}",
        results
            .iter()
            .map(|r| r.as_ref().err().map(|e| e.to_string()))
            .collect::<Vec<_>>()
    );
    for r in &results {
        if let Err(e) = r {
            assert!(
                matches!(e, PoolError::Placement(PlacementError::Shortfall(_))),
                "{e}"
            );
        }
    }
    let view = d.view().unwrap();
    for s in view.servers.values() {
        assert!(
            view.committed_bytes(&s.id) <= s.capacity_bytes,
            "{} overcommitted",
            s.id
        );
    }
}

#[test]
fn drain_plan_commits_and_status_reports_the_fleet() {
    let etcd = etcd();
    let d = dir(&etcd);
    // After draining b1 every slab needs r1 and r3: 9 GiB each, which they hold.
    let regs: Vec<_> = [
        ("a1", "r1", 8),
        ("a2", "r1", 8),
        ("b1", "r2", 8),
        ("c1", "r3", 16),
    ]
    .iter()
    .enumerate()
    .map(|(i, (id, rack, gib))| {
        d.register_server(
            record(id, rack, 7400 + i as u16, gib * GIB),
            Duration::from_secs(10),
        )
        .unwrap()
    })
    .collect();
    let mut vms = Vec::new();
    for _ in 0..3 {
        vms.push(
            d.admit_vm(&vm_request(4 * GIB, GIB, 2), Duration::from_secs(10))
                .unwrap(),
        );
    }
    let victim = ServerId::new("b1").unwrap();
    assert!(d.view().unwrap().committed_bytes(&victim) > 0);
    d.set_draining(&victim, true).unwrap();
    let view = d.view().unwrap();
    assert_eq!(view.servers[&victim].health, ServerHealth::Draining);
    let plan = drain_plan(&view, &victim, 2).unwrap();
    assert!(plan.is_complete(), "{plan:?}");
    assert!(!plan.moves.is_empty());
    for m in &plan.moves {
        d.commit_move(m).unwrap();
    }
    // A stale move conflicts.
    let e = d.commit_move(&plan.moves[0]).unwrap_err();
    assert!(matches!(e, PoolError::Conflict { .. }), "{e}");
    let view = d.view().unwrap();
    assert_eq!(view.committed_bytes(&victim), 0);
    for rec in view.slabs.values() {
        let racks: std::collections::BTreeSet<_> =
            rec.replicas.iter().map(|s| &view.servers[s].rack).collect();
        assert_eq!(racks.len(), rec.replicas.len());
    }

    let status = d.status().unwrap();
    assert_eq!(status.fleet.servers, 4);
    assert_eq!(status.fleet.racks, 3);
    assert_eq!(status.fleet.vms, 3);
    assert_eq!(status.fleet.guest_ram_bytes, 12 * GIB);
    assert_eq!(status.fleet.local_ram_bytes, 3 * GIB);
    assert_eq!(status.fleet.oversubscription, Some(4.0));
    assert_eq!(status.fleet.reserved_bytes, 18 * GIB);
    let r2 = status
        .racks
        .iter()
        .find(|r| r.rack.as_str() == "r2")
        .unwrap();
    assert_eq!(r2.servers[0].health, ServerHealth::Draining);
    assert_eq!(r2.servers[0].reserved_bytes, 0);
    let json = status.to_json();
    let back: PoolStatus = serde_json::from_str(&json).unwrap();
    assert_eq!(back, status);
    let table = status.render_table();
    assert!(table.contains("oversubscription 4.00x"), "{table}");
    assert!(table.contains("draining"), "{table}");
    drop(vms);
    drop(regs);
}

#[test]
fn etcd_restart_clients_wait_then_reconnect() {
    let mut etcd = etcd();
    let d = dir(&etcd);
    let reg = d
        .register_server(record("ms-a", "r1", 7501, 8 * GIB), Duration::from_secs(5))
        .unwrap();
    let mut watch = d.watch();
    wait_until("the watch's first view", || {
        let v = watch.latest();
        v.servers
            .contains_key(&ServerId::new("ms-a").unwrap())
            .then_some(())
    });

    etcd.stop();
    let e = d.view().unwrap_err();
    assert!(e.is_unreachable(), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("etcd unreachable") && msg.contains("no answer for"),
        "{msg}"
    );
    assert!(matches!(d.connectivity(), Connectivity::Unreachable { .. }));
    let e = d.admit_vm(&vm_request(2 * GIB, GIB, 1), TTL).unwrap_err();
    assert!(e.is_unreachable(), "{e}");
    wait_until("the registration to notice", || {
        matches!(reg.state(), RegistrationState::Reconnecting { .. }).then_some(())
    });
    // Updates while etcd is down are kept and written once it is back.
    reg.update(|r| r.used_bytes = GIB);

    etcd.restart().unwrap();
    let view = wait_until("the directory to reconnect", || d.view().ok());
    assert!(view.servers.contains_key(&ServerId::new("ms-a").unwrap()));
    assert_eq!(d.connectivity(), Connectivity::Connected);
    wait_until("the registration to be live again", || {
        matches!(reg.state(), RegistrationState::Live { .. }).then_some(())
    });
    wait_until("the update made during the outage", || {
        let v = d.view().ok()?;
        (v.servers[&ServerId::new("ms-a").unwrap()].used_bytes == GIB).then_some(())
    });
    // The watch resumed too.
    reg.update(|r| r.used_bytes = 2 * GIB);
    watch
        .wait_for(PATIENCE, |v| {
            v.servers
                .get(&ServerId::new("ms-a").unwrap())
                .is_some_and(|s| s.used_bytes == 2 * GIB)
        })
        .expect("the watch to see an update after the restart");
    // And admission works again.
    d.admit_vm(&vm_request(2 * GIB, GIB, 1), TTL).unwrap();
}

#[test]
fn watch_follows_servers_coming_and_going() {
    let etcd = etcd();
    let d = dir(&etcd);
    let mut watch = d.watch();
    watch
        .wait_for(PATIENCE, |v| v.revision > 0)
        .expect("a first view");
    let a = d
        .register_server(record("ms-a", "r1", 7601, GIB), TTL)
        .unwrap();
    watch
        .wait_for(PATIENCE, |v| v.servers.len() == 1)
        .expect("the watch to see ms-a");
    a.abandon();
    watch
        .wait_for(PATIENCE, |v| v.servers.is_empty())
        .expect("the watch to see ms-a expire");
}

#[test]
fn a_snapshot_owns_its_vms_namespace_until_restored_once_or_deleted() {
    let etcd = etcd();
    let d = dir(&etcd);
    let _servers = three_racks(&d);
    let req = vm_request(4 * GIB, GIB, 2);
    let vm = d.admit_vm(&req, TTL).unwrap();
    let expected = vm.placement().servers();
    let holding = |dir: &str| farvm_pool::SnapshotHolding {
        dir: dir.into(),
        host: "host1".into(),
        remote_pages: 1000,
        local_pages: 10,
    };
    let snap = vm.hand_to_snapshot(holding("/snap/a")).unwrap();
    assert_eq!(snap.vm.uuid, req.vm);
    let view = d.view().unwrap();
    assert!(!view.vms.contains_key(&req.vm) && view.snapshots.contains_key(&req.vm));
    assert_eq!(view.vm_slabs(req.vm).count(), 3, "the placement stays");

    // Past the VM's lease and with no grace, the collector leaves an owned namespace alone.
    std::thread::sleep(TTL + Duration::from_secs(1));
    let mut rec = Recorder::default();
    let report = d.collect_garbage(&mut rec, Duration::ZERO).unwrap();
    assert!(
        report.reclaimed.is_empty() && report.waiting.is_empty(),
        "{report:?}"
    );
    assert!(sweep(&d.view().unwrap()).is_empty());
    let status = d.status().unwrap();
    assert_eq!(status.snapshots.len(), 1);
    assert_eq!(status.snapshots[0].dir, "/snap/a");
    assert_eq!(status.snapshots[0].remote_bytes, 1000 * 4096);

    // Restored once: the VM's record is back under a new lease, under the same id.
    let (back, from) = d.restore_snapshot(req.vm, "host2", TTL).unwrap();
    assert_eq!(from, snap);
    assert_eq!(back.record().host, "host2");
    assert_eq!(back.placement().servers(), expected);
    let view = d.view().unwrap();
    assert!(view.vms.contains_key(&req.vm) && view.snapshots.is_empty());
    match d.restore_snapshot(req.vm, "host2", TTL) {
        Err(e @ PoolError::NoSnapshot(_)) => {
            assert!(e.to_string().contains("restored already"), "{e}")
        }
        other => panic!("restored twice: {other:?}"),
    }

    // Saved again, then deleted: the collectors get its servers; a second delete is refused.
    back.hand_to_snapshot(holding("/snap/b")).unwrap();
    let deleted = d.delete_snapshot(req.vm).unwrap();
    assert_eq!(deleted.dir, "/snap/b");
    let view = d.view().unwrap();
    assert!(view.snapshots.is_empty() && view.vm_slabs(req.vm).count() == 0);
    let pending: Vec<ServerId> = view.gc_marks[&req.vm]
        .pending
        .iter()
        .map(|p| p.server.clone())
        .collect();
    assert_eq!(pending, expected);
    assert!(matches!(
        d.delete_snapshot(req.vm),
        Err(PoolError::NoSnapshot(_))
    ));
    let report = d.collect_garbage(&mut rec, Duration::ZERO).unwrap();
    assert_eq!(report.vms_reclaimed, vec![req.vm]);
}

#[test]
fn a_handover_gives_the_vm_to_exactly_one_host() {
    let etcd = etcd();
    let d = dir(&etcd);
    let _servers = three_racks(&d);

    // Committed: the destination owns the record under its lease; the source's cancel fails,
    // and the source's lease going (revoked, or expired and renewed) leaves the record alone.
    let req = vm_request(4 * GIB, GIB, 2);
    let src = d.admit_vm(&req, TTL).unwrap();
    let expected = src.placement().servers();
    let fence = src.handover_fence().unwrap();
    let dst = d.take_over_vm(req.vm, "host2", TTL, fence).unwrap();
    assert_eq!(dst.record().host, "host2");
    assert_eq!(dst.placement().servers(), expected);
    assert!(
        !src.cancel_handover(fence).unwrap(),
        "cancelled after the commit"
    );
    assert!(
        src.handover_fence().is_err(),
        "the source still sees the record as its own"
    );
    let src_lease = src.lease().unwrap();
    let (rt, mut raw) = raw_client(&etcd);
    // The source's lease expires (an outage): it must not register the VM again over the
    // destination's record.
    rt.block_on(raw.lease_revoke(src_lease)).unwrap();
    let reason = wait_until("the source's registration to be lost", || {
        match src.state() {
            RegistrationState::Lost { reason } => Some(reason),
            _ => None,
        }
    });
    assert!(reason.contains("took the VM over"), "{reason}");
    let view = d.view().unwrap();
    assert_eq!(view.vms[&req.vm].host, "host2");
    assert_eq!(view.vm_slabs(req.vm).count(), 3, "the placement stays");
    src.handed_over();
    std::thread::sleep(TTL + Duration::from_secs(1));
    assert!(
        d.view().unwrap().vms.contains_key(&req.vm),
        "the destination's lease holds it"
    );
    drop(dst);

    // Cancelled first: the destination's commit fails and the source keeps the VM.
    let req = vm_request(4 * GIB, GIB, 2);
    let src = d.admit_vm(&req, TTL).unwrap();
    let fence = src.handover_fence().unwrap();
    assert!(src.cancel_handover(fence).unwrap());
    match d.take_over_vm(req.vm, "host2", TTL, fence) {
        Err(PoolError::Conflict { .. }) => {}
        other => panic!("took over a cancelled handover: {other:?}"),
    }
    assert_eq!(d.view().unwrap().vms[&req.vm].host, "host1");
    assert!(
        src.handover_fence().is_ok(),
        "the source still owns its record"
    );
}

#[test]
fn a_handover_decided_while_etcd_is_stopped_is_settled_from_the_record() {
    // A transaction whose client gave up may still run when etcd does; a second try then
    // fails its condition. The source's cancel, sent while etcd is stopped, must end as
    // "kept" (the record is under its lease), never as "the destination took it".
    let etcd = etcd();
    let d = dir(&etcd);
    let _servers = three_racks(&d);
    // Longer than the pause below: no lease expires in it.
    let ttl = Duration::from_secs(10);
    let req = vm_request(4 * GIB, GIB, 2);
    let src = d.admit_vm(&req, ttl).unwrap();
    let fence = src.handover_fence().unwrap();
    let pid = etcd.pid().unwrap() as i32;
    // SAFETY: kill(2) on the etcd this test started; no memory is involved.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let cancel = std::thread::spawn(move || {
        let kept = src.cancel_handover(fence);
        (src, kept)
    });
    // Past the request timeout (2 s): the first try has failed at the client.
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let (src, kept) = cancel.join().unwrap();
    assert!(kept.unwrap(), "the source lost a VM it kept");
    match d.take_over_vm(req.vm, "host2", ttl, fence) {
        Err(PoolError::Conflict { .. }) => {}
        other => panic!("took over a cancelled handover: {other:?}"),
    }
    let (rt, mut raw) = raw_client(&etcd);
    let key = farvm_pool::keys::KeyLayout::default().vm(&req.vm);
    let resp = rt.block_on(raw.get(key.clone(), None)).unwrap();
    assert_eq!(resp.kvs()[0].lease(), src.lease().unwrap());

    // The same for a takeover sent while etcd is stopped: it ends as "taken" once etcd
    // runs, and the source's cancel then fails.
    let fence = src.handover_fence().unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let d2 = d.clone();
    let take = std::thread::spawn(move || d2.take_over_vm(req.vm, "host2", ttl, fence));
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let dst = take.join().unwrap().unwrap();
    assert_eq!(dst.record().host, "host2");
    assert!(!src.cancel_handover(fence).unwrap());
    let resp = rt.block_on(raw.get(key, None)).unwrap();
    assert_eq!(resp.kvs()[0].lease(), dst.lease().unwrap());
}
