//! A snapshot's manifest, `manifest.json`: the format's name and version, the farvm that
//! wrote it, the VM's description, guest RAM's page file record, every vCPU's state, KVM's
//! VM-wide state and the devices'. It is written last (to a temporary name, then renamed), so
//! a directory with a manifest holds a complete snapshot.
//!
//! Version 1 holds every page in the page file; version 2 is a pool VM's snapshot, whose
//! remote pages stayed on the memory servers ([`Manifest::pool`]); version 3 is either, sealed
//! under a snapshot key ([`Manifest::sealed`], [`super::sealed`]: its machine state is sealed
//! too, and the rest authenticated). Reading checks the format
//! and version before the rest, so a manifest of another version is
//! [`SnapshotError::Version`], not a parse error.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::machine::{DeviceState, KvmState};
use super::pages::MemoryRecord;
use super::remote::RemoteRecord;
use super::sealed::SealRecord;
use super::SnapshotError;
use crate::spec::VmSpec;
use crate::vstate::vcpu::VcpuState;

/// The manifest's file name in a snapshot's directory.
pub const MANIFEST: &str = "manifest.json";
/// The page file's name.
pub const PAGES: &str = "memory.pages";
/// The `format` field of every farvm snapshot.
pub const FORMAT: &str = "farvm-snapshot";
/// The version this farvm writes for a snapshot holding every page (and the oldest it reads).
pub const VERSION: u32 = 1;
/// The version of a pool VM's snapshot, whose remote pages stay on the memory servers
/// ([`Manifest::pool`]): a farvm that reads only [`VERSION`] refuses it rather than restore
/// the remote pages as zeros.
pub const POOL_VERSION: u32 = 2;
/// The version of a sealed snapshot ([`Manifest::sealed`]), of either kind: a farvm that
/// cannot open it refuses it rather than load its sealed pages as guest RAM.
pub const SEALED_VERSION: u32 = 3;

/// A snapshot's manifest (module doc).
#[derive(Serialize, Deserialize)]
pub struct Manifest {
    /// [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub version: u32,
    /// The farvm that wrote it.
    pub farvm_version: String,
    /// The VM's description.
    pub vm: VmSpec,
    /// Guest RAM.
    pub memory: MemoryRecord,
    /// Every vCPU's state, in index order.
    pub vcpus: Vec<VcpuState>,
    /// KVM's VM-wide state.
    pub kvm: KvmState,
    /// The devices' state.
    pub devices: DeviceState,
    /// A pool VM's remote part (format [`POOL_VERSION`]): its remote pages stayed on the
    /// memory servers. None: the page file holds every page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<RemoteRecord>,
    /// How the snapshot is sealed (format [`SEALED_VERSION`]); never the key. None: its files
    /// are in the clear. A sealed manifest file holds `vcpus`, `kvm` and `devices` sealed, as
    /// one hex string `machine` ([`super::sealed`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<SealRecord>,
}

impl Manifest {
    /// Reads and checks the manifest at `path` (one in the clear: a sealed manifest is read
    /// by [`read_value`], opened, then [`Manifest::from_value`]).
    pub fn read(path: &Path) -> Result<Self, SnapshotError> {
        read_value(path).and_then(|(v, _)| Self::from_value(path, v))
    }

    /// The manifest in `v`, read from `path` by [`read_value`] (and, sealed, opened).
    pub fn from_value(path: &Path, v: Value) -> Result<Self, SnapshotError> {
        let m: Self =
            serde_json::from_value(v).map_err(|e| SnapshotError::corrupt(path, e.to_string()))?;
        if (m.version == SEALED_VERSION) != m.sealed.is_some() {
            return Err(SnapshotError::corrupt(
                path,
                format!(
                    "version {} with a seal record: {}",
                    m.version,
                    m.sealed.is_some()
                ),
            ));
        }
        Ok(m)
    }

    /// Writes the manifest into `dir` (to a temporary name, then renamed).
    pub fn write(&self, dir: &Path) -> Result<(), SnapshotError> {
        let text = serde_json::to_vec(self).map_err(|e| SnapshotError::Write {
            path: dir.join(MANIFEST),
            source: std::io::Error::other(e),
        })?;
        write_bytes(dir, &text)
    }
}

/// Reads the manifest file at `path` and checks its format and version; returns it as JSON,
/// with the file's bytes (which a sealed snapshot's summary authenticates).
pub fn read_value(path: &Path) -> Result<(Value, Vec<u8>), SnapshotError> {
    let text = std::fs::read(path).map_err(SnapshotError::read(path))?;
    let v: Value = serde_json::from_slice(&text)
        .map_err(|e| SnapshotError::corrupt(path, format!("not JSON: {e}")))?;
    match v.get("format").and_then(Value::as_str) {
        Some(FORMAT) => {}
        other => {
            return Err(SnapshotError::corrupt(
                path,
                format!("format {other:?}, expected \"{FORMAT}\""),
            ))
        }
    }
    match v.get("version").and_then(Value::as_u64) {
        Some(n) if (u64::from(VERSION)..=u64::from(SEALED_VERSION)).contains(&n) => {}
        Some(n) => {
            return Err(SnapshotError::Version {
                path: path.to_path_buf(),
                found: n,
                supported: SEALED_VERSION,
            })
        }
        None => return Err(SnapshotError::corrupt(path, "no version number".into())),
    }
    Ok((v, text))
}

/// Writes `text`, a manifest's bytes, into `dir` (to a temporary name, then renamed).
pub fn write_bytes(dir: &Path, text: &[u8]) -> Result<(), SnapshotError> {
    let tmp = dir.join(format!("{MANIFEST}.tmp"));
    std::fs::write(&tmp, text).map_err(SnapshotError::write(&tmp))?;
    let path = dir.join(MANIFEST);
    std::fs::rename(&tmp, &path).map_err(SnapshotError::write(&path))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str) -> std::path::PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join(MANIFEST);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn bad_manifests_are_named_errors() {
        let dir = std::env::temp_dir().join(format!("farvm-manifest-{}", std::process::id()));
        let p = write(&dir, "{not json");
        assert!(matches!(
            Manifest::read(&p),
            Err(SnapshotError::Corrupt { .. })
        ));
        let p = write(&dir, r#"{"format":"qemu","version":1}"#);
        assert!(matches!(
            Manifest::read(&p),
            Err(SnapshotError::Corrupt { .. })
        ));
        let p = write(&dir, r#"{"format":"farvm-snapshot","version":99}"#);
        match Manifest::read(&p) {
            Err(SnapshotError::Version { found: 99, .. }) => {}
            Err(e) => panic!("not a version error: {e}"),
            Ok(_) => panic!("accepted"),
        }
        let p = write(&dir, r#"{"format":"farvm-snapshot","version":1,"vm":{}}"#);
        assert!(matches!(
            Manifest::read(&p),
            Err(SnapshotError::Corrupt { .. })
        ));
        let missing = dir.join("none").join(MANIFEST);
        assert!(matches!(
            Manifest::read(&missing),
            Err(SnapshotError::Read { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
