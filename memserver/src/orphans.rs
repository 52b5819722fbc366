//! Which of a pool member's namespaces nothing in the pool owns any more: the check that lets
//! a memory server reclaim by itself what the pool's collector could not tell it to (it was
//! away, partitioned or restarting when the VM was claimed; a claim's discard failed; a copy
//! landed there that no record lists).
//!
//! A namespace is owned while the pool holds any of: the VM's record (its lease is alive),
//! a snapshot of the VM (`farvm snapshot` of a pool VM: it owns the namespace until it is
//! restored or deleted), a slab placement of the VM (the lease expired but the collector has not claimed it: the
//! VMM may register again), or an unclaimed collector mark. A namespace none of these name,
//! in every fresh view of the pool for a whole grace period, is an orphan: no VMM can use it
//! again (a claimed VM cannot register again), so dropping it loses nothing.
//!
//! The caller lists the namespaces it holds *before* reading the view: a VM is admitted (its
//! record and placement written) before its first page is, so every namespace in the list
//! belongs to a VM that is in the view unless it is gone. A view with unreadable keys
//! decides nothing (a record may be among them), and neither does an etcd that does not
//! answer: a suspect is dropped only on a fresh view that still finds no owner.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use farvm_pool::PoolView;

/// Namespaces seen without an owner, with when each was first seen so.
#[derive(Debug, Default)]
pub struct OrphanNamespaces {
    suspects: HashMap<u64, Instant>,
}

impl OrphanNamespaces {
    /// Given the namespaces `held` (listed before `view` was read) and a fresh `view`, the
    /// namespaces to drop now: those without an owner in every view for at least `grace`.
    pub fn check(
        &mut self,
        held: &[u64],
        view: &PoolView,
        now: Instant,
        grace: Duration,
    ) -> Vec<u64> {
        if !view.unreadable.is_empty() {
            return Vec::new();
        }
        // A live VM's record names its namespace; placements and marks, as the collector reads
        // them, only the VM (its namespace derives from its id).
        let owned: HashSet<u64> = view
            .slabs
            .keys()
            .map(|s| &s.vm)
            .chain(
                view.gc_marks
                    .iter()
                    .filter(|(_, m)| m.pending.is_empty())
                    .map(|(vm, _)| vm),
            )
            .map(|vm| vm.namespace())
            .chain(view.vms.values().map(|r| r.namespace))
            .chain(view.snapshots.values().map(|s| s.vm.namespace))
            .collect();
        let unowned: HashSet<u64> = held
            .iter()
            .copied()
            .filter(|ns| !owned.contains(ns))
            .collect();
        self.suspects.retain(|ns, _| unowned.contains(ns));
        let mut drop = Vec::new();
        for ns in unowned {
            let since = *self.suspects.entry(ns).or_insert(now);
            if now.saturating_duration_since(since) >= grace {
                drop.push(ns);
            }
        }
        for ns in &drop {
            self.suspects.remove(ns);
        }
        drop.sort_unstable();
        drop
    }

