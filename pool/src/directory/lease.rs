//! A registration's background task: keeps its etcd lease alive, writes record updates, and
//! rides out etcd outages (reconnecting, and granting a new lease if the old one expired).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{Link, Shared};
use crate::ids::RackId;

/// What a registration's lease holds, which decides how it is re-established.
#[derive(Debug, Clone)]
pub(crate) enum Holder {
    /// A server record: put again as it is, while its rack is still declared.
    Server {
        /// The server's rack.
        rack: RackId,
        /// Its key under `racks/`.
        rack_key: String,
    },
    /// A VM record: put again only while the VM's placement exists (the garbage collector
    /// may have reclaimed it during a long outage), deleting any collector mark.
    Vm {
        placement_prefix: String,
        gc_mark: String,
        slabs: u32,
    },
}

impl Holder {
    /// The holder of VM `vm`'s record, with `slabs` slabs placed, under `keys`.
    pub(crate) fn vm(keys: &crate::keys::KeyLayout, vm: &crate::ids::VmId, slabs: u32) -> Self {
        Self::Vm {
            placement_prefix: keys.vm_placement(vm),
            gc_mark: keys.gc_mark(vm),
            slabs,
        }
    }

    /// Why a registration of this holder could not be renewed.
    fn lost_reason(&self) -> String {
        match self {
            Self::Server { rack, .. } => format!(
                "its lease expired and rack {rack} was removed from the pool meanwhile; \
                 declare it again (farvm pool racks add {rack}) and restart the server"
            ),
            Self::Vm { .. } => "its lease expired and either the garbage collector reclaimed \
                                its placement (its remote pages are gone) or another host took \
                                the VM over (a live migration)"
                .to_owned(),
        }
    }
}

/// Where a registration stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationState {
    /// The lease is alive and the record written.
    Live {
        /// The etcd lease id.
        lease: i64,
    },
    /// etcd does not answer; retrying. The record stays in etcd until its lease TTL runs out
    /// there, and is written again under a new lease if it did.
    Reconnecting {
        /// How long renewals have been failing.
        down_for: Duration,
        /// The last error.
        detail: String,
    },
    /// The registration cannot be renewed: a VM whose lease expired and whose placement was
    /// reclaimed meanwhile (its remote pages are gone and the VM must stop), or a server
    /// whose lease expired and whose rack was removed from the pool meanwhile.
    Lost {
        /// Why.
        reason: String,
    },
    /// Deregistered or abandoned.
    Stopped,
}

#[derive(Debug, Clone)]
enum Inner {
    Live(i64),
    Reconnecting(Instant, String),
    Lost(String),
    Stopped,
}

/// How a registration ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Revoke the lease: the record goes at once.
    Revoke,
    /// Stop renewing: the record goes when the lease TTL runs out, as after a crash.
    Abandon,
}

/// The handle on a registration's task.
pub(crate) struct LeaseTask {
    value_tx: watch::Sender<Vec<u8>>,
    stop_tx: watch::Sender<Option<Stop>>,
    state: Arc<Mutex<Inner>>,
    join: Option<JoinHandle<()>>,
    shared: Arc<Shared>,
}

impl LeaseTask {
    /// Starts keeping `lease` (already granted, `key` already written) alive.
    pub fn start(
        shared: Arc<Shared>,
        key: String,
        value: Vec<u8>,
        ttl: Duration,
        lease: i64,
        holder: Holder,
    ) -> Self {
        let (value_tx, value_rx) = watch::channel(value);
        let (stop_tx, stop_rx) = watch::channel(None);
        let state = Arc::new(Mutex::new(Inner::Live(lease)));
        let task = Task {
            client: shared.client.clone(),
            link: shared.link.clone(),
            timeout: shared.cfg.request_timeout,
            key,
            ttl,
            holder,
            state: state.clone(),
        };
        let join = shared.rt().spawn(task.run(lease, value_rx, stop_rx));
        Self {
            value_tx,
            stop_tx,
            state,
            join: Some(join),
            shared,
        }
    }

    /// Hands a new record value to the task (written in the background).
    pub fn set_value(&self, value: Vec<u8>) {
        self.value_tx.send_replace(value);
    }

