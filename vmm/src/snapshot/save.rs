//! Saving a running VM into a snapshot directory: refuse what cannot be saved yet before
//! touching the VM, pause it, read every vCPU's state (each on its own parked thread), KVM's
//! VM-wide state and the devices', copy guest RAM into the page file (a pool VM: its resident
//! pages, and the record of its remote ones, [`super::remote`]), write the manifest last, hand
//! a pool VM's namespace to the snapshot, then stop the VM ([`VmOutcome::Snapshotted`]). On
//! any failure the files written so far are removed, the namespace stays the VM's, and the VM
//! runs on (unless it was paused before the save). Given a snapshot key, every file that holds
//! guest data is sealed ([`super::sealed`]); without one the save warns what is in the clear.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::machine::{check_saveable, DeviceState, KvmState};
use farvm_seal::PageKey;

use super::manifest::{Manifest, FORMAT, MANIFEST, PAGES, POOL_VERSION, SEALED_VERSION, VERSION};
use super::page_lists::{RESIDENT_PAGES, WORKING_SET};
use super::pages::{self, MemoryRecord};
use super::remote::{self, RemoteRecord, KEY, REMOTE_PAGES};
use super::sealed::{Sealing, SEALED_KEY, TAGS};
use super::SnapshotError;
use crate::spec::VmSpec;
use crate::vm::{VmOutcome, VmShared, VmState, PAUSE_TIMEOUT};
use crate::vstate::vcpu::VcpuState;

/// How long the parked vCPU threads have to report their state.
const STATE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a save wrote.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Saved {
    /// The snapshot's directory.
    pub dir: PathBuf,
    /// Guest RAM, bytes (the page file's length).
    pub memory_bytes: u64,
    /// Pages written (not zero).
    pub pages_written: u64,
    /// Pages left on the memory pool's servers (0: every page was written).
    pub remote_pages: u64,
    /// The snapshot's id in the memory pool (the VM's uuid there), for a pool VM.
    pub pool_snapshot: Option<String>,
    /// How long the VM was paused for the save, seconds.
    pub paused_secs: f64,
    /// The public id of the snapshot key the snapshot is sealed under (None: in the clear).
    pub sealed_under: Option<String>,
}

/// Saves `vm`, made from the description `spec`, into `dir` (created if missing; a directory
/// holding a snapshot is refused), sealed under `key` if given, and stops it (module doc).
pub fn save(
    vm: &VmShared,
    spec: &VmSpec,
    dir: &Path,
    key: Option<&PageKey>,
) -> Result<Saved, SnapshotError> {
    check_saveable(spec, vm.board.agent().is_some())?;
    let was_paused = match vm.state() {
        VmState::Running => false,
        VmState::Paused => true,
        other => return Err(SnapshotError::State(format!("the VM is {other}"))),
    };
    std::fs::create_dir_all(dir).map_err(SnapshotError::write(dir))?;
    if dir.join(MANIFEST).exists() {
        return Err(SnapshotError::Exists {
            dir: dir.to_path_buf(),
        });
    }
    // A pool VM's pages stay on the servers under one key, which the snapshot keeps.
    if let Some(keys) = vm.remote_saving().and_then(|s| s.keys.as_ref()) {
        keys.settled_key()
            .map_err(|e| SnapshotError::State(e.to_string()))?;
    }
    if key.is_none() {
        tracing::warn!(
            dir = %dir.display(),
            "the snapshot is not sealed: its page file holds the guest's pages in the clear \
             (and a pool VM's page.key the key to the pool's copy of every other page), \
             protected by file mode 0600 only; give a snapshot key to seal it (farvm snapshot \
             --key-file, or snapshot_key_file in the host config for the API's vm.snapshot)"
        );
    }
    vm.pause(PAUSE_TIMEOUT)
        .map_err(|e| SnapshotError::State(e.to_string()))?;
    let started = Instant::now();
    match write_snapshot(vm, spec, dir, key) {
        Ok((memory, pool)) => {
            let saved = Saved {
                dir: dir.to_path_buf(),
                memory_bytes: memory.bytes,
                pages_written: memory.pages_written,
                remote_pages: pool.as_ref().map_or(0, |p| p.pages),
                pool_snapshot: pool.map(|p| p.pool_vm),
                paused_secs: started.elapsed().as_secs_f64(),
                sealed_under: key.map(|k| k.id().to_string()),
            };
            match &saved.pool_snapshot {
                Some(id) => tracing::info!(
                    dir = %dir.display(),
                    pages = saved.pages_written,
                    remote_pages = saved.remote_pages,
                    pool_snapshot = %id,
                    secs = saved.paused_secs,
                    "VM saved (its remote pages stay in the pool, owned by the snapshot); stopping it"
                ),
                None => tracing::info!(
                    dir = %dir.display(),
                    pages = saved.pages_written,
                    secs = saved.paused_secs,
                    "VM saved (every page written); stopping it"
                ),
            }
            vm.request_stop(VmOutcome::Snapshotted {
                dir: dir.display().to_string(),
            });
            Ok(saved)
        }
        Err(e) => {
            for f in [
                PAGES.to_string(),
                format!("{MANIFEST}.tmp"),
                MANIFEST.to_string(),
                REMOTE_PAGES.to_string(),
                KEY.to_string(),
                TAGS.to_string(),
                SEALED_KEY.to_string(),
                RESIDENT_PAGES.to_string(),
                WORKING_SET.to_string(),
            ] {
                let _ = std::fs::remove_file(dir.join(f));
            }
            if !was_paused {
                if let Err(r) = vm.resume() {
                    tracing::error!("the save failed and the VM could not be resumed: {r}");
                }
            }
            tracing::warn!("snapshot to {} failed: {e}", dir.display());
            Err(e)
        }
    }
}

