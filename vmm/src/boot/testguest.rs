//! Boot data for the farvm test guest: the VMM-built page tables, the boot GDT and
//! [`BootInfo`], laid out as `farvm_guest_agent::boot` specifies.

use farvm_guest_agent::boot::{
    self, BootInfo, MemRange, ProcessSpec, BOOT_GDT_GPA, BOOT_INFO_GPA, BOOT_MAGIC, BOOT_PML4_GPA,
    BOOT_TABLES_GPA, KERNEL_PHYS_BASE, MAX_PROCS, MAX_RAM_RANGES,
};
use farvm_guest_agent::ABI_VERSION;

use super::{elf, BootError, EntryState};
use vm_memory::{ByteValued, Bytes, GuestAddress};

use crate::vstate::memory::GuestRam;

const PTE_P: u64 = 1 << 0;
const PTE_RW: u64 = 1 << 1;
/// Accessed/Dirty preset: on this shadow-paging host a first touch through an entry with A/D
/// clear costs an extra fault (host-kvm-uffd.md §4).
const PTE_A: u64 = 1 << 5;
const PTE_D: u64 = 1 << 6;
const PTE_PS: u64 = 1 << 7;
const PTE_NX: u64 = 1 << 63;
const TABLE: u64 = PTE_P | PTE_RW | PTE_A;
const LEAF_2M: u64 = PTE_P | PTE_RW | PTE_A | PTE_D | PTE_PS;

const DIRECT_PDPT: u64 = 0x2000;
const WINDOW_PDPT: u64 = 0x3000;
const WINDOW_PD: u64 = 0x4000;

/// Selectors of the boot GDT.
pub const CODE64_SELECTOR: u16 = 0x08;
/// Data selector of the boot GDT.
pub const DATA_SELECTOR: u16 = 0x10;
const GDT: [u64; 3] = [0, 0x00af_9a00_0000_ffff, 0x00cf_9200_0000_ffff];

/// The test plan written into [`BootInfo`].
#[derive(Clone, Debug, Default)]
pub struct TestPlan {
    /// One entry per ring-3 process.
    pub procs: Vec<ProcessSpec>,
    /// LAPIC timer rate (0: cooperative scheduling only).
    pub timer_hz: u32,
    /// `boot::flags::*`.
    pub flags: u64,
    /// Seed of the free-frame shuffle (0: frames in ascending order).
    pub frame_shuffle_seed: u64,
    /// Free-list fragmentation: runs of `1 << frame_run_shift` frames (0 = every frame shuffled).
    pub frame_run_shift: u32,
    /// The boot blob (the `replay` workload's trace), loaded page aligned right after the
    /// kernel like an initrd; empty for none.
    pub blob: Vec<u8>,
}

/// Loads the test-guest ELF and writes page tables, GDT and BootInfo. Returns the entry state
/// of vCPU 0 (others differ only in `rsi`).
pub fn setup(
    ram: &GuestRam,
    kernel: &[u8],
    ncpus: u32,
    tsc_khz: u64,
    plan: &TestPlan,
) -> Result<EntryState, BootError> {
    if ram.regions().len() > MAX_RAM_RANGES {
        return Err(BootError::Setup(format!(
            "{} RAM ranges; the test guest takes at most {MAX_RAM_RANGES}",
            ram.regions().len()
        )));
    }
    if plan.procs.len() > MAX_PROCS {
        return Err(BootError::Setup(format!(
            "{} processes requested; the test guest takes at most {MAX_PROCS}",
            plan.procs.len()
        )));
    }
    let loaded = elf::load(ram, kernel, KERNEL_PHYS_BASE)?;
    write_page_tables(ram)?;
    write_gdt(ram)?;
    let mut first_free = (loaded.phys_end + 0xfff) & !0xfff;
    let blob_gpa = first_free;
    if !plan.blob.is_empty() {
        let end = blob_gpa + plan.blob.len() as u64;
        let low_ram_end = ram.regions().first().map_or(0, |r| r.gpa() + r.len());
        if end > low_ram_end {
            return Err(BootError::Setup(format!(
                "the boot blob ({} bytes) does not fit in the guest's RAM below {:#x}",
                plan.blob.len(),
                low_ram_end
            )));
        }
        ram.write_slice(&plan.blob, GuestAddress(blob_gpa))?;
        first_free = (end + 0xfff) & !0xfff;
    }
    let ranges: Vec<MemRange> = ram
        .regions()
        .iter()
        .map(|r| MemRange {
            gpa: r.gpa(),
            len: r.len(),
        })
        .collect();
    let mut info = boot_info(&ranges, first_free, ncpus, tsc_khz, plan);
    if !plan.blob.is_empty() {
        info.blob_gpa = blob_gpa;
        info.blob_len = plan.blob.len() as u64;
    }
    ram.write_obj(info, GuestAddress(BOOT_INFO_GPA))?;
    Ok(EntryState {
        rip: loaded.entry,
        rsi: 0,
        rdi: BOOT_INFO_GPA,
        rsp: 0,
        cr3: BOOT_PML4_GPA,
        code_selector: CODE64_SELECTOR,
        data_selector: DATA_SELECTOR,
        gdt_base: BOOT_GDT_GPA,
        gdt_limit: (GDT.len() * 8 - 1) as u16,
    })
}

