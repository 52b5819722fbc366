//! The paravirtual control device: port I/O from guest to VMM, and the records ports refer to.
//!
//! Never `vmcall` (it livelocks the vCPU on this host's KVM backend); port I/O works from ring 0
//! and, through the TSS I/O bitmap, from ring 3 (ports `PORT_BASE..PORT_BASE+16`).
//! Each port takes a 32-bit value written with `out dx, eax`.

/// First port of the device (ports `PORT_BASE..PORT_BASE+16`).
pub const PORT_BASE: u16 = 0x500;
/// value = GPA of a [`LogRecord`]: a line of text for the VMM's log.
pub const PORT_LOG: u16 = 0x500;
/// value = GPA of a process [`Mailbox`]: the process changed `phase`/`state`; the VMM
/// timestamps the event with the host clock and reads the record.
pub const PORT_MAILBOX: u16 = 0x501;
/// value ignored: this vCPU has nothing left to run (the guest halts it for good; the VMM may
/// stop running it).
pub const PORT_CPU_DONE: u16 = 0x502;
/// value = guest exit status: power off now.
pub const PORT_SHUTDOWN: u16 = 0x503;
/// value = GPA of a [`BulkOp`] the VMM performs on the guest's behalf (ring-0 bulk memory
/// operations are emulated and very slow on this host).
pub const PORT_BULK: u16 = 0x506;
/// value = GPA of this vCPU's [`crate::slot::AgentSlot`] page.
pub const PORT_AGENT_SLOT: u16 = 0x507;
/// value = GPA of a [`LogRecord`] with the kernel panic location; the VMM stops the VM.
pub const PORT_PANIC: u16 = 0x508;

/// A line of text, at most `LOG_MAX` bytes, in guest memory.
pub const LOG_MAX: usize = 240;
#[repr(C)]
#[derive(Clone, Copy)]
/// A line of text the guest hands the VMM ([`PORT_LOG`], [`PORT_PANIC`]).
pub struct LogRecord {
    /// Valid bytes in `bytes`.
    pub len: u32,
    /// The vCPU that wrote it.
    pub cpu: u32,
    /// The text (UTF-8, not NUL-terminated).
    pub bytes: [u8; LOG_MAX],
}

/// `Mailbox::magic`: "FARVMMBX".
pub const MAILBOX_MAGIC: u64 = u64::from_le_bytes(*b"FARVMMBX");

/// `Mailbox::state`
pub mod state {
    /// Set up by the kernel; the process has not run yet.
    pub const STARTING: u32 = 0;
    /// The process runs its workload.
    pub const RUNNING: u32 = 1;
    /// Finished normally; `checksum` and `elapsed_ns` are final.
    pub const DONE: u32 = 2;
    /// Killed by the kernel after an exception in ring 3 (`fault_*` describe it).
    pub const KILLED: u32 = 3;
    /// The workload refused its parameters (e.g. heap too small); `error` holds the
    /// `farvm_workloads::Error` code. Nothing was measured.
    pub const FAILED: u32 = 4;
}

/// `Mailbox::phase`: each change is announced with a [`PORT_MAILBOX`] doorbell, so the VMM gets a
/// host timestamp for every phase boundary.
pub mod phase {
    /// Filling the working set (first touch of every heap page).
    pub const SETUP: u32 = 0;
    /// One unmeasured pass (warms caches, TLB and host mappings).
    pub const WARMUP: u32 = 1;
    /// The measured phase begins (rung just before the start timestamp is taken).
    pub const MEASURE: u32 = 2;
    /// The measured phase ended (rung just after the end timestamp); results follow with `DONE`.
    pub const MEASURED: u32 = 3;
}

