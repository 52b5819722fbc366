//! Errors of the etcd directory, and which etcd failures mean "etcd is unreachable".

use std::time::Duration;

use crate::ids::{RackId, ServerId, VmId};
use crate::placement::PlacementError;

/// A directory operation failed.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// etcd does not answer (down, restarting, partitioned). The directory keeps retrying in
    /// the background; registrations stay in place on the servers' side until their lease TTL.
    #[error(
        "etcd unreachable at {endpoints} (no answer for {:.1}s); last error: {detail}",
        down_for.as_secs_f64()
    )]
    Unreachable {
        /// The configured endpoints.
        endpoints: String,
        /// How long calls have been failing.
        down_for: Duration,
        /// The last transport error.
        detail: String,
    },
    /// etcd answered with an error.
    #[error("etcd refused the request: {0}")]
    Etcd(String),
    /// Placement refused the request.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// The rack is not declared in the pool (`farvm pool racks add`): a server may not
    /// register in it, and it cannot be removed.
    #[error("{}", unknown_rack(rack, declared))]
    UnknownRack {
        /// The rack asked for.
        rack: RackId,
        /// The racks the pool declares, in name order.
        declared: Vec<RackId>,
    },
    /// The rack still has live memory servers, so it cannot be removed.
    #[error(
        "rack {rack} still has {} live memory server(s) ({}): stop them (after `farvm pool \
         drain`) before removing the rack",
        servers.len(),
        join(servers)
    )]
    RackInUse {
        /// The rack.
        rack: RackId,
        /// Its live servers.
        servers: Vec<ServerId>,
    },
    /// A registration can no longer be renewed (e.g. a server whose lease expired in an etcd
    /// outage and whose rack was removed meanwhile).
    #[error("pool registration lost: {0}")]
    Lost(String),
    /// The pool holds no snapshot of this VM: never saved on a pool, deleted, or restored
    /// already (a pool snapshot is restored once).
    #[error(
        "the pool holds no snapshot of VM {0}: it was deleted, or restored already (a pool \
         snapshot is restored once: the restored VM overwrites its remote pages)"
    )]
    NoSnapshot(VmId),
    /// A VM with this id is registered already.
    #[error("VM {0} is already registered in the pool")]
    AlreadyRegistered(VmId),
    /// Other admissions changed the placement every time this one tried to commit.
    #[error("admission of VM {vm} raced with other admissions {attempts} times; try again")]
    Contended {
        /// The VM.
        vm: VmId,
        /// Attempts made.
        attempts: u32,
    },
    /// A record changed between reading it and committing a change to it.
    #[error("{key} changed while committing; re-read the pool and plan again")]
    Conflict {
        /// The key.
        key: String,
    },
    /// A change needs more operations in one etcd transaction than etcd allows.
    #[error(
        "{what} needs {ops} operations in one etcd transaction, above the limit of {limit} \
         (etcd --max-txn-ops); use larger slabs or raise the limit on etcd and in the directory config"
    )]
    TooManyOps {
        /// What was being committed.
        what: String,
        /// Operations needed.
        ops: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A VM's namespace could not be discarded on some servers.
    #[error(
        "could not discard namespace {namespace:#018x} of VM {vm} on {failures}; the garbage collector retries"
    )]
    Discard {
        /// The VM.
        vm: VmId,
        /// Its namespace.
        namespace: u64,
        /// `server: error` for each failure.
        failures: String,
    },
    /// The configuration is unusable.
    #[error("invalid directory configuration: {0}")]
    Config(String),
    /// The directory's runtime thread could not start.
    #[error("cannot start the etcd client runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

fn join<T: std::fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(|i| i.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn unknown_rack(rack: &RackId, declared: &[RackId]) -> String {
    if declared.is_empty() {
        format!(
            "rack {rack} is not declared in the pool, which declares no racks yet; declare \
             the pool's racks first: farvm pool racks add {rack} [RACK...]"
        )
    } else {
        format!(
            "rack {rack} is not declared in the pool (declared racks: {}); if {rack} is a new \
             rack, declare it first: farvm pool racks add {rack}",
            join(declared)
        )
    }
}

impl PoolError {
    /// Whether this is [`PoolError::Unreachable`] (retrying later may succeed).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
    }
}

/// Whether an etcd client error means the cluster could not be reached (as opposed to a
/// request it refused).
pub(crate) fn is_transport(e: &etcd_client::Error) -> bool {
    use tonic::Code;
    match e {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(s) => matches!(
            s.code(),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
        ),
        etcd_client::Error::LeaseKeepAliveError(_) | etcd_client::Error::WatchError(_) => true,
        _ => false,
    }
}
