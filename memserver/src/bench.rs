//! `farvm-memserver bench`: the client's read bench (`farvm_memclient::bench`) against a server
//! started in this process on loopback.

pub use farvm_memclient::bench::{
    table, transport_table, BenchConfig, Row, TransportRow, TransportRun,
};

use crate::server::{Server, ServerConfig, ServerError};

/// Bench failures.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Server start.
    #[error(transparent)]
    Server(#[from] ServerError),
    /// The measurement.
    #[error(transparent)]
    Bench(#[from] farvm_memclient::bench::BenchError),
}

/// Starts a loopback server with room for the bench's pages, runs the bench against it and
/// stops it; `progress` is called with a line per finished cell.
pub fn run(cfg: &BenchConfig, progress: impl FnMut(&str)) -> Result<Vec<Row>, BenchError> {
    let server = Server::start(ServerConfig::loopback(
        farvm_memclient::bench::capacity_bytes(cfg),
    ))?;
    let rows = farvm_memclient::bench::run(cfg, server.addr(), progress)?;
    server.shutdown();
    Ok(rows)
}

/// Starts a server listening on `ip` over TCP and RDMA (ephemeral ports), runs the transport
/// comparison (`farvm_memclient::bench::run_transports`) against it and stops it.
pub fn run_transports(
    cfg: &BenchConfig,
    ip: std::net::IpAddr,
    progress: impl FnMut(&str),
) -> Result<TransportRun, BenchError> {
    let mut scfg = ServerConfig::loopback(farvm_memclient::bench::capacity_bytes(cfg));
    scfg.listen = std::net::SocketAddr::new(ip, 0);
    scfg.rdma = Some(std::net::SocketAddr::new(ip, 0));
    let server = Server::start(scfg)?;
    let rdma = server.rdma_addr().ok_or(ServerError::NoRdmaSupport)?;
    let rows = farvm_memclient::bench::run_transports(cfg, server.addr(), rdma, progress)?;
    server.shutdown();
    Ok(rows)
}
