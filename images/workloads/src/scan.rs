//! Scans: sequential, strided and uniform-random read-modify-write over the working set.

use crate::fold::{combine, fold_words};
use crate::lathist::{counter, LatencyHistogram};
use crate::rng::{mix64, Rng};
use crate::{measured, phase, Env, Error, Outcome};

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// Fills `words` with a seeded pseudo-random pattern (setup phase: first touch of every page).
pub(crate) fn fill(words: &mut [u64], seed: u64, stream: u64) {
    let base = Rng::new(seed, stream).next_u64();
    let mut x = base;
    for w in words.iter_mut() {
        x = x.wrapping_add(GOLDEN);
        *w = mix64(x);
    }
}

/// Wrapping sum of every word (an order-independent integer reduction: bit-identical whatever
/// the compiler's vectorisation).
pub(crate) fn sum(words: &[u64]) -> u64 {
    words.iter().fold(0u64, |a, &w| a.wrapping_add(w))
}

/// The cost of two back-to-back clock reads (the smallest of a few), subtracted from timed
/// accesses.
fn timer_overhead(env: &mut dyn Env) -> u64 {
    let mut best = u64::MAX;
    for _ in 0..64 {
        let a = env.now_ns();
        let b = env.now_ns();
        best = best.min(b.saturating_sub(a));
    }
    best
}

/// The first word a verifying scan found wrong, as reported through [`Env::counter`].
struct Divergence {
    word: u64,
    pass: u64,
    expected: u64,
    found: u64,
}

/// What a verifying scan expects: the fill of `base` (stream 1) raised by `added`.
struct Verify {
    base: u64,
    added: u64,
    pass: u64,
}

impl Verify {
    /// One read-modify-write pass adding `k` that checks each word before writing it; counts
    /// the wrong ones and keeps the first. Returns the sum of the words read.
    fn pass(
        &self,
        heap: &mut [u64],
        k: u64,
        first: &mut Option<Divergence>,
        mismatches: &mut u64,
        stalls: &mut Stalls,
        env: &mut dyn Env,
    ) -> u64 {
        let mut a = 0u64;
        let mut x = self.base;
        for (n, page) in heap.chunks_mut(PAGE_WORDS).enumerate() {
            stalls.tick(env);
            for (j, w) in page.iter_mut().enumerate() {
                x = x.wrapping_add(GOLDEN);
                let expected = mix64(x).wrapping_add(self.added);
                if *w != expected {
                    *mismatches += 1;
                    first.get_or_insert(Divergence {
                        word: (n * PAGE_WORDS + j) as u64,
                        pass: self.pass,
                        expected,
                        found: *w,
                    });
                }
                a = a.wrapping_add(*w);
                *w = w.wrapping_add(k);
            }
        }
        a
    }
}

/// Words in a 4 KiB page.
const PAGE_WORDS: usize = 512;

/// The longest time a scan took from one page to the next ([`counter::LONGEST_STALL_NS`]).
struct Stalls {
    last: u64,
    longest: u64,
}

impl Stalls {
    fn new(env: &mut dyn Env) -> Self {
        Stalls {
            last: env.now_ns(),
            longest: 0,
        }
    }

    /// The scan reached its next page.
    #[inline]
    fn tick(&mut self, env: &mut dyn Env) {
        let now = env.now_ns();
        self.longest = self.longest.max(now.saturating_sub(self.last));
        self.last = now;
    }
}

