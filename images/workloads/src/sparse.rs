//! Sparse: `pages` 4 KiB pages spread over a large working set (the span), the rest never
//! touched. A guest with tens of GiB of RAM costs only the pages this writes.

use crate::fold::{combine, fold_words};
use crate::rng::Rng;
use crate::scan::{fill, sum};
use crate::{measured, phase, Env, Error, Outcome};

/// Words per 4 KiB page.
const PAGE_WORDS: usize = 512;

/// Page number (in the span) of touched page `i` of `n`: one page in each of `n` equal
/// stretches of the span's `span` pages, at a seeded offset inside its stretch (ascending,
/// distinct, no table: computed again wherever needed).
fn position(seed: u64, i: u64, n: u64, span: u64) -> u64 {
    let lo = (i as u128 * span as u128 / n as u128) as u64;
    let hi = ((i + 1) as u128 * span as u128 / n as u128) as u64;
    lo + Rng::new(seed, 0x5A_0000 ^ i).below(hi - lo)
}

fn page(heap: &mut [u64], pos: u64) -> &mut [u64] {
    let a = pos as usize * PAGE_WORDS;
    &mut heap[a..a + PAGE_WORDS]
}

/// Writes `pages` pages spread over `heap` (setup), sums them (warm-up), then makes `passes`
/// read-modify-write passes over them, ascending and descending in turn (measured). The
/// checksum folds every touched page with its position; untouched pages are never read.
pub(crate) fn run(
    heap: &mut [u64],
    seed: u64,
    pages: u64,
    passes: u64,
    env: &mut dyn Env,
) -> Result<Outcome, Error> {
    let span = (heap.len() / PAGE_WORDS) as u64;
    if pages == 0 || pages > span {
        return Err(Error::BadParam {
            name: "pages",
            value: pages,
        });
    }
    env.phase(phase::SETUP);
    for i in 0..pages {
        fill(page(heap, position(seed, i, pages, span)), seed, 0x5A00 + i);
    }
    env.phase(phase::WARMUP);
    let mut warm = 0u64;
    for i in 0..pages {
        warm = warm.wrapping_add(sum(page(heap, position(seed, i, pages, span))));
    }
    let (s, ns) = measured(env, || {
        let mut s = 0u64;
        for pass in 0..passes {
            let k = pass.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let mut a = 0u64;
            for j in 0..pages {
                let i = if pass % 2 == 0 { j } else { pages - 1 - j };
                for w in page(heap, position(seed, i, pages, span)).iter_mut() {
                    a = a.wrapping_add(*w);
                    *w = w.wrapping_add(k);
                }
            }
            s = combine(s, a);
        }
        s
    });
    let mut c = combine(warm, s);
    for i in 0..pages {
        let pos = position(seed, i, pages, span);
        c = combine(c, fold_words(page(heap, pos)) ^ pos);
    }
    Ok(Outcome {
        checksum: c,
        ops: passes * pages,
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
    fn touches_exactly_pages_pages_spread_over_the_span() {
        let span = 1000u64;
        let mut h = vec![0u64; span as usize * PAGE_WORDS];
        let r = run(&mut h, 3, 37, 2, &mut Fake::default()).unwrap();
        assert_eq!(r.ops, 74);
        let touched: std::vec::Vec<u64> = (0..span)
            .filter(|&p| {
                h[p as usize * PAGE_WORDS..][..PAGE_WORDS]
                    .iter()
                    .any(|&w| w != 0)
            })
            .collect();
        assert_eq!(touched.len(), 37);
        // One page per stretch of span / pages pages.
        for (i, &p) in touched.iter().enumerate() {
            let i = i as u64;
            assert!(
                p >= i * span / 37 && p < (i + 1) * span / 37,
                "page {i} at {p}"
            );
        }
        assert!(*touched.last().unwrap() >= span - span / 37 - 1);
    }

    #[test]
    fn deterministic_seed_dependent_and_position_sensitive() {
        let mut a = vec![0u64; 64 * PAGE_WORDS];
        let mut b = vec![0u64; 64 * PAGE_WORDS];
        let ra = run(&mut a, 5, 16, 3, &mut Fake::default()).unwrap();
        let rb = run(&mut b, 5, 16, 3, &mut Fake::default()).unwrap();
        assert_eq!(ra.checksum, rb.checksum);
        assert_eq!(a, b);
        let mut c = vec![0u64; 64 * PAGE_WORDS];
        let rc = run(&mut c, 6, 16, 3, &mut Fake::default()).unwrap();
        assert_ne!(ra.checksum, rc.checksum);
        assert!(run(&mut c, 5, 65, 1, &mut Fake::default()).is_err());
        assert!(run(&mut c, 5, 0, 1, &mut Fake::default()).is_err());
    }
}