/// The paused VM's machine state: every vCPU's, KVM's VM-wide state and the devices'.
pub(crate) fn machine_state(
    vm: &VmShared,
) -> Result<(Vec<VcpuState>, KvmState, DeviceState), SnapshotError> {
    let vcpus = vm
        .save_vcpus(STATE_TIMEOUT)
        .map_err(|e| SnapshotError::State(e.to_string()))?;
    let kvm = {
        let fd = vm
            .kvm_vm()
            .ok_or_else(|| SnapshotError::State("the KVM VM is closed".into()))?;
        KvmState::read(&fd)?
    };
    Ok((vcpus, kvm, DeviceState::read(vm)))
}

/// Everything but the pause and the outcome: state, pages, manifest, and a pool VM's
/// namespace handed to the snapshot (last: a failure before leaves it the VM's).
fn write_snapshot(
    vm: &VmShared,
    spec: &VmSpec,
    dir: &Path,
    key: Option<&PageKey>,
) -> Result<(MemoryRecord, Option<RemoteRecord>), SnapshotError> {
    let (vcpus, kvm, devices) = machine_state(vm)?;
    let mut sealing = key.map(|k| Sealing::create(dir, k)).transpose()?;
    let saving = vm.remote_saving();
    let pool_vm = saving.and_then(|s| s.pool.vm());
    let (memory, pool) = match (saving, pool_vm) {
        (Some(saving), Some(id)) => {
            let (memory, rec) = remote::save(
                saving,
                &vm.ram,
                dir,
                PAGES,
                &id.to_string(),
                sealing.as_mut(),
            )?;
            (memory, Some(rec))
        }
        _ => (
            pages::save(&vm.ram, &dir.join(PAGES), PAGES, sealing.as_mut())?,
            None,
        ),
    };
    let mut manifest = Manifest {
        format: FORMAT.into(),
        version: match (&sealing, &pool) {
            (Some(_), _) => SEALED_VERSION,
            (None, Some(_)) => POOL_VERSION,
            (None, None) => VERSION,
        },
        farvm_version: env!("CARGO_PKG_VERSION").into(),
        vm: spec.clone(),
        memory: memory.clone(),
        vcpus,
        kvm,
        devices,
        pool: pool.clone(),
        sealed: None,
    };
    match sealing {
        Some(s) => s.write_manifest(&mut manifest, dir)?,
        None => manifest.write(dir)?,
    }
    if let (Some(saving), Some(rec)) = (saving, &pool) {
        saving
            .pool
            .hand_to_snapshot(dir, rec.pages, memory.pages_written)
            .map_err(|e| {
                SnapshotError::State(format!(
                    "handing the VM's namespace to the snapshot in the memory pool: {e}"
                ))
            })?;
    }
    Ok((memory, pool))
}
