//! Page content fingerprints (XXH3-128) used to decide at eviction whether a page differs from
//! its remote copy. See `evict.rs` for why content, not a write tracker, is the final word.
//!
//! The hash is `twox-hash`'s XXH3, which picks its AVX2 kernel at run time where the CPU has
//! it; `xxhash-rust` chooses at compile time and, built for baseline x86-64, runs its SSE2
//! kernel everywhere. Same function, same values; table 4 of `cargo bench -p farvm-ept --bench
//! fault_path` times both on this host.

use crate::PAGE_SIZE;

/// XXH3-128 of a page's 4 KiB.
pub type Fingerprint = u128;

/// XXH3-128 of `bytes` (seed 0).
#[inline]
fn xxh3_128(bytes: &[u8]) -> Fingerprint {
    twox_hash::XxHash3_128::oneshot(bytes)
}

/// Fingerprint of 4 KiB at `p`.
///
/// # Safety
/// `p` must point at 4 KiB of readable memory that nobody writes during the call (the caller
/// owns the page through the page-state table, and the guest view is unmapped or not yet mapped).
#[inline]
pub unsafe fn of_page(p: *const u8) -> Fingerprint {
    // SAFETY: per the function contract.
    let s = unsafe { core::slice::from_raw_parts(p, PAGE_SIZE) };
    xxh3_128(s)
}

/// Fingerprint of an all-zero page.
pub fn zero() -> Fingerprint {
    xxh3_128(&[0u8; PAGE_SIZE])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fingerprint is XXH3-128 exactly: the reference implementation (`xxhash-rust`) gives
    /// the same value for pages of varied content, read at any alignment.
    #[test]
    fn of_page_is_xxh3_128() {
        let mut buf = vec![0u8; 3 * PAGE_SIZE];
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
        }
        for off in [0, 1, 8, 63, PAGE_SIZE] {
            let page = &buf[off..off + PAGE_SIZE];
            // SAFETY: `page` is 4 KiB of readable memory nobody writes meanwhile.
            let fp = unsafe { of_page(page.as_ptr()) };
            assert_eq!(fp, xxhash_rust::xxh3::xxh3_128(page), "offset {off}");
        }
        assert_eq!(zero(), xxhash_rust::xxh3::xxh3_128(&[0u8; PAGE_SIZE]));
        // One flipped bit changes the fingerprint (the dirty check relies on it).
        let before = xxh3_128(&buf[..PAGE_SIZE]);
        buf[100] ^= 1;
        // SAFETY: as above.
        let after = unsafe { of_page(buf.as_ptr()) };
        assert_ne!(after, before);
    }
}
