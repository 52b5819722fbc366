//! In-place quicksort of `ws / 4` pseudo-random u32 (median-of-3 pivot, Hoare partition,
//! insertion sort below 16 elements, recursion into the smaller side only: depth <= log2 n).

use crate::fold::{combine, fold_u32};
use crate::rng::Rng;
use crate::scan::sum;
use crate::{as_u32, measured, phase, Env, Error, Outcome};

pub(crate) fn run(heap: &mut [u64], seed: u64, env: &mut dyn Env) -> Result<Outcome, Error> {
    env.phase(phase::SETUP);
    let v = as_u32(heap);
    let mut rng = Rng::new(seed, 8);
    for pair in v.chunks_mut(2) {
        let r = rng.next_u64();
        pair[0] = r as u32;
        if let Some(x) = pair.get_mut(1) {
            *x = (r >> 32) as u32;
        }
    }
    env.phase(phase::WARMUP);
    let warm = sum(heap);
    let v = as_u32(heap);
    let ((), ns) = measured(env, || sort(v));
    let unsorted = v.windows(2).filter(|w| w[0] > w[1]).count() as u64;
    Ok(Outcome {
        checksum: combine(combine(warm, unsorted), fold_u32(v)),
        ops: v.len() as u64,
        elapsed_ns: ns,
    })
}

/// Sorts `v` ascending.
pub fn sort(mut v: &mut [u32]) {
    loop {
        let n = v.len();
        if n <= 16 {
            insertion(v);
            return;
        }
        let mid = n / 2;
        if v[mid] < v[0] {
            v.swap(mid, 0);
        }
        if v[n - 1] < v[0] {
            v.swap(n - 1, 0);
        }
        if v[n - 1] < v[mid] {
            v.swap(n - 1, mid);
        }
        let pivot = v[mid];
        let mut i = 0usize;
        let mut j = n - 1;
        let split = loop {
            while v[i] < pivot {
                i += 1;
            }
            while v[j] > pivot {
                j -= 1;
            }
            if i >= j {
                break j;
            }
            v.swap(i, j);
            i += 1;
            j -= 1;
        };
        let (lo, hi) = v.split_at_mut(split + 1);
        if lo.len() < hi.len() {
            sort(lo);
            v = hi;
        } else {
            sort(hi);
            v = lo;
        }
    }
}

fn insertion(v: &mut [u32]) {
    for i in 1..v.len() {
        let x = v[i];
        let mut j = i;
        while j > 0 && v[j - 1] > x {
            v[j] = v[j - 1];
            j -= 1;
        }
        v[j] = x;
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::testenv::Fake;
    use std::vec::Vec;

    #[test]
    fn sorts_like_std() {
        let mut rng = Rng::new(3, 3);
        for n in [0usize, 1, 2, 15, 16, 17, 100, 1000, 10_000] {
            for modulus in [3u64, 1 << 32] {
                let mut v: Vec<u32> = (0..n).map(|_| rng.below(modulus) as u32).collect();
                let mut w = v.clone();
                sort(&mut v);
                w.sort_unstable();
                assert_eq!(v, w, "n {n} mod {modulus}");
            }
        }
    }

    #[test]
    fn workload_sorts_its_heap() {
        let mut h = vec![0u64; 1 << 14];
        let r = run(&mut h, 2, &mut Fake::default()).unwrap();
        assert_eq!(r.ops, 1 << 15);
        let v = as_u32(&mut h);
        assert!(v.windows(2).all(|w| w[0] <= w[1]));
        let mut h2 = vec![7u64; 1 << 14];
        assert_eq!(
            run(&mut h2, 2, &mut Fake::default()).unwrap().checksum,
            r.checksum
        );
    }
    use std::vec;
}
