//! Zipf-distributed ranks in `1..=n` by rejection-inversion (Hörmann & Derflinger, 1996; the
//! algorithm of Apache Commons' `RejectionInversionZipfSampler`): O(1) time and memory per
//! sample, no table, so the sampler adds nothing to the working set.

use crate::math::{exp, ln};
use crate::rng::Rng;

/// P(k) proportional to 1 / k^s for k in 1..=n.
#[derive(Clone, Copy, Debug)]
pub struct Zipf {
    n: f64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    s_val: f64,
}

impl Zipf {
    /// `n >= 1`, `s >= 0` (returns `None` otherwise).
    pub fn new(n: u64, s: f64) -> Option<Self> {
        if n == 0 || s.is_nan() || s < 0.0 {
            return None;
        }
        let mut z = Zipf {
            n: n as f64,
            s,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            s_val: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(n as f64 + 0.5);
        z.s_val = 2.0 - z.h_integral_inv(z.h_integral(2.5) - z.h(2.0));
        Some(z)
    }

    /// One rank in `1..=n` (1 is the most popular).
    pub fn sample(&self, rng: &mut Rng) -> u64 {
        loop {
            let u = self.h_integral_n + rng.unit_f64() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inv(u);
            let mut k = (x + 0.5) as u64; // saturating float-to-int cast
            if k < 1 {
                k = 1;
            } else if k as f64 > self.n {
                k = self.n as u64;
            }
            let kf = k as f64;
            if kf - x <= self.s_val || u >= self.h_integral(kf + 0.5) - self.h(kf) {
                return k;
            }
        }
    }

    /// H(x) = (x^(1-s) - 1) / (1-s), the integral of h from 1 (ln x when s = 1).
    fn h_integral(&self, x: f64) -> f64 {
        let lx = ln(x);
        helper2((1.0 - self.s) * lx) * lx
    }

    /// h(x) = x^-s.
    fn h(&self, x: f64) -> f64 {
        exp(-self.s * ln(x))
    }

    fn h_integral_inv(&self, x: f64) -> f64 {
        let mut t = x * (1.0 - self.s);
        if t < -1.0 {
            t = -1.0;
        }
        exp(helper1(t) * x)
    }
}

/// ln(1+x)/x, with its series near 0.
fn helper1(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        ln(1.0 + x) / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// (e^x - 1)/x, with its series near 0.
fn helper2(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        (exp(x) - 1.0) / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    #[test]
    fn frequencies_follow_the_power_law() {
        let n = 1000u64;
        let z = Zipf::new(n, 0.99).unwrap();
        let mut rng = Rng::new(1, 1);
        let mut counts = vec![0u64; n as usize + 1];
        let samples = 400_000;
        for _ in 0..samples {
            let k = z.sample(&mut rng);
            assert!((1..=n).contains(&k));
            counts[k as usize] += 1;
        }
        let norm: f64 = (1..=n).map(|k| 1.0 / (k as f64).powf(0.99)).sum();
        for k in [1usize, 2, 3, 10, 100] {
            let want = samples as f64 / (k as f64).powf(0.99) / norm;
            let got = counts[k] as f64;
            assert!(
                (got - want).abs() < 5.0 * want.sqrt() + 0.02 * want,
                "rank {k}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn degenerate_parameters() {
        assert!(Zipf::new(0, 0.99).is_none());
        assert!(Zipf::new(5, -1.0).is_none());
        let one = Zipf::new(1, 0.99).unwrap();
        let mut rng = Rng::new(2, 2);
        assert!((0..100).all(|_| one.sample(&mut rng) == 1));
        let uniform = Zipf::new(4, 0.0).unwrap();
        let mut seen = [false; 5];
        for _ in 0..1000 {
            seen[uniform.sample(&mut rng) as usize] = true;
        }
        assert_eq!(seen, [false, true, true, true, true]);
        let harmonic = Zipf::new(100, 1.0).unwrap();
        assert!((0..1000).all(|_| (1..=100).contains(&harmonic.sample(&mut rng))));
    }
}
