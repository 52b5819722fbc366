//! Decision cost per fault of each prefetcher (criterion).
//!
//! The calls a prefetcher gets are those of a realistic run: a trace of four processes
//! interleaved access by access (a sequential scan, a stride-10 walk, uniform random pages over
//! 2^20, and two interleaved scans in one process; 2^16 accesses each) is replayed through the
//! evaluator in `injected` mode with 2^16 local pages, and every call the prefetcher receives
//! (`on_fault`, `on_marker_hit`; `on_hit` never happens in this mode) is recorded. The benchmark
//! replays that call log into a freshly built prefetcher and reports time per *decision*
//! (a fault or a marker hit) via criterion's throughput. `none` is the baseline measured in the
//! same run (the cost of the dynamic call and the loop); read the others as ratios to it, or in
//! absolute ns per decision on this machine.
//!
//! Time is the benchmark thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time: the
//! build machines are shared (load averages of 8 on 2 cores are common), and wall time would
//! mostly measure the scheduler. Set `FARVM_BENCH_WALL=1` to measure wall time instead.

use std::hint::black_box;

use std::time::{Duration, Instant};

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_main, BatchSize, Criterion, Throughput};
use farvm_prefetch::eval::{replay, EvalConfig};
use farvm_prefetch::trace::Trace;
use farvm_prefetch::{
    build, names, Candidates, Config, HitVisibility, Nanos, PageNo, Prefetcher, ProcessKey,
};

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_THREAD_CPUTIME_ID is supported by
    // every Linux kernel this project runs on; the call writes only `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Criterion measurement: thread CPU time, or wall time with `FARVM_BENCH_WALL=1`.
struct CpuTime {
    wall: bool,
    epoch: Instant,
}

impl CpuTime {
    fn now(&self) -> Duration {
        if self.wall {
            self.epoch.elapsed()
        } else {
            thread_cpu()
        }
    }
}

struct NsFormatter;

impl ValueFormatter for NsFormatter {
    fn scale_values(&self, _typical: f64, _values: &mut [f64]) -> &'static str {
        "ns"
    }
    fn scale_throughputs(&self, _typical: f64, t: &Throughput, values: &mut [f64]) -> &'static str {
        // Reported as ns per element (decision), the unit the target is stated in.
        let n = match *t {
            Throughput::Elements(n) | Throughput::Bytes(n) | Throughput::BytesDecimal(n) => n,
            _ => 1,
        }
        .max(1) as f64;
        for v in values.iter_mut() {
            *v /= n;
        }
        "ns/decision"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

impl Measurement for CpuTime {
    type Intermediate = Duration;
    type Value = Duration;
    fn start(&self) -> Duration {
        self.now()
    }
    fn end(&self, start: Duration) -> Duration {
        self.now().saturating_sub(start)
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, v: &Duration) -> f64 {
        v.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &NsFormatter
    }
}

#[derive(Clone, Copy)]
enum Call {
    Fault(ProcessKey, PageNo, Nanos),
    Marker(ProcessKey, PageNo, Nanos),
    Hit(ProcessKey, PageNo, Nanos),
}

struct Recorder {
    inner: Box<dyn Prefetcher>,
    calls: Vec<Call>,
}

impl Prefetcher for Recorder {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn on_fault(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        self.calls.push(Call::Fault(key, page, now));
        self.inner.on_fault(key, page, now, out);
    }
    fn on_hit(&mut self, key: ProcessKey, page: PageNo, now: Nanos) {
        self.calls.push(Call::Hit(key, page, now));
        self.inner.on_hit(key, page, now);
    }
    fn on_marker_hit(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        self.calls.push(Call::Marker(key, page, now));
        self.inner.on_marker_hit(key, page, now, out);
    }
    fn forget(&mut self, key: ProcessKey) {
        self.inner.forget(key);
    }
}

fn trace() -> Trace {
    let mut x = 0x9e37_79b9u64;
    let mut pairs = Vec::new();
    for j in 0..(1u64 << 16) {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        pairs.push((1, j));
        pairs.push((2, 10 * j));
        pairs.push((3, x >> 44));
        pairs.push((4, if j % 2 == 0 { j / 2 } else { (1 << 30) + j / 2 }));
    }
    Trace::from_pairs(pairs)
}

fn decision(c: &mut Criterion<CpuTime>) {
    let trace = trace();
    let eval = EvalConfig {
        local_pages: 1 << 16,
        hits: HitVisibility::Injected,
        eager_eviction: false,
        marker_continuation: true,
    };
    let cfg = Config::default();
    let mut group = c.benchmark_group("decision_per_fault");
    for &name in names() {
        let mut rec = Recorder {
            inner: build(name, &cfg).expect("defaults build"),
            calls: Vec::new(),
        };
        replay(&trace, &mut rec, &eval, &mut |_| {}).expect("replay runs");
        let calls = rec.calls;
        let decisions = calls.iter().filter(|c| !matches!(c, Call::Hit(..))).count();
        group.throughput(Throughput::Elements(decisions as u64));
        group.bench_function(name, |b| {
            b.iter_batched(
                || build(name, &cfg).expect("defaults build"),
                |mut pf| {
                    let mut out = Candidates::new();
                    for &call in &calls {
                        match call {
                            Call::Fault(k, p, t) => pf.on_fault(k, p, t, &mut out),
                            Call::Marker(k, p, t) => pf.on_marker_hit(k, p, t, &mut out),
                            Call::Hit(k, p, t) => pf.on_hit(k, p, t),
                        }
                        black_box(out.len());
                    }
                    pf
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

fn config() -> Criterion<CpuTime> {
    Criterion::default().with_measurement(CpuTime {
        wall: std::env::var_os("FARVM_BENCH_WALL").is_some_and(|v| v == "1"),
        epoch: Instant::now(),
    })
}

/// The criterion group (in a module: the macro's function takes no doc comment).
mod group {
    use super::{config, decision};
    criterion::criterion_group! {
        name = benches;
        config = config();
        targets = decision
    }
}
criterion_main!(group::benches);
