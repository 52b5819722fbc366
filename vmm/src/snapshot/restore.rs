//! Restoring a snapshot: [`Snapshot::open`] reads and checks the manifest, [`Snapshot::spec`]
//! gives the VM's description to build the VM from (the caller builds it, as for any boot),
//! and [`Snapshot::restore_into`] loads guest RAM, KVM's VM-wide state, every vCPU's state and
//! the devices' into that VM before it starts. Starting it resumes the guest where it was
//! saved.

use std::path::{Path, PathBuf};

use super::manifest::{Manifest, MANIFEST};
use super::{pages, SnapshotError};
use crate::spec::VmSpec;
use crate::vm::Vm;
use crate::vstate::vcpu::VcpuExits;

/// A snapshot read from its directory.
pub struct Snapshot {
    dir: PathBuf,
    manifest: Manifest,
}

impl Snapshot {
    /// Reads the snapshot in `dir` (its manifest; the page file is read by
    /// [`Snapshot::restore_into`]).
    pub fn open(dir: &Path) -> Result<Self, SnapshotError> {
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
        let manifest = Manifest::read(&path)?;
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
        })
    }

    /// The snapshot's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The description of the VM the snapshot was taken of.
    pub fn spec(&self) -> VmSpec {
        self.manifest.vm.clone()
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
        pages::load(vm.ram(), &self.dir.join(&m.memory.file), &m.memory)?;
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
        Ok(())
    }
}
