//! A VM's vCPU threads as one: spawned (each reports its thread id, then waits), started
//! together, paused and resumed together, asked for their state, and joined once the VM's end
//! is decided. Every request goes through the threads' [`VcpuHandle`]s, one request at a time
//! (the handles' lock): pause, state reports and a snapshot's state reads are requests on
//! these handles.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvm_ioctls::VcpuFd;

use super::exits::VcpuExits;
use super::handle::{VcpuEvent, VcpuHandle, VcpuResponse};
use super::run::VcpuThread;
use super::state::VcpuState;
use crate::vstate::lock;
use crate::vstate::outcome::{OutcomeLatch, VmOutcome};

/// How long a new vCPU thread has to report its thread id.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the vCPUs did not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// The VM's outcome is decided: its vCPUs are leaving.
    #[error("the VM is stopping")]
    Stopping,
    /// Not every vCPU left the guest in time (one blocked in the host, e.g. on a page fault
    /// not yet served); the others were resumed.
    #[error("the vCPUs did not leave the guest within {0:?}")]
    PauseTimeout(Duration),
    /// A snapshot's state read needs every vCPU parked.
    #[error("the vCPUs are not paused")]
    NotPaused,
    /// A vCPU did not answer a state read in time.
    #[error("vcpu{0} did not report its state in time")]
    NoAnswer(u32),
    /// KVM refused to read a vCPU's state.
    #[error("cannot read the state of vcpu{index}: {message}")]
    ReadState {
        /// The vCPU.
        index: u32,
        /// KVM's error.
        message: String,
    },
}

/// A vCPU thread could not be spawned.
#[derive(Debug, thiserror::Error)]
#[error("cannot start thread vcpu{index}: {source}")]
pub struct SpawnError {
    /// The vCPU.
    pub index: u32,
    /// The OS error.
    pub source: std::io::Error,
}

/// The vCPU threads of one VM (module doc).
pub struct VcpuGroup {
    latch: Arc<OutcomeLatch>,
    /// The lock serialises requests, so each answer read is to the request just sent.
    handles: Mutex<Vec<VcpuHandle>>,
    tids: Vec<i32>,
    paused: AtomicBool,
}

