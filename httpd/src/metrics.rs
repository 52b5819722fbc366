//! The Prometheus exposition: a prometheus-client [`Registry`] rendered as OpenMetrics text on
//! each scrape, served at `GET /metrics` (and `GET /`).
//!
//! Components whose numbers are snapshots taken on demand (a VM's exits, the paging engine's
//! counters and latency quantiles, a memory server's per-op counters) register a
//! [`Collector`]; inside its `encode` they write families with [`Families`], which puts the
//! same labels (e.g. `vm="name"`) on every series. Counters are exposed as `NAME_total`.
//! Latency quantiles computed by the component (HDR histograms) are exposed as a gauge family
//! `NAME{quantile="0.99"}` with `NAME_sum` and `NAME_count` gauges beside it: prometheus-client
//! has no summary type, and this keeps the series names of a Prometheus summary.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeMetric, MetricEncoder,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Content type of the exposition (OpenMetrics 1.0 text, which Prometheus scrapes natively).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The metrics of one process (or one VM), rendered on each scrape.
#[derive(Debug, Default)]
pub struct Exposition {
    registry: Registry,
}

impl Exposition {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// The registry, for metrics that live in it (prometheus-client counters, gauges,
    /// histograms updated as things happen).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Adds a collector whose `encode` runs on every scrape.
    pub fn register_collector(&mut self, collector: impl Collector) {
        self.registry.register_collector(Box::new(collector));
    }

    /// The OpenMetrics text of every registered metric and collector.
    pub fn render(&self) -> String {
        let mut text = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            tracing::warn!("encoding metrics: {e}");
        }
        text
    }
}

/// The routes of a metrics endpoint: `GET /metrics` and `GET /` render `exposition`; any
/// other path is a 404 that says where the metrics are.
pub fn router(exposition: Arc<Exposition>) -> Router {
    Router::new()
        .route("/metrics", get(scrape))
        .route("/", get(scrape))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found: try GET /metrics\n") })
        .with_state(exposition)
}

async fn scrape(State(exposition): State<Arc<Exposition>>) -> impl IntoResponse {
    // Collectors take snapshots (merging histograms, locking counters): off the reactor.
    match tokio::task::spawn_blocking(move || exposition.render()).await {
        Ok(text) => (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], text),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            format!("rendering metrics failed: {e}\n"),
        ),
    }
}

/// Extra labels of one series of a family (on top of the [`Families`] labels).
pub type SeriesLabels<'l> = &'l [(&'l str, &'l str)];

/// A histogram's value: per-bucket counts `(upper bound, count in that bucket)`, the last bound
/// `f64::INFINITY`, plus the sum and count of the observations.
#[derive(Clone, Copy, Debug)]
pub struct HistogramValue<'b> {
    /// Sum of the observations.
    pub sum: f64,
    /// Number of observations (the sum of the bucket counts).
    pub count: u64,
    /// `(upper bound, count in that bucket)`, not cumulative, the last bound `f64::INFINITY`.
    pub buckets: &'b [(f64, u64)],
}

/// `common` followed by `extra`.
fn with(common: &[(String, String)], extra: SeriesLabels<'_>) -> Vec<(String, String)> {
    let mut labels = common.to_vec();
    labels.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    labels
}

