//! Virtio devices: the [`VirtioDevice`] trait a device model implements, the virtio-mmio
//! transport that exposes one to the guest ([`mmio::VirtioMmio`]), the block device
//! ([`block::Block`]) and the network device ([`net::Net`]). Split virtqueues come from
//! rust-vmm's `virtio-queue`; guest memory is any vm-memory `GuestMemory`.
//!
//! Most queues are paced by the driver: it posts a request, kicks, the device serves it. A
//! receive queue is paced by the device's backend instead: its buffers wait until a frame
//! arrives. [`VirtioDevice::queue_has_work`] is the one seam for both: the transport asks it
//! before taking each chain, so a receive queue's buffers stay available until the device holds
//! data for them, and whoever learns that data arrived (a thread polling the backend's fd)
//! simply runs the queue with [`mmio::VirtioMmio::notify_queue`] as a driver kick would.
//! [`VirtioDevice::take_config_change`] lets a device that changed its configuration space on
//! its own (a link going down) have the transport raise the config-change interrupt.

pub mod block;
pub mod mmio;
pub mod net;

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

    /// Whether the device has something for the next chain of queue `queue`. Queues the
    /// driver paces (requests, transmit) always do: the default. A receive queue has work only
    /// while the device holds an incoming frame, which this call may fetch from its backend;
    /// the transport asks before taking each chain and stops serving the queue at the first
    /// `false`, leaving the remaining buffers available.
    fn queue_has_work(&mut self, _queue: usize) -> bool {
        true
    }

    /// Whether the device changed its configuration space by itself since the last call (the
    /// transport then bumps the config generation and raises a config-change interrupt).
    fn take_config_change(&mut self) -> bool {
        false
    }
}
