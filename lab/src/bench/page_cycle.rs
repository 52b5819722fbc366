//! `farvm-lab bench page-cycle`: one page cycle of guest memory a real KVM guest touches, with
//! memfd guest RAM (the engine's: land through the alias, `UFFDIO_CONTINUE`, zap, punch) against
//! anonymous guest RAM whose frames move with `UFFDIO_MOVE` (`farvm_ept::sys::anon::AnonRam`:
//! pool → staging → guest → staging → pool), in alternating passes of one invocation.

use anyhow::{bail, Context, Result};
use clap::Args;
use farvm_ept::sys::anon::AnonRam;
use farvm_ept::sys::mem::GuestRam;
use farvm_ept::sys::uffd::{self, Uffd};
use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};

pub const PAGE_CYCLE_ABOUT: &str = "\
Page cycle with a KVM guest: the host-side CPU of evicting and re-installing guest pages that a
real KVM guest has mapped (so every eviction also pays KVM's mmu-notifier invalidation), and
the guest's CPU to touch each page again afterwards (its first access of a re-installed page
is a KVM page fault resolved from the host mapping), for two backings of guest RAM:

  memfd   the engine's: evict = zap the guest view (MADV_DONTNEED), unmap the alias and
          punch the page out of the memfd (MADV_REMOVE); land = copy 4 KiB through the alias
          into the freed page (the kernel allocates and zeroes it); install = UFFDIO_CONTINUE
  anon    private anonymous memory: evict = UFFDIO_MOVE guest -> staging slot, then the slot
          -> a free pool; land = UFFDIO_MOVE pool -> staging slot and the copy into it;
          install = UFFDIO_MOVE staging -> guest. No page is allocated, zeroed or freed.

The guest is a 16-bit real-mode loop reading one byte of each of the 240 pages from 64 KiB to
1 MiB and then writing an I/O port; the host cycles those pages between passes, one page per
call (every other page, or all of them) or in runs (the memfd zaps and frees, as the
engine's, take up to 64 runs per vectored call; a move takes one). The guest-touch figure is
the guest's whole pass (resident pages included) over the pages cycled. Passes of the two backings alternate; every figure is the median over passes
of one thread's CPU time (CLOCK_THREAD_CPUTIME_ID) per page, the vCPU run on that thread, and
the last column is anon over memfd. Needs /dev/kvm and UFFDIO_MOVE (Linux 6.8 or later).

EXAMPLES
  farvm-lab bench page-cycle
  farvm-lab bench page-cycle --passes 400 --run 16

EXIT STATUS
  0 the table was printed; 1 KVM, userfaultfd or a guest exit failed; 64 bad arguments";

#[derive(Args, Debug)]
pub struct PageCycleArgs {
    /// Passes of each backing and shape (they alternate).
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u64).range(1..))]
    pub passes: u64,
    /// Pages per call in the run-shaped rows (a divisor of 240).
    #[arg(long, default_value_t = 48, value_parser = parse_run)]
    pub run: u64,
}

fn parse_run(s: &str) -> Result<u64, String> {
    s.parse()
        .ok()
        .filter(|&n: &u64| n > 0 && (PAGES - FIRST).is_multiple_of(n))
        .ok_or_else(|| format!("`{s}` does not divide the {} cycled pages", PAGES - FIRST))
}

const PG: u64 = 4096;
/// Guest RAM: 1 MiB, what real mode reaches.
const PAGES: u64 = 256;
/// The pages the guest touches and the host cycles: 64 KiB .. 1 MiB.
const FIRST: u64 = 16;
const CODE_PAGE: u64 = 1;

/// At 0x1000: bx = 0x1000; loop { ds = bx; al = [0]; bx += 0x100 (next 4 KiB) } until bx
/// wraps to 0; out 0x10, al; start over.
const CODE: [u8; 18] = [
    0xBB, 0x00, 0x10, 0x8E, 0xDB, 0xA0, 0x00, 0x00, 0x81, 0xC3, 0x00, 0x01, 0x75, 0xF5, 0xE6, 0x10,
    0xEB, 0xEE,
];

/// The cycled pages as calls `(first page, pages)`: runs of `run` pages, or every other page
/// one by one (`run` 0).
fn calls(run: u64) -> Vec<(u64, u64)> {
    if run == 0 {
        return (FIRST..PAGES).step_by(2).map(|p| (p, 1)).collect();
    }
    (FIRST..PAGES)
        .step_by(run as usize)
        .map(|p| (p, run))
        .collect()
}

