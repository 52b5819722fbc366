//! Table 6: one page cycle with memfd guest RAM (today's engine) against anonymous guest RAM
//! whose pages move between the guest view and a pool of staging pages with `UFFDIO_MOVE`.
//!
//! memfd (as the engine does it): the received bytes land in the memfd page through the alias
//! (the page was freed at its last eviction, so the kernel faults, allocates and zeroes it
//! first), `UFFDIO_CONTINUE` maps it into the guest view, eviction zaps the guest view
//! (`MADV_DONTNEED`), unmaps the alias and punches the page out of the memfd (`MADV_REMOVE`).
//!
//! anon + MOVE: guest RAM is private anonymous memory registered MISSING; a staging area of the
//! same size (private anonymous, registered in WP mode only, so that it is a valid `UFFDIO_MOVE`
//! destination while its own missing faults stay the kernel's) holds the physical pages not
//! mapped into the guest. The bytes land in a staging page that is already resident (a copy
//! only), `UFFDIO_MOVE` moves it into the guest address, eviction moves it back out into the
//! now empty staging slot (where write-back and the fingerprint would read it, and the next
//! landing reuses it). No page is allocated, zeroed or freed in the cycle.
//!
//! anon + MOVE via a free pool: as the engine would run it, with a staging area that mirrors
//! guest RAM page for page (so a run of guest pages has a run of staging slots, and moves in
//! one call both ways) and a pool of free pages beside it: before the read, the landing pages
//! move from the pool into the mirror (land = that move + the copy); after the eviction's
//! write-back they move back to the pool (free). Four moves per cycle, still no allocation.
//!
//! Every step is timed as this thread's CPU time over all pages of a pass, per page; each
//! variant runs `PASSES` passes and the table gives the median pass. "Scattered" is every other
//! page of the region, one page per call for MOVE (the ioctl takes one range) and one vectored
//! `process_madvise` per 64 pages for the memfd zap and frees, as the engine issues them.
//! "Runs of 64" moves, installs, zaps and frees 64 contiguous pages per call. The variants run
//! alone and with a sibling thread of this process spinning on the other CPU (as a running vCPU
//! does): then every TLB flush of a page-table change is an IPI to that CPU.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use farvm_ept::sys::anon::AnonRam;
use farvm_ept::sys::mem::GuestRam;
use farvm_ept::sys::uffd::{self, Uffd};
use farvm_ept::PAGE_SIZE;

use super::{median, thread_cpu_ns};

const PAGES: u64 = 4096;
const RUN: u64 = 64;
const PASSES: usize = 7;
const PG: u64 = PAGE_SIZE as u64;

/// Per-page CPU ns of each step of one pass: land, install, evict, free.
type Steps = [f64; 4];

/// Which pages a pass cycles and how many per call.
#[derive(Clone, Copy)]
enum Shape {
    Scattered,
    Runs,
}

impl Shape {
    /// The `(first page, pages)` calls of one pass.
    fn calls(self) -> Vec<(u64, u64)> {
        match self {
            Shape::Scattered => (0..PAGES).step_by(2).map(|p| (p, 1)).collect(),
            Shape::Runs => (0..PAGES).step_by(RUN as usize).map(|p| (p, RUN)).collect(),
        }
    }
}

fn per_page(calls: &[(u64, u64)], f: &mut dyn FnMut(u64, u64)) -> f64 {
    let pages: u64 = calls.iter().map(|c| c.1).sum();
    let t = thread_cpu_ns();
    for &(p, n) in calls {
        f(p, n);
    }
    (thread_cpu_ns() - t) as f64 / pages as f64
}

fn land(dst: *mut u8, src: &[u8], n: u64) {
    for i in 0..n as usize {
        // SAFETY: callers pass `n` pages of a mapping this benchmark owns; `src` is a separate
        // 4 KiB buffer.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst.add(i * PAGE_SIZE), PAGE_SIZE) };
    }
}

