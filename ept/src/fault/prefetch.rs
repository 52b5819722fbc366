//! The fault handler's side of prefetching: what the prefetcher is told and what it answers.
//! Owns the prefetcher and the page space (only the fault thread calls them), the round's
//! demand faults (the prefetcher is consulted after the round's demand reads are out), the
//! candidates buffer, and the queue of candidates deferred by the limits. Fixed buffers: no
//! allocation per fault.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use farvm_prefetch::{Candidates, Prefetcher};

use crate::installer::Installer;
use crate::procstats::ProcRef;
use crate::stats::{Counter, Counters};
use crate::sys::uffd::MAX_EVENTS;
use crate::translate::PageSpace;
use crate::vcpu::{Attribution, VcpuTable};

pub(super) struct Learner {
    prefetcher: Box<dyn Prefetcher>,
    space: Box<dyn PageSpace>,
    cands: Candidates,
    /// Demand faults of this round: (process key, its per-process entry, guest page).
    round: [(u64, ProcRef, u64); MAX_EVENTS],
    n: usize,
    installer: Arc<Installer>,
    vcpus: Arc<VcpuTable>,
    counters: Arc<Counters>,
    /// `EngineConfig::global_history` (switchable at run time): every fault goes to the
    /// global history.
    global: Arc<AtomicBool>,
}

impl Learner {
    pub fn new(
        prefetcher: Box<dyn Prefetcher>,
        space: Box<dyn PageSpace>,
        installer: Arc<Installer>,
        vcpus: Arc<VcpuTable>,
        counters: Arc<Counters>,
        global: Arc<AtomicBool>,
    ) -> Self {
        Self {
            global,
            prefetcher,
            space,
            cands: Candidates::new(),
            round: [(0, ProcRef::NONE, 0); MAX_EVENTS],
            n: 0,
            installer,
            vcpus,
            counters,
        }
    }

    /// Who faulted, for a fault by thread `tid`: its vCPU and what that vCPU's agent slot
    /// says runs there.
    pub fn attribute(&self, tid: u32) -> Attribution {
        let installer = &*self.installer;
        // SAFETY: registered slot pages are pinned resident (`Engine::set_agent_slot`) and in
        // bounds of the alias mapping, which lives as long as the installer.
        unsafe { self.vcpus.attribute(tid, |page| installer.alias_ptr(page)) }
    }

    /// The prefetcher's process key of an attribution: its CR3 as the page space names
    /// processes (0 — the global history — without a vCPU or a slot, or with one global
    /// history asked for).
    pub fn process_key(&self, a: &Attribution) -> u64 {
        if self.global.load(Ordering::Relaxed) {
            return crate::translate::GLOBAL_KEY;
        }
        self.space.process_key(a.key())
    }

    /// Remembers a demand fault of this round for the prefetcher (consulted after the round's
    /// demand reads are on their way), by process `key` whose entry is `owner`.
    pub fn note_fault(&mut self, key: u64, owner: ProcRef, p: u64) {
        if self.n < self.round.len() {
            self.round[self.n] = (key, owner, p);
            self.n += 1;
        }
    }

    /// Ends the round: how many faults it noted (see [`Learner::consult`]).
    pub fn end_round(&mut self) -> usize {
        std::mem::take(&mut self.n)
    }

    /// Tells the prefetcher of the round's `i`-th fault; its answer is in the candidates.
    /// Returns the history the fault went to (the process's, or the global one for a page
    /// the process's user mapping does not place) and the fault's per-process entry.
    pub fn consult(&mut self, i: usize, now: u64) -> (u64, ProcRef) {
        let (key, owner, p) = self.round[i];
        let (key, pf) = self.space.to_prefetch(&*self.installer, key, p);
        self.prefetcher.on_fault(key, pf, now, &mut self.cands);
        (key, owner)
    }

