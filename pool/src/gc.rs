//! Garbage collection of dead VMs' namespaces.
//!
//! A VM's record lives under its lease; its slab placements do not. A VM whose record is gone
//! while placements remain died without cleaning up (crash, host loss): its namespace still
//! holds pages on every server of its placement. [`sweep`] finds those (server, namespace)
//! pairs. The directory's collector ([`crate::Directory::collect_garbage`]) marks such a VM
//! first; once the mark is older than a grace period and the VM has not come back, it claims
//! the VM in one transaction (deletes the placement, so the VM can no longer register again,
//! and lists the pairs in the mark), then discards each namespace through a
//! [`NamespaceReclaimer`], keeping the pairs whose discard failed in the mark for the next
//! sweep.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::ids::{ServerId, VmId};
use crate::view::PoolView;

/// Discards a namespace on a memory server (implemented with the memory-server client's
/// discard). Called by the collector, outside any etcd transaction.
pub trait NamespaceReclaimer {
    /// Drops every page of `namespace` on the server at `address`. An error keeps the VM's
    /// placement for the next sweep.
    fn discard(
        &mut self,
        server: &ServerId,
        address: SocketAddr,
        namespace: u64,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;

    /// Whether this reclaimer discards on `server` (default: every server). A memory server
    /// collecting garbage for itself handles only its own id; the pairs of other servers stay
    /// in the VM's mark for their own collectors, without counting as failures.
    fn handles(&self, _server: &ServerId) -> bool {
        true
    }
}

/// The collector's note that a VM was seen gone (stored under `gc/<uuid>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcMark {
    /// When the collector first saw the VM gone (Unix milliseconds, the collector's clock).
    pub first_seen_unix_ms: u64,
    /// Once claimed (placement deleted): the discards still to do.
    #[serde(default)]
    pub pending: Vec<PendingDiscard>,
}

/// A namespace to discard on a server, kept in a claimed VM's mark until done.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingDiscard {
    /// The server.
    pub server: ServerId,
    /// The slab indices it held.
    pub slabs: Vec<u32>,
}

/// Where a dead VM left pages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Orphan {
    /// The VM whose record is gone.
    pub vm: VmId,
    /// Its namespace.
    pub namespace: u64,
    /// A server holding replicas of its slabs.
    pub server: ServerId,
    /// The server's address, if it is still registered. A server that is gone lost the pages
    /// with its process, or will be reclaimed when it restarts with a new instance; there is
    /// nothing to discard there.
    pub address: Option<SocketAddr>,
    /// The slab indices with a replica there.
    pub slabs: Vec<u32>,
}

/// Every (server, namespace) pair to discard, in (VM, server) order: those of VMs that have
/// placements but neither a record nor a snapshot, and those a claimed VM's mark still lists.
pub fn sweep(view: &PoolView) -> Vec<Orphan> {
    let mut out: BTreeMap<(VmId, ServerId), Vec<u32>> = BTreeMap::new();
    for (slab, rec) in &view.slabs {
        if view.owned(&slab.vm) {
            continue;
        }
        for server in &rec.replicas {
            out.entry((slab.vm, server.clone()))
                .or_default()
                .push(slab.index);
        }
    }
    for (vm, mark) in &view.gc_marks {
        for p in &mark.pending {
            out.entry((*vm, p.server.clone()))
                .or_default()
                .extend(&p.slabs);
        }
    }
    for slabs in out.values_mut() {
        slabs.sort_unstable();
        slabs.dedup();
    }
    out.into_iter()
        .map(|((vm, server), slabs)| Orphan {
            vm,
            namespace: vm.namespace(),
            address: view.servers.get(&server).map(|s| s.address),
            server,
            slabs,
        })
        .collect()
}

/// What a collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// Pairs discarded (or whose server is gone), their placement deleted.
    pub reclaimed: Vec<Orphan>,
    /// Pairs of VMs marked this sweep or still within the grace period.
    pub waiting: Vec<Orphan>,
    /// Pairs whose discard failed, with the error; their VM's placement is kept.
    pub failed: Vec<(Orphan, String)>,
    /// Pairs left in the VM's mark for another collector (the reclaimer does not handle
    /// their server).
    #[serde(default)]
    pub deferred: Vec<Orphan>,
    /// VMs whose placement was deleted.
    pub vms_reclaimed: Vec<VmId>,
    /// Marks removed because their VM is registered again.
    pub marks_cleared: Vec<VmId>,
}