fn memfd_pass(ram: &GuestRam, u: &Uffd, shape: Shape, src: &[u8]) -> Steps {
    let calls = shape.calls();
    let landed = per_page(&calls, &mut |p, n| land(ram.alias_page(p), src, n));
    let install = per_page(&calls, &mut |p, n| {
        u.continue_range(ram.guest_page_addr(p), n * PG, false)
            .expect("UFFDIO_CONTINUE");
    });
    // The engine zaps and frees a round's victims with one vectored call per 64 runs.
    let batches: Vec<Vec<(u64, u64)>> = calls.chunks(64).map(|c| c.to_vec()).collect();
    let pages_in = |b: &[(u64, u64)]| b.iter().map(|c| c.1).sum::<u64>();
    let total: u64 = calls.iter().map(|c| c.1).sum();
    let t = thread_cpu_ns();
    for b in &batches {
        ram.zap_guest_spans(b).expect("zap");
    }
    let evict = (thread_cpu_ns() - t) as f64 / total as f64;
    let t = thread_cpu_ns();
    for b in &batches {
        ram.unmap_alias_spans(b).expect("unmap alias");
        let pages: Vec<u64> = b.iter().flat_map(|&(p, n)| p..p + n).collect();
        debug_assert_eq!(pages.len() as u64, pages_in(b));
        ram.free(&pages).expect("punch");
    }
    let free = (thread_cpu_ns() - t) as f64 / total as f64;
    [landed, install, evict, free]
}

/// Anonymous guest RAM for the cycle: free frames start in the staging slots (plain MOVE) or
/// in the pool (`pooled`).
fn anon_ram(pages: u64, pooled: bool) -> std::io::Result<AnonRam> {
    let ram = AnonRam::new(pages as usize * PAGE_SIZE, pages, uffd::feature::THREAD_ID)?;
    if pooled {
        ram.fill_pool(0, pages)?;
    } else {
        for p in 0..pages {
            // SAFETY: in bounds of the staging area, whose missing faults are the kernel's.
            unsafe { core::ptr::write_volatile(ram.staging_page(p), 1u8) };
        }
    }
    Ok(ram)
}

fn anon_pass(ram: &AnonRam, shape: Shape, src: &[u8]) -> Steps {
    let calls = shape.calls();
    // Guest page p cycles through staging slot p.
    let landed = per_page(&calls, &mut |p, n| land(ram.staging_page(p), src, n));
    let install = per_page(&calls, &mut |p, n| {
        ram.move_in(p, n, false).expect("UFFDIO_MOVE in")
    });
    let evict = per_page(&calls, &mut |p, n| {
        ram.move_out(p, n).expect("UFFDIO_MOVE out")
    });
    [landed, install, evict, 0.0]
}

fn anon_pool_pass(ram: &AnonRam, shape: Shape, src: &[u8]) -> Steps {
    let calls = shape.calls();
    // The pool hands out its top pages; which ones does not change the cost of a move.
    let landed = per_page(&calls, &mut |p, n| {
        ram.take(p, p, n).expect("UFFDIO_MOVE pool -> staging");
        land(ram.staging_page(p), src, n)
    });
    let install = per_page(&calls, &mut |p, n| {
        ram.move_in(p, n, false).expect("UFFDIO_MOVE in")
    });
    let evict = per_page(&calls, &mut |p, n| {
        ram.move_out(p, n).expect("UFFDIO_MOVE out")
    });
    let free = per_page(&calls, &mut |p, n| {
        ram.give(p, p, n).expect("UFFDIO_MOVE staging -> pool")
    });
    [landed, install, evict, free]
}

/// Checks the mechanism once: the bytes landed in a slot are what the guest address reads after
/// the move in, and what the slot reads after the move out (the page moved, not copied).
fn check(ram: &AnonRam) {
    let src: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7) as u8).collect();
    land(ram.staging_page(0), &src, 1);
    ram.move_in(0, 1, false)
        .expect("UFFDIO_MOVE (Linux >= 6.8 with UFFD_FEATURE_MOVE)");
    let g = ram.guest_page_addr(0) as *mut u8;
    // SAFETY: guest page 0 was just moved in, so reading it does not fault into the uffd.
    let got = unsafe { core::slice::from_raw_parts(g, PAGE_SIZE) };
    assert_eq!(got, &src[..], "the guest address reads the moved page");
    // SAFETY: guest page 0 is mapped; this write lands in the moved page.
    unsafe { core::ptr::write_volatile(g, 0xEE) };
    ram.move_out(0, 1).expect("UFFDIO_MOVE back");
    // SAFETY: slot 0 holds the page again.
    let s = unsafe { core::slice::from_raw_parts(ram.staging_page(0), PAGE_SIZE) };
    assert_eq!(s[0], 0xEE, "the guest's write moved out with the page");
    assert_eq!(&s[1..], &src[1..]);
}

