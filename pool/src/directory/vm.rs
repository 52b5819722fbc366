//! VM admission and registration: the placement is computed from a fresh view and committed
//! with the VM's leased record in one transaction, retried when another admission won.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp};

use super::lease::{Holder, LeaseTask, RegistrationState, Stop};
use super::settle::{is_lease_gone, settle};
use super::{Directory, PoolError};
use crate::gc::NamespaceReclaimer;
use crate::placement::{admit, AdmissionRequest, VmPlacement};
use crate::record::VmRecord;

/// Admission attempts before giving up with [`PoolError::Contended`].
const ADMIT_ATTEMPTS: u32 = 8;

/// Leases granted, one after another expired in an outage, before a registration that
/// replaces a record gives up.
const LEASE_GRANTS: u32 = 3;

/// An admitted VM. Dropping it revokes the VM's lease and leaves its placement to the garbage
/// collector; [`VmRegistration::retire`] is the clean exit that discards its pages first.
pub struct VmRegistration {
    dir: Directory,
    record: VmRecord,
    placement: VmPlacement,
    task: LeaseTask,
}

impl Directory {
    /// Admits a VM: places its remote share ([`admit`]) on the current pool and commits the
    /// VM record (under a new lease of `ttl`, kept alive in the background) together with
    /// every slab's placement, in one etcd transaction that fails if any placement changed
    /// since the pool was read (then it is planned again, up to 8 times).
    ///
    /// Refused with [`PoolError::Placement`] (a shortfall naming the racks and bytes missing)
    /// when the share does not fit, [`PoolError::AlreadyRegistered`] when the id is taken.
    pub fn admit_vm(
        &self,
        req: &AdmissionRequest,
        ttl: Duration,
    ) -> Result<VmRegistration, PoolError> {
        let sh = &self.shared;
        let ttl_s = ttl.as_secs().max(1);
        let slabs = req.slab_count();
        let ops = slabs as usize + 1;
        if ops > sh.cfg.max_txn_ops {
            return Err(PoolError::TooManyOps {
                what: format!("admitting VM {} ({slabs} slabs)", req.vm),
                ops,
                limit: sh.cfg.max_txn_ops,
            });
        }
        let vm_key = sh.keys.vm(&req.vm);
        for _ in 0..ADMIT_ATTEMPTS {
            let view = sh.view()?;
            if view.vms.contains_key(&req.vm) {
                return Err(PoolError::AlreadyRegistered(req.vm));
            }
            let placement = admit(&view, req)?;
            let record = req.record(placement.slabs.len() as u32);
            let value = serde_json::to_vec(&record).map_err(|e| PoolError::Etcd(e.to_string()))?;

            let mut lc = sh.client.lease_client();
            let lease = sh.call(lc.grant(ttl_s as i64, None))?.id();
            let mut ops = vec![TxnOp::put(
                vm_key.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )];
            for (i, slab) in placement.slabs.iter().enumerate() {
                let v = serde_json::to_vec(slab).map_err(|e| PoolError::Etcd(e.to_string()))?;
                ops.push(TxnOp::put(
                    sh.keys.slab(&req.vm, i as u32),
                    v,
                    None::<PutOptions>,
                ));
            }
            let txn = Txn::new()
                .when([
                    Compare::create_revision(vm_key.clone(), CompareOp::Equal, 0),
                    Compare::mod_revision(sh.keys.placements(), CompareOp::Less, view.revision + 1)
                        .with_prefix(),
                ])
                .and_then(ops);
            let mut kv = sh.client.kv_client();
            let committed = sh.call(kv.txn(txn));
            match committed {
                Ok(r) if r.succeeded() => {
                    tracing::info!(vm = %req.vm, name = %req.name, slabs = placement.slabs.len(), servers = ?placement.servers(), "VM admitted to the pool");
                    let task = LeaseTask::start(
                        sh.clone(),
                        vm_key,
                        value,
                        Duration::from_secs(ttl_s),
                        lease,
                        Holder::vm(&sh.keys, &req.vm, record.slabs),
                    );
                    return Ok(VmRegistration {
                        dir: self.clone(),
                        record,
                        placement,
                        task,
                    });
                }
                other => {
                    let _ = sh.call(lc.revoke(lease));
                    other?;
                    tracing::debug!(vm = %req.vm, "admission raced with another; planning again");
                }
            }
        }
        Err(PoolError::Contended {
            vm: req.vm,
            attempts: ADMIT_ATTEMPTS,
        })
    }
}