/// One backing's guest RAM and the operations of its cycle.
trait Backing {
    fn guest_base(&self) -> u64;
    /// Evicts the runs `spans` (`(first page, pages)`, at most 64).
    fn evict(&self, spans: &[(u64, u64)]) -> Result<()>;
    fn land(&self, p: u64, n: u64, src: &[u8]) -> Result<()>;
    fn install(&self, p: u64, n: u64) -> Result<()>;
}

struct Memfd {
    ram: GuestRam,
    uffd: Uffd,
}

impl Memfd {
    fn new() -> Result<Self> {
        let ram = GuestRam::new((PAGES * PG) as usize).context("memfd guest RAM")?;
        let uffd = Uffd::open(uffd::feature::MINOR_SHMEM).context("userfaultfd")?;
        uffd.register(
            ram.guest_base(),
            PAGES * PG,
            uffd::mode::MISSING | uffd::mode::MINOR,
        )
        .context("register")?;
        for p in 0..PAGES {
            ram.allocate_zero(p);
        }
        Ok(Self { ram, uffd })
    }
}

impl Backing for Memfd {
    fn guest_base(&self) -> u64 {
        self.ram.guest_base()
    }
    fn evict(&self, spans: &[(u64, u64)]) -> Result<()> {
        // As the engine: one vectored call per step for up to 64 runs.
        self.ram.zap_guest_spans(spans)?;
        self.ram.unmap_alias_spans(spans)?;
        let pages: Vec<u64> = spans.iter().flat_map(|&(p, n)| p..p + n).collect();
        Ok(self.ram.free(&pages)?)
    }
    fn land(&self, p: u64, n: u64, src: &[u8]) -> Result<()> {
        for q in p..p + n {
            // SAFETY: the alias page of q is in bounds and only this benchmark writes it.
            unsafe {
                core::ptr::copy_nonoverlapping(src.as_ptr(), self.ram.alias_page(q), src.len())
            };
        }
        Ok(())
    }
    fn install(&self, p: u64, n: u64) -> Result<()> {
        self.uffd
            .continue_range(self.ram.guest_page_addr(p), n * PG, false)?;
        Ok(())
    }
}

struct Anon {
    ram: AnonRam,
}

impl Anon {
    fn new() -> Result<Self> {
        let ram = AnonRam::new((PAGES * PG) as usize, PAGES, 0)
            .context("anonymous guest RAM with UFFDIO_MOVE (Linux >= 6.8)")?;
        // Every page's frame starts in the pool slot of the same number.
        ram.fill_pool(0, PAGES)?;
        Ok(Self { ram })
    }
}

impl Backing for Anon {
    fn guest_base(&self) -> u64 {
        self.ram.guest_base()
    }
    fn evict(&self, spans: &[(u64, u64)]) -> Result<()> {
        // UFFDIO_MOVE takes one range per call.
        for &(p, n) in spans {
            self.ram.move_out(p, n)?;
            self.ram.give(p, p, n)?;
        }
        Ok(())
    }
    fn land(&self, p: u64, n: u64, src: &[u8]) -> Result<()> {
        self.ram.take(p, p, n)?;
        for q in p..p + n {
            // SAFETY: staging slot q holds the frame just taken; only this benchmark uses it.
            unsafe {
                core::ptr::copy_nonoverlapping(src.as_ptr(), self.ram.staging_page(q), src.len())
            };
        }
        Ok(())
    }
    fn install(&self, p: u64, n: u64) -> Result<()> {
        Ok(self.ram.move_in(p, n, false)?)
    }
}

/// A VM over one backing, its vCPU parked at the guest's `out`.
struct Guest {
    _vm: VmFd,
    vcpu: VcpuFd,
}

impl Guest {
    fn new(kvm: &Kvm, b: &dyn Backing) -> Result<Self> {
        // Code and every other page in place.
        let mut code = vec![0u8; PG as usize];
        code[..CODE.len()].copy_from_slice(&CODE);
        let zero = vec![0u8; PG as usize];
        for p in 0..PAGES {
            b.land(p, 1, if p == CODE_PAGE { &code } else { &zero })?;
            b.install(p, 1)?;
        }
        let vm = kvm.create_vm().context("KVM_CREATE_VM")?;
        let region = kvm_userspace_memory_region {
            slot: 0,
            guest_phys_addr: 0,
            memory_size: PAGES * PG,
            userspace_addr: b.guest_base(),
            flags: 0,
        };
        // SAFETY: the region is a live mapping of PAGES pages that outlives the VM (the caller
        // drops the guest before the backing).
        unsafe { vm.set_user_memory_region(region) }.context("KVM_SET_USER_MEMORY_REGION")?;
        let vcpu = vm.create_vcpu(0).context("KVM_CREATE_VCPU")?;
        let mut sregs = vcpu.get_sregs()?;
        for seg in [&mut sregs.cs, &mut sregs.ds, &mut sregs.es, &mut sregs.ss] {
            seg.base = 0;
            seg.selector = 0;
        }
        vcpu.set_sregs(&sregs)?;
        let mut regs = vcpu.get_regs()?;
        regs.rip = CODE_PAGE * PG;
        regs.rflags = 2;
        vcpu.set_regs(&regs)?;
        let mut g = Self { _vm: vm, vcpu };
        g.pass()?; // first touches, outside the measurement
        Ok(g)
    }

