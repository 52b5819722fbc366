//! Table 7: how received pages get into anonymous guest RAM, and how they leave it, when another
//! thread of the process runs on the other CPU (as the vCPU does): every TLB flush of this
//! process's page tables is then a shootdown IPI to that CPU.
//!
//! Guest RAM is an `AnonRam` (guest view registered MISSING, staging mirror, pool). A pass
//! cycles all its pages in calls of `n` contiguous pages (1, 4, 16, 64); per call:
//!
//! - **MOVE from pool slots** (the engine today, `backing.rs`'s `move_in`): the received bytes
//!   land in pool frames (resident: recycled frames of earlier victims), `UFFDIO_MOVE` moves
//!   the run into the guest view (clearing the source PTEs, which this kernel flushes once per
//!   call: it moves a run's entries under one flush), and the clean victim moves straight back
//!   into pool slots (one flush per call); nothing is freed.
//! - **COPY from a landing ring**: the bytes land in a fixed ring of resident frames that are
//!   never moved (as the bounce pages are), `UFFDIO_COPY` allocates new pages in the guest view
//!   and copies the run into them (no source PTE cleared: no flush); the victim moves out to
//!   its staging slots (one flush per call, as today: the guest must lose write access before
//!   the fingerprint) and its frames are freed with one vectored `MADV_DONTNEED` per 64 calls.
//! - **COPY, evicted by MADV_DONTNEED** (for understanding only: a zap drops the data, so it is
//!   no correct eviction of a page that may be dirty): as above, but the run leaves the guest
//!   view with one `MADV_DONTNEED` (one batched flush per call).
//!
//! Each step is this thread's CPU time over a pass, per page (the sender of a shootdown waits
//! for the other CPU to take it, so its cost shows here); the table gives the median of
//! `PASSES` passes. "IPIs / page" is the pass's TLB shootdowns received by all CPUs
//! (`/proc/interrupts`, line `TLB`), per page: what the other CPU pays on top. A flush sends
//! one only while the other thread is running, so on a host whose CPUs are shared with other
//! work the column says how often that was the case.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use farvm_ept::sys::anon::AnonRam;
use farvm_ept::sys::uffd;
use farvm_ept::PAGE_SIZE;

use super::{median, thread_cpu_ns};

const PAGES: u64 = 4096;
/// Landing ring frames (as many as the pool's slots for reads in flight, `LANDING_SLOTS`).
const RING: u64 = 1024;
const PASSES: usize = 7;
const PG: u64 = PAGE_SIZE as u64;
const RUNS: [u64; 4] = [1, 4, 16, 64];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    MovePool,
    CopyRing,
    CopyZap,
}

impl Variant {
    fn name(self) -> &'static str {
        match self {
            Self::MovePool => "MOVE from pool slots, MOVE out to pool slots",
            Self::CopyRing => "COPY from the ring, MOVE out + free",
            Self::CopyZap => "COPY from the ring, MADV_DONTNEED (not an eviction)",
        }
    }
}

/// CPU ns per page of each step (land, install, evict, free) and IPIs per page of the pass.
type Steps = [f64; 5];

/// TLB shootdowns received so far by all CPUs.
fn tlb_ipis() -> u64 {
    let s = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
    s.lines()
        .find(|l| l.trim_start().starts_with("TLB:"))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .map_while(|w| w.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// Pins the calling thread to `cpu`; returns its former affinity mask.
fn pin(cpu: usize) -> Option<libc::cpu_set_t> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; both calls get its true size.
    unsafe {
        let mut old: libc::cpu_set_t = core::mem::zeroed();
        if libc::sched_getaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &mut old) != 0 {
            return None;
        }
        let mut set: libc::cpu_set_t = core::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        (libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &set) == 0)
            .then_some(old)
    }
}

fn unpin(old: libc::cpu_set_t) {
    // SAFETY: restores a mask the kernel gave us.
    unsafe { libc::sched_setaffinity(0, core::mem::size_of::<libc::cpu_set_t>(), &old) };
}