impl Directory {
    /// Registers VM `record` (placed as `view` says) under a new lease of `ttl`: in one
    /// transaction, only while every compare of `when` holds, puts the record under the lease
    /// together with the operations `also`, then keeps the lease alive in the background. If
    /// the condition fails the lease is revoked and `refused` returned. While etcd does not
    /// answer, the transaction is sent again until it is decided (`settle`): an etcd failure
    /// returned means the outcome is not known (the lease is then left to expire, never
    /// revoked: revoking would delete a record that did get under it).
    pub(super) fn put_vm_under_new_lease(
        &self,
        view: &crate::view::PoolView,
        record: VmRecord,
        ttl: Duration,
        when: Vec<Compare>,
        also: Vec<TxnOp>,
        refused: PoolError,
    ) -> Result<VmRegistration, PoolError> {
        let sh = &self.shared;
        let vm = record.uuid;
        let placement = VmPlacement {
            vm,
            slabs: view.vm_slabs(vm).map(|(_, r)| r.clone()).collect(),
        };
        let value = serde_json::to_vec(&record).map_err(|e| PoolError::Etcd(e.to_string()))?;
        let ttl_s = ttl.as_secs().max(1);
        let mut lc = sh.client.lease_client();
        let key = sh.keys.vm(&vm);
        let txn = |lease: i64| {
            let mut ops = also.clone();
            ops.push(TxnOp::put(
                key.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            ));
            Txn::new().when(when.clone()).and_then(ops)
        };
        // An error leaves the outcome unknown (the transaction may still commit): it is
        // settled, never taken for a refusal (see `settle`).
        let mut granted = 0;
        let lease = loop {
            let lease = sh.call(lc.grant(ttl_s as i64, None))?.id();
            granted += 1;
            match settle(sh, &key, lease, || txn(lease)) {
                Ok(true) => break lease,
                Ok(false) => {
                    // The record is not under this lease: nothing is.
                    let _ = sh.call(lc.revoke(lease));
                    return Err(refused);
                }
                // The lease expired while etcd did not answer: nothing was put under it.
                Err(e) if is_lease_gone(&e) && granted < LEASE_GRANTS => continue,
                Err(e) => return Err(e),
            }
        };
        let task = LeaseTask::start(
            sh.clone(),
            key,
            value,
            Duration::from_secs(ttl_s),
            lease,
            Holder::vm(&sh.keys, &vm, record.slabs),
        );
        Ok(VmRegistration {
            dir: self.clone(),
            record,
            placement,
            task,
        })
    }

    /// Waits up to `timeout` until VM `vm` has nothing left to collect: no placement and no
    /// collector mark. Returns whether it got there.
    pub fn wait_reclaimed(
        &self,
        vm: crate::ids::VmId,
        timeout: Duration,
    ) -> Result<bool, PoolError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let view = self.view()?;
            if !view.gc_marks.contains_key(&vm) && view.vm_slabs(vm).next().is_none() {
                return Ok(true);
            }
            if std::time::Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl std::fmt::Debug for VmRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmRegistration")
            .field("vm", &self.record.uuid)
            .field("state", &self.task.state())
            .finish()
    }
}

impl VmRegistration {
    /// The directory it was made by.
    pub(super) fn dir(&self) -> &Directory {
        &self.dir
    }

    /// Its lease task.
    pub(super) fn task_mut(&mut self) -> &mut LeaseTask {
        &mut self.task
    }

    /// The VM's record.
    pub fn record(&self) -> &VmRecord {
        &self.record
    }

    /// Where its slabs were placed at admission (moves committed later change the placement
    /// records in etcd, not this copy).
    pub fn placement(&self) -> &VmPlacement {
        &self.placement
    }

    /// Whether its lease is alive. [`RegistrationState::Lost`] means its placement was
    /// reclaimed during an etcd outage longer than the lease TTL and the collector's grace
    /// period: its remote pages are gone.
    pub fn state(&self) -> RegistrationState {
        self.task.state()
    }

