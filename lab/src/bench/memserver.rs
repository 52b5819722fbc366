//! `farvm-lab bench memserver`: the memory server as the client sees it — 4 KiB read latency
//! and pages/s next to a raw TCP floor, or TCP vs RDMA one-sided vs RDMA SEND/RECV — against a
//! server started in this process (the client's bench, `farvm_memclient::bench`).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use farvm_memclient::bench::{self, BenchConfig};
use farvm_memserver::server::{Server, ServerConfig, ServerError};

pub const MEMSERVER_ABOUT: &str = "\
The memory server against the raw TCP floor: 4 KiB read latency (p50/p99) and pages/s at 1, 8
and 32 requests in flight through farvm's client and one memory server started in this process
on loopback, next to a raw TCP 16 B request / 4096 B response floor measured in the same run,
in alternating rounds.

With --rdma IP: one server listening on IP over TCP and over RDMA, read through TCP, RDMA with
one-sided pages and RDMA with SEND/RECV in alternating slices; prints their ratios and the CPU
time of the idle links. The IP must have an RDMA device (a RoCE GID), e.g. 127.0.0.1 with
Soft-RoCE on `lo` (the KVM lab has one). An RDMA link keeps at most 16 requests in flight.

EXIT STATUS
  0 the table was printed; 1 a bad argument, or the server or a client failed";

#[derive(Args, Debug)]
pub struct MemserverArgs {
    /// Seconds per cell and round.
    #[arg(long, default_value_t = 2.0)]
    pub duration: f64,
    /// Alternating floor/memserver rounds per depth (pooled).
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Comma-separated in-flight depths to measure (e.g. `1` for the latency cell only).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 8, 32])]
    pub depths: Vec<usize>,
    /// Pages stored before reading; each read picks one at random (8192 pages = 32 MiB, more
    /// than the CPU caches, like a real server; 1 = always the same cache-hot page).
    #[arg(long, default_value_t = 8192)]
    pub pages: u64,
    /// Compare transports on one server listening on this local IP over TCP and RDMA.
    #[arg(long, value_name = "IP")]
    pub rdma: Option<IpAddr>,
}

/// The client's read bench against a loopback server started for it (and stopped after).
pub fn loopback_rows(cfg: &BenchConfig) -> Result<Vec<bench::Row>> {
    let server = Server::start(ServerConfig::loopback(bench::capacity_bytes(cfg)))
        .context("starting the memory server")?;
    let rows = bench::run(cfg, server.addr(), |_| {});
    server.shutdown();
    Ok(rows?)
}

pub fn run(a: MemserverArgs) -> Result<()> {
    if !(a.duration > 0.0 && a.duration.is_finite()) {
        bail!("--duration must be a positive number of seconds");
    }
    if a.depths.is_empty() || a.depths.iter().any(|&d| d == 0 || d > 256) {
        bail!("--depths must list in-flight depths between 1 and 256");
    }
    if a.pages == 0 || a.pages > 1 << 20 {
        bail!("--pages must be between 1 and 1048576 (4 GiB)");
    }
    let cfg = BenchConfig {
        duration: Duration::from_secs_f64(a.duration),
        rounds: a.rounds,
        depths: a.depths,
        pages: a.pages,
    };
    eprintln!(
        "bench: {} rounds x {:.1} s per cell, depths {:?}, one connection each",
        cfg.rounds, a.duration, cfg.depths
    );
    let progress = |l: &str| eprintln!("{l}");
    let mut scfg = ServerConfig::loopback(bench::capacity_bytes(&cfg));
    if let Some(ip) = a.rdma {
        eprintln!("bench: the same memserver on {ip} over TCP, RDMA one-sided and RDMA SEND/RECV");
        scfg.listen = SocketAddr::new(ip, 0);
        scfg.rdma = Some(SocketAddr::new(ip, 0));
    }
    let server = Server::start(scfg).context("starting the memory server")?;
    let table = match a.rdma {
        Some(_) => {
            let rdma = server.rdma_addr().ok_or(ServerError::NoRdmaSupport)?;
            bench::transport_table(&bench::run_transports(&cfg, server.addr(), rdma, progress)?)
        }
        None => bench::table(&bench::run(&cfg, server.addr(), progress)?),
    };
    server.shutdown();
    print!("{table}");
    Ok(())
}
