//! Thread placement: pinning the threads of a VM's fault path to one host CPU.
//!
//! A demand fault is a chain of thread hand-offs — the vCPU blocks in the fault, the fault
//! handler wakes, sends the read, the (local) memserver's connection thread wakes and
//! answers, the handler wakes again, installs and wakes the vCPU. Each hand-off to a thread
//! whose CPU sits idle is a wake-up of that CPU. On a host whose idle CPUs halt without
//! polling (a VM with `haltpoll.guest_halt_poll_ns=0`, as measured here) a wake-up across CPUs
//! costs tens of µs, ten times one on the same CPU ([`wakeup_round_trip`], printed by `farvm-lab
//! bench placement`). Keeping the chain on one CPU turns its hand-offs into plain context
//! switches; the evictor, prefetch receiver and everything else keep running on any CPU.
//! `farvm-lab bench placement` measures what that buys per workload (README "Fault-path
//! placement").

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// Host CPUs this process may run on (the calling thread's affinity, which threads it
/// spawns inherit).
pub fn allowed_cpus() -> io::Result<Vec<usize>> {
    thread_cpus(0)
}

/// Checks that `cpu` is one this process may run on (a clear error before any VM starts).
pub fn check_cpu(cpu: usize) -> Result<(), String> {
    let allowed =
        allowed_cpus().map_err(|e| format!("cannot read this process's CPU affinity: {e}"))?;
    if allowed.contains(&cpu) {
        Ok(())
    } else {
        Err(format!(
            "CPU {cpu} is not one this process may run on (allowed: {})",
            allowed
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ))
    }
}

/// Checks a `--fault-path-cpu` (of `farvm run` and the lab's benches): a CPU this process may
/// run on.
pub fn check_fault_path_cpu(cpu: Option<usize>) -> Result<(), String> {
    match cpu {
        Some(c) => check_cpu(c).map_err(|e| format!("--fault-path-cpu: {e}")),
        None => Ok(()),
    }
}

/// Pins kernel thread `tid` (of this process) to `cpu`.
pub fn pin_thread(tid: i32, cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; a stale tid fails with ESRCH.
    let r = unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The CPUs kernel thread `tid` (0: the calling thread) may run on.
pub fn thread_cpus(tid: i32) -> io::Result<Vec<usize>> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let r =
        unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: `c` is below CPU_SETSIZE, the bit count of `set`.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Mean round trip of a one-byte ping-pong between two threads pinned to CPUs `a` and `b`
/// (each side sleeps in `read` until the other writes): two thread wake-ups per round, on one
/// CPU if `a == b`, else each one a wake-up of the other CPU.
pub fn wakeup_round_trip(a: usize, b: usize, rounds: u32) -> io::Result<Duration> {
    let (mut ping, mut pong) = UnixStream::pair()?;
    let echo = std::thread::Builder::new()
        .name("wakeup-echo".into())
        .spawn(move || -> io::Result<()> {
            // SAFETY: gettid has no preconditions.
            pin_thread(unsafe { libc::gettid() }, b)?;
            let mut byte = [0u8; 1];
            while pong.read(&mut byte)? == 1 {
                pong.write_all(&byte)?;
            }
            Ok(())
        })?;
    let timed = std::thread::Builder::new()
        .name("wakeup-ping".into())
        .spawn(move || -> io::Result<Duration> {
            // SAFETY: gettid has no preconditions.
            pin_thread(unsafe { libc::gettid() }, a)?;
            let mut byte = [1u8; 1];
            // A few unmeasured rounds: both threads have run on their CPUs.
            for _ in 0..100 {
                ping.write_all(&byte)?;
                ping.read_exact(&mut byte)?;
            }
            let t0 = Instant::now();
            for _ in 0..rounds {
                ping.write_all(&byte)?;
                ping.read_exact(&mut byte)?;
            }
            Ok(t0.elapsed() / rounds.max(1))
        })?;
    let r = timed
        .join()
        .map_err(|_| io::Error::other("the timing thread panicked"))?;
    // `ping` was dropped with its thread: the echo side reads end of stream and returns.
    let e = echo
        .join()
        .map_err(|_| io::Error::other("the echo thread panicked"))?;
    let r = r?;
    e?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pinned_thread_runs_only_on_its_cpu_and_bad_cpus_are_refused_by_number() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        let cpu = *allowed.last().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() }).unwrap();
            std::thread::park();
        });
        let tid = rx.recv().unwrap();
        pin_thread(tid, cpu).unwrap();
        assert_eq!(thread_cpus(tid).unwrap(), vec![cpu]);
        h.thread().unpark();
        h.join().unwrap();
        check_cpu(cpu).unwrap();
        let bad = check_cpu(libc::CPU_SETSIZE as usize + 1).unwrap_err();
        assert!(
            bad.contains(&format!("CPU {}", libc::CPU_SETSIZE as usize + 1)),
            "{bad}"
        );
        assert!(pin_thread(tid, libc::CPU_SETSIZE as usize).is_err());
    }

    #[test]
    fn a_wakeup_round_trip_is_measured_on_one_cpu_and_a_bad_cpu_is_an_error() {
        let cpu = allowed_cpus().unwrap()[0];
        let d = wakeup_round_trip(cpu, cpu, 200).unwrap();
        assert!(d > Duration::ZERO && d < Duration::from_secs(1), "{d:?}");
        assert!(wakeup_round_trip(cpu, libc::CPU_SETSIZE as usize, 10).is_err());
    }
}
