//! The garbage collector's etcd side: marks dead VMs, claims them after the grace period and
//! discards their namespaces through a [`NamespaceReclaimer`].

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use etcd_client::{Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp};

use super::{Directory, PoolError};
use crate::gc::{sweep, GcMark, GcReport, NamespaceReclaimer, Orphan, PendingDiscard};
use crate::ids::VmId;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Directory {
    /// One garbage-collection sweep.
    ///
    /// A VM with placements but neither a record nor a snapshot is marked the first time it is seen; once its mark
    /// is `grace` old (at once with a zero grace) and the VM has not registered again, the
    /// collector claims it (one transaction, only while the VM record is absent: deletes its
    /// placement and lists the servers in the mark), then discards its namespace on every
    /// server still registered through `reclaimer`. Discards that fail stay in the mark and
    /// are retried by the next sweep. Marks of VMs that came back are cleared.
    ///
    /// Safe to run from several hosts at once: claims are transactions.
    pub fn collect_garbage(
        &self,
        reclaimer: &mut dyn NamespaceReclaimer,
        grace: Duration,
    ) -> Result<GcReport, PoolError> {
        let sh = &self.shared;
        let view = self.view()?;
        let mut report = GcReport::default();
        let mut kv = sh.client.kv_client();
        let grace_ms = grace.as_millis() as u64;

        for (vm, mark) in &view.gc_marks {
            if mark.pending.is_empty() && view.owned(vm) {
                sh.call(kv.delete(sh.keys.gc_mark(vm), None))?;
                report.marks_cleared.push(*vm);
            }
        }

        let mut by_vm: BTreeMap<VmId, Vec<Orphan>> = BTreeMap::new();
        for o in sweep(&view) {
            by_vm.entry(o.vm).or_default().push(o);
        }
        for (vm, orphans) in by_vm {
            let vm_key = sh.keys.vm(&vm);
            // A VM is unowned while it has neither a record nor a snapshot.
            let unowned = || {
                [
                    Compare::create_revision(vm_key.clone(), CompareOp::Equal, 0),
                    Compare::create_revision(sh.keys.snapshot(&vm), CompareOp::Equal, 0),
                ]
            };
            let mark_key = sh.keys.gc_mark(&vm);
            let mark = view.gc_marks.get(&vm);
            let claimed = mark.is_some_and(|m| !m.pending.is_empty());
            if !claimed {
                let first_seen = match mark {
                    Some(m) => m.first_seen_unix_ms,
                    None => {
                        let m = GcMark {
                            first_seen_unix_ms: now_ms(),
                            pending: Vec::new(),
                        };
                        let put = Txn::new().when(unowned()).and_then([TxnOp::put(
                            mark_key.clone(),
                            to_json(&m)?,
                            None::<PutOptions>,
                        )]);
                        if !sh.call(kv.txn(put))?.succeeded() {
                            continue; // registered again meanwhile
                        }
                        tracing::info!(%vm, "garbage collector: VM gone, its namespaces marked");
                        m.first_seen_unix_ms
                    }
                };
                if now_ms().saturating_sub(first_seen) < grace_ms {
                    report.waiting.extend(orphans);
                    continue;
                }
                // Claim: from here on the VM cannot register again.
                let claim = GcMark {
                    first_seen_unix_ms: first_seen,
                    pending: orphans
                        .iter()
                        .map(|o| PendingDiscard {
                            server: o.server.clone(),
                            slabs: o.slabs.clone(),
                        })
                        .collect(),
                };
                let txn = Txn::new().when(unowned()).and_then([
                    TxnOp::delete(
                        sh.keys.vm_placement(&vm),
                        Some(DeleteOptions::new().with_prefix()),
                    ),
                    TxnOp::delete(
                        sh.keys.vm_moves(&vm),
                        Some(DeleteOptions::new().with_prefix()),
                    ),
                    TxnOp::put(mark_key.clone(), to_json(&claim)?, None::<PutOptions>),
                ]);
                if !sh.call(kv.txn(txn))?.succeeded() {
                    continue;
                }
            }

            let mut left = Vec::new();
            for o in orphans {
                let result = match o.address {
                    None => Ok(()), // the server is gone, and its pages with it
                    Some(_) if !reclaimer.handles(&o.server) => {
                        left.push(PendingDiscard {
                            server: o.server.clone(),
                            slabs: o.slabs.clone(),
                        });
                        report.deferred.push(o);
                        continue;
                    }
                    Some(addr) => reclaimer.discard(&o.server, addr, o.namespace),
                };
                match result {
                    Ok(()) => report.reclaimed.push(o),
                    Err(e) => {
                        tracing::warn!(%vm, server = %o.server, error = %e, "garbage collector: discard failed; retried next sweep");
                        left.push(PendingDiscard {
                            server: o.server.clone(),
                            slabs: o.slabs.clone(),
                        });
                        report.failed.push((o, e.to_string()));
                    }
                }
            }
            if left.is_empty() {
                sh.call(kv.delete(mark_key, None))?;
                tracing::info!(%vm, "garbage collector: VM's namespaces discarded");
                report.vms_reclaimed.push(vm);
            } else if claimed && mark.is_some_and(|m| same_pending(&m.pending, &left)) {
                // Nothing this collector could do: leave the mark to the others untouched.
            } else {
                let m = GcMark {
                    first_seen_unix_ms: mark.map_or_else(now_ms, |m| m.first_seen_unix_ms),
                    pending: left,
                };
                sh.call(kv.put(mark_key, to_json(&m)?, None))?;
            }
        }
        // Marks of VMs whose placement vanished some other way (retired after being marked).
        for (vm, mark) in &view.gc_marks {
            if mark.pending.is_empty() && !view.owned(vm) && view.vm_slabs(*vm).next().is_none() {
                sh.call(kv.delete(sh.keys.gc_mark(vm), None::<DeleteOptions>))?;
            }
        }
        Ok(report)
    }
}

/// Whether two pending lists name the same (server, slabs) pairs, in any order.
fn same_pending(a: &[PendingDiscard], b: &[PendingDiscard]) -> bool {
    let key = |v: &[PendingDiscard]| {
        let mut k: Vec<(String, Vec<u32>)> = v
            .iter()
            .map(|p| {
                let mut s = p.slabs.clone();
                s.sort_unstable();
                (p.server.to_string(), s)
            })
            .collect();
        k.sort();
        k
    };
    key(a) == key(b)
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<Vec<u8>, PoolError> {
    serde_json::to_vec(v).map_err(|e| PoolError::Etcd(e.to_string()))
}
