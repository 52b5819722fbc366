//! A memory server's registration: its record under a lease it keeps alive.

use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};

use super::lease::{Holder, LeaseTask, RegistrationState, Stop};
use super::racks::{racks_of, racks_read};
use super::{Directory, PoolError};
use crate::record::ServerRecord;

/// A registered memory server. Dropping it deregisters (revokes the lease).
///
/// The memory server's loop: register once, then call [`ServerRegistration::update`] with
/// fresh usage every few seconds; it never blocks on etcd.
pub struct ServerRegistration {
    record: Mutex<ServerRecord>,
    task: LeaseTask,
}

impl Directory {
    /// Registers `record` under a new lease of `ttl` (at least 1 s, whole seconds) and keeps
    /// the lease alive in the background. A record left by an earlier process with the same
    /// server id is replaced. Refused with [`PoolError::UnknownRack`] unless the record's rack
    /// is declared (checked in the same transaction that writes the record).
    pub fn register_server(
        &self,
        record: ServerRecord,
        ttl: Duration,
    ) -> Result<ServerRegistration, PoolError> {
        let sh = &self.shared;
        let ttl_s = ttl.as_secs().max(1);
        let key = sh.keys.server(&record.id);
        let value = serde_json::to_vec(&record).map_err(|e| PoolError::Etcd(e.to_string()))?;
        let mut lc = sh.client.lease_client();
        let lease = sh.call(lc.grant(ttl_s as i64, None))?.id();
        let rack_key = sh.keys.rack(&record.rack);
        let txn = Txn::new()
            .when([Compare::version(rack_key.clone(), CompareOp::Greater, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(sh.keys.racks(), Some(racks_read()))]);
        let mut kv = sh.client.kv_client();
        let refused = match sh.call(kv.txn(txn)) {
            Ok(resp) if resp.succeeded() => None,
            Ok(resp) => {
                let declared = resp
                    .op_responses()
                    .into_iter()
                    .find_map(|r| match r {
                        TxnOpResponse::Get(g) => Some(racks_of(&sh.keys, g.kvs())),
                        _ => None,
                    })
                    .unwrap_or_default();
                Some(PoolError::UnknownRack {
                    rack: record.rack.clone(),
                    declared,
                })
            }
            Err(e) => Some(e),
        };
        if let Some(e) = refused {
            let _ = sh.call(lc.revoke(lease));
            return Err(e);
        }
        tracing::info!(server = %record.id, address = %record.address, rack = %record.rack, lease, "memory server registered in the pool");
        let task = LeaseTask::start(
            sh.clone(),
            key,
            value,
            Duration::from_secs(ttl_s),
            lease,
            Holder::Server {
                rack: record.rack.clone(),
                rack_key,
            },
        );
        Ok(ServerRegistration {
            record: Mutex::new(record),
            task,
        })
    }
}

impl std::fmt::Debug for ServerRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerRegistration")
            .field("record", &self.record())
            .field("state", &self.task.state())
            .finish()
    }
}

impl ServerRegistration {
    /// Changes the record (e.g. `used_bytes`, `health`); written in the background, never
    /// waiting on etcd. The id cannot change.
    pub fn update(&self, f: impl FnOnce(&mut ServerRecord)) {
        let mut g = self.record.lock().unwrap_or_else(|e| e.into_inner());
        let id = g.id.clone();
        f(&mut g);
        g.id = id;
        if let Ok(v) = serde_json::to_vec(&*g) {
            self.task.set_value(v);
        }
    }

    /// The record as last set.
    pub fn record(&self) -> ServerRecord {
        self.record
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether the lease is alive.
    pub fn state(&self) -> RegistrationState {
        self.task.state()
    }

    /// The etcd lease id while live.
    pub fn lease(&self) -> Option<i64> {
        self.task.lease()
    }

    /// Revokes the lease: the record disappears now.
    pub fn deregister(mut self) {
        self.task.stop(Stop::Revoke);
    }

    /// Stops renewing the lease without revoking it: the record disappears when the TTL runs
    /// out, exactly as when the server process dies.
    pub fn abandon(mut self) {
        self.task.stop(Stop::Abandon);
    }
}