    /// Runs one touching pass: to the guest's `out 0x10`.
    fn pass(&mut self) -> Result<()> {
        loop {
            match self.vcpu.run().context("KVM_RUN")? {
                VcpuExit::IoOut(0x10, _) => return Ok(()),
                VcpuExit::Intr => continue,
                other => bail!("unexpected guest exit {other:?}"),
            }
        }
    }
}

/// CPU ns of one pass per cycled page: evict, land + install, guest touch (the guest's pass
/// over all 240 pages, resident ones included, over the pages cycled).
fn one_pass(b: &dyn Backing, g: &mut Guest, calls: &[(u64, u64)], src: &[u8]) -> Result<[u64; 3]> {
    let thread_cpu_ns = || farvm_memclient::bench::thread_cpu().as_nanos() as u64;
    let pages: u64 = calls.iter().map(|c| c.1).sum();
    let t0 = thread_cpu_ns();
    for batch in calls.chunks(64) {
        b.evict(batch)?;
    }
    let t1 = thread_cpu_ns();
    for &(p, n) in calls {
        b.land(p, n, src)?;
        b.install(p, n)?;
    }
    let t2 = thread_cpu_ns();
    g.pass()?;
    let t3 = thread_cpu_ns();
    Ok([(t1 - t0) / pages, (t2 - t1) / pages, (t3 - t2) / pages])
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

pub fn run(a: PageCycleArgs) -> Result<()> {
    let kvm = Kvm::new().context("/dev/kvm")?;
    let memfd = Memfd::new()?;
    let anon = Anon::new()?;
    let mut gm = Guest::new(&kvm, &memfd)?;
    let mut ga = Guest::new(&kvm, &anon)?;
    let src = vec![0x5Au8; PG as usize];
    println!(
        "# Page cycle with a KVM guest: {} pages, {} alternating passes per row (CPU ns per page, medians)\n",
        PAGES - FIRST,
        a.passes
    );
    println!("| calls | step | memfd | anon | anon / memfd |");
    println!("|---|---|---|---|---|");
    for (name, run) in [
        ("every other page, 1 per call", 0),
        ("1 page per call", 1),
        ("runs", a.run),
    ] {
        let calls = calls(run);
        let mut m: Vec<[u64; 3]> = Vec::with_capacity(a.passes as usize);
        let mut n: Vec<[u64; 3]> = Vec::with_capacity(a.passes as usize);
        for i in 0..a.passes {
            // Alternate which backing goes first.
            if i % 2 == 0 {
                m.push(one_pass(&memfd, &mut gm, &calls, &src)?);
                n.push(one_pass(&anon, &mut ga, &calls, &src)?);
            } else {
                n.push(one_pass(&anon, &mut ga, &calls, &src)?);
                m.push(one_pass(&memfd, &mut gm, &calls, &src)?);
            }
        }
        let label = if run <= 1 {
            name.to_string()
        } else {
            format!("{name} of {run}")
        };
        let col = |v: &[[u64; 3]], i: usize| median(v.iter().map(|x| x[i]).collect());
        let sum = |v: &[[u64; 3]]| median(v.iter().map(|x| x.iter().sum()).collect());
        for (i, step) in ["evict", "land + install", "guest touch"]
            .iter()
            .enumerate()
        {
            let (x, y) = (col(&m, i), col(&n, i));
            println!(
                "| {label} | {step} | {x} | {y} | {:.2} |",
                y as f64 / x.max(1) as f64
            );
        }
        let (x, y) = (sum(&m), sum(&n));
        println!(
            "| {label} | whole cycle | {x} | {y} | {:.2} |",
            y as f64 / x.max(1) as f64
        );
    }
    drop((gm, ga));
    Ok(())
}
