//! Page checksum micro-benchmark: `cargo bench -p farvm-memproto --bench page_checksum`.
//!
//! Prints one table: ns per 4 KiB page of the protocol's crc32c ([`farvm_memproto::page_crc`])
//! against the `crc32c` crate in the same run, over pages in cache (64 pages, as a receiver
//! checks a page it has just landed) and out of cache (64 MiB). Wall time, best of 7 passes.
//! `FARVM_BENCH_COLD_PAGES` (default 16384) sets the out-of-cache set.

use std::time::Instant;

use farvm_memproto::{page_crc, PAGE_SIZE};

fn best_ns(pages: &[u8], f: &dyn Fn(&[u8]) -> u32) -> f64 {
    let n = pages.len() / PAGE_SIZE;
    let mut best = f64::MAX;
    let mut acc = 0u32;
    for _ in 0..7 {
        let t = Instant::now();
        for p in pages.chunks_exact(PAGE_SIZE) {
            acc ^= f(p);
        }
        best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
    }
    std::hint::black_box(acc);
    best
}

fn main() {
    let cold: usize = std::env::var("FARVM_BENCH_COLD_PAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16384);
    println!("# farvm-memproto page checksum (ns per 4 KiB page, best of 7 passes)\n");
    println!("| pages | crc32c crate | page_crc | page_crc / crc32c crate |");
    println!("|---|---|---|---|");
    for (label, n) in [("64, in cache", 64usize), ("out of cache", cold)] {
        let pages: Vec<u8> = (0..n * PAGE_SIZE)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        // Same values, or the comparison is meaningless.
        assert_eq!(
            page_crc(&pages[..PAGE_SIZE]),
            crc32c::crc32c(&pages[..PAGE_SIZE])
        );
        let base = best_ns(&pages, &|p| crc32c::crc32c(p));
        let new = best_ns(&pages, &|p| page_crc(p));
        println!("| {label} | {base:.0} | {new:.0} | {:.2} |", new / base);
    }
}
