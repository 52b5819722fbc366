//! The queues between the engine's threads and the signals that wake and stop them:
//! - retries: pages whose failed demand read must be read again (completion path → fault
//!   handler, which holds them for the retry back-off; failure path only);
//! - write-back completions (completion path → evictor);
//! - the fault handler's doorbell (an eventfd in its epoll set: frames freed while it waits
//!   for some, a retry queued, stop) and the stop flag every thread polls.
//!
//! (The evictor sleeps in `park`, so its wake-up lives with the frame budget that triggers it.)

use std::os::fd::RawFd;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};

use crate::error::EngineError;
use crate::store::{Completion, GuestPage};
use crate::sys::poll::EventFd;

/// Write-back completions not yet taken by the evictor (at most a few rounds' worth).
const WRITTEN: usize = 4096;

pub(crate) struct Queues {
    retry: (Sender<GuestPage>, Receiver<GuestPage>),
    written: (Sender<Completion>, Receiver<Completion>),
    kick: EventFd,
    /// The fault handler holds faults parked or prefetches deferred for want of a frame: the
    /// evictor's freed frames are worth its wake-up. Without them the wake-up would be for
    /// nothing, and it is not cheap: the fault handler shares its CPU with vCPU 0, which it
    /// preempts (every eviction round rang the doorbell before, about as often as the vCPU
    /// blocked on a sequential scan).
    waiting_for_frames: AtomicBool,
    stop: AtomicBool,
}

impl Queues {
    pub fn new() -> Result<Self, EngineError> {
        Ok(Self {
            retry: crossbeam_channel::unbounded(),
            written: crossbeam_channel::bounded(WRITTEN),
            kick: EventFd::new().map_err(|e| EngineError::os("eventfd", e))?,
            waiting_for_frames: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        })
    }

    /// Queues page `p` (INFLIGHT, its failed read owned by the retry) for another read and
    /// wakes the fault handler.
    pub fn retry_later(&self, p: GuestPage) {
        let _ = self.retry.0.send(p);
        self.kick();
    }

    /// The next page queued by [`Queues::retry_later`].
    #[inline]
    pub fn next_retry(&self) -> Option<GuestPage> {
        self.retry.1.try_recv().ok()
    }

    /// Hands a write-back completion to the evictor; false if its queue overflowed.
    pub fn written(&self, c: Completion) -> bool {
        self.written.0.try_send(c).is_ok()
    }

    /// The next write-back completion, waiting up to `timeout` (zero: no wait).
    pub fn next_written(&self, timeout: Duration) -> Option<Completion> {
        if timeout.is_zero() {
            self.written.1.try_recv().ok()
        } else {
            self.written.1.recv_timeout(timeout).ok()
        }
    }

    /// Rings the fault handler's doorbell.
    #[inline]
    pub fn kick(&self) {
        self.kick.kick();
    }

    /// The fault handler, before it waits: whether it holds work that waits for frames. After
    /// setting it, it must look at the frame count again before sleeping (see
    /// [`Queues::frames_freed`]).
    pub fn set_waiting_for_frames(&self, waiting: bool) {
        self.waiting_for_frames.store(waiting, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }

    /// The evictor, after a round gave frames back: rings the doorbell if the fault handler
    /// waits for frames. The fences pair with [`Queues::set_waiting_for_frames`]: either this
    /// sees the flag, or the fault handler's look at the frame count after setting it sees the
    /// frames freed here.
    pub fn frames_freed(&self) {
        fence(Ordering::SeqCst);
        if self.waiting_for_frames.load(Ordering::Relaxed) {
            self.kick();
        }
    }

    /// Clears the doorbell (the fault handler, after waking on it).
    pub fn drain_kick(&self) {
        self.kick.drain();
    }

    /// The doorbell, for the fault handler's epoll set.
    pub fn kick_fd(&self) -> RawFd {
        self.kick.raw_fd()
    }

    /// Tells every thread to stop (and rings the fault handler's doorbell).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.kick();
    }

    #[inline]
    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Freed frames ring the fault handler's doorbell only while it waits for some: it shares
    /// its CPU with vCPU 0, so a wake-up for nothing costs the guest.
    #[test]
    fn freed_frames_ring_the_doorbell_only_while_the_fault_handler_waits_for_them() {
        let q = Queues::new().unwrap();
        q.frames_freed();
        assert!(!q.kick.drain(), "nothing waits for frames: no wake-up");
        q.set_waiting_for_frames(true);
        q.frames_freed();
        assert!(q.kick.drain(), "a parked fault waits: woken");
        q.set_waiting_for_frames(false);
        q.frames_freed();
        assert!(!q.kick.drain(), "waits no more: no wake-up");
    }
}
