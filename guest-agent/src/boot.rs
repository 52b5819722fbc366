//! How the VMM hands the test guest its machine and its test plan.
//!
//! The VMM enters the kernel ELF in 64-bit mode with paging on, `rdi` = [`BOOT_INFO_GPA`]
//! and `rsi` = the vCPU index. The boot page tables map all RAM at [`DIRECT_MAP_BASE`] with
//! 2 MiB pages and guest-physical 0..1 GiB at [`KERNEL_WINDOW_BASE`] (where the kernel is linked).

/// Guest-physical layout fixed by the VMM for the test guest.
pub const BOOT_GDT_GPA: u64 = 0x500;
/// The boot PML4 (its lower tables follow from [`BOOT_TABLES_GPA`]).
pub const BOOT_PML4_GPA: u64 = 0x1000;
/// [`BootInfo`] lives here (at most [`BOOT_INFO_MAX`] bytes).
pub const BOOT_INFO_GPA: u64 = 0x9000;
/// Most bytes a [`BootInfo`] may take.
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
/// Maximum vCPUs the test-guest kernel runs on (`BootInfo::ncpus`; added 01:25, CHANGES.md).
pub const MAX_CPUS: usize = 16;

/// The ELF note that marks a kernel file as the farvm test guest, so a VMM handed the file by
/// path (`--kernel`, a libvirt `<kernel>`) boots it with [`BootInfo`] rather than as Linux. The
/// kernel carries it in a `PT_NOTE` segment; its descriptor is the [`crate::ABI_VERSION`] the
/// kernel was built against.
pub mod note {
    /// Note name (with its NUL), as in the ELF `n_name` field.
    pub const NAME: &[u8; 6] = b"farvm\0";
    /// Note type of the test-guest marker.
    pub const TYPE_TEST_GUEST: u32 = 1;

    /// The whole note as laid out in the file: header, name padded to 4 bytes, descriptor.
    #[repr(C, align(4))]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct TestGuestNote {
        /// `n_namesz`: length of the name with its NUL.
        pub namesz: u32,
        /// `n_descsz`: length of the descriptor.
        pub descsz: u32,
        /// `n_type`: [`TYPE_TEST_GUEST`].
        pub n_type: u32,
        /// [`NAME`], NUL-padded to 8 bytes.
        pub name: [u8; 8],
        /// The guest/VMM ABI version the kernel was built against.
        pub abi_version: u32,
    }

    impl TestGuestNote {
        /// The note of a kernel built against this crate.
        pub const fn current() -> Self {
            TestGuestNote {
                namesz: NAME.len() as u32,
                descsz: 4,
                n_type: TYPE_TEST_GUEST,
                name: *b"farvm\0\0\0",
                abi_version: crate::ABI_VERSION,
            }
        }
    }

    const _: () = assert!(core::mem::size_of::<TestGuestNote>() == 24);
}

/// `BootInfo::flags`
pub mod flags {
    /// Guest RAM is fresh VMM memory (all zero): the kernel need not zero new frames.
    pub const RAM_IS_ZERO: u64 = 1 << 0;
    /// Premap each process's whole heap at start (PV PTE fill) instead of demand paging it.
    pub const PREMAP_HEAP: u64 = 1 << 1;
    /// Without [`PREMAP_HEAP`]: map exactly one 4 KiB page per heap #PF (about 250 µs each on
    /// this host; realistic for a uffd path, slow). Without this flag a heap #PF maps the whole
    /// aligned 2 MiB of heap around the fault (512 PTEs with one PV fill).
    pub const DEMAND_4K: u64 = 1 << 2;
}

/// The guest's exit status (value written to [`crate::pv::PORT_SHUTDOWN`]).
pub mod exit {
    /// Every process ended as expected: `DONE`, or `KILLED` for a [`super::workload::CRASH`]
    /// process (a crash test that does not crash is a failure).
    pub const OK: u32 = 0;
    /// At least one process ended otherwise (killed unexpectedly, workload error, or a CRASH
    /// process that finished).
    pub const PROCESS_FAILED: u32 = 1;
    /// `BootInfo` is malformed (magic, ABI version, CPU/process counts, memory map).
    pub const BAD_BOOT_INFO: u32 = 2;
    /// The plan does not fit in guest RAM (frames or page-table pool exhausted).
    pub const OUT_OF_MEMORY: u32 = 3;
    /// The user program embedded in the kernel is not a valid ELF.
    pub const BAD_USER_IMAGE: u32 = 4;
}

/// The virtual layout of every test-guest process (4 KiB pages, own PML4; the kernel half is
/// shared). Useful to a VMM that translates process addresses via the agent slot's CR3.
pub mod user {
    /// The ring-3 program is linked here.
    pub const IMAGE_BASE: u64 = 0x40_0000;
    /// Heap (working set): `ProcessSpec::ws_bytes` rounded up to 4 KiB, from here.
    pub const HEAP_BASE: u64 = 0x1000_0000_0000;
    /// Largest heap the kernel maps (64 GiB).
    pub const HEAP_MAX: u64 = 64 << 30;
    /// The process's own mailbox page.
    pub const MAILBOX_VA: u64 = 0x7FFF_0000_0000;
    /// The boot blob ([`super::BootInfo::blob_gpa`]), mapped read-only into every `replay`
    /// process; its length is in the mailbox (`Mailbox::blob_bytes`).
    pub const BLOB_VA: u64 = 0x5000_0000_0000;
    /// Top of the user stack (grows down, [`STACK_BYTES`] bytes).
    pub const STACK_TOP: u64 = 0x7FFF_FFFF_F000;
    /// Size of the user stack.
    pub const STACK_BYTES: u64 = 256 << 10;
}

