//! Live migration's handover of a pool VM's namespace from the VMM running it (the source)
//! to the VMM it moves to (the destination), decided by one etcd transaction on the VM's
//! record.
//!
//! The source, its guest paused, reads the record's modification revision: the *fence*
//! ([`VmRegistration::handover_fence`]). The destination commits the handover
//! ([`Directory::take_over_vm`]): in one transaction, only while the record's revision is
//! still the fence, it puts the record (its host now the destination's) under the
//! destination's own lease. A source that gives up instead ([`VmRegistration::cancel_handover`])
//! puts the record again under its lease, only while the revision is still the fence. Exactly
//! one of the two transactions succeeds, whatever the network, the processes or etcd do
//! meanwhile, so exactly one VMM owns the namespace; the placement records never move.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use super::lease::Stop;
use super::settle::{read_patiently, settle};
use super::vm::VmRegistration;
use super::{Directory, PoolError};
use crate::ids::VmId;
use crate::record::VmRecord;

impl VmRegistration {
    /// The fence of a handover: the VM record's modification revision now. Fails if the
    /// record is not under this registration's live lease (its lease expired, or the record
    /// is another VMM's already).
    pub fn handover_fence(&self) -> Result<i64, PoolError> {
        let sh = &self.dir().shared;
        let key = sh.keys.vm(&self.record().uuid);
        let lease = self.lease().ok_or_else(|| {
            PoolError::Lost("the VM's pool lease is not live (etcd unreachable?)".into())
        })?;
        let mut kv = sh.client.kv_client();
        let resp = sh.call(kv.get(key.clone(), None::<GetOptions>))?;
        match resp.kvs().first() {
            Some(kv) if kv.lease() == lease => Ok(kv.mod_revision()),
            Some(_) => Err(PoolError::Conflict { key }),
            None => Err(PoolError::Lost(
                "the VM's record is gone from the pool".into(),
            )),
        }
    }

    /// Gives up a handover the destination has not committed: in one transaction, only while
    /// the record's revision is still `fence`, puts the record again under this lease (the
    /// destination's commit then fails). `Ok(true)`: the VM is still this registration's;
    /// `Ok(false)`: the destination committed first and owns the namespace (stop with
    /// [`VmRegistration::handed_over`]). An error: etcd has not decided yet (see `settle`).
    pub fn cancel_handover(&self, fence: i64) -> Result<bool, PoolError> {
        let sh = &self.dir().shared;
        let key = sh.keys.vm(&self.record().uuid);
        let lease = self.lease().ok_or_else(|| {
            PoolError::Lost("the VM's pool lease is not live (etcd unreachable?)".into())
        })?;
        let value =
            serde_json::to_vec(self.record()).map_err(|e| PoolError::Etcd(e.to_string()))?;
        settle(sh, &key, lease, || {
            Txn::new()
                .when([Compare::mod_revision(key.clone(), CompareOp::Equal, fence)])
                .and_then([TxnOp::put(
                    key.clone(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )])
        })
    }

    /// The source's end after the destination committed: its lease (which holds nothing now:
    /// the record is under the destination's) is revoked; nothing is released.
    pub fn handed_over(mut self) {
        self.task_mut().stop(Stop::Revoke);
        tracing::info!(vm = %self.record().uuid, "VM's namespace handed over to its new host");
    }
}

impl Directory {
    /// Commits the handover of VM `vm` to `host` (see the module doc): grants a lease of
    /// `ttl`, and in one transaction, only while the record's revision is `fence`, puts the
    /// record under it. [`PoolError::Conflict`] if the record changed since the fence (the
    /// source cancelled, or its lease was renewed): the source keeps the VM. While etcd does
    /// not answer it tries again (for up to 300 s); an error then leaves the outcome unknown.
    pub fn take_over_vm(
        &self,
        vm: VmId,
        host: &str,
        ttl: Duration,
        fence: i64,
    ) -> Result<VmRegistration, PoolError> {
        let sh = &self.shared;
        // The destination waits for etcd as its source does (the guest is paused either way).
        let view = read_patiently("taking a VM over", || sh.view())?;
        let mut record: VmRecord = view
            .vms
            .get(&vm)
            .cloned()
            .ok_or_else(|| PoolError::Lost(format!("VM {vm} is not registered in the pool")))?;
        record.host = host.to_owned();
        let key = sh.keys.vm(&vm);
        let reg = self.put_vm_under_new_lease(
            &view,
            record,
            ttl,
            vec![Compare::mod_revision(key.clone(), CompareOp::Equal, fence)],
            Vec::new(),
            PoolError::Conflict { key },
        )?;
        tracing::info!(%vm, %host, "VM's namespace taken over from its old host");
        Ok(reg)
    }
}
