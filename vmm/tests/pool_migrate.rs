//! Live migration of pool VMs, end to end through the binary against a real etcd and real
//! `farvm-memserver --pool` processes: a VM at 25% local migrated mid-workload moves its
//! resident pages only (bytes sent close to the resident pages' bytes), leaves its remote
//! pages in the pool, and finishes at the destination with the uninterrupted run's checksum,
//! the pool listing one VM on one host; a destination under another key is refused before
//! anything moves; a destination that dies after receiving the VM (before it took the
//! namespace over) leaves the VM running at the source, which finishes with the right
//! checksum; a VM migrated right after a lazy restore sends the pages still in its
//! snapshot's page file; and no page leaks.

mod common;
#[path = "common/pool.rs"]
mod pool_harness;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use common::{assert_native_report, farvm, kvm_available, refusal, wait_for_measured_phase};
use pool_harness::Pool;

/// Read-modify-write passes over 96 MiB that check every word they read.
const WORKLOAD: &str = "seq:ws=96M,passes=6,write=1,verify=1";
/// The VM's resident budget: 25% of 128 MiB.
const LOCAL_BYTES: u64 = 32 << 20;

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("farvm-migrate-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn key_file(dir: &Path, name: &str, byte: u8) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, [byte; 32]).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// The source: a 128 MiB test guest at 25% local on `pool`, running [`WORKLOAD`], with a
/// failure injected (`FARVM_MIGRATION_FAULT`) if `fault` says so.
fn start_source_with(pool: &Pool, name: &str, sock: &Path, fault: Option<&str>) -> Child {
    let mut cmd = farvm();
    if let Some(f) = fault {
        cmd.env("FARVM_MIGRATION_FAULT", f);
    }
    // etcd paused for seconds must not outlast the lease (tests that pause it).
    let ttl = if fault.is_some() { "10" } else { "2" };
    cmd.args(["run", "--name", name, "--pool", &pool.url()])
        .args(["--pool-lease-ttl", ttl, "--pool-slab", "32M"])
        .args(["--memory", "128M", "--local-memory", "25%"])
        .args(["--workload", WORKLOAD, "--serial", "none", "--json"])
        .arg("--control-socket")
        .arg(sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The destination, waiting on a free loopback port; returns it with the address it
/// listens on (read from its stderr, which is drained in the background afterwards).
fn start_destination(name: &str, key: &Path, dir: &Path) -> (Child, String) {
    start_destination_with(name, key, dir, None)
}

/// [`start_destination`] with a failure injected (`FARVM_MIGRATION_FAULT`).
fn start_destination_with(
    name: &str,
    key: &Path,
    dir: &Path,
    fault: Option<&str>,
) -> (Child, String) {
    let mut cmd = farvm();
    if let Some(f) = fault {
        cmd.env("FARVM_MIGRATION_FAULT", f);
    }
    let mut child = cmd
        .args(["run", "--incoming", "127.0.0.1:0", "--migration-key-file"])
        .arg(key)
        .arg("--incoming-dir")
        .arg(dir.join("incoming"))
        .args([
            "--name",
            name,
            "--serial",
            "none",
            "--json",
            "--no-control-socket",
        ])
        .env("FARVM_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let addr = loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("the destination exited before listening: {seen}");
        }
        seen.push_str(&line);
        if let Some(a) = line
            .trim()
            .strip_prefix("farvm: waiting for a migrating VM on ")
        {
            break a.to_string();
        }
    };
    // Written as it comes (`NAME.stderr.part`), renamed once the pipe closes.
    let part = dir.join(format!("{name}.stderr.part"));
    let log = dir.join(format!("{name}.stderr"));
    std::thread::spawn(move || {
        use std::io::Write;
        let Ok(mut f) = std::fs::File::create(&part) else {
            return;
        };
        let _ = f.write_all(seen.as_bytes());
        for line in err.lines().map_while(Result::ok) {
            let _ = writeln!(f, "{line}");
        }
        drop(f);
        let _ = std::fs::rename(part, log);
    });
    (child, addr)
}

/// Asserts that a VMM exited 0 with its workload's native checksum (`context` says which,
/// with its log).
fn assert_finished_native(out: &std::process::Output, context: &str) {
    assert!(out.status.success(), "{context}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_native_report(&report, WORKLOAD);
}

/// Waits for the pool to hold no VM, no slab and no page (`what` names the event).
fn assert_pool_empty(pool: &Pool, what: &str) {
    pool.wait(what, |v| {
        v.vms.is_empty() && v.slabs.is_empty() && Pool::used(v) == 0
    });
}

/// The stderr of the exited destination `name` (written once its pipe closed).
fn dest_log(dir: &Path, name: &str) -> String {
    let path = dir.join(format!("{name}.stderr"));
    for _ in 0..200 {
        if let Ok(s) = std::fs::read_to_string(&path) {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    String::new()
}

fn migrate(sock: &Path, to: &str, key: &Path) -> std::process::Output {
    farvm()
        .args(["migrate", "--json", "--socket"])
        .arg(sock)
        .args(["--to", to, "--key-file"])
        .arg(key)
        .output()
        .unwrap()
}

/// A pool, a scratch directory, its migration key and a source VM in its measured phase:
/// `(pool, dir, control socket, key file, source, the VM's pool id)`.
fn setup(
    tag: &str,
    name: &str,
    fault: Option<&str>,
) -> (Pool, PathBuf, PathBuf, PathBuf, Child, farvm_pool::VmId) {
    let pool = Pool::start(&["r1", "r2", "r3"], "512M");
    let dir = scratch(tag);
    let sock = dir.join("src.sock");
    let key = key_file(&dir, "migration.key", 7);
    let name = format!("{name}-{}", std::process::id());
    let mut src = start_source_with(&pool, &name, &sock, fault);
    wait_for_measured_phase(&sock, &mut src);
    let admitted = pool.wait("the VM admitted", |v| v.vms.len() == 1);
    let id = *admitted.vms.keys().next().unwrap();
    (pool, dir, sock, key, src, id)
}

#[test]
fn a_pool_vm_migrated_mid_run_moves_its_resident_pages_only_and_finishes_there() {
    if !kvm_available() {
        return;
    }
    let (pool, dir, sock, key, src, id) = setup("live", "pmig-src", None);

    // Under another key: refused before anything moves; the VM runs on at the source.
    let wrong = key_file(&dir, "wrong.key", 8);
    let (mut dst, addr) = start_destination("pmig-wrong", &wrong, &dir);
    let o = migrate(&sock, &addr, &key);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(71), "{err}");
    assert!(err.contains("not authentic"), "{err}");
    let status = farvm_vmm::control::request(&sock, "status").unwrap();
    assert_eq!(status["state"], "running", "{status}");
    let _ = dst.kill();
    let _ = dst.wait();

    let (dst, addr) = start_destination("pmig-dst", &key, &dir);
    let o = migrate(&sock, &addr, &key);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "farvm migrate: {err}");
    let m: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    eprintln!("migration: {m}");
    assert_eq!(m["confirmed"], true, "{m}");
    let resident = m["resident_pages"].as_u64().unwrap();
    let remote = m["remote_pages"].as_u64().unwrap();
    let sent = m["bytes_sent"].as_u64().unwrap();
    assert!(resident * 4096 <= LOCAL_BYTES + (1 << 20), "{m}");
    assert!(remote * 4096 >= 48 << 20, "{m}");
    // Only the local part moved: far less than guest RAM (the rounds re-send the pages the
    // guest rewrites meanwhile; the bound is loose for a loaded host).
    assert!(sent < 4 * LOCAL_BYTES, "{sent} bytes sent: {m}");

    let out = src.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "the source: {err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"]["kind"], "migrated", "{report}");

    // One VM, under the same id, on one host; the destination finishes with the
    // uninterrupted run's checksum, and at its exit the pool drops every page.
    let v = pool.dir.view().unwrap();
    assert_eq!(v.vms.len(), 1, "{:?}", v.vms);
    assert!(v.vms.contains_key(&id) && v.snapshots.is_empty());
    let out = dst.wait_with_output().unwrap();
    let log = dest_log(&dir, "pmig-dst");
    assert_finished_native(&out, &format!("the destination: {log}"));
    assert_pool_empty(&pool, "the migrated VM's pages dropped at its exit");
    assert!(
        !dir.join("incoming").exists(),
        "the key's directory is removed"
    );
    if std::env::var_os("FARVM_KEEP_TEST_DIR").is_none() {
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn a_destination_that_dies_before_the_takeover_leaves_the_vm_running_at_its_source() {
    if !kvm_available() {
        return;
    }
    let (pool, dir, sock, key, src, id) = setup("crash", "pmig-crash", None);

    let (mut dst, addr) =
        start_destination_with("pmig-crashed", &key, &dir, Some("crash-before-takeover"));
    let o = migrate(&sock, &addr, &key);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(71), "{err}");
    assert!(err.contains("the destination failed"), "{err}");
    assert_eq!(dst.wait().unwrap().code(), Some(71));
    let status = farvm_vmm::control::request(&sock, "status").unwrap();
    assert_eq!(status["state"], "running", "{status}");
    let v = pool.dir.view().unwrap();
    assert_eq!(v.vms.len(), 1);
    assert!(v.vms.contains_key(&id), "the source owns it: {v:#?}");

    // It runs on at the source to the uninterrupted run's checksum; nothing leaks.
    let out = src.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_finished_native(&out, &format!("the source: {err}"));
    assert_pool_empty(&pool, "the VM's pages dropped at its exit");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_lost_answer_after_the_takeover_stops_the_source_and_the_vm_runs_at_the_destination() {
    if !kvm_available() {
        return;
    }
    let (pool, dir, sock, key, src, id) = setup("silent", "pmig-silent", None);

    let (dst, addr) =
        start_destination_with("pmig-silent", &key, &dir, Some("no-answer-after-takeover"));
    let o = migrate(&sock, &addr, &key);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "farvm migrate: {err}");
    let m: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(m["confirmed"], false, "{m}");
    let out = src.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"]["kind"], "migrated", "{report}");

    // Exactly one VM, the destination's, which finishes with the right checksum.
    let v = pool.dir.view().unwrap();
    assert_eq!(v.vms.len(), 1);
    assert!(v.vms.contains_key(&id));
    let out = dst.wait_with_output().unwrap();
    let log = dest_log(&dir, "pmig-silent");
    assert_finished_native(&out, &format!("the destination: {log}"));
    assert_pool_empty(&pool, "the VM's pages dropped at its exit");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_source_that_dies_mid_stream_ends_the_destination_with_the_reason_and_leaks_nothing() {
    if !kvm_available() {
        return;
    }
    let (pool, dir, sock, key, mut src, _) = setup(
        "srccrash",
        "pmig-srccrash",
        Some("source-crash-before-pause"),
    );
    let (dst, addr) = start_destination("pmig-orphan", &key, &dir);
    let o = migrate(&sock, &addr, &key);
    assert!(!o.status.success(), "farvm migrate succeeded");
    assert_eq!(src.wait().unwrap().code(), Some(71));
    let out = dst.wait_with_output().unwrap();
    let log = dest_log(&dir, "pmig-orphan");
    assert_eq!(out.status.code(), Some(71), "{log}");
    assert!(
        log.contains("incoming migration: receiving from the other host"),
        "{log}"
    );
    // The source's lease (2 s) expires and the servers collect its namespace.
    assert_pool_empty(&pool, "the dead VM's pages collected");
    assert!(
        !dir.join("incoming").exists(),
        "the key's directory is removed"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_network_cut_mid_stream_leaves_the_vm_running_at_its_source() {
    if !kvm_available() {
        return;
    }
    let (pool, dir, sock, key, src, id) = setup("cut", "pmig-cut", None);
    let (dst, addr) = start_destination("pmig-cut", &key, &dir);
    // The link between the hosts: forwards the stream, and breaks both ways after 4 MiB.
    let link = cut_after(&addr, 4 << 20);
    let o = migrate(&sock, &link, &key);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(71), "{err}");
    let status = farvm_vmm::control::request(&sock, "status").unwrap();
    assert_eq!(status["state"], "running", "{status}");
    let out = dst.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(71));
    let v = pool.dir.view().unwrap();
    assert_eq!(v.vms.len(), 1);
    assert!(v.vms.contains_key(&id));
    let out = src.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_finished_native(&out, &format!("the source: {err}"));
    assert_pool_empty(&pool, "the VM's pages dropped at its exit");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A TCP relay to `to` on a new loopback port (returned) that shuts both directions of its
/// one connection down after `limit` bytes from the client: a network cut.
fn cut_after(to: &str, limit: u64) -> String {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let to = to.to_string();
    std::thread::spawn(move || {
        let (mut client, _) = l.accept().unwrap();
        let server = TcpStream::connect(&to).unwrap();
        let (mut s_read, mut c_write) = (server.try_clone().unwrap(), client.try_clone().unwrap());
        let back = std::thread::spawn(move || {
            let _ = std::io::copy(&mut s_read, &mut c_write);
        });
        let mut server_w = server.try_clone().unwrap();
        let mut buf = [0u8; 65536];
        let mut passed = 0u64;
        while passed < limit {
            let n = match client.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if server_w.write_all(&buf[..n]).is_err() {
                break;
            }
            passed += n as u64;
        }
        let _ = client.shutdown(Shutdown::Both);
        let _ = server.shutdown(Shutdown::Both);
        let _ = back.join();
    });
    addr
}

#[test]
fn etcd_paused_during_the_handover_leaves_exactly_one_vm_running() {
    if !kvm_available() {
        return;
    }
    let (pool, dir, sock, key, src, id) = setup("etcd", "pmig-etcd", Some("none"));
    let (dst, addr) =
        start_destination_with("pmig-etcd-dst", &key, &dir, Some("stall-before-takeover"));
    let (sock2, addr2, key2) = (sock.clone(), addr.clone(), key.clone());
    let migration = std::thread::spawn(move || migrate(&sock2, &addr2, &key2));
    // The VM has arrived and the guest is paused at the source: etcd stops answering for
    // 5 s, across the destination's takeover and the source's fallback.
    let part = dir.join("pmig-etcd-dst.stderr.part");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !std::fs::read_to_string(&part)
        .unwrap_or_default()
        .contains("stall-before-takeover")
    {
        assert!(std::time::Instant::now() < deadline, "the VM never arrived");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let etcd = pool.etcd.pid().unwrap() as i32;
    // SAFETY: kill(2) on the etcd this test started; no memory is involved.
    unsafe { libc::kill(etcd, libc::SIGSTOP) };
    std::thread::sleep(std::time::Duration::from_secs(5));
    // SAFETY: as above.
    unsafe { libc::kill(etcd, libc::SIGCONT) };
    let o = migration.join().unwrap();
    let src_out = src.wait_with_output().unwrap();
    let dst_out = dst.wait_with_output().unwrap();
    let log = dest_log(&dir, "pmig-etcd-dst");
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("farvm migrate: exit {:?}: {err}", o.status.code());
    // Exactly one of the two ran the VM to its end, with the uninterrupted run's checksum.
    let (ran, stopped) = if o.status.success() {
        (&dst_out, &src_out)
    } else {
        (&src_out, &dst_out)
    };
    assert!(ran.status.success(), "{log}");
    let report: serde_json::Value = serde_json::from_slice(&ran.stdout).unwrap();
    assert_native_report(&report, WORKLOAD);
    if o.status.success() {
        let r: serde_json::Value = serde_json::from_slice(&stopped.stdout).unwrap();
        assert_eq!(r["outcome"]["kind"], "migrated", "{r}");
    } else {
        assert_eq!(stopped.status.code(), Some(71), "{log}");
    }
    let v = pool.dir.view().unwrap();
    assert!(v.vms.len() <= 1 && (v.vms.is_empty() || v.vms.contains_key(&id)));
    assert_pool_empty(&pool, "the VM's pages dropped at its exit");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_migrations_are_refused_with_the_reason_and_the_vm_runs_on() {
    if !kvm_available() {
        return;
    }
    let dir = scratch("bad");
    let key = key_file(&dir, "migration.key", 7);
    // A key file others can read is refused at the destination before it listens.
    let open = dir.join("open.key");
    std::fs::write(&open, [1u8; 32]).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = refusal(
        farvm()
            .args(["run", "--incoming", "127.0.0.1:0", "--migration-key-file"])
            .arg(&open),
        64,
    );
    assert!(
        err.contains("--migration-key-file") && err.contains("open.key"),
        "{err}"
    );

    // A VM whose remote memory is not in a pool is refused before it is paused.
    let sock = dir.join("local.sock");
    let mut vm = farvm()
        .args([
            "run",
            "--name",
            &format!("pmig-local-{}", std::process::id()),
        ])
        .args(["--memory", "64M", "--local-memory", "50%"])
        // Long enough (seconds) to be still running when the refusals below are checked.
        .args(["--workload", "seq:ws=32M,passes=40,write=1,verify=1"])
        .args(["--serial", "none", "--json", "--control-socket"])
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_measured_phase(&sock, &mut vm);
    let o = migrate(&sock, "127.0.0.1:9", &key);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(71), "{err}");
    assert!(err.contains("memory pool"), "{err}");
    // A relative key path is refused too (the VMM's working directory is not the client's:
    // `farvm migrate` makes it absolute, the control command checks).
    let r = farvm_vmm::control::request(&sock, "migrate 127.0.0.1:9 relative.key");
    assert!(r.is_err(), "{r:?}");
    let status = farvm_vmm::control::request(&sock, "status").unwrap();
    assert_eq!(status["state"], "running", "{status}");
    let out = vm.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A VM restored with nothing local still has its resident pages in its snapshot's page
/// file, on no server: migrated at once, it sends them from the file, and the destination
/// finishes with the uninterrupted run's checksum (a page left behind would be read stale or
/// absent from the pool, and the verifying workload, or the engine's check, would say so).
#[test]
fn a_lazily_restored_vm_migrates_with_the_pages_still_in_its_snapshot() {
    if !kvm_available() {
        return;
    }
    let (pool, dir, sock, key, src, _) = setup("lazy", "pmig-lazy", None);
    let snap = dir.join("snap");
    let o = farvm()
        .args(["snapshot", "--socket"])
        .arg(&sock)
        .arg(&snap)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(src.wait_with_output().unwrap().status.success());
    pool.wait("the snapshot record", |v| v.snapshots.len() == 1);

    let sock2 = dir.join("restored.sock");
    let mut restored = farvm()
        .arg("run")
        .arg("--restore")
        .arg(&snap)
        .args(["--restore-pages", "lazy", "--serial", "none", "--json"])
        .arg("--control-socket")
        .arg(&sock2)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stats = loop {
        if let Ok(v) = farvm_vmm::control::request(&sock2, "stats") {
            break v;
        }
        assert!(restored.try_wait().unwrap().is_none(), "the restore exited");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    eprintln!(
        "pages read from the page file before the migration: {}",
        stats["paging"]["lazy_restore"]["page_file_reads"]
    );
    let (dst, addr) = start_destination("pmig-lazy-dst", &key, &dir);
    let o = migrate(&sock2, &addr, &key);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = restored.wait_with_output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["outcome"]["kind"], "migrated", "{report}");
    let out = dst.wait_with_output().unwrap();
    let log = dest_log(&dir, "pmig-lazy-dst");
    assert_finished_native(&out, &format!("the destination: {log}"));
    assert_pool_empty(&pool, "the migrated VM's pages dropped at its exit");
    std::fs::remove_dir_all(&dir).unwrap();
}