fn median_steps(mut passes: Vec<Steps>) -> Steps {
    let mut out = [0.0; 4];
    for (i, o) in out.iter_mut().enumerate() {
        let mut v: Vec<u64> = passes.iter_mut().map(|s| s[i] as u64).collect();
        *o = median(&mut v) as f64;
    }
    out
}

/// A thread of this process spinning on another CPU until dropped.
struct Sibling {
    stop: Arc<AtomicBool>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl Sibling {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let join = Some(std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        }));
        Self { stop, join }
    }
}

impl Drop for Sibling {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(j) = self.join.take() {
            j.join().expect("sibling");
        }
    }
}

pub fn table() {
    let src = vec![0xA5u8; PAGE_SIZE];
    let memfd = GuestRam::new(PAGES as usize * PAGE_SIZE).expect("memfd");
    let mu = Uffd::open(uffd::feature::THREAD_ID | uffd::feature::MINOR_SHMEM)
        .expect("userfaultfd (run as root)");
    mu.register(
        memfd.guest_base(),
        memfd.len() as u64,
        uffd::mode::MISSING | uffd::mode::MINOR,
    )
    .expect("register memfd");
    let made = anon_ram(PAGES, false).and_then(|a| Ok((a, anon_ram(PAGES, true)?)));
    let (anon, pooled) = match made {
        Ok(a) => a,
        Err(e) => {
            println!("## 6. Page cycle: UFFDIO_MOVE unavailable here ({e})\n");
            return;
        }
    };
    check(&anon);
    println!(
        "## 6. One page cycle: memfd + UFFDIO_CONTINUE vs anonymous + UFFDIO_MOVE \
         (CPU ns per page, median of {PASSES} passes over {PAGES} pages)\n"
    );
    println!("| sibling thread | backing | calls | land | install | evict | free | cycle | cycle / memfd |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for sibling in [false, true] {
        let _s = sibling.then(Sibling::start);
        for (shape, name) in [
            (Shape::Scattered, "every other page, 1 per call"),
            (Shape::Runs, "runs of 64"),
        ] {
            let m = median_steps(
                (0..PASSES)
                    .map(|_| memfd_pass(&memfd, &mu, shape, &src))
                    .collect(),
            );
            let a = median_steps((0..PASSES).map(|_| anon_pass(&anon, shape, &src)).collect());
            let ap = median_steps(
                (0..PASSES)
                    .map(|_| anon_pool_pass(&pooled, shape, &src))
                    .collect(),
            );
            let mc: f64 = m.iter().sum();
            let sib = if sibling { "spinning" } else { "none" };
            for (backing, st) in [
                ("memfd + CONTINUE", m),
                ("anon + MOVE", a),
                ("anon + MOVE via a free pool", ap),
            ] {
                let c: f64 = st.iter().sum();
                println!(
                    "| {sib} | {backing} | {name} | {:.0} | {:.0} | {:.0} | {:.0} | {c:.0} | {:.2}x |",
                    st[0],
                    st[1],
                    st[2],
                    st[3],
                    c / mc
                );
            }
        }
    }
    println!(
        "\nmemfd: land = copy through the alias into a freed page (fault, allocate, zero, copy); \
         install = UFFDIO_CONTINUE; evict = zap the guest view; free = unmap the alias and \
         MADV_REMOVE. anon: land = copy into a resident staging page; install = UFFDIO_MOVE \
         staging -> guest; evict = UFFDIO_MOVE guest -> the free staging slot; free = nothing \
         (the slot is reused). anon via a free pool: land = UFFDIO_MOVE pool -> staging + the \
         copy; free = UFFDIO_MOVE staging -> pool.\n"
    );
}
