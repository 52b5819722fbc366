//! CPU time and context switches of one remote-memory VM run, split by thread: the vCPU, the
//! engine's fault handler and evictor, the memclient receive and send threads (completions are
//! applied on the receive thread: the page lands and is installed there), the embedded
//! memserver child (all its threads), and the rest of this process. A sampler thread reads the
//! tasks of this process and of the embedded memserver child every [`PERIOD`]
//! (`/proc/PID/task/TID/schedstat`), keeping each thread's latest CPU time, so a thread that
//! exits loses at most one period. Times are the scheduler's exact run times where the kernel
//! shows them, else clock ticks. Each sample is kept with its time, so the split of a window of
//! the run (the workload's measured phase) is the difference of the samples nearest its ends.
//! The sampler's own CPU time is reported apart ([`RunCpu::sampler_ms`]): it is the
//! measurement's cost, not farvm's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use serde::Serialize;

const PERIOD: Duration = Duration::from_millis(10);
/// The sampler thread's name.
const SAMPLER: &str = "lab-cpu-sampler";

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
    /// CPU ms of the sampler thread itself over the whole run (left out of the splits).
    pub sampler_ms: f64,
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
            sampler_ms: series.sampler_ms,
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
    /// CPU ms the sampler thread used.
    sampler_ms: f64,
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
        if t.comm == SAMPLER {
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
        let mut open = OpenTasks::default();
        let mut memserver = None;
        sample(&mut seen, &mut open, &mut memserver, true);
        let flag = stop.clone();
        let t0 = std::time::Instant::now();
        let thread = std::thread::Builder::new()
            .name(SAMPLER.into())
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
                    sample(&mut seen, &mut open, &mut memserver, false);
                    let (cpu, switches) = split_of(&seen);
                    series.points.push((t0.elapsed(), cpu, switches));
                    if last {
                        series.sampler_ms = seen
                            .values()
                            .filter(|t| t.comm == SAMPLER)
                            .map(|t| t.last.0.saturating_sub(t.first.0) as f64 / 1e6)
                            .sum();
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
fn sample(seen: &mut Seen, open: &mut OpenTasks, memserver: &mut Option<u32>, initial: bool) {
    let own = std::process::id();
    open.listed.clear();
    for (tid, comm, now) in open.tasks(own) {
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
        for (tid, comm, now) in open.tasks(child) {
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
    // Tasks gone since: their files are closed.
    let listed = &open.listed;
    open.files.retain(|tid, _| listed.contains(tid));
}

/// The pid of a `farvm-memserver` child of process `own`, if one runs: looked for among the
/// children its threads list (`/proc/PID/task/TID/children`), not in all of `/proc`, since a
/// local-only run, which has none, looks for it every period.
fn find_memserver(own: u32) -> Option<u32> {
    let tasks = std::fs::read_dir(format!("/proc/{own}/task")).ok()?;
    tasks.flatten().find_map(|t| {
        let children = std::fs::read_to_string(t.path().join("children")).ok()?;
        children.split_whitespace().find_map(|c| {
            let pid = c.parse::<u32>().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            comm.starts_with("farvm-memserv").then_some(pid)
        })
    })
}

/// The `comm` and `schedstat` files of the tasks sampled, kept open from one sample to the
/// next: a sample then costs one `pread` per file, not an open, a stat, a read and a close
/// (the sampler reads them every period for some 30 tasks; reading each task's long `sched`
/// table afresh, it took 6-10% of a scan bench's CPU samples, 1% this way).
#[derive(Default)]
struct OpenTasks {
    files: HashMap<u32, TaskFiles>,
    /// The tids the current sample listed.
    listed: std::collections::HashSet<u32>,
}

struct TaskFiles {
    comm: std::fs::File,
    /// `None` where the kernel has no `schedstat`.
    schedstat: Option<std::fs::File>,
}

impl OpenTasks {
    /// (tid, comm, (CPU time in ns, context switches)) of every task of `pid`: from
    /// `schedstat`, the scheduler's exact run time (`se.sum_exec_runtime`, ns) and how many
    /// times the task was switched in (its context switches); where the kernel has no
    /// `schedstat`, user + system time in clock ticks from `stat` and voluntary + involuntary
    /// switches from `status`.
    fn tasks(&mut self, pid: u32) -> Vec<(u32, String, (u64, u64))> {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        let mut buf = [0u8; 128];
        dir.flatten()
            .filter_map(|t| {
                let tid = t.file_name().to_str()?.parse::<u32>().ok()?;
                self.listed.insert(tid);
                let f = match self.files.entry(tid) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(TaskFiles {
                        comm: std::fs::File::open(t.path().join("comm")).ok()?,
                        schedstat: std::fs::File::open(t.path().join("schedstat")).ok(),
                    }),
                };
                let read = |f: &TaskFiles, buf: &mut [u8]| {
                    let comm = read_at_start(&f.comm, buf)?.trim_end().to_string();
                    let times = match &f.schedstat {
                        Some(file) => {
                            let s = read_at_start(file, buf)?;
                            let mut fields = s.split_whitespace();
                            let ns = fields.next()?.parse().ok()?;
                            (ns, fields.nth(1)?.parse().ok()?)
                        }
                        None => ticks_and_switches(&t.path())?,
                    };
                    Some((tid, comm, times))
                };
                let r = read(f, &mut buf);
                if r.is_none() {
                    // Gone (its tid may come back for a new task: opened afresh then).
                    self.files.remove(&tid);
                }
                r
            })
            .collect()
    }
}

/// The text of a short procfs file, read again from its start.
fn read_at_start<'b>(f: &std::fs::File, buf: &'b mut [u8]) -> Option<&'b str> {
    use std::os::unix::fs::FileExt;
    let n = f.read_at(buf, 0).ok()?;
    std::str::from_utf8(&buf[..n]).ok()
}

/// (CPU ns in clock-tick resolution, context switches) of the task at `dir`, from `stat` and
/// `status`: for kernels without `schedstat`.
fn ticks_and_switches(dir: &std::path::Path) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    // After "comm) ": state is field 3, utime field 14, stime field 15.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    let ns = ((utime + stime) as f64 * 1e9 / clock_ticks_per_sec()) as u64;
    let switches = std::fs::read_to_string(dir.join("status"))
        .map(|s| {
            s.lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.rsplit_once(':')?.1.trim().parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    Some((ns, switches))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thread_cpu_ms() -> f64 {
        farvm_memclient::bench::thread_cpu().as_secs_f64() * 1e3
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
