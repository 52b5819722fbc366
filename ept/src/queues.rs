//! The queues between the engine's threads and the signals that wake and stop them:
//! - retries: pages whose failed demand read must be read again (completion path → fault
//!   handler, which holds them for the retry back-off; failure path only);
//! - write-back completions (completion path → evictor);
//! - the fault handler's doorbell (an eventfd in its epoll set: frames freed, a retry queued,
//!   stop) and the stop flag every thread polls.
//!
//! (The evictor sleeps in `park`, so its wake-up lives with the frame budget that triggers it.)

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
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
    stop: AtomicBool,
}

impl Queues {
    pub fn new() -> Result<Self, EngineError> {
        Ok(Self {
            retry: crossbeam_channel::unbounded(),
            written: crossbeam_channel::bounded(WRITTEN),
            kick: EventFd::new().map_err(|e| EngineError::os("eventfd", e))?,
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
