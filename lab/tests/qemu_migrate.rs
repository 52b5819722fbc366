//! `farvm-lab bench qemu-migrate` on this host: QEMU's pre-copy live migration and save to a
//! file of a small test guest must both end at the destination with the workload's native
//! checksum, and QEMU's account of what it moved must cover the working set the guest wrote.
//!
//! Needs /dev/kvm (`FARVM_SKIP_KVM=1` skips it) and qemu-system-x86_64 (Debian:
//! qemu-system-x86, installed by scripts/setup.sh).

use std::process::Command;

use serde_json::Value;

const WS: u64 = 16 << 20;

#[test]
fn qemus_migration_and_save_end_with_the_native_checksum() {
    if std::env::var("FARVM_SKIP_KVM").as_deref() == Ok("1") {
        eprintln!("FARVM_SKIP_KVM=1: skipping a test that needs /dev/kvm");
        return;
    }
    let dir = tempfile::tempdir().expect("scratch directory");
    // Enough passes that the workload is still running when the migration or save starts
    // (0.2 s into its measured phase) on a loaded host: a few seconds in all.
    let workload = format!("seq:ws={}M,passes=400,write=1,verify=1", WS >> 20);
    let o = Command::new(env!("CARGO_BIN_EXE_farvm-lab"))
        .args([
            "bench",
            "qemu-migrate",
            "--memory",
            "64M",
            "--settle",
            "0.2",
        ])
        .args(["--timeout", "300", "--workload", &workload])
        .arg("--out")
        .arg(dir.path())
        .arg("--work")
        .arg(dir.path())
        .output()
        .expect("spawn farvm-lab bench qemu-migrate");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    let report: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("qemu-migrate.json")).expect("qemu-migrate.json"),
    )
    .expect("JSON");
    let live = &report["live"][0];
    let save = &report["save"][0];
    for (what, row) in [("live", live), ("save", save)] {
        assert_eq!(row["workload"], workload.as_str(), "{what}: {row}");
        assert_eq!(
            row["result"]["checksum"], row["native_checksum"],
            "{what}: {row}"
        );
        // Every page of the working set was written before the measured phase: QEMU sends
        // each with its content (zero pages travel as a flag).
        let sent = row["result"]["stats"]["normal_pages"].as_u64().unwrap() * 4096;
        assert!(sent >= WS, "{what}: {sent} bytes of page content: {row}");
    }
    let file = save["result"]["bytes_written"].as_u64().unwrap();
    assert!(
        (WS..=(72 << 20)).contains(&file),
        "the saved file is {file} bytes: {save}"
    );
}
