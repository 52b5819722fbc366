//! The agent device: how a guest agent (farvm's Linux kernel module) finds farvm, agrees on a
//! protocol version, registers its per-vCPU agent slots and its process-event ring, and rings
//! the VMM when process events are queued.
//!
//! Discovery: an ACPI device with `_HID` [`ACPI_HID`] ("FARV0001") in the DSDT whose `_CRS` is
//! one [`WINDOW_SIZE`] MMIO register window. Registers are 32 bits, little-endian, at the
//! offsets of [`reg`]; 64-bit values are split in `_LO`/`_HI` halves (write `_LO` first). Any
//! other offset reads 0 and ignores writes; so do 8- and 16-bit accesses.
//!
//! Protocol (guest side):
//! 1. read [`reg::MAGIC`] (must be [`DEVICE_MAGIC`]), [`reg::VERSION_MIN`],
//!    [`reg::VERSION_MAX`] and [`reg::NCPUS`];
//! 2. choose the highest version both sides speak and write it to [`reg::VERSION`]; the device
//!    answers in [`reg::RESULT`]: [`result::OK`], or [`result::BAD_VERSION`] (nothing in common:
//!    the agent must stop; it writes its own version anyway so the VMM can log the refusal).
//!    Old agents on a newer VMM and new agents on an older VMM meet at the older one's version
//!    if both still speak it;
//! 3. allocate one 4 KiB page per vCPU, physically contiguous: the slot of the vCPU whose
//!    local APIC ID is `i` is at `base + i * SLOT_STRIDE` (farvm gives vCPU `i` APIC ID `i`);
//!    fill each slot's `magic`, `cpu` (= `i`) and `version`, write `base` to
//!    [`reg::SLOTS_LO`]/[`reg::SLOTS_HI`], the number of slots to [`reg::SLOTS_COUNT`], and
//!    [`cmd::REGISTER_SLOTS`] to [`reg::COMMAND`]; check [`reg::RESULT`]. From then on the VMM
//!    reads each vCPU's slot at every fault (see [`crate::slot`] for the writer's protocol);
//! 4. optionally register a process-event ring ([`ring`]) the same way ([`reg::RING_LO`],
//!    [`reg::RING_HI`], [`reg::RING_BYTES`], [`cmd::REGISTER_RING`]) and write anything to
//!    [`reg::DOORBELL`] after queuing events: the VMM drains the ring before the write returns;
//! 5. before freeing the memory: [`cmd::UNREGISTER_SLOTS`] / [`cmd::UNREGISTER_RING`] (or
//!    [`cmd::RESET`] for both). When the command's write returns, the VMM no longer reads it.
//!
//! Commands need a negotiated version ([`result::NOT_NEGOTIATED`] otherwise). Every guest
//! address is checked against guest RAM; a refusal leaves the previous registration in place.

/// `_HID` of the agent device in the DSDT.
pub const ACPI_HID: &str = "FARV0001";
/// Size of the MMIO register window.
pub const WINDOW_SIZE: u64 = 0x1000;
/// [`reg::MAGIC`]: "FARV" little-endian.
pub const DEVICE_MAGIC: u32 = u32::from_le_bytes(*b"FARV");

/// The newest agent-protocol version this crate describes.
pub const AGENT_VERSION: u32 = 1;
/// The oldest agent-protocol version this crate still speaks.
pub const AGENT_VERSION_MIN: u32 = 1;

/// Distance between two vCPUs' slots in the slot array (one page each).
pub const SLOT_STRIDE: u64 = crate::PAGE_SIZE;
/// Most slots one registration may name.
pub const MAX_SLOTS: u32 = 256;

/// Register offsets in the window.
pub mod reg {
    /// RO: [`super::DEVICE_MAGIC`].
    pub const MAGIC: u64 = 0x00;
    /// RO: the newest agent-protocol version the VMM speaks.
    pub const VERSION_MAX: u64 = 0x04;
    /// RO: the oldest agent-protocol version the VMM speaks.
    pub const VERSION_MIN: u64 = 0x08;
    /// RO: number of vCPUs (APIC IDs `0..NCPUS`): slots past it are never read.
    pub const NCPUS: u64 = 0x0C;
    /// RO: [`super::feature`] bits.
    pub const FEATURES: u64 = 0x10;
    /// RW: the version the agent chose (0 = none yet). A write negotiates (see the module docs).
    pub const VERSION: u64 = 0x14;
    /// RO: [`super::status`] bits.
    pub const STATUS: u64 = 0x18;
    /// RO: [`super::result`] of the last write to [`VERSION`] or [`COMMAND`].
    pub const RESULT: u64 = 0x1C;
    /// RW: guest-physical address of the slot array, low and high halves.
    pub const SLOTS_LO: u64 = 0x20;
    /// RW: high half of the slot array's address.
    pub const SLOTS_HI: u64 = 0x24;
    /// RW: number of slots in the array.
    pub const SLOTS_COUNT: u64 = 0x28;
    /// RW: guest-physical address of the process-event ring, low and high halves.
    pub const RING_LO: u64 = 0x30;
    /// RW: high half of the ring's address.
    pub const RING_HI: u64 = 0x34;
    /// RW: bytes of the ring (header and records).
    pub const RING_BYTES: u64 = 0x38;
    /// WO: a [`super::cmd`] value.
    pub const COMMAND: u64 = 0x40;
    /// WO: the ring has new records (the value is ignored).
    pub const DOORBELL: u64 = 0x44;
    /// RO: ring records the VMM has taken so far (low 32 bits).
    pub const RING_TAKEN: u64 = 0x48;
    /// RO: ring records the VMM refused as malformed so far (low 32 bits).
    pub const RING_REFUSED: u64 = 0x4C;
}