/// A thread of this process on the other CPU, writing its own 64 KiB over and over (a running
/// vCPU's stand-in) until dropped.
struct Toucher {
    stop: Arc<AtomicBool>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl Toucher {
    fn start(cpu: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let laps = Arc::new(AtomicU64::new(0));
        let (s, l) = (stop.clone(), laps.clone());
        let join = Some(std::thread::spawn(move || {
            pin(cpu);
            let mut buf = vec![0u64; 8192];
            let mut k = 0u64;
            while !s.load(Ordering::Relaxed) {
                for w in buf.iter_mut().step_by(8) {
                    *w = w.wrapping_add(k);
                }
                k += 1;
                l.store(k, Ordering::Relaxed);
            }
            std::hint::black_box(&buf);
        }));
        // Running before the first pass.
        while laps.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        Self { stop, join }
    }
}

impl Drop for Toucher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(j) = self.join.take() {
            j.join().expect("toucher");
        }
    }
}

fn land(dst: *mut u8, src: &[u8], n: u64) {
    for i in 0..n as usize {
        // SAFETY: callers pass `n` resident (or kernel-faulted) pages of a mapping this
        // benchmark owns, not registered MISSING; `src` is a separate 4 KiB buffer.
        unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), dst.add(i * PAGE_SIZE), PAGE_SIZE) };
    }
}

fn per_page(calls: &[u64], n: u64, f: &mut dyn FnMut(u64)) -> f64 {
    let t = thread_cpu_ns();
    for &p in calls {
        f(p);
    }
    (thread_cpu_ns() - t) as f64 / (calls.len() as u64 * n) as f64
}

/// Guest RAM with its pool full of resident frames and a landing ring of resident frames.
fn rig() -> std::io::Result<AnonRam> {
    let ram = AnonRam::new(PAGES as usize * PAGE_SIZE, PAGES, uffd::feature::THREAD_ID)?
        .with_bounce(RING)?;
    ram.fill_pool(0, PAGES)?;
    for b in 0..RING {
        // SAFETY: in bounds of the ring, plain anonymous memory.
        unsafe { core::ptr::write_volatile(ram.bounce_page(b), 1u8) };
    }
    Ok(ram)
}

fn ring(ram: &AnonRam, p: u64) -> *mut u8 {
    ram.bounce_page(p % RING)
}

fn pass(ram: &AnonRam, v: Variant, n: u64, src: &[u8]) -> Steps {
    let u = ram.uffd();
    let calls: Vec<u64> = (0..PAGES).step_by(n as usize).collect();
    let guest = |p: u64| ram.guest_page_addr(p);
    let ipis = tlb_ipis();
    let landed = per_page(&calls, n, &mut |p| match v {
        Variant::MovePool => land(ram.pool_page(p), src, n),
        _ => land(ring(ram, p), src, n),
    });
    let install = per_page(&calls, n, &mut |p| {
        let b = match v {
            Variant::MovePool => u.move_range(guest(p), ram.pool_page(p) as u64, n * PG, false),
            _ => u.copy_some(guest(p), ring(ram, p) as u64, n * PG, false),
        };
        assert_eq!(b.expect("install"), n * PG, "the whole run in one call");
    });
    let evict = per_page(&calls, n, &mut |p| match v {
        Variant::MovePool => {
            u.move_range(ram.pool_page(p) as u64, guest(p), n * PG, false)
                .expect("UFFDIO_MOVE out to the pool");
        }
        Variant::CopyRing => ram.move_out(p, n).expect("UFFDIO_MOVE out to staging"),
        Variant::CopyZap => {
            // SAFETY: the run lies in the guest view, which the rig owns; the pages are freed.
            let r = unsafe {
                libc::madvise(
                    guest(p) as *mut libc::c_void,
                    (n * PG) as usize,
                    libc::MADV_DONTNEED,
                )
            };
            assert_eq!(r, 0, "MADV_DONTNEED");
        }
    });
    let free = if v == Variant::CopyRing {
        // One vectored call per 64 runs, as the engine frees a round.
        let t = thread_cpu_ns();
        let runs: Vec<(u64, u64)> = calls.iter().map(|&p| (p, n)).collect();
        for c in runs.chunks(64) {
            ram.drop_staging_runs(c).expect("free the victims' frames");
        }
        (thread_cpu_ns() - t) as f64 / PAGES as f64
    } else {
        0.0
    };
    let ipis = (tlb_ipis() - ipis) as f64 / PAGES as f64;
    [landed, install, evict, free, ipis]
}

