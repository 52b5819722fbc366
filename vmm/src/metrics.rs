//! The VM's Prometheus metrics (`farvm run --metrics ADDR`), served by farvm-httpd: a
//! collector that takes a snapshot of the VM on every scrape — exits and uptime, and with
//! remote memory the paging engine's counters, gauges and latency quantiles and the memory
//! servers' health — every series labelled `vm="<name>"`.
//!
//! Series: `farvm_vm_exits_total`, `farvm_vm_uptime_seconds`; `farvm_ept_<counter>_total` for
//! each engine counter; the gauges `farvm_ept_{total,budget,reserve,resident}_pages`,
//! `farvm_ept_prefetch_{inflight,accuracy,accuracy_markers,coverage}`; the latency quantiles
//! `farvm_ept_<what>_seconds{quantile="0.5"|"0.99"|"0.999"}` with `_sum` and `_count`; and
//! `farvm_memservers`, `farvm_replication`, `farvm_memserver_*`. Per guest process (remote
//! memory; labels `pid` and `name`, one series per process the engine tracks, so at most
//! `farvm_ept::procstats::MAX_PROCESSES` each): `farvm_process_<counter>_total` for each
//! per-process counter and the gauges `farvm_process_prefetch_{accuracy,coverage}`; and
//! `farvm_process_unattributed_faults_total{reason=...}`.

use std::fmt;
use std::sync::{Arc, Weak};

use farvm_ept::stats::LatencySummary;
use farvm_ept::Stats;
use farvm_httpd::metrics::{router, Families};
use farvm_httpd::prometheus_client::collector::Collector;
use farvm_httpd::prometheus_client::encoding::DescriptorEncoder;
use farvm_httpd::{Exposition, HttpError, HttpServer, Listen};

use crate::process_stats::{PerProcessStats, ProcessRow};
use crate::remote::{RemoteHealth, RemoteStats};
use crate::vm::VmShared;

/// Serves `vm`'s metrics on `listen` from a thread named `metrics` (until dropped).
pub fn serve(listen: &Listen, vm: &Arc<VmShared>) -> Result<HttpServer, HttpError> {
    let mut exposition = Exposition::new();
    exposition.register_collector(VmCollector(Arc::downgrade(vm)));
    HttpServer::start_in(
        listen,
        "metrics",
        Some(farvm_sandbox::ThreadClass::Metrics),
        router(Arc::new(exposition)),
    )
}

/// The VM's metrics, taken on each scrape; nothing once the VM is gone.
#[derive(Debug)]
struct VmCollector(Weak<VmShared>);

impl Collector for VmCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let Some(vm) = self.0.upgrade() else {
            return Ok(());
        };
        let name = label_value(&vm.name);
        let mut f = Families::new(encoder, &[("vm", &name)]);
        if let Some(paging) = vm.paging_stats() {
            encode_paging(&mut f, &paging)?;
        }
        if let Some(procs) = vm.per_process() {
            encode_processes(&mut f, &procs)?;
        }
        f.counter(
            "farvm_vm_exits",
            "vCPU exits to the VMM (all kinds).",
            vm.exits.snapshot().total(),
        )?;
        f.gauge(
            "farvm_vm_uptime_seconds",
            "Time since the VM was built.",
            vm.started.elapsed().as_secs_f64(),
        )
    }
}

/// A VM name as a label value: quotes, backslashes and newlines become `_` (as they always
/// have in farvm's series, so dashboards keep matching).
fn label_value(name: &str) -> String {
    name.replace(['"', '\\', '\n'], "_")
}

/// The paging engine's and the memory servers' series.
pub fn encode_paging(f: &mut Families<'_>, s: &RemoteStats) -> fmt::Result {
    encode_engine(f, &s.engine)?;
    if let Some(r) = &s.lazy_restore {
        f.counter(
            "farvm_restore_page_file_reads",
            "Pages a lazily restored VM read from its snapshot's page file.",
            r.page_file_reads,
        )?;
        f.counter(
            "farvm_restore_working_set_fetched",
            "Pages of the snapshot's recorded working set fetched (--restore-pages working-set).",
            r.working_set_fetched,
        )?;
    }
    encode_health(f, &s.remote)
}

