//! The `farvm-lab` binary: documented exit statuses for bad options, and help texts that say
//! what each command writes where.

use std::process::{Command, Output};

use farvm_vmm::exit_code;

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farvm-lab"))
        .args(args)
        .output()
        .expect("spawn farvm-lab")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn bad_arguments_exit_64() {
    for (args, needle) in [
        (
            vec!["bench", "remote", "--repeat", "0"],
            "0 is not in 1..=15",
        ),
        (vec!["bench", "nosuch"], "nosuch"),
        (vec!["trace", "eval", "--bogus-flag"], "--bogus-flag"),
        (
            vec!["nemesis", "--kinds", "server-kill,nosuch"],
            "unknown fault kind `nosuch`",
        ),
        (vec!["nemesis", "--schedules", "0"], "--schedules"),
        (vec!["fuzz", "--iterations", "0"], "--iterations"),
    ] {
        let o = run(&args);
        assert_eq!(
            o.status.code(),
            Some(exit_code::USAGE),
            "{args:?}: {}",
            stderr(&o)
        );
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn help_documents_commands_outputs_and_exit_status() {
    let o = run(&["--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for needle in ["bench", "trace"] {
        assert!(
            stdout(&o).contains(needle),
            "missing {needle}: {}",
            stdout(&o)
        );
    }
    let o = run(&["bench", "remote", "--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for needle in [
        "EXIT STATUS",
        "EXAMPLES",
        "farvm-lab bench remote",
        "docs/bench/remote",
    ] {
        assert!(
            stdout(&o).contains(needle),
            "missing {needle}: {}",
            stdout(&o)
        );
    }
    for cmd in [
        "local",
        "placement",
        "page-space",
        "page-cycle",
        "stage2",
        "compare",
        "pool",
    ] {
        let o = run(&["bench", cmd, "--help"]);
        assert!(o.status.success(), "{cmd}: {}", stderr(&o));
        assert!(stdout(&o).contains("EXIT STATUS"), "{cmd}: {}", stdout(&o));
    }
}

#[test]
fn nemesis_help_names_every_fault_kind_invariant_and_how_to_replay() {
    let o = run(&["nemesis", "--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for needle in [
        "etcd-pause",
        "etcd-restart",
        "partition",
        "server-kill",
        "server-pause",
        "server-restart-empty",
        "server-restart-same-id",
        "vmm-pause",
        "vmm-kill",
        "drain",
        "rebalance",
        "no leak",
        "nothing hung",
        "--seed S --schedules 1",
        "EXAMPLES",
        "EXIT STATUS",
    ] {
        assert!(
            stdout(&o).contains(needle),
            "missing {needle}: {}",
            stdout(&o)
        );
    }
}

#[test]
fn pool_bench_refuses_empty_counts_before_starting_anything() {
    // A usage error (status 64), for either list.
    for opt in ["--vms", "--servers"] {
        let o = run(&["bench", "pool", opt, "1,0", "--out", "/nonexistent/pool"]);
        assert_eq!(o.status.code(), Some(64), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("`0` is not a count of at least 1"),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn a_failed_run_exits_1() {
    // A bench whose options parse but name no known prefetcher fails before any VM starts.
    let o = run(&[
        "bench",
        "remote",
        "--prefetcher",
        "nosuch",
        "--out",
        "/nonexistent/x",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("unknown --prefetcher `nosuch`"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn compare_refuses_bad_options_before_touching_the_host() {
    for (args, needle) in [
        (
            vec!["--swap", "nfs"],
            "--swap nfs: expected zram, loop, nbd, both (zram and loop), all or none",
        ),
        (
            vec!["--local", "100"],
            "--local 100: must be a percentage in (0, 100)",
        ),
        (
            vec!["--prefetcher", "nosuch"],
            "unknown --prefetcher `nosuch`",
        ),
        (
            vec!["--farvm", "/nonexistent/farvm", "--swap", "none"],
            "no farvm binary at /nonexistent/farvm",
        ),
        (
            vec!["--qemu-limit", "half", "--swap", "none"],
            "--qemu-limit half: expected own or farvm",
        ),
    ] {
        let mut all = vec!["bench", "compare"];
        all.extend(&args);
        let o = run(&all);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
    let o = run(&["bench", "compare", "--help"]);
    for needle in [
        "zram",
        "loop device backed by tmpfs",
        "memory.oom_control",
        "--swap none",
        "QEMU + kernel swap",
        "nbd-server",
    ] {
        assert!(
            stdout(&o).contains(needle),
            "missing {needle}: {}",
            stdout(&o)
        );
    }
}

/// The fuzzer of the memory server's decoder and the page sealing, CI-sized: a fixed seed runs
/// clean, reaches both halves' interesting outcomes, and says what it ran.
#[test]
fn fuzz_runs_clean_and_reaches_both_halves() {
    let o = run(&["fuzz", "--iterations", "20000", "--seed", "1"]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    for needle in [
        "command:    farvm-lab fuzz --iterations 20000 --seed 1",
        "executions: 20000 (server ",
        "violations: 0",
        // Server: pages come back as sealed, and a misdirected page is refused by its seal.
        "read: page opened at its own address",
        "read: page stored under another address, refused by its seal",
        "write: refused (Denied)",
        "read: refused (Denied)",
        "write: refused (ChecksumMismatch)",
        "connection ended: malformed frame (BadLength)",
        "connection ended: frame cut short",
        // Client: corrupted responses are refused, genuine ones delivered.
        "client: refused (Unauthentic)",
        "client: refused (ChecksumMismatch)",
        "client: accepted, every page authentic",
        "another VM's page",
        "seal cut short, crc fixed",
    ] {
        assert!(out.contains(needle), "missing `{needle}`:\n{out}");
    }
    let o = run(&["fuzz", "--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for needle in ["EXIT STATUS", "--iterations", "--seed", "Violations"] {
        assert!(
            stdout(&o).contains(needle),
            "missing {needle}: {}",
            stdout(&o)
        );
    }
}

#[test]
fn fuzz_virtio_documents_its_invariants_and_refuses_bad_devices() {
    let o = run(&["fuzz-virtio", "--help"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for needle in [
        "--device",
        "--iterations",
        "--seed",
        "guard pages",
        "OUT request",
        "config-change",
        "EXAMPLES",
        "EXIT STATUS",
    ] {
        assert!(
            stdout(&o).contains(needle),
            "missing {needle}: {}",
            stdout(&o)
        );
    }
    let o = run(&["fuzz-virtio", "--device", "scsi"]);
    assert_eq!(o.status.code(), Some(exit_code::USAGE), "{}", stderr(&o));
    // A short run prints its summary and exits 0.
    let o = run(&[
        "--log",
        "off",
        "fuzz-virtio",
        "--device",
        "net",
        "--iterations",
        "200",
        "--seed",
        "3",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    for needle in [
        "executions                ",
        "200",
        "violations",
        "executions per second",
    ] {
        assert!(
            stdout(&o).contains(needle),
            "missing {needle}: {}",
            stdout(&o)
        );
    }
}
