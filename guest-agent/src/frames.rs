//! The test guest's physical-frame order: which guest-physical frame its allocator hands out
//! n-th, as a pure function shared by the kernel and the VMM (bulk op `FRAME_BATCH`).
//!
//! Order model. A long-running OS's free list is not sorted: after hours of allocation and
//! freeing, consecutive allocations land on physically scattered frames, in runs whose length
//! depends on fragmentation (Linux's buddy allocator hands out runs of 2^order frames; with
//! `page_alloc.shuffle` it shuffles them). The test guest models that with a seeded pseudo-random
//! *permutation* of all free frames:
//! - the free frames are every 4 KiB frame of guest RAM at or above the kernel's first free
//!   GPA, in RAM-range order (the MMIO hole is skipped);
//! - they are grouped into runs of `1 << run_shift` frames (a last partial run stays whole);
//! - runs are handed out in the order of a keyed bijection of their index (a 4-round Feistel
//!   network over the next even power of two, cycle-walked into range), frames inside a run in
//!   ascending order;
//! - seed 0 means no shuffle: ascending physical order.
//!
//! Because the order is a bijection computed per position, nothing is stored and any position
//! can be computed independently (O(1) expected, ~4 Feistel evaluations worst on average).

use crate::boot::MemRange;
use crate::PAGE_SIZE;

/// Maximum RAM ranges a [`FrameOrder`] follows (matches `boot::MAX_RAM_RANGES`).
pub const MAX_RANGES: usize = crate::boot::MAX_RAM_RANGES;

/// The shuffled order of free frames. `Copy`, no allocation, `no_std`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameOrder {
    seed: u64,
    run_shift: u32,
    /// Free frames per range (after clipping at `first_free_gpa`), and where each starts.
    starts: [u64; MAX_RANGES],
    counts: [u64; MAX_RANGES],
    nranges: usize,
    total: u64,
    /// Number of runs, and the Feistel half width in bits.
    nruns: u64,
    half_bits: u32,
}

impl FrameOrder {
    /// The free-frame order for `ranges` (ascending, page aligned; extra ranges beyond
    /// [`MAX_RANGES`] are ignored) clipped to `first_free_gpa..`. `run_shift` is capped at 20.
    pub fn new(seed: u64, run_shift: u32, first_free_gpa: u64, ranges: &[MemRange]) -> Self {
        let mut starts = [0u64; MAX_RANGES];
        let mut counts = [0u64; MAX_RANGES];
        let mut n = 0usize;
        let mut total = 0u64;
        for r in ranges.iter().take(MAX_RANGES) {
            let end = r.gpa.saturating_add(r.len) & !(PAGE_SIZE - 1);
            let start = align_up(r.gpa.max(first_free_gpa));
            if start >= end {
                continue;
            }
            starts[n] = start;
            counts[n] = (end - start) / PAGE_SIZE;
            total += counts[n];
            n += 1;
        }
        let run_shift = run_shift.min(20);
        let nruns = total.div_ceil(1u64 << run_shift);
        // Smallest even bit width covering nruns, so the walk's domain is < 4 * nruns.
        let bits = 64 - nruns.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        FrameOrder {
            seed,
            run_shift,
            starts,
            counts,
            nranges: n,
            total,
            nruns,
            half_bits,
        }
    }

    /// Number of free frames in the order.
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Whether there is no free frame.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Physical index (ascending position among free frames) of the frame handed out at
    /// position `pos`, or `None` past the end.
    pub fn physical_index(&self, pos: u64) -> Option<u64> {
        if pos >= self.total {
            return None;
        }
        if self.seed == 0 {
            return Some(pos);
        }
        let run = pos >> self.run_shift;
        let within = pos & ((1u64 << self.run_shift) - 1);
        let last_run = self.nruns - 1;
        let last_len = self.total - (last_run << self.run_shift);
        // The permuted run may be the short last run: positions are assigned run by run, so a
        // bijection of run indices alone would leave holes. Keep the short last run in place
        // (it is the last position's run too) and permute the full runs among themselves.
        let full_runs = if last_len == (1u64 << self.run_shift) {
            self.nruns
        } else {
            last_run
        };
        let target = if run < full_runs {
            self.permute(run, full_runs)
        } else {
            run
        };
        Some((target << self.run_shift) | within)
    }

