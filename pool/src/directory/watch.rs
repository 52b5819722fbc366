//! A live view of the pool: listed once, then kept current from an etcd watch; listed again
//! after an outage or a compaction.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, EventType, GetOptions, WatchOptions};
use tokio::sync::watch;

use super::codec::build_view;
use super::{Directory, Link, Shared};
use crate::keys::KeyLayout;
use crate::view::PoolView;

/// The pool as it changes. Dropping it ends the watch.
pub struct PoolWatch {
    rx: watch::Receiver<Arc<PoolView>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    shared: Arc<Shared>,
}

impl Directory {
    /// Starts watching the pool. The first view arrives once etcd answers
    /// ([`PoolWatch::wait_newer`]); until then [`PoolWatch::latest`] is empty at revision 0.
    pub fn watch(&self) -> PoolWatch {
        let sh = &self.shared;
        let (tx, rx) = watch::channel(Arc::new(PoolView::default()));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let task = Watcher {
            client: sh.client.clone(),
            keys: sh.keys.clone(),
            link: sh.link.clone(),
            timeout: sh.cfg.request_timeout,
            tx,
        };
        sh.rt().spawn(async move {
            tokio::select! {
                _ = task.run() => {}
                _ = stop_rx => {}
            }
        });
        PoolWatch {
            rx,
            stop: Some(stop_tx),
            shared: sh.clone(),
        }
    }
}

impl PoolWatch {
    /// The newest view (never blocks).
    pub fn latest(&self) -> Arc<PoolView> {
        self.rx.borrow().clone()
    }

    /// Waits up to `timeout` for a view newer than the last one returned; None on timeout.
    pub fn wait_newer(&mut self, timeout: Duration) -> Option<Arc<PoolView>> {
        let rx = &mut self.rx;
        let changed = self
            .shared
            .rt()
            .block_on(async { tokio::time::timeout(timeout, rx.changed()).await });
        match changed {
            Ok(Ok(())) => Some(self.rx.borrow_and_update().clone()),
            _ => None,
        }
    }

    /// Waits up to `timeout` for a view satisfying `pred` (checks the latest one first).
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        mut pred: impl FnMut(&PoolView) -> bool,
    ) -> Option<Arc<PoolView>> {
        let deadline = std::time::Instant::now() + timeout;
        let v = self.rx.borrow_and_update().clone();
        if pred(&v) {
            return Some(v);
        }
        loop {
            let left = deadline.checked_duration_since(std::time::Instant::now())?;
            let v = self.wait_newer(left)?;
            if pred(&v) {
                return Some(v);
            }
        }
    }
}

impl Drop for PoolWatch {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

struct Watcher {
    client: Client,
    keys: KeyLayout,
    link: Arc<Link>,
    timeout: Duration,
    tx: watch::Sender<Arc<PoolView>>,
}

impl Watcher {
    fn publish(&self, revision: i64, kvs: &BTreeMap<String, Vec<u8>>) {
        let view = build_view(
            &self.keys,
            revision,
            kvs.iter().map(|(k, v)| (k.clone(), v.as_slice())),
        );
        self.tx.send_replace(Arc::new(view));
    }

    async fn run(self) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.list_and_follow().await {
                Ok(()) => backoff = Duration::from_millis(100),
                Err(e) => {
                    let _ = self.link.down(format!("pool watch: {e}"));
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Lists the pool, publishes it, then applies watch events until the watch ends.
    async fn list_and_follow(&self) -> Result<(), String> {
        let mut c = self.client.clone();
        let root = self.keys.root();
        let resp = tokio::time::timeout(
            self.timeout,
            c.get(root.clone(), Some(GetOptions::new().with_prefix())),
        )
        .await
        .map_err(|_| "list: no answer".to_owned())?
        .map_err(|e| e.to_string())?;
        self.link.up();
        let mut revision = resp.header().map_or(0, |h| h.revision());
        let mut kvs: BTreeMap<String, Vec<u8>> = resp
            .kvs()
            .iter()
            .map(|kv| {
                (
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    kv.value().to_vec(),
                )
            })
            .collect();
        self.publish(revision, &kvs);

        let opts = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision + 1);
        let mut stream = tokio::time::timeout(self.timeout, c.watch(root, Some(opts)))
            .await
            .map_err(|_| "watch: no answer".to_owned())?
            .map_err(|e| e.to_string())?;
        loop {
            let Some(resp) = stream.message().await.map_err(|e| e.to_string())? else {
                return Err("watch stream closed".into());
            };
            if resp.canceled() {
                // Compacted past our revision, or refused: list again.
                return Ok(());
            }
            if resp.events().is_empty() {
                continue;
            }
            for ev in resp.events() {
                let Some(kv) = ev.kv() else { continue };
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                match ev.event_type() {
                    EventType::Put => {
                        kvs.insert(key, kv.value().to_vec());
                    }
                    EventType::Delete => {
                        kvs.remove(&key);
                    }
                }
                revision = revision.max(kv.mod_revision());
            }
            if let Some(h) = resp.header() {
                revision = revision.max(h.revision());
            }
            self.publish(revision, &kvs);
        }
    }
}
