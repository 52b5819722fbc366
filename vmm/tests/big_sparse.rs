//! A 64 GiB guest on remote memory: it starts (guest RAM above the 3..4 GiB MMIO hole
//! continues at 4 GiB), runs a workload over part of it, and costs only what it touches: the
//! memory server stores no more than the pages the guest wrote, not 64 GiB, and the VMM's
//! resident memory stays near its local budget.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use common::{kvm_available, native_checksum};
use farvm_memclient::{Client, ClientConfig};

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a 64 GiB run of `workload` cost.
struct Cost {
    /// Pages the guest touched first (every one was zero-filled locally).
    touched: u64,
    /// Pages the memory server holds at the end.
    stored: u64,
    /// The VMM's peak resident set in bytes.
    max_rss: u64,
}

/// Runs `workload` in a 64 GiB guest with a `local` byte budget on a fresh memory server
/// (`extra`: more `farvm run` arguments); asserts it finished with the native checksum.
// The VM's process is reaped by wait4 (for its rusage), not by Child::wait.
#[allow(clippy::zombie_processes)]
fn run_64g(workload: &str, local: u64, extra: &[&str]) -> Cost {
    let bin = farvm_vmm::remote::local_server::binary().expect("farvm-memserver binary");
    let mut child = Command::new(bin)
        .args(["--listen", "127.0.0.1:0", "--capacity", "80G"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let _server = Server(child);
    let addr: SocketAddr = line
        .trim()
        .strip_prefix("listening ")
        .unwrap()
        .parse()
        .unwrap();

    let mut vm = Command::new(env!("CARGO_BIN_EXE_farvm"))
        .args([
            "run",
            "--memory",
            "64G",
            "--local-memory",
            &local.to_string(),
        ])
        .args(extra)
        .args(["--memserver", &addr.to_string(), "--workload", workload])
        .args(["--serial", "none", "--no-control-socket", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = {
        let mut e = vm.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = e.read_to_string(&mut s);
            s
        })
    };
    let mut out = Vec::new();
    vm.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    // wait4 rather than Child::wait: it also gives the VMM's peak RSS.
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; `status` and `ru` are valid for writes.
    let pid = unsafe { libc::wait4(vm.id() as i32, &mut status, 0, &mut ru) };
    assert_eq!(pid, vm.id() as i32, "wait4");
    let err = err.join().unwrap();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "status {status:#x}: {err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON report");
    let p = &v["processes"][0];
    assert_eq!(p["state_name"], "done", "{p}");
    assert_eq!(
        p["checksum"].as_u64(),
        Some(native_checksum(workload)),
        "{p}"
    );

    let touched = v["paging"]["engine"]["counters"]["zero_fills"]
        .as_u64()
        .unwrap_or_else(|| panic!("no zero-fill count in {}", v["paging"]));
    let stats = Client::connect(ClientConfig::new(vec![addr]))
        .unwrap()
        .stat(0);
    let stored = stats[0].as_ref().unwrap().as_ref().unwrap().used_pages;
    let cost = Cost {
        touched,
        stored,
        max_rss: ru.ru_maxrss as u64 * 1024,
    };
    eprintln!(
        "{workload}: touched {touched} pages ({} MiB), memserver holds {stored} pages ({} MiB), \
         VMM peak RSS {} MiB",
        (touched * 4096) >> 20,
        (stored * 4096) >> 20,
        cost.max_rss >> 20
    );
    assert!(
        stored <= touched,
        "the server holds {stored} pages, more than the {touched} touched"
    );
    assert!(
        stored + local / 4096 >= touched,
        "{touched} pages touched, {stored} on the server: pages went missing"
    );
    cost
}

#[test]
fn a_64_gib_guest_on_remote_memory_costs_only_what_it_touches() {
    if !kvm_available() {
        return;
    }
    // The workload writes 256 MiB (65 536 pages) and reads it back.
    let c = run_64g("seq:ws=256M,passes=2,write=1", 128 << 20, &[]);
    assert!(c.touched >= 65_536, "the workload touched {}", c.touched);
    assert!(
        c.touched < 128 * 1024,
        "{} pages touched: the guest touched far more than its workload",
        c.touched
    );
}

#[test]
fn a_sparse_workload_over_16_gib_of_a_64_gib_guest_costs_only_its_pages() {
    if !kvm_available() {
        return;
    }
    // The same guest with a trivial workload: what 64 GiB of guest RAM costs the VMM by
    // itself (its per-page bookkeeping), the baseline for the sparse run's RSS.
    let base = run_64g("seq:ws=4M,passes=1", 16 << 20, &["--demand-4k"]);
    // 4096 pages, one in every 4 MiB of a 16 GiB heap; the guest kernel maps each on first
    // touch (--demand-4k), with a page table per 2 MiB region touched.
    let pages = 4096u64;
    let local = 16u64 << 20;
    let c = run_64g("sparse:ws=16G,pages=4096,passes=2", local, &["--demand-4k"]);
    assert!(c.touched >= pages, "the workload touched {}", c.touched);
    assert!(
        c.touched < 2 * pages + base.touched + 1024,
        "{} pages touched for {pages} pages of workload, as many page tables and {} pages \
         of a trivial run",
        c.touched,
        base.touched
    );
    assert!(
        c.stored >= pages / 2,
        "the server holds {} pages: the workload did not page",
        c.stored
    );
    // Resident: the trivial run's plus at most the local budget and some slack, nowhere near
    // the 16 GiB span.
    assert!(
        c.max_rss < base.max_rss + local + (64 << 20),
        "VMM peak RSS {} MiB, {} MiB with a trivial workload, for a {} MiB local budget",
        c.max_rss >> 20,
        base.max_rss >> 20,
        local >> 20
    );
}
