//! The memory pool under randomized faults, short form: `farvm-lab nemesis` runs 10 schedules
//! with the fixed seeds 1000-1009 (4 faults each over 10 s, 3 VMs with a verifying checksum
//! workload, 3 racks x 2 memory servers built by `scripts/cluster.sh`) and must report no
//! violated invariant. A failure prints the nemesis's summary: the seed, the invariant and the
//! command that replays it; the schedule's logs are kept in the directory it names.
//!
//! Needs root (network namespaces, veth, a bridge), iproute2, etcd (etcd-server), /dev/kvm
//! (`FARVM_SKIP_KVM=1` skips it) and the release binaries `farvm`, `farvm-memserver`,
//! `farvm-pool` and `farvm-delay-proxy` next to `farvm-lab` (`cargo build --release
//! --workspace --bins`; CI's `cargo test --workspace` builds them).

use std::path::Path;
use std::process::Command;

#[test]
fn ten_fixed_seeds_of_random_faults_violate_no_invariant() {
    if std::env::var("FARVM_SKIP_KVM").as_deref() == Ok("1") {
        eprintln!("FARVM_SKIP_KVM=1: skipping a test that needs /dev/kvm");
        return;
    }
    let logs = std::env::temp_dir().join(format!("farvm-nemesis-test-{}", std::process::id()));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/cluster.sh");
    let o = Command::new(env!("CARGO_BIN_EXE_farvm-lab"))
        .args(["nemesis", "--seed", "1000", "--schedules", "10"])
        .args(["--faults", "4", "--vms", "3", "--span", "10"])
        .args(["--workload", "seq:ws=24M,passes=40,write=1,verify=1"])
        .arg("--logs")
        .arg(&logs)
        .arg("--cluster-script")
        .arg(&script)
        .output()
        .expect("spawn farvm-lab nemesis");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    // The summary first: it names each failed seed, its invariant and its replay command.
    // Without root, network namespaces or /dev/kvm the nemesis stops at once and says which.
    assert_eq!(
        o.status.code(),
        Some(0),
        "{out}\nlogs kept in {}\n--- the nemesis's progress:\n{err}",
        logs.display()
    );
    assert!(
        out.contains("10 schedule(s), 10 passed, 0 failed."),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(&logs);
}