/// Workload identifiers (`ProcessSpec::workload`). Implemented by `farvm-workloads`.
pub mod workload {
    /// Sequential scan of the heap, several passes (sum, or read-modify-write).
    pub const SEQ_SCAN: u32 = 1;
    /// Touches every N-th page of the heap (`param[0]` = stride in pages).
    pub const STRIDE: u32 = 2;
    /// Random read-modify-write of heap words.
    pub const RANDOM_RMW: u32 = 3;
    /// C = A·B, the naive i-j-k loop.
    pub const MATMUL_NAIVE: u32 = 4;
    /// C = A·B, blocked (tiled).
    pub const MATMUL_BLOCKED: u32 = 5;
    /// An open-addressing hash table under Zipf-distributed gets and sets.
    pub const ZIPF_KV: u32 = 6;
    /// Pull-based PageRank over a power-law graph.
    pub const PAGERANK: u32 = 7;
    /// Quicksort of random u32s.
    pub const QUICKSORT: u32 = 8;
    /// Writes and rewrites a few pages spread over a large heap, leaving the rest untouched.
    pub const SPARSE: u32 = 9;
    /// Replays one process of a page-access trace from the boot blob (`param[0]`: its section).
    pub const REPLAY: u32 = 10;
    /// Writes its pid over its heap, yields, verifies: address-space isolation check.
    pub const ISOLATION: u32 = 100;
    /// Deliberately faults in ring 3 (`param[0]`: 0 = #PF, 1 = #UD, 2 = #DE, 3 = #GP).
    /// Such a process is expected to end `KILLED` (see [`super::exit::OK`]).
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
    /// Seed of the workload's random numbers.
    pub seed: u64,
    /// Workload-specific parameters (stride, iterations, passes, ...), see `farvm-workloads`.
    pub params: [u64; 4],
}

const _: () = assert!(core::mem::size_of::<ProcessSpec>() == 56);

/// Written by the VMM at [`BOOT_INFO_GPA`] before the first vCPU runs.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BootInfo {
    /// [`BOOT_MAGIC`].
    pub magic: u64,
    /// [`crate::ABI_VERSION`] the VMM speaks.
    pub abi_version: u32,
    /// vCPUs (at most [`MAX_CPUS`]).
    pub ncpus: u32,
    /// Guest RAM size in bytes (RAM is guest-physical `0..mem_bytes`).
    pub mem_bytes: u64,
    /// First guest-physical byte the kernel may allocate frames from (page aligned).
    pub first_free_gpa: u64,
    /// TSC frequency in kHz (KVM_GET_TSC_KHZ), for ring-3 timing.
    pub tsc_khz: u64,
    /// LAPIC timer frequency; 0 = no timer (cooperative scheduling only).
    pub timer_hz: u32,
    /// Valid entries in `procs`.
    pub nprocs: u32,
    /// `flags::*`
    pub flags: u64,
    /// Seed for the physical-frame free-list shuffle (0 = unshuffled, ascending).
    /// See [`crate::frames`] for the order model.
    pub frame_shuffle_seed: u64,
    /// The test plan: one entry per process.
    pub procs: [ProcessSpec; MAX_PROCS],
    // ---- added in ABI v1 before freeze (CHANGES.md, 00:35 UTC) ----
    /// Free-list fragmentation: frames are handed out in runs of `1 << frame_run_shift`
    /// physically contiguous frames, runs in shuffled order (0 = every 4 KiB frame shuffled).
    pub frame_run_shift: u32,
    /// Number of valid entries in `ram`.
    pub nram: u32,
    /// Guest RAM ranges, ascending, page aligned (the VMM leaves an MMIO hole below 4 GiB).
    /// `mem_bytes` is their total.
    pub ram: [MemRange; MAX_RAM_RANGES],
    // ---- appended (0 in a BootInfo without a blob) ----
    /// Guest-physical address of the boot blob (page aligned; below `first_free_gpa`), or 0.
    /// The replay workload's trace (`farvm_workloads::replay`), loaded by the VMM like an
    /// initrd; the kernel maps it read-only at [`user::BLOB_VA`] into `replay` processes.
    pub blob_gpa: u64,
    /// Its length in bytes (0 = no blob).
    pub blob_len: u64,
}

/// Maximum RAM ranges in [`BootInfo::ram`].
pub const MAX_RAM_RANGES: usize = 4;

/// One range of guest RAM.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemRange {
    /// First guest-physical byte.
    pub gpa: u64,
    /// Length in bytes.
    pub len: u64,
}

const _: () = assert!(core::mem::size_of::<BootInfo>() <= BOOT_INFO_MAX as usize);
const _: () = assert!(core::mem::offset_of!(BootInfo, procs) == 64);
const _: () = assert!(core::mem::offset_of!(BootInfo, frame_run_shift) == 64 + 56 * MAX_PROCS);
