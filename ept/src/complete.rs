//! The completion path: runs on whatever thread the store delivers on (no hop to another
//! thread: on this host a thread wake-up costs 5–50 µs). A read that landed is fingerprinted,
//! then either staged (markers / probes: left unmapped so the first touch reveals the hit) or
//! installed with UFFDIO_CONTINUE — waking the vCPU for demand reads, without a wake for
//! prefetches (that is the injection), followed by a stage-2 pre-fault where supported.

use std::sync::atomic::Ordering;

use crate::engine::Inner;
use crate::error::EngineError;
use crate::state::{self as st, state_of};
use crate::stats::Hist;
use crate::store::{Completion, Op, Status};
use crate::PAGE_SIZE;

/// Injected pages mapped per batch of completions (a stack array, no allocation).
const INJECT_BATCH: usize = 64;

impl Inner {
    pub(crate) fn on_completions(&self, batch: &[Completion]) {
        // Injected prefetches of this batch are mapped together at the end, one
        // UFFDIO_CONTINUE per run of neighbours (0.3-0.5 us per page instead of ~1.2 us per
        // call, research notes); demand pages are mapped and woken immediately.
        let mut inject = [0u64; INJECT_BATCH];
        let mut n = 0;
        for c in batch {
            match c.op {
                Op::Read => {
                    if c.page >= self.pages() {
                        tracing::error!("store completed a read of unknown page {:#x}", c.page);
                        continue;
                    }
                    self.outstanding.fetch_sub(1, Ordering::AcqRel);
                    if let Some(p) = self.read_done(c.page, c.status) {
                        inject[n] = p;
                        n += 1;
                        if n == INJECT_BATCH {
                            self.map_injected(&mut inject[..n]);
                            n = 0;
                        }
                    }
                }
                Op::Write => {
                    self.outstanding.fetch_sub(1, Ordering::AcqRel);
                    if self.wb_tx.try_send(*c).is_err() {
                        tracing::error!("write-back completion queue overflow");
                    }
                    self.wake_evictor();
                }
            }
        }
        if n > 0 {
            self.map_injected(&mut inject[..n]);
        }
    }

    /// Maps claimed injected pages (LOCAL, pinned) in runs, then pre-faults stage 2.
    fn map_injected(&self, pages: &mut [u64]) {
        pages.sort_unstable();
        let c = &self.counters;
        let _ = crate::sys::mem::for_runs(pages, |start, n| {
            self.map_pinned(start, n, false);
            c.prefetch_injected.fetch_add(n, Ordering::Relaxed);
            if let Some(ok) = self
                .stage2
                .pre_fault(start * PAGE_SIZE as u64, n * PAGE_SIZE as u64)
            {
                c.prefault_calls.fetch_add(1, Ordering::Relaxed);
                if !ok {
                    c.prefault_unsupported.fetch_add(1, Ordering::Relaxed);
                }
            }
            Ok(())
        });
    }

    /// Handles one read completion from outside a batch (failed submissions, VMM reads).
    pub(crate) fn on_read_done(&self, p: u64, status: Status) {
        if let Some(p) = self.read_done(p, status) {
            self.map_injected(&mut [p]);
        }
    }