/// The [`BootInfo`] of `plan` on a machine with RAM `ranges` (at most [`MAX_RAM_RANGES`], and
/// the plan at most [`MAX_PROCS`] processes: callers check), the kernel's frames starting at
/// `first_free`.
pub(crate) fn boot_info(
    ranges: &[MemRange],
    first_free: u64,
    ncpus: u32,
    tsc_khz: u64,
    plan: &TestPlan,
) -> BootInfo {
    // Filled field by field from zero so fields the ABI appends later start out 0.
    let mut info = BootInfo::zeroed();
    info.magic = BOOT_MAGIC;
    info.abi_version = ABI_VERSION;
    info.ncpus = ncpus;
    info.mem_bytes = ranges.iter().map(|r| r.len).sum();
    info.first_free_gpa = first_free;
    info.tsc_khz = tsc_khz;
    info.timer_hz = plan.timer_hz;
    info.nprocs = plan.procs.len() as u32;
    info.flags = plan.flags;
    info.frame_shuffle_seed = plan.frame_shuffle_seed;
    info.procs[..plan.procs.len()].copy_from_slice(&plan.procs);
    info.frame_run_shift = plan.frame_run_shift;
    info.nram = ranges.len() as u32;
    info.ram[..ranges.len()].copy_from_slice(ranges);
    info
}

fn write_gdt(ram: &GuestRam) -> Result<(), BootError> {
    for (i, d) in GDT.iter().enumerate() {
        ram.write_obj(*d, GuestAddress(BOOT_GDT_GPA + 8 * i as u64))?;
    }
    Ok(())
}

/// PML4 at 0x1000; all RAM at DIRECT_MAP_BASE (2 MiB pages, NX; the MMIO hole unmapped);
/// guest-physical 0..1 GiB at KERNEL_WINDOW_BASE (2 MiB pages, executable).
fn write_page_tables(ram: &GuestRam) -> Result<(), BootError> {
    let gib = ram.end_gpa().div_ceil(1 << 30);
    let max_gib = (KERNEL_PHYS_BASE - BOOT_TABLES_GPA) / 0x1000;
    if gib > max_gib {
        return Err(BootError::Setup(format!(
            "{gib} GiB of RAM needs more boot page directories than fit below the kernel \
             (max {max_gib} GiB)"
        )));
    }
    let mut page = [0u64; 512];
    // PML4: only the two kernel-half entries.
    page[256] = DIRECT_PDPT | TABLE;
    page[511] = WINDOW_PDPT | TABLE;
    write_table(ram, BOOT_PML4_GPA, &page)?;
    // Direct-map PDPT and its page directories.
    page = [0; 512];
    for g in 0..gib {
        page[g as usize] = (BOOT_TABLES_GPA + g * 0x1000) | TABLE;
    }
    write_table(ram, DIRECT_PDPT, &page)?;
    for g in 0..gib {
        let mut pd = [0u64; 512];
        for (j, e) in pd.iter_mut().enumerate() {
            let gpa = (g * 512 + j as u64) << 21;
            // Map every 2 MiB chunk that holds RAM (RAM ranges are 4 KiB aligned; a partial
            // last chunk is mapped whole, as the guest only uses frames inside `ram`).
            if ram
                .regions()
                .iter()
                .any(|r| gpa < r.gpa() + r.len() && gpa + (2 << 20) > r.gpa())
            {
                *e = gpa | LEAF_2M | PTE_NX;
            }
        }
        write_table(ram, BOOT_TABLES_GPA + g * 0x1000, &pd)?;
    }
    // Kernel window: KERNEL_WINDOW_BASE is PML4 index 511, PDPT index 510.
    let window_pdpt_index = ((boot::KERNEL_WINDOW_BASE >> 30) & 511) as usize;
    page = [0; 512];
    page[window_pdpt_index] = WINDOW_PD | TABLE;
    write_table(ram, WINDOW_PDPT, &page)?;
    let mut pd = [0u64; 512];
    for (j, e) in pd.iter_mut().enumerate() {
        *e = ((j as u64) << 21) | LEAF_2M;
    }
    write_table(ram, WINDOW_PD, &pd)
}

