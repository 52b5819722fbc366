//! CPU time and context switches of one remote-memory VM run, split by thread: the vCPU, the engine's fault handler
//! and evictor, the memclient receive and send threads (completions are applied on the receive
//! thread: the page lands and is installed there), the embedded memserver child (all its
//! threads), and the rest of this process. A sampler thread reads `/proc/self/task/*/stat` and
//! the embedded memserver child's tasks every [`PERIOD`], keeping each thread's latest user+system time,
//! so a thread that exits loses at most one period. Times are the scheduler's exact run times
//! where the kernel shows them (`/proc/PID/task/TID/sched`), else clock ticks. Each sample is kept with its time, so the
//! split of a window of the run (the workload's measured phase) is the difference of the samples
//! nearest its ends.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

const PERIOD: Duration = Duration::from_millis(10);

/// A quantity by thread class: ms of CPU time, or context switches.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct ThreadSplit {
    pub vcpu: f64,
    pub fault: f64,
    pub evict: f64,
    /// memclient receive threads: page reception and the engine's completion path (install).
    pub store_rx: f64,
    /// memclient send and maintenance threads.
    pub store_tx: f64,
    /// The memserver child process, all threads.
    pub memserver: f64,
    /// Every other thread of this process that ran during the VM run (VM setup, devices).
    pub other: f64,
}

impl ThreadSplit {
    pub fn total(&self) -> f64 {
        self.vcpu
            + self.fault
            + self.evict
            + self.store_rx
            + self.store_tx
            + self.memserver
            + self.other
    }

    /// `self - earlier`, class by class.
    pub fn since(&self, earlier: &ThreadSplit) -> ThreadSplit {
        ThreadSplit {
            vcpu: self.vcpu - earlier.vcpu,
            fault: self.fault - earlier.fault,
            evict: self.evict - earlier.evict,
            store_rx: self.store_rx - earlier.store_rx,
            store_tx: self.store_tx - earlier.store_tx,
            memserver: self.memserver - earlier.memserver,
            other: self.other - earlier.other,
        }
    }

    fn add(&mut self, process: Process, comm: &str, ms: f64) {
        let slot = match process {
            Process::Memserver => &mut self.memserver,
            Process::Own if comm.starts_with("vcpu") => &mut self.vcpu,
            Process::Own if comm == "ept-fault" => &mut self.fault,
            Process::Own if comm == "ept-evict" => &mut self.evict,
            Process::Own if comm.starts_with("memclient-rx") => &mut self.store_rx,
            Process::Own if comm.starts_with("memclient-") => &mut self.store_tx,
            Process::Own => &mut self.other,
        };
        *slot += ms;
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Process {
    Own,
    Memserver,
}

/// CPU time of one run: the whole VM run, and the workload's measured phase.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct RunCpu {
    /// CPU ms of the whole VM run.
    pub whole: ThreadSplit,
    /// CPU ms between the workload's MEASURE and MEASURED doorbells; `None` if it did not get
    /// there.
    pub measured: Option<ThreadSplit>,
    /// Context switches (each a block and a wake-up, or a preemption) in the same window.
    pub measured_switches: Option<ThreadSplit>,
    /// Pages read from the memserver in the measured phase.
    pub measured_pages_read: u64,
}

impl RunCpu {
    /// The split of a run sampled as `series` whose process record is `rec` (`None`: timed
    /// out). The doorbells are timed from the VM's start, a few ms after the sampler's: the
    /// window is that much early, which a phase of hundreds of ms hardly notices.
    pub fn of(series: &CpuSeries, rec: Option<&farvm_vmm::devices::pvctl::ProcessRecord>) -> Self {
        use farvm_guest_agent::pv::phase;
        let at = |r: &farvm_vmm::devices::pvctl::ProcessRecord, ph: u32| {
            r.events
                .iter()
                .find(|e| e.phase == ph)
                .map(|e| Duration::from_nanos(e.host_ns))
        };
        let window =
            rec.and_then(|r| Some(series.window(at(r, phase::MEASURE)?, at(r, phase::MEASURED)?)));
        let measured_pages_read = rec
            .and_then(|r| r.measured_phase_paging())
            .map_or(0, |d| d.bytes_read / 4096);
        Self {
            whole: series.total(),
            measured: window.map(|w| w.0),
            measured_switches: window.map(|w| w.1),
            measured_pages_read,
        }
    }

