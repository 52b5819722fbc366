//! One vCPU thread as its owner sees it: a request channel, a response channel and a kick (the
//! shape of Firecracker's `VcpuHandle`). A request waits in the channel until the thread is
//! between two KVM_RUNs; the kick makes that now (KVM_RUN returns at once, even if the signal
//! lands just before the thread enters it). A thread blocked in the host kernel — a fault on a
//! page not yet fetched — answers when the fault is served.

use std::os::unix::thread::JoinHandleExt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};

use super::state::VcpuState;
use crate::signals;

/// What a vCPU thread is asked to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VcpuEvent {
    /// Run the guest (sent once, when every thread of the VM is ready).
    Start,
    /// Leave the guest and park until [`VcpuEvent::Resume`] or the VM's end.
    Pause,
    /// Run the guest again after a pause.
    Resume,
    /// Report the vCPU's state ([`VcpuResponse::State`]).
    DumpState,
    /// Read the vCPU's full state for a snapshot ([`VcpuResponse::Saved`]); asked of a parked
    /// thread.
    SaveState,
}

/// A vCPU's state as its thread read it for a snapshot, or why KVM refused. Answers compare by
/// identity (two reads are two answers), which is all the handles' matching needs.
#[derive(Clone, Debug)]
pub struct SavedState(pub Arc<Result<VcpuState, String>>);

impl PartialEq for SavedState {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SavedState {}

/// What a vCPU thread answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VcpuResponse {
    /// The thread is up (its host thread id); it waits for [`VcpuEvent::Start`].
    Ready {
        /// `gettid()` of the thread.
        tid: i32,
    },
    /// Parked outside the guest.
    Paused,
    /// Running the guest again.
    Resumed,
    /// The vCPU's state, in words.
    State(String),
    /// The vCPU's full state ([`VcpuEvent::SaveState`]).
    Saved(SavedState),
}

/// The owner's end of one vCPU thread (module doc).
pub struct VcpuHandle {
    index: u32,
    events: Sender<VcpuEvent>,
    responses: Receiver<VcpuResponse>,
    pthread: libc::pthread_t,
    /// `None` once joined: a joined thread is never kicked.
    thread: Option<JoinHandle<()>>,
}

impl VcpuHandle {
    pub(super) fn new(
        index: u32,
        events: Sender<VcpuEvent>,
        responses: Receiver<VcpuResponse>,
        thread: JoinHandle<()>,
    ) -> Self {
        VcpuHandle {
            index,
            events,
            responses,
            pthread: thread.as_pthread_t(),
            thread: Some(thread),
        }
    }

    /// The vCPU's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The thread's pthread id (valid until [`VcpuHandle::join`]).
    pub(super) fn pthread(&self) -> libc::pthread_t {
        self.pthread
    }

    /// Drops answers to earlier requests nobody waited for (a report that came after its
    /// deadline), so the next answer read is to the next request.
    pub fn discard_stale(&self) {
        while self.responses.try_recv().is_ok() {}
    }

    /// Queues `event` and kicks the thread out of the guest to see it. Returns false if the
    /// thread has ended.
    pub fn send(&self, event: VcpuEvent) -> bool {
        if self.thread.is_none() || self.events.send(event).is_err() {
            return false;
        }
        signals::kick(self.pthread);
        true
    }

    /// Waits until `deadline` for an answer `want` accepts; answers it does not accept are
    /// dropped (late answers to earlier requests). `None`: no such answer in time, or the
    /// thread has ended.
    pub fn answer<T>(
        &self,
        deadline: Instant,
        mut want: impl FnMut(VcpuResponse) -> Option<T>,
    ) -> Option<T> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.responses.recv_timeout(left) {
                Ok(r) => {
                    if let Some(t) = want(r) {
                        return Some(t);
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Waits up to `timeout` for the thread's first answer, its thread id.
    pub(super) fn ready(&self, timeout: Duration) -> Option<i32> {
        self.answer(Instant::now() + timeout, |r| match r {
            VcpuResponse::Ready { tid } => Some(tid),
            _ => None,
        })
    }

    /// Joins the thread (it must be stopping: the VM's outcome decided).
    pub(super) fn join(&mut self) {
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("vcpu{}: the thread panicked", self.index);
            }
        }
    }
}
