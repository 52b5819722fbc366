//! vm-memory's `ByteValued` for the ABI records (feature `vm-memory`): a VMM built on rust-vmm
//! copies them in and out of guest memory with `Bytes::read_obj` / `write_obj`.

use vm_memory::ByteValued;

use crate::boot::{BootInfo, MemRange, ProcessSpec};
use crate::device::ring::{ProcEvent, RingHeader};
use crate::pv::{BulkOp, LogRecord, Mailbox};
use crate::slot::AgentSlot;

// SAFETY: every record is `repr(C)` and made only of integers and integer arrays with explicit
// sizes and no padding (layouts pinned by the const assertions of this crate), so any bit
// pattern is a valid value and every byte is initialised.
unsafe impl ByteValued for BootInfo {}
// SAFETY: as above.
unsafe impl ByteValued for ProcessSpec {}
// SAFETY: as above.
unsafe impl ByteValued for MemRange {}
// SAFETY: as above.
unsafe impl ByteValued for Mailbox {}
// SAFETY: as above.
unsafe impl ByteValued for BulkOp {}
// SAFETY: as above.
unsafe impl ByteValued for LogRecord {}
// SAFETY: as above.
unsafe impl ByteValued for AgentSlot {}
// SAFETY: as above.
unsafe impl ByteValued for RingHeader {}
// SAFETY: as above.
unsafe impl ByteValued for ProcEvent {}
