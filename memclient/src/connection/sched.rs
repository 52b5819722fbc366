//! The request scheduler both links share: a table of request slots, the demand and prefetch
//! queues in front of the window, request ids, timeouts and the account of a stall.
//!
//! Up to `window` requests are in flight; more wait in two queues, and a queued demand request
//! always goes before queued prefetches. Prefetches may use only `window - demand_reserve`
//! slots, so a demand read never waits behind a full window of prefetches. A request's id is
//! its slot (low 16 bits) and a generation, so a late answer to a request that timed out is
//! told apart from the slot's next request.
//!
//! A slot whose response is being landed is *receiving*: only the thread landing it finishes
//! it, so a failure or timeout elsewhere never hands the buffer back while pages are copied
//! in. A request may be *ordered*: it is not sent while requests that are not are in flight
//! (the RDMA link's one-sided requests wait for its SENDs, which the server applies later).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::ConnLimits;
use crate::{ClientError, Priority};

/// Where a request slot is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum SlotState {
    Free,
    Queued,
    InFlight,
    /// Its response is being landed by the thread that claimed it.
    Receiving,
}

#[derive(Clone, Copy)]
pub(crate) struct Slot {
    pub state: SlotState,
    pub req_id: u64,
    pub ticket: u32,
    /// From when it was sent: time spent queued says nothing about the server's health.
    pub deadline: Instant,
    /// Waits for the unordered requests in flight (see module docs).
    pub ordered: bool,
}

/// A request that may be sent now: its slot, id and ticket, and whether it is ordered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Go {
    pub slot: u16,
    pub req_id: u64,
    pub ticket: u32,
    pub ordered: bool,
}

/// What [`Sched::fail_all`] and [`Sched::expire`] found.
pub(crate) struct Failed {
    /// The link was already broken (nothing done).
    pub already: bool,
    /// A response stopped arriving mid-landing (expire only).
    pub stuck_receiving: bool,
}

pub(crate) struct Sched {
    pub slots: Vec<Slot>,
    free: Vec<u16>,
    demand: VecDeque<u16>,
    prefetch: VecDeque<u16>,
    pub inflight: usize,
    /// Unordered requests in flight.
    unordered: usize,
    generation: u64,
    pub broken: bool,
    limits: ConnLimits,
}

impl Sched {
    /// `limits.depth` slots, all free.
    pub fn new(limits: ConnLimits) -> Self {
        let depth = limits.depth;
        let now = Instant::now();
        Self {
            slots: vec![
                Slot {
                    state: SlotState::Free,
                    req_id: 0,
                    ticket: 0,
                    deadline: now,
                    ordered: false,
                };
                depth
            ],
            free: (0..depth as u16).rev().collect(),
            demand: VecDeque::with_capacity(depth),
            prefetch: VecDeque::with_capacity(depth),
            inflight: 0,
            unordered: 0,
            generation: 1,
            broken: false,
            limits,
        }
    }

    fn window_allows(&self, prio: Priority) -> bool {
        match prio {
            Priority::Demand => self.inflight < self.limits.window,
            Priority::Prefetch => self.inflight < self.limits.window - self.limits.demand_reserve,
        }
    }

    fn may_send(&self, ordered: bool) -> bool {
        !ordered || self.unordered == 0
    }

    fn launch(&mut self, slot: u16) -> Go {
        let sl = &mut self.slots[slot as usize];
        sl.state = SlotState::InFlight;
        sl.deadline = Instant::now() + self.limits.timeout;
        self.inflight += 1;
        if !sl.ordered {
            self.unordered += 1;
        }
        Go {
            slot,
            req_id: sl.req_id,
            ticket: sl.ticket,
            ordered: sl.ordered,
        }
    }

