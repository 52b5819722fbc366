//! farvm-guest-agent: everything the guest and the VMM agree on, byte for byte.
//!
//! `#![no_std]` and dependency-free so that the freestanding test-guest kernel, the ring-3 test
//! program, a Linux agent and the VMM all compile the same definitions. Every shared structure is
//! `#[repr(C)]` with explicit sizes; layouts are pinned by `const` assertions below. The optional
//! `vm-memory` feature (host side only) marks the records as vm-memory `ByteValued`, so a
//! rust-vmm VMM reads and writes them in guest memory with `Bytes::read_obj` / `write_obj`.
//!
//! Contract notes:
//! - Existing items are an ABI: do not change their layout or meaning; add new items or bump
//!   [`ABI_VERSION`].
//! - Port I/O values are 32 bits (`out dx, eax`), so every record a port refers to lives below
//!   4 GiB guest-physical.
#![no_std]

pub mod boot;
#[cfg(feature = "vm-memory")]
mod byte_valued;
pub mod device;
pub mod frames;
pub mod pv;
pub mod slot;

/// Version of this whole ABI. The guest writes it into [`boot::BootInfo::abi_version`] checks and
/// the VMM refuses a guest built against another version.
pub const ABI_VERSION: u32 = 1;

/// Guest page size used by farvm (4 KiB).
pub const PAGE_SIZE: u64 = 4096;