/// Checks both installs once: the guest reads the landed bytes, the ring keeps its copy.
fn check(ram: &AnonRam) {
    let u = ram.uffd();
    let src: Vec<u8> = (0..PAGE_SIZE).map(|i| (i * 7) as u8).collect();
    land(ram.pool_page(0), &src, 1);
    land(ring(ram, 1), &src, 1);
    u.move_range(ram.guest_page_addr(0), ram.pool_page(0) as u64, PG, false)
        .expect("UFFDIO_MOVE (Linux >= 6.8 with UFFD_FEATURE_MOVE)");
    u.copy_some(ram.guest_page_addr(1), ring(ram, 1) as u64, PG, false)
        .expect("UFFDIO_COPY");
    for p in 0..2 {
        // SAFETY: guest pages 0 and 1 were just installed; the ring is plain memory.
        let (g, r) = unsafe {
            (
                core::slice::from_raw_parts(ram.guest_page_addr(p) as *const u8, PAGE_SIZE),
                core::slice::from_raw_parts(ring(ram, 1), PAGE_SIZE),
            )
        };
        assert_eq!(g, &src[..], "guest page {p} reads the landed bytes");
        assert_eq!(r, &src[..], "the ring frame keeps its bytes");
    }
    u.move_range(ram.pool_page(0) as u64, ram.guest_page_addr(0), PG, false)
        .expect("back to the pool");
    ram.move_out(1, 1).expect("out to staging");
    ram.drop_staging(1, 1).expect("free");
}

pub fn table() {
    let ram = match rig() {
        Ok(r) => r,
        Err(e) => {
            println!("## 7. Landing: UFFDIO_MOVE unavailable here ({e})\n");
            return;
        }
    };
    check(&ram);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let old = pin(0);
    println!(
        "## 7. Installing runs of received pages: UFFDIO_MOVE from pool slots vs UFFDIO_COPY \
         from a landing ring (CPU ns per page, median of {PASSES} passes over {PAGES} pages)\n"
    );
    if cpus < 2 {
        println!("(one CPU: no other CPU to shoot down, the comparison says nothing)\n");
    }
    println!(
        "| other CPU | pages per call | install and eviction | land | install | evict | free | \
         cycle | install / MOVE | cycle / MOVE | TLB IPIs / page |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let src = vec![0xA5u8; PAGE_SIZE];
    for toucher in [true, false] {
        let _t = (toucher && cpus > 1).then(|| Toucher::start(1));
        let who = if toucher {
            "thread touching memory"
        } else {
            "idle"
        };
        for n in RUNS {
            let mut base = None;
            for v in [Variant::MovePool, Variant::CopyRing, Variant::CopyZap] {
                let passes: Vec<Steps> = (0..PASSES).map(|_| pass(&ram, v, n, &src)).collect();
                let mut st = [0.0; 5];
                for (i, o) in st.iter_mut().enumerate() {
                    // Medians in hundredths (IPIs per page are fractions).
                    let mut col: Vec<u64> = passes.iter().map(|s| (s[i] * 100.0) as u64).collect();
                    *o = median(&mut col) as f64 / 100.0;
                }
                let cycle: f64 = st[..4].iter().sum();
                let (bi, bc) = *base.get_or_insert((st[1], cycle));
                println!(
                    "| {who} | {n} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {cycle:.0} | {:.2}x | \
                     {:.2}x | {:.2} |",
                    v.name(),
                    st[0],
                    st[1],
                    st[2],
                    st[3],
                    st[1] / bi,
                    cycle / bc,
                    st[4]
                );
            }
        }
    }
    if let Some(m) = old {
        unpin(m);
    }
    println!(
        "\nland = the received bytes copied into the landing frame (a pool slot, or the \
         ring); install = UFFDIO_MOVE pool -> guest view (one TLB flush per call) or UFFDIO_COPY \
         ring -> guest view (a new page each, no flush); evict = UFFDIO_MOVE guest view -> pool \
         slots or staging slots (one flush per call), or MADV_DONTNEED of the run (one flush \
         per call; drops the data); free = MADV_DONTNEED of the staging slots, one vectored \
         call per 64 runs. The benchmark thread runs on CPU 0, the other thread on CPU 1.\n"
    );
}
