//! Builds a [`PoolView`] from the key-value pairs under the pool prefix.

use crate::keys::{KeyLayout, PoolKey};
use crate::record::ServerHealth;
use crate::view::{PoolView, SlabRef};

/// The view of `kvs` (keys under `keys`' prefix) at `revision`. Values that do not parse, or
/// whose id disagrees with their key, are listed in [`PoolView::unreadable`] and skipped.
pub(crate) fn build_view<'a>(
    keys: &KeyLayout,
    revision: i64,
    kvs: impl IntoIterator<Item = (String, &'a [u8])>,
) -> PoolView {
    let mut view = PoolView {
        revision,
        ..PoolView::default()
    };
    let mut drained = Vec::new();
    for (key, value) in kvs {
        let ok = match keys.parse(&key) {
            Some(PoolKey::Rack(rack)) => {
                view.racks.insert(rack);
                true
            }
            Some(PoolKey::Server(id)) => serde_json::from_slice(value)
                .ok()
                .filter(|r: &crate::record::ServerRecord| r.id == id)
                .map(|r| view.servers.insert(id, r))
                .is_some(),
            Some(PoolKey::Vm(id)) => serde_json::from_slice(value)
                .ok()
                .filter(|r: &crate::record::VmRecord| r.uuid == id)
                .map(|r| view.vms.insert(id, r))
                .is_some(),
            Some(PoolKey::Snapshot(id)) => serde_json::from_slice(value)
                .ok()
                .filter(|r: &crate::record::SnapshotRecord| r.vm.uuid == id)
                .map(|r| view.snapshots.insert(id, r))
                .is_some(),
            Some(PoolKey::Slab(vm, index)) => serde_json::from_slice(value)
                .ok()
                .map(|r| view.slabs.insert(SlabRef { vm, index }, r))
                .is_some(),
            Some(PoolKey::GcMark(vm)) => serde_json::from_slice(value)
                .ok()
                .map(|m| view.gc_marks.insert(vm, m))
                .is_some(),
            Some(PoolKey::MoveRequest(vm, index)) => serde_json::from_slice(value)
                .ok()
                .filter(|m: &crate::placement::Move| m.slab == SlabRef { vm, index })
                .map(|m| view.move_requests.insert(m.slab, m))
                .is_some(),
            Some(PoolKey::Drain(id)) => {
                drained.push(id);
                true
            }
            None => false,
        };
        if !ok {
            tracing::warn!(%key, "unreadable pool record skipped");
            view.unreadable.push(key);
        }
    }
    for id in drained {
        if let Some(s) = view.servers.get_mut(&id) {
            s.health = ServerHealth::Draining;
        }
    }
    view
}