fn encode_engine(f: &mut Families<'_>, s: &Stats) -> fmt::Result {
    for (name, v) in s.counters.pairs() {
        f.counter(
            &format!("farvm_ept_{name}"),
            &format!("Paging engine counter `{name}` (see `farvm stats`)."),
            v,
        )?;
    }
    let pages = [
        ("total_pages", "Guest RAM pages.", s.total_pages),
        (
            "budget_pages",
            "Local-memory budget in pages.",
            s.budget_pages,
        ),
        (
            "reserve_pages",
            "Free frames the evictor keeps in reserve.",
            s.reserve_pages,
        ),
        ("resident_pages", "Pages resident now.", s.resident_pages),
        (
            "prefetch_inflight",
            "Prefetch reads in flight.",
            s.prefetch_inflight,
        ),
    ];
    for (name, help, v) in pages {
        f.gauge(&format!("farvm_ept_{name}"), help, v)?;
    }
    let ratios = [
        (
            "prefetch_accuracy",
            "Estimated hit rate of all prefetches (sampled probes).",
            s.accuracy,
        ),
        (
            "prefetch_accuracy_markers",
            "Hit rate of staged prefetches (markers and probes).",
            s.accuracy_markers,
        ),
        (
            "prefetch_coverage",
            "Estimated prefetch hits / (hits + demand faults).",
            s.coverage,
        ),
    ];
    for (name, help, v) in ratios {
        f.gauge(&format!("farvm_ept_{name}"), help, v)?;
    }
    let latencies: [(&str, &str, &LatencySummary); 7] = [
        ("fault_service", "Guest fault to wake-up", &s.fault_service),
        (
            "zero_fill",
            "Zero-fill of a never-written page",
            &s.zero_fill,
        ),
        (
            "store_read",
            "Page read from the memory store",
            &s.store_read,
        ),
        ("install", "Page install into the guest view", &s.install),
        (
            "prefetch_timeliness",
            "Prefetch arrival ahead of the guest's touch",
            &s.prefetch_timeliness,
        ),
        ("evict_round", "Evictor round", &s.evict_round),
        ("wake", "Wake-up of a faulting vCPU", &s.wake),
    ];
    for (name, help, l) in latencies {
        f.quantiles(
            &format!("farvm_ept_{name}_seconds"),
            &format!("{help}, seconds."),
            &[
                ("0.5", l.p50 as f64 / 1e9),
                ("0.99", l.p99 as f64 / 1e9),
                ("0.999", l.p999 as f64 / 1e9),
            ],
            l.mean * l.count as f64 / 1e9,
            l.count,
        )?;
    }
    Ok(())
}

/// Longest `name` label value (Linux's task names are 15 bytes; longer names are cut).
const MAX_NAME_LABEL: usize = 32;

