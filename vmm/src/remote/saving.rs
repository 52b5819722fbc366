//! What a snapshot needs of a VM's remote memory besides guest RAM's bytes: the paging
//! engine (to list resident and remote pages without reading remote ones back), the page
//! key (a restored VM opens the sealed remote pages with it) and the pool membership (its
//! namespace passes to the snapshot). [`RemoteSaving`] is built by
//! [`super::RemoteMemory::saving`] and kept by the VM for `crate::snapshot`; a restore
//! brings the same pieces back through [`PoolRestore`].

use std::path::PathBuf;
use std::sync::Arc;

use farvm_ept::Engine;
use farvm_memclient::KeyRing;
use farvm_pool::VmId;

use super::pool::PoolHandoff;

/// A pool VM's remote memory, for a snapshot that leaves its remote pages on the servers.
#[derive(Clone)]
pub struct RemoteSaving {
    /// The paging engine.
    pub engine: Arc<Engine>,
    /// The namespace on the memory servers.
    pub namespace: u64,
    /// The page keys, if pages are sealed (the key saved is the current one: a snapshot is
    /// refused while a key rotation runs).
    pub keys: Option<Arc<KeyRing>>,
    /// The pool membership.
    pub pool: PoolHandoff,
    /// A lazy restore's page file: pages it still holds are listed remote by the engine
    /// but are not on the servers, so a save or a migration copies them from it.
    pub snapshot_pages: Option<Arc<super::page_file::SnapshotPageFile>>,
}

/// A restore of a pool VM's snapshot (set by `crate::snapshot::Snapshot::prepare` on the
/// VM's [`super::RemoteSpec`]): the VM takes the snapshot's namespace back instead of being
/// admitted afresh.
#[derive(Clone, Debug)]
pub struct PoolRestore {
    /// The saved VM's id in the pool (its namespace derives from it).
    pub vm: VmId,
    /// The page key that sealed the pool's pages, if they are sealed and the key is at hand
    /// (unwrapped from a sealed snapshot, received by a live migration); wins over
    /// `key_file`.
    pub key: Option<farvm_seal::PageKey>,
    /// The snapshot's key file, if its pages are sealed and the key is in the clear.
    pub key_file: Option<PathBuf>,
    /// A live migration's destination: the fence its takeover of the namespace commits on
    /// (instead of restoring a snapshot record). None: a snapshot's restore.
    pub takeover_fence: Option<i64>,
}
