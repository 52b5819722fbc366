//! How the VMM hands the test guest its machine and its test plan.
//!
//! The VMM enters the kernel ELF in 64-bit mode with paging on, `rdi` = [`BOOT_INFO_GPA`]
//! and `rsi` = the vCPU index. The boot page tables map all RAM at [`DIRECT_MAP_BASE`] with
//! 2 MiB pages and guest-physical 0..1 GiB at [`KERNEL_WINDOW_BASE`] (where the kernel is linked).

/// Guest-physical layout fixed by the VMM for the test guest.
pub const BOOT_GDT_GPA: u64 = 0x500;
pub const BOOT_PML4_GPA: u64 = 0x1000;
/// [`BootInfo`] lives here (at most [`BOOT_INFO_MAX`] bytes).
pub const BOOT_INFO_GPA: u64 = 0x9000;
pub const BOOT_INFO_MAX: u64 = 0x7000;
/// The VMM's boot page tables occupy `BOOT_TABLES_GPA..KERNEL_PHYS_BASE`.
pub const BOOT_TABLES_GPA: u64 = 0x10000;
/// The kernel ELF's PT_LOAD segments are placed at their `p_paddr`, from here up.
pub const KERNEL_PHYS_BASE: u64 = 0x100000;
/// All guest RAM is mapped here (2 MiB pages, RW, NX).
pub const DIRECT_MAP_BASE: u64 = 0xFFFF_8000_0000_0000;
/// Guest-physical 0..1 GiB is mapped here; the kernel is linked at `KERNEL_WINDOW_BASE + 1 MiB`.
pub const KERNEL_WINDOW_BASE: u64 = 0xFFFF_FFFF_8000_0000;

/// `BootInfo::magic`: "FARVMBOT".
pub const BOOT_MAGIC: u64 = u64::from_le_bytes(*b"FARVMBOT");
/// Maximum processes in one test plan.
pub const MAX_PROCS: usize = 64;

/// `BootInfo::flags`
pub mod flags {
    /// Guest RAM is fresh VMM memory (all zero): the kernel need not zero new frames.
    pub const RAM_IS_ZERO: u64 = 1 << 0;
    /// Premap each process's whole heap at start (PV PTE fill) instead of demand paging it.
    pub const PREMAP_HEAP: u64 = 1 << 1;
}

/// Workload identifiers (`ProcessSpec::workload`). Implemented by `farvm-workloads`.
pub mod workload {
    pub const SEQ_SCAN: u32 = 1;
    pub const STRIDE: u32 = 2;
    pub const RANDOM_RMW: u32 = 3;
    pub const MATMUL_NAIVE: u32 = 4;
    pub const MATMUL_BLOCKED: u32 = 5;
    pub const ZIPF_KV: u32 = 6;
    pub const PAGERANK: u32 = 7;
    pub const QUICKSORT: u32 = 8;
    /// Writes its pid over its heap, yields, verifies: address-space isolation check.
    pub const ISOLATION: u32 = 100;
    /// Deliberately faults in ring 3 (`param[0]`: 0 = #PF, 1 = #UD, 2 = #DE, 3 = #GP).
    pub const CRASH: u32 = 101;
    /// Pure integer work, no memory: a CPU-bound process for preemption tests.
    pub const INT_OPS: u32 = 102;
}

/// One process of the test plan.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessSpec {
    /// vCPU whose run queue gets this process.
    pub cpu: u32,
    /// A `workload::*` id.
    pub workload: u32,
    /// Heap (working set) size in bytes.
    pub ws_bytes: u64,
    pub seed: u64,
    /// Workload-specific parameters (stride, iterations, passes, ...), see `farvm-workloads`.
    pub params: [u64; 4],
}

const _: () = assert!(core::mem::size_of::<ProcessSpec>() == 56);

/// Written by the VMM at [`BOOT_INFO_GPA`] before the first vCPU runs.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BootInfo {
    pub magic: u64,
    pub abi_version: u32,
    pub ncpus: u32,
    /// Guest RAM size in bytes (RAM is guest-physical `0..mem_bytes`).
    pub mem_bytes: u64,
    /// First guest-physical byte the kernel may allocate frames from (page aligned).
    pub first_free_gpa: u64,
    /// TSC frequency in kHz (KVM_GET_TSC_KHZ), for ring-3 timing.
    pub tsc_khz: u64,
    /// LAPIC timer frequency; 0 = no timer (cooperative scheduling only).
    pub timer_hz: u32,
    pub nprocs: u32,
    /// `flags::*`
    pub flags: u64,
    /// Seed for the physical-frame free-list shuffle (0 = unshuffled, ascending).
    pub frame_shuffle_seed: u64,
    pub procs: [ProcessSpec; MAX_PROCS],
}

const _: () = assert!(core::mem::size_of::<BootInfo>() <= BOOT_INFO_MAX as usize);
