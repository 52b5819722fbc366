//! Checksums that detect any wrong page: every word is folded together with its position, so a
//! stale, zeroed, swapped or duplicated page changes the result.

use crate::rng::mix64;

const K: [u64; 4] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x27D4_EB2F_1656_67C5,
];

/// Position-sensitive fold of `words` (4 independent lanes so it runs at memory speed).
pub fn fold_words(words: &[u64]) -> u64 {
    let mut acc = [0u64; 4];
    let mut chunks = words.chunks_exact(4);
    let mut i = 0u64;
    for c in &mut chunks {
        for l in 0..4 {
            acc[l] = acc[l].wrapping_add((c[l] ^ (i + l as u64)).wrapping_mul(K[l]));
        }
        i += 4;
    }
    for (l, w) in chunks.remainder().iter().enumerate() {
        acc[l] = acc[l].wrapping_add((w ^ (i + l as u64)).wrapping_mul(K[l]));
    }
    combine(
        combine(mix64(acc[0]), mix64(acc[1])),
        combine(mix64(acc[2]), mix64(acc[3] ^ words.len() as u64)),
    )
}

/// Fold of 32-bit words (a `u32` array viewed as such).
pub fn fold_u32(v: &[u32]) -> u64 {
    let mut acc = [0u64; 2];
    let mut chunks = v.chunks_exact(2);
    let mut i = 0u64;
    for c in &mut chunks {
        acc[0] = acc[0].wrapping_add((c[0] as u64 ^ (i << 32)).wrapping_mul(K[0]));
        acc[1] = acc[1].wrapping_add((c[1] as u64 ^ ((i + 1) << 32)).wrapping_mul(K[1]));
        i += 2;
    }
    if let Some(&w) = chunks.remainder().first() {
        acc[0] = acc[0].wrapping_add((w as u64 ^ (i << 32)).wrapping_mul(K[2]));
    }
    combine(mix64(acc[0]), mix64(acc[1] ^ v.len() as u64))
}

/// Order-dependent combination of two checksums.
#[inline]
pub fn combine(a: u64, b: u64) -> u64 {
    mix64(a.rotate_left(23) ^ b.wrapping_mul(K[3]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_and_position_matters() {
        let base: [u64; 1024] = core::array::from_fn(|i| mix64(i as u64));
        let f = fold_words(&base);
        for i in [0usize, 1, 511, 512, 1023] {
            let mut v = base;
            v[i] ^= 1;
            assert_ne!(fold_words(&v), f, "flip at {i}");
        }
        let mut swapped = base;
        swapped.swap(0, 512);
        assert_ne!(fold_words(&swapped), f);
        let zero = [0u64; 1024];
        let mut one_page = zero;
        one_page[600] = 0;
        assert_eq!(fold_words(&one_page), fold_words(&zero));
        assert_ne!(fold_words(&zero[..1000]), fold_words(&zero));
    }

    #[test]
    fn u32_fold_sees_swaps() {
        let v: [u32; 64] = core::array::from_fn(|i| i as u32 * 7);
        let mut w = v;
        w.swap(3, 40);
        assert_ne!(fold_u32(&v), fold_u32(&w));
    }
}
