//! CPU time of one remote-memory VM run, split by thread: the vCPU, the engine's fault handler
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

/// CPU milliseconds of one run by thread class.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct CpuSplit {
    pub vcpu_ms: f64,
    pub fault_ms: f64,
    pub evict_ms: f64,
    /// memclient receive threads: page reception and the engine's completion path (install).
    pub store_rx_ms: f64,
    /// memclient send and maintenance threads.
    pub store_tx_ms: f64,
    /// The memserver child process, all threads.
    pub memserver_ms: f64,
    /// Every other thread of this process that ran during the VM run (VM setup, devices).
    pub other_ms: f64,
}

impl CpuSplit {
    pub fn total_ms(&self) -> f64 {
        self.vcpu_ms
            + self.fault_ms
            + self.evict_ms
            + self.store_rx_ms
            + self.store_tx_ms
            + self.memserver_ms
            + self.other_ms
    }

    /// `self - earlier`, class by class.
    pub fn since(&self, earlier: &CpuSplit) -> CpuSplit {
        CpuSplit {
            vcpu_ms: self.vcpu_ms - earlier.vcpu_ms,
            fault_ms: self.fault_ms - earlier.fault_ms,
            evict_ms: self.evict_ms - earlier.evict_ms,
            store_rx_ms: self.store_rx_ms - earlier.store_rx_ms,
            store_tx_ms: self.store_tx_ms - earlier.store_tx_ms,
            memserver_ms: self.memserver_ms - earlier.memserver_ms,
            other_ms: self.other_ms - earlier.other_ms,
        }
    }

    fn add(&mut self, process: Process, comm: &str, ms: f64) {
        let slot = match process {
            Process::Memserver => &mut self.memserver_ms,
            Process::Own if comm.starts_with("vcpu") => &mut self.vcpu_ms,
            Process::Own if comm == "ept-fault" => &mut self.fault_ms,
            Process::Own if comm == "ept-evict" => &mut self.evict_ms,
            Process::Own if comm.starts_with("memclient-rx") => &mut self.store_rx_ms,
            Process::Own if comm.starts_with("memclient-") => &mut self.store_tx_ms,
            Process::Own => &mut self.other_ms,
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
    pub whole: CpuSplit,
    /// Between the workload's MEASURE and MEASURED doorbells; `None` if it did not get there.
    pub measured: Option<CpuSplit>,
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
        let measured =
            rec.and_then(|r| Some(series.window(at(r, phase::MEASURE)?, at(r, phase::MEASURED)?)));
        let measured_pages_read = rec
            .and_then(|r| r.measured_phase_paging())
            .map_or(0, |d| d.bytes_read / 4096);
        Self {
            whole: series.total(),
            measured,
            measured_pages_read,
        }
    }

    /// µs of CPU (all threads) per page read in the measured phase (NaN without one).
    pub fn us_per_page(&self) -> f64 {
        match self.measured {
            Some(m) if self.measured_pages_read > 0 => {
                m.total_ms() * 1e3 / self.measured_pages_read as f64
            }
            _ => f64::NAN,
        }
    }
}

/// (process, tid) -> (comm, CPU ns at first sight, latest CPU ns).
type Seen = HashMap<(Process, u32), (String, u64, u64)>;

/// The CPU split since the sampler started, at points in time (since it started).
#[derive(Debug, Default)]
pub(crate) struct CpuSeries {
    points: Vec<(Duration, CpuSplit)>,
}

impl CpuSeries {
    /// The split of the whole sampled time.
    pub fn total(&self) -> CpuSplit {
        self.points.last().map(|p| p.1).unwrap_or_default()
    }

    /// The split between `from` and `to` (times since the sampler started), from the samples
    /// nearest them.
    pub fn window(&self, from: Duration, to: Duration) -> CpuSplit {
        let at = |t: Duration| {
            self.points
                .iter()
                .min_by_key(|p| p.0.abs_diff(t))
                .map(|p| p.1)
                .unwrap_or_default()
        };
        at(to).since(&at(from))
    }
}

fn split_of(seen: &Seen) -> CpuSplit {
    let mut split = CpuSplit::default();
    for ((process, _), (comm, first, last)) in seen {
        if comm == "lab-cpu-sampler" {
            continue;
        }
        split.add(*process, comm, last.saturating_sub(*first) as f64 / 1e6);
    }
    split
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
                series.points.push((Duration::ZERO, CpuSplit::default()));
                loop {
                    let last = flag.load(Ordering::Relaxed);
                    if !last {
                        std::thread::sleep(PERIOD);
                    }
                    sample(&mut seen, &mut memserver, false);
                    series.points.push((t0.elapsed(), split_of(&seen)));
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
    for (tid, comm, ticks) in tasks(own) {
        let e = seen
            .entry((Process::Own, tid))
            .or_insert_with(|| (comm.clone(), if initial { ticks } else { 0 }, ticks));
        e.0 = comm;
        e.2 = ticks;
    }
    if memserver.is_none() {
        *memserver = find_memserver(own);
    }
    if let Some(child) = *memserver {
        for (tid, comm, ticks) in tasks(child) {
            let e = seen
                .entry((Process::Memserver, tid))
                .or_insert_with(|| (comm, if initial { ticks } else { 0 }, ticks));
            e.2 = ticks;
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

/// (tid, comm, CPU time in ns) of every task of `pid`: the scheduler's exact run time
/// (`se.sum_exec_runtime` in `/proc/PID/task/TID/sched`, ms with ns digits) where the kernel
/// shows it, else user + system time from `stat`, in clock ticks.
fn tasks(pid: u32) -> Vec<(u32, String, u64)> {
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
            Some((tid, comm, ns))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_busy_thread_is_counted_by_its_name() {
        let sampler = CpuSampler::start();
        let t = std::thread::Builder::new()
            .name("ept-evict".into())
            .spawn(|| {
                let t0 = std::time::Instant::now();
                let mut x = 0u64;
                while t0.elapsed() < Duration::from_millis(300) {
                    x = x.wrapping_mul(31).wrapping_add(1);
                }
                std::hint::black_box(x);
            })
            .unwrap();
        t.join().unwrap();
        let series = sampler.finish();
        let split = series.total();
        assert_eq!(
            series.window(Duration::ZERO, Duration::from_secs(3600)),
            split
        );
        // Some CPU was seen (the exact share depends on the host's load).
        assert!(split.evict_ms > 0.0, "{split:?}");
        assert_eq!(split.fault_ms, 0.0);
        assert!(split.total_ms() >= split.evict_ms);
    }
}
