//! Snapshots of a running VM: `farvm snapshot --vm NAME DIR` (through the control socket) or
//! the API's `vm.snapshot` saves it, `farvm run --restore DIR` or the API's `vm.restore` builds
//! it again and resumes it where it was.
//!
//! A snapshot is a directory holding `manifest.json` ([`manifest`]: a versioned record of the
//! VM's description, every vCPU's state, KVM's irqchip and clock, the devices' state) and
//! `memory.pages` ([`pages`]: guest RAM, zero pages left as holes). Without a pool every page
//! is written, the remote ones read back from the memory servers, as every VMM does. A VM on
//! a memory pool leaves its remote pages there ([`remote`]): the page file holds the resident
//! pages, `remote.pages` the fingerprint of every remote one and `page.key` the key that
//! sealed them, and the VM's namespace passes to a snapshot record in the pool, which the
//! restore takes back (once). The save stops the VM, as `virsh save` expects; a save that
//! fails resumes it (unless it was paused before), leaves the namespace with it, and says
//! why.
//!
//! [`save`] runs on whatever thread asks (the control socket's, the API's) against the VM's
//! shared state; [`Snapshot`] ([`restore`]) reads a snapshot and loads it into a VM built from
//! its description, before the VM starts.

pub mod clock;
pub mod machine;
pub mod manifest;
pub mod page_lists;
pub mod pages;
pub mod remote;
mod restore;
mod restore_pages;
mod save;
pub mod sealed;

use std::path::{Path, PathBuf};

pub use remote::listed_page;
pub use restore::Snapshot;
pub use restore_pages::RestorePages;
pub(crate) use save::machine_state;
pub use save::{save, Saved};

use crate::vstate::vm::KvmError;

/// Why a snapshot could not be saved or restored.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The directory does not exist or holds no snapshot.
    #[error("no snapshot at {}: {why}", dir.display())]
    NotFound {
        /// The directory.
        dir: PathBuf,
        /// What is missing.
        why: &'static str,
    },
    /// A snapshot file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A snapshot file cannot be written (a full disk, a read-only directory).
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A snapshot file does not hold what it should.
    #[error("the snapshot file {} is corrupt: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The manifest is of a format version this farvm does not read.
    #[error(
        "the snapshot {} is format version {found}; this farvm reads version {supported}",
        path.display()
    )]
    Version {
        /// The manifest.
        path: PathBuf,
        /// Its version.
        found: u64,
        /// The version this farvm reads.
        supported: u32,
    },
    /// The directory already holds a snapshot (a save never overwrites one).
    #[error("{} already holds a snapshot (remove it or choose another directory)", dir.display())]
    Exists {
        /// The directory.
        dir: PathBuf,
    },
    /// The snapshot cannot be restored the way asked (`farvm run --restore-pages`).
    #[error("--restore-pages {mode}: {why}")]
    RestoreMode {
        /// The mode asked for.
        mode: &'static str,
        /// Why not.
        why: String,
    },
    /// A device whose state farvm cannot save yet.
    #[error("cannot save {0} yet: the VM is left running")]
    Unsupported(String),
    /// The VM's control socket was started without its description (a library caller's).
    #[error("the VM has no description to save (it was not started by farvm run or the API)")]
    NoDescription,
    /// The VM is not in a state to be saved, or its vCPUs would not stop.
    #[error("cannot save the VM: {0}")]
    State(String),
    /// A KVM call failed.
    #[error(transparent)]
    Kvm(#[from] KvmError),
    /// Guest RAM could not be copied.
    #[error("guest memory: {0}")]
    Memory(String),
    /// A device's state could not be loaded.
    #[error("device state: {0}")]
    Device(String),
    /// The memory pool refused or did not answer (etcd).
    #[error("memory pool: {0}")]
    Pool(String),
    /// The snapshot key could not be loaded (its file is missing, exposed or malformed).
    #[error(
        "snapshot key (farvm snapshot --key-file, farvm run --snapshot-key-file, or \
         snapshot_key_file in the host config): {0}"
    )]
    Key(String),
    /// The snapshot is sealed and no snapshot key was given.
    #[error(
        "the snapshot {} is sealed under snapshot key {key_id}: give its key with farvm run \
         --snapshot-key-file PATH (the API's vm.restore: snapshot_key_file in the host config)",
        dir.display()
    )]
    KeyMissing {
        /// The snapshot's directory.
        dir: PathBuf,
        /// The public id of the key it was sealed under.
        key_id: String,
    },
    /// The key given is not the one the snapshot was sealed under.
    #[error(
        "the snapshot {} is sealed under snapshot key {sealed}, not under the key {given} \
         given (farvm run --snapshot-key-file, or snapshot_key_file in the host config)",
        dir.display()
    )]
    KeyWrong {
        /// The snapshot's directory.
        dir: PathBuf,
        /// The public id of the key it was sealed under.
        sealed: String,
        /// The public id of the key given.
        given: String,
    },
}

impl From<crate::remote::PageFileError> for SnapshotError {
    fn from(e: crate::remote::PageFileError) -> Self {
        use crate::remote::PageFileError;
        match e {
            PageFileError::Read { path, source } => SnapshotError::Read { path, source },
            PageFileError::OutsideRam { path, page } => SnapshotError::Corrupt {
                path,
                reason: format!("page {page:#x} listed in it lies outside guest RAM"),
            },
        }
    }
}

impl SnapshotError {
    fn read(path: &Path) -> impl Fn(std::io::Error) -> SnapshotError + '_ {
        move |source| SnapshotError::Read {
            path: path.to_path_buf(),
            source,
        }
    }

    fn write(path: &Path) -> impl Fn(std::io::Error) -> SnapshotError + '_ {
        move |source| SnapshotError::Write {
            path: path.to_path_buf(),
            source,
        }
    }

    fn corrupt(path: &Path, reason: String) -> SnapshotError {
        SnapshotError::Corrupt {
            path: path.to_path_buf(),
            reason,
        }
    }
}
