//! `farvm run --restore DIR`: the snapshot's description, with what belongs to this run rather
//! than to the VM (console, name, metrics address, guest log echo) taken from the command
//! line, and the snapshot loaded into the VM built from it before it starts.

use std::path::Path;

use farvm_vmm::exit_code;
use farvm_vmm::snapshot::{Snapshot, SnapshotError};
use farvm_vmm::spec::VmSpec;
use farvm_vmm::vm::Vm;

use super::run::RunArgs;
use super::Failure;

fn failure(e: SnapshotError) -> Failure {
    Failure::new(exit_code::for_snapshot_error(&e), e.to_string())
}

/// Reads the snapshot in `dir`, checked under the snapshot key in `key_file` if it is sealed
/// (`--snapshot-key-file`).
pub fn open(dir: &Path, key_file: Option<&Path>) -> Result<Snapshot, Failure> {
    let key = key_file
        .map(|path| {
            farvm_seal::PageKey::from_file(path)
                .map_err(|e| Failure::new(exit_code::USAGE, format!("--snapshot-key-file: {e}")))
        })
        .transpose()?;
    Snapshot::open(dir, key.as_ref()).map_err(failure)
}

/// The VM to build: the snapshot's, with this run's console, name, metrics and log echo.
pub fn spec(snap: &Snapshot, a: &RunArgs) -> VmSpec {
    spec_from(snap.spec(), a)
}

/// The saved (or migrating) VM's description `spec`, with this run's console, name,
/// metrics and log echo (and, for a migration, this host's name in the pool).
pub fn spec_from(mut spec: VmSpec, a: &RunArgs) -> VmSpec {
    spec.serial = a.vm.serial.clone();
    spec.serial_in = a.serial_in.clone();
    spec.echo_guest_logs = a.guest_log;
    if a.vm.name.is_some() {
        spec.name = a.vm.name.clone();
    }
    if a.vm.metrics.is_some() {
        spec.metrics = a.vm.metrics;
    }
    if a.incoming.is_some() {
        // This host's name in the pool, not the source's.
        spec.remote.pool_options.host = a.pool_host.clone();
    }
    spec
}

/// Readies `cfg` (from [`spec`]) for the snapshot: a pool VM takes its namespace back.
pub fn prepare(snap: &Snapshot, cfg: &mut farvm_vmm::builder::VmConfig) -> Result<(), Failure> {
    snap.prepare(cfg).map_err(failure)
}

/// Loads the snapshot into `vm` (built from [`spec`], not started).
pub fn load(snap: &Snapshot, vm: &Vm) -> Result<(), Failure> {
    let started = std::time::Instant::now();
    snap.restore_into(vm).map_err(failure)?;
    tracing::info!(
        dir = %snap.dir().display(),
        secs = started.elapsed().as_secs_f64(),
        "snapshot loaded; resuming the VM"
    );
    Ok(())
}
