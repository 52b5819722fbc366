//! Page content fingerprints (XXH3-128) used to decide at eviction whether a page differs from
//! its remote copy. See `evict.rs` for why content, not a write tracker, is the final word.

use crate::PAGE_SIZE;

/// XXH3-128 of a page's 4 KiB.
pub type Fingerprint = u128;

/// Fingerprint of 4 KiB at `p`.
///
/// # Safety
/// `p` must point at 4 KiB of readable memory that nobody writes during the call (the caller
/// owns the page through the page-state table, and the guest view is unmapped or not yet mapped).
#[inline]
pub unsafe fn of_page(p: *const u8) -> Fingerprint {
    // SAFETY: per the function contract.
    let s = unsafe { core::slice::from_raw_parts(p, PAGE_SIZE) };
    xxhash_rust::xxh3::xxh3_128(s)
}

/// Fingerprint of an all-zero page.
pub fn zero() -> Fingerprint {
    xxhash_rust::xxh3::xxh3_128(&[0u8; PAGE_SIZE])
}
