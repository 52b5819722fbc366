//! The loopback floors `farvm-lab bench remote` reports next to its cells: the TCP 4 KiB
//! request/response latency (blocking and spinning), the memserver's read latency and the raw
//! TCP streaming rate of 4 KiB pages and its CPU per page, all measured in this run.

use std::time::Duration;

use anyhow::{Context, Result};

use super::report::Floor;

pub(super) fn floor(secs: u64) -> Result<Floor> {
    let cfg = farvm_memclient::bench::BenchConfig {
        duration: Duration::from_secs(secs.max(1)),
        depths: vec![1],
        rounds: 2,
        ..Default::default()
    };
    let rows = super::super::memserver::loopback_rows(&cfg).context("measuring the TCP floor")?;
    let r = rows.first().context("TCP floor: no result")?;
    let (spin_p50, spin_p99) =
        farvm_memclient::bench::tcp_spinning_floor(Duration::from_secs(secs.max(1)))
            .context("measuring the spinning TCP floor")?;
    let (stream, rounds) = stream_rate(secs)?;
    // The stricter of the two waiting policies is the floor: on this host a blocked waiter's
    // wake-up costs 10-50 µs depending on whether the other core is idle, and spinning avoids
    // it when the peer runs on the other core.
    let (tcp_p50_us, tcp_p99_us) = if spin_p50 < r.floor.p50_us {
        (spin_p50, spin_p99)
    } else {
        (r.floor.p50_us, r.floor.p99_us)
    };
    Ok(Floor {
        tcp_p50_us,
        tcp_p99_us,
        tcp_blocking_p50_us: r.floor.p50_us,
        tcp_spinning_p50_us: spin_p50,
        memserver_p50_us: r.memserver.p50_us,
        memserver_p99_us: r.memserver.p99_us,
        tcp_stream_pages_per_s: stream.pages_per_s,
        tcp_stream_cpu_us_per_page: stream.cpu_us_per_page,
        tcp_stream_rounds_pages_per_s: rounds.iter().map(|r| r.pages_per_s).collect(),
    })
}

/// Rounds of the streaming measurement: a round disturbed by the host (on a 2-core host one
/// round in a few can stream at half the rate or less) does not set the floor.
const STREAM_ROUNDS: usize = 3;

/// The median of [`STREAM_ROUNDS`] rounds of `secs` each, by rate, and every round.
fn stream_rate(
    secs: u64,
) -> Result<(
    farvm_memclient::bench::StreamRate,
    Vec<farvm_memclient::bench::StreamRate>,
)> {
    let rounds = (0..STREAM_ROUNDS)
        .map(|_| farvm_memclient::bench::tcp_stream(Duration::from_secs(secs.max(1))))
        .collect::<std::io::Result<Vec<_>>>()
        .context("measuring the TCP streaming rate")?;
    let mut sorted = rounds.clone();
    sorted.sort_by(|a, b| a.pages_per_s.total_cmp(&b.pages_per_s));
    let median = sorted[STREAM_ROUNDS / 2];
    Ok((median, rounds))
}