/// Sequential scan: `passes` ascending passes, read-only sums or read-modify-writes. With
/// `verify` = 1 (and `write` = 1), every word read is checked against what the scan last wrote
/// there; a word that differs (memory that lost a write or was handed back wrong) fails the
/// run with [`Error::Corrupted`], the first such word reported in the counters
/// (`counter::DIVERGED_*`). The checksum is the same either way.
pub(crate) fn seq(
    heap: &mut [u64],
    seed: u64,
    passes: u64,
    write: u64,
    verify: u64,
    env: &mut dyn Env,
) -> Result<Outcome, Error> {
    if write > 1 {
        return Err(Error::BadParam {
            name: "write",
            value: write,
        });
    }
    if verify > 1 || (verify == 1 && write == 0) {
        return Err(Error::BadParam {
            name: "verify",
            value: verify,
        });
    }
    env.phase(phase::SETUP);
    fill(heap, seed, 1);
    env.phase(phase::WARMUP);
    let warm = sum(heap);
    let base = Rng::new(seed, 1).next_u64();
    let mut first: Option<Divergence> = None;
    let mut mismatches = 0u64;
    // Timed here, not through `measured`: the scan reads the clock at every page.
    env.phase(phase::MEASURE);
    let t0 = env.now_ns();
    let mut stalls = Stalls::new(env);
    let mut s = 0u64;
    // What every word was raised by so far (the fill's pattern plus this).
    let mut added = 0u64;
    for pass in 0..passes {
        let p = if write == 1 {
            let k = pass.wrapping_mul(GOLDEN) | 1;
            let mut a = 0u64;
            if verify == 1 {
                let v = Verify { base, added, pass };
                a = v.pass(heap, k, &mut first, &mut mismatches, &mut stalls, env);
            } else {
                for page in heap.chunks_mut(PAGE_WORDS) {
                    stalls.tick(env);
                    for w in page.iter_mut() {
                        a = a.wrapping_add(*w);
                        *w = w.wrapping_add(k);
                    }
                }
            }
            added = added.wrapping_add(k);
            a
        } else {
            // A wrapping sum page by page is the same sum.
            heap.chunks(PAGE_WORDS).fold(0u64, |a, page| {
                stalls.tick(env);
                a.wrapping_add(sum(page))
            })
        };
        s = combine(s, p);
    }
    let ns = env.now_ns().saturating_sub(t0);
    env.phase(phase::MEASURED);
    env.counter(counter::LONGEST_STALL_NS, stalls.longest);
    if let Some(d) = first {
        env.counter(counter::DIVERGED_WORD, d.word);
        env.counter(counter::DIVERGED_PASS, d.pass);
        env.counter(counter::DIVERGED_EXPECTED, d.expected);
        env.counter(counter::DIVERGED_FOUND, d.found);
        return Err(Error::Corrupted { mismatches });
    }
    Ok(Outcome {
        checksum: combine(combine(warm, s), fold_words(heap)),
        ops: passes * heap.len() as u64,
        elapsed_ns: ns,
    })
}

/// Strided read-modify-write: one word per 64-byte line, lines `stride` bytes apart, with
/// `stride / 64` shifted sweeps per pass so every line is touched once per pass.
pub(crate) fn stride(
    heap: &mut [u64],
    seed: u64,
    stride: u64,
    passes: u64,
    env: &mut dyn Env,
) -> Result<Outcome, Error> {
    if stride == 0 || !stride.is_multiple_of(64) {
        return Err(Error::BadParam {
            name: "stride",
            value: stride,
        });
    }
    env.phase(phase::SETUP);
    fill(heap, seed, 2);
    env.phase(phase::WARMUP);
    let warm = sum(heap);
    let lines = heap.len() / 8;
    let step = (stride / 64) as usize;
    // With a page-multiple stride, the sweeps starting at a page's first line touch each page
    // for the first time in the pass: those accesses are timed one by one (the guest-visible
    // cost of reaching a page: a fault, a prefetch hit, or a local page). 1 in 64 accesses.
    let timed_page_firsts = stride.is_multiple_of(4096);
    let overhead = timer_overhead(env);
    let mut hist = LatencyHistogram::default();
    env.phase(phase::MEASURE);
    let t0 = env.now_ns();
    let mut s = 0u64;
    for pass in 0..passes {
        for start in 0..step.min(lines.max(1)) {
            let timed = timed_page_firsts && start % 64 == 0;
            let mut l = start;
            while l < lines {
                let w = &mut heap[l * 8];
                if timed {
                    let a = env.now_ns();
                    s = s.wrapping_add(*w);
                    *w = w.rotate_left(9) ^ pass;
                    let b = env.now_ns();
                    hist.record(b.saturating_sub(a).saturating_sub(overhead));
                } else {
                    s = s.wrapping_add(*w);
                    *w = w.rotate_left(9) ^ pass;
                }
                l += step;
            }
        }
        s = mix64(s);
    }
    let ns = env.now_ns().saturating_sub(t0);
    env.phase(phase::MEASURED);
    if hist.count() > 0 {
        env.counter(counter::PAGE_ACCESS_P50_NS, hist.quantile(0.5));
        env.counter(counter::PAGE_ACCESS_P99_NS, hist.quantile(0.99));
        env.counter(counter::PAGE_ACCESSES_TIMED, hist.count());
    }
    Ok(Outcome {
        checksum: combine(combine(warm, s), fold_words(heap)),
        ops: passes * lines as u64,
        elapsed_ns: ns,
    })
}

