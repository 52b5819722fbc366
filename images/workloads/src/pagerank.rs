//! PageRank (pull formulation, damping 0.85, dangling mass redistributed) on a synthetic R-MAT
//! power-law graph (a, b, c, d = 9/16, 3/16, 3/16, 1/16: Graph500's 0.57, 0.19, 0.19, 0.05 to
//! 4-bit precision, two levels per random byte) stored in CSR by destination.
//!
//! Heap layout (u64-aligned regions): `offsets: [u32; V+1]`, `srcs: [u32; E]`,
//! `outdeg: [u32; V]`, `rank: [f64; V]`, `contrib: [f64; V]` — 24 V + 4 E bytes plus padding.
//! The graph is built without an edge list: the R-MAT stream is generated twice from the same
//! seed (count in-degrees, then place sources), so the whole working set is the CSR itself.

use crate::fold::{combine, fold_words};
use crate::rng::Rng;
use crate::{as_f64, as_u32, measured, phase, Env, Error, Outcome};

const DAMPING: f64 = 0.85;
/// Edges generated per batch during construction.
const BATCH: usize = 256;

/// R-MAT quadrant for 4 random bits: a = 9/16, b = c = 3/16, d = 1/16 (Graph500's 0.57, 0.19,
/// 0.19, 0.05 to 4-bit precision). Returns (src bit << 1) | dst bit.
const fn quadrant(nibble: u32) -> u32 {
    if nibble < 9 {
        0
    } else if nibble < 12 {
        1
    } else if nibble < 15 {
        2
    } else {
        3
    }
}

/// Two R-MAT levels per random byte: `(src 2 bits) << 2 | (dst 2 bits)`, low nibble first.
const fn pair_table() -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let q1 = quadrant(i as u32 & 15);
        let q2 = quadrant(i as u32 >> 4);
        let s = (q1 >> 1) << 1 | (q2 >> 1);
        let d = (q1 & 1) << 1 | (q2 & 1);
        t[i] = (s << 2 | d) as u8;
        i += 1;
    }
    t
}
static PAIRS: [u8; 256] = pair_table();

/// Words needed for scale `s` and average degree `deg`.
fn words_needed(scale: u32, deg: u64) -> u64 {
    let v = 1u64 << scale;
    let e = deg << scale;
    (v + 2).div_ceil(2) + e.div_ceil(2) + v.div_ceil(2) + 2 * v
}

pub(crate) fn run(
    heap: &mut [u64],
    seed: u64,
    iters: u64,
    degree: u64,
    scale: u64,
    env: &mut dyn Env,
) -> Result<Outcome, Error> {
    if degree == 0 || degree > 1024 {
        return Err(Error::BadParam {
            name: "degree",
            value: degree,
        });
    }
    let words = heap.len() as u64;
    let scale = if scale == 0 {
        let mut s = 4u32;
        while s < 28 && words_needed(s + 1, degree) <= words {
            s += 1;
        }
        s
    } else if (1..=28).contains(&scale) {
        scale as u32
    } else {
        return Err(Error::BadParam {
            name: "scale",
            value: scale,
        });
    };
    let need = words_needed(scale, degree);
    if need > words {
        return Err(Error::HeapTooSmall {
            need: need * 8,
            have: words * 8,
        });
    }
    if degree << scale > u32::MAX as u64 {
        return Err(Error::BadParam {
            name: "degree",
            value: degree,
        });
    }
    let v = 1usize << scale;
    let e = (degree as usize) << scale;

    let (off_w, rest) = heap.split_at_mut((v + 2).div_ceil(2));
    let (src_w, rest) = rest.split_at_mut(e.div_ceil(2));
    let (deg_w, rest) = rest.split_at_mut(v.div_ceil(2));
    let (rank_w, rest) = rest.split_at_mut(v);
    let contrib_w = &mut rest[..v];
    let offsets = &mut as_u32(off_w)[..v + 1];
    let srcs = &mut as_u32(src_w)[..e];
    let outdeg = &mut as_u32(deg_w)[..v];
    let rank = as_f64(rank_w);
    let contrib = as_f64(contrib_w);

    env.phase(phase::SETUP);
    offsets.fill(0);
    outdeg.fill(0);
    // Edges are generated in batches and applied in a tight loop, so the CPU overlaps many of
    // the scattered increments' cache misses (interleaved with the generator it had ~3 in flight).
    let mut gen = Rmat::new(seed, scale);
    let mut batch = [(0u32, 0u32); BATCH];
    let mut done = 0usize;
    while done < e {
        let n = BATCH.min(e - done);
        for b in batch[..n].iter_mut() {
            *b = gen.edge();
        }
        for &(s, d) in &batch[..n] {
            offsets[d as usize] += 1;
            outdeg[s as usize] += 1;
        }
        done += n;
    }
    let mut acc = 0u32;
    for o in offsets[..v].iter_mut() {
        acc += *o;
        *o = acc;
    }
    offsets[v] = acc;
    let mut gen = Rmat::new(seed, scale);
    let mut done = 0usize;
    while done < e {
        let n = BATCH.min(e - done);
        for b in batch[..n].iter_mut() {
            *b = gen.edge();
        }
        for &(s, d) in &batch[..n] {
            offsets[d as usize] -= 1;
            srcs[offsets[d as usize] as usize] = s;
        }
        done += n;
    }
    let init = 1.0 / v as f64;
    rank.fill(init);

    env.phase(phase::WARMUP);
    iterate(offsets, srcs, outdeg, rank, contrib);
    let ((), ns) = measured(env, || {
        for _ in 0..iters {
            iterate(offsets, srcs, outdeg, rank, contrib);
        }
    });
    let l1: f64 = rank.iter().fold(0.0, |a, &r| a + r);
    Ok(Outcome {
        checksum: combine(l1.to_bits(), fold_words(heap)),
        ops: iters * e as u64,
        elapsed_ns: ns,
    })
}

