//! The memory server's seccomp filters (`--seccomp`, docs/security.md): a filtered server
//! stores and returns a client's pages and serves its metrics, every one of its threads under
//! a filter and its connection threads under two; a forbidden call on a connection thread (the
//! sandbox's self-test knob: `execve`) ends it with status 159 and a message naming the thread,
//! its class and the call.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};

use common::{client, page_content};
use farvm_memproto::PAGE_SIZE;

/// `farvm-memserver --seccomp MODE` with metrics, and the addresses it prints.
fn spawn(mode: &str, selftest: Option<&str>) -> (Child, SocketAddr, SocketAddr) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_farvm-memserver"));
    c.args([
        "--listen",
        "127.0.0.1:0",
        "--capacity",
        "64M",
        "--metrics",
        "127.0.0.1:0",
        "--seccomp",
        mode,
    ])
    .env("RUST_LOG", "warn")
    .env_remove(farvm_sandbox::MODE_ENV)
    .env_remove(farvm_sandbox::SELFTEST_ENV)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    if let Some(class) = selftest {
        c.env(farvm_sandbox::SELFTEST_ENV, class);
    }
    let mut child = c.spawn().expect("spawn farvm-memserver");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut addr = |prefix: &str| {
        let mut line = String::new();
        out.read_line(&mut line).expect("a banner line");
        line.trim()
            .strip_prefix(prefix)
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("expected `{prefix}ADDR`, got {line:?}"))
    };
    let listen = addr("listening ");
    let metrics = addr("metrics ");
    (child, listen, metrics)
}

/// `Seccomp_filters` of each thread of `pid`, by thread name.
fn filters_per_thread(pid: u32) -> Vec<(String, u32)> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the server's threads");
    tasks
        .map(|t| {
            let dir = t.unwrap().path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap();
            let status = std::fs::read_to_string(dir.join("status")).unwrap();
            let filters = status
                .lines()
                .find_map(|l| l.strip_prefix("Seccomp_filters:"))
                .map_or(0, |n| n.trim().parse().unwrap());
            (comm.trim().to_string(), filters)
        })
        .collect()
}

#[test]
fn a_filtered_server_stores_pages_and_serves_metrics() {
    let (mut child, addr, metrics) = spawn("on", None);
    const PAGES: usize = 512;
    let c = client(&[addr]);
    let mut data = vec![0u8; PAGES * PAGE_SIZE];
    for (p, page) in data.chunks_mut(PAGE_SIZE).enumerate() {
        page_content(7, p as u64, 1, page);
    }
    c.write(7, 0, &data).expect("write");
    let mut back = vec![0u8; PAGES * PAGE_SIZE];
    c.read(7, 0, &mut back).expect("read");
    assert!(back == data, "pages came back changed");

    let mut s = TcpStream::connect(metrics).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    assert!(
        body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
        "{body}"
    );

    let threads = filters_per_thread(child.id());
    for (name, n) in &threads {
        // The process filter on every thread; a connection's and the metrics thread's own on top.
        let want = if name.starts_with("memserver-conn") || name == "memserver-metr" {
            2
        } else {
            1
        };
        assert!(*n >= want, "thread {name} has {n} filters: {threads:?}");
    }
    assert!(
        threads.iter().any(|(n, _)| n.starts_with("memserver-conn")),
        "{threads:?}"
    );
    drop(c);
    assert!(child.try_wait().unwrap().is_none(), "the server died");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn execve_on_a_connection_thread_ends_the_server_with_the_message() {
    let (mut child, addr, _) = spawn("on", Some("memserver-connection"));
    let _conn = TcpStream::connect(addr).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(farvm_sandbox::EXIT_STATUS), "{err}");
    assert!(
        err.contains(
            "farvm-memserver: seccomp: thread memserver-conn- (class memserver-connection) \
             made the forbidden system call execve (59)"
        ),
        "{err}"
    );
}

#[test]
fn without_filters_the_self_test_call_fails_harmlessly() {
    let (mut child, addr, _) = spawn("off", Some("memserver-connection"));
    let c = client(&[addr]);
    let mut page = vec![0u8; PAGE_SIZE];
    page_content(9, 0, 1, &mut page);
    c.write(9, 0, &page).expect("write");
    assert!(child.try_wait().unwrap().is_none(), "the server died");
    assert!(
        filters_per_thread(child.id()).iter().all(|(_, n)| *n == 0),
        "--seccomp off installed a filter"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
