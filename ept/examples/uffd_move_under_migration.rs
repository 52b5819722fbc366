//! Does this kernel keep anonymous pages intact when `UFFDIO_MOVE` races with page migration?
//! Anonymous guest memory (`--guest-memory anon`) moves every page in and out of the guest view
//! with `UFFDIO_MOVE`; memory compaction migrates the same pages underneath. This check moves
//! runs of pages back and forth between a guest-view-like mapping and a pool-like one (as the
//! anon backing does: runs of 61 pages, which straddle page-table boundaries on both sides),
//! while another thread makes the kernel compact memory (`/proc/sys/vm/compact_memory`, so it
//! needs root) — and checks after every move that every page is where the move put it, with
//! its content.
//!
//! ```text
//! sudo cargo run --release -p farvm-ept --example uffd_move_under_migration -- \
//!     [SECS] [--no-compaction]
//! ```
//!
//! Prints the moves made, the pages the kernel migrated meanwhile (`pgmigrate_success`) and the
//! errors; exits 1 if any page was lost, duplicated or changed. `--no-compaction` runs the same
//! moves without compaction (the control).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use farvm_ept::sys::uffd::{feature, mode, Uffd};

const PG: usize = 4096;
const GUEST_PAGES: usize = 8192;
const POOL_PAGES: usize = 1024;
const RUN: usize = 61;

fn map(pages: usize) -> *mut u8 {
    // SAFETY: a fresh private anonymous mapping; checked below.
    let p = unsafe {
        libc::mmap(
            core::ptr::null_mut(),
            pages * PG,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    assert_ne!(
        p,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: advisory calls on the mapping just made (4 KiB pages, not shared with children),
    // as the anon backing's mappings.
    unsafe {
        libc::madvise(p, pages * PG, libc::MADV_NOHUGEPAGE);
        libc::madvise(p, pages * PG, libc::MADV_DONTFORK);
    }
    p.cast()
}

/// Pages of `[a, a+n)` that hold a frame (mincore).
fn present(a: *mut u8, n: usize) -> usize {
    let mut v = vec![0u8; n];
    // SAFETY: `n` pages of a live mapping; `v` takes one byte per page.
    let r = unsafe { libc::mincore(a.cast(), n * PG, v.as_mut_ptr()) };
    assert_eq!(r, 0, "mincore: {}", std::io::Error::last_os_error());
    v.iter().filter(|b| *b & 1 != 0).count()
}

fn migrated() -> u64 {
    std::fs::read_to_string("/proc/vmstat")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("pgmigrate_success "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs: u64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(20);
    let compact = !args.iter().any(|a| a == "--no-compaction");
    let uffd = Uffd::open(feature::MOVE).expect("a userfaultfd with UFFDIO_MOVE (Linux 6.8+)");
    let guest = map(GUEST_PAGES);
    let pool = map(POOL_PAGES);
    uffd.register(guest as u64, (GUEST_PAGES * PG) as u64, mode::MISSING)
        .expect("register the guest view");
    uffd.register(pool as u64, (POOL_PAGES * PG) as u64, mode::WP)
        .expect("register the pool");
    let mut page = vec![0u8; PG];
    for p in 0..GUEST_PAGES {
        page[..8].copy_from_slice(&(p as u64).to_ne_bytes());
        // SAFETY: one page of the guest view, which has none yet.
        uffd.copy_page(guest as u64 + (p * PG) as u64, page.as_ptr() as u64, false)
            .expect("fill the guest view");
    }
    let stop = AtomicBool::new(false);
    let errors = AtomicU64::new(0);
    let moves = AtomicU64::new(0);
    let before = migrated();
    let started = Instant::now();
    std::thread::scope(|s| {
        if compact {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    if std::fs::write("/proc/sys/vm/compact_memory", "1").is_err() {
                        eprintln!("cannot write /proc/sys/vm/compact_memory (needs root)");
                        std::process::exit(2);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
        }
        let bad = |what: String| {
            if errors.fetch_add(1, Ordering::Relaxed) < 10 {
                eprintln!("{what}");
            }
        };
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        while started.elapsed() < Duration::from_secs(secs) {
            for b in 0..GUEST_PAGES / RUN {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let off = (seed % (POOL_PAGES - RUN) as u64) as usize;
                // SAFETY: in bounds of the two mappings (b < GUEST_PAGES / RUN, off + RUN <
                // POOL_PAGES).
                let (g, p) = unsafe { (guest.add(b * RUN * PG), pool.add(off * PG)) };
                let len = (RUN * PG) as u64;
                if let Err(e) = uffd.move_range(p as u64, g as u64, len, false) {
                    bad(format!("run {b}: moving out: {e}"));
                    continue;
                }
                if present(g, RUN) != 0 || present(p, RUN) != RUN {
                    bad(format!(
                        "run {b}: after moving out, {} pages left in the guest view, {} of \
                         {RUN} in the pool",
                        present(g, RUN),
                        present(p, RUN)
                    ));
                }
                if let Err(e) = uffd.move_range(g as u64, p as u64, len, false) {
                    bad(format!("run {b}: moving in: {e}"));
                    continue;
                }
                moves.fetch_add(2, Ordering::Relaxed);
                if present(g, RUN) != RUN || present(p, RUN) != 0 {
                    bad(format!(
                        "run {b}: after moving in, {} of {RUN} pages in the guest view, {} \
                         left in the pool",
                        present(g, RUN),
                        present(p, RUN)
                    ));
                    continue;
                }
                for i in 0..RUN {
                    let want = (b * RUN + i) as u64;
                    // SAFETY: a page of the guest view that holds a frame (checked above).
                    let got = unsafe { g.add(i * PG).cast::<u64>().read_volatile() };
                    if got != want {
                        bad(format!("page {want}: holds page {got}'s content"));
                    }
                }
            }
        }
        stop.store(true, Ordering::Relaxed);
    });
    let errors = errors.load(Ordering::Relaxed);
    println!(
        "{} moves of {RUN}-page runs in {secs} s, {} pages migrated by the kernel meanwhile \
         (compaction {}): {errors} errors",
        moves.load(Ordering::Relaxed),
        migrated() - before,
        if compact { "on" } else { "off" }
    );
    std::process::exit(i32::from(errors > 0));
}