    pub fn state(&self) -> RegistrationState {
        match &*self.state.lock().unwrap_or_else(|e| e.into_inner()) {
            Inner::Live(l) => RegistrationState::Live { lease: *l },
            Inner::Reconnecting(since, d) => RegistrationState::Reconnecting {
                down_for: since.elapsed(),
                detail: d.clone(),
            },
            Inner::Lost(r) => RegistrationState::Lost { reason: r.clone() },
            Inner::Stopped => RegistrationState::Stopped,
        }
    }

    /// The lease in use, if live.
    pub fn lease(&self) -> Option<i64> {
        match &*self.state.lock().unwrap_or_else(|e| e.into_inner()) {
            Inner::Live(l) => Some(*l),
            _ => None,
        }
    }

    /// Ends the task and waits for it (at most a request timeout and a bit).
    pub fn stop(&mut self, how: Stop) {
        self.stop_tx.send_replace(Some(how));
        if let Some(join) = self.join.take() {
            let wait = self.shared.cfg.request_timeout + Duration::from_millis(500);
            let _ = self
                .shared
                .rt()
                .block_on(async { tokio::time::timeout(wait, join).await });
        }
    }
}

impl Drop for LeaseTask {
    fn drop(&mut self) {
        if self.join.is_some() {
            self.stop(Stop::Revoke);
        }
    }
}

struct Task {
    client: Client,
    link: Arc<Link>,
    timeout: Duration,
    key: String,
    ttl: Duration,
    holder: Holder,
    state: Arc<Mutex<Inner>>,
}

/// Why the keep-alive loop left.
enum Exit {
    /// etcd failed; reconnect.
    Transport(String),
    /// The lease is gone in etcd; grant another.
    Expired,
    /// Asked to stop.
    Stop(Stop),
}

impl Task {
    fn set(&self, s: Inner) {
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = s;
    }

    fn failing(&self, detail: String) {
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let since = match &*g {
            Inner::Reconnecting(since, _) => *since,
            _ => Instant::now(),
        };
        tracing::warn!(key = %self.key, %detail, "pool registration: etcd unreachable, retrying");
        *g = Inner::Reconnecting(since, detail.clone());
        drop(g);
        let _ = self.link.down(detail);
    }

