//! `farvm snapshot` and `farvm run --restore`, end to end through the binary: a verifying scan
//! on remote memory (25% local, so most of its pages live on the embedded memory server) is
//! saved in its measured phase, the first VMM exits, and the restored VM finishes with the
//! checksum the uninterrupted (native) run computes; a missing, corrupt or other-version
//! snapshot is a named error with its documented exit status. A snapshot sealed under a
//! snapshot key holds no byte string of the guest's RAM, is refused without its key, with
//! another key, or altered (a flipped bit, two pages swapped), and resumes with its key.

mod common;
#[path = "common/sealed.rs"]
mod sealed;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use common::{assert_native_report, farvm, kvm_available, refusal, wait_for_measured_phase};

/// Read-modify-write passes that check every word they read: a page restored wrong fails the
/// run, naming the word.
const WORKLOAD: &str = "seq:ws=32M,passes=80,write=1,verify=1";

/// A fresh scratch directory for one test.
fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("farvm-snapshot-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// An 80 MiB test guest at 25% local running [`WORKLOAD`], controlled at `sock`, in its
/// measured phase.
fn start_vm(tag: &str, sock: &Path) -> Child {
    let name = format!("snap-{tag}-{}", std::process::id());
    let mut vm = farvm()
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
        .arg(sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_measured_phase(sock, &mut vm);
    vm
}

/// `farvm snapshot --socket SOCK [--key-file KEY] DIR`.
fn snapshot(sock: &Path, dir: &Path, key: Option<&Path>) -> std::process::Output {
    sealed::snapshot(Path::new(env!("CARGO_BIN_EXE_farvm")), sock, dir, key)
}

/// Waits for the saved VM's run to end as saved: status 0, the workload unfinished; returns
/// its log.
fn assert_saved(vm: Child) -> String {
    let out = vm.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let saved: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(saved["outcome"]["kind"], "snapshotted", "{saved}");
    assert_eq!(saved["processes"][0]["state_name"], "running", "{saved}");
    err.into_owned()
}

/// Restores `snap` (with the snapshot key `key`) and checks the VM finishes with the native
/// checksum; returns its report.
fn restore_to_native(snap: &Path, key: Option<&Path>) -> serde_json::Value {
    let o = sealed::restore(Path::new(env!("CARGO_BIN_EXE_farvm")), snap, key);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "farvm run --restore: {err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_native_report(&v, WORKLOAD);
    v
}

#[test]
fn a_vm_saved_mid_run_resumes_and_finishes_with_the_native_checksum() {
    if !kvm_available() {
        return;
    }
    let dir = scratch("mid-run");
    let sock = dir.join("vm.sock");
    let snap = dir.join("snap");
    let first = start_vm("mid-run", &sock);

    // A save that fails after the pause (its page file cannot be created) says why and
    // leaves the VM running.
    let blocked = dir.join("blocked");
    std::fs::create_dir_all(blocked.join("memory.pages")).unwrap();
    let o = snapshot(&sock, &blocked, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(71), "{err}");
    assert!(
        err.contains("cannot write") && err.contains("memory.pages"),
        "{err}"
    );
    let status = farvm_vmm::control::request(&sock, "status").unwrap();
    assert_eq!(status["state"], "running", "{status}");
    assert!(!blocked.join("manifest.json").exists());

    let o = snapshot(&sock, &snap, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "farvm snapshot: {err}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("(in the clear)"));

    // The saved VM stops, as `virsh save` expects: its run ends with status 0 and the
    // workload unfinished. It warned that the snapshot is in the clear.
    let log = assert_saved(first);
    assert!(log.contains("not sealed"), "the clear save warns: {log}");
    assert!(snap.join("manifest.json").is_file() && snap.join("memory.pages").is_file());
    // In the clear, the page file holds the guest's bytes as they are (readable by its
    // owner only).
    assert_eq!(
        sealed::files_holding(&snap, &sealed::marker()),
        ["memory.pages"]
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(snap.join("memory.pages"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // A full copy (no pool) restores eagerly only: a lazy mode is refused before the VM is
    // built, naming the flag.
    let err = refusal(
        farvm().arg("run").arg("--restore").arg(&snap).args([
            "--restore-pages",
            "lazy",
            "--serial",
            "none",
        ]),
        64,
    );
    assert!(
        err.contains("--restore-pages lazy") && err.contains("eagerly only"),
        "{err}"
    );

    let v = restore_to_native(&snap, None);
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
        r#"{"format":"farvm-snapshot","version":4}"#,
    )
    .unwrap();
    let (code, err) = restore(&dir);
    assert_eq!(code, Some(65), "{err}");
    assert!(err.contains("format version 4"), "{err}");

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

#[test]
fn a_sealed_snapshot_hides_the_guest_refuses_a_wrong_key_or_tampering_and_resumes_with_its_key() {
    if !kvm_available() {
        return;
    }
    let dir = scratch("sealed");
    let sock = dir.join("vm.sock");
    let snap = dir.join("snap");
    let key = sealed::key_file(&dir, "snapshot.key", 0x5a);
    let wrong = sealed::key_file(&dir, "other.key", 0x33);
    let vm = start_vm("sealed", &sock);

    // A key file others can read is refused, naming the flag; the VM runs on.
    let exposed = dir.join("exposed.key");
    std::fs::write(&exposed, [7u8; 32]).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exposed, std::fs::Permissions::from_mode(0o644)).unwrap();
    let o = snapshot(&sock, &snap, Some(&exposed));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(64), "{err}");
    assert!(err.contains("--key-file") && err.contains("0644"), "{err}");

    let o = snapshot(&sock, &snap, Some(&key));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "farvm snapshot --key-file: {err}");
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("sealed under snapshot key"), "{said}");
    let log = assert_saved(vm);
    assert!(!log.contains("not sealed"), "{log}");

    // Nothing of the guest's RAM, nor the key, is readable in the directory; the manifest
    // says it is sealed, and under which key id.
    assert_eq!(
        sealed::files_holding(&snap, &sealed::marker()),
        Vec::<String>::new()
    );
    assert!(sealed::files_holding(&snap, &[0x5a; 32]).is_empty());
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(snap.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["version"], 3, "{manifest}");
    assert!(manifest["sealed"]["key_id"].is_string(), "{manifest}");
    // The machine state (registers, devices) is sealed too.
    assert!(manifest["machine"].is_string(), "{manifest}");
    for clear in ["vcpus", "kvm", "devices"] {
        assert!(
            manifest.get(clear).is_none(),
            "{clear} in the clear: {manifest}"
        );
    }
    let pages = sealed::sealed_pages(&snap);
    assert_eq!(
        pages.len() as u64,
        manifest["memory"]["pages_written"].as_u64().unwrap()
    );

    // Without the key, or with another: refused before the VM runs, naming the flag.
    let bin = Path::new(env!("CARGO_BIN_EXE_farvm"));
    let (code, err) = sealed::refused_restore(bin, &snap, None);
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("is sealed") && err.contains("--snapshot-key-file"),
        "{err}"
    );
    let (code, err) = sealed::refused_restore(bin, &snap, Some(&wrong));
    assert_eq!(code, Some(64), "{err}");
    assert!(
        err.contains("not under the key") && err.contains("--snapshot-key-file"),
        "{err}"
    );

    // Altered: one flipped bit in a page, two pages swapped (with or without their tags), a
    // page's data removed (a hole punched, here zeroed): refused as corrupt. Each change is
    // undone after.
    let file = snap.join("memory.pages");
    let (a, b) = (pages[pages.len() / 3], pages[2 * pages.len() / 3]);
    let refused = |what: &str| {
        let (code, err) = sealed::refused_restore(bin, &snap, Some(&key));
        assert_eq!(code, Some(65), "{what}: {err}");
        assert!(err.contains("corrupt"), "{what}: {err}");
    };
    sealed::flip_bit(&file, a * 4096 + 1000, 3);
    refused("a flipped bit");
    sealed::flip_bit(&file, a * 4096 + 1000, 3);
    sealed::swap_pages(&file, a, b);
    refused("two pages swapped");
    sealed::swap_tags(&snap, a, b);
    refused("two pages swapped with their tags");
    sealed::swap_pages(&file, a, b);
    sealed::swap_tags(&snap, a, b);
    let saved_page = std::fs::read(&file).unwrap()[(a * 4096) as usize..][..4096].to_vec();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        f.write_all_at(&[0u8; 4096], a * 4096).unwrap();
        refused("a page removed");
        f.write_all_at(&saved_page, a * 4096).unwrap();
    }

    // A manifest field changed (the VM's description is readable, not writable).
    let manifest_path = snap.join("manifest.json");
    let text = std::fs::read_to_string(&manifest_path).unwrap();
    let edited = text.replacen("\"vcpus\":1", "\"vcpus\":2", 1);
    assert_ne!(edited, text, "the description names its vCPUs: {text}");
    std::fs::write(&manifest_path, edited).unwrap();
    refused("the manifest edited");
    std::fs::write(&manifest_path, &text).unwrap();

    // With its key, intact again: the VM finishes with the native checksum.
    restore_to_native(&snap, Some(&key));
    std::fs::remove_dir_all(&dir).unwrap();
}
