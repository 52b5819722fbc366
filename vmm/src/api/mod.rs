//! farvm's Cloud-Hypervisor-compatible API server: what libvirt's Cloud Hypervisor ("ch")
//! driver talks to. libvirt binds `<stateDir>/<name>-socket`, starts farvm as
//! `cloud-hypervisor --api-socket fd=N` and drives the VM over HTTP/1.1 on that socket:
//! `vm.create`, `vm.boot`, `vm.info` (reading the pty path), `vm.pause`/`vm.resume`,
//! `vm.shutdown`, ... (the dialect: `farvm_chapi`).
//!
//! - [`state`]: the one VM and its life ([`ApiState`]);
//! - [`routes`]: the HTTP handler (served by farvm-httpd, like the metrics endpoint);
//! - [`counters`]: `vm.counters`; [`events`]: the `--event-monitor` records.
//!
//! What the VM becomes is the caller's business: a [`VmFactory`] turns the `vm.create` body
//! into a [`VmConfig`] (the `farvm` binary's applies the host config file, so libvirt-launched
//! VMs get their remote-memory settings from the host's per-domain section or defaults).

pub mod counters;
pub mod events;
pub mod factory;
pub mod routes;
pub mod state;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use farvm_chapi::{ApiError, CreateSpec};
use farvm_httpd::{BoundAddr, HttpError, HttpServer, Listen};

pub use events::EventMonitor;
pub use state::ApiState;

use crate::builder::VmConfig;
use crate::spec::VmSpec;

/// A VM to build, as a factory prepared it from a `vm.create` body.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The VM (its `serial` is set by the API server from the body's console and serial).
    pub config: VmConfig,
    /// Serve the VM's Prometheus metrics here while it runs.
    pub metrics: Option<Listen>,
    /// What the factory decided, for the log (e.g. which host-config section applied).
    pub notes: Vec<String>,
    /// The description `config` was made from (a snapshot saves it).
    pub spec: VmSpec,
}

/// Turns `vm.create` bodies into VM configurations.
pub trait VmFactory: Send + Sync {
    /// The VM named `name` that `spec` asks for; a configuration farvm cannot run is
    /// [`ApiError::BadConfig`].
    fn prepare(&self, name: &str, spec: &CreateSpec) -> Result<Prepared, ApiError>;

    /// The file holding the key a live migration of the VM named `name` is sealed with
    /// (`vm.send-migration`, `vm.receive-migration`); `None`: this host has none configured.
    fn migration_key_file(&self, name: &str) -> Result<Option<PathBuf>, ApiError> {
        let _ = name;
        Ok(None)
    }

    /// The file holding the snapshot key that seals `vm.snapshot`'s snapshots of the VM named
    /// `name` and opens them for `vm.restore`; `None`: snapshots are written in the clear.
    fn snapshot_key_file(&self, name: &str) -> Result<Option<PathBuf>, ApiError> {
        let _ = name;
        Ok(None)
    }
}

/// A running API server.
pub struct ApiServer {
    state: Arc<ApiState>,
    http: Option<HttpServer>,
}

impl ApiServer {
    /// Serves the API for a VM called `name` on `listen` (thread `api-server`).
    pub fn start(
        listen: &Listen,
        name: String,
        factory: Box<dyn VmFactory>,
        events: Option<EventMonitor>,
    ) -> Result<Self, HttpError> {
        let state = ApiState::new(name, factory, events);
        let http = HttpServer::start(listen, "api-server", routes::router(state.clone()))?;
        state.emit_vmm("starting");
        Ok(ApiServer {
            state,
            http: Some(http),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> Option<&BoundAddr> {
        self.http.as_ref().map(HttpServer::addr)
    }

    /// The VM's state.
    pub fn state(&self) -> &Arc<ApiState> {
        &self.state
    }

    /// Blocks until `vmm.shutdown` (true) or, when `watch_signals`, SIGINT/SIGTERM or the
    /// event monitor's reader closing it (false): a manager that follows the VMM through its
    /// events (libvirt's ch driver) closes them when it is done with the domain.
    pub fn wait(&self, watch_signals: bool) -> bool {
        let mut tick = 0u64;
        loop {
            tick += 1;
            if self.state.wait_exit(Duration::from_millis(100)) {
                return true;
            }
            // About once a second.
            if watch_signals && tick.is_multiple_of(10) {
                self.state.event_keepalive();
            }
            if watch_signals && crate::signals::termination_requested().is_some() {
                return false;
            }
            if watch_signals && self.state.event_reader_gone() {
                tracing::info!(
                    vm = self.state.name(),
                    "the event monitor's reader closed it: stopping"
                );
                return false;
            }
        }
    }

    /// Stops the VM, if any, then the server.
    pub fn shutdown(mut self) {
        self.state.stop();
        self.http.take();
        self.state.emit_vmm("shutdown");
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if self.http.is_some() {
            self.state.stop();
            self.http.take();
        }
    }
}