    /// µs of CPU (all threads) per page read in the measured phase (NaN without one).
    pub fn us_per_page(&self) -> f64 {
        match self.measured {
            Some(m) if self.measured_pages_read > 0 => {
                m.total() * 1e3 / self.measured_pages_read as f64
            }
            _ => f64::NAN,
        }
    }
}

/// One thread as sampled: comm, (CPU ns, context switches) at first sight and latest.
struct Task {
    comm: String,
    first: (u64, u64),
    last: (u64, u64),
}

/// (process, tid) -> what was seen of it.
type Seen = HashMap<(Process, u32), Task>;

/// The CPU (ms) and context-switch splits since the sampler started, at points in time (since
/// it started).
#[derive(Debug, Default)]
pub(crate) struct CpuSeries {
    points: Vec<(Duration, ThreadSplit, ThreadSplit)>,
}

impl CpuSeries {
    /// The CPU split of the whole sampled time.
    pub fn total(&self) -> ThreadSplit {
        self.points.last().map(|p| p.1).unwrap_or_default()
    }

    /// The (CPU, context switches) splits between `from` and `to` (times since the sampler
    /// started), from the samples nearest them.
    pub fn window(&self, from: Duration, to: Duration) -> (ThreadSplit, ThreadSplit) {
        let at = |t: Duration| {
            self.points
                .iter()
                .min_by_key(|p| p.0.abs_diff(t))
                .map(|p| (p.1, p.2))
                .unwrap_or_default()
        };
        let (a, b) = (at(from), at(to));
        (b.0.since(&a.0), b.1.since(&a.1))
    }
}

/// (CPU ms, context switches) by thread class.
fn split_of(seen: &Seen) -> (ThreadSplit, ThreadSplit) {
    let mut cpu = ThreadSplit::default();
    let mut switches = ThreadSplit::default();
    for ((process, _), t) in seen {
        if t.comm == "lab-cpu-sampler" {
            continue;
        }
        cpu.add(
            *process,
            &t.comm,
            t.last.0.saturating_sub(t.first.0) as f64 / 1e6,
        );
        switches.add(*process, &t.comm, t.last.1.saturating_sub(t.first.1) as f64);
    }
    (cpu, switches)
}

/// Samples thread CPU times from [`CpuSampler::start`] to [`CpuSampler::finish`].
pub(crate) struct CpuSampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<CpuSeries>>,
}

impl CpuSampler {
    /// Starts sampling. Threads alive now count from their current CPU time, threads that
    /// start later from zero.
    pub fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let mut seen = Seen::new();
        let mut memserver = None;
        sample(&mut seen, &mut memserver, true);
        let flag = stop.clone();
        let t0 = std::time::Instant::now();
        let thread = std::thread::Builder::new()
            .name("lab-cpu-sampler".into())
            .spawn(move || {
                let mut series = CpuSeries::default();
                series.points.push((
                    Duration::ZERO,
                    ThreadSplit::default(),
                    ThreadSplit::default(),
                ));
                loop {
                    let last = flag.load(Ordering::Relaxed);
                    if !last {
                        std::thread::sleep(PERIOD);
                    }
                    sample(&mut seen, &mut memserver, false);
                    let (cpu, switches) = split_of(&seen);
                    series.points.push((t0.elapsed(), cpu, switches));
                    if last {
                        return series;
                    }
                }
            })
            .ok();
        Self { stop, thread }
    }

    /// Stops sampling; the CPU split since [`CpuSampler::start`] over time (empty, all zero,
    /// if the sampler thread could not be started).
    pub fn finish(mut self) -> CpuSeries {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for CpuSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn clock_ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// One pass over this process's tasks and its memserver child's tasks.
fn sample(seen: &mut Seen, memserver: &mut Option<u32>, initial: bool) {
    let own = std::process::id();
    for (tid, comm, now) in tasks(own) {
        let e = seen.entry((Process::Own, tid)).or_insert_with(|| Task {
            comm: comm.clone(),
            first: if initial { now } else { (0, 0) },
            last: now,
        });
        e.comm = comm;
        e.last = now;
    }
    if memserver.is_none() {
        *memserver = find_memserver(own);
    }
    if let Some(child) = *memserver {
        for (tid, comm, now) in tasks(child) {
            let e = seen
                .entry((Process::Memserver, tid))
                .or_insert_with(|| Task {
                    comm,
                    first: if initial { now } else { (0, 0) },
                    last: now,
                });
            e.last = now;
        }
    }
}

/// The pid of a `farvm-memserver` child of process `own`, if one runs.
fn find_memserver(own: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|d| {
        let pid = d.file_name().to_str()?.parse::<u32>().ok()?;
        let stat = std::fs::read_to_string(d.path().join("stat")).ok()?;
        let (head, rest) = stat.rsplit_once(") ")?;
        let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
        (ppid == own && head.split_once(" (")?.1.starts_with("farvm-memserv")).then_some(pid)
    })
}