/// Encodes each series of one family with `encode`. A family whose only series has no label at
/// all is encoded without a label set, so it reads `NAME 3` rather than `NAME{} 3`.
fn each_series<V>(
    mut family: MetricEncoder<'_>,
    common: &[(String, String)],
    series: &[(SeriesLabels<'_>, V)],
    mut encode: impl FnMut(MetricEncoder<'_>, &V) -> fmt::Result,
) -> fmt::Result {
    if let [(extra, value)] = series {
        if common.is_empty() && extra.is_empty() {
            return encode(family, value);
        }
    }
    for (extra, value) in series {
        let labels = with(common, extra);
        encode(family.encode_family(&labels)?, value)?;
    }
    Ok(())
}

/// Writes metric families of a snapshot from inside [`Collector::encode`]. Every series gets
/// the labels given to [`Families::new`]; the `*_series` forms write several series of one
/// family, each with extra labels (e.g. `op="read"`).
pub struct Families<'a> {
    encoder: DescriptorEncoder<'a>,
    labels: Vec<(String, String)>,
}

impl<'a> Families<'a> {
    /// `labels` go on every series, in this order.
    pub fn new(encoder: DescriptorEncoder<'a>, labels: &[(&str, &str)]) -> Self {
        Families {
            encoder,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// A monotonic counter, exposed as `NAME_total`.
    pub fn counter(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        self.counter_series(name, help, &[(&[], value)])
    }

    /// Series of one counter family.
    pub fn counter_series(
        &mut self,
        name: &str,
        help: &str,
        series: &[(SeriesLabels<'_>, u64)],
    ) -> fmt::Result {
        let m = self
            .encoder
            .encode_descriptor(name, help, None, MetricType::Counter)?;
        each_series(m, &self.labels, series, |e, v| {
            ConstCounter::new(*v).encode(e)
        })
    }

    /// A gauge (integers print as integers, floats as floats).
    pub fn gauge<G: EncodeGaugeValue + Copy>(
        &mut self,
        name: &str,
        help: &str,
        value: G,
    ) -> fmt::Result {
        self.gauge_series(name, help, &[(&[], value)])
    }

    /// Series of one gauge family.
    pub fn gauge_series<G: EncodeGaugeValue + Copy>(
        &mut self,
        name: &str,
        help: &str,
        series: &[(SeriesLabels<'_>, G)],
    ) -> fmt::Result {
        let m = self
            .encoder
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        each_series(m, &self.labels, series, |e, v| {
            ConstGauge::new(*v).encode(e)
        })
    }

    /// Quantiles of a distribution the component computed itself: `NAME{quantile="q"}` for
    /// each `(q, value)`, plus `NAME_sum` and `NAME_count`.
    pub fn quantiles(
        &mut self,
        name: &str,
        help: &str,
        quantiles: &[(&str, f64)],
        sum: f64,
        count: u64,
    ) -> fmt::Result {
        let labels: Vec<[(&str, &str); 1]> =
            quantiles.iter().map(|(q, _)| [("quantile", *q)]).collect();
        let series: Vec<(SeriesLabels<'_>, f64)> = labels
            .iter()
            .zip(quantiles)
            .map(|(l, (_, v))| (&l[..], *v))
            .collect();
        self.gauge_series(name, help, &series)?;
        self.gauge(
            &format!("{name}_sum"),
            &format!("Sum of the observations of {name}."),
            sum,
        )?;
        self.gauge(
            &format!("{name}_count"),
            &format!("Number of observations of {name}."),
            count,
        )
    }

    /// A histogram, exposed as `NAME_bucket{le=...}` (cumulative), `NAME_sum`, `NAME_count`.
    pub fn histogram(&mut self, name: &str, help: &str, value: HistogramValue<'_>) -> fmt::Result {
        self.histogram_series(name, help, &[(&[], value)])
    }

    /// Series of one histogram family.
    pub fn histogram_series(
        &mut self,
        name: &str,
        help: &str,
        series: &[(SeriesLabels<'_>, HistogramValue<'_>)],
    ) -> fmt::Result {
        let m = self
            .encoder
            .encode_descriptor(name, help, None, MetricType::Histogram)?;
        each_series(m, &self.labels, series, |mut e, h| {
            e.encode_histogram(
                h.sum,
                h.count,
                h.buckets,
                None::<&HashMap<usize, Exemplar<Vec<(String, String)>, f64>>>,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{client, HttpServer};

    #[derive(Debug)]
    struct Snapshot;

    impl Collector for Snapshot {
        fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
            let mut f = Families::new(encoder, &[("vm", "t1")]);
            f.counter("farvm_test_faults", "Faults.", 3)?;
            f.gauge("farvm_test_pages", "Pages.", 7u64)?;
            f.gauge("farvm_test_ratio", "A ratio.", 0.25)?;
            f.quantiles(
                "farvm_test_seconds",
                "Latency.",
                &[("0.5", 0.001), ("0.99", 0.004)],
                0.5,
                200,
            )?;
            f.histogram(
                "farvm_test_op_seconds",
                "Op latency.",
                HistogramValue {
                    sum: 1.5,
                    count: 3,
                    buckets: &[(0.001, 1), (0.01, 2), (f64::INFINITY, 0)],
                },
            )?;
            f.counter_series(
                "farvm_test_ops",
                "Ops by kind.",
                &[(&[("op", "read")], 5), (&[("op", "write")], 6)],
            )
        }
    }

    #[derive(Debug)]
    struct Unlabelled;

    impl Collector for Unlabelled {
        fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
            let mut f = Families::new(encoder, &[]);
            f.gauge("farvm_test_pages", "Pages.", 7u64)?;
            f.counter("farvm_test_faults", "Faults.", 3)?;
            f.counter_series("farvm_test_ops", "Ops by kind.", &[(&[("op", "read")], 5)])
        }
    }

    #[test]
    fn a_series_without_labels_has_no_label_set() {
        let mut e = Exposition::new();
        e.register_collector(Unlabelled);
        let text = e.render();
        for line in [
            "farvm_test_pages 7",
            "farvm_test_faults_total 3",
            "farvm_test_ops_total{op=\"read\"} 5",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
        assert!(!text.contains("{}"), "{text}");
    }

    #[test]
    fn renders_families_and_serves_them() {
        let mut e = Exposition::new();
        e.register_collector(Snapshot);
        let text = e.render();
        for line in [
            "# TYPE farvm_test_faults counter",
            "farvm_test_faults_total{vm=\"t1\"} 3",
            "farvm_test_pages{vm=\"t1\"} 7",
            "farvm_test_ratio{vm=\"t1\"} 0.25",
            "farvm_test_seconds{vm=\"t1\",quantile=\"0.99\"} 0.004",
            "farvm_test_seconds_sum{vm=\"t1\"} 0.5",
            "farvm_test_seconds_count{vm=\"t1\"} 200",
            "farvm_test_op_seconds_bucket{le=\"0.01\",vm=\"t1\"} 3",
            "farvm_test_op_seconds_count{vm=\"t1\"} 3",
            "farvm_test_ops_total{vm=\"t1\",op=\"read\"} 5",
            "farvm_test_ops_total{vm=\"t1\",op=\"write\"} 6",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
        let s = HttpServer::start(
            &"127.0.0.1:0".parse().unwrap(),
            "metrics-test",
            router(Arc::new(e)),
        )
        .unwrap();
        let r = client::get(s.addr(), "/metrics").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.content_type.as_deref(), Some(CONTENT_TYPE));
        assert_eq!(r.body, text);
        assert_eq!(client::get(s.addr(), "/").unwrap().body, text);
        let r = client::get(s.addr(), "/other").unwrap();
        assert_eq!(r.status, 404);
        assert!(r.body.contains("GET /metrics"), "{}", r.body);
    }
}
