//! Server metrics: lock-free atomics the connection threads bump, and their Prometheus
//! exposition on `--metrics` (farvm-httpd's HTTP server and prometheus-client encoding).
//!
//! The counters are plain atomics rather than prometheus-client metric types so the
//! per-request path is a handful of relaxed increments with no lock and no allocation; a
//! [`Collector`] reads them on each scrape.

use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use farvm_httpd::metrics::{router, Families, HistogramValue, SeriesLabels};
use farvm_httpd::prometheus_client::collector::Collector;
use farvm_httpd::prometheus_client::encoding::DescriptorEncoder;
use farvm_httpd::{Exposition, HttpError, HttpServer, Listen};
use farvm_memproto::{Status, PAGE_SIZE};

use super::store::Store;

/// Operations with their own counters and latency histogram.
#[derive(Debug, Clone, Copy)]
pub enum Op {
    /// Handshake.
    Hello = 0,
    /// READ.
    Read = 1,
    /// WRITE.
    Write = 2,
    /// DISCARD.
    Discard = 3,
    /// STAT.
    Stat = 4,
}
const OPS: [&str; 5] = ["hello", "read", "write", "discard", "stat"];
/// Histogram upper bounds in microseconds.
const BUCKETS_US: [u64; 12] = [
    5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 100000,
];
const STATUSES: [&str; 9] = [
    "ok",
    "bad_request",
    "auth_failed",
    "denied",
    "capacity_exhausted",
    "checksum_mismatch",
    "version_unsupported",
    "not_authenticated",
    "reclaimed",
];

#[derive(Default)]
struct OpStats {
    count: AtomicU64,
    sum_ns: AtomicU64,
    buckets: [AtomicU64; BUCKETS_US.len()],
    errors: [AtomicU64; STATUSES.len()],
}

/// All counters of one server.
#[derive(Default)]
pub struct Metrics {
    ops: [OpStats; OPS.len()],
    pages_read: AtomicU64,
    pages_written: AtomicU64,
    pages_discarded: AtomicU64,
    connections: AtomicU64,
    connections_total: AtomicU64,
    malformed_frames: AtomicU64,
    rdma_grants: AtomicU64,
}

impl Metrics {
    /// Records one request.
    pub fn record(&self, op: Op, status: Status, elapsed: Duration) {
        let s = &self.ops[op as usize];
        s.count.fetch_add(1, Relaxed);
        let ns = elapsed.as_nanos().min(u64::MAX as u128) as u64;
        s.sum_ns.fetch_add(ns, Relaxed);
        let us = ns / 1000;
        if let Some(b) = BUCKETS_US.iter().position(|&b| us <= b) {
            s.buckets[b].fetch_add(1, Relaxed);
        }
        if status != Status::Ok {
            s.errors[status as usize].fetch_add(1, Relaxed);
        }
    }

    /// Counts pages moved.
    pub fn pages(&self, read: u64, written: u64, discarded: u64) {
        self.pages_read.fetch_add(read, Relaxed);
        self.pages_written.fetch_add(written, Relaxed);
        self.pages_discarded.fetch_add(discarded, Relaxed);
    }

    /// A connection opened.
    pub fn conn_open(&self) {
        self.connections.fetch_add(1, Relaxed);
        self.connections_total.fetch_add(1, Relaxed);
    }

    /// A connection closed.
    pub fn conn_close(&self) {
        self.connections.fetch_sub(1, Relaxed);
    }

    /// A connection was closed for a malformed frame.
    pub fn malformed(&self) {
        self.malformed_frames.fetch_add(1, Relaxed);
    }

    /// A slab was granted to an RDMA session for one-sided access.
    pub fn grant(&self) {
        self.rdma_grants.fetch_add(1, Relaxed);
    }

    /// Requests of `op` handled (over TCP or as RDMA SENDs; one-sided accesses are not
    /// requests).
    pub fn requests(&self, op: Op) -> u64 {
        self.ops[op as usize].count.load(Relaxed)
    }

    /// Slabs granted to RDMA sessions.
    pub fn grants(&self) -> u64 {
        self.rdma_grants.load(Relaxed)
    }

    /// Count of errors with `status` for `op` (tests and the bench use it).
    pub fn errors(&self, op: Op, status: Status) -> u64 {
        self.ops[op as usize].errors[status as usize].load(Relaxed)
    }
}

/// What a scrape reads: the counters and the store's occupancy.
struct Snapshot {
    metrics: Arc<Metrics>,
    store: Arc<Store>,
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("memserver metrics")
    }
}

impl Collector for Snapshot {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let m = &self.metrics;
        let occ = self.store.occupancy();
        let mut f = Families::new(encoder, &[]);
        f.gauge(
            "farvm_memserver_pages_stored",
            "Pages currently stored.",
            occ.used_pages,
        )?;
        f.gauge(
            "farvm_memserver_bytes_stored",
            "Bytes of page data currently stored.",
            occ.used_pages * PAGE_SIZE as u64,
        )?;
        f.gauge(
            "farvm_memserver_capacity_pages",
            "Capacity in pages.",
            occ.capacity_pages,
        )?;
        f.gauge(
            "farvm_memserver_connections",
            "Open client connections.",
            m.connections.load(Relaxed),
        )?;
        f.counter(
            "farvm_memserver_connections_accepted",
            "Client connections accepted.",
            m.connections_total.load(Relaxed),
        )?;
        f.counter(
            "farvm_memserver_malformed_frames",
            "Connections closed for a malformed frame.",
            m.malformed_frames.load(Relaxed),
        )?;
        f.counter(
            "farvm_memserver_rdma_slab_grants",
            "Slabs granted to RDMA sessions for one-sided READ/WRITE.",
            m.rdma_grants.load(Relaxed),
        )?;
        f.counter(
            "farvm_memserver_pages_read",
            "Present pages returned by READ.",
            m.pages_read.load(Relaxed),
        )?;
        f.counter(
            "farvm_memserver_pages_written",
            "Pages stored by WRITE.",
            m.pages_written.load(Relaxed),
        )?;
        f.counter(
            "farvm_memserver_pages_discarded",
            "Pages freed by DISCARD.",
            m.pages_discarded.load(Relaxed),
        )?;

