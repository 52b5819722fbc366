//! Slab placement: pure functions of a [`PoolView`], no I/O.
//!
//! A VM's remote share (guest RAM minus its local budget) is cut into slabs; each slab gets R
//! replicas on R servers in R distinct racks. Only servers that are `up`, in a declared rack,
//! speak the client's wire version and have room for a whole slab take new slabs; a server's load is the larger
//! of its stored bytes and the slabs reserved on it.
//!
//! * [`admit`] places a whole VM or refuses it with a [`Shortfall`] naming the missing bytes
//!   and the racks that could supply them. It succeeds exactly when the share fits: with
//!   `c_r` slabs of room in rack `r` and `n` slabs to place, when Σ min(c_r, n) ≥ n·R.
//! * [`replace_replica`] moves one replica off a server (dead, full or draining);
//!   [`repair_plan`] does it for every replica on a dead server and enough replicas to bring
//!   overfull servers back under capacity; [`drain_plan`] for every replica on one server.
//! * [`rebalance_plan`] evens load relative to capacity across `up` servers with few moves: a
//!   replica only moves from a server above its fair share to one below it, no server both
//!   gives and receives, and no replica moves twice.
//!
//! Plans are lists of [`Move`]s; the directory commits each one (the VM's client copies the
//! slab to the new server first).

mod admit;
mod ledger;
mod rebalance;
mod replace;

pub use admit::{
    admit, fitted_slab_bytes, AdmissionRequest, RackRoom, Shortfall, VmPlacement, MAX_FITTED_SLAB,
    MIN_FITTED_SLAB,
};
pub use rebalance::rebalance_plan;
pub use replace::{drain_plan, repair_plan, replace_replica, DrainPlan, Unmovable};

use serde::{Deserialize, Serialize};

use crate::ids::ServerId;
use crate::units::fmt_bytes;
use crate::view::SlabRef;

#[cfg(doc)]
use crate::view::PoolView;

/// The most replicas a slab may have.
pub const MAX_REPLICATION: u8 = 8;

/// One replica of one slab changes server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    /// The slab.
    pub slab: SlabRef,
    /// The server giving up its replica.
    pub from: ServerId,
    /// The server taking it.
    pub to: ServerId,
    /// Bytes moved (the slab's size).
    pub bytes: u64,
}

impl std::fmt::Display for Move {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "slab {} ({}): {} -> {}",
            self.slab,
            fmt_bytes(self.bytes),
            self.from,
            self.to
        )
    }
}

/// Why placement failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlacementError {
    /// The request itself is wrong (e.g. local budget above guest RAM).
    #[error("invalid admission request: {0}")]
    Invalid(String),
    /// The remote share does not fit at the requested replication.
    #[error("{0}")]
    Shortfall(Box<Shortfall>),
    /// No server can take a replica.
    #[error("no server can take slab {slab} ({}) off {from}: {reason}", fmt_bytes(*bytes))]
    NoTarget {
        /// The slab.
        slab: SlabRef,
        /// The server it should leave.
        from: ServerId,
        /// Its size.
        bytes: u64,
        /// What ruled every candidate out.
        reason: String,
    },
    /// The slab has no placement record.
    #[error("slab {0} is not placed")]
    UnknownSlab(SlabRef),
    /// The server holds no replica of the slab.
    #[error("server {server} holds no replica of slab {slab}")]
    NotAReplica {
        /// The slab.
        slab: SlabRef,
        /// The server.
        server: ServerId,
    },
    /// The server is not registered.
    #[error("server {0} is not in the pool")]
    UnknownServer(ServerId),
}