impl VcpuGroup {
    /// Spawns one thread per vCPU, `vcpu0`, `vcpu1`, … (libvirt and the paging engine rely on
    /// the names), and waits (bounded) for each to report its thread id. The threads do not
    /// run the guest before [`VcpuGroup::start`]. `hlt_in_guest`: the VM's HLT exits are
    /// disabled ([`crate::vstate::vm::KvmVm::hlt_in_guest`]).
    pub fn spawn(
        fds: Vec<VcpuFd>,
        exits: Arc<dyn VcpuExits>,
        latch: Arc<OutcomeLatch>,
        hlt_in_guest: bool,
    ) -> Result<Self, SpawnError> {
        // A vCPU saving its state reads KVM's MSR list, which opens /dev/kvm: read it here,
        // before the threads exist, so that their seccomp filter need not allow opening files.
        // An error is the save's to report, when it asks again.
        let _ = super::state::msr_index_list();
        let mut handles = Vec::with_capacity(fds.len());
        for (index, fd) in (0u32..).zip(fds) {
            let (events_tx, events) = crossbeam_channel::unbounded();
            let (responses, responses_rx) = crossbeam_channel::unbounded();
            let thread = VcpuThread {
                index,
                fd,
                exits: exits.clone(),
                latch: latch.clone(),
                events,
                responses,
                hlt_in_guest,
            };
            match std::thread::Builder::new()
                .name(format!("vcpu{index}"))
                .spawn(move || {
                    farvm_sandbox::enter(farvm_sandbox::ThreadClass::Vcpu);
                    thread.run()
                }) {
                Ok(t) => handles.push(VcpuHandle::new(index, events_tx, responses_rx, t)),
                Err(source) => {
                    // The threads spawned so far wait for a start: the decided outcome ends
                    // their wait.
                    latch.decide(VmOutcome::HostError {
                        message: format!("cannot spawn vcpu{index}: {source}"),
                    });
                    for mut h in handles {
                        h.join();
                    }
                    return Err(SpawnError { index, source });
                }
            }
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        let tids = handles
            .iter()
            .map(|h| {
                h.ready(deadline.saturating_duration_since(Instant::now()))
                    .unwrap_or_else(|| {
                        tracing::warn!("vcpu{}: no thread id within {READY_TIMEOUT:?}", h.index());
                        0
                    })
            })
            .collect();
        latch.watch_vcpu_threads(handles.iter().map(VcpuHandle::pthread).collect());
        Ok(VcpuGroup {
            latch,
            handles: Mutex::new(handles),
            tids,
            paused: AtomicBool::new(false),
        })
    }

    /// Lets every thread run the guest.
    pub fn start(&self) {
        for h in lock(&self.handles).iter() {
            h.send(VcpuEvent::Start);
        }
    }

    /// Host thread ids of the vCPU threads, in index order (0: one never reported).
    pub fn tids(&self) -> &[i32] {
        &self.tids
    }

    /// Whether every vCPU is parked by [`VcpuGroup::pause`].
    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Parks every vCPU outside the guest; returns once all are parked, or after `timeout`
    /// with the ones that parked resumed. Pausing a paused group does nothing.
    pub fn pause(&self, timeout: Duration) -> Result<(), VcpuError> {
        let handles = lock(&self.handles);
        if self.latch.stopping() {
            return Err(VcpuError::Stopping);
        }
        if self.is_paused() {
            return Ok(());
        }
        for h in handles.iter() {
            h.discard_stale();
            h.send(VcpuEvent::Pause);
        }
        let deadline = Instant::now() + timeout;
        for h in handles.iter() {
            // In slices, so that a stop meanwhile ends the wait.
            loop {
                let slice = (Instant::now() + Duration::from_millis(50)).min(deadline);
                if h.answer(slice, |r| (r == VcpuResponse::Paused).then_some(()))
                    .is_some()
                {
                    break;
                }
                if self.latch.stopping() {
                    return Err(VcpuError::Stopping);
                }
                if Instant::now() >= deadline {
                    // The late ones park when they get to it and see the resume right after.
                    for h in handles.iter() {
                        h.send(VcpuEvent::Resume);
                    }
                    return Err(VcpuError::PauseTimeout(timeout));
                }
            }
        }
        self.paused.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Lets paused vCPUs run the guest again (waits, bounded by `timeout`, for each to say
    /// so; a parked thread answers at once).
    pub fn resume(&self, timeout: Duration) {
        let handles = lock(&self.handles);
        self.paused.store(false, Ordering::SeqCst);
        for h in handles.iter() {
            h.discard_stale();
            h.send(VcpuEvent::Resume);
        }
        let deadline = Instant::now() + timeout;
        for h in handles.iter() {
            if h.answer(deadline, |r| (r == VcpuResponse::Resumed).then_some(()))
                .is_none()
            {
                tracing::warn!(
                    "vcpu{}: no answer to the resume within {timeout:?}",
                    h.index()
                );
            }
        }
    }

    /// Each vCPU's state report (see [`VcpuEvent::DumpState`]); `None` for one that did not
    /// answer within `timeout` (its thread blocked in the host, e.g. in a fault on a page not
    /// yet fetched).
    pub fn dump(&self, timeout: Duration) -> Vec<Option<String>> {
        let handles = lock(&self.handles);
        ask_all(&handles, VcpuEvent::DumpState, timeout, |r| match r {
            VcpuResponse::State(s) => Some(s),
            _ => None,
        })
    }

    /// Every vCPU's full state, read by its parked thread (the group must be paused: the
    /// state of a vCPU running the guest would be stale as soon as read).
    pub fn save_states(&self, timeout: Duration) -> Result<Vec<VcpuState>, VcpuError> {
        let handles = lock(&self.handles);
        if self.latch.stopping() {
            return Err(VcpuError::Stopping);
        }
        if !self.is_paused() {
            return Err(VcpuError::NotPaused);
        }
        let answers = ask_all(&handles, VcpuEvent::SaveState, timeout, |r| match r {
            VcpuResponse::Saved(s) => Some(s),
            _ => None,
        });
        (0u32..)
            .zip(answers)
            .map(|(index, saved)| {
                let saved = saved.ok_or(VcpuError::NoAnswer(index))?;
                // The answer is the thread's only copy, handed over.
                match Arc::try_unwrap(saved.0) {
                    Ok(Ok(state)) => Ok(state),
                    Ok(Err(message)) => Err(VcpuError::ReadState { index, message }),
                    Err(_) => Err(VcpuError::NoAnswer(index)),
                }
            })
            .collect()
    }

    /// Joins every thread. Call once the VM's outcome is decided (the threads end then).
    pub fn join(&self) {
        self.latch.forget_vcpu_threads();
        for h in lock(&self.handles).iter_mut() {
            h.join();
        }
    }
}

/// Sends `event` to every thread and returns each one's answer that `want` accepts (`None`:
/// none within `timeout`). The caller holds the handles' lock, so the answers are to this
/// request.
fn ask_all<T>(
    handles: &[VcpuHandle],
    event: VcpuEvent,
    timeout: Duration,
    want: impl Fn(VcpuResponse) -> Option<T>,
) -> Vec<Option<T>> {
    for h in handles {
        h.discard_stale();
        h.send(event);
    }
    let deadline = Instant::now() + timeout;
    handles.iter().map(|h| h.answer(deadline, &want)).collect()
}
