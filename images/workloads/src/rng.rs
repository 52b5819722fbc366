//! Deterministic pseudo-random numbers for the workloads: SplitMix64 (tiny state, good enough
//! statistics for address streams, identical natively and in the guest).

/// SplitMix64's output function: a bijective 64-bit mixer.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// SplitMix64 generator.
#[derive(Clone, Copy, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator for `seed`, decorrelated per `stream` (workload id, phase, ...).
    pub fn new(seed: u64, stream: u64) -> Self {
        Rng {
            state: mix64(seed ^ mix64(stream.wrapping_add(0x5851_F42D_4C95_7F2D))),
        }
    }

    /// The next 64 random bits.
    #[inline(always)]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.state)
    }

    /// Uniform in `0..n` (n > 0) by multiply-high (no division, negligible bias for n << 2^64).
    #[inline(always)]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform f64 in `[0, 1)` with 53 random bits.
    #[inline(always)]
    pub fn unit_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}
