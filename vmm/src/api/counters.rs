//! `vm.counters`: farvm's counters in Cloud Hypervisor's shape (groups of named integers):
//!
//! - `vm`: `uptime_ms`, `exits`;
//! - `exits`: vCPU exits by kind; `guest`: the PV device's counters;
//! - `paging` (remote memory): the paging engine's counters (`demand_faults`,
//!   `prefetch_issued`, ...), its page gauges, `accuracy_ppm`/`coverage_ppm` of the
//!   prefetches, and latency summaries; `memservers`: the memory servers' health;
//! - `process.<pid>`: each guest process's state, cpu, workload, ops, checksum and measured
//!   time (`elapsed_ns`).
//!
//! Fractions are reported as parts per million (`NAME_ppm`); text fields are left out.

use farvm_chapi::info::{flatten_into, Counters};
use serde::Serialize;

use crate::devices::pvctl::ProcessRecord;
use crate::vm::{VmCounters, VmReport};

fn group<T: Serialize>(c: &mut Counters, name: &str, v: &T) {
    let v = serde_json::to_value(v).unwrap_or_default();
    flatten_into(c.entry(name.to_string()).or_default(), "", &v);
}

fn processes(c: &mut Counters, procs: &[ProcessRecord]) {
    for p in procs {
        let g = c.entry(format!("process.{}", p.pid)).or_default();
        for (k, v) in [
            ("cpu", p.cpu as u64),
            ("workload", p.workload as u64),
            ("state", p.state as u64),
            ("phase", p.phase as u64),
            ("ops", p.ops),
            ("checksum", p.checksum),
            ("elapsed_ns", p.elapsed_ns),
            ("error", p.error),
            ("heap_bytes", p.heap_bytes),
        ] {
            g.insert(k.to_string(), v);
        }
    }
}

/// The counters of a running VM.
pub fn live(v: &VmCounters, procs: &[ProcessRecord]) -> Counters {
    let mut c = Counters::new();
    let vm = c.entry("vm".into()).or_default();
    vm.insert("uptime_ms".into(), (v.uptime_secs * 1e3) as u64);
    vm.insert("exits".into(), v.exits_total);
    group(&mut c, "exits", &v.exits);
    group(&mut c, "guest", &v.pv);
    if let Some(p) = &v.paging {
        group(&mut c, "paging", &p.engine);
        group(&mut c, "memservers", &p.remote);
    }
    processes(&mut c, procs);
    c
}

/// The counters of a VM that has stopped, from its final report.
pub fn finished(r: &VmReport) -> Counters {
    let mut c = Counters::new();
    let vm = c.entry("vm".into()).or_default();
    vm.insert("uptime_ms".into(), (r.uptime_secs * 1e3) as u64);
    vm.insert("exits".into(), r.exits.total());
    group(&mut c, "exits", &r.exits);
    if let Some(p) = &r.paging {
        group(&mut c, "paging", &p.engine);
        group(&mut c, "memservers", &p.remote);
    }
    processes(&mut c, &r.processes);
    c
}
