//! Transactions whose outcome the caller must know before it acts: taking a VM's record
//! (a migration's takeover, a snapshot's restore) and a migration source keeping it.
//!
//! A transaction sent while etcd does not answer may still commit after the client gave up
//! on it: the request waits in a stopped etcd's socket and runs when etcd does. Treating
//! that error as "not committed" let a migration's destination give the VM up while its
//! takeover committed, and its source then stop the VM too. So such a transaction is sent
//! again, on the same condition, until etcd answers it; its `or_else` branch reads the
//! record, and the lease the record sits under says whose write won (an earlier copy of our
//! own, or someone else's).

use std::time::{Duration, Instant};

use etcd_client::{Txn, TxnOp, TxnOpResponse, TxnResponse};

use super::{PoolError, Shared};

/// How long a transaction is sent again while etcd does not answer (a migration's source
/// waits as long for its cancel: `farvm_vmm`'s `CANCEL_PATIENCE`).
const SETTLE_PATIENCE: Duration = Duration::from_secs(300);

/// Pause between two tries while etcd does not answer.
const RETRY_EVERY: Duration = Duration::from_millis(500);

/// Runs `txn` (a conditional transaction that puts `key` under `lease`) until etcd has
/// decided it. `Ok(true)`: the record is under `lease` (this call's transaction, or an
/// earlier copy of it, committed); `Ok(false)`: the condition failed and the record is
/// someone else's or gone. Errors that prove the transaction did not run (the lease is
/// gone: [`is_lease_gone`]) are returned at once; others are retried for up to 300 s, then
/// returned, the outcome unknown.
pub(super) fn settle(
    sh: &Shared,
    key: &str,
    lease: i64,
    txn: impl Fn() -> Txn,
) -> Result<bool, PoolError> {
    let deadline = Instant::now() + SETTLE_PATIENCE;
    let mut kv = sh.client.kv_client();
    loop {
        let t = txn().or_else([TxnOp::get(key, None)]);
        match sh.call(kv.txn(t)) {
            Ok(r) if r.succeeded() => return Ok(true),
            Ok(r) => return Ok(record_lease(&r) == Some(lease)),
            Err(e) if is_lease_gone(&e) || Instant::now() >= deadline => return Err(e),
            Err(e) => {
                tracing::warn!(%key, "etcd has not decided a transaction yet ({e}); sending it again");
                std::thread::sleep(RETRY_EVERY);
            }
        }
    }
}

/// Runs `read` (no write: retrying it changes nothing) until etcd answers, for up to 300 s.
pub(super) fn read_patiently<T>(
    what: &str,
    mut read: impl FnMut() -> Result<T, PoolError>,
) -> Result<T, PoolError> {
    let deadline = Instant::now() + SETTLE_PATIENCE;
    loop {
        match read() {
            Err(e) if e.is_unreachable() && Instant::now() < deadline => {
                tracing::warn!("{what}: etcd does not answer ({e}); trying again");
                std::thread::sleep(RETRY_EVERY);
            }
            other => return other,
        }
    }
}

/// etcd refused a put because its lease does not exist (expired or revoked): the
/// transaction did not run.
pub(super) fn is_lease_gone(e: &PoolError) -> bool {
    matches!(e, PoolError::Etcd(m) if m.contains("lease not found"))
}

/// The lease of the record an `or_else` get returned (`None`: no record, or no get).
fn record_lease(r: &TxnResponse) -> Option<i64> {
    r.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.lease()),
        _ => None,
    })
}
