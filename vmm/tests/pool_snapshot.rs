//! Snapshots of pool VMs, end to end through the binary against a real etcd and real
//! `farvm-memserver --pool` processes: a VM at 25% local saved mid-workload writes its
//! resident pages only and leaves the rest on the servers, owned by a snapshot record that
//! `farvm pool status` lists and that outlives the saving VMM past its lease and the
//! collectors' grace; the restored VM finishes with the uninterrupted run's checksum; a
//! second restore is refused; deleting a snapshot empties the servers; a save that fails
//! leaves the VM running and owning its namespace. A snapshot sealed under a snapshot key
//! holds no byte string of the guest's RAM nor its page key in the clear; restored without
//! the key, with another key, or altered, it is refused and stays in the pool, restorable with
//! its key.

mod common;
#[path = "common/pool.rs"]
mod pool_harness;
#[path = "common/sealed.rs"]
mod sealed;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

use common::{assert_native_report, farvm, kvm_available, refusal, wait_for_measured_phase};
use farvm_pool::VmId;
use pool_harness::Pool;

/// Read-modify-write passes over 96 MiB that check every word they read: a page restored
/// wrong (or read back stale from a server) fails the run, naming the word.
const WORKLOAD: &str = "seq:ws=96M,passes=6,write=1,verify=1";
/// [`WORKLOAD`] with more passes, for a test that saves and restores the VM three times.
const LONG_WORKLOAD: &str = "seq:ws=96M,passes=24,write=1,verify=1";
/// The VM's resident budget: 25% of 128 MiB.
const LOCAL_BYTES: u64 = 32 << 20;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("farvm-poolsnap-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A 128 MiB test guest at 25% local on `pool`, running [`WORKLOAD`], controlled at `sock`.
fn start_vm(pool: &Pool, name: &str, sock: &Path) -> Child {
    start_vm_running(pool, name, sock, WORKLOAD)
}

/// [`start_vm`] running `workload`.
fn start_vm_running(pool: &Pool, name: &str, sock: &Path, workload: &str) -> Child {
    farvm()
        .args(["run", "--name", name, "--pool", &pool.url()])
        .args(["--pool-lease-ttl", "2", "--pool-slab", "32M"])
        .args(["--memory", "128M", "--local-memory", "25%"])
        .args(["--workload", workload, "--serial", "none", "--json"])
        .arg("--control-socket")
        .arg(sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn snapshot(sock: &Path, dir: &Path, key: Option<&Path>) -> std::process::Output {
    sealed::snapshot(Path::new(env!("CARGO_BIN_EXE_farvm")), sock, dir, key)
}

/// Saves the VM into `snap` (sealed under the snapshot key `key`, if given) and waits for its
/// VMM to exit as saved; returns the VM's pool id.
fn save(pool: &Pool, sock: &Path, snap: &Path, vm: Child, key: Option<&Path>) -> VmId {
    let o = snapshot(sock, snap, key);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "farvm snapshot: {err}");
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("left in the memory pool"), "{said}");
    let out = vm.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"]["kind"], "snapshotted", "{report}");
    let v = pool.wait("the snapshot record", |v| v.snapshots.len() == 1);
    assert!(v.vms.is_empty(), "{:?}", v.vms);
    *v.snapshots.keys().next().unwrap()
}

fn restore(snap: &Path) -> std::process::Output {
    sealed::restore(Path::new(env!("CARGO_BIN_EXE_farvm")), snap, None)
}

#[test]
fn a_pool_vm_saved_mid_run_keeps_its_remote_pages_in_the_pool_and_resumes_once() {
    if !kvm_available() {
        return;
    }
    let pool = Pool::start(&["r1", "r2", "r3"], "512M");
    let dir = scratch("resume");
    let sock = dir.join("vm.sock");
    let snap = dir.join("snap");
    let mut vm = start_vm(&pool, &format!("psnap-{}", std::process::id()), &sock);
    wait_for_measured_phase(&sock, &mut vm);
    let admitted = pool.wait("the VM admitted", |v| v.vms.len() == 1);
    let id = *admitted.vms.keys().next().unwrap();

    // A save that fails (its page file cannot be created) leaves the VM running and the
    // namespace its own.
    let blocked = dir.join("blocked");
    std::fs::create_dir_all(blocked.join("memory.pages")).unwrap();
    let o = snapshot(&sock, &blocked, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(71), "{err}");
    assert!(err.contains("memory.pages"), "{err}");
    let status = farvm_vmm::control::request(&sock, "status").unwrap();
    assert_eq!(status["state"], "running", "{status}");
    let v = pool.dir.view().unwrap();
    assert!(v.vms.contains_key(&id) && v.snapshots.is_empty(), "{v:#?}");
    assert!(!blocked.join("manifest.json").exists());
    assert!(!blocked.join("remote.pages").exists() && !blocked.join("page.key").exists());

    assert_eq!(
        save(&pool, &sock, &snap, vm, None),
        id,
        "the snapshot is the VM's id"
    );

    // The snapshot holds the resident pages only, and the key, privately.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(snap.join("manifest.json")).unwrap()).unwrap();
    let written = manifest["memory"]["pages_written"].as_u64().unwrap();
    let remote = manifest["pool"]["pages"].as_u64().unwrap();
    assert!(written * 4096 <= LOCAL_BYTES, "{written} pages written");
    let allocated = std::fs::metadata(snap.join("memory.pages"))
        .unwrap()
        .blocks()
        * 512;
    assert!(allocated <= LOCAL_BYTES, "{allocated} bytes allocated");
    assert!(remote * 4096 >= 48 << 20, "{remote} pages left remote");
    let key = std::fs::metadata(snap.join("page.key")).unwrap();
    assert_eq!(key.permissions().mode() & 0o777, 0o600);

    // `farvm pool status` lists it and what it holds.
    let o = farvm()
        .args(["pool", "--etcd", &pool.url(), "status", "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let listed = &st["snapshots"][0];
    assert_eq!(listed["uuid"], id.to_string(), "{st}");
    assert_eq!(listed["remote_bytes"].as_u64(), Some(remote * 4096), "{st}");
    assert_eq!(listed["dir"], snap.display().to_string(), "{st}");
    let o = farvm()
        .args(["pool", "--etcd", &pool.url(), "status"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("SNAPSHOT") && table.contains(&id.to_string()),
        "{table}"
    );

    // Past the lease TTL (2 s) and the servers' collection grace (0 s), with several of
    // their sweeps, the servers still hold the pages: the snapshot owns them.
    std::thread::sleep(Duration::from_secs(8));
    // Read through `wait`: etcd may have closed the test's idle connection meanwhile (its
    // keepalive pings, every 2 s, are more than etcd allows an idle client: "too_many_pings").
    let v = pool.wait("the pool after the sleep", |_| true);
    assert!(
        v.snapshots.contains_key(&id) && v.gc_marks.is_empty(),
        "{v:#?}"
    );
    assert!(v.vm_slabs(id).next().is_some(), "the placement stays");
    assert!(
        Pool::used(&v) >= remote * 4096,
        "servers hold {} bytes",
        Pool::used(&v)
    );

    // The restored VM finishes with the uninterrupted run's checksum, faulting its remote
    // pages from the pool; at its exit the pool drops them.
    let o = restore(&snap);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "farvm run --restore: {err}");
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_native_report(&report, WORKLOAD);
    let c = &report["paging"]["engine"]["counters"];
    assert!(c["demand_faults"].as_u64().unwrap_or(0) > 0, "{c}");
    pool.wait("the restored VM's pages dropped at its exit", |v| {
        v.vms.is_empty() && v.snapshots.is_empty() && v.slabs.is_empty() && Pool::used(v) == 0
    });

    // A pool snapshot is restored once.
    let o = restore(&snap);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(66), "{err}");
    assert!(err.contains("restored already"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn deleting_a_pool_snapshot_empties_the_servers() {
    if !kvm_available() {
        return;
    }
    let pool = Pool::start(&["r1", "r2"], "512M");
    let dir = scratch("delete");
    let sock = dir.join("vm.sock");
    let snap = dir.join("snap");
    let mut vm = start_vm(&pool, &format!("psdel-{}", std::process::id()), &sock);
    wait_for_measured_phase(&sock, &mut vm);
    let id = save(&pool, &sock, &snap, vm, None);
    assert!(Pool::used(&pool.dir.view().unwrap()) > 0);
    let delete = || {
        farvm()
            .args(["pool", "--etcd", &pool.url(), "snapshot-delete"])
            .arg(id.to_string())
            .output()
            .unwrap()
    };

    let o = delete();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "snapshot-delete: {err}");
    pool.wait("the servers emptied", |v| {
        v.snapshots.is_empty() && v.slabs.is_empty() && Pool::used(v) == 0
    });
    let o = delete();
    assert_eq!(o.status.code(), Some(1));
    let o = restore(&snap);
    assert_eq!(o.status.code(), Some(66));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_sealed_pool_snapshot_is_refused_without_its_key_and_stays_in_the_pool_until_restored_with_it()
{
    if !kvm_available() {
        return;
    }
    let pool = Pool::start(&["r1", "r2"], "512M");
    let dir = scratch("sealed");
    let sock = dir.join("vm.sock");
    let snap = dir.join("snap");
    let key = sealed::key_file(&dir, "snapshot.key", 0x5a);
    let wrong = sealed::key_file(&dir, "other.key", 0x33);
    let mut vm = start_vm(&pool, &format!("pseal-{}", std::process::id()), &sock);
    wait_for_measured_phase(&sock, &mut vm);
    let id = save(&pool, &sock, &snap, vm, Some(&key));

    // The page key is stored wrapped only; nothing of the guest's RAM or of the snapshot key
    // is readable in the directory.
    assert!(!snap.join("page.key").exists());
    let wrapped = std::fs::metadata(snap.join("page.key.sealed")).unwrap();
    assert_eq!(wrapped.permissions().mode() & 0o777, 0o600);
    assert_eq!(
        sealed::files_holding(&snap, &sealed::marker()),
        Vec::<String>::new()
    );
    assert!(sealed::files_holding(&snap, &[0x5a; 32]).is_empty());

    // Refused before anything is taken from the pool: the snapshot stays listed.
    let bin = Path::new(env!("CARGO_BIN_EXE_farvm"));
    let still_listed = |what: &str| {
        pool.wait(&format!("the snapshot still listed ({what})"), |v| {
            v.snapshots.contains_key(&id) && v.vms.is_empty()
        });
    };
    let (code, err) = sealed::refused_restore(bin, &snap, None);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("is sealed") && err.contains("--snapshot-key-file"),
        "{err}"
    );
    still_listed("no key");
    let (code, err) = sealed::refused_restore(bin, &snap, Some(&wrong));
    assert_eq!(code, Some(64), "{err}");
    assert!(err.contains("not under the key"), "{err}");
    still_listed("another key");
    for file in ["page.key.sealed", "remote.pages"] {
        let path = snap.join(file);
        sealed::flip_bit(&path, 5, 0);
        let (code, err) = sealed::refused_restore(bin, &snap, Some(&key));
        assert_eq!(code, Some(65), "{file} altered: {err}");
        assert!(
            err.contains("corrupt") && err.contains(file),
            "{file} altered: {err}"
        );
        still_listed(file);
        sealed::flip_bit(&path, 5, 0);
    }
    // A sealed snapshot keeps no clear list of its pages' fingerprints: it restores eagerly
    // only, and a lazy mode is refused before anything is taken from the pool.
    assert!(!snap.join("resident.pages").exists() && !snap.join("working-set.pages").exists());
    let err = refusal(
        farvm()
            .arg("run")
            .arg("--restore")
            .arg(&snap)
            .arg("--snapshot-key-file")
            .arg(&key)
            .args(["--restore-pages", "lazy", "--serial", "none"]),
        64,
    );
    assert!(
        err.contains("is sealed") && err.contains("eagerly only"),
        "{err}"
    );
    still_listed("a lazy mode");

    // With its key the VM finishes with the uninterrupted run's checksum.
    let o = sealed::restore(bin, &snap, Some(&key));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "farvm run --restore --snapshot-key-file: {err}"
    );
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_native_report(&report, WORKLOAD);
    pool.wait("the restored VM's pages dropped at its exit", |v| {
        v.vms.is_empty() && v.snapshots.is_empty() && Pool::used(v) == 0
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Restores `snap` with `--restore-pages mode`, under the control socket `sock`.
fn restore_running(snap: &Path, mode: &str, sock: &Path) -> Child {
    farvm()
        .arg("run")
        .arg("--restore")
        .arg(snap)
        .args(["--restore-pages", mode, "--serial", "none", "--json"])
        .arg("--control-socket")
        .arg(sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits until the VM at `sock` has made `pages` pages resident since its restore (its
/// guest runs on, touching its working set).
fn wait_for_touches(sock: &Path, vm: &mut Child, pages: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = vm.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(e) = vm.stderr.as_mut() {
                let _ = std::io::Read::read_to_string(e, &mut err);
            }
            panic!("the restored VM exited ({status}) before touching {pages} pages: {err}");
        }
        if let Ok(v) = farvm_vmm::control::request(sock, "stats") {
            let c = &v["paging"]["engine"]["counters"];
            let reads = c["demand_faults"].as_u64().unwrap_or(0);
            if reads >= pages {
                return;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the restored VM did not touch {pages} pages"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn finished_report(vm: Child) -> serde_json::Value {
    let out = vm.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "farvm run --restore: {err}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The restore modes that start the guest with nothing local, chained on one VM: saved mid
/// run, restored lazily (every resident page read from the page file on first touch), saved
/// again while it still has pages in the first snapshot's file (the save copies them), that
/// snapshot's recorded working set (the order the lazily restored guest touched its pages)
/// fetched before the guest runs, and a third round fetching it behind the running guest.
/// The workload verifies every word it reads and ends with the uninterrupted run's checksum.
#[test]
fn lazy_restores_fault_the_resident_pages_from_the_page_file_and_fetch_the_working_set() {
    if !kvm_available() {
        return;
    }
    let pool = Pool::start(&["r1", "r2"], "512M");
    let dir = scratch("lazy");
    let sock = dir.join("vm.sock");
    // Long enough that three saves and restores happen well before its end.
    let mut vm = start_vm_running(
        &pool,
        &format!("pslazy-{}", std::process::id()),
        &sock,
        LONG_WORKLOAD,
    );
    wait_for_measured_phase(&sock, &mut vm);
    let first = dir.join("first");
    save(&pool, &sock, &first, vm, None);
    let resident = std::fs::read(first.join("resident.pages")).unwrap();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(first.join("manifest.json")).unwrap()).unwrap();
    let written = manifest["memory"]["pages_written"].as_u64().unwrap();
    assert_eq!(
        resident.len() as u64,
        written * 24 + 16,
        "one record per page"
    );
    let ws = std::fs::read(first.join("working-set.pages")).unwrap();
    assert_eq!(
        ws.len() as u64,
        written * 8 + 16,
        "every resident page, in order"
    );

    // An unknown mode is refused before anything is read; the snapshot stays restorable.
    let o = farvm()
        .arg("run")
        .arg("--restore")
        .arg(&first)
        .args(["--restore-pages", "sideways", "--serial", "none"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("sideways"), "{err}");

    // Lazy: nothing loaded before the guest runs; every page it touches from the file.
    let sock2 = dir.join("vm2.sock");
    let mut vm = restore_running(&first, "lazy", &sock2);
    wait_for_touches(&sock2, &mut vm, 2000);
    let v = farvm_vmm::control::request(&sock2, "stats").unwrap();
    let lazy = &v["paging"]["lazy_restore"];
    assert!(lazy["page_file_reads"].as_u64().unwrap() > 0, "{v}");
    let c = &v["paging"]["engine"]["counters"];
    assert_eq!(
        c["remote_reads_prefetch"].as_u64(),
        Some(0),
        "prefetcher off: {c}"
    );
    let second = dir.join("second");
    let o = snapshot(&sock2, &second, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = finished_report(vm);
    assert_eq!(report["outcome"]["kind"], "snapshotted", "{report}");
    pool.wait("the second snapshot record", |v| v.snapshots.len() == 1);

    // The working set recorded since the lazy restore, fetched before the guest runs.
    let ws = std::fs::read(second.join("working-set.pages")).unwrap();
    let ws_pages = (ws.len() as u64 - 16) / 8;
    assert!(ws_pages > 0);
    let sock3 = dir.join("vm3.sock");
    let mut vm = restore_running(&second, "working-set", &sock3);
    wait_for_touches(&sock3, &mut vm, 1000);
    let v = farvm_vmm::control::request(&sock3, "stats").unwrap();
    let fetched = v["paging"]["lazy_restore"]["working_set_fetched"].as_u64();
    assert_eq!(fetched, Some(ws_pages), "{v}");
    let third = dir.join("third");
    let o = snapshot(&sock3, &third, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(finished_report(vm)["outcome"]["kind"], "snapshotted");
    pool.wait("the third snapshot record", |v| v.snapshots.len() == 1);

    // Behind the running guest, to the end of the workload.
    let sock4 = dir.join("vm4.sock");
    let report = finished_report(restore_running(&third, "working-set-async", &sock4));
    assert_native_report(&report, LONG_WORKLOAD);
    let lazy = &report["paging"]["lazy_restore"];
    assert!(
        lazy["working_set_fetched"].as_u64().unwrap() > 0,
        "{report}"
    );
    pool.wait("the restored VM's pages dropped at its exit", |v| {
        v.vms.is_empty() && v.snapshots.is_empty() && v.slabs.is_empty() && Pool::used(v) == 0
    });
    std::fs::remove_dir_all(&dir).unwrap();
}