    async fn run(
        self,
        mut lease: i64,
        mut value_rx: watch::Receiver<Vec<u8>>,
        mut stop_rx: watch::Receiver<Option<Stop>>,
    ) {
        let mut backoff = Duration::from_millis(100);
        // Whether the record in etcd may be older than the latest value.
        let mut dirty = false;
        loop {
            let exit = self
                .keep_alive(lease, &mut value_rx, &mut stop_rx, &mut dirty)
                .await;
            match exit {
                Exit::Stop(how) => {
                    if how == Stop::Revoke {
                        let mut c = self.client.clone();
                        let _ = tokio::time::timeout(self.timeout, c.lease_revoke(lease)).await;
                    }
                    self.set(Inner::Stopped);
                    return;
                }
                Exit::Transport(detail) => self.failing(detail),
                Exit::Expired => match self.renew(&value_rx).await {
                    Ok(Some(new)) => {
                        tracing::info!(key = %self.key, old = lease, new, "pool registration: lease expired, registered again");
                        lease = new;
                        dirty = false;
                        backoff = Duration::from_millis(100);
                        self.link.up();
                        self.set(Inner::Live(lease));
                        continue;
                    }
                    Ok(None) => {
                        let reason = self.holder.lost_reason();
                        tracing::error!(key = %self.key, %reason, "pool registration lost");
                        self.set(Inner::Lost(reason));
                        return;
                    }
                    Err(detail) => self.failing(detail),
                },
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop_rx.changed() => {}
            }
            if stop_rx.borrow().is_some() {
                continue;
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
    }

    /// Keeps `lease` alive until etcd fails, the lease expires or a stop is asked.
    async fn keep_alive(
        &self,
        lease: i64,
        value_rx: &mut watch::Receiver<Vec<u8>>,
        stop_rx: &mut watch::Receiver<Option<Stop>>,
        dirty: &mut bool,
    ) -> Exit {
        if let Some(how) = *stop_rx.borrow() {
            return Exit::Stop(how);
        }
        let mut c = self.client.clone();
        let (mut keeper, mut stream) =
            match tokio::time::timeout(self.timeout, c.lease_keep_alive(lease)).await {
                Ok(Ok(pair)) => pair,
                // etcd-client opens the stream with one keep-alive and reports a lease etcd no
                // longer has (TTL 0 in the answer) as this error: the lease expired or was
                // revoked before the stream opened, e.g. between a reconnect and this call.
                Ok(Err(etcd_client::Error::LeaseKeepAliveError(m))) if m == "lease not found" => {
                    return Exit::Expired;
                }
                Ok(Err(e)) => return Exit::Transport(e.to_string()),
                Err(_) => return Exit::Transport("keep-alive stream: no answer".into()),
            };
        let mut tick = tokio::time::interval((self.ttl / 3).max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    if let Err(e) = keeper.keep_alive().await {
                        return Exit::Transport(e.to_string());
                    }
                    match tokio::time::timeout(self.timeout, stream.message()).await {
                        Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                            self.link.up();
                            if *dirty {
                                let v = value_rx.borrow().clone();
                                match self.put(lease, v).await {
                                    Ok(()) => *dirty = false,
                                    Err(e) => return Exit::Transport(e),
                                }
                            }
                            self.set(Inner::Live(lease));
                        }
                        Ok(Ok(Some(_))) => return Exit::Expired,
                        Ok(Ok(None)) => return Exit::Transport("keep-alive stream closed".into()),
                        Ok(Err(e)) => return Exit::Transport(e.to_string()),
                        Err(_) => return Exit::Transport("keep-alive: no answer".into()),
                    }
                }
                changed = value_rx.changed() => {
                    if changed.is_err() {
                        return Exit::Stop(Stop::Revoke);
                    }
                    let v = value_rx.borrow_and_update().clone();
                    if let Err(e) = self.put(lease, v).await {
                        *dirty = true;
                        return Exit::Transport(e);
                    }
                }
                _ = stop_rx.changed() => {
                    return Exit::Stop(stop_rx.borrow().unwrap_or(Stop::Revoke));
                }
            }
        }
    }

    async fn put(&self, lease: i64, value: Vec<u8>) -> Result<(), String> {
        let mut c = self.client.clone();
        let opts = PutOptions::new().with_lease(lease);
        match tokio::time::timeout(self.timeout, c.put(self.key.clone(), value, Some(opts))).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("put: no answer".into()),
        }
    }

    /// Grants a new lease and writes the record under it. `Ok(None)`: a VM whose placement is
    /// gone, or a server whose rack is no longer declared (not registered again).
    async fn renew(&self, value_rx: &watch::Receiver<Vec<u8>>) -> Result<Option<i64>, String> {
        let mut c = self.client.clone();
        let ttl = self.ttl.as_secs().max(1) as i64;
        let grant = match tokio::time::timeout(self.timeout, c.lease_grant(ttl, None)).await {
            Ok(Ok(g)) => g,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err("lease grant: no answer".into()),
        };
        let lease = grant.id();
        let value = value_rx.borrow().clone();
        let put = TxnOp::put(
            self.key.clone(),
            value,
            Some(PutOptions::new().with_lease(lease)),
        );
        let txn = match &self.holder {
            Holder::Server { rack_key, .. } => Txn::new()
                .when([Compare::version(rack_key.clone(), CompareOp::Greater, 0)])
                .and_then([put]),
            Holder::Vm {
                placement_prefix,
                gc_mark,
                slabs,
            } => {
                let del = TxnOp::delete(gc_mark.clone(), None::<DeleteOptions>);
                // Our expired lease took the record with it: a record there now is another
                // VMM's (a live migration's destination took the VM over), never overwritten.
                let ours = Compare::version(self.key.clone(), CompareOp::Equal, 0);
                if *slabs == 0 {
                    Txn::new().when([ours]).and_then([put, del])
                } else {
                    Txn::new()
                        .when([
                            ours,
                            Compare::version(placement_prefix.clone(), CompareOp::Greater, 0)
                                .with_prefix(),
                        ])
                        .and_then([put, del])
                }
            }
        };
        match tokio::time::timeout(self.timeout, c.txn(txn)).await {
            Ok(Ok(r)) if r.succeeded() => Ok(Some(lease)),
            Ok(Ok(_)) => {
                let _ = c.lease_revoke(lease).await;
                Ok(None)
            }
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("re-register: no answer".into()),
        }
    }
}
