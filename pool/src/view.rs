//! The pool at one etcd revision: every declared rack, every live server, every live VM, every
//! VM snapshot, every slab placement and every garbage-collection mark. Placement, garbage
//! collection and the status model are pure functions of a view.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::gc::GcMark;
use crate::ids::{RackId, ServerId, VmId};
use crate::record::{ServerRecord, SlabRecord, VmRecord};

/// One slab of one VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SlabRef {
    /// The VM.
    pub vm: VmId,
    /// Slab index within the VM's remote share (slab `i` covers its remote pages
    /// `i * slab_bytes ..`).
    pub index: u32,
}

impl std::fmt::Display for SlabRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.vm, self.index)
    }
}

/// The pool at one revision.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolView {
    /// The etcd revision read (0 for a view built in memory).
    pub revision: i64,
    /// The racks the operator declared (`farvm pool racks add`). Only servers in a declared
    /// rack take slabs.
    #[serde(default)]
    pub racks: BTreeSet<RackId>,
    /// Registered (live) servers.
    pub servers: BTreeMap<ServerId, ServerRecord>,
    /// Registered (live) VMs.
    pub vms: BTreeMap<VmId, VmRecord>,
    /// Snapshots of pool VMs (each owns its VM's namespace and placement), by VM.
    #[serde(default)]
    pub snapshots: BTreeMap<VmId, crate::record::SnapshotRecord>,
    /// Slab placements, of live VMs, of snapshots and of VMs whose lease expired.
    pub slabs: BTreeMap<SlabRef, SlabRecord>,
    /// VMs the garbage collector marked as gone.
    pub gc_marks: BTreeMap<VmId, GcMark>,
    /// Replica moves the operator asked VMMs to make (drain, rebalance), by slab.
    #[serde(default)]
    pub move_requests: BTreeMap<SlabRef, crate::placement::Move>,
    /// Keys under the prefix whose value could not be read (skipped).
    pub unreadable: Vec<String>,
}

impl PoolView {
    /// Whether something owns VM `vm`'s namespace: its (leased) record or a snapshot.
    pub fn owned(&self, vm: &VmId) -> bool {
        self.vms.contains_key(vm) || self.snapshots.contains_key(vm)
    }

    /// Whether `rack` is declared: servers registered in any other rack take no slab.
    pub fn rack_declared(&self, rack: &RackId) -> bool {
        self.racks.contains(rack)
    }

    /// Whether `server` takes new slabs from clients of wire version `min_wire_version`: it
    /// is `up`, in a declared rack and speaks that version (room is checked separately).
    pub fn takes_new_slabs(&self, server: &ServerRecord, min_wire_version: u8) -> bool {
        server.health == crate::record::ServerHealth::Up
            && self.rack_declared(&server.rack)
            && server.wire_version >= min_wire_version
    }

    /// Servers that slab placements name but that are not registered: gone for good, or
    /// about to register again (after an etcd outage every lease expired, and each server
    /// registers again within its lease TTL of etcd's return).
    pub fn unregistered_replica_servers(&self) -> BTreeSet<&ServerId> {
        self.slabs
            .values()
            .flat_map(|s| &s.replicas)
            .filter(|id| !self.servers.contains_key(*id))
            .collect()
    }

    /// Bytes reserved on `server` by placed slab replicas.
    pub fn committed_bytes(&self, server: &ServerId) -> u64 {
        self.slabs
            .values()
            .filter(|s| s.replicas.contains(server))
            .map(|s| s.bytes)
            .sum()
    }

    /// Bytes reserved per server by placed slab replicas (servers with none are absent).
    pub fn committed_by_server(&self) -> BTreeMap<&ServerId, u64> {
        let mut out = BTreeMap::new();
        for s in self.slabs.values() {
            for r in &s.replicas {
                *out.entry(r).or_insert(0) += s.bytes;
            }
        }
        out
    }

    /// A server's load for placement: the larger of its stored pages and its reservations
    /// (slabs fill lazily, and a server may also hold pages of clients outside the pool).
    pub fn load_bytes(&self, server: &ServerRecord) -> u64 {
        server.used_bytes.max(self.committed_bytes(&server.id))
    }

    /// The slabs of one VM, in index order.
    pub fn vm_slabs(&self, vm: VmId) -> impl Iterator<Item = (&SlabRef, &SlabRecord)> {
        let lo = SlabRef { vm, index: 0 };
        let hi = SlabRef {
            vm,
            index: u32::MAX,
        };
        self.slabs.range(lo..=hi)
    }
}
