//! Restoring a snapshot: [`Snapshot::open`] reads and checks the manifest, [`Snapshot::spec`]
//! gives the VM's description to build the VM from (the caller builds it, as for any boot),
//! and [`Snapshot::restore_into`] loads guest RAM, KVM's VM-wide state, every vCPU's state and
//! the devices' into that VM before it starts. Starting it resumes the guest where it was
//! saved. A sealed snapshot is checked under its key when it is opened, before anything is
//! built or taken from the pool.

use std::path::{Path, PathBuf};

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use farvm_seal::PageKey;

use super::manifest::{self, Manifest, MANIFEST};
use super::page_lists::{self, RESIDENT_PAGES, WORKING_SET};
use super::restore_pages::RestorePages;
use super::sealed::Unsealed;
use super::{pages, remote, SnapshotError};
use crate::remote::{working_set, SnapshotPageFile};
use crate::spec::VmSpec;
use crate::vm::Vm;
use crate::vstate::vcpu::VcpuExits;

/// A snapshot read from its directory.
pub struct Snapshot {
    dir: PathBuf,
    pub(super) manifest: Manifest,
    /// A sealed snapshot, checked under its key.
    unsealed: Option<Unsealed>,
    /// Received by a live migration: the fence its pool VM's takeover commits on.
    takeover_fence: Option<i64>,
    /// How the resident pages come back.
    restore_pages: RestorePages,
    /// A lazy restore's resident pages and fingerprints, read by [`Snapshot::prepare`].
    resident: OnceLock<Vec<(u64, u128)>>,
    /// A working-set restore's pages in recorded order, read by [`Snapshot::prepare`].
    working_set: OnceLock<Vec<u64>>,
}

impl Snapshot {
    /// Reads the snapshot in `dir` (its manifest; the page file is read by
    /// [`Snapshot::restore_into`]). A sealed snapshot is checked under the snapshot key `key`
    /// (its id, the summary over the manifest and the page tags, its machine state, the
    /// wrapped page key): without a key or with another key it is refused here, before any VM
    /// is built. A key for a snapshot in the clear is not needed, and said so.
    pub fn open(dir: &Path, key: Option<&PageKey>) -> Result<Self, SnapshotError> {
        let not_found = |why| SnapshotError::NotFound {
            dir: dir.to_path_buf(),
            why,
        };
        if !dir.is_dir() {
            return Err(not_found("no such directory"));
        }
        let path = dir.join(MANIFEST);
        if !path.exists() {
            return Err(not_found("the directory has no manifest.json"));
        }
        let (mut v, text) = manifest::read_value(&path)?;
        let sealed_under = v
            .get("sealed")
            .map(|s| s["key_id"].as_str().unwrap_or("?").to_string());
        let unsealed = match (sealed_under, key) {
            (Some(_), Some(key)) => Some(Unsealed::check(dir, &text, &mut v, key)?),
            (Some(key_id), None) => {
                return Err(SnapshotError::KeyMissing {
                    dir: dir.to_path_buf(),
                    key_id,
                })
            }
            (None, Some(_)) => {
                tracing::warn!(
                    dir = %dir.display(),
                    "the snapshot is not sealed: the snapshot key given is not used"
                );
                None
            }
            (None, None) => None,
        };
        let manifest = Manifest::from_value(&path, v)?;
        let file = &manifest.memory.file;
        if Path::new(file).file_name().and_then(|f| f.to_str()) != Some(file.as_str()) {
            return Err(SnapshotError::corrupt(
                &path,
                format!("the page file `{file}` is not a file name inside the snapshot"),
            ));
        }
        Ok(Snapshot {
            dir: dir.to_path_buf(),
            manifest,
            unsealed,
            takeover_fence: None,
            restore_pages: RestorePages::Eager,
            resident: OnceLock::new(),
            working_set: OnceLock::new(),
        })
    }

    /// Restores the resident pages as `mode` says (default [`RestorePages::Eager`]); a
    /// mode other than eager needs a pool VM's snapshot that lists its resident pages
    /// (checked by [`Snapshot::prepare`]).
    pub fn restore_pages(mut self, mode: RestorePages) -> Self {
        self.restore_pages = mode;
        self
    }

    /// Marks the snapshot as a live migration's arrival: its pool VM takes the namespace
    /// over from the running source (one etcd transaction on `fence`, once the VM is loaded)
    /// instead of restoring a snapshot record.
    pub fn arriving(mut self, fence: i64) -> Self {
        self.takeover_fence = Some(fence);
        self
    }

