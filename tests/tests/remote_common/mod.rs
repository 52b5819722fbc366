//! Shared helpers of the remote-memory integration tests: boot the test guest on remote memory
//! (paging engine + memserver), check every process's checksum against the native build, and
//! locate the `farvm-memserver` binary for tests that spawn (and kill) server processes.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use farvm_guest_agent::pv::state;
use farvm_tests::{compare_with_native_blob, record_for, GuestSetup};
use farvm_vmm::remote::{RemoteMemory, RemoteSpec, RemoteStats};
use farvm_vmm::vm::{VmOutcome, VmReport};

/// Boots `setup` with its RAM on remote memory per `spec`; returns the report and the final
/// paging statistics, asserting the engine reported no error. `during` runs on the test
/// thread while the guest runs.
pub fn run_remote_with(
    setup: &GuestSetup,
    spec: &RemoteSpec,
    during: impl FnOnce(&RemoteMemory),
) -> (VmReport, RemoteStats) {
    let (report, stats, errors) = run_remote_errors(setup, spec, during);
    assert!(
        errors.is_empty(),
        "paging engine errors ({} store errors): {:?}\noutcome: {:?}\npaging: {stats:#?}",
        stats.engine.counters.store_errors,
        errors.iter().take(8).collect::<Vec<_>>(),
        report.outcome
    );
    (report, stats)
}

/// [`run_remote_with`], returning the errors the engine kept (as text) instead of failing.
pub fn run_remote_errors(
    setup: &GuestSetup,
    spec: &RemoteSpec,
    during: impl FnOnce(&RemoteMemory),
) -> (VmReport, RemoteStats, Vec<String>) {
    let mut cfg = setup.config();
    cfg.remote = Some(spec.clone());
    let running = setup.start_with(&cfg);
    during(running.remote().expect("the VM's remote memory"));
    let outcome = running.wait(Some(setup.timeout), false);
    let mut report = running.finish(outcome);
    let stats = report
        .paging
        .clone()
        .expect("paging stats of a VM on remote memory");
    let errors = std::mem::take(&mut report.paging_errors);
    (report, stats, errors)
}

pub fn run_remote(setup: &GuestSetup, spec: &RemoteSpec) -> (VmReport, RemoteStats) {
    run_remote_with(setup, spec, |_| {})
}

/// A guest setup for remote-memory tests: frames handed out in 2 MiB runs (as `farvm run`
/// does with remote memory), no timer noise beyond the default.
pub fn setup(name: &str, mem: u64, workloads: &[&str]) -> GuestSetup {
    let mut s = GuestSetup::new(name, mem, 1, workloads);
    s.frame_run_shift = 9;
    s.timeout = farvm_tests::vm_timeout(Duration::from_secs(240));
    s
}

/// Asserts a clean shutdown and native-identical checksums for every process.
pub fn assert_native_checksums(setup: &GuestSetup, report: &VmReport, stats: &RemoteStats) {
    assert_eq!(
        report.outcome,
        VmOutcome::GuestShutdown { status: 0 },
        "guest did not finish cleanly: {report:#?}\npaging: {stats:#?}"
    );
    let (placed, blob) = setup.placement();
    assert_eq!(report.processes.len(), placed.len(), "{report:#?}");
    for (i, w) in placed.iter().enumerate() {
        let rec = record_for(report, &placed, i)
            .unwrap_or_else(|| panic!("no mailbox for {}: {report:#?}", w.name()));
        assert_eq!(rec.state, state::DONE, "{}: state {}", w.name(), rec.state);
        let nat = compare_with_native_blob(w, &blob, rec);
        assert_eq!(
            rec.checksum,
            nat.checksum,
            "{}: checksum on remote memory {:#x} != native {:#x}",
            w.name(),
            rec.checksum,
            nat.checksum
        );
        assert_eq!(rec.ops, nat.ops, "{}: ops differ", w.name());
    }
    let c = &stats.engine.counters;
    eprintln!(
        "paging: budget {} of {} pages, demand faults {}, zero fills {}, evictions {} (dirty {}), \
         prefetch issued {}, coverage {:.3}, store errors {}",
        stats.engine.budget_pages,
        stats.engine.total_pages,
        c.demand_faults,
        c.zero_fills,
        c.evictions,
        c.evict_dirty,
        c.prefetch_issued,
        stats.engine.coverage,
        c.store_errors
    );
    assert_eq!(
        (c.remote_stale, c.remote_absent),
        (0, 0),
        "every page came back as last written or read: {c:?}"
    );
    assert!(
        stats.engine.resident_pages <= stats.engine.budget_pages,
        "resident {} over budget {}",
        stats.engine.resident_pages,
        stats.engine.budget_pages
    );
}

