//! A fixed-size log-linear latency histogram for workloads that time individual accesses
//! (no allocator in the guest: 512 `u32` buckets on the stack), and the indices of the
//! per-process counters workloads report through [`crate::Env::counter`].

/// Indices of workload-reported counters (the guest agent's `Mailbox::counters`).
pub mod counter {
    /// Median guest-visible latency of a page's first access in a pass, in ns (stride).
    pub const PAGE_ACCESS_P50_NS: usize = 0;
    /// 99th percentile of the same, in ns.
    pub const PAGE_ACCESS_P99_NS: usize = 1;
    /// How many accesses the two figures above are taken over.
    pub const PAGE_ACCESSES_TIMED: usize = 2;
    /// A verifying scan's first wrong word (seq `verify=1`): its index in the working set
    /// (byte offset / 8; its page is index / 512)...
    pub const DIVERGED_WORD: usize = 3;
    /// ... the pass that read it (0-based) ...
    pub const DIVERGED_PASS: usize = 4;
    /// ... what the scan had written there ...
    pub const DIVERGED_EXPECTED: usize = 5;
    /// ... and what it read.
    pub const DIVERGED_FOUND: usize = 6;
    /// The longest a sequential scan's measured phase went from one page to the next, in ns
    /// of the guest's clock (seq): a remote fault, or the whole VM paused (a live migration's
    /// pause, when the destination keeps the guest's clock running across it).
    pub const LONGEST_STALL_NS: usize = 7;
}

/// Sub-buckets per power of two: values are kept to within 1/8 (12.5%).
const SUB: u32 = 8;
const BUCKETS: usize = 64 * SUB as usize;

/// Log-linear histogram of nanosecond values: bucket = (floor(log2 v), next 3 bits).
pub struct LatencyHistogram {
    counts: [u32; BUCKETS],
    total: u64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self {
            counts: [0; BUCKETS],
            total: 0,
        }
    }
}

fn bucket_of(v: u64) -> usize {
    if v < SUB as u64 {
        return v as usize;
    }
    let exp = 63 - v.leading_zeros();
    let sub = (v >> (exp - 3)) & (SUB as u64 - 1);
    ((exp - 2) * SUB) as usize + sub as usize
}

/// The smallest value that falls in bucket `b` (what a percentile reports).
fn floor_of(b: usize) -> u64 {
    if b < SUB as usize {
        return b as u64;
    }
    let exp = (b as u32 / SUB) + 2;
    let sub = (b as u32 % SUB) as u64;
    (1u64 << exp) | (sub << (exp - 3))
}

impl LatencyHistogram {
    /// Counts one observation of `ns` nanoseconds.
    pub fn record(&mut self, ns: u64) {
        let b = bucket_of(ns).min(BUCKETS - 1);
        self.counts[b] = self.counts[b].saturating_add(1);
        self.total += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.total
    }

    /// The value at quantile `q` (0..=1), to within 12.5% below; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        let rank = ((self.total as f64 * q) as u64).clamp(1, self.total);
        let mut seen = 0u64;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c as u64;
            if seen >= rank {
                return floor_of(b);
            }
        }
        floor_of(BUCKETS - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_tight() {
        let mut last = 0;
        for v in [
            0u64,
            1,
            7,
            8,
            9,
            15,
            16,
            100,
            1000,
            55_000,
            1 << 40,
            u64::MAX,
        ] {
            let b = bucket_of(v);
            assert!(b >= last, "bucket of {v} went backwards");
            last = b;
            let f = floor_of(b);
            assert!(f <= v, "floor {f} above {v}");
            assert!(v - f <= v / 8, "floor {f} more than 1/8 below {v}");
        }
    }

    #[test]
    fn quantiles_of_a_known_mix() {
        let mut h = LatencyHistogram::default();
        for _ in 0..90 {
            h.record(200);
        }
        for _ in 0..10 {
            h.record(50_000);
        }
        assert_eq!(h.count(), 100);
        let p50 = h.quantile(0.5);
        assert!((175..=200).contains(&p50), "p50 {p50}");
        let p99 = h.quantile(0.99);
        assert!((43_750..=50_000).contains(&p99), "p99 {p99}");
        assert_eq!(LatencyHistogram::default().quantile(0.5), 0);
    }
}