    /// GPA of the frame handed out at position `pos`, or `None` past the end.
    pub fn frame_gpa(&self, pos: u64) -> Option<u64> {
        let mut idx = self.physical_index(pos)?;
        for i in 0..self.nranges {
            if idx < self.counts[i] {
                return Some(self.starts[i] + idx * PAGE_SIZE);
            }
            idx -= self.counts[i];
        }
        None
    }

    /// A bijection of `0..n` keyed by the seed: Feistel network on `2 * half_bits` bits,
    /// cycle-walked until the value falls in range (terminates: the walk follows the cycle of
    /// a permutation that contains `x < n`).
    fn permute(&self, x: u64, n: u64) -> u64 {
        let mut v = x;
        loop {
            v = self.feistel(v);
            if v < n {
                return v;
            }
        }
    }

    fn feistel(&self, v: u64) -> u64 {
        let h = self.half_bits;
        let mask = (1u64 << h) - 1;
        let mut l = v >> h;
        let mut r = v & mask;
        let mut round = 0u64;
        while round < 4 {
            let f = mix(r ^ self.seed.rotate_left(round as u32 * 17) ^ (round << 56)) & mask;
            let nl = r;
            r = l ^ f;
            l = nl;
            round += 1;
        }
        (l << h) | r
    }
}

/// splitmix64's finalizer: a cheap, well-mixed 64-bit hash.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn align_up(x: u64) -> u64 {
    x.div_ceil(PAGE_SIZE) * PAGE_SIZE
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::collections::HashSet;
    use std::vec::Vec;

    fn order(seed: u64, shift: u32, ranges: &[MemRange], first: u64) -> Vec<u64> {
        let o = FrameOrder::new(seed, shift, first, ranges);
        (0..o.len()).map(|p| o.frame_gpa(p).unwrap()).collect()
    }

    #[test]
    fn is_a_permutation_of_the_free_frames() {
        let ranges = [
            MemRange {
                gpa: 0,
                len: 3 << 20,
            },
            MemRange {
                gpa: 4 << 20,
                len: (1 << 20) + 4096 * 3,
            },
        ];
        for &(seed, shift) in &[(1u64, 0u32), (42, 0), (7, 3), (9, 4), (0, 0)] {
            let v = order(seed, shift, &ranges, 0x10_0000);
            let want: HashSet<u64> = (0x10_0000..(3 << 20))
                .step_by(4096)
                .chain(((4 << 20)..(5 << 20) + 4096 * 3).step_by(4096))
                .collect();
            assert_eq!(v.len(), want.len());
            let got: HashSet<u64> = v.iter().copied().collect();
            assert_eq!(got, want, "seed {seed} shift {shift}");
        }
    }

    #[test]
    fn seed_zero_is_ascending_and_seeds_shuffle() {
        let ranges = [MemRange {
            gpa: 0,
            len: 64 << 20,
        }];
        let asc = order(0, 0, &ranges, 1 << 20);
        assert!(asc.windows(2).all(|w| w[1] == w[0] + 4096));
        let a = order(1, 0, &ranges, 1 << 20);
        let b = order(2, 0, &ranges, 1 << 20);
        assert_ne!(a, b);
        // Scattered: few consecutive allocations are physically adjacent.
        let adjacent = a.windows(2).filter(|w| w[1] == w[0] + 4096).count();
        assert!(adjacent < a.len() / 100, "{adjacent} adjacent pairs");
        // Deterministic.
        assert_eq!(a, order(1, 0, &ranges, 1 << 20));
    }

    #[test]
    fn runs_stay_contiguous() {
        let ranges = [MemRange {
            gpa: 0,
            len: 16 << 20,
        }];
        let v = order(5, 4, &ranges, 0);
        for run in v.chunks(16) {
            assert!(run.windows(2).all(|w| w[1] == w[0] + 4096));
            assert_eq!(run[0] % (16 * 4096), 0);
        }
    }

    #[test]
    fn past_the_end_is_none() {
        let o = FrameOrder::new(3, 0, 0, &[MemRange { gpa: 0, len: 40960 }]);
        assert_eq!(o.len(), 10);
        assert!(o.frame_gpa(10).is_none());
        let empty = FrameOrder::new(3, 0, 1 << 30, &[MemRange { gpa: 0, len: 40960 }]);
        assert!(empty.is_empty() && empty.frame_gpa(0).is_none());
    }
}
