//! `farvm run --incoming HOST:PORT`: waits for a live migration's source, builds the VM from
//! its description while the pre-copy arrives, receives the rest into a snapshot directory,
//! loads it, and answers the source once the VM is loaded (and owns its namespace in the
//! pool) or has failed.

use std::net::SocketAddr;

use farvm_vmm::builder::VmConfig;
use farvm_vmm::exit_code;
use farvm_vmm::migration::{Arrival, Arriving, Incoming, MigrationError};
use farvm_vmm::spec::VmSpec;
use farvm_vmm::vm::Vm;

use farvm_vmm::spec::CliNames;

use super::run::{build_vm, spec_failure, RunArgs};
use super::Failure;

fn failure(e: MigrationError) -> Failure {
    let code = match &e {
        MigrationError::Snapshot(s) => exit_code::for_snapshot_error(s),
        MigrationError::Key(_) => exit_code::USAGE,
        _ => exit_code::HOST_ERROR,
    };
    Failure::new(code, format!("incoming migration: {e}"))
}

/// Waits on `addr` for the source, builds its VM and loads it; returns the VM's description,
/// configuration and the VM, ready to run.
pub fn arrive(addr: SocketAddr, a: &RunArgs) -> Result<(VmSpec, VmConfig, Vm), Failure> {
    let Some(key_path) = &a.migration_key_file else {
        return Err(Failure::new(
            exit_code::USAGE,
            "--incoming needs --migration-key-file",
        ));
    };
    let key = farvm_seal::PageKey::from_file(key_path)
        .map_err(|e| Failure::new(exit_code::USAGE, format!("--migration-key-file: {e}")))?;
    let dir = a.incoming_dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("farvm-incoming-{}", std::process::id()))
    });
    if dir.join("manifest.json").exists() {
        return Err(Failure::new(
            exit_code::USAGE,
            format!("--incoming-dir {} already holds a snapshot", dir.display()),
        ));
    }
    let incoming = Incoming::listen(addr).map_err(failure)?;
    let at = incoming.addr().map_err(failure)?;
    eprintln!("farvm: waiting for a migrating VM on {at}");
    let removed = |f: Failure| {
        let _ = std::fs::remove_dir_all(&dir);
        f
    };
    let arriving = incoming
        .accept(&dir, &key)
        .map_err(|e| removed(failure(e)))?;
    let (spec, cfg, vm) = build(&arriving, a).map_err(removed)?;
    let arrival = arriving.receive().map_err(|e| removed(failure(e)))?;
    tracing::info!(bytes = arrival.bytes_received, dir = %arrival.dir().display(), "migration: the VM's state has arrived; loading it");
    if injected_fault() == Some(Fault::CrashOnArrival) {
        tracing::warn!("FARVM_MIGRATION_FAULT=crash-before-takeover: exiting as a crash would");
        std::process::exit(exit_code::HOST_ERROR);
    }
    if injected_fault() == Some(Fault::Stall) {
        tracing::warn!("FARVM_MIGRATION_FAULT=stall-before-takeover: waiting 2 s before the load");
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    let loaded = arrival.snapshot().map_err(failure).and_then(|snap| {
        super::restore::load(&snap, &vm)?;
        // Last, just before the guest runs: its clocks move forward by the pause.
        arrival.resume_clocks(&snap, &vm).map_err(failure)
    });
    match loaded {
        Ok(()) => arrived(arrival),
        Err(f) => Err(refuse(arrival, f)),
    }?;
    Ok((spec, cfg, vm))
}

/// The VM the source describes, built while its pre-copy arrives (its build writes nothing
/// into guest RAM; it joins the pool without owning the VM).
fn build(arriving: &Arriving, a: &RunArgs) -> Result<(VmSpec, VmConfig, Vm), Failure> {
    let spec = super::restore::spec_from(arriving.spec(), a);
    let mut cfg = spec.to_config().map_err(|e| spec_failure(&e, &CliNames))?;
    arriving.prepare(&mut cfg).map_err(failure)?;
    let vm = build_vm(&cfg)?;
    Ok((spec, cfg, vm))
}

/// Tells the source the VM failed here (it runs on there); returns `f`.
fn refuse(arrival: Arrival, f: Failure) -> Failure {
    let dir = arrival.dir().to_path_buf();
    if let Err(e) = arrival.answer(Err(f.message.clone())) {
        tracing::warn!("migration: cannot tell the source the VM failed here: {e}");
    }
    let _ = std::fs::remove_dir_all(dir);
    f
}

/// Tells the source the VM is loaded here and owns its namespace; removes the directory (it
/// holds the page key).
fn arrived(arrival: Arrival) -> Result<(), Failure> {
    let dir = arrival.dir().to_path_buf();
    let told = if injected_fault() == Some(Fault::NoAnswer) {
        tracing::warn!("FARVM_MIGRATION_FAULT=no-answer-after-takeover: the source is not told");
        drop(arrival);
        Ok(())
    } else {
        arrival.answer(Ok(()))
    };
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = told {
        // The namespace is ours (the takeover committed): the source learns it from etcd.
        tracing::warn!(
            "migration: cannot tell the source the VM runs here ({e}); it learns it from the pool"
        );
    }
    eprintln!("farvm: the migrated VM runs here");
    Ok(())
}

/// A failure injected on purpose (`FARVM_MIGRATION_FAULT`), for the tests of the handover:
/// the destination dies once the VM has arrived, before it takes the namespace over; it
/// takes it over and runs the VM without answering the source (the answer lost); or it waits
/// before the load (a window to pause etcd in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    CrashOnArrival,
    NoAnswer,
    /// Waits 2 s before the load and the takeover (a window for a test to pause etcd in).
    Stall,
}

fn injected_fault() -> Option<Fault> {
    match std::env::var("FARVM_MIGRATION_FAULT").ok()?.as_str() {
        "crash-before-takeover" => Some(Fault::CrashOnArrival),
        "no-answer-after-takeover" => Some(Fault::NoAnswer),
        "stall-before-takeover" => Some(Fault::Stall),
        // The source's (vmm/src/migration/send.rs), and none.
        "source-crash-before-pause" | "none" => None,
        other => {
            tracing::warn!("FARVM_MIGRATION_FAULT={other}: unknown fault, ignored (known: crash-before-takeover, no-answer-after-takeover, stall-before-takeover, source-crash-before-pause, none)");
            None
        }
    }
}
