//! The test guest as a file (`farvm image export`) booted by path with its workloads on the
//! kernel command line, and farvm answering `--version` as `cloud-hypervisor` (what libvirt's ch
//! driver asks before it uses a VMM).

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use common::kvm_available;
use farvm_vmm::exit_code;

fn scratch_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("farvm-tgfile-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn farvm(args: &[&str], runtime: &PathBuf) -> Output {
    Command::new(env!("CARGO_BIN_EXE_farvm"))
        .env("XDG_RUNTIME_DIR", runtime)
        .args(args)
        .output()
        .expect("spawn farvm")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn export_writes_the_builtin_guest_and_refuses_to_overwrite() {
    let dir = scratch_dir("export");
    let out = dir.join("images");
    let o = farvm(&["image", "export", out.to_str().unwrap()], &dir);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let path = out.join("farvm-testguest.elf");
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        path.to_str().unwrap()
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        farvm_vmm::builtin::test_guest_elf()
    );
    let again = farvm(&["image", "export", out.to_str().unwrap()], &dir);
    assert_eq!(again.status.code(), Some(exit_code::USAGE));
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));
    let forced = farvm(&["image", "export", "--force", out.to_str().unwrap()], &dir);
    assert_eq!(forced.status.code(), Some(0), "{}", stderr(&forced));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exported_guest_takes_workloads_from_the_cmdline() {
    let dir = scratch_dir("cmdline");
    let kernel = dir.join("renamed-kernel");
    std::fs::write(&kernel, farvm_vmm::builtin::test_guest_elf()).unwrap();
    let kernel = kernel.to_str().unwrap();
    // A misspelt key is a usage error naming the word (no VM needed to find out).
    let o = farvm(
        &["run", "--kernel", kernel, "--cmdline", "farvm.wrkload=seq"],
        &dir,
    );
    assert_eq!(o.status.code(), Some(exit_code::USAGE), "{}", stderr(&o));
    assert!(stderr(&o).contains("farvm.wrkload=seq"), "{}", stderr(&o));
    let o = farvm(
        &[
            "run",
            "--kernel",
            kernel,
            "--cmdline",
            "farvm.workload=nosuch",
        ],
        &dir,
    );
    assert_eq!(o.status.code(), Some(exit_code::USAGE), "{}", stderr(&o));
    assert!(stderr(&o).contains("unknown workload"), "{}", stderr(&o));
    if !kvm_available() {
        return;
    }
    let o = farvm(
        &[
            "run",
            "--kernel",
            kernel,
            "--memory",
            "128M",
            "--cmdline",
            "console=ttyS0 farvm.workload=seq:ws=8M,seed=5 farvm.workload=intops",
            "--serial",
            "none",
            "--no-control-socket",
            "--json",
        ],
        &dir,
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
    assert!(
        v["paging"].is_object(),
        "remote memory, as the built-in guest: {v}"
    );
    let procs = v["processes"].as_array().unwrap();
    let names: Vec<&str> = procs.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["seq", "intops"], "{v}");
    assert!(procs.iter().all(|p| p["state_name"] == "done"), "{v}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn answers_version_as_cloud_hypervisor() {
    let dir = scratch_dir("ch");
    let link = dir.join("cloud-hypervisor");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_farvm"), &link).unwrap();
    let o = Command::new(&link).arg("--version").output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let line = String::from_utf8(o.stdout).unwrap();
    assert_eq!(
        line,
        format!(
            "cloud-hypervisor v27.0.0 (farvm {})\n",
            env!("CARGO_PKG_VERSION")
        )
    );
    // Under its own name farvm keeps its own version output.
    let own = farvm(&["--version"], &dir);
    assert_eq!(
        String::from_utf8_lossy(&own.stdout).trim(),
        format!("farvm {}", env!("CARGO_PKG_VERSION"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}
