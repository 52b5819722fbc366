//! Server metrics as lock-free atomics, rendered in the Prometheus text format, and the tiny
//! HTTP responder serving them on `--metrics`.
//!
//! Hand-rolled rather than a registry crate so the per-request path is a handful of relaxed
//! atomic increments with no lock and no allocation.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use super::store::Store;
use farvm_memproto::{Status, PAGE_SIZE};

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
const STATUSES: [&str; 8] = [
    "ok",
    "bad_request",
    "auth_failed",
    "denied",
    "capacity_exhausted",
    "checksum_mismatch",
    "version_unsupported",
    "not_authenticated",
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

    /// Count of errors with `status` for `op` (tests and the bench use it).
    pub fn errors(&self, op: Op, status: Status) -> u64 {
        self.ops[op as usize].errors[status as usize].load(Relaxed)
    }

    /// Prometheus text exposition.
    pub fn render(&self, store: &Store) -> String {
        let mut o = String::with_capacity(8192);
        let occ = store.occupancy();
        let g = |o: &mut String, name: &str, help: &str, kind: &str, v: u64| {
            let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}");
        };
        g(
            &mut o,
            "farvm_memserver_pages_stored",
            "Pages currently stored.",
            "gauge",
            occ.used_pages,
        );
        g(
            &mut o,
            "farvm_memserver_bytes_stored",
            "Bytes of page data currently stored.",
            "gauge",
            occ.used_pages * PAGE_SIZE as u64,
        );
        g(
            &mut o,
            "farvm_memserver_capacity_pages",
            "Capacity in pages.",
            "gauge",
            occ.capacity_pages,
        );
        g(
            &mut o,
            "farvm_memserver_connections",
            "Open client connections.",
            "gauge",
            self.connections.load(Relaxed),
        );
        g(
            &mut o,
            "farvm_memserver_connections_total",
            "Client connections accepted.",
            "counter",
            self.connections_total.load(Relaxed),
        );
        g(
            &mut o,
            "farvm_memserver_malformed_frames_total",
            "Connections closed for a malformed frame.",
            "counter",
            self.malformed_frames.load(Relaxed),
        );
        g(
            &mut o,
            "farvm_memserver_pages_read_total",
            "Present pages returned by READ.",
            "counter",
            self.pages_read.load(Relaxed),
        );
        g(
            &mut o,
            "farvm_memserver_pages_written_total",
            "Pages stored by WRITE.",
            "counter",
            self.pages_written.load(Relaxed),
        );
        g(
            &mut o,
            "farvm_memserver_pages_discarded_total",
            "Pages freed by DISCARD.",
            "counter",
            self.pages_discarded.load(Relaxed),
        );
        let _ = writeln!(o, "# HELP farvm_memserver_ops_total Requests handled.\n# TYPE farvm_memserver_ops_total counter");
        for (i, name) in OPS.iter().enumerate() {
            let _ = writeln!(
                o,
                "farvm_memserver_ops_total{{op=\"{name}\"}} {}",
                self.ops[i].count.load(Relaxed)
            );
        }
        let _ = writeln!(o, "# HELP farvm_memserver_errors_total Requests answered with an error status.\n# TYPE farvm_memserver_errors_total counter");
        for (i, name) in OPS.iter().enumerate() {
            for (j, st) in STATUSES.iter().enumerate().skip(1) {
                let v = self.ops[i].errors[j].load(Relaxed);
                if v > 0 {
                    let _ = writeln!(
                        o,
                        "farvm_memserver_errors_total{{op=\"{name}\",status=\"{st}\"}} {v}"
                    );
                }
            }
        }
        let _ = writeln!(o, "# HELP farvm_memserver_op_latency_seconds Server-side time per request.\n# TYPE farvm_memserver_op_latency_seconds histogram");
        for (i, name) in OPS.iter().enumerate() {
            let s = &self.ops[i];
            let mut cum = 0;
            for (b, ub) in BUCKETS_US.iter().enumerate() {
                cum += s.buckets[b].load(Relaxed);
                let _ = writeln!(
                    o,
                    "farvm_memserver_op_latency_seconds_bucket{{op=\"{name}\",le=\"{}\"}} {cum}",
                    *ub as f64 / 1e6
                );
            }
            let count = s.count.load(Relaxed);
            let _ = writeln!(
                o,
                "farvm_memserver_op_latency_seconds_bucket{{op=\"{name}\",le=\"+Inf\"}} {count}"
            );
            let _ = writeln!(
                o,
                "farvm_memserver_op_latency_seconds_sum{{op=\"{name}\"}} {}",
                s.sum_ns.load(Relaxed) as f64 / 1e9
            );
            let _ = writeln!(
                o,
                "farvm_memserver_op_latency_seconds_count{{op=\"{name}\"}} {count}"
            );
        }
        o
    }
}

/// Serves `GET /metrics` (any path) until `stop` is set. One request per connection.
pub fn serve(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    store: Arc<Store>,
    stop: Arc<AtomicBool>,
) {
    // Nonblocking accept with a short sleep so shutdown is noticed without a wake-up connection.
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::error!("metrics listener: {e}");
        return;
    }
    while !stop.load(Relaxed) {
        match listener.accept() {
            Ok((mut s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let mut req = [0u8; 2048];
                let _ = s.read(&mut req);
                let body = metrics.render(&store);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => {
                tracing::warn!("metrics accept: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
