//! `farvm snapshot` and `farvm run --restore`, end to end through the binary: a verifying scan
//! on remote memory (25% local, so most of its pages live on the embedded memory server) is
//! saved in its measured phase, the first VMM exits, and the restored VM finishes with the
//! checksum the uninterrupted (native) run computes; a missing, corrupt or other-version
//! snapshot is a named error with its documented exit status.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{assert_native_report, kvm_available, wait_for_measured_phase};

/// Read-modify-write passes that check every word they read: a page restored wrong fails the
/// run, naming the word.
const WORKLOAD: &str = "seq:ws=32M,passes=80,write=1,verify=1";

fn farvm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_farvm"))
}

/// A fresh scratch directory for one test.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("farvm-snapshot-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_vm_saved_mid_run_resumes_and_finishes_with_the_native_checksum() {
    if !kvm_available() {
        return;
    }
    let dir = scratch("mid-run");
    let sock = dir.join("vm.sock");
    let snap = dir.join("snap");
    let name = format!("snap-{}", std::process::id());
    let mut first = farvm()
        .args([
            "run",
            "--name",
            &name,
            "--memory",
            "80M",
            "--local-memory",
            "25%",
        ])
        .args(["--workload", WORKLOAD, "--serial", "none", "--json"])
        .arg("--control-socket")
        .arg(&sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_measured_phase(&sock, &mut first);

    // A save that fails after the pause (its page file cannot be created) says why and
    // leaves the VM running.
    let blocked = dir.join("blocked");
    std::fs::create_dir_all(blocked.join("memory.pages")).unwrap();
    let o = farvm()
        .arg("snapshot")
        .arg("--socket")
        .arg(&sock)
        .arg(&blocked)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(71), "{err}");
    assert!(
        err.contains("cannot write") && err.contains("memory.pages"),
        "{err}"
    );
    let status = farvm_vmm::control::request(&sock, "status").unwrap();
    assert_eq!(status["state"], "running", "{status}");
    assert!(!blocked.join("manifest.json").exists());

    let o = farvm()
        .arg("snapshot")
        .arg("--socket")
        .arg(&sock)
        .arg(&snap)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "farvm snapshot: {err}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("saved to"));

    // The saved VM stops, as `virsh save` expects: its run ends with status 0 and the
    // workload unfinished.
    let out = first.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let saved: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(saved["outcome"]["kind"], "snapshotted", "{saved}");
    assert_eq!(saved["processes"][0]["state_name"], "running", "{saved}");
    assert!(snap.join("manifest.json").is_file() && snap.join("memory.pages").is_file());

    // A full copy (no pool) restores eagerly only: a lazy mode is refused before the VM is
    // built, naming the flag.
    let o = farvm()
        .arg("run")
        .arg("--restore")
        .arg(&snap)
        .args(["--restore-pages", "lazy", "--serial", "none"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(
        err.contains("--restore-pages lazy") && err.contains("eagerly only"),
        "{err}"
    );

    let o = farvm()
        .arg("run")
        .arg("--restore")
        .arg(&snap)
        .args(["--serial", "none", "--json", "--no-control-socket"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "farvm run --restore: {err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_native_report(&v, WORKLOAD);
    // The restored VM runs on remote memory again: it faulted its pages back in.
    let c = &v["paging"]["engine"]["counters"];
    assert!(c["evictions"].as_u64().unwrap() > 0, "{c}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_snapshots_are_named_errors_with_their_exit_status() {
    let dir = scratch("bad");
    let restore = |d: &Path| {
        let o = farvm()
            .arg("run")
            .arg("--restore")
            .arg(d)
            .args(["--serial", "none"])
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let (code, err) = restore(&dir.join("missing"));
    assert_eq!(code, Some(66), "{err}");
    assert!(
        err.contains("no snapshot at") && err.contains("no such directory"),
        "{err}"
    );

    let (code, err) = restore(&dir);
    assert_eq!(code, Some(66), "{err}");
    assert!(err.contains("no manifest.json"), "{err}");

    std::fs::write(dir.join("manifest.json"), "{\"format\":\"farvm-snapshot\",").unwrap();
    let (code, err) = restore(&dir);
    assert_eq!(code, Some(65), "{err}");
    assert!(err.contains("corrupt") && err.contains("not JSON"), "{err}");

    std::fs::write(
        dir.join("manifest.json"),
        r#"{"format":"farvm-snapshot","version":3}"#,
    )
    .unwrap();
    let (code, err) = restore(&dir);
    assert_eq!(code, Some(65), "{err}");
    assert!(err.contains("format version 3"), "{err}");

    // --restore takes the VM's description from the snapshot.
    let o = farvm()
        .arg("run")
        .arg("--restore")
        .arg(&dir)
        .args(["--memory", "1G"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(64));
    std::fs::remove_dir_all(&dir).unwrap();
}
