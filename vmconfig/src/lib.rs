//! farvm-vmconfig: what farvm reads to configure a VM, and the one settings struct it makes of it.
//!
//! - [`domain`]: the libvirt domain XML subset farvm understands ([`Domain::parse`]), with
//!   [`Warning`]s for what it ignores; [`metadata`]: farvm's own `<metadata>` element, in the
//!   namespace [`FARVM_NS`]; [`write`]: a [`Domain`] back as XML.
//! - [`host`]: the host config file ([`HostConfig`], TOML, `/etc/farvm/farvm.toml` or
//!   `$FARVM_CONFIG`).
//! - [`settings`]: [`merge`] of the two into [`VmSettings`] (domain metadata over the host's
//!   per-domain section over the host's defaults over farvm's defaults).
//! - [`remote`]: the remote-memory settings a layer may set; [`units`]: libvirt's size units;
//!   [`xml`]: the namespace-aware element tree under the domain reader.

pub mod domain;
pub mod error;
pub mod host;
pub mod metadata;
pub mod remote;
pub mod settings;
pub mod units;
pub mod write;
pub mod xml;

pub use domain::{Domain, ParsedDomain};
pub use error::{ConfigError, Warning};
pub use host::HostConfig;
pub use remote::{LocalShare, Overrides, PageSpace, Pool, Servers};
pub use settings::{merge, RemoteSettings, Serial, VmSettings};

/// The XML namespace of farvm's domain metadata (version 1 of its vocabulary). libvirt keeps
/// elements in this namespace inside `<metadata>` (`virsh metadata DOMAIN URI`).
pub const FARVM_NS: &str = "https://farvm.dev/xmlns/domain/1";
