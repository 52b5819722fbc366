//! Live migration of a pool VM between hosts, in time and bytes proportional to its local
//! memory: only the resident pages cross between the hosts, the remote ones stay in the pool
//! and pass to the destination with the namespace's ownership.
//!
//! The source ([`send`], `farvm migrate`) copies the resident pages to the destination while
//! the guest runs, round after round, each round sending the pages whose content changed
//! since they were sent (a content fingerprint per page, the engine's own dirty check:
//! it sees writes by the guest and by the VMM's devices alike, where KVM's dirty log sees the
//! guest's only), until what is left fits the downtime limit at the measured rate
//! ([`precopy`]) or the rounds stop shrinking. It then pauses the guest, sends
//! the pages still changed, the list of remote pages with their fingerprints, the page key,
//! the machine state and the handover fence (`farvm_pool`'s handover), and waits. The
//! destination ([`receive`], `farvm run --incoming`) lays what it received out as a
//! snapshot directory, builds the VM from it, loads it, takes the namespace over in one etcd
//! transaction on the fence, answers, and runs the guest; the source then stops. If the
//! answer does not come, the source cancels the handover on the same fence: exactly one of
//! the two transactions succeeds, so exactly one host runs the VM.
//!
//! The stream is sealed with a key both hosts hold ([`wire`]): a migration carries guest
//! memory and the page key, and nobody on the way may read or alter it.

mod precopy;
pub mod receive;
pub mod send;
mod wire;

pub use precopy::DEFAULT_DOWNTIME_LIMIT;
pub use receive::{Arrival, Arriving, Incoming};
pub use send::{migrate, Migrated};

/// Why a migration failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The VM cannot be migrated (no pool, a device that cannot be saved, its state).
    #[error("cannot migrate the VM: {0}")]
    Refused(String),
    /// The migration key could not be read or made.
    #[error("migration key: {0}")]
    Key(String),
    /// The connection failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// A frame did not open: another key, or altered on the way.
    #[error("the migration stream is not authentic (the two hosts' migration keys differ, or it was altered on the way): {0}")]
    Unauthentic(String),
    /// The other end broke the protocol.
    #[error("migration protocol: {0}")]
    Protocol(String),
    /// Saving or loading state failed.
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    /// The destination failed to take the VM; it runs on here.
    #[error("the destination failed: {0}")]
    Destination(String),
    /// The memory pool failed (etcd).
    #[error("memory pool: {0}")]
    Pool(String),
}

/// Maps an I/O error of `what` to [`MigrationError::Io`].
pub(crate) fn io(what: &'static str) -> impl Fn(std::io::Error) -> MigrationError {
    move |source| MigrationError::Io { what, source }
}