/// [`reg::COMMAND`] values.
pub mod cmd {
    /// Registers the slot array at [`super::reg::SLOTS_LO`]/[`super::reg::SLOTS_HI`].
    pub const REGISTER_SLOTS: u32 = 1;
    /// Unregisters the slot array.
    pub const UNREGISTER_SLOTS: u32 = 2;
    /// Registers the process-event ring at [`super::reg::RING_LO`]/[`super::reg::RING_HI`].
    pub const REGISTER_RING: u32 = 3;
    /// Unregisters the ring.
    pub const UNREGISTER_RING: u32 = 4;
    /// Unregisters slots and ring and forgets the negotiated version.
    pub const RESET: u32 = 5;
}

/// [`reg::RESULT`] values.
pub mod result {
    /// The write was accepted.
    pub const OK: u32 = 0;
    /// No version both sides speak (the write to [`super::reg::VERSION`] is refused).
    pub const BAD_VERSION: u32 = 1;
    /// A command before a version was agreed.
    pub const NOT_NEGOTIATED: u32 = 2;
    /// An address is not guest RAM (or not 4 KiB aligned, or overflows).
    pub const BAD_ADDRESS: u32 = 3;
    /// A count is 0 or above [`super::MAX_SLOTS`].
    pub const BAD_COUNT: u32 = 4;
    /// The command value is not one of [`super::cmd`].
    pub const UNKNOWN_COMMAND: u32 = 5;
    /// The ring's header is malformed (magic, version, capacity, size).
    pub const BAD_RING: u32 = 6;
}

/// [`reg::STATUS`] bits.
pub mod status {
    /// A version was agreed.
    pub const NEGOTIATED: u32 = 1 << 0;
    /// The slot array is registered.
    pub const SLOTS: u32 = 1 << 1;
    /// The process-event ring is registered.
    pub const RING: u32 = 1 << 2;
}

/// [`reg::FEATURES`] bits.
pub mod feature {
    /// Per-vCPU agent slots ([`super::cmd::REGISTER_SLOTS`]).
    pub const SLOTS: u32 = 1 << 0;
    /// The process-event ring ([`super::cmd::REGISTER_RING`]).
    pub const PROCESS_RING: u32 = 1 << 1;
}

/// What a guest agent and a VMM agree on, from their version ranges: the highest version both
/// speak, or `None` (refuse). The guest computes it; the VMM checks the guest's choice is in its
/// own range.
pub const fn negotiate(agent_min: u32, agent_max: u32, vmm_min: u32, vmm_max: u32) -> Option<u32> {
    let hi = if agent_max < vmm_max {
        agent_max
    } else {
        vmm_max
    };
    let lo = if agent_min > vmm_min {
        agent_min
    } else {
        vmm_min
    };
    if hi >= lo && hi > 0 {
        Some(hi)
    } else {
        None
    }
}

