//! Bring-up: the BSP validates BootInfo, sizes and initialises the allocators, builds the IDT
//! and creates every process; the APs wait for `BOOT_DONE`, then every vCPU loads its tables
//! and enters its first process.

use core::ptr::addr_of;
use core::sync::atomic::{AtomicBool, Ordering};

use farvm_guest_agent::boot::{exit, flags, BootInfo, MemRange, BOOT_MAGIC, MAX_RAM_RANGES};
use farvm_guest_agent::frames::FrameOrder;
use farvm_guest_agent::{ABI_VERSION, PAGE_SIZE};

use crate::arch::{image_gpa, pause, phys};
use crate::pv::{shutdown, Msg};
use crate::{cpu, elf, mm, proc, sched, MAX_CPUS};

/// Ticks cost ~250 µs of emulated ring 0 each: at most 100 Hz (2.5 % of a vCPU).
const MAX_TIMER_HZ: u32 = 100;

static BOOT_DONE: AtomicBool = AtomicBool::new(false);

/// The embedded ring-3 program.
static USER_ELF: &[u8] = include_bytes!(env!("FARVM_USER_ELF"));

/// Called by `_start` on every vCPU with its own boot stack.
pub extern "C" fn kmain(boot_gpa: u64, cpu_no: u64) -> ! {
    let cpu_no = cpu_no as usize;
    if cpu_no == 0 {
        bsp_boot(boot_gpa);
        BOOT_DONE.store(true, Ordering::Release);
    } else {
        while !BOOT_DONE.load(Ordering::Acquire) {
            pause();
        }
    }
    sched::start(cpu_no)
}

fn bad(what: &[u8], v: u64) -> ! {
    Msg::new(0)
        .s(b"bad BootInfo: ")
        .s(what)
        .s(b" ")
        .hex(v)
        .log();
    shutdown(exit::BAD_BOOT_INFO)
}

fn bad_proc(what: &[u8], idx: usize) -> ! {
    Msg::new(0)
        .s(b"bad BootInfo: process ")
        .dec(idx as u64)
        .s(b": ")
        .s(what)
        .log();
    shutdown(exit::BAD_BOOT_INFO)
}

fn oom(what: &[u8], v: u64) -> ! {
    Msg::new(0)
        .s(b"out of memory: ")
        .s(what)
        .s(b" ")
        .dec(v)
        .log();
    shutdown(exit::OUT_OF_MEMORY)
}

