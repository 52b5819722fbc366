//! `farvm-pool`'s exit statuses (EXIT STATUS in its `--help`): 69 when etcd does not answer,
//! with a message that does not claim to wait, and 64 for bad arguments.

use std::process::Command;

fn farvm_pool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_farvm-pool"))
}

#[test]
fn status_with_etcd_down_exits_69_saying_so() {
    // Nothing listens on the discard port of loopback: etcd is unreachable.
    let o = farvm_pool()
        .args(["--etcd", "http://127.0.0.1:9", "status"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(69), "{err}");
    assert!(err.contains("etcd unreachable at"), "{err}");
    assert!(!err.contains("waiting"), "it does not wait: {err}");
}

#[test]
fn bad_arguments_exit_64_and_help_documents_the_statuses() {
    let o = farvm_pool().args(["status", "--bogus"]).output().unwrap();
    assert_eq!(o.status.code(), Some(64));
    let o = farvm_pool().arg("--help").output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    let help = String::from_utf8_lossy(&o.stdout);
    assert!(help.contains("69  etcd did not answer"), "{help}");
}
