//! The racks the operator declares (`racks/<rack>`): servers register only in a declared rack,
//! and a rack is removed only while no live server is registered in it.

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, PutOptions, Txn, TxnOp,
};

use super::{Directory, PoolError};
use crate::ids::RackId;
use crate::keys::{KeyLayout, PoolKey};

/// Removing a rack retries this often when servers' records change under it.
const REMOVE_ATTEMPTS: u32 = 20;

/// The racks named by the keys of `kvs` (a read of the `racks/` prefix), in name order.
pub(crate) fn racks_of(keys: &KeyLayout, kvs: &[KeyValue]) -> Vec<RackId> {
    let mut racks: Vec<RackId> = kvs
        .iter()
        .filter_map(|kv| match keys.parse(&String::from_utf8_lossy(kv.key())) {
            Some(PoolKey::Rack(r)) => Some(r),
            _ => None,
        })
        .collect();
    racks.sort();
    racks
}

/// Reads the keys (only) under the `racks/` prefix.
pub(crate) fn racks_read() -> GetOptions {
    GetOptions::new().with_prefix().with_keys_only()
}

impl Directory {
    /// The declared racks, in name order.
    pub fn declared_racks(&self) -> Result<Vec<RackId>, PoolError> {
        let sh = &self.shared;
        let mut kv = sh.client.kv_client();
        let resp = sh.call(kv.get(sh.keys.racks(), Some(racks_read())))?;
        Ok(racks_of(&sh.keys, resp.kvs()))
    }

    /// Declares `racks` (declaring a declared rack again changes nothing). Returns the racks
    /// that were not declared before.
    pub fn declare_racks(&self, racks: &[RackId]) -> Result<Vec<RackId>, PoolError> {
        let sh = &self.shared;
        let known = self.declared_racks()?;
        let mut new: Vec<RackId> = racks
            .iter()
            .filter(|r| !known.contains(r))
            .cloned()
            .collect();
        new.sort();
        new.dedup();
        if new.is_empty() {
            return Ok(new);
        }
        if new.len() > sh.cfg.max_txn_ops {
            return Err(PoolError::TooManyOps {
                what: format!("declaring {} racks", new.len()),
                ops: new.len(),
                limit: sh.cfg.max_txn_ops,
            });
        }
        let puts: Vec<TxnOp> = new
            .iter()
            .map(|r| TxnOp::put(sh.keys.rack(r), b"{}".to_vec(), None::<PutOptions>))
            .collect();
        let mut kv = sh.client.kv_client();
        sh.call(kv.txn(Txn::new().and_then(puts)))?;
        tracing::info!(racks = ?new, "racks declared in the pool");
        Ok(new)
    }

    /// Removes a declared rack. Refused with [`PoolError::RackInUse`] while a live server is
    /// registered in it, and with [`PoolError::UnknownRack`] if it is not declared. The check
    /// and the removal are one transaction: it fails if any server record changed since the
    /// pool was read (then it reads again).
    pub fn remove_rack(&self, rack: &RackId) -> Result<(), PoolError> {
        let sh = &self.shared;
        let key = sh.keys.rack(rack);
        for _ in 0..REMOVE_ATTEMPTS {
            let view = sh.view()?;
            if !view.rack_declared(rack) {
                return Err(PoolError::UnknownRack {
                    rack: rack.clone(),
                    declared: view.racks.into_iter().collect(),
                });
            }
            let servers: Vec<_> = view
                .servers
                .values()
                .filter(|s| &s.rack == rack)
                .map(|s| s.id.clone())
                .collect();
            if !servers.is_empty() {
                return Err(PoolError::RackInUse {
                    rack: rack.clone(),
                    servers,
                });
            }
            let txn = Txn::new()
                .when([
                    Compare::version(key.clone(), CompareOp::Greater, 0),
                    Compare::mod_revision(sh.keys.servers(), CompareOp::Less, view.revision + 1)
                        .with_prefix(),
                ])
                .and_then([TxnOp::delete(key.clone(), None::<DeleteOptions>)]);
            let mut kv = sh.client.kv_client();
            if sh.call(kv.txn(txn))?.succeeded() {
                tracing::info!(%rack, "rack removed from the pool");
                return Ok(());
            }
        }
        Err(PoolError::Conflict { key })
    }
}
