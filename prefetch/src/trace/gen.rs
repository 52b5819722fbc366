//! Synthetic trace generators.
//!
//! Each generator emits the page sequence a program would touch, one record per access to a
//! page *different from the previous access by the same reference* (array or pointer): a scan
//! over a 4 KiB page makes 512 word accesses but, for paging, one touch. Program data structures
//! are laid out page-aligned one after another from page 0, as in a fresh process heap.

use super::rng::{SplitMix64, Zipf};
use super::Trace;
use crate::{PageNo, ProcessKey};

const PAGE: u64 = 4096;

/// A synthetic workload.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// `passes` scans over pages `0..pages`.
    Sequential {
        /// Pages scanned.
        pages: u64,
        /// Scans.
        passes: u32,
    },
    /// `count` accesses to pages `0, stride, 2·stride, ...`, repeated `passes` times.
    Stride {
        /// Pages between accesses.
        stride: u64,
        /// Accesses per pass.
        count: u64,
        /// Passes.
        passes: u32,
    },
    /// `count` accesses uniformly at random in `0..pages`.
    Random {
        /// Pages drawn from.
        pages: u64,
        /// Accesses.
        count: u64,
        /// Random seed.
        seed: u64,
    },
    /// `count` accesses to page k with probability ∝ 1/(k+1)^θ in `0..pages`.
    Zipf {
        /// Pages drawn from (page k has rank k).
        pages: u64,
        /// Accesses.
        count: u64,
        /// Skew θ (0: uniform).
        theta: f64,
        /// Random seed.
        seed: u64,
    },
    /// C = A·B over n×n row-major f64 arrays; `block` = 0 for the naive i-j-k loop, else the
    /// tile size of the blocked loop.
    MatMul {
        /// Matrix dimension.
        n: u64,
        /// Tile size (0: naive loop).
        block: u64,
    },
    /// Pull-based PageRank over a CSR graph whose edge sources follow a power law.
    PageRank {
        /// Vertices of the graph.
        vertices: u64,
        /// Mean in-degree.
        degree: u64,
        /// Iterations.
        iters: u32,
        /// Random seed of the graph.
        seed: u64,
    },
    /// Hoare-partition quicksort of `elements` random u32.
    QuickSort {
        /// Elements sorted.
        elements: u64,
        /// Random seed of the input.
        seed: u64,
    },
    /// Process 1 scans `scan_pages` sequentially while process 2 touches random pages of its own
    /// `polluter_pages`; each access is the polluter's with probability `polluter_share`.
    Mix {
        /// Pages of the scanning process.
        scan_pages: u64,
        /// Pages of the random polluter.
        polluter_pages: u64,
        /// Probability that an access is the polluter's.
        polluter_share: f64,
        /// Random seed.
        seed: u64,
    },
    /// One process, two threads each scanning its own array of `pages`, interleaved access by
    /// access.
    TwoStream {
        /// Pages of each array.
        pages: u64,
    },
}

/// Why a workload cannot be generated.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid trace parameters: {0}")]
pub struct GenError(pub String);

/// Upper bound on records one generator may produce (keeps a typo from filling the disk).
pub const MAX_RECORDS: u64 = 1 << 32;

/// Emits a page each time a reference moves to a different page.
struct Toucher<'a> {
    last: [Option<PageNo>; 4],
    sink: &'a mut dyn FnMut(ProcessKey, PageNo),
}

impl Toucher<'_> {
    fn touch(&mut self, reference: usize, byte_addr: u64) {
        let page = byte_addr / PAGE;
        if self.last[reference] != Some(page) {
            self.last[reference] = Some(page);
            (self.sink)(1, page);
        }
    }
}

fn pages_for(bytes: u64) -> u64 {
    bytes.div_ceil(PAGE)
}

fn check(cond: bool, msg: impl FnOnce() -> String) -> Result<(), GenError> {
    if cond {
        Ok(())
    } else {
        Err(GenError(msg()))
    }
}