fn write_table(ram: &GuestRam, gpa: u64, entries: &[u64; 512]) -> Result<(), BootError> {
    let mut bytes = [0u8; 4096];
    for (i, e) in entries.iter().enumerate() {
        bytes[i * 8..i * 8 + 8].copy_from_slice(&e.to_le_bytes());
    }
    ram.write_slice(&bytes, GuestAddress(gpa))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vstate::pagewalk::translate;
    use farvm_guest_agent::boot::{DIRECT_MAP_BASE, KERNEL_WINDOW_BASE};

    #[test]
    fn page_tables_map_direct_and_window() {
        let mem = 1536u64 << 20;
        let ram = GuestRam::local(&[(0, mem)]).unwrap();
        let kernel = elf::build_test_elf(&[0xf4], KERNEL_WINDOW_BASE + 0x100000, 0x100000);
        let plan = TestPlan {
            procs: vec![ProcessSpec {
                cpu: 1,
                workload: boot::workload::SEQ_SCAN,
                ws_bytes: 64 << 20,
                seed: 7,
                params: [1, 2, 3, 4],
            }],
            timer_hz: 100,
            flags: boot::flags::RAM_IS_ZERO,
            frame_shuffle_seed: 42,
            frame_run_shift: 0,
            blob: Vec::new(),
        };
        let entry = setup(&ram, &kernel, 2, 2_445_000, &plan).unwrap();
        assert_eq!(entry.rip, KERNEL_WINDOW_BASE + 0x100000);
        assert_eq!(entry.rdi, BOOT_INFO_GPA);
        let t = |va| translate(&ram, entry.cr3, va);
        assert_eq!(t(DIRECT_MAP_BASE), Some(0));
        assert_eq!(t(DIRECT_MAP_BASE + mem - 8), Some(mem - 8));
        assert_eq!(t(DIRECT_MAP_BASE + mem), None, "nothing past RAM");
        assert_eq!(t(KERNEL_WINDOW_BASE + 0x123456), Some(0x123456));
        assert_eq!(t(KERNEL_WINDOW_BASE + (1 << 30) - 1), Some((1 << 30) - 1));
        assert_eq!(t(0x500), None, "no identity map");
        let info: BootInfo = ram.read_obj(GuestAddress(BOOT_INFO_GPA)).unwrap();
        assert_eq!(info.magic, BOOT_MAGIC);
        assert_eq!((info.ncpus, info.nprocs, info.timer_hz), (2, 1, 100));
        assert_eq!(info.mem_bytes, mem);
        assert_eq!(info.first_free_gpa, 0x101000);
        assert_eq!(info.procs[0], plan.procs[0]);
        assert_eq!(info.frame_shuffle_seed, 42);
        assert_eq!(info.nram, 1);
        assert_eq!((info.ram[0].gpa, info.ram[0].len), (0, mem));
        let code: u64 = ram.read_obj(GuestAddress(BOOT_GDT_GPA + 8)).unwrap();
        assert_eq!(code, GDT[1]);
    }

    #[test]
    fn split_ram_is_described_and_mapped() {
        let ram = GuestRam::local(&[(0, 64 << 20), (4 << 30, 64 << 20)]).unwrap();
        let kernel = elf::build_test_elf(&[0xf4], 0x100000, 0x100000);
        let e = setup(&ram, &kernel, 1, 1, &TestPlan::default()).unwrap();
        let info: BootInfo = ram.read_obj(GuestAddress(BOOT_INFO_GPA)).unwrap();
        assert_eq!(info.nram, 2);
        assert_eq!((info.ram[1].gpa, info.ram[1].len), (4 << 30, 64 << 20));
        assert_eq!(info.mem_bytes, 128 << 20);
        let t = |va| translate(&ram, e.cr3, va);
        assert_eq!(t(DIRECT_MAP_BASE + (4 << 30) + 5), Some((4 << 30) + 5));
        assert_eq!(t(DIRECT_MAP_BASE + (1 << 30)), None, "hole unmapped");
        assert_eq!((info.blob_gpa, info.blob_len), (0, 0), "no blob");
    }

    #[test]
    fn the_boot_blob_sits_after_the_kernel_below_the_free_frames() {
        let ram = GuestRam::local(&[(0, 64 << 20)]).unwrap();
        let kernel = elf::build_test_elf(&[0xf4], 0x100000, 0x100000);
        let blob: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
        let plan = TestPlan {
            blob: blob.clone(),
            ..TestPlan::default()
        };
        setup(&ram, &kernel, 1, 1, &plan).unwrap();
        let info: BootInfo = ram.read_obj(GuestAddress(BOOT_INFO_GPA)).unwrap();
        assert_eq!((info.blob_gpa, info.blob_len), (0x101000, 10_000));
        assert_eq!(
            info.first_free_gpa,
            0x101000 + 3 * 4096,
            "rounded up to a page"
        );
        let mut back = vec![0u8; blob.len()];
        ram.read_slice(&mut back, GuestAddress(info.blob_gpa))
            .unwrap();
        assert_eq!(back, blob);
        let small = GuestRam::local(&[(0, 2 << 20)]).unwrap();
        let huge = TestPlan {
            blob: vec![0; 2 << 20],
            ..TestPlan::default()
        };
        let e = setup(&small, &kernel, 1, 1, &huge).unwrap_err();
        assert!(e.to_string().contains("boot blob"), "{e}");
    }
}