fn bsp_boot(boot_gpa: u64) {
    let bi = phys(boot_gpa) as *const BootInfo;
    // Scalars read one by one: a BootInfo copy would be a 3.7 KB emulated memcpy.
    macro_rules! field {
        ($f:ident) => {
            // SAFETY: the VMM wrote BootInfo at boot_gpa (direct-mapped) before starting us.
            unsafe { addr_of!((*bi).$f).read_volatile() }
        };
    }
    if field!(magic) != BOOT_MAGIC {
        bad(b"magic", field!(magic));
    }
    if field!(abi_version) != ABI_VERSION {
        bad(b"abi_version (kernel wants 1)", field!(abi_version) as u64);
    }
    let ncpus = field!(ncpus);
    if ncpus == 0 || ncpus as usize > MAX_CPUS {
        bad(b"ncpus (1..=16)", ncpus as u64);
    }
    let nprocs = field!(nprocs);
    if nprocs as usize > crate::MAX_PROCS {
        bad(b"nprocs (<= 64)", nprocs as u64);
    }
    let nram = field!(nram) as usize;
    if nram == 0 || nram > MAX_RAM_RANGES {
        bad(b"nram (1..=4)", nram as u64);
    }
    let mut ram = [MemRange::default(); MAX_RAM_RANGES];
    for (i, r) in ram.iter_mut().enumerate().take(nram) {
        // SAFETY: as in field!; i < nram <= MAX_RAM_RANGES.
        *r = unsafe { addr_of!((*bi).ram[i]).read_volatile() };
    }
    let boot_flags = field!(flags);
    let first_free = field!(first_free_gpa);
    let blob = (field!(blob_gpa), field!(blob_len));
    if blob.1 != 0 && (blob.0 % PAGE_SIZE != 0 || blob.0.saturating_add(blob.1) > first_free) {
        bad(b"blob_gpa (page aligned, below first_free_gpa)", blob.0);
    }
    // Only the address of the linker-script symbol is taken (no read).
    let kernel_end = image_gpa(core::ptr::addr_of!(KERNEL_END));
    if first_free % PAGE_SIZE != 0 || first_free < kernel_end {
        bad(b"first_free_gpa", first_free);
    }

    // Size the pool for the whole plan (page tables, kernel stacks, FPU areas, mailboxes).
    let mut pool_pages = 16u64;
    for i in 0..nprocs as usize {
        // SAFETY: as in field!; i < nprocs <= MAX_PROCS.
        let ws = unsafe { addr_of!((*bi).procs[i].ws_bytes).read_volatile() };
        if ws > farvm_guest_agent::boot::user::HEAP_MAX {
            bad_proc(b"ws_bytes above 64 GiB", i);
        }
        pool_pages += proc::pool_pages(ws);
        // SAFETY: as above.
        let w = unsafe { addr_of!((*bi).procs[i].workload).read_volatile() };
        if w == farvm_guest_agent::boot::workload::REPLAY {
            // Page tables of the blob mapping: a PDPT, a PD and one table per 2 MiB.
            pool_pages += 2 + blob.1.div_ceil(2 << 20);
        }
    }
    let pool_end = first_free + pool_pages * PAGE_SIZE;
    if pool_end > (ram[0].gpa + ram[0].len).min(1 << 32) {
        oom(b"page-table pool pages", pool_pages);
    }
    let seed = field!(frame_shuffle_seed);
    let shift = field!(frame_run_shift);
    let order = FrameOrder::new(seed, shift, pool_end, &ram[..nram]);
    mm::init(
        0,
        first_free,
        pool_end - first_free,
        boot_flags & flags::RAM_IS_ZERO != 0,
        order,
        [seed, shift as u64, pool_end],
    );
    cpu::build_idt();
    let Some(img) = elf::parse(USER_ELF) else {
        Msg::new(0)
            .s(b"embedded user program is not a valid ELF")
            .log();
        shutdown(exit::BAD_USER_IMAGE);
    };
    let img_gpa = image_gpa(USER_ELF.as_ptr());
    let tsc_khz = field!(tsc_khz);
    for i in 0..nprocs as usize {
        // SAFETY: as in field!; the spec is read in place, not copied.
        let spec = unsafe { &*addr_of!((*bi).procs[i]) };
        if spec.cpu >= ncpus {
            bad_proc(b"cpu >= ncpus", i);
        }
        if proc::create(i, spec, boot_flags, tsc_khz, &img, img_gpa, blob).is_err() {
            oom(b"creating pid", i as u64 + 1);
        }
        sched::enqueue(spec.cpu as usize, i);
    }
    sched::configure(nprocs, field!(timer_hz).min(MAX_TIMER_HZ), boot_flags);
    Msg::new(0)
        .s(b"farvm testguest: ")
        .dec(ncpus as u64)
        .s(b" cpus, ")
        .dec(nprocs as u64)
        .s(b" processes, ")
        .dec(mm::frames_left())
        .s(b" free frames")
        .log();
    crate::console::Line::start()
        .s(b"booted: ")
        .dec(ncpus as u64)
        .s(b" cpus, ")
        .dec(nprocs as u64)
        .s(b" processes");
    if nprocs == 0 {
        shutdown(exit::OK);
    }
}

extern "C" {
    /// End of the kernel image (kernel.ld), page aligned.
    static KERNEL_END: u8;
}