impl Workload {
    /// Checks parameters before any record is produced.
    pub fn validate(&self) -> Result<(), GenError> {
        match *self {
            Workload::Sequential { pages, passes } => {
                check(pages > 0 && passes > 0, || {
                    "sequential needs pages > 0 and passes > 0".into()
                })?;
                check(
                    pages.saturating_mul(u64::from(passes)) <= MAX_RECORDS,
                    || "too many records".into(),
                )
            }
            Workload::Stride {
                stride,
                count,
                passes,
            } => {
                check(stride > 0 && count > 0 && passes > 0, || {
                    "stride needs stride, count and passes > 0".into()
                })?;
                check(stride.checked_mul(count).is_some(), || {
                    "stride × count overflows the page range".into()
                })?;
                check(
                    count.saturating_mul(u64::from(passes)) <= MAX_RECORDS,
                    || "too many records".into(),
                )
            }
            Workload::Random { pages, count, .. } => {
                check(pages > 0 && count > 0, || {
                    "random needs pages > 0 and count > 0".into()
                })?;
                check(count <= MAX_RECORDS, || "too many records".into())
            }
            Workload::Zipf {
                pages,
                count,
                theta,
                ..
            } => {
                check(pages > 0 && count > 0, || {
                    "zipf needs pages > 0 and count > 0".into()
                })?;
                check(pages <= 1 << 26, || {
                    format!("zipf keeps a CDF per page: at most 2^26 pages, got {pages}")
                })?;
                check(theta.is_finite() && (0.0..=10.0).contains(&theta), || {
                    format!("zipf θ must be in [0, 10], got {theta}")
                })?;
                check(count <= MAX_RECORDS, || "too many records".into())
            }
            Workload::MatMul { n, block } => {
                check((1..=4096).contains(&n), || {
                    format!("matmul n must be in 1..=4096, got {n}")
                })?;
                check(block == 0 || (block <= n && n % block == 0), || {
                    format!("matmul block must be 0 (naive) or divide n = {n}, got {block}")
                })
            }
            Workload::PageRank {
                vertices,
                degree,
                iters,
                ..
            } => {
                check((2..=1 << 26).contains(&vertices), || {
                    format!("pagerank vertices must be in 2..=2^26, got {vertices}")
                })?;
                check((1..=1024).contains(&degree), || {
                    format!("pagerank degree must be in 1..=1024, got {degree}")
                })?;
                check(vertices * degree <= 1 << 28, || {
                    "pagerank graph too large (vertices × degree > 2^28)".into()
                })?;
                check(iters > 0, || "pagerank needs iters > 0".into())
            }
            Workload::QuickSort { elements, .. } => {
                check((2..=1 << 28).contains(&elements), || {
                    format!("quicksort elements must be in 2..=2^28, got {elements}")
                })
            }
            Workload::Mix {
                scan_pages,
                polluter_pages,
                polluter_share,
                ..
            } => {
                check(scan_pages > 0 && polluter_pages > 0, || {
                    "mix needs scan and polluter pages > 0".into()
                })?;
                check((0.0..1.0).contains(&polluter_share), || {
                    format!("polluter share must be in [0, 1), got {polluter_share}")
                })?;
                check(scan_pages <= MAX_RECORDS / 16, || "too many records".into())
            }
            Workload::TwoStream { pages } => check(pages > 0 && pages <= MAX_RECORDS / 2, || {
                "two-stream needs 0 < pages ≤ 2^31".into()
            }),
        }
    }

    /// Feeds every access to `sink` as `(process key, page)`.
    pub fn generate(&self, sink: &mut dyn FnMut(ProcessKey, PageNo)) -> Result<(), GenError> {
        self.validate()?;
        match *self {
            Workload::Sequential { pages, passes } => {
                for _ in 0..passes {
                    (0..pages).for_each(|p| sink(1, p));
                }
            }
            Workload::Stride {
                stride,
                count,
                passes,
            } => {
                for _ in 0..passes {
                    (0..count).for_each(|i| sink(1, i * stride));
                }
            }
            Workload::Random { pages, count, seed } => {
                let mut rng = SplitMix64::new(seed);
                (0..count).for_each(|_| sink(1, rng.below(pages)));
            }
            Workload::Zipf {
                pages,
                count,
                theta,
                seed,
            } => {
                let mut rng = SplitMix64::new(seed);
                let z = Zipf::new(pages as usize, theta);
                (0..count).for_each(|_| sink(1, z.sample(&mut rng)));
            }
            Workload::MatMul { n, block } => matmul(n, block, sink),
            Workload::PageRank {
                vertices,
                degree,
                iters,
                seed,
            } => pagerank(vertices, degree, iters, seed, sink),
            Workload::QuickSort { elements, seed } => quicksort(elements, seed, sink),
            Workload::Mix {
                scan_pages,
                polluter_pages,
                polluter_share,
                seed,
            } => {
                let mut rng = SplitMix64::new(seed);
                let mut next = 0;
                while next < scan_pages {
                    if rng.unit() < polluter_share {
                        sink(2, rng.below(polluter_pages));
                    } else {
                        sink(1, next);
                        next += 1;
                    }
                }
            }
            Workload::TwoStream { pages } => {
                // The second array starts 1 GiB (2^18 pages) past the end of the first.
                let b = pages + (1 << 18);
                for i in 0..pages {
                    sink(1, i);
                    sink(1, b + i);
                }
            }
        }
        Ok(())
    }