    /// The snapshot's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The description of the VM the snapshot was taken of.
    pub fn spec(&self) -> VmSpec {
        self.manifest.vm.clone()
    }

    /// The snapshot's id in the memory pool (the saved VM's uuid there), if its remote pages
    /// stayed in one.
    pub fn pool_snapshot(&self) -> Option<&str> {
        self.manifest.pool.as_ref().map(|p| p.pool_vm.as_str())
    }

    /// Readies the configuration of the VM to build (from [`Snapshot::spec`]) for this
    /// snapshot: its build writes nothing into guest RAM, and a pool VM's takes the
    /// snapshot's namespace back (and its page key) instead of being admitted afresh.
    pub fn prepare(&self, cfg: &mut crate::builder::VmConfig) -> Result<(), SnapshotError> {
        let unsealed = self.unsealed.as_ref();
        // Every page the guest had comes from the snapshot: the build leaves guest RAM alone.
        cfg.restoring = true;
        let mode = self.restore_pages;
        if !mode.is_eager() && unsealed.is_some() {
            return Err(SnapshotError::RestoreMode {
                mode: mode.name(),
                why: "the snapshot is sealed: it keeps no clear list of its pages' \
                      fingerprints, and restores eagerly only"
                    .into(),
            });
        }
        let Some(rec) = &self.manifest.pool else {
            if !mode.is_eager() {
                return Err(SnapshotError::RestoreMode {
                    mode: mode.name(),
                    why: "the snapshot holds every page (its VM was not on a memory pool): \
                          it restores eagerly only"
                        .into(),
                });
            }
            return Ok(());
        };
        let path = self.dir.join(MANIFEST);
        let vm = rec.pool_vm.parse().map_err(|e| {
            SnapshotError::corrupt(&path, format!("pool VM id `{}`: {e}", rec.pool_vm))
        })?;
        let remote = cfg
            .remote
            .as_mut()
            .filter(|r| r.pool.is_some())
            .ok_or_else(|| {
                SnapshotError::corrupt(
                    &path,
                    "its remote pages are in a memory pool, but its VM has no pool".into(),
                )
            })?;
        remote.pool_restore = Some(crate::remote::PoolRestore {
            vm,
            key: unsealed.and_then(|u| u.page_key().cloned()),
            key_file: match unsealed {
                Some(_) => None,
                None => rec.key_file.as_ref().map(|k| self.dir.join(k)),
            },
            takeover_fence: self.takeover_fence,
        });
        if mode.is_eager() {
            return Ok(());
        }
        let resident =
            page_lists::read_resident(&self.dir)?.ok_or_else(|| SnapshotError::RestoreMode {
                mode: mode.name(),
                why: format!(
                    "{} has no {RESIDENT_PAGES} (written by a farvm without lazy restores): \
                     restore it eagerly",
                    self.dir.display()
                ),
            })?;
        let mem = &self.manifest.memory;
        if resident.len() as u64 != mem.pages_written {
            return Err(SnapshotError::corrupt(
                &self.dir.join(RESIDENT_PAGES),
                format!(
                    "{} pages listed, the page file holds {}",
                    resident.len(),
                    mem.pages_written
                ),
            ));
        }
        let file_path = self.dir.join(&mem.file);
        let len = std::fs::metadata(&file_path)
            .map_err(SnapshotError::read(&file_path))?
            .len();
        if len != mem.bytes {
            return Err(SnapshotError::corrupt(
                &file_path,
                format!("{len} bytes, the manifest says {}", mem.bytes),
            ));
        }
        let file = SnapshotPageFile::open(&file_path, &mem.regions, resident.iter().map(|r| r.0))?;
        remote.snapshot_pages = Some(Arc::new(file));
        if mode == RestorePages::Lazy {
            remote.prefetcher = "none".into();
        }
        if mode.uses_working_set() {
            let ws = page_lists::read_working_set(&self.dir)?.ok_or_else(|| {
                SnapshotError::RestoreMode {
                    mode: mode.name(),
                    why: format!(
                        "{} has no {WORKING_SET}: restore it with lazy-prefetch",
                        self.dir.display()
                    ),
                }
            })?;
            if let Some(&p) = ws.iter().find(|&&p| !remote_holds(&resident, p)) {
                return Err(SnapshotError::corrupt(
                    &self.dir.join(WORKING_SET),
                    format!("page {p:#x} of the working set is not in the page file"),
                ));
            }
            let _ = self.working_set.set(ws);
        }
        let _ = self.resident.set(resident);
        Ok(())
    }