/// Asserts the VM was stopped with `MemoryLost` (exit status 74) on a page of its RAM, with
/// the engine's lost-page counters to show for it; returns the page's address.
pub fn assert_memory_lost(setup: &GuestSetup, report: &VmReport, stats: &RemoteStats) -> u64 {
    let VmOutcome::MemoryLost { gpa } = report.outcome else {
        panic!(
            "expected the VM to stop with lost memory: {:#?}\npaging: {stats:#?}",
            report.outcome
        );
    };
    assert!(gpa < setup.mem_bytes, "{gpa:#x}");
    assert_eq!(farvm_vmm::exit_code::for_outcome(&report.outcome), 74);
    let c = &stats.engine.counters;
    assert!(c.remote_absent >= 1 && c.lost_accesses >= 1, "{c:?}");
    gpa
}

/// The `farvm-memserver` binary next to this test's build (target/<profile>/), or a clear
/// failure telling how to build it.
pub fn memserver_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("FARVM_MEMSERVER_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>/farvm-memserver
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("test binary lives in target/<profile>/deps");
    let bin = dir.join("farvm-memserver");
    assert!(
        bin.exists(),
        "{} not found: build it first (`cargo build --release -p farvm-memserver`, which \
         `cargo test --workspace --release` does) or set FARVM_MEMSERVER_BIN",
        bin.display()
    );
    bin
}

/// A `farvm-memserver` child process on an ephemeral loopback port.
pub struct MemserverProcess {
    pub child: Child,
    pub addr: std::net::SocketAddr,
    /// Its RDMA listener, if started with one ([`MemserverProcess::spawn_rdma`]).
    pub rdma: Option<std::net::SocketAddr>,
}

impl MemserverProcess {
    pub fn spawn(capacity: &str) -> Self {
        Self::spawn_at("127.0.0.1:0", capacity)
    }

    /// A server listening on `listen` (e.g. the address of one just killed: a restart).
    pub fn spawn_at(listen: &str, capacity: &str) -> Self {
        Self::spawn_with(&["--listen", listen, "--capacity", capacity])
    }

    /// A server that also serves RDMA sessions on `ip` (an address with an RDMA device),
    /// ephemeral ports; its log goes to this process's stderr.
    pub fn spawn_rdma(ip: std::net::IpAddr, capacity: &str) -> Self {
        let listen = std::net::SocketAddr::new(ip, 0).to_string();
        Self::spawn_with(&[
            "--listen",
            &listen,
            "--rdma",
            &listen,
            "--capacity",
            capacity,
        ])
    }

    fn spawn_with(args: &[&str]) -> Self {
        use std::io::BufRead;
        let rdma = args.contains(&"--rdma");
        let mut child = Command::new(memserver_binary())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(if rdma {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("spawn farvm-memserver");
        let out = child.stdout.take().expect("stdout");
        let mut out = std::io::BufReader::new(out);
        let mut line = String::new();
        out.read_line(&mut line)
            .expect("read the memserver's first line");
        let addr = line
            .trim()
            .strip_prefix("listening ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected memserver banner {line:?}"));
        let rdma = rdma.then(|| {
            line.clear();
            out.read_line(&mut line)
                .expect("read the memserver's second line");
            line.trim()
                .strip_prefix("rdma ")
                .and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("unexpected memserver RDMA line {line:?}"))
        });
        Self { child, addr, rdma }
    }

    /// SIGKILL, no clean-up: the server's RAM (and every page on it) is gone.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// Sends `sig` (SIGSTOP / SIGCONT freeze and resume the server with its pages intact).
    /// Returns after a SIGSTOP only once every server thread has stopped (kill(2) only queues
    /// it).
    pub fn signal(&self, sig: i32) {
        // SAFETY: kill(2) on our own child's pid (not yet reaped); no memory is involved.
        unsafe { libc::kill(self.child.id() as i32, sig) };
        if sig == libc::SIGSTOP {
            assert!(
                farvm_memserver::process::wait_all_threads_stopped(
                    self.child.id(),
                    Duration::from_secs(10)
                ),
                "the server did not stop within 10 s of SIGSTOP"
            );
        }
    }
}

impl Drop for MemserverProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(unused_imports)] // used by the RDMA tests only
pub use farvm_memserver::process::rdma_test_ip as rdma_ip;

/// A remote spec with `budget` (e.g. "25%") and `prefetcher`.
pub fn spec(name: &str, budget: &str, prefetcher: &str) -> RemoteSpec {
    let mut s = RemoteSpec::new(name);
    s.budget = farvm_vmm::remote::Budget::parse(budget).expect("budget");
    s.prefetcher = prefetcher.to_string();
    s
}

/// Waits (up to 60 s) until the guest has written more than `n` pages back; returns the count
/// then, or 0 if it never did.
pub fn wait_for_write_backs(remote: &RemoteMemory, n: u64) -> u64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let written = remote.stats().engine.counters.remote_writes;
        if written > n {
            return written;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    0
}