/// The per-process series (module docs).
pub fn encode_processes(f: &mut Families<'_>, p: &PerProcessStats) -> fmt::Result {
    let labels: Vec<(String, String)> = p
        .processes
        .iter()
        .map(|r| {
            let name = label_value(r.name.as_deref().unwrap_or(""));
            (
                r.pid.to_string(),
                name.chars().take(MAX_NAME_LABEL).collect(),
            )
        })
        .collect();
    let series_labels: Vec<[(&str, &str); 2]> = labels
        .iter()
        .map(|(pid, name)| [("pid", pid.as_str()), ("name", name.as_str())])
        .collect();
    let pairs: Vec<Vec<(&'static str, u64)>> =
        p.processes.iter().map(|r| r.counters.pairs()).collect();
    let Some(first) = pairs.first() else {
        return encode_unattributed(f, p);
    };
    for (k, (name, _)) in first.iter().enumerate() {
        let series: Vec<(&[(&str, &str)], u64)> = series_labels
            .iter()
            .zip(&pairs)
            .map(|(l, v)| (&l[..], v[k].1))
            .collect();
        f.counter_series(
            &format!("farvm_process_{name}"),
            &format!("Per guest process: paging engine counter `{name}` (see `farvm stats --per-process`)."),
            &series,
        )?;
    }
    let ratio = |get: fn(&ProcessRow) -> f64| -> Vec<(&[(&str, &str)], f64)> {
        series_labels
            .iter()
            .zip(&p.processes)
            .map(|(l, r)| (&l[..], get(r)))
            .collect()
    };
    f.gauge_series(
        "farvm_process_prefetch_accuracy",
        "Per guest process: estimated hit rate of its prefetches.",
        &ratio(|r| r.accuracy),
    )?;
    f.gauge_series(
        "farvm_process_prefetch_coverage",
        "Per guest process: estimated prefetch hits / (those + its demand faults).",
        &ratio(|r| r.coverage),
    )?;
    encode_unattributed(f, p)
}

fn encode_unattributed(f: &mut Families<'_>, p: &PerProcessStats) -> fmt::Result {
    let u = &p.unattributed;
    f.counter_series(
        "farvm_process_unattributed_faults",
        "Guest faults no process could be given, by reason.",
        &[
            (&[("reason", "no_vcpu")], u.no_vcpu),
            (&[("reason", "no_slot")], u.no_slot),
            (&[("reason", "unreadable")], u.unreadable),
        ],
    )
}

fn encode_health(f: &mut Families<'_>, r: &RemoteHealth) -> fmt::Result {
    f.gauge(
        "farvm_memservers",
        "Memory servers.",
        r.servers.len() as u64,
    )?;
    f.gauge(
        "farvm_remote_pages_to_reseal",
        "While a page-key rotation runs: stored pages that may still be sealed under the \
         previous key (0 when none runs).",
        r.pages_to_reseal,
    )?;
    f.gauge(
        "farvm_replication",
        "Copies of each remote page.",
        r.replication as u64,
    )?;
    f.gauge(
        "farvm_memserver_dead",
        "Memory servers out of service now.",
        r.dead_servers.saturating_sub(r.rejoined_servers),
    )?;
    let counters = [
        (
            "memserver_taken_out_of_service",
            "Times a memory server was taken out of service.",
            r.dead_servers,
        ),
        (
            "memserver_rejoined",
            "Times a memory server was put back in service.",
            r.rejoined_servers,
        ),
        (
            "memserver_read_failovers",
            "Reads served by another replica.",
            r.read_failovers,
        ),
        (
            "memserver_slabs_rereplicated",
            "Slabs copied to a new replica.",
            r.slabs_rereplicated,
        ),
        (
            "memserver_replicas_moved",
            "Slab replicas moved to another server (drain, rebalance, a full server).",
            r.replicas_moved,
        ),
        (
            "memserver_replicas_dropped",
            "Slab replicas dropped because they missed a write; the slab is re-replicated.",
            r.replicas_dropped,
        ),
        (
            "memserver_replicas_rejected",
            "Slab replicas dropped because a read from them returned a stale page.",
            r.replicas_rejected,
        ),
        (
            "remote_unauthentic",
            "Read responses whose sealed pages failed authentication (never installed).",
            r.remote_unauthentic,
        ),
        (
            "memserver_requests",
            "Requests sent to the memory servers.",
            r.wire_requests,
        ),
        (
            "memserver_failed_requests",
            "Requests that failed.",
            r.failed_requests,
        ),
    ];
    for (name, help, v) in counters {
        f.counter(&format!("farvm_{name}"), help, v)?;
    }
    f.gauge(
        "farvm_memserver_suspended_slabs",
        "Slabs with no replica in service (their pages wait).",
        r.suspended_slabs,
    )?;
    f.gauge(
        "farvm_memserver_degraded_slabs",
        "Slabs with fewer replicas than asked for.",
        r.degraded_slabs,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::Stage2Prefault;

    #[derive(Debug)]
    struct Paging(RemoteStats, String);

    impl Collector for Paging {
        fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
            let mut f = Families::new(encoder, &[("vm", &label_value(&self.1))]);
            encode_paging(&mut f, &self.0)
        }
    }

    #[test]
    fn paging_series_keep_their_names() {
        let mut engine = Stats::default();
        engine.fault_service.count = 4000;
        engine.fault_service.p99 = 2_000_000;
        engine.coverage = 0.5;
        let stats = RemoteStats {
            engine,
            remote: RemoteHealth {
                servers: vec!["127.0.0.1:1".into()],
                embedded: true,
                pool_vm: None,
                replicas_moved: 3,
                replicas_dropped: 0,
                replicas_rejected: 0,
                page_encryption: true,
                remote_unauthentic: 0,
                key_id: Some("8bcb3207".into()),
                previous_key_id: Some("01234567".into()),
                pages_to_reseal: 12,
                resealed_pages: 30,
                key_rotations: 0,
                replication: 1,
                dead_servers: 2,
                rejoined_servers: 1,
                read_failovers: 0,
                slabs_rereplicated: 0,
                degraded_slabs: 0,
                suspended_slabs: 0,
                wire_requests: 9,
                slot_waits: 0,
                busy: 0,
                failed_requests: 0,
            },
            stage2_prefault: Stage2Prefault::On,
            lazy_restore: Some(crate::remote::LazyRestoreStats {
                page_file_reads: 7,
                working_set_fetched: 5,
            }),
        };
        let mut e = Exposition::new();
        e.register_collector(Paging(stats, "vm\"1".into()));
        let text = e.render();
        for line in [
            "farvm_ept_demand_faults_total{vm=\"vm_1\"} 0",
            "farvm_ept_fault_service_seconds_count{vm=\"vm_1\"} 4000",
            "farvm_ept_fault_service_seconds{vm=\"vm_1\",quantile=\"0.99\"} 0.002",
            "farvm_ept_prefetch_coverage{vm=\"vm_1\"} 0.5",
            "farvm_ept_total_pages{vm=\"vm_1\"} 0",
            "farvm_memservers{vm=\"vm_1\"} 1",
            "farvm_memserver_dead{vm=\"vm_1\"} 1",
            "farvm_memserver_taken_out_of_service_total{vm=\"vm_1\"} 2",
            "farvm_memserver_requests_total{vm=\"vm_1\"} 9",
            "farvm_remote_pages_to_reseal{vm=\"vm_1\"} 12",
            "farvm_restore_page_file_reads_total{vm=\"vm_1\"} 7",
            "farvm_restore_working_set_fetched_total{vm=\"vm_1\"} 5",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
    }

    #[derive(Debug)]
    struct Procs(PerProcessStats);

    impl Collector for Procs {
        fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
            let mut f = Families::new(encoder, &[("vm", "v")]);
            encode_processes(&mut f, &self.0)
        }
    }

    #[test]
    fn per_process_series_carry_pid_and_name() {
        use farvm_ept::procstats::{ProcessCounterValues, UnattributedFaults};
        let row = |pid: u64, name: Option<&str>, demand: u64| ProcessRow {
            pid,
            name: name.map(str::to_string),
            cr3: pid << 12,
            retired: false,
            first_seen_secs: 0.0,
            last_seen_secs: 1.0,
            counters: ProcessCounterValues {
                demand_faults: demand,
                ..Default::default()
            },
            faults: demand,
            prefetch_hits: 0,
            accuracy: 0.5,
            coverage: 0.25,
        };
        let stats = PerProcessStats {
            processes: vec![
                row(42, Some("postgres \"main\""), 7),
                row(0, Some("kernel"), 1),
                row(9, None, 0),
            ],
            unattributed: UnattributedFaults {
                no_vcpu: 3,
                ..Default::default()
            },
            user_faults: 7,
            attribution: 0.7,
            recycled: 0,
        };
        let mut e = Exposition::new();
        e.register_collector(Procs(stats));
        let text = e.render();
        for line in [
            "farvm_process_demand_faults_total{vm=\"v\",pid=\"42\",name=\"postgres _main_\"} 7",
            "farvm_process_demand_faults_total{vm=\"v\",pid=\"0\",name=\"kernel\"} 1",
            "farvm_process_demand_faults_total{vm=\"v\",pid=\"9\",name=\"\"} 0",
            "farvm_process_prefetch_coverage{vm=\"v\",pid=\"42\",name=\"postgres _main_\"} 0.25",
            "farvm_process_unattributed_faults_total{vm=\"v\",reason=\"no_vcpu\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
    }
}