/// The process-event ring: guest-written records of processes starting, exiting and renaming,
/// so the VMM can name the processes its statistics are keyed by.
///
/// Layout: a [`RingHeader`] then `capacity` [`ProcEvent`] records. `head` and `tail` are
/// free-running record counts; record `n` is at index `n % capacity`. Single producer (the guest
/// agent, under its own lock): if `head - tail == capacity` the ring is full and the producer
/// counts the record in `dropped` instead; otherwise it writes record `head % capacity`, then
/// (write barrier) stores `head + 1`, then rings [`super::reg::DOORBELL`]. Single consumer (the
/// VMM, on the doorbell): takes records `tail..head` and stores the new `tail`. The VMM keeps its
/// own copy of `tail` and never trusts the header's; a `head` that is behind it or more than
/// `capacity` ahead is a malformed ring: the VMM takes nothing and resynchronises to `head`.
pub mod ring {
    /// [`RingHeader::magic`]: "FARVMRNG".
    pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"FARVMRNG");
    /// [`RingHeader::version`].
    pub const RING_VERSION: u32 = 1;
    /// Most records a ring may hold.
    pub const MAX_CAPACITY: u32 = 4096;
    /// Bytes of a name in a record (UTF-8, NUL-padded, not necessarily NUL-terminated).
    pub const NAME_BYTES: usize = 40;

    /// [`ProcEvent::kind`].
    pub mod kind {
        /// Present when the agent started (its first scan).
        pub const PRESENT: u32 = 1;
        /// Started since (fork or clone of a new process).
        pub const START: u32 = 2;
        /// Runs a new program (exec) or changed its name: `name` is the new one.
        pub const RENAME: u32 = 3;
        /// Exited.
        pub const EXIT: u32 = 4;
    }

    /// The header at the start of the process-event ring.
    #[repr(C)]
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct RingHeader {
        /// The ring's magic number.
        pub magic: u64,
        /// The ring layout's version.
        pub version: u32,
        /// Records the ring holds.
        pub capacity: u32,
        /// Records written so far (guest).
        pub head: u64,
        /// Records taken so far (VMM).
        pub tail: u64,
        /// Records the guest could not queue because the ring was full.
        pub dropped: u64,
        /// Zero.
        pub _reserved: [u64; 3],
    }

    /// One process event. `pid`/`ppid` are thread-group ids (what `ps` calls PID), `time_ns` is
    /// the guest's CLOCK_BOOTTIME when the event happened (start time for `PRESENT`/`START`).
    #[repr(C)]
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct ProcEvent {
        /// What happened (one of the event kinds above).
        pub kind: u32,
        /// The process.
        pub pid: u32,
        /// Its parent.
        pub ppid: u32,
        /// Its user id.
        pub uid: u32,
        /// When (see above).
        pub time_ns: u64,
        /// Its name (`comm`), NUL-padded.
        pub name: [u8; NAME_BYTES],
    }

    impl Default for ProcEvent {
        fn default() -> Self {
            ProcEvent {
                kind: 0,
                pid: 0,
                ppid: 0,
                uid: 0,
                time_ns: 0,
                name: [0; NAME_BYTES],
            }
        }
    }

    impl ProcEvent {
        /// The name bytes up to the first NUL.
        pub fn name_bytes(&self) -> &[u8] {
            let n = self.name.iter().position(|&b| b == 0).unwrap_or(NAME_BYTES);
            &self.name[..n]
        }

        /// Sets `name` from `s`, cut at [`NAME_BYTES`] on a UTF-8 character boundary.
        pub fn set_name(&mut self, s: &str) {
            let mut n = s.len().min(NAME_BYTES);
            while !s.is_char_boundary(n) {
                n -= 1;
            }
            self.name = [0; NAME_BYTES];
            self.name[..n].copy_from_slice(&s.as_bytes()[..n]);
        }
    }

    /// Bytes of a ring of `capacity` records.
    pub const fn ring_bytes(capacity: u32) -> u64 {
        core::mem::size_of::<RingHeader>() as u64
            + capacity as u64 * core::mem::size_of::<ProcEvent>() as u64
    }

    /// Guest-physical address of record `n` of a ring at `base` holding `capacity` records.
    pub const fn record_gpa(base: u64, capacity: u32, n: u64) -> u64 {
        base + core::mem::size_of::<RingHeader>() as u64
            + (n % capacity as u64) * core::mem::size_of::<ProcEvent>() as u64
    }

    const _: () = assert!(core::mem::size_of::<RingHeader>() == 64);
    const _: () = assert!(core::mem::size_of::<ProcEvent>() == 64);
    const _: () = assert!(core::mem::offset_of!(RingHeader, head) == 16);
    const _: () = assert!(core::mem::offset_of!(RingHeader, tail) == 24);
    const _: () = assert!(core::mem::offset_of!(ProcEvent, name) == 24);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_meet_at_the_older_side() {
        // Same range.
        assert_eq!(negotiate(1, 1, 1, 1), Some(1));
        // A newer agent on an older VMM that it still speaks to: downgraded.
        assert_eq!(negotiate(1, 3, 1, 2), Some(2));
        // An older agent on a newer VMM that still speaks its version.
        assert_eq!(negotiate(1, 1, 1, 2), Some(1));
        // Nothing in common: refused both ways.
        assert_eq!(negotiate(3, 3, 1, 2), None);
        assert_eq!(negotiate(1, 1, 2, 2), None);
        assert_eq!(negotiate(0, 0, 0, 0), None, "version 0 means none");
    }

    #[test]
    fn names_are_cut_on_character_boundaries() {
        let mut e = ring::ProcEvent::default();
        e.set_name("postgres");
        assert_eq!(e.name_bytes(), b"postgres");
        let long = "é".repeat(30); // 60 bytes
        e.set_name(&long);
        assert_eq!(e.name_bytes().len(), 40);
        assert!(core::str::from_utf8(e.name_bytes()).is_ok());
        assert_eq!(ring::ring_bytes(63), 4096);
        assert_eq!(ring::record_gpa(0x1000, 63, 64), 0x1000 + 64 + 64);
    }
}
