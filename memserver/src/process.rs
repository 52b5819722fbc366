//! Observing a memory-server *process* from outside: tests (and tools) that freeze one with
//! SIGSTOP need to know when it has really stopped, because kill(2) only queues the signal and a
//! server thread already running may still answer a request sent right after it. Also where
//! tests find the RDMA device to serve on ([`rdma_test_ip`]).

use std::time::{Duration, Instant};

/// Waits until every thread of process `pid` is stopped (state `T` in `/proc/PID/task/*/stat`),
/// up to `timeout`. Returns whether they all stopped; false also if the process is gone.
pub fn wait_all_threads_stopped(pid: u32, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        // A thread that exits meanwhile (its stat unreadable) does not hold the wait up.
        let all_stopped = tasks.flatten().all(|t| {
            std::fs::read_to_string(t.path().join("stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('T')))
                .unwrap_or(true)
        });
        if all_stopped {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// For tests over RDMA: the address of a local RDMA device's interface to serve on
/// (`FARVM_RDMA_IP`, which the KVM lab's Soft-RoCE set-up exports), or `None` with a note when
/// there is none — then the caller does not test RDMA here, unless `FARVM_REQUIRE_RDMA=1`
/// (the lab's test list sets it), which makes a missing device a failure.
pub fn rdma_test_ip(test: &str) -> Option<std::net::IpAddr> {
    match std::env::var("FARVM_RDMA_IP") {
        Ok(v) => Some(
            v.parse()
                .unwrap_or_else(|_| panic!("FARVM_RDMA_IP={v:?} is not an IP address")),
        ),
        Err(_) => {
            assert!(
                std::env::var("FARVM_REQUIRE_RDMA").as_deref() != Ok("1"),
                "{test}: FARVM_REQUIRE_RDMA=1 but FARVM_RDMA_IP is not set (no RDMA device \
                 set up: scripts/kvm-lab --modules crc32_generic,rdma_rxe,ib_uverbs sets up \
                 Soft-RoCE)"
            );
            eprintln!(
                "{test}: FARVM_RDMA_IP is not set (no RDMA device here): RDMA is tested in the \
                 KVM lab (scripts/kvm-lab test with Soft-RoCE)"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_child_is_seen_stopped_and_a_running_one_is_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        assert!(!wait_all_threads_stopped(pid, Duration::from_millis(20)));
        // SAFETY: kill(2) on our own child's pid (not yet reaped); no memory is involved.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        assert!(wait_all_threads_stopped(pid, Duration::from_secs(10)));
        let _ = child.kill();
        let _ = child.wait();
        assert!(!wait_all_threads_stopped(pid, Duration::from_millis(20)));
    }
}