    /// Process `key` reached page `p` of a prefetch: a marker (staged or still in flight) is
    /// answered with the prefetcher's next window, in the candidates. Returns the history the
    /// hit went to (as [`Learner::consult`]).
    pub fn hit(&mut self, key: u64, p: u64, marker: bool, now: u64) -> u64 {
        let (key, pf) = self.space.to_prefetch(&*self.installer, key, p);
        if marker {
            self.prefetcher.on_marker_hit(key, pf, now, &mut self.cands);
        } else {
            self.prefetcher.on_hit(key, pf, now);
        }
        key
    }

    /// Process `key` reached page `p` of a prefetch still in flight (a late hit): a marker is
    /// answered as by [`Learner::hit`], any other page with what the prefetcher fetches
    /// further ahead (the guest caught up with its reads), in the candidates. Returns the
    /// history the hit went to.
    pub fn late_hit(&mut self, key: u64, p: u64, marker: bool, now: u64) -> u64 {
        if marker {
            return self.hit(key, p, true, now);
        }
        let (key, pf) = self.space.to_prefetch(&*self.installer, key, p);
        self.prefetcher.on_late_hit(key, pf, now, &mut self.cands);
        key
    }

    pub fn candidates(&self) -> usize {
        self.cands.len()
    }

    /// Candidate `j` as (the guest page it maps to, if any; marker).
    pub fn candidate(&mut self, key: u64, j: usize) -> (Option<u64>, bool) {
        let (cand, marker) = (self.cands.as_slice()[j], self.cands.is_marker(j));
        let p = self
            .space
            .to_guest(&*self.installer, key, cand)
            .filter(|&p| p < self.installer.pages());
        (p, marker)
    }

    /// Copies the page space's counts into the engine's counters (stores, not adds: the space
    /// keeps the totals).
    pub fn publish_counts(&self) {
        let w = self.space.counts();
        let c = &self.counters;
        c.set(Counter::PageTableWalks, w.walks);
        c.set(Counter::FaultsSeenVirtual, w.translated);
        c.set(Counter::FaultsSeenPhysical, w.untranslated);
        c.set(Counter::CandidatesUnmapped, w.unmapped_candidates);
    }
}

/// Deferred prefetch candidates kept at most.
const DEFERRED: usize = 512;

/// Candidates the limits refused, kept for when frames or in-flight slots free up: a dropped
/// candidate is one the prefetcher believes was fetched, and a stream pipeline that lost one
/// window keeps running ahead of the guest (measured with leap+stream). Bounded: the oldest
/// are dropped, and so are stale ones (the guest has likely passed).
pub(super) struct Deferred {
    /// (page, marker, the process it is for, since ns).
    q: VecDeque<(u64, bool, ProcRef, u64)>,
    max_age_ns: u64,
    counters: Arc<Counters>,
}

impl Deferred {
    pub fn new(max_age_ns: u64, counters: Arc<Counters>) -> Self {
        Self {
            q: VecDeque::with_capacity(DEFERRED),
            max_age_ns,
            counters,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }

    pub fn push(&mut self, p: u64, marker: bool, owner: ProcRef, now: u64) {
        self.counters.inc(Counter::PrefetchDeferred);
        // Never grows past the capacity allocated up front.
        if self.q.len() == self.q.capacity() {
            self.q.pop_front();
            self.counters.inc(Counter::PrefetchDropped);
        }
        self.q.push_back((p, marker, owner, now));
    }

    /// The oldest candidate still fresh (stale ones are dropped on the way), left queued.
    pub fn oldest(&mut self, now: u64) -> Option<(u64, bool, ProcRef)> {
        while let Some(&(p, marker, owner, since)) = self.q.front() {
            if now.saturating_sub(since) <= self.max_age_ns {
                return Some((p, marker, owner));
            }
            // Too late to be ahead of the guest: spend the frame on fresher candidates.
            self.q.pop_front();
            self.counters.inc(Counter::PrefetchDropped);
        }
        None
    }

    /// Removes the candidate [`Deferred::oldest`] returned (it was issued or skipped).
    pub fn pop(&mut self) {
        self.q.pop_front();
    }
}
