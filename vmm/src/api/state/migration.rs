//! `vm.send-migration` and `vm.receive-migration` on the API's VM: live migration of a pool
//! VM ([`crate::migration`]) between two API servers, the stream sealed with the host
//! config's `migration_key_file`. The source migrates its running VM and stops it; the
//! destination, with no VM created, waits on the body's address, builds the VM the source
//! describes while its pre-copy arrives, loads what arrived as `vm.restore` loads a
//! snapshot, answers the source once it is loaded (and owns its namespace in the pool), and
//! runs it.

use std::os::fd::{AsFd, AsRawFd};

use farvm_chapi::error::StateName;
use farvm_chapi::ApiError;
use farvm_seal::PageKey;

use super::{ApiState, Launch, Run, Slot};
use crate::api::events::Source;
use crate::migration::{Arrival, Arriving, Incoming};
use crate::vm::Vm;
use crate::vstate::lock;

/// How often a receive waiting for its source checks that the VMM is not stopping, ms.
const WAIT_TICK_MS: i32 = 500;

/// The action `vm.send-migration` names in its errors.
const SEND: &str = "send a migration";
/// The action `vm.receive-migration` names in its errors.
pub(super) const RECEIVE: &str = "receive a migration";

impl ApiState {
    /// The migration key of the host config (`migration_key_file`): without one, neither
    /// end of a migration runs.
    fn migration_key(&self, action: &'static str) -> Result<PageKey, ApiError> {
        let path = self
            .factory
            .migration_key_file(&self.name)?
            .ok_or_else(|| ApiError::Failed {
                action,
                reason: "this host has no migration key: set migration_key_file in the host \
                         config (a file of 32 bytes or 64 hex digits, mode 0600 or 0400, that \
                         the hosts a VM migrates between share)"
                    .into(),
            })?;
        PageKey::from_file(&path).map_err(|e| ApiError::Failed {
            action,
            reason: format!("the host config's migration_key_file: {e}"),
        })
    }

    /// `vm.send-migration`: live-migrates the running (or paused) VM to the farvm receiving at
    /// the body's `tcp:HOST:PORT`; once the destination runs it, it stops here
    /// (`vm:migration-started`, `vm:migration-finished`). A migration that fails leaves the VM
    /// running here.
    pub fn send_migration(&self, body: &[u8]) -> Result<(), ApiError> {
        let to = farvm_chapi::migration::destination(body)?;
        let mut slot = lock(&self.slot);
        let vm = Self::running(&slot, SEND)?;
        let key = self.migration_key(SEND)?;
        let spec = &slot
            .created
            .as_ref()
            .ok_or(ApiError::NotCreated { action: SEND })?
            .prepared
            .spec;
        self.emit(Source::Vm, "migration-started");
        let migrated = crate::migration::migrate(
            vm.shared(),
            spec,
            &to,
            &key,
            crate::migration::DEFAULT_DOWNTIME_LIMIT,
        )
        .map_err(|e| ApiError::Failed {
            action: SEND,
            reason: e.to_string(),
        })?;
        tracing::info!(
            vm = self.name,
            to = migrated.to,
            rounds = migrated.rounds,
            bytes_sent = migrated.bytes_sent,
            paused_ms = migrated.paused_secs * 1e3,
            "migrated"
        );
        // The VM runs at the destination now: finished here at once, so that `vm.info`
        // answers Shutdown as soon as this request is answered.
        if let Some(report) = slot.finish_running() {
            slot.run = Run::Stopped(Box::new(report));
        }
        drop(slot);
        self.emit(Source::Vm, "migration-finished");
        Ok(())
    }