        let op_labels: Vec<[(&str, &str); 1]> = OPS.iter().map(|op| [("op", *op)]).collect();
        let ops: Vec<(SeriesLabels<'_>, u64)> = op_labels
            .iter()
            .zip(&m.ops)
            .map(|(l, s)| (&l[..], s.count.load(Relaxed)))
            .collect();
        f.counter_series("farvm_memserver_ops", "Requests handled.", &ops)?;

        // Only the (op, status) pairs that happened: most never do.
        let mut error_labels = Vec::new();
        for (op, s) in OPS.iter().zip(&m.ops) {
            for (status, n) in STATUSES.iter().zip(&s.errors).skip(1) {
                let n = n.load(Relaxed);
                if n > 0 {
                    error_labels.push(([("op", *op), ("status", *status)], n));
                }
            }
        }
        let errors: Vec<(SeriesLabels<'_>, u64)> =
            error_labels.iter().map(|(l, n)| (&l[..], *n)).collect();
        f.counter_series(
            "farvm_memserver_errors",
            "Requests answered with an error status.",
            &errors,
        )?;

        let buckets: Vec<Vec<(f64, u64)>> = m.ops.iter().map(OpStats::buckets).collect();
        let latency: Vec<(SeriesLabels<'_>, HistogramValue<'_>)> = op_labels
            .iter()
            .zip(&m.ops)
            .zip(&buckets)
            .map(|((l, s), b)| {
                let value = HistogramValue {
                    sum: s.sum_ns.load(Relaxed) as f64 / 1e9,
                    count: b.iter().map(|(_, n)| n).sum(),
                    buckets: b,
                };
                (&l[..], value)
            })
            .collect();
        f.histogram_series(
            "farvm_memserver_op_latency_seconds",
            "Server-side time per request.",
            &latency,
        )
    }
}

impl OpStats {
    /// Per-bucket counts `(upper bound in seconds, count)`, the last bound +Inf holding what
    /// no finite bucket took.
    fn buckets(&self) -> Vec<(f64, u64)> {
        let mut out: Vec<(f64, u64)> = BUCKETS_US
            .iter()
            .zip(&self.buckets)
            .map(|(ub, n)| (*ub as f64 / 1e6, n.load(Relaxed)))
            .collect();
        let finite: u64 = out.iter().map(|(_, n)| n).sum();
        // `count` is bumped before the bucket: a request recorded mid-scrape may be in
        // `count` and not yet in its bucket, which would only make +Inf one too big.
        let beyond = self.count.load(Relaxed).saturating_sub(finite);
        out.push((f64::INFINITY, beyond));
        out
    }
}

/// The exposition of one server's metrics.
pub(crate) fn exposition(metrics: Arc<Metrics>, store: Arc<Store>) -> Exposition {
    let mut e = Exposition::new();
    e.register_collector(Snapshot { metrics, store });
    e
}

/// Serves the metrics at `GET /metrics` on `addr` from a thread named `memserver-metrics`,
/// until the returned server is dropped.
pub(crate) fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    store: Arc<Store>,
) -> Result<HttpServer, HttpError> {
    let e = Arc::new(exposition(metrics, store));
    HttpServer::start_in(
        &Listen::Tcp(addr),
        "memserver-metrics",
        Some(farvm_sandbox::ThreadClass::Metrics),
        router(e),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::arena::Arena;

    #[test]
    fn the_exposition_has_every_family_cumulative_buckets_and_only_errors_that_happened() {
        let m = Arc::new(Metrics::default());
        let store = Arc::new(Store::new(Arena::new(16).unwrap()));
        m.conn_open();
        m.conn_open();
        m.conn_close();
        m.record(Op::Read, Status::Ok, Duration::from_micros(3));
        m.record(Op::Read, Status::Ok, Duration::from_micros(40));
        m.record(Op::Read, Status::Ok, Duration::from_secs(1));
        m.record(
            Op::Write,
            Status::CapacityExhausted,
            Duration::from_micros(7),
        );
        m.pages(3, 1, 0);
        let text = exposition(m, store).render();
        for line in [
            "farvm_memserver_capacity_pages 16",
            "farvm_memserver_connections 1",
            "farvm_memserver_connections_accepted_total 2",
            "farvm_memserver_pages_read_total 3",
            "farvm_memserver_ops_total{op=\"read\"} 3",
            "farvm_memserver_ops_total{op=\"hello\"} 0",
            "farvm_memserver_errors_total{op=\"write\",status=\"capacity_exhausted\"} 1",
            "farvm_memserver_op_latency_seconds_bucket{le=\"0.000005\",op=\"read\"} 1",
            "farvm_memserver_op_latency_seconds_bucket{le=\"0.00005\",op=\"read\"} 2",
            "farvm_memserver_op_latency_seconds_bucket{le=\"0.1\",op=\"read\"} 2",
            "farvm_memserver_op_latency_seconds_bucket{le=\"+Inf\",op=\"read\"} 3",
            "farvm_memserver_op_latency_seconds_count{op=\"read\"} 3",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
        assert_eq!(
            text.matches("farvm_memserver_errors_total{").count(),
            1,
            "only the pair that happened:\n{text}"
        );
    }
}
