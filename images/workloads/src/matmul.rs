//! f64 matrix multiply C = A x B over three n x n row-major matrices at the start of the heap:
//! naive i-j-k (column walk of B: the "ladder" pattern) or cache-blocked i-k-j.

use crate::fold::{combine, fold_words};
use crate::rng::Rng;
use crate::{as_f64, measured, phase, Env, Error, Outcome};

/// Largest automatic order (512^3 = 1.3e8 multiply-adds, a fraction of a second).
pub const AUTO_MAX_N: u64 = 512;

/// `block == 0` selects the naive loops.
pub(crate) fn run(
    heap: &mut [u64],
    seed: u64,
    n: u64,
    block: u64,
    env: &mut dyn Env,
) -> Result<Outcome, Error> {
    let words = heap.len() as u64;
    let n = if n == 0 {
        let mut n = 1;
        while n < AUTO_MAX_N && 3 * (n + 1) * (n + 1) <= words {
            n += 1;
        }
        n
    } else {
        n
    };
    if n > 1 << 16 {
        return Err(Error::BadParam {
            name: "n",
            value: n,
        });
    }
    if 3 * n * n > words {
        return Err(Error::HeapTooSmall {
            need: 24 * n * n,
            have: words * 8,
        });
    }
    let n = n as usize;
    let nn = n * n;
    env.phase(phase::SETUP);
    let m = as_f64(&mut heap[..3 * nn]);
    let (a, rest) = m.split_at_mut(nn);
    let (b, c) = rest.split_at_mut(nn);
    let mut rng = Rng::new(seed, 4);
    for x in a.iter_mut().chain(b.iter_mut()) {
        *x = rng.unit_f64() * 2.0 - 1.0;
    }
    c.fill(0.0);
    env.phase(phase::WARMUP);
    let warm = fold_words(&heap[..2 * nn]);
    let m = as_f64(&mut heap[..3 * nn]);
    let (a, rest) = m.split_at_mut(nn);
    let (b, c) = rest.split_at_mut(nn);
    let ((), ns) = measured(env, || {
        if block == 0 {
            naive(a, b, c, n)
        } else {
            blocked(a, b, c, n, block as usize)
        }
    });
    let result = fold_words(&heap[2 * nn..3 * nn]);
    Ok(Outcome {
        checksum: combine(combine(warm, result), fold_words(heap)),
        ops: (n * nn) as u64,
        elapsed_ns: ns,
    })
}

fn naive(a: &[f64], b: &[f64], c: &mut [f64], n: usize) {
    for i in 0..n {
        let row = &a[i * n..(i + 1) * n];
        for j in 0..n {
            let mut s = 0.0;
            for (k, &aik) in row.iter().enumerate() {
                s += aik * b[k * n + j];
            }
            c[i * n + j] = s;
        }
    }
}

fn blocked(a: &[f64], b: &[f64], c: &mut [f64], n: usize, bs: usize) {
    let bs = bs.clamp(1, n);
    for ii in (0..n).step_by(bs) {
        let ie = (ii + bs).min(n);
        for kk in (0..n).step_by(bs) {
            let ke = (kk + bs).min(n);
            for jj in (0..n).step_by(bs) {
                let je = (jj + bs).min(n);
                for i in ii..ie {
                    let crow = &mut c[i * n + jj..i * n + je];
                    for k in kk..ke {
                        let aik = a[i * n + k];
                        let brow = &b[k * n + jj..k * n + je];
                        for (cv, &bv) in crow.iter_mut().zip(brow) {
                            *cv += aik * bv;
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::testenv::Fake;
    use std::vec;

    #[test]
    fn naive_and_blocked_agree_numerically() {
        let n = 37;
        let mut h1 = vec![0u64; 3 * n * n];
        let mut h2 = vec![0u64; 3 * n * n];
        let r1 = run(&mut h1, 9, n as u64, 0, &mut Fake::default()).unwrap();
        let _ = run(&mut h2, 9, n as u64, 8, &mut Fake::default()).unwrap();
        assert_eq!(r1.ops, (n * n * n) as u64);
        let c1 = as_f64(&mut h1[2 * n * n..]).to_vec();
        let c2 = as_f64(&mut h2[2 * n * n..]).to_vec();
        for (x, y) in c1.iter().zip(&c2) {
            assert!((x - y).abs() < 1e-12 * n as f64, "{x} vs {y}");
        }
        // Reference for one element.
        let a = as_f64(&mut h1[..n * n]).to_vec();
        let b = as_f64(&mut h1[n * n..2 * n * n]).to_vec();
        let want: f64 = (0..n).map(|k| a[3 * n + k] * b[k * n + 5]).sum();
        assert!((c1[3 * n + 5] - want).abs() < 1e-12);
        let again = run(&mut h1, 9, n as u64, 0, &mut Fake::default()).unwrap();
        assert_eq!(again.checksum, r1.checksum);
    }

    #[test]
    fn auto_order_fits_and_too_big_is_refused() {
        let mut h = vec![0u64; 3 * 20 * 20 + 5];
        let r = run(&mut h, 1, 0, 0, &mut Fake::default()).unwrap();
        assert_eq!(r.ops, 20 * 20 * 20);
        assert!(matches!(
            run(&mut h, 1, 21, 0, &mut Fake::default()),
            Err(Error::HeapTooSmall { .. })
        ));
    }
}
