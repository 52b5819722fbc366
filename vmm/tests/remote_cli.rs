//! `farvm run` on remote memory, end to end through the binary: the default local memserver (a
//! child process that dies with farvm), `farvm stats` showing the paging engine live, the
//! Prometheus endpoint, the exit summary, and clear errors for bad remote-memory arguments.

mod common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::{alive, assert_native_report, farvm, kvm_available, memserver_children};

#[test]
fn bad_remote_arguments_are_usage_errors() {
    for (args, want) in [
        (vec!["run", "--local-memory", "0%"], "local-memory"),
        (vec!["run", "--local-memory", "12Q"], "local-memory"),
        (
            vec!["run", "--prefetcher", "oracle"],
            "--prefetcher: unknown prefetcher `oracle`",
        ),
        (
            vec!["run", "--memserver", "127.0.0.1:1", "--replicas", "3"],
            "--replicas 3",
        ),
        (
            vec!["run", "--local-only", "--memserver", "127.0.0.1:1"],
            "cannot be used with",
        ),
        (
            vec!["run", "--memserver", "no-such-host.invalid:7070"],
            "cannot resolve",
        ),
        (vec!["run", "--memserver", "memsrv1"], "expected HOST:PORT"),
        (vec!["run", "--probe-every", "many"], "--probe-every"),
        (vec!["run", "--guest-memory", "shmem"], "--guest-memory"),
    ] {
        let o = farvm().args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn anonymous_guest_memory_pages_a_workload_to_its_checksum() {
    if !kvm_available() {
        return;
    }
    // Guest RAM whose pages move with UFFDIO_MOVE, through evictions and prefetched reads.
    let workload = "seq:ws=32M,passes=3";
    let o = farvm()
        .args([
            "run",
            "--memory",
            "80M",
            "--local-memory",
            "25%",
            "--workload",
            workload,
            "--guest-memory",
            "anon",
            "--serial",
            "none",
            "--json",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_native_report(&v, workload);
    let c = &v["paging"]["engine"]["counters"];
    assert!(c["evictions"].as_u64().unwrap() > 10_000, "{c}");
    assert!(c["remote_reads_prefetch"].as_u64().unwrap() > 10_000, "{c}");
}

#[test]
fn unreachable_memserver_is_a_clear_host_error() {
    if !kvm_available() {
        return;
    }
    // Port 1 on loopback: nothing listens there, by address or by host name (resolved).
    for server in ["127.0.0.1:1", "localhost:1"] {
        let o = farvm()
            .args(["run", "--memserver", server, "--no-control-socket"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(71), "{server}: {err}");
        assert!(err.contains("memory servers"), "{server}: {err}");
    }
}

#[test]
fn a_missing_memserver_binary_is_a_clear_host_error() {
    if !kvm_available() {
        return;
    }
    let missing = std::env::temp_dir().join("farvm-no-such-memserver");
    let o = farvm()
        .args(["run", "--no-control-socket"])
        .env("FARVM_MEMSERVER_BIN", &missing)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(71), "{err}");
    assert!(
        err.contains(&*missing.to_string_lossy()) && err.contains("does not exist"),
        "{err}"
    );
}

/// The memserver children of process `pid` (their pids).
#[test]
fn the_local_memserver_dies_with_farvm() {
    if !kvm_available() {
        return;
    }
    let mut child = farvm()
        .args([
            "run",
            "--no-control-socket",
            "--memory",
            "64M",
            "--workload",
            "seq:ws=32M,passes=1000",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let server = loop {
        if let Some(&p) = memserver_children(child.id()).first() {
            break p;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "farvm started no memserver"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    let t0 = Instant::now();
    while alive(server) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "memserver {server} outlived its farvm"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn run_pages_remotely_with_live_stats_and_metrics() {
    if !kvm_available() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("farvm-remote-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("remote.sock");
    let mut child = farvm()
        .args([
            "run",
            "--memory",
            "160M",
            "--local-memory",
            "25%",
            "--workload",
            "seq:ws=96M,passes=30",
            "--name",
            "remote-cli",
            "--control-socket",
            sock.to_str().unwrap(),
            "--metrics",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The metrics address is announced on stderr before the guest runs.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let addr: std::net::SocketAddr = loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "no metrics line");
        if let Some(rest) = line.trim().strip_prefix("farvm: metrics on http://") {
            break rest.trim_end_matches("/metrics").parse().unwrap();
        }
    };
    let err_thread = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });
    // Live: the control socket's stats carry the engine's counters once the guest faults.
    let t0 = Instant::now();
    let v = loop {
        let o = farvm()
            .args(["stats", "--socket", sock.to_str().unwrap(), "--json"])
            .output()
            .unwrap();
        if o.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            if v["paging"]["engine"]["counters"]["evictions"].as_u64() > Some(0) {
                break v;
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no paging stats with evictions on the control socket"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(v["paging"]["engine"]["prefetcher"], "leap+stream");
    assert_eq!(v["paging"]["remote"]["embedded"], true);
    let text = farvm()
        .args(["stats", "--socket", sock.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).into_owned();
    assert!(text.contains("paging: prefetcher leap+stream"), "{text}");
    let farvm_httpd::client::Response { status, body, .. } =
        farvm_httpd::client::get(&farvm_httpd::BoundAddr::Tcp(addr), "/metrics").unwrap();
    assert_eq!(status, 200);
    for series in [
        "farvm_ept_demand_faults_total{vm=\"remote-cli\"}",
        "farvm_ept_fault_service_seconds{vm=\"remote-cli\",quantile=\"0.99\"}",
        "farvm_ept_prefetch_coverage{vm=\"remote-cli\"}",
        "farvm_memservers{vm=\"remote-cli\"} 1",
        "farvm_vm_exits_total{vm=\"remote-cli\"}",
    ] {
        assert!(body.contains(series), "missing {series} in:\n{body}");
    }
    let t1 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(240),
            "farvm run did not finish"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    let err_rest = err_thread.join().unwrap();
    assert!(status.success(), "{out}\n{err_rest}");
    assert!(
        out.contains("paging: prefetcher leap+stream, local budget"),
        "{out}"
    );
    assert!(out.contains("(embedded)"), "{out}");
    assert!(out.contains(" seq ") && out.contains(" done "), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}
