//! farvm-chapi: the slice of Cloud Hypervisor's REST API that farvm speaks — what libvirt's
//! Cloud Hypervisor ("ch") driver sends — as data: no sockets, no VMs (the VMM's API server
//! serves it over HTTP/1.1 on a Unix socket with farvm-httpd).
//!
//! - [`endpoint`]: `/api/v1/<name>` and the HTTP method → [`Endpoint`] ([`route`]).
//! - [`create`]: the `vm.create` body ([`CreateSpec::parse`]): what farvm accepts, what it
//!   refuses (with a 400 naming the field and why), and its conversion into a libvirt-style
//!   [`farvm_vmconfig::Domain`] so host-config settings merge as for a domain XML file.
//! - [`add_net`]: the `vm.add-net` body ([`AddNetSpec::parse`]), whose tap comes as a
//!   descriptor with the request.
//! - [`info`]: the `vm.info`, `vmm.ping` and `vm.counters` bodies, [`VmState`].
//! - [`snapshot`]: the `vm.snapshot` and `vm.restore` bodies (the snapshot's directory).
//! - [`migration`]: the `vm.send-migration` and `vm.receive-migration` bodies (a
//!   `tcp:HOST:PORT` URL).
//! - [`event`]: the `--event-monitor` records.
//! - [`error`]: [`ApiError`]: the status code and Cloud Hypervisor's JSON error body (an array
//!   of messages, outermost first).
//!
//! Status codes follow Cloud Hypervisor's API description: 200 with a body, 204 without; 400 for
//! a malformed request, a wrong method or a configuration farvm cannot run; 404 for an unknown
//! endpoint or when no VM is created; 405 when the VM is in the wrong state for the action
//! (booting a running VM, pausing one that is not running, creating a second VM ...); 500 when
//! the host fails (KVM, memory servers).

pub mod add_net;
pub mod create;
pub mod endpoint;
pub mod error;
pub mod event;
pub mod info;
pub mod migration;
pub mod snapshot;

pub use add_net::AddNetSpec;
pub use create::{ConsoleConfig, ConsoleMode, CreateSpec, DiskSpec, NetSpec, SerialTarget};
pub use endpoint::{route, Endpoint, Method};
pub use error::ApiError;
pub use info::VmState;

/// The path prefix of every endpoint.
pub const API_ROOT: &str = "/api/v1/";

/// The Cloud Hypervisor release whose REST API dialect farvm speaks. v27 is the last release
/// before the `payload` object replaced `kernel`/`cmdline` in `vm.create` (v28), and it is the
/// format libvirt 9.0's ch driver sends whatever the version (farvm accepts `payload` too).
pub const API_LEVEL: &str = "27.0.0";
