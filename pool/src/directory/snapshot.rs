//! Snapshots of pool VMs in etcd: the ownership of a saved VM's namespace passes from its
//! leased record to a snapshot record ([`VmRegistration::hand_to_snapshot`]), back to a new
//! leased record under the same uuid when the snapshot is restored
//! ([`Directory::restore_snapshot`], once), or to the collectors when it is deleted
//! ([`Directory::delete_snapshot`]). Each change is one transaction; the placement records
//! stay where they are throughout.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp};

use super::lease::Stop;
use super::vm::VmRegistration;
use super::{Directory, PoolError};
use crate::gc::{GcMark, PendingDiscard};
use crate::ids::{ServerId, VmId};
use crate::record::SnapshotRecord;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, PoolError> {
    serde_json::to_vec(v).map_err(|e| PoolError::Etcd(e.to_string()))
}

/// What a snapshot holds, as the saving VMM counts it.
#[derive(Debug, Clone)]
pub struct SnapshotHolding {
    /// The snapshot's directory.
    pub dir: String,
    /// The saving host.
    pub host: String,
    /// Pages left on the memory servers.
    pub remote_pages: u64,
    /// Pages written into the directory.
    pub local_pages: u64,
}

impl VmRegistration {
    /// Hands the VM's namespace to a snapshot record: in one transaction (only while the VM's
    /// record is still there), deletes the leased record and any collector mark and writes
    /// `snapshots/<uuid>`; then revokes the lease. The placement stays. On failure the
    /// registration comes back untouched (the VM still owns its namespace).
    pub fn hand_to_snapshot(
        mut self,
        holding: SnapshotHolding,
    ) -> Result<SnapshotRecord, (Box<Self>, PoolError)> {
        let record = SnapshotRecord {
            vm: self.record().clone(),
            dir: holding.dir,
            host: holding.host,
            remote_pages: holding.remote_pages,
            local_pages: holding.local_pages,
            created_unix_ms: now_ms(),
        };
        let vm = record.vm.uuid;
        let sh = self.dir().shared.clone();
        let value = match to_json(&record) {
            Ok(v) => v,
            Err(e) => return Err((Box::new(self), e)),
        };
        let vm_key = sh.keys.vm(&vm);
        let txn = Txn::new()
            .when([Compare::version(vm_key.clone(), CompareOp::Greater, 0)])
            .and_then([
                TxnOp::delete(vm_key.clone(), None::<DeleteOptions>),
                TxnOp::delete(sh.keys.gc_mark(&vm), None::<DeleteOptions>),
                TxnOp::delete(
                    sh.keys.vm_moves(&vm),
                    Some(DeleteOptions::new().with_prefix()),
                ),
                TxnOp::put(sh.keys.snapshot(&vm), value, None::<PutOptions>),
            ]);
        let mut kv = sh.client.kv_client();
        match sh.call(kv.txn(txn)) {
            Ok(r) if r.succeeded() => {}
            Ok(_) => return Err((Box::new(self), PoolError::Conflict { key: vm_key })),
            Err(e) => return Err((Box::new(self), e)),
        }
        self.task_mut().stop(Stop::Revoke);
        tracing::info!(%vm, dir = %record.dir, "VM's namespace handed to its snapshot");
        Ok(record)
    }
}

impl Directory {
    /// Restores VM `vm`'s snapshot record to a running VM on `host`: in one transaction
    /// (only while the snapshot record is there and no VM record is), deletes the snapshot
    /// record and writes the VM's record under a new lease of `ttl`, kept alive in the
    /// background; returns it with the snapshot record it replaced (to hand the namespace
    /// back with [`VmRegistration::hand_to_snapshot`] if the restore fails before the VM
    /// runs). [`PoolError::NoSnapshot`] when the record is gone (deleted, or restored
    /// already).
    pub fn restore_snapshot(
        &self,
        vm: VmId,
        host: &str,
        ttl: Duration,
    ) -> Result<(VmRegistration, SnapshotRecord), PoolError> {
        let sh = &self.shared;
        let view = sh.view()?;
        let snap = view.snapshots.get(&vm).ok_or(PoolError::NoSnapshot(vm))?;
        if view.vms.contains_key(&vm) {
            return Err(PoolError::AlreadyRegistered(vm));
        }
        let mut record = snap.vm.clone();
        record.host = host.to_owned();
        let name = record.name.clone();
        let snap_key = sh.keys.snapshot(&vm);
        let reg = self.put_vm_under_new_lease(
            &view,
            record,
            ttl,
            vec![
                Compare::version(snap_key.clone(), CompareOp::Greater, 0),
                Compare::create_revision(sh.keys.vm(&vm), CompareOp::Equal, 0),
            ],
            vec![TxnOp::delete(snap_key, None::<DeleteOptions>)],
            PoolError::NoSnapshot(vm),
        )?;
        tracing::info!(%vm, %name, "VM restored from its snapshot into the pool");
        Ok((reg, snap.clone()))
    }

    /// Deletes VM `vm`'s snapshot record and frees its pages: in one transaction (only while
    /// the record is there), deletes it and the placement and hands every server of the
    /// placement to the collectors as a claimed mark (the memory servers watching the pool
    /// drop the namespace at once). Returns the deleted record.
    pub fn delete_snapshot(&self, vm: VmId) -> Result<SnapshotRecord, PoolError> {
        let sh = &self.shared;
        let view = sh.view()?;
        let snap = view
            .snapshots
            .get(&vm)
            .cloned()
            .ok_or(PoolError::NoSnapshot(vm))?;
        let mut by_server: std::collections::BTreeMap<ServerId, Vec<u32>> = Default::default();
        for (slab, rec) in view.vm_slabs(vm) {
            for s in &rec.replicas {
                by_server.entry(s.clone()).or_default().push(slab.index);
            }
        }
        let mark = GcMark {
            first_seen_unix_ms: now_ms(),
            pending: by_server
                .into_iter()
                .map(|(server, slabs)| PendingDiscard { server, slabs })
                .collect(),
        };
        let snap_key = sh.keys.snapshot(&vm);
        let mut ops = vec![
            TxnOp::delete(snap_key.clone(), None::<DeleteOptions>),
            TxnOp::delete(
                sh.keys.vm_placement(&vm),
                Some(DeleteOptions::new().with_prefix()),
            ),
        ];
        if !mark.pending.is_empty() {
            ops.push(TxnOp::put(
                sh.keys.gc_mark(&vm),
                to_json(&mark)?,
                None::<PutOptions>,
            ));
        }
        let txn = Txn::new()
            .when([Compare::version(snap_key, CompareOp::Greater, 0)])
            .and_then(ops);
        let mut kv = sh.client.kv_client();
        if !sh.call(kv.txn(txn))?.succeeded() {
            return Err(PoolError::NoSnapshot(vm));
        }
        tracing::info!(%vm, "snapshot deleted; its servers drop its namespace");
        Ok(snap)
    }
}
