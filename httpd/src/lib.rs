//! farvm-httpd: the one HTTP server of farvm's control plane and the one Prometheus exposition.
//!
//! - [`listen`]: where a server listens — a TCP address, a Unix socket path, or a listening
//!   socket inherited as a file descriptor (`HOST:PORT`, `unix:PATH`, `fd:N`).
//! - [`server`]: [`HttpServer`] runs an axum [`Router`](axum::Router) on its own thread with a
//!   single-threaded tokio runtime, so the data path (vCPUs, the paging engine, the memory
//!   server's connections) never shares a thread or a runtime with it; stops on drop.
//! - [`metrics`]: the Prometheus/OpenMetrics exposition (prometheus-client): a registry that
//!   renders on scrape, [`metrics::Families`] to write snapshot values from a collector, and the
//!   `GET /metrics` route.
//! - [`client`]: a minimal blocking `GET` over TCP or a Unix socket (tests and CLI clients).
//! - [`fdpass`]: descriptors a request brings over a Unix socket (SCM_RIGHTS), as libvirt's
//!   driver hands a VMM its tap devices; a handler takes them from its connection's
//!   [`fdpass::FdInbox`].
//!
//! Users: the VMM's metrics endpoint (`farvm run --metrics`), the memory server's, and the
//! VMM's API server. `axum` and `prometheus_client` are re-exported so they build their routes
//! and collectors against the same versions.

pub mod client;
pub mod fdpass;
pub mod listen;
pub mod metrics;
pub mod server;

pub use axum;
pub use listen::{BoundAddr, Listen};
pub use metrics::{Exposition, Families, HistogramValue};
pub use prometheus_client;
pub use server::HttpServer;

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
/// Errors of starting a server.
pub enum HttpError {
    #[error("invalid listen address `{0}` (expected HOST:PORT, unix:PATH or fd:N)")]
    /// A listen address that is none of `HOST:PORT`, `unix:PATH`, `fd:N`.
    BadListen(String),
    #[error("cannot listen on {what}: {source}")]
    /// Binding or preparing the listening socket failed.
    Bind {
        /// The address, as given.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    #[error("fd {fd} is not a listening TCP or Unix stream socket{detail}")]
    /// An inherited fd that cannot be served.
    NotAListener {
        /// The fd given.
        fd: i32,
        /// Why not (starts with a space, or is empty).
        detail: String,
    },
    #[error("{what} is already served by a running process")]
    /// A Unix socket path another live process answers on.
    InUse {
        /// The socket path.
        what: String,
    },
    #[error("cannot start the HTTP server thread: {0}")]
    /// The server thread or its runtime could not be created.
    Runtime(std::io::Error),
}
