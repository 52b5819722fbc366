//! The best-offset table (`--best-offset`): which distances after a fault the process's next
//! faults land at.

use farvm_prefetch::{Candidates, PageNo};

/// Faults per round of the best-offset table (`--best-offset`).
const ROUND: u32 = 256;
/// Faults per process the best-offset table looks back on.
const OFFSET_HISTORY: usize = 64;

/// Per-process state of the best-offset table (`--best-offset`).
#[derive(Default)]
pub(crate) struct OffsetTable {
    recent: std::collections::VecDeque<PageNo>,
    /// Faults that landed d pages after a recent one, index d (0 unused).
    score: [u32; 9],
    faults: u32,
    chosen: [bool; 9],
}

impl OffsetTable {
    /// Scores the fault, closes the round when it is full, and proposes the chosen distances.
    pub(crate) fn fault(
        &mut self,
        page: PageNo,
        threshold: u32,
        print: bool,
        out: Option<&mut Candidates>,
    ) {
        for d in 1..=8u64 {
            if page
                .checked_sub(d)
                .is_some_and(|q| self.recent.contains(&q))
            {
                self.score[d as usize] += 1;
            }
        }
        self.recent.push_back(page);
        if self.recent.len() > OFFSET_HISTORY {
            self.recent.pop_front();
        }
        self.faults += 1;
        if self.faults == ROUND {
            if print {
                eprintln!(
                    "best-offset round, faults per distance 1..8: {:?}",
                    &self.score[1..]
                );
            }
            for d in 1..=8 {
                self.chosen[d] = self.score[d] * 100 >= threshold * ROUND;
                self.score[d] = 0;
            }
            self.faults = 0;
        }
        if let Some(out) = out {
            for d in (1..=8u64).filter(|&d| self.chosen[d as usize]) {
                out.push_distinct(page.saturating_add(d));
            }
        }
    }
}
