//! `--seccomp`: with filters on, the test guest runs on remote memory (the local memory
//! server filtered too, pages sealed, metrics served) to its native checksum, as it does with
//! them off; a forbidden call — `execve` from the fault handler, made by the sandbox's
//! self-test knob — ends the VMM with exit status 159 and a message naming the thread, its
//! class and the call; in `log` mode the same call is let through.

mod common;

use std::process::{Command, Output};

use common::{assert_native_report, kvm_available};
use farvm_vmm::exit_code;

const WORKLOAD: &str = "seq:ws=32M,passes=2";

/// `farvm run` of [`WORKLOAD`] with a quarter of guest RAM local (faults, evictions and
/// prefetches through the local memory server), sealed pages and a metrics endpoint.
fn run(seccomp: &str, selftest: Option<&str>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_farvm"));
    c.args([
        "run",
        "--memory",
        "80M",
        "--local-memory",
        "25%",
        "--workload",
        WORKLOAD,
        "--page-encryption",
        "on",
        "--metrics",
        "127.0.0.1:0",
        "--serial",
        "none",
        "--no-control-socket",
        "--json",
        "--seccomp",
        seccomp,
    ])
    .env_remove("FARVM_SECCOMP")
    .env_remove(farvm_sandbox::SELFTEST_ENV);
    if let Some(class) = selftest {
        c.env(farvm_sandbox::SELFTEST_ENV, class);
    }
    c.output().expect("spawn farvm")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn filters_on_and_off_run_the_guest_on_remote_memory_to_its_checksum() {
    if !kvm_available() {
        return;
    }
    for mode in ["on", "off"] {
        let o = run(mode, None);
        assert!(o.status.success(), "--seccomp {mode}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_native_report(&v, WORKLOAD);
        let c = &v["paging"]["engine"]["counters"];
        assert!(c["evictions"].as_u64().unwrap() > 1_000, "{mode}: {c}");
    }
}

#[test]
fn execve_from_the_fault_thread_ends_the_vmm_with_the_thread_and_the_call() {
    if !kvm_available() {
        return;
    }
    let o = run("on", Some("fault-handler"));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(exit_code::SECCOMP_DENIED), "{err}");
    assert!(
        err.contains(
            "farvm: seccomp: thread ept-fault (class fault-handler) made the forbidden \
             system call execve (59); exiting with status 159"
        ),
        "{err}"
    );
}

#[test]
fn every_thread_class_of_a_vm_traps_the_call() {
    if !kvm_available() {
        return;
    }
    // The classes a remote-memory VM's threads enter, each proven live by its own trap.
    for (class, thread) in [
        ("vcpu", "vcpu0"),
        ("evictor", "ept-evict"),
        ("store-connection", "memclient-"),
        ("metrics", "metrics"),
    ] {
        let o = run("on", Some(class));
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(159), "{class}: {err}");
        let want = format!("(class {class}) made the forbidden system call execve");
        assert!(err.contains(&want), "{class}: {err}");
        assert!(err.contains(&format!("thread {thread}")), "{class}: {err}");
    }
}

#[test]
fn the_local_memory_server_traps_a_forbidden_call_too() {
    if !kvm_available() {
        return;
    }
    // The server's connection thread dies with the message; the VMM loses its only server.
    let o = run("on", Some("memserver-connection"));
    let err = stderr(&o);
    assert!(
        err.contains(
            "farvm-memserver: seccomp: thread memserver-conn- (class memserver-connection) \
             made the forbidden system call execve"
        ),
        "{err}"
    );
    assert!(!o.status.success(), "{err}");
}

#[test]
fn log_mode_lets_the_forbidden_call_through() {
    if !kvm_available() {
        return;
    }
    let o = run("log", Some("fault-handler"));
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_native_report(&v, WORKLOAD);
}

#[test]
fn a_bad_mode_is_a_usage_error() {
    let o = Command::new(env!("CARGO_BIN_EXE_farvm"))
        .args(["run", "--seccomp", "strict"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(exit_code::USAGE), "{err}");
    assert!(err.contains("off, log or on"), "{err}");
}