fn iterate(offsets: &[u32], srcs: &[u32], outdeg: &[u32], rank: &mut [f64], contrib: &mut [f64]) {
    let n = rank.len();
    let nf = n as f64;
    let mut dangling = 0.0;
    for u in 0..n {
        let od = outdeg[u];
        if od == 0 {
            dangling += rank[u];
            contrib[u] = 0.0;
        } else {
            contrib[u] = rank[u] / od as f64;
        }
    }
    let base = (1.0 - DAMPING) / nf + DAMPING * dangling / nf;
    for (vtx, r) in rank.iter_mut().enumerate() {
        let (a, b) = (offsets[vtx] as usize, offsets[vtx + 1] as usize);
        let mut s = 0.0;
        for &u in &srcs[a..b] {
            s += contrib[u as usize];
        }
        *r = base + DAMPING * s;
    }
}

/// R-MAT edge stream; vertex ids are scrambled by an odd multiplier (a bijection modulo
/// 2^scale) so hot vertices are spread over the arrays, as in Graph500.
struct Rmat {
    rng: Rng,
    scale: u32,
    mask: u32,
    mul: u32,
}

impl Rmat {
    fn new(seed: u64, scale: u32) -> Self {
        let mut rng = Rng::new(seed, 7);
        let mul = (rng.next_u64() as u32) | 1;
        Rmat {
            rng,
            scale,
            mask: ((1u64 << scale) - 1) as u32,
            mul,
        }
    }

    /// One edge: `scale` levels, two per random byte (8 bytes per RNG call).
    #[inline]
    fn edge(&mut self) -> (u32, u32) {
        let (mut s, mut d) = (0u32, 0u32);
        let mut bits = 0u64;
        let mut avail = 0u32;
        let mut left = self.scale;
        while left >= 2 {
            if avail == 0 {
                bits = self.rng.next_u64();
                avail = 8;
            }
            let p = PAIRS[(bits & 0xFF) as usize] as u32;
            bits >>= 8;
            avail -= 1;
            s = (s << 2) | (p >> 2);
            d = (d << 2) | (p & 3);
            left -= 2;
        }
        if left == 1 {
            if avail == 0 {
                bits = self.rng.next_u64();
            }
            let q = quadrant((bits & 15) as u32);
            s = (s << 1) | (q >> 1);
            d = (d << 1) | (q & 1);
        }
        (
            s.wrapping_mul(self.mul) & self.mask,
            d.wrapping_mul(self.mul) & self.mask,
        )
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::testenv::Fake;
    use std::vec;

    #[test]
    fn ranks_are_a_distribution_and_csr_is_consistent() {
        let scale = 10u32;
        let deg = 8u64;
        let mut h = vec![0u64; words_needed(scale, deg) as usize];
        let r = run(&mut h, 3, 10, deg, scale as u64, &mut Fake::default()).unwrap();
        assert_eq!(r.ops, 10 * (8 << 10));
        let v = 1usize << scale;
        let e = 8 << scale;
        let (off_w, rest) = h.split_at_mut((v + 2).div_ceil(2));
        let (src_w, rest) = rest.split_at_mut(e / 2);
        let (deg_w, rest) = rest.split_at_mut(v / 2);
        let offsets = as_u32(off_w)[..v + 1].to_vec();
        let srcs = as_u32(src_w)[..e].to_vec();
        let outdeg = as_u32(deg_w)[..v].to_vec();
        let rank = as_f64(&mut rest[..v]).to_vec();
        assert_eq!(offsets[0], 0);
        assert_eq!(offsets[v] as usize, e);
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
        let mut out = vec![0u32; v];
        for &s in &srcs {
            out[s as usize] += 1;
        }
        assert_eq!(out, outdeg);
        let total: f64 = rank.iter().sum();
        assert!((total - 1.0).abs() < 1e-9, "sum of ranks {total}");
        // Power law: the top vertex has far more in-edges than the average.
        let maxin = offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(maxin > 20 * deg as u32, "max in-degree {maxin}");
        let again = run(
            &mut vec![9u64; h.len()],
            3,
            10,
            deg,
            scale as u64,
            &mut Fake::default(),
        );
        assert_eq!(again.unwrap().checksum, r.checksum);
    }

    #[test]
    fn auto_scale_fits() {
        let mut h = vec![0u64; (1 << 20) / 8];
        let r = run(&mut h, 1, 1, 8, 0, &mut Fake::default()).unwrap();
        // 1 MiB: scale 14 needs 24*16K + 4*128K = 896 KiB (+ padding) and fits; 15 does not.
        assert_eq!(r.ops, 8 << 14);
        assert!(matches!(
            run(&mut h, 1, 1, 8, 16, &mut Fake::default()),
            Err(Error::HeapTooSmall { .. })
        ));
    }
}
