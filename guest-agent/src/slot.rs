//! The per-vCPU agent slot: the guest publishes which process runs on each vCPU.
//!
//! The VMM cannot ask KVM for a blocked vCPU's CR3 (KVM_GET_SREGS blocks while the vCPU waits in
//! a userfaultfd fault), so the guest writes `(pid, cr3)` into a shared page on every context
//! switch and the VMM reads it at fault time (UFFD_FEATURE_THREAD_ID -> vCPU -> slot).
//!
//! Concurrency: a seqlock. The guest (single writer per slot: the vCPU itself) increments
//! `generation` to an odd value, writes the fields, then increments it to an even value. A
//! reader retries while `generation` is odd or changed during its read.

/// `AgentSlot::magic`: "FARVMSLT" little-endian.
pub const SLOT_MAGIC: u64 = u64::from_le_bytes(*b"FARVMSLT");

/// One per vCPU, at the start of a 4 KiB-aligned guest page the guest announces at boot
/// ([`crate::pv::PORT_AGENT_SLOT`]) or that the Linux agent registers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentSlot {
    /// [`SLOT_MAGIC`] once the slot is set up.
    pub magic: u64,
    /// Seqlock counter, odd while the guest is writing.
    pub generation: u64,
    /// vCPU index this slot belongs to.
    pub cpu: u32,
    /// ABI version ([`crate::ABI_VERSION`]).
    pub version: u32,
    /// Guest process id running now (0 = kernel / idle).
    pub pid: u64,
    /// CR3 of the running process (page-table root GPA, low 12 bits masked).
    pub cr3: u64,
    /// Number of context switches on this vCPU so far.
    pub switches: u64,
}

const _: () = assert!(core::mem::size_of::<AgentSlot>() == 48);