    /// `vm.receive-migration`: with no VM created, waits on the body's `tcp:HOST:PORT` for a
    /// migrating VM and runs it (answered once it runs, or failed; a source that fails here
    /// keeps its VM).
    pub fn receive_migration(&self, body: &[u8]) -> Result<(), ApiError> {
        let addr = farvm_chapi::migration::receiver(body)?;
        let already = || ApiError::WrongState {
            action: RECEIVE,
            state: StateName::AlreadyCreated,
        };
        if lock(&self.slot).created.is_some() {
            return Err(already());
        }
        let failed = |reason: String| ApiError::Failed {
            action: RECEIVE,
            reason,
        };
        let key = self.migration_key(RECEIVE)?;
        // Private to this process and VM; it holds the page key until the VM is loaded.
        let dir = std::env::temp_dir().join(format!(
            "farvm-incoming-{}-{}",
            std::process::id(),
            self.name
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let incoming = Incoming::listen(addr).map_err(|e| failed(e.to_string()))?;
        tracing::info!(vm = self.name, %addr, "waiting for a migrating VM");
        // The slot is not held while the source is awaited: requests run one at a time, and
        // the VMM stays stoppable meanwhile.
        self.await_source(&incoming)?;
        let arriving = incoming.accept(&dir, &key).map_err(|e| {
            let _ = std::fs::remove_dir_all(&dir);
            failed(e.to_string())
        })?;
        let mut arriving = Some(arriving);
        let mut arrival = None;
        let mut slot = lock(&self.slot);
        let result = if slot.created.is_some() {
            Err(already())
        } else {
            self.build_arrival(&mut slot, &mut arriving, &mut arrival)
        };
        if let Err(e) = &result {
            if let Some(arrival) = arrival.take() {
                if let Err(a) = arrival.answer(Err(e.to_string())) {
                    tracing::warn!("migration: cannot tell the source the VM failed here: {a}");
                }
            }
        }
        drop(slot);
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    /// Waits until a source connects to `incoming`, or the VMM is told to stop (SIGTERM,
    /// SIGINT, its event monitor's reader gone), which fails the request: the server answers
    /// it and can stop.
    fn await_source(&self, incoming: &Incoming) -> Result<(), ApiError> {
        let failed = |reason: String| ApiError::Failed {
            action: RECEIVE,
            reason,
        };
        loop {
            if let Some(signal) = crate::signals::termination_requested() {
                return Err(failed(format!(
                    "the VMM is stopping (signal {signal}) before a source came"
                )));
            }
            if self.event_reader_gone() {
                return Err(failed(
                    "the VMM is stopping (its event monitor's reader left) before a source came"
                        .into(),
                ));
            }
            let mut pfd = libc::pollfd {
                fd: incoming.as_fd().as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd, valid for the call, on a listener that outlives it.
            let n = unsafe { libc::poll(&mut pfd, 1, WAIT_TICK_MS) };
            if n > 0 {
                return Ok(());
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(failed(format!("waiting for the source: {e}")));
                }
            }
        }
    }

    /// Builds the VM the source describes while its pre-copy arrives, loads it once the rest
    /// has, tells the source, and runs it; on failure the slot is as before and the arrival,
    /// if the stream arrived and was not answered yet, still to answer.
    fn build_arrival(
        &self,
        slot: &mut Slot,
        arriving: &mut Option<Arriving>,
        arrival: &mut Option<Arrival>,
    ) -> Result<(), ApiError> {
        let source = arriving.as_ref().ok_or_else(|| ApiError::Failed {
            action: RECEIVE,
            reason: "the migration stream was taken already".into(),
        })?;
        let mut spec = source.spec();
        // This host's name in the pool, not the source's.
        spec.remote.pool_options.host = None;
        self.adopt(slot, spec, RECEIVE, |cfg| {
            source.prepare(cfg).map_err(|e| e.to_string())
        })?;
        let launched = self.launch(slot, Launch::Arrive { arriving, arrival });
        if launched.is_err() {
            slot.created = None;
        }
        launched
    }
}

/// Receives the rest of the migration into `vm` (built, not started): the stream is taken
/// out of `arriving`, and what arrived is left in `arrival` for the answer.
pub(super) fn load(
    vm: &Vm,
    arriving: &mut Option<Arriving>,
    arrival: &mut Option<Arrival>,
) -> Result<(), ApiError> {
    let failed = |reason: String| ApiError::Failed {
        action: RECEIVE,
        reason,
    };
    let stream = arriving
        .take()
        .ok_or_else(|| failed("the migration stream was taken already".into()))?;
    let arrived = arrival.insert(stream.receive().map_err(|e| failed(e.to_string()))?);
    tracing::info!(
        bytes = arrived.bytes_received,
        "migration: the VM's state has arrived; loading it"
    );
    let snapshot = arrived.snapshot().map_err(|e| failed(e.to_string()))?;
    snapshot
        .restore_into(vm)
        .map_err(|e| failed(e.to_string()))?;
    // Last, just before the guest runs: its clocks move forward by the pause.
    arrived
        .resume_clocks(&snapshot, vm)
        .map_err(|e| failed(e.to_string()))
}

/// Tells the source the VM is loaded here and owns its namespace (it stops there).
pub(super) fn arrived(name: &str, arrival: Arrival) {
    match arrival.answer(Ok(())) {
        Ok(()) => tracing::info!(vm = name, "the migrated VM runs here"),
        // The takeover committed: the source learns it from the pool.
        Err(e) => tracing::warn!(
            vm = name,
            "migration: cannot tell the source the VM runs here ({e}); it learns it from the pool"
        ),
    }
}
