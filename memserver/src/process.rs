//! Observing a memory-server *process* from outside: tests (and tools) that freeze one with
//! SIGSTOP need to know when it has really stopped, because kill(2) only queues the signal and a
//! server thread already running may still answer a request sent right after it.

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