/// One 4 KiB page per process. Written by the process (ring 3) and by the kernel (start, kill);
/// read by the VMM on each [`PORT_MAILBOX`] doorbell.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mailbox {
    /// [`MAILBOX_MAGIC`].
    pub magic: u64,
    /// Guest process id.
    pub pid: u32,
    /// The vCPU it runs on.
    pub cpu: u32,
    /// Its `boot::workload::*` id.
    pub workload: u32,
    /// `state::*`
    pub state: u32,
    /// Workload phase number: 0 = setup, 1 = warm-up, 2 = measured, ...
    pub phase: u32,
    /// Keeps the following u64s aligned.
    pub _pad: u32,
    /// Guest-measured (rdtsc) duration of the measured phase, in ns.
    pub elapsed_ns: u64,
    /// The workload's checksum (compared with a native run's).
    pub checksum: u64,
    /// Operations done in the measured phase (accesses, keys, iterations).
    pub ops: u64,
    /// The process's CR3 (so the VMM can attribute faults to processes).
    pub cr3: u64,
    /// Exception vector, error code, CR2 and RIP when `state == KILLED`.
    pub fault_vector: u64,
    /// See `fault_vector`.
    pub fault_error: u64,
    /// See `fault_vector`.
    pub fault_cr2: u64,
    /// See `fault_vector`.
    pub fault_rip: u64,
    /// Workload-defined counters (indices: `farvm_workloads::lathist::counter`).
    pub counters: [u64; 8],
    // ---- added in ABI v1 before freeze (CHANGES.md) ----
    /// The process's plan entry, copied by the kernel before the process starts.
    pub spec: crate::boot::ProcessSpec,
    /// Where the heap is mapped in the process (`crate::boot::user::HEAP_BASE`) and its size.
    pub heap_va: u64,
    /// See `heap_va`.
    pub heap_bytes: u64,
    /// `BootInfo::tsc_khz`, for ring-3 timing with `rdtsc`.
    pub tsc_khz: u64,
    /// Error code when `state == FAILED` (`farvm_workloads::Error::code`).
    pub error: u64,
    /// Guest TSC at the start and end of the measured phase.
    pub tsc_begin: u64,
    /// See `tsc_begin`.
    pub tsc_end: u64,
    // ---- appended ----
    /// Where the boot blob is mapped (read-only) in this process (`boot::user::BLOB_VA`), or 0.
    pub blob_va: u64,
    /// Its length in bytes (0 = not mapped).
    pub blob_bytes: u64,
}

const _: () = assert!(core::mem::size_of::<Mailbox>() <= crate::PAGE_SIZE as usize);
const _: () = assert!(core::mem::offset_of!(Mailbox, counters) == 96);
const _: () = assert!(core::mem::offset_of!(Mailbox, spec) == 160);

/// `BulkOp::op`
pub mod bulk {
    /// Zero `len` bytes at `dst`.
    pub const ZERO: u32 = 1;
    /// Copy `len` bytes from `src` to `dst` (guest-physical, non-overlapping).
    pub const COPY: u32 = 2;
    /// Fill the page-table page at `dst` (not yet linked into any live table) with `len` 4 KiB
    /// PTEs: entry i = (frame GPA read from the u64 array at `src`, index i) | `pte_flags`.
    /// `dst` may point inside the page (8-byte aligned); `dst .. dst + 8*len` stays in one page.
    pub const FILL_PTES: u32 = 3;
    /// Write `len` u64 frame GPAs at `dst`: entry i = the frame at position `src + i` of the
    /// guest's shuffled free-frame order, i.e. `crate::frames::FrameOrder::new(aux[0] (seed),
    /// aux[1] as u32 (run shift), aux[2] (first free GPA), <the VMM's RAM ranges>)
    /// .frame_gpa(src + i)`. Refused (status [`super::status::BAD_RANGE`]) if any position is
    /// past the last frame. Lets the kernel hand out shuffled frames without computing the
    /// permutation in (emulated, ~1 µs/instruction) ring 0.
    pub const FRAME_BATCH: u32 = 4;
}

/// `BulkOp::status`
pub mod status {
    /// The guest writes this before ringing the port; the VMM overwrites it.
    pub const PENDING: u32 = u32::MAX;
    /// Done.
    pub const OK: u32 = 0;
    /// A range is outside guest RAM (or the PTE count exceeds 512, or no such frame).
    pub const BAD_RANGE: u32 = 1;
    /// The VMM does not implement this `op`.
    pub const UNKNOWN_OP: u32 = 2;
}

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
/// A bulk memory operation the VMM performs for the guest ([`PORT_BULK`]).
pub struct BulkOp {
    /// A `bulk::*` operation.
    pub op: u32,
    /// [`status::PENDING`] when rung; set by the VMM: [`status::OK`] or a refusal code.
    pub status: u32,
    /// Destination guest-physical address.
    pub dst: u64,
    /// Source guest-physical address (or position, see each op).
    pub src: u64,
    /// Length (bytes or entries, see each op).
    pub len: u64,
    /// Flags ORed into every PTE of `FILL_PTES`.
    pub pte_flags: u64,
    /// Extra operands (added before freeze, CHANGES.md): see each op.
    pub aux: [u64; 4],
}

const _: () = assert!(core::mem::size_of::<BulkOp>() == 72);
