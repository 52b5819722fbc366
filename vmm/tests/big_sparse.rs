//! A 64 GiB guest on remote memory: it starts (guest RAM above the 3..4 GiB MMIO hole
//! continues at 4 GiB), runs a workload over part of it, and costs only what it touches: the
//! memory server stores no more than the pages the guest wrote, not 64 GiB.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use common::kvm_available;
use farvm_memclient::{Client, ClientConfig};

#[test]
fn a_64_gib_guest_on_remote_memory_costs_only_what_it_touches() {
    if !kvm_available() {
        return;
    }
    let bin = farvm_vmm::remote::local_server::binary().expect("farvm-memserver binary");
    let mut server = Command::new(bin)
        .args(["--listen", "127.0.0.1:0", "--capacity", "80G"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("listening ")
        .unwrap()
        .parse()
        .unwrap();

    // The workload writes 256 MiB (65 536 pages) and reads it back.
    let workload = "seq:ws=256M,passes=2,write=1";
    let o = Command::new(env!("CARGO_BIN_EXE_farvm"))
        .args(["run", "--memory", "64G", "--local-memory", "128M"])
        .args(["--memserver", &addr.to_string(), "--workload", workload])
        .args(["--serial", "none", "--no-control-socket", "--json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON report");
    let p = &v["processes"][0];
    assert_eq!(p["state_name"], "done", "{p}");
    let placed = farvm_vmm::workload_spec::place(&[workload.to_string()], 1).unwrap();
    let w = &placed[0];
    let native = farvm_workloads::run_native(w.spec.workload.id, &w.spec.params()).unwrap();
    assert_eq!(p["checksum"].as_u64(), Some(native.checksum), "{p}");

    // Pages the guest touched first: every one was zero-filled locally.
    let touched = v["paging"]["engine"]["counters"]["zero_fills"]
        .as_u64()
        .unwrap_or_else(|| panic!("no zero-fill count in {}", v["paging"]));
    let stats = Client::connect(ClientConfig::new(vec![addr]))
        .unwrap()
        .stat(0);
    let used_pages = stats[0].as_ref().unwrap().as_ref().unwrap().used_pages;
    let local_pages = (128u64 << 20) / 4096;
    eprintln!(
        "touched {touched} pages ({} MiB), memserver holds {used_pages} pages ({} MiB)",
        (touched * 4096) >> 20,
        (used_pages * 4096) >> 20
    );
    assert!(touched >= 65_536, "the workload touched {touched} pages");
    assert!(
        touched < 128 * 1024,
        "{touched} pages touched: the guest touched far more than its workload"
    );
    assert!(
        used_pages <= touched,
        "the server holds {used_pages} pages, more than the {touched} touched"
    );
    assert!(
        used_pages + local_pages >= touched,
        "{touched} pages touched, {used_pages} on the server: pages went missing"
    );
    let _ = server.kill();
    let _ = server.wait();
}
