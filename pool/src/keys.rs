//! The pool's key layout in etcd. Everything lives under one prefix (default
//! `/farvm/pool/v1`; the `v1` changes only with an incompatible layout):
//!
//! | key                                   | value              | lease        |
//! |---------------------------------------|--------------------|--------------|
//! | `<prefix>/racks/<rack>`               | `{}`               | none         |
//! | `<prefix>/servers/<server-id>`        | [`ServerRecord`]   | the server's |
//! | `<prefix>/vms/<vm-uuid>`              | [`VmRecord`]       | the VM's     |
//! | `<prefix>/placement/<vm-uuid>/<slab>` | [`SlabRecord`]     | none         |
//! | `<prefix>/gc/<vm-uuid>`               | [`GcMark`]         | none         |
//! | `<prefix>/drain/<server-id>`          | `{}`               | none         |
//! | `<prefix>/moves/<vm-uuid>/<slab>`     | [`Move`]           | none         |
//! | `<prefix>/snapshots/<vm-uuid>`        | [`SnapshotRecord`] | none         |
//!
//! Values are JSON. `racks/` holds the racks the operator declared: a server registers only
//! in a declared rack (a misspelt `--rack` must not create a new failure domain), and a rack is
//! removed only while no live server is in it. A placement outlives its VM's lease on purpose: once the VM record is gone
//! the placement tells the garbage collector which namespaces to discard where; the collector
//! first marks the VM under `gc/` and discards after a grace period, and a VMM that renews its
//! registration in that period removes the mark. A `drain/` mark is the operator's: the server
//! reads as draining (no new slabs) whatever its own record says, across its restarts. A
//! `moves/` entry asks the VM's VMM to move one replica of one slab (a drain or a rebalance
//! planned by the operator's command): the VMM copies the slab while the VM runs, commits the
//! new placement and deletes the request. A `snapshots/` record owns a saved VM's namespace
//! instead of its (leased) VM record: `farvm snapshot` of a pool VM moves the ownership there
//! in one transaction, its placement stays, and a restore moves it back to a new leased VM
//! record under the same uuid (so the snapshot is restored once); deleting the snapshot hands
//! its servers to the collectors as [`VmRegistration::release`] does.
//!
//! [`SnapshotRecord`]: crate::record::SnapshotRecord
//! [`VmRegistration::release`]: crate::VmRegistration::release
//! [`ServerRecord`]: crate::record::ServerRecord
//! [`VmRecord`]: crate::record::VmRecord
//! [`SlabRecord`]: crate::record::SlabRecord
//! [`GcMark`]: crate::gc::GcMark
//! [`Move`]: crate::placement::Move

use crate::ids::{RackId, ServerId, VmId};

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "/farvm/pool/v1";

/// Builds and parses keys under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: String,
}

/// A parsed pool key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolKey {
    /// `racks/<rack>`
    Rack(RackId),
    /// `servers/<id>`
    Server(ServerId),
    /// `vms/<uuid>`
    Vm(VmId),
    /// `placement/<uuid>/<slab>`
    Slab(VmId, u32),
    /// `gc/<uuid>`
    GcMark(VmId),
    /// `drain/<id>`
    Drain(ServerId),
    /// `moves/<uuid>/<slab>`
    MoveRequest(VmId, u32),
    /// `snapshots/<uuid>`
    Snapshot(VmId),
}