    /// The etcd lease id while live.
    pub fn lease(&self) -> Option<i64> {
        self.task.lease()
    }

    /// The clean exit: discards the VM's namespace on every server of its current placement,
    /// then deletes the placement and the VM record. If a discard fails the placement is kept
    /// (the garbage collector retries it) and the error returned.
    pub fn retire(mut self, reclaimer: &mut dyn NamespaceReclaimer) -> Result<(), PoolError> {
        let vm = self.record.uuid;
        let view = self.dir.view()?;
        let mut failures = Vec::new();
        let mut servers: Vec<_> = view
            .vm_slabs(vm)
            .flat_map(|(_, r)| r.replicas.iter().cloned())
            .collect();
        servers.sort();
        servers.dedup();
        for server in servers {
            let Some(rec) = view.servers.get(&server) else {
                continue; // gone: its pages went with it
            };
            if let Err(e) = reclaimer.discard(&server, rec.address, self.record.namespace) {
                failures.push(format!("{server}: {e}"));
            }
        }
        if !failures.is_empty() {
            self.task.stop(Stop::Revoke);
            return Err(PoolError::Discard {
                vm,
                namespace: self.record.namespace,
                failures: failures.join("; "),
            });
        }
        let sh = &self.dir.shared;
        let txn = Txn::new().and_then([
            TxnOp::delete(
                sh.keys.vm_placement(&vm),
                Some(DeleteOptions::new().with_prefix()),
            ),
            TxnOp::delete(sh.keys.vm(&vm), None::<DeleteOptions>),
        ]);
        let mut kv = sh.client.kv_client();
        sh.call(kv.txn(txn))?;
        self.task.stop(Stop::Revoke);
        tracing::info!(%vm, "VM retired from the pool");
        Ok(())
    }

    /// The clean exit when the memory servers collect their own garbage (`farvm-memserver
    /// --pool`): in one transaction, deletes the VM record and its placement and hands every
    /// server of the placement to the collectors as a claimed mark, then revokes the lease.
    /// The servers, which watch the pool, drop the namespace at once; nothing here waits on a
    /// memory server ([`Directory::wait_reclaimed`] does).
    pub fn release(mut self) -> Result<(), PoolError> {
        let vm = self.record.uuid;
        let sh = &self.dir.shared;
        let view = self.dir.view()?;
        let mut by_server: std::collections::BTreeMap<crate::ids::ServerId, Vec<u32>> =
            Default::default();
        for (slab, rec) in view.vm_slabs(vm) {
            for s in &rec.replicas {
                by_server.entry(s.clone()).or_default().push(slab.index);
            }
        }
        let mark = crate::gc::GcMark {
            first_seen_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            pending: by_server
                .into_iter()
                .map(|(server, slabs)| crate::gc::PendingDiscard { server, slabs })
                .collect(),
        };
        let mut ops = vec![
            TxnOp::delete(
                sh.keys.vm_placement(&vm),
                Some(DeleteOptions::new().with_prefix()),
            ),
            TxnOp::delete(sh.keys.vm(&vm), None::<DeleteOptions>),
            TxnOp::delete(
                sh.keys.vm_moves(&vm),
                Some(DeleteOptions::new().with_prefix()),
            ),
        ];
        if !mark.pending.is_empty() {
            let v = serde_json::to_vec(&mark).map_err(|e| PoolError::Etcd(e.to_string()))?;
            ops.push(TxnOp::put(sh.keys.gc_mark(&vm), v, None::<PutOptions>));
        }
        let mut kv = sh.client.kv_client();
        sh.call(kv.txn(Txn::new().and_then(ops)))?;
        self.task.stop(Stop::Revoke);
        tracing::info!(%vm, "VM released from the pool; its servers drop its namespace");
        Ok(())
    }

    /// Revokes the lease, leaving the placement for the garbage collector.
    pub fn deregister(mut self) {
        self.task.stop(Stop::Revoke);
    }

    /// Stops renewing the lease without revoking it: the record disappears when the TTL runs
    /// out, exactly as when the VMM process dies.
    pub fn abandon(mut self) {
        self.task.stop(Stop::Abandon);
    }
}