    /// Admits `ticket`: `Ok(Some(go))` when the caller sends it now (`may_go`: it may, and
    /// the window, the queues and ordering allow), `Ok(None)` when it was queued.
    pub fn admit(
        &mut self,
        ticket: u32,
        prio: Priority,
        ordered: bool,
        may_go: bool,
    ) -> Result<Option<Go>, ClientError> {
        if self.broken {
            return Err(ClientError::Disconnected);
        }
        let Some(slot) = self.free.pop() else {
            return Err(ClientError::QueueFull);
        };
        self.generation += 1;
        let queues_empty = match prio {
            Priority::Demand => self.demand.is_empty(),
            Priority::Prefetch => self.demand.is_empty() && self.prefetch.is_empty(),
        };
        let go = may_go && queues_empty && self.window_allows(prio) && self.may_send(ordered);
        self.slots[slot as usize] = Slot {
            state: SlotState::Queued,
            req_id: self.generation << 16 | slot as u64,
            ticket,
            deadline: Instant::now() + self.limits.timeout,
            ordered,
        };
        if go {
            return Ok(Some(self.launch(slot)));
        }
        match prio {
            Priority::Demand => self.demand.push_back(slot),
            Priority::Prefetch => self.prefetch.push_back(slot),
        }
        Ok(None)
    }

    /// The next queued request the window (and ordering) lets go, marked in flight.
    pub fn next(&mut self) -> Option<Go> {
        if self.broken {
            return None;
        }
        let pick = |q: &VecDeque<u16>, s: &Self, prio| {
            q.front()
                .copied()
                .filter(|&i| s.window_allows(prio) && s.may_send(s.slots[i as usize].ordered))
        };
        let slot = if let Some(i) = pick(&self.demand, self, Priority::Demand) {
            self.demand.pop_front();
            i
        } else if self.demand.is_empty() || !self.window_allows(Priority::Demand) {
            let i = pick(&self.prefetch, self, Priority::Prefetch)?;
            self.prefetch.pop_front();
            i
        } else {
            return None;
        };
        Some(self.launch(slot))
    }

    /// Whether requests wait in the queues.
    pub fn has_queued(&self) -> bool {
        !self.demand.is_empty() || !self.prefetch.is_empty()
    }

    /// Claims the slot of response `req_id` (compared on the bits of `mask`) for landing: its
    /// slot and ticket, or `None` for a late answer to a request that already timed out.
    pub fn claim(&mut self, req_id: u64, mask: u64) -> Option<(usize, u32)> {
        let slot = (req_id & 0xffff) as usize;
        match self.slots.get_mut(slot) {
            Some(sl) if sl.req_id & mask == req_id & mask && sl.state == SlotState::InFlight => {
                sl.state = SlotState::Receiving;
                Some((slot, sl.ticket))
            }
            _ => None,
        }
    }

    fn retire(&mut self, i: usize) {
        self.inflight -= 1;
        if !self.slots[i].ordered {
            self.unordered -= 1;
        }
        self.slots[i].state = SlotState::Free;
        self.free.push(i as u16);
    }

    /// Frees a slot its lander finished; false if it was not receiving (failed meanwhile).
    pub fn finish(&mut self, slot: usize) -> bool {
        let owned = self.slots[slot].state == SlotState::Receiving;
        if owned {
            self.retire(slot);
        }
        owned
    }

    /// Marks the link broken and frees every queued or in-flight slot, pushing its ticket to
    /// `failed`; a slot being landed stays (its lander finishes it).
    pub fn fail_all(&mut self, failed: &mut Vec<u32>) -> Failed {
        if self.broken {
            return Failed {
                already: true,
                stuck_receiving: false,
            };
        }
        self.broken = true;
        let (mut receiving, mut unordered) = (0, 0);
        for i in 0..self.slots.len() {
            let sl = self.slots[i];
            match sl.state {
                SlotState::Free => {}
                SlotState::Receiving => {
                    receiving += 1;
                    unordered += !sl.ordered as usize;
                }
                SlotState::Queued | SlotState::InFlight => {
                    failed.push(sl.ticket);
                    self.slots[i].state = SlotState::Free;
                    self.free.push(i as u16);
                }
            }
        }
        self.demand.clear();
        self.prefetch.clear();
        self.inflight = receiving;
        self.unordered = unordered;
        Failed {
            already: false,
            stuck_receiving: false,
        }
    }

    /// Frees in-flight slots past their deadline, pushing their tickets to `expired` (at
    /// most its spare capacity, so nothing allocates); reports a slot whose landing outlived
    /// its deadline.
    pub fn expire(&mut self, now: Instant, expired: &mut Vec<u32>) -> Failed {
        let mut stuck_receiving = false;
        for i in 0..self.slots.len() {
            let sl = self.slots[i];
            if sl.deadline > now {
                continue;
            }
            match sl.state {
                SlotState::InFlight if expired.len() < expired.capacity() => {
                    self.retire(i);
                    expired.push(sl.ticket);
                }
                SlotState::Receiving => stuck_receiving = true,
                _ => {}
            }
        }
        Failed {
            already: self.broken,
            stuck_receiving,
        }
    }