    /// The whole trace in memory (untimed: time = record index).
    pub fn trace(&self) -> Result<Trace, GenError> {
        let mut pairs = Vec::new();
        self.generate(&mut |k, p| pairs.push((k, p)))?;
        Ok(Trace::from_pairs(pairs))
    }
}

fn matmul(n: u64, block: u64, sink: &mut dyn FnMut(ProcessKey, PageNo)) {
    let bytes = n * n * 8;
    let a = 0;
    let b = pages_for(bytes) * PAGE;
    let c = b + pages_for(bytes) * PAGE;
    let mut t = Toucher {
        last: [None; 4],
        sink,
    };
    let bs = if block == 0 { n } else { block };
    for ii in (0..n).step_by(bs as usize) {
        for jj in (0..n).step_by(bs as usize) {
            for kk in (0..n).step_by(bs as usize) {
                for i in ii..ii + bs {
                    for j in jj..jj + bs {
                        t.touch(2, c + (i * n + j) * 8);
                        for k in kk..kk + bs {
                            t.touch(0, a + (i * n + k) * 8);
                            t.touch(1, b + (k * n + j) * 8);
                        }
                    }
                }
            }
        }
    }
}

fn pagerank(v: u64, degree: u64, iters: u32, seed: u64, sink: &mut dyn FnMut(ProcessKey, PageNo)) {
    let mut rng = SplitMix64::new(seed);
    // In-edges in CSR: vertex x has 1..=2·degree−1 in-edges whose sources follow Zipf(0.8)
    // over a scrambled vertex order (popular vertices are spread over the rank array).
    let zipf = Zipf::new(v as usize, 0.8);
    let scramble = |r: u64| (r.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 7) % v;
    let mut offsets = Vec::with_capacity(v as usize + 1);
    let mut src = Vec::new();
    offsets.push(0u64);
    for _ in 0..v {
        let d = 1 + rng.below(2 * degree - 1);
        for _ in 0..d {
            src.push(scramble(zipf.sample(&mut rng)) as u32);
        }
        offsets.push(src.len() as u64);
    }
    let e = src.len() as u64;
    // Layout: offsets (u64), src (u32), rank (f64), outdeg (u32), next (f64).
    let off_base = 0;
    let src_base = off_base + pages_for((v + 1) * 8) * PAGE;
    let rank_base = src_base + pages_for(e * 4) * PAGE;
    let deg_base = rank_base + pages_for(v * 8) * PAGE;
    let next_base = deg_base + pages_for(v * 4) * PAGE;
    let mut t = Toucher {
        last: [None; 4],
        sink,
    };
    for _ in 0..iters {
        for x in 0..v {
            t.touch(0, off_base + x * 8);
            for k in offsets[x as usize]..offsets[x as usize + 1] {
                t.touch(1, src_base + k * 4);
                let u = u64::from(src[k as usize]);
                t.touch(2, rank_base + u * 8);
                t.touch(3, deg_base + u * 4);
            }
            t.touch(0, next_base + x * 8);
        }
    }
}

