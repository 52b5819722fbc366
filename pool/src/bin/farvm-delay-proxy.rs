//! `farvm-delay-proxy`: a TCP proxy adding a fixed latency each way.

use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;

/// TCP proxy that adds a fixed one-way latency to every byte in both directions, to emulate
/// the distance between racks on a machine whose kernel has no `netem` (where `tc qdisc add
/// dev X root netem delay 200us` exists, prefer it). Bytes keep their order; the connection
/// keeps streaming while data is in flight, so it adds latency without capping bandwidth.
/// One thread pair per direction and connection; serves until killed.
///
/// Example (a memory server on 10.77.0.11:7070 seen 250 µs away each way on 10.77.0.1:17070):
///   farvm-delay-proxy --listen 10.77.0.1:17070 --connect 10.77.0.11:7070 --delay-us 250
#[derive(Parser, Debug)]
#[command(name = "farvm-delay-proxy", version, verbatim_doc_comment)]
struct Cli {
    /// Address to accept connections on.
    #[arg(long, value_name = "ADDR")]
    listen: SocketAddr,
    /// Address to forward each connection to.
    #[arg(long, value_name = "ADDR")]
    connect: SocketAddr,
    /// One-way delay in microseconds, applied in each direction (round trip: twice this).
    #[arg(long, value_name = "MICROSECONDS", default_value_t = 200)]
    delay_us: u64,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("farvm-delay-proxy: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let listener = TcpListener::bind(cli.listen)
        .with_context(|| format!("cannot listen on {}", cli.listen))?;
    tracing::info!(listen = %listener.local_addr()?, connect = %cli.connect, delay_us = cli.delay_us, "delay proxy serving");
    farvm_pool::delay::serve(listener, cli.connect, Duration::from_micros(cli.delay_us))
        .context("accept failed")
}