    /// Loads the snapshot into `vm`, built from [`Snapshot::spec`] and not started.
    pub fn restore_into(&self, vm: &Vm) -> Result<(), SnapshotError> {
        let m = &self.manifest;
        if m.vcpus.len() != vm.vcpus().len() {
            return Err(SnapshotError::corrupt(
                &self.dir.join(MANIFEST),
                format!(
                    "{} vCPU states for a VM of {} vCPUs",
                    m.vcpus.len(),
                    vm.vcpus().len()
                ),
            ));
        }
        let unsealed = self.unsealed.as_ref();
        let saving = vm.shared().remote_saving();
        match (self.resident.get(), saving) {
            // Lazy: the page file's pages are read on first touch (`PageFileStore`), checked
            // against the fingerprints the save recorded.
            (Some(resident), Some(saving)) if !self.restore_pages.is_eager() => {
                for &(p, fp) in resident {
                    saving
                        .engine
                        .adopt_remote(p, fp)
                        .map_err(|e| SnapshotError::Memory(e.to_string()))?;
                }
            }
            _ => pages::load(
                vm.ram(),
                &self.dir.join(&m.memory.file),
                &m.memory,
                unsealed,
            )?,
        }
        if let Some(rec) = &m.pool {
            let saving = saving.ok_or_else(|| {
                SnapshotError::State(
                    "the snapshot's remote pages are in a memory pool, and the VM is not on one"
                        .into(),
                )
            })?;
            remote::adopt(&saving.engine, &self.dir, rec, unsealed)?;
        }
        m.kvm.apply(vm.kvm_vm())?;
        for (state, fd) in m.vcpus.iter().zip(vm.vcpus()) {
            state.apply(fd)?;
        }
        m.devices.apply(vm.shared())?;
        // The paging engine learns the guest's paging depth from CR4 when an agent slot is
        // registered; the restored slots were registered before any vCPU ran.
        for (cpu, state) in (0u32..).zip(&m.vcpus) {
            if vm.shared().pv.agent_slot_gpa(cpu).is_some() {
                vm.shared().guest_cr4(cpu, state.sregs.cr4);
            }
        }
        if let (Some(saving), Some(fence)) = (vm.shared().remote_saving(), self.takeover_fence) {
            saving.pool.set_takeover_fence(fence);
        }
        if let Some(saving) = vm.shared().remote_saving() {
            // Loaded: the VM owns its namespace for good from here (its guest will overwrite
            // the snapshot's remote pages).
            saving
                .pool
                .restore_done()
                .map_err(|e| SnapshotError::Pool(format!("taking the VM's namespace over: {e}")))?;
            // From here the log is the guest's touches, not what the restore loaded.
            saving.engine.restart_touch_log();
        }
        self.fetch_working_set(vm)
    }

    /// A working-set restore's fetch: before the guest runs, or started behind it.
    fn fetch_working_set(&self, vm: &Vm) -> Result<(), SnapshotError> {
        let (Some(ws), Some(saving)) = (self.working_set.get(), vm.shared().remote_saving()) else {
            return Ok(());
        };
        if self.restore_pages == RestorePages::WorkingSetAsync {
            let remote = vm.remote().ok_or_else(|| {
                SnapshotError::State("a working-set restore needs remote memory".into())
            })?;
            return remote
                .fetch_in_background(ws.clone())
                .map_err(|e| SnapshotError::State(format!("starting the working-set fetch: {e}")));
        }
        let started = std::time::Instant::now();
        let n = working_set::fetch(
            &saving.engine,
            ws,
            saving.snapshot_pages.as_deref(),
            &AtomicBool::new(false),
        )
        .map_err(|e| SnapshotError::Memory(format!("fetching the working set: {e}")))?;
        tracing::info!(
            pages = n,
            secs = started.elapsed().as_secs_f64(),
            "working set fetched before the guest runs"
        );
        Ok(())
    }
}

/// Whether `p` is among `resident` (sorted by page, as the save writes them).
fn remote_holds(resident: &[(u64, u128)], p: u64) -> bool {
    resident.binary_search_by_key(&p, |r| r.0).is_ok()
}