impl KeyLayout {
    /// Keys under `prefix` (trailing slashes are ignored).
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.trim_end_matches('/').to_owned(),
        }
    }

    /// The prefix every pool key starts with, with a trailing slash.
    pub fn root(&self) -> String {
        format!("{}/", self.prefix)
    }

    /// `<prefix>/racks/` (every declared rack).
    pub fn racks(&self) -> String {
        format!("{}/racks/", self.prefix)
    }

    /// `<prefix>/racks/<rack>`
    pub fn rack(&self, rack: &RackId) -> String {
        format!("{}/racks/{rack}", self.prefix)
    }

    /// `<prefix>/servers/`
    pub fn servers(&self) -> String {
        format!("{}/servers/", self.prefix)
    }

    /// `<prefix>/servers/<id>`
    pub fn server(&self, id: &ServerId) -> String {
        format!("{}/servers/{id}", self.prefix)
    }

    /// `<prefix>/vms/<uuid>`
    pub fn vm(&self, vm: &VmId) -> String {
        format!("{}/vms/{vm}", self.prefix)
    }

    /// `<prefix>/placement/` (every VM's slabs).
    pub fn placements(&self) -> String {
        format!("{}/placement/", self.prefix)
    }

    /// `<prefix>/placement/<uuid>/` (one VM's slabs).
    pub fn vm_placement(&self, vm: &VmId) -> String {
        format!("{}/placement/{vm}/", self.prefix)
    }

    /// `<prefix>/placement/<uuid>/<slab>`
    pub fn slab(&self, vm: &VmId, slab: u32) -> String {
        format!("{}/placement/{vm}/{slab}", self.prefix)
    }

    /// `<prefix>/gc/<uuid>`
    pub fn gc_mark(&self, vm: &VmId) -> String {
        format!("{}/gc/{vm}", self.prefix)
    }

    /// `<prefix>/drain/<id>`
    pub fn drain_mark(&self, id: &ServerId) -> String {
        format!("{}/drain/{id}", self.prefix)
    }

    /// `<prefix>/moves/<uuid>/` (one VM's move requests).
    pub fn vm_moves(&self, vm: &VmId) -> String {
        format!("{}/moves/{vm}/", self.prefix)
    }

    /// `<prefix>/moves/<uuid>/<slab>`
    pub fn move_request(&self, vm: &VmId, slab: u32) -> String {
        format!("{}/moves/{vm}/{slab}", self.prefix)
    }

    /// `<prefix>/snapshots/` (every snapshot).
    pub fn snapshots(&self) -> String {
        format!("{}/snapshots/", self.prefix)
    }

    /// `<prefix>/snapshots/<uuid>`
    pub fn snapshot(&self, vm: &VmId) -> String {
        format!("{}/snapshots/{vm}", self.prefix)
    }

    /// Parses a key under this prefix; `None` for anything else.
    pub fn parse(&self, key: &str) -> Option<PoolKey> {
        let rest = key.strip_prefix(&self.prefix)?.strip_prefix('/')?;
        let (kind, name) = rest.split_once('/')?;
        match kind {
            "racks" => RackId::new(name).ok().map(PoolKey::Rack),
            "servers" => ServerId::new(name).ok().map(PoolKey::Server),
            "vms" => name.parse().ok().map(PoolKey::Vm),
            "gc" => name.parse().ok().map(PoolKey::GcMark),
            "snapshots" => name.parse().ok().map(PoolKey::Snapshot),
            "drain" => ServerId::new(name).ok().map(PoolKey::Drain),
            "placement" => {
                let (vm, slab) = name.split_once('/')?;
                Some(PoolKey::Slab(vm.parse().ok()?, slab.parse().ok()?))
            }
            "moves" => {
                let (vm, slab) = name.split_once('/')?;
                Some(PoolKey::MoveRequest(vm.parse().ok()?, slab.parse().ok()?))
            }
            _ => None,
        }
    }
}

impl Default for KeyLayout {
    fn default() -> Self {
        Self::new(DEFAULT_PREFIX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip() {
        let k = KeyLayout::new("/farvm/pool/v1/");
        let s = ServerId::new("ms-1").unwrap();
        let vm = VmId::random();
        assert_eq!(k.server(&s), "/farvm/pool/v1/servers/ms-1");
        assert_eq!(k.parse(&k.server(&s)), Some(PoolKey::Server(s)));
        assert_eq!(k.parse(&k.vm(&vm)), Some(PoolKey::Vm(vm)));
        assert_eq!(k.parse(&k.slab(&vm, 17)), Some(PoolKey::Slab(vm, 17)));
        assert_eq!(k.parse(&k.gc_mark(&vm)), Some(PoolKey::GcMark(vm)));
        assert_eq!(k.parse(&k.snapshot(&vm)), Some(PoolKey::Snapshot(vm)));
        assert!(k.snapshot(&vm).starts_with(&k.snapshots()));
        let r = RackId::new("r1").unwrap();
        assert_eq!(k.rack(&r), "/farvm/pool/v1/racks/r1");
        assert!(k.rack(&r).starts_with(&k.racks()));
        assert_eq!(k.parse(&k.rack(&r)), Some(PoolKey::Rack(r)));
        assert_eq!(k.parse("/farvm/pool/v1/racks/a/b"), None);
        let d = ServerId::new("ms-2").unwrap();
        assert_eq!(k.parse(&k.drain_mark(&d)), Some(PoolKey::Drain(d)));
        assert!(k.slab(&vm, 3).starts_with(&k.vm_placement(&vm)));
        assert_eq!(
            k.parse(&k.move_request(&vm, 4)),
            Some(PoolKey::MoveRequest(vm, 4))
        );
        assert_eq!(k.parse("/farvm/pool/v2/servers/ms-1"), None);
        assert_eq!(k.parse("/farvm/pool/v1/vms/not-a-uuid"), None);
        assert_eq!(k.parse("/farvm/pool/v1/placement/x"), None);
    }
}
