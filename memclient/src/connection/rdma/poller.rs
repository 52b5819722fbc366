//! The RDMA link's poller thread and what it watches: completions nobody polls inline, request
//! timeouts, the control connection, and a send queue that stalled (the kick; docs/rdma.md,
//! "Why one-sided requests stalled").

use super::*;

impl RdmaLink {
    /// The link's counters and its queue pair's state, for warnings and stall reports.
    pub(super) fn diagnosis(&self) -> String {
        format!(
            "{}; queue pair state {}",
            self.counters.summary(),
            self.qp.state()
        )
    }

    /// Whether the control connection says the server went away (it never sends after the
    /// bootstrap: readable means closed or broken).
    pub(super) fn control_closed(&self) -> bool {
        // A grant being asked for: its reply is what makes the socket readable.
        let Ok(_g) = self.grant_lock.try_lock() else {
            return false;
        };
        let mut p = libc::pollfd {
            fd: self.ctl.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack; the socket is owned by `self.ctl`.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r > 0
    }

    /// Fails requests in flight past their deadline (`expired`: scratch space, its capacity
    /// bounding how many per call).
    pub(super) fn expire(&self, expired: &mut Vec<u32>) {
        {
            let mut s = self.sched();
            s.q.expire(Instant::now(), expired);
            self.inflight_hint.store(s.q.inflight, Ordering::SeqCst);
        }
        if !expired.is_empty() {
            tracing::warn!(
                server = self.server,
                n = expired.len(),
                "requests timed out; {}",
                self.diagnosis()
            );
            self.dispatch();
            for t in expired.drain(..) {
                self.sink
                    .complete(t, self.server, Err(ClientError::Timeout));
            }
        }
    }

    /// The poller thread: completions nobody polls inline, timeouts, and the control
    /// connection. After [`SPIN_ROUNDS`] polls that find nothing it arms the completion queue
    /// and sleeps on its completion channel (and the control connection) until a completion
    /// arrives: an idle link costs no CPU. With requests in flight it wakes at least every
    /// [`BUSY_WAIT`] to enforce their timeouts.
    pub(super) fn poller(self: Arc<Self>) {
        let mut last_check = Instant::now();
        let mut quiet = 0u32;
        let mut expired = Vec::with_capacity(self.limits.depth);
        loop {
            if self.is_broken() {
                return;
            }
            if last_check.elapsed() >= EXPIRE_EVERY {
                last_check = Instant::now();
                if self.control_closed() {
                    if !self.is_broken() {
                        tracing::warn!(server = self.server, "RDMA session closed by the server");
                    }
                    self.fail_all();
                    return;
                }
                self.expire(&mut expired);
                if !self.kick_if_stalled() {
                    return;
                }
            }
            let Some(handled) = self.try_poll() else {
                return;
            };
            if handled > 0 {
                quiet = 0;
                continue;
            }
            quiet += 1;
            if quiet < SPIN_ROUNDS {
                std::thread::yield_now();
                continue;
            }
            if let Err(rc) = self.qp.arm() {
                tracing::warn!(
                    server = self.server,
                    rc,
                    "arming the completion queue failed"
                );
                self.fail_all();
                return;
            }
            // A completion that arrived before the CQ was armed raises no event.
            match self.try_poll() {
                None => return,
                Some(n) if n > 0 => {
                    quiet = 0;
                    continue;
                }
                Some(_) => {}
            }
            let busy = self.inflight_hint.load(Ordering::SeqCst) > 0;
            // The control connection wakes us when the server closes it, except while a grant
            // is asked for (its reply makes it readable).
            let ctl = self
                .grant_lock
                .try_lock()
                .is_ok()
                .then(|| self.ctl.as_raw_fd());
            Counters::add(&self.counters.sleeps, 1);
            self.sleeping.store(true, Ordering::SeqCst);
            let ctl_readable = self.qp.wait(ctl, if busy { BUSY_WAIT } else { IDLE_WAIT });
            self.sleeping.store(false, Ordering::SeqCst);
            if ctl_readable {
                last_check = Instant::now() - EXPIRE_EVERY;
            }
            // Poll a few times before sleeping again.
            quiet = SPIN_ROUNDS - 4;
        }
    }

    /// Nanoseconds since the link opened.
    pub(super) fn now_ns(&self) -> u64 {
        self.opened.elapsed().as_nanos() as u64
    }

    /// Notes a post or a completion (the send queue moved).
    pub(super) fn touch(&self) {
        self.last_activity.store(self.now_ns(), Ordering::Relaxed);
    }

    /// Kicks the send queue when requests are in flight and neither a post nor a completion
    /// happened for [`KICK_AFTER`] (nor a kick). False when the kick could not be posted (the
    /// link failed).
    pub(super) fn kick_if_stalled(&self) -> bool {
        if self.inflight_hint.load(Ordering::SeqCst) == 0 || self.is_broken() {
            return true;
        }
        let now = self.now_ns();
        let last = self
            .last_activity
            .load(Ordering::Relaxed)
            .max(self.last_kick.load(Ordering::Relaxed));
        if now.saturating_sub(last) < KICK_AFTER.as_nanos() as u64 {
            return true;
        }
        self.last_kick.store(now, Ordering::Relaxed);
        self.kick_pending.store(true, Ordering::Relaxed);
        Counters::add(&self.counters.kicks, 1);
        let rc = self.qp.post_kick();
        if rc != 0 {
            tracing::warn!(server = self.server, rc, "kicking the send queue failed");
            self.fail_all();
            return false;
        }
        true
    }

    /// Polls the completion queue once unless another thread does: `Some(handled)`, or
    /// `None` when the link failed.
    pub(super) fn try_poll(&self) -> Option<usize> {
        match self.poll.try_lock() {
            Ok(_p) => self.poll_once(),
            Err(_) => Some(0),
        }
    }
}