    /// Requests queued or in flight.
    pub fn outstanding(&self) -> usize {
        self.limits.depth - self.free.len()
    }

    /// How long the oldest request in flight has been, if one is.
    pub fn oldest(&self, now: Instant) -> Option<Duration> {
        self.slots
            .iter()
            .filter(|sl| matches!(sl.state, SlotState::InFlight | SlotState::Receiving))
            .map(|sl| {
                self.limits
                    .timeout
                    .saturating_sub(sl.deadline.saturating_duration_since(now))
            })
            .max()
    }

    /// "N in flight, D demand + P prefetch queued", for stall reports.
    pub fn summary(&self) -> String {
        format!(
            "{} in flight, {} demand + {} prefetch queued",
            self.inflight,
            self.demand.len(),
            self.prefetch.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(window: usize, reserve: usize, depth: usize) -> ConnLimits {
        ConnLimits {
            window,
            demand_reserve: reserve,
            depth,
            timeout: Duration::from_secs(3600),
        }
    }

    #[test]
    fn window_queues_and_demand_first() {
        let mut s = Sched::new(limits(2, 1, 8));
        let a = s
            .admit(1, Priority::Prefetch, false, true)
            .unwrap()
            .unwrap();
        // The reserve keeps the second window slot for demand.
        assert_eq!(s.admit(2, Priority::Prefetch, false, true).unwrap(), None);
        let d = s.admit(3, Priority::Demand, false, true).unwrap().unwrap();
        assert_eq!(d.ticket, 3);
        assert_eq!(s.admit(4, Priority::Demand, false, true).unwrap(), None);
        assert_eq!(s.next(), None, "window full");
        assert_eq!(s.claim(a.req_id, u64::MAX), Some((a.slot as usize, 1)));
        assert!(s.finish(a.slot as usize));
        assert_eq!(
            s.next().unwrap().ticket,
            4,
            "queued demand before queued prefetch"
        );
        assert_eq!(s.outstanding(), 3);
        let late = s.claim(a.req_id, u64::MAX);
        assert_eq!(late, None, "a finished request's id is never claimed again");
    }

    #[test]
    fn ordered_requests_wait_for_unordered_ones() {
        let mut s = Sched::new(limits(4, 0, 8));
        let u = s.admit(1, Priority::Demand, false, true).unwrap().unwrap();
        assert_eq!(s.admit(2, Priority::Demand, true, true).unwrap(), None);
        assert_eq!(
            s.next(),
            None,
            "an ordered request waits for the SEND in flight"
        );
        s.claim(u.req_id, u64::MAX).unwrap();
        assert!(s.finish(u.slot as usize));
        let o = s.next().unwrap();
        assert!(o.ordered && o.ticket == 2);
        // Ordered requests do not hold each other back, nor unordered ones.
        assert!(s.admit(3, Priority::Demand, true, true).unwrap().is_some());
        assert!(s.admit(4, Priority::Demand, false, true).unwrap().is_some());
    }

    #[test]
    fn failure_and_timeouts_free_slots_but_not_one_being_landed() {
        let mut s = Sched::new(limits(4, 0, 4));
        let a = s.admit(1, Priority::Demand, false, true).unwrap().unwrap();
        let _b = s.admit(2, Priority::Demand, false, true).unwrap().unwrap();
        s.admit(3, Priority::Demand, false, false).unwrap();
        s.claim(a.req_id, u64::MAX).unwrap();
        let mut expired = Vec::with_capacity(8);
        let f = s.expire(Instant::now() + Duration::from_secs(7200), &mut expired);
        assert_eq!(expired, vec![2]);
        assert!(f.stuck_receiving);
        let mut failed = Vec::new();
        assert!(!s.fail_all(&mut failed).already);
        assert_eq!(failed, vec![3]);
        assert_eq!(s.inflight, 1, "the slot being landed stays");
        assert!(s.fail_all(&mut failed).already);
        assert!(matches!(
            s.admit(9, Priority::Demand, false, true),
            Err(ClientError::Disconnected)
        ));
        assert!(s.finish(a.slot as usize));
        assert_eq!(s.outstanding(), 0);
    }
}
