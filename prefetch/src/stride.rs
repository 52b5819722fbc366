//! The `stride` baseline (Leap Table 2's "Stride"): when the last two deltas of a process are
//! equal and non-zero, fetch N pages along that stride; otherwise nothing. Its history is two
//! accesses, so one irregular access breaks it for two faults.

use crate::slots::SlotTable;
use crate::{Candidates, Nanos, PageNo, Prefetcher, ProcessKey};

#[derive(Clone, Copy, Debug, Default)]
struct StrideState {
    last: Option<PageNo>,
    delta: i64,
}

/// Classic two-delta stride detector.
pub struct Stride {
    n: usize,
    per_process: bool,
    slots: SlotTable,
    states: Box<[StrideState]>,
}

impl Stride {
    /// Proposes `n` pages along a stride seen twice in a row; `slots` streams tracked, per process if `per_process`.
    pub fn new(n: usize, slots: usize, per_process: bool) -> Self {
        let slots = slots.max(1);
        Self {
            n,
            per_process,
            slots: SlotTable::new(slots),
            states: vec![StrideState::default(); slots].into_boxed_slice(),
        }
    }
}

impl Prefetcher for Stride {
    fn name(&self) -> &'static str {
        "stride"
    }
    fn on_fault(&mut self, key: ProcessKey, page: PageNo, _now: Nanos, out: &mut Candidates) {
        out.clear();
        let slot = self.slots.acquire(if self.per_process { key } else { 0 });
        let st = &mut self.states[slot.index];
        if slot.fresh {
            *st = StrideState::default();
        }
        let Some(last) = st.last.replace(page) else {
            return;
        };
        let delta = page.wrapping_sub(last) as i64;
        if delta != 0 && delta == st.delta {
            let mut p = page;
            for _ in 0..self.n {
                match p.checked_add_signed(delta) {
                    Some(next) => p = next,
                    None => break,
                }
                out.push(p);
            }
        }
        st.delta = delta;
    }
    fn on_hit(&mut self, _key: ProcessKey, _page: PageNo, _now: Nanos) {}
    fn forget(&mut self, key: ProcessKey) {
        self.slots.remove(if self.per_process { key } else { 0 });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_delta_prefetches_along_it() {
        let mut p = Stride::new(3, 4, true);
        let mut out = Candidates::new();
        p.on_fault(1, 100, 0, &mut out);
        p.on_fault(1, 90, 1, &mut out);
        assert!(out.is_empty());
        p.on_fault(1, 80, 2, &mut out);
        assert_eq!(out.as_slice(), &[70, 60, 50]);
        p.on_fault(1, 5, 3, &mut out);
        assert!(out.is_empty());
        p.on_fault(2, 5, 3, &mut out);
        assert!(out.is_empty(), "other processes have their own history");
    }
}