fn quicksort(n: u64, seed: u64, sink: &mut dyn FnMut(ProcessKey, PageNo)) {
    let mut rng = SplitMix64::new(seed);
    let mut data: Vec<u32> = (0..n).map(|_| rng.next_u64() as u32).collect();
    let mut t = Toucher {
        last: [None; 4],
        sink,
    };
    // Explicit stack of (lo, hi) inclusive ranges; the larger half is pushed first so the
    // stack stays O(log n).
    let mut stack = vec![(0usize, n as usize - 1)];
    while let Some((lo, hi)) = stack.pop() {
        if hi <= lo {
            continue;
        }
        if hi - lo < 16 {
            for i in lo + 1..=hi {
                let mut j = i;
                t.touch(0, i as u64 * 4);
                while j > lo && data[j - 1] > data[j] {
                    t.touch(1, (j - 1) as u64 * 4);
                    data.swap(j - 1, j);
                    j -= 1;
                }
            }
            continue;
        }
        let mid = lo + (hi - lo) / 2;
        t.touch(2, mid as u64 * 4);
        let pivot = data[mid];
        let (mut i, mut j) = (lo, hi);
        loop {
            while {
                t.touch(0, i as u64 * 4);
                data[i] < pivot
            } {
                i += 1;
            }
            while {
                t.touch(1, j as u64 * 4);
                data[j] > pivot
            } {
                j -= 1;
            }
            if i >= j {
                break;
            }
            data.swap(i, j);
            i += 1;
            j -= 1;
        }
        // Hoare: [lo, j] and [j+1, hi].
        let (left, right) = ((lo, j), (j + 1, hi));
        if j - lo > hi - j - 1 {
            stack.push(left);
            stack.push(right);
        } else {
            stack.push(right);
            stack.push(left);
        }
    }
    debug_assert!(data.windows(2).all(|w| w[0] <= w[1]));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pages(w: &Workload) -> Vec<(u64, u64)> {
        w.trace()
            .unwrap()
            .records
            .iter()
            .map(|r| (r.key, r.page))
            .collect()
    }

    #[test]
    fn simple_shapes() {
        assert_eq!(
            pages(&Workload::Sequential {
                pages: 3,
                passes: 2
            }),
            [(1, 0), (1, 1), (1, 2), (1, 0), (1, 1), (1, 2)]
        );
        assert_eq!(
            pages(&Workload::Stride {
                stride: 10,
                count: 3,
                passes: 1
            }),
            [(1, 0), (1, 10), (1, 20)]
        );
        let two = pages(&Workload::TwoStream { pages: 2 });
        assert_eq!(
            two,
            [(1, 0), (1, 2 + (1 << 18)), (1, 1), (1, 3 + (1 << 18))]
        );
        let r = pages(&Workload::Random {
            pages: 100,
            count: 1000,
            seed: 3,
        });
        assert!(r.iter().all(|&(k, p)| k == 1 && p < 100));
        assert_eq!(
            r,
            pages(&Workload::Random {
                pages: 100,
                count: 1000,
                seed: 3
            }),
            "deterministic"
        );
    }

    #[test]
    fn mix_interleaves_two_processes() {
        let m = pages(&Workload::Mix {
            scan_pages: 1000,
            polluter_pages: 50,
            polluter_share: 0.5,
            seed: 1,
        });
        let scan: Vec<u64> = m.iter().filter(|r| r.0 == 1).map(|r| r.1).collect();
        assert_eq!(scan, (0..1000).collect::<Vec<_>>());
        let pol = m.iter().filter(|r| r.0 == 2).count();
        assert!((800..1200).contains(&pol), "{pol}");
    }

    #[test]
    fn matmul_touches_all_three_matrices() {
        let n = 64; // 32 KiB per matrix = 8 pages each
        for block in [0, 16] {
            let p = pages(&Workload::MatMul { n, block });
            let mut distinct: Vec<u64> = p.iter().map(|r| r.1).collect();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct, (0..24).collect::<Vec<_>>(), "block {block}");
        }
        let naive = pages(&Workload::MatMul { n, block: 0 }).len();
        let blocked = pages(&Workload::MatMul { n, block: 16 }).len();
        assert_ne!(naive, blocked);
    }

    #[test]
    fn quicksort_and_pagerank_stay_in_their_arrays() {
        let q = pages(&Workload::QuickSort {
            elements: 100_000,
            seed: 5,
        });
        assert!(q.iter().all(|r| r.1 < 98));
        assert!(q.len() > 1000);
        let g = pages(&Workload::PageRank {
            vertices: 10_000,
            degree: 4,
            iters: 1,
            seed: 5,
        });
        assert!(g.len() > 10_000);
    }

    #[test]
    fn bad_parameters_are_errors() {
        assert!(Workload::Sequential {
            pages: 0,
            passes: 1
        }
        .trace()
        .is_err());
        assert!(Workload::MatMul { n: 64, block: 10 }.trace().is_err());
        assert!(Workload::Zipf {
            pages: 10,
            count: 10,
            theta: f64::NAN,
            seed: 0
        }
        .trace()
        .is_err());
        assert!(Workload::Mix {
            scan_pages: 1,
            polluter_pages: 1,
            polluter_share: 1.0,
            seed: 0
        }
        .trace()
        .is_err());
    }
}