    /// Returns `Some(p)` for a page claimed for injection that the caller must map
    /// ([`Inner::map_injected`]).
    fn read_done(&self, p: u64, status: Status) -> Option<u64> {
        let now = self.now();
        let c = &self.counters;
        let w0 = self.table.load(p);
        if state_of(w0) != st::INFLIGHT {
            tracing::error!(
                "read completion for guest page {p:#x} that is not in flight ({w0:#x})"
            );
            return None;
        }
        if w0 & st::F_PF_READ != 0 {
            self.prefetch_inflight.fetch_sub(1, Ordering::Relaxed);
        }
        match status {
            Status::Ok => {
                c.bytes_read.fetch_add(PAGE_SIZE as u64, Ordering::Relaxed);
                let fp = self.fingerprint(p);
                self.set_clean_fp(p, fp);
                let submitted = self.t_io[p as usize].load(Ordering::Relaxed);
                self.hist
                    .record(Hist::StoreRead, now.saturating_sub(submitted));
                return self.install_arrived(p, now);
            }
            Status::Absent => {
                c.remote_absent.fetch_add(1, Ordering::Relaxed);
                // Pages become REMOTE only when the engine wrote them back: the servers lost
                // it. LOST for good (another read would say the same); whoever waits on it is
                // reported, a prefetch that found it is not (the guest may never need it).
                self.push_error(EngineError::PageLost {
                    gpa: p * PAGE_SIZE as u64,
                });
                let r = self.table.update(p, |w| {
                    (state_of(w) == st::INFLIGHT).then_some(st::pins_only(w) | st::LOST)
                });
                if let Ok((old, _)) = r {
                    self.release_frame();
                    if old & (st::F_DEMAND | st::F_WAITERS) != 0 {
                        self.lost_page_accessed(p);
                    }
                }
            }
            Status::Failed(error) => {
                c.store_errors.fetch_add(1, Ordering::Relaxed);
                self.push_error(EngineError::Store {
                    op: "read",
                    gpa: p * PAGE_SIZE as u64,
                    error,
                });
                // Somebody waits on it (a vCPU, or a VMM access): it stays INFLIGHT with its
                // frame, so the waiters keep waiting and no second read of it can start, and
                // the fault thread reads it again after a back-off — one retry chain per page,
                // however long the store is unavailable. Nobody waits: drop the read.
                let r = self.table.update(p, |w| {
                    if state_of(w) != st::INFLIGHT {
                        None
                    } else if w & (st::F_DEMAND | st::F_WAITERS) != 0 {
                        Some(w & !st::F_PF_READ)
                    } else {
                        Some(st::pins_only(w) | st::REMOTE)
                    }
                });
                match r {
                    Ok((_, new)) if state_of(new) == st::INFLIGHT => {
                        let _ = self.retry_tx.send(p);
                        self.kick.kick();
                    }
                    Ok(_) => self.release_frame(),
                    Err(_) => {}
                }
            }
        }
        None
    }

    /// Stages or installs a page whose data just landed in the memfd. Returns `Some(p)` when
    /// the page was claimed for injection (LOCAL, pinned) and still has to be mapped.
    fn install_arrived(&self, p: u64, now: u64) -> Option<u64> {
        let c = &self.counters;
        loop {
            let w = self.table.load(p);
            let waiters = w & (st::F_WAITERS | st::F_DEMAND) != 0;
            if w & st::F_MARKER != 0 && !waiters {
                let staged = st::pins_only(w)
                    | st::STAGED
                    | st::F_PREFETCHED
                    | st::F_REF
                    | (w & st::F_PROBE);
                self.t_io[p as usize].store(now, Ordering::Relaxed);
                if self.table.cas(p, w, staged).is_err() {
                    continue;
                }
                c.prefetch_staged.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            let old = self.claim_local(p, |w| {
                if w & (st::F_WAITERS | st::F_DEMAND) != 0 {
                    w & (st::F_CONSUMED | st::F_HOT)
                } else {
                    st::F_PREFETCHED
                }
            });
            if old & (st::F_WAITERS | st::F_DEMAND) == 0 {
                // Injection: mapped with its neighbours by the caller, nobody to wake.
                return Some(p);
            }
            // Map without waking, then wake, timing each apart: the woken vCPU often takes
            // this CPU before the wake call returns (2 cores), which is neither install cost
            // nor time the vCPU spent waiting.
            self.map_pinned(p, 1, false);
            let mapped = self.now();
            self.hist.record(Hist::Install, mapped.saturating_sub(now));
            let t0 = self.t_fault[p as usize].load(Ordering::Relaxed);
            if old & st::F_DEMAND != 0 && t0 != 0 {
                self.hist
                    .record(Hist::FaultService, mapped.saturating_sub(t0));
            }
            if let Err(e) = self
                .uffd
                .wake(self.ram.guest_page_addr(p), PAGE_SIZE as u64)
            {
                tracing::error!("UFFDIO_WAKE of guest page {p:#x}: {e}");
            }
            self.hist
                .record(Hist::Wake, self.now().saturating_sub(mapped));
            return None;
        }
    }
}