    /// How many namespaces are suspected now.
    pub fn suspects(&self) -> usize {
        self.suspects.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use farvm_pool::gc::{GcMark, PendingDiscard};
    use farvm_pool::{ServerId, SlabRecord, SlabRef, VmId};

    fn view_with(vms: &[VmId]) -> PoolView {
        let mut v = PoolView {
            revision: 1,
            ..PoolView::default()
        };
        for vm in vms {
            v.slabs.insert(
                SlabRef { vm: *vm, index: 0 },
                SlabRecord {
                    bytes: 1 << 20,
                    replicas: vec![ServerId::new("s").unwrap()],
                },
            );
        }
        v
    }

    #[test]
    fn a_namespace_is_dropped_only_after_a_grace_of_views_without_an_owner() {
        let (a, b) = (VmId::random(), VmId::random());
        let held = [a.namespace(), b.namespace()];
        let grace = Duration::from_secs(5);
        let t0 = Instant::now();
        let mut o = OrphanNamespaces::default();
        // b has a placement (its lease may have expired: it may come back); a has nothing.
        let view = view_with(&[b]);
        assert!(o.check(&held, &view, t0, grace).is_empty());
        assert_eq!(o.suspects(), 1);
        assert!(o
            .check(&held, &view, t0 + Duration::from_secs(4), grace)
            .is_empty());
        assert_eq!(
            o.check(&held, &view, t0 + Duration::from_secs(5), grace),
            vec![a.namespace()]
        );
        assert_eq!(o.suspects(), 0);
    }

    #[test]
    fn an_owner_seen_again_clears_the_suspicion_and_an_unreadable_view_decides_nothing() {
        let a = VmId::random();
        let held = [a.namespace()];
        let grace = Duration::from_secs(5);
        let t0 = Instant::now();
        let mut o = OrphanNamespaces::default();
        assert!(o.check(&held, &view_with(&[]), t0, grace).is_empty());
        // Its placement shows up (the view before lagged): no longer suspected.
        assert!(o
            .check(&held, &view_with(&[a]), t0 + Duration::from_secs(1), grace)
            .is_empty());
        assert_eq!(o.suspects(), 0);
        // Suspected anew, from a later time.
        assert!(o
            .check(&held, &view_with(&[]), t0 + Duration::from_secs(2), grace)
            .is_empty());
        let mut unreadable = view_with(&[]);
        unreadable.unreadable.push("pool/vms/x".into());
        assert!(o
            .check(&held, &unreadable, t0 + Duration::from_secs(60), grace)
            .is_empty());
        assert!(o
            .check(&held, &view_with(&[]), t0 + Duration::from_secs(6), grace)
            .is_empty());
        assert_eq!(
            o.check(&held, &view_with(&[]), t0 + Duration::from_secs(7), grace),
            vec![a.namespace()]
        );
    }

    #[test]
    fn an_unclaimed_collector_mark_owns_its_namespace_and_a_claimed_one_does_not() {
        let (a, b) = (VmId::random(), VmId::random());
        let held = [a.namespace(), b.namespace()];
        let mut view = view_with(&[]);
        view.gc_marks.insert(
            a,
            GcMark {
                first_seen_unix_ms: 0,
                pending: Vec::new(),
            },
        );
        view.gc_marks.insert(
            b,
            GcMark {
                first_seen_unix_ms: 0,
                pending: vec![PendingDiscard {
                    server: ServerId::new("gone").unwrap(),
                    slabs: vec![0],
                }],
            },
        );
        let mut o = OrphanNamespaces::default();
        let t0 = Instant::now();
        assert!(o.check(&held, &view, t0, Duration::ZERO) == vec![b.namespace()]);
    }

    #[test]
    fn a_snapshot_owns_its_vms_namespace_without_a_record_or_placement() {
        let vm = VmId::random();
        let held = [vm.namespace()];
        let mut view = view_with(&[]);
        view.snapshots.insert(
            vm,
            farvm_pool::SnapshotRecord {
                vm: farvm_pool::VmRecord {
                    uuid: vm,
                    namespace: vm.namespace(),
                    name: "saved".into(),
                    host: "h".into(),
                    guest_ram_bytes: 1 << 30,
                    local_budget_bytes: 1 << 28,
                    replication: 2,
                    slab_bytes: 1 << 28,
                    slabs: 3,
                },
                dir: "/snap".into(),
                host: "h".into(),
                remote_pages: 1,
                local_pages: 1,
                created_unix_ms: 0,
            },
        );
        let mut o = OrphanNamespaces::default();
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(3600);
        assert!(o.check(&held, &view, t0, Duration::ZERO).is_empty());
        assert!(o.check(&held, &view, later, Duration::ZERO).is_empty());
        view.snapshots.clear();
        assert_eq!(
            o.check(&held, &view, later, Duration::ZERO),
            vec![vm.namespace()]
        );
    }
}