/// (tid, comm, (CPU time in ns, context switches)) of every task of `pid`. CPU time is the
/// scheduler's exact run time (`se.sum_exec_runtime` in `/proc/PID/task/TID/sched`, ms with ns
/// digits) where the kernel shows it, else user + system time from `stat` in clock ticks;
/// context switches are voluntary + involuntary from `status`.
fn tasks(pid: u32) -> Vec<(u32, String, (u64, u64))> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let ns_per_tick = 1e9 / clock_ticks_per_sec();
    dir.flatten()
        .filter_map(|t| {
            let tid = t.file_name().to_str()?.parse::<u32>().ok()?;
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let (head, rest) = stat.rsplit_once(") ")?;
            let comm = head.split_once(" (")?.1.to_string();
            let exact = std::fs::read_to_string(t.path().join("sched"))
                .ok()
                .and_then(|s| {
                    let line = s.lines().find(|l| l.starts_with("se.sum_exec_runtime"))?;
                    let ms: f64 = line.rsplit_once(':')?.1.trim().parse().ok()?;
                    Some((ms * 1e6) as u64)
                });
            let ns = match exact {
                Some(ns) => ns,
                None => {
                    // After "comm) ": state is field 3, utime field 14, stime field 15.
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    let utime: u64 = f.get(11)?.parse().ok()?;
                    let stime: u64 = f.get(12)?.parse().ok()?;
                    ((utime + stime) as f64 * ns_per_tick) as u64
                }
            };
            let switches = std::fs::read_to_string(t.path().join("status"))
                .map(|s| {
                    s.lines()
                        .filter(|l| l.contains("ctxt_switches:"))
                        .filter_map(|l| l.rsplit_once(':')?.1.trim().parse::<u64>().ok())
                        .sum()
                })
                .unwrap_or(0);
            Some((tid, comm, (ns, switches)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_cpu_ms() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
    }

    #[test]
    fn a_busy_thread_is_counted_by_its_name_and_a_sleeping_one_by_its_switches() {
        use std::sync::mpsc::channel;
        let sampler = CpuSampler::start();
        // Each thread reports when its work is done and stays alive until released, so the
        // sampler's last sample (taken by `finish`) sees its final times however late the
        // loaded host schedules the sampler.
        let (done_tx, done_rx) = channel::<()>();
        let (busy_go, busy_release) = channel::<()>();
        let (sleepy_go, sleepy_release) = channel::<()>();
        let busy = {
            let done = done_tx.clone();
            std::thread::Builder::new()
                .name("ept-evict".into())
                .spawn(move || {
                    // Busy for 100 ms of its own CPU time, however loaded the host.
                    let mut x = 0u64;
                    while thread_cpu_ms() < 100.0 {
                        for _ in 0..10_000 {
                            x = x.wrapping_mul(31).wrapping_add(1);
                        }
                    }
                    std::hint::black_box(x);
                    done.send(()).unwrap();
                    let _ = busy_release.recv();
                })
                .unwrap()
        };
        let sleepy = std::thread::Builder::new()
            .name("ept-fault".into())
            .spawn(move || {
                for _ in 0..20 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                done_tx.send(()).unwrap();
                let _ = sleepy_release.recv();
            })
            .unwrap();
        done_rx.recv().unwrap();
        done_rx.recv().unwrap();
        let series = sampler.finish();
        busy_go.send(()).unwrap();
        sleepy_go.send(()).unwrap();
        busy.join().unwrap();
        sleepy.join().unwrap();
        let split = series.total();
        let (cpu, switches) = series.window(Duration::ZERO, Duration::from_secs(3600));
        assert_eq!(cpu, split);
        assert!(
            split.evict >= 90.0 && split.evict < 1000.0,
            "100 ms of CPU counted as {split:?}"
        );
        assert!(split.fault < 50.0, "{split:?}");
        assert!(split.total() >= split.evict);
        // Each sleep is a block and a wake-up.
        assert!(switches.fault >= 20.0, "{switches:?}");
    }
}