/// Uniform random read-modify-write of `ops` words.
pub(crate) fn random(
    heap: &mut [u64],
    seed: u64,
    ops: u64,
    env: &mut dyn Env,
) -> Result<Outcome, Error> {
    env.phase(phase::SETUP);
    fill(heap, seed, 3);
    env.phase(phase::WARMUP);
    let warm = sum(heap);
    let n = heap.len() as u64;
    let (s, ns) = measured(env, || {
        let mut rng = Rng::new(seed, 0x3A);
        let mut s = 0u64;
        for i in 0..ops {
            let idx = rng.below(n) as usize;
            let w = heap[idx];
            s = s.wrapping_add(w);
            heap[idx] = w.rotate_left(7) ^ i;
        }
        s
    });
    Ok(Outcome {
        checksum: combine(combine(warm, s), fold_words(heap)),
        ops,
        elapsed_ns: ns,
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::testenv::Fake;
    use std::vec;

    #[test]
    fn scans_are_deterministic_and_seed_dependent() {
        for f in [
            |h: &mut [u64], s, e: &mut Fake| seq(h, s, 2, 0, 0, e),
            |h: &mut [u64], s, e: &mut Fake| seq(h, s, 2, 1, 0, e),
            |h: &mut [u64], s, e: &mut Fake| seq(h, s, 2, 1, 1, e),
            |h: &mut [u64], s, e: &mut Fake| stride(h, s, 4096, 2, e),
            |h: &mut [u64], s, e: &mut Fake| random(h, s, 10_000, e),
        ] {
            let mut a = vec![0u64; 1 << 16];
            let mut b = vec![0xFFu64; 1 << 16];
            let ra = f(&mut a, 5, &mut Fake::default()).unwrap();
            let rb = f(&mut b, 5, &mut Fake::default()).unwrap();
            assert_eq!(
                ra.checksum, rb.checksum,
                "stale heap contents must not matter"
            );
            assert_eq!(a, b);
            let rc = f(&mut a, 6, &mut Fake::default()).unwrap();
            assert_ne!(ra.checksum, rc.checksum);
            // Two clock reads bracket the measured phase (stride reads more: it times accesses).
            assert!(ra.ops > 0 && ra.elapsed_ns >= 1000);
        }
    }

    #[test]
    fn a_verifying_scan_has_the_same_checksum_and_names_the_first_wrong_word() {
        let mut a = vec![0u64; 1 << 14];
        let mut b = vec![0u64; 1 << 14];
        let plain = seq(&mut a, 9, 3, 1, 0, &mut Fake::default()).unwrap();
        let verified = seq(&mut b, 9, 3, 1, 1, &mut Fake::default()).unwrap();
        assert_eq!(plain.checksum, verified.checksum);
        assert!(
            seq(&mut b, 9, 3, 0, 1, &mut Fake::default()).is_err(),
            "verify needs write=1"
        );
        // A heap as the scan left it after one pass, but for one word a write did not reach
        // (it holds the fill) and one a page of zeros replaced.
        let mut h = vec![0u64; 4096];
        fill(&mut h, 9, 1);
        let k0 = 1u64; // pass 0's k: 0 * GOLDEN | 1
        let before = h[700];
        for w in h.iter_mut() {
            *w = w.wrapping_add(k0);
        }
        h[700] = before;
        h[2000] = 0;
        let v = Verify {
            base: Rng::new(9, 1).next_u64(),
            added: k0,
            pass: 1,
        };
        let (mut first, mut bad) = (None, 0);
        let mut env = Fake::default();
        let mut stalls = Stalls::new(&mut env);
        v.pass(
            &mut h,
            GOLDEN | 1,
            &mut first,
            &mut bad,
            &mut stalls,
            &mut env,
        );
        assert_eq!(bad, 2);
        let d = first.unwrap();
        assert_eq!((d.word, d.pass, d.found), (700, 1, before));
        assert_eq!(d.expected, before.wrapping_add(k0));
    }

    /// The longest step from one page to the next is reported: a clock that jumps once (a
    /// VM paused and resumed with its clock moved forward) gives that jump.
    #[test]
    fn seq_reports_its_longest_step_between_pages() {
        struct Jumps {
            t: u64,
            reads: u64,
            longest: u64,
        }
        impl crate::Env for Jumps {
            fn now_ns(&mut self) -> u64 {
                self.reads += 1;
                // 1 µs a read, and 30 ms once, mid-way through the measured phase.
                self.t += if self.reads == 20 { 30_000_000 } else { 1000 };
                self.t
            }
            fn counter(&mut self, index: usize, value: u64) {
                if index == counter::LONGEST_STALL_NS {
                    self.longest = value;
                }
            }
        }
        for write in [0, 1] {
            let mut h = vec![0u64; 512 * 16];
            let mut e = Jumps {
                t: 0,
                reads: 0,
                longest: 0,
            };
            seq(&mut h, 3, 3, write, write, &mut e).unwrap();
            assert_eq!(e.longest, 30_000_000, "write={write}");
        }
    }

    #[test]
    fn stride_touches_every_line_once_per_pass() {
        let mut h = vec![0u64; 8 * 1000];
        let mut e = Fake::default();
        let r = stride(&mut h, 1, 64 * 7, 1, &mut e).unwrap();
        assert_eq!(r.ops, 1000);
        let mut fresh = vec![0u64; 8 * 1000];
        fill(&mut fresh, 1, 2);
        for l in 0..1000 {
            assert_eq!(h[l * 8], fresh[l * 8].rotate_left(9), "line {l}");
            assert_eq!(h[l * 8 + 1], fresh[l * 8 + 1]);
        }
        assert_eq!(&e.phases[..e.nphases], &[0, 1, 2, 3]);
        assert!(stride(&mut h, 1, 100, 1, &mut e).is_err());
        // Not a page multiple: no per-page timing reported.
        assert_eq!(e.counters[counter::PAGE_ACCESSES_TIMED], 0);
    }

    #[test]
    fn stride_10_times_each_page_first_access_once_per_pass() {
        let pages = 256;
        let mut h = vec![0u64; pages * 512];
        let mut e = Fake::default();
        let untimed = {
            let mut h2 = h.clone();
            stride(&mut h2, 3, 4096 * 10, 3, &mut Fake::default())
                .unwrap()
                .checksum
        };
        let r = stride(&mut h, 3, 4096 * 10, 3, &mut e).unwrap();
        assert_eq!(r.checksum, untimed, "timing must not change results");
        assert_eq!(
            e.counters[counter::PAGE_ACCESSES_TIMED],
            3 * pages as u64,
            "one timed access per page per pass"
        );
        // The fake clock advances 1000 ns per read and the overhead (two reads) is 1000 ns.
        assert_eq!(e.counters[counter::PAGE_ACCESS_P50_NS], 0);
    }
}
