//! Spatial footprints (`--footprint`), as Spatial Memory Streaming (Somogyi et al., ISCA 2006)
//! without the instruction address it keys its patterns by: per process, the pages of each
//! aligned block of [`BLOCK`] pages a *generation* touched (from the first fault in the block
//! until the process has faulted G more times), remembered by the offset of the generation's
//! first fault; a first fault in a block fetches the pages the last generation with the same
//! first offset touched.

use std::collections::{HashMap, HashSet};

use farvm_prefetch::{Candidates, PageNo, ProcessKey};

/// Pages per block.
const BLOCK: u64 = 16;

/// A block's generation in progress: pages touched (bit per page), the process's fault count
/// when it began, and the offset of its first fault.
#[derive(Clone, Copy)]
struct Generation {
    touched: u16,
    began: u64,
    trigger: u8,
}

/// The footprint table of every process.
#[derive(Default)]
pub(crate) struct Footprints {
    /// Faults a generation lasts.
    generation: u64,
    /// Fewest pages a footprint must hold to be fetched.
    min_pages: u32,
    /// Whether fetched pages are markers (their use then counts towards the footprint).
    markers: bool,
    open: HashMap<(ProcessKey, PageNo), Generation>,
    /// (process, first offset) → pages the last such generation touched.
    patterns: HashMap<(ProcessKey, u8), u16>,
    faults: HashMap<ProcessKey, u64>,
    outstanding: HashSet<(ProcessKey, PageNo)>,
}

impl Footprints {
    pub(crate) fn new(generation: u64, min_pages: u32, markers: bool) -> Self {
        Self {
            generation,
            min_pages,
            markers,
            ..Self::default()
        }
    }

    /// A fault: closes the process's generations that are over, adds the page to its block's
    /// generation or begins one, and (with `out`) fetches the pattern of a new generation.
    pub(crate) fn fault(&mut self, key: ProcessKey, page: PageNo, out: Option<&mut Candidates>) {
        let count = self.faults.entry(key).or_default();
        *count += 1;
        let now = *count;
        let over: Vec<(PageNo, Generation)> = self
            .open
            .iter()
            .filter(|(&(k, _), g)| k == key && now - g.began >= self.generation)
            .map(|(&(_, b), &g)| (b, g))
            .collect();
        for (block, g) in over {
            self.open.remove(&(key, block));
            self.patterns.insert((key, g.trigger), g.touched);
        }
        let (block, offset) = (page / BLOCK, (page % BLOCK) as u8);
        if let Some(g) = self.open.get_mut(&(key, block)) {
            g.touched |= 1 << offset;
            return;
        }
        let g = Generation {
            touched: 1 << offset,
            began: now,
            trigger: offset,
        };
        self.open.insert((key, block), g);
        let (Some(out), Some(&pattern)) = (out, self.patterns.get(&(key, offset))) else {
            return;
        };
        if pattern.count_ones() < self.min_pages {
            return;
        }
        for o in (0..BLOCK as u8).filter(|&o| o != offset && pattern & (1 << o) != 0) {
            let q = block * BLOCK + u64::from(o);
            if self.markers {
                if out.push_distinct_marker(q) {
                    self.outstanding.insert((key, q));
                }
            } else {
                out.push_distinct(q);
            }
        }
    }

    /// A marker hit: whether it was one of the footprints' (its page then joins its block's
    /// generation).
    pub(crate) fn marker_hit(&mut self, key: ProcessKey, page: PageNo) -> bool {
        if !self.outstanding.remove(&(key, page)) {
            return false;
        }
        if let Some(g) = self.open.get_mut(&(key, page / BLOCK)) {
            g.touched |= 1 << (page % BLOCK);
        }
        true
    }
}
