//! Virtio devices: the [`VirtioDevice`] trait a device model implements, the virtio-mmio
//! transport that exposes one to the guest ([`mmio::VirtioMmio`]), and the block device
//! ([`block::Block`]). Split virtqueues come from rust-vmm's `virtio-queue`; guest memory is any
//! vm-memory `GuestMemory`.

pub mod block;
pub mod mmio;

use virtio_queue::DescriptorChain;
use vm_memory::GuestMemory;

/// Feature bit: the device follows virtio 1.x (required by the modern mmio transport).
pub const VIRTIO_F_VERSION_1: u64 = 1 << virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
/// Feature bit: descriptors may point at indirect descriptor tables.
pub const VIRTIO_RING_F_INDIRECT_DESC: u64 =
    1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
/// Feature bit: `used_event` / `avail_event` notification suppression.
pub const VIRTIO_RING_F_EVENT_IDX: u64 = 1 << virtio_bindings::virtio_ring::VIRTIO_RING_F_EVENT_IDX;

/// A virtio device model behind a transport. The transport owns the queues, feature
/// negotiation and interrupts; the device serves one descriptor chain at a time.
pub trait VirtioDevice: Send {
    /// The virtio device ID (2 for block).
    fn device_type(&self) -> u32;
    /// Every feature bit the device offers.
    fn features(&self) -> u64;
    /// Maximum size of each queue (powers of two); the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];
    /// Reads device configuration space at `offset`; bytes past its end read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);
    /// Writes device configuration space (ignored by devices without writable fields).
    fn write_config(&mut self, offset: u64, data: &[u8]);
    /// The driver set DRIVER_OK having accepted `acked_features`.
    fn activate(&mut self, acked_features: u64);
    /// The driver reset the device (wrote 0 to the status register).
    fn reset(&mut self);
    /// Serves one request from queue `queue`, returning the number of bytes written into the
    /// chain's device-writable buffers (the used-ring length). Guest mistakes are answered in
    /// the device's own way (an error status), never with a panic.
    fn process_chain<M: GuestMemory>(&mut self, queue: usize, chain: DescriptorChain<&M>) -> u32;
}
