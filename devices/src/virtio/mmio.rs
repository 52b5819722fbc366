//! The virtio-mmio transport, version 2 (virtio 1.2, 4.2.2): the register file the guest driver
//! programs (feature negotiation, queue setup, status), queue notification by a write to
//! QueueNotify, and used-buffer / config-change interrupts through an [`IrqLine`].
//!
//! All state sits behind one mutex per device, so a vCPU exit handler and a future ioeventfd
//! worker ([`VirtioMmio::notify_queue`]) can drive the same device. Anything the guest gets
//! wrong (bad widths, writes out of order, rings outside guest memory) is refused or answered
//! with DEVICE_NEEDS_RESET; nothing the guest writes can panic the VMM.

use std::sync::{Mutex, MutexGuard};

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
};
use virtio_bindings::virtio_mmio::*;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_device::bus::{MmioAddress, MmioAddressOffset};
use vm_device::DeviceMmio;
use vm_memory::GuestAddressSpace;

use super::{VirtioDevice, VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX};
use crate::interrupt::IrqLine;

/// "virt" in little-endian.
pub const MMIO_MAGIC: u32 = 0x7472_6976;
/// The modern (virtio 1.x) register layout.
pub const MMIO_VERSION: u32 = 2;
/// Vendor ID reported to the guest.
pub const MMIO_VENDOR_ID: u32 = 0;

/// Status bits (virtio 1.2, 2.1). The guest found the device.
pub const STATUS_ACKNOWLEDGE: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
/// The driver knows how to drive the device.
pub const STATUS_DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
/// The driver accepted the features it negotiated.
pub const STATUS_FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
/// The driver is ready: the device may use its queues.
pub const STATUS_DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;
/// The device hit an error and needs a reset.
pub const STATUS_NEEDS_RESET: u32 = VIRTIO_CONFIG_S_NEEDS_RESET;
/// The driver gave up on the device.
pub const STATUS_FAILED: u32 = VIRTIO_CONFIG_S_FAILED;
/// The status bits a driver may set.
const DRIVER_STATUS_BITS: u32 =
    STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK | STATUS_DRIVER_OK | STATUS_FAILED;

/// Why a transport could not be built.
#[derive(Debug, thiserror::Error)]
pub enum MmioError {
    /// A queue size virtio does not allow.
    #[error("virtio device declares queue {index} with maximum size {size}; sizes must be powers of two up to 32768")]
    QueueSize {
        /// The queue.
        index: usize,
        /// The size declared.
        size: u16,
    },
    /// A device with no queue.
    #[error("virtio device declares no queues")]
    NoQueues,
}

struct Transport<D> {
    device: D,
    device_features_sel: u32,
    driver_features_sel: u32,
    driver_features: u64,
    queue_sel: u32,
    queues: Vec<Queue>,
    status: u32,
    interrupt_status: u32,
    config_generation: u32,
    activated: bool,
}

impl<D> Transport<D> {
    fn selected_queue(&mut self) -> Option<&mut Queue> {
        self.queues.get_mut(self.queue_sel as usize)
    }

    /// Queue registers may be written after FEATURES_OK and before DRIVER_OK (4.2.3.2), and
    /// only while the queue is not ready.
    fn queue_config_allowed(&self) -> bool {
        self.status & STATUS_FEATURES_OK != 0
            && self.status & (STATUS_DRIVER_OK | STATUS_FAILED | STATUS_NEEDS_RESET) == 0
    }
}

/// A virtio device on the MMIO bus.
pub struct VirtioMmio<D: VirtioDevice, A: GuestAddressSpace> {
    mem: A,
    irq: IrqLine,
    state: Mutex<Transport<D>>,
}

fn reg_u32(data: &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(data.try_into().ok()?))
}

fn half(value: u64, select: u32) -> u32 {
    match select {
        0 => value as u32,
        1 => (value >> 32) as u32,
        _ => 0,
    }
}

impl<D: VirtioDevice, A: GuestAddressSpace> VirtioMmio<D, A> {
    /// Wraps `device`; its queues live in `mem`, its interrupts go to `irq`.
    pub fn new(device: D, mem: A, irq: IrqLine) -> Result<Self, MmioError> {
        let sizes = device.queue_max_sizes();
        if sizes.is_empty() {
            return Err(MmioError::NoQueues);
        }
        let queues = sizes
            .iter()
            .enumerate()
            .map(|(index, &size)| {
                Queue::new(size).map_err(|_| MmioError::QueueSize { index, size })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(VirtioMmio {
            mem,
            irq,
            state: Mutex::new(Transport {
                device,
                device_features_sel: 0,
                driver_features_sel: 0,
                driver_features: 0,
                queue_sel: 0,
                queues,
                status: 0,
                interrupt_status: 0,
                config_generation: 0,
                activated: false,
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Transport<D>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The device status register as the driver last left it (plus NEEDS_RESET).
    pub fn status(&self) -> u32 {
        self.lock().status
    }

    /// The features the driver accepted (meaningful after FEATURES_OK).
    pub fn acked_features(&self) -> u64 {
        self.lock().driver_features
    }

    /// Runs `f` on the device model (for inspection).
    pub fn with_device<R>(&self, f: impl FnOnce(&D) -> R) -> R {
        f(&self.lock().device)
    }

    /// Runs `f` on the device model mutably, under the lock the queues are served with (for
    /// tests that drive a fake backend).
    pub fn with_device_mut<R>(&self, f: impl FnOnce(&mut D) -> R) -> R {
        f(&mut self.lock().device)
    }

    /// Processes queue `index` as if the driver had written it to QueueNotify; for an
    /// ioeventfd worker, or a thread that learnt the device's backend has data for a
    /// device-paced queue ([`super::VirtioDevice::queue_has_work`]).
    pub fn notify_queue(&self, index: u32) {
        let mut st = self.lock();
        self.process_queue(&mut st, index as usize);
    }

    /// A guest load from register `offset`. Registers below 0x100 are 32 bits wide and read
    /// as zero with any other width; configuration space takes any width.
    pub fn read(&self, offset: u64, data: &mut [u8]) {
        let st = self.lock();
        if offset >= u64::from(VIRTIO_MMIO_CONFIG) {
            st.device
                .read_config(offset - u64::from(VIRTIO_MMIO_CONFIG), data);
            return;
        }
        data.fill(0);
        if data.len() != 4 || !offset.is_multiple_of(4) {
            tracing::debug!(
                "virtio-mmio: {}-byte read at {offset:#x} ignored",
                data.len()
            );
            return;
        }
        let q = st.queues.get(st.queue_sel as usize);
        let value = match offset as u32 {
            VIRTIO_MMIO_MAGIC_VALUE => MMIO_MAGIC,
            VIRTIO_MMIO_VERSION => MMIO_VERSION,
            VIRTIO_MMIO_DEVICE_ID => st.device.device_type(),
            VIRTIO_MMIO_VENDOR_ID => MMIO_VENDOR_ID,
            VIRTIO_MMIO_DEVICE_FEATURES => half(st.device.features(), st.device_features_sel),
            VIRTIO_MMIO_QUEUE_NUM_MAX => q.map_or(0, |q| u32::from(q.max_size())),
            VIRTIO_MMIO_QUEUE_READY => q.map_or(0, |q| u32::from(q.ready())),
            VIRTIO_MMIO_QUEUE_DESC_LOW => q.map_or(0, |q| q.desc_table() as u32),
            VIRTIO_MMIO_QUEUE_DESC_HIGH => q.map_or(0, |q| (q.desc_table() >> 32) as u32),
            VIRTIO_MMIO_QUEUE_AVAIL_LOW => q.map_or(0, |q| q.avail_ring() as u32),
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH => q.map_or(0, |q| (q.avail_ring() >> 32) as u32),
            VIRTIO_MMIO_QUEUE_USED_LOW => q.map_or(0, |q| q.used_ring() as u32),
            VIRTIO_MMIO_QUEUE_USED_HIGH => q.map_or(0, |q| (q.used_ring() >> 32) as u32),
            VIRTIO_MMIO_INTERRUPT_STATUS => st.interrupt_status,
            VIRTIO_MMIO_STATUS => st.status,
            // No shared memory regions: a length of all-ones says "absent".
            VIRTIO_MMIO_SHM_LEN_LOW | VIRTIO_MMIO_SHM_LEN_HIGH => u32::MAX,
            VIRTIO_MMIO_SHM_BASE_LOW | VIRTIO_MMIO_SHM_BASE_HIGH => u32::MAX,
            VIRTIO_MMIO_CONFIG_GENERATION => st.config_generation,
            _ => 0,
        };
        data.copy_from_slice(&value.to_le_bytes());
    }

    /// A guest store to register `offset`.
    pub fn write(&self, offset: u64, data: &[u8]) {
        let mut st = self.lock();
        if offset >= u64::from(VIRTIO_MMIO_CONFIG) {
            st.device
                .write_config(offset - u64::from(VIRTIO_MMIO_CONFIG), data);
            return;
        }
        let Some(value) = reg_u32(data).filter(|_| offset.is_multiple_of(4)) else {
            tracing::debug!(
                "virtio-mmio: {}-byte write at {offset:#x} ignored",
                data.len()
            );
            return;
        };
        let st = &mut *st;
        match offset as u32 {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => st.device_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => st.driver_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES => {
                let negotiating = st.status & STATUS_DRIVER != 0
                    && st.status & (STATUS_FEATURES_OK | STATUS_FAILED) == 0;
                if !negotiating {
                    tracing::debug!("virtio-mmio: driver features written outside negotiation");
                    return;
                }
                let shift = match st.driver_features_sel {
                    0 => 0,
                    1 => 32,
                    _ => return,
                };
                st.driver_features =
                    (st.driver_features & !(0xffff_ffffu64 << shift)) | (u64::from(value) << shift);
            }
            VIRTIO_MMIO_QUEUE_SEL => st.queue_sel = value,
            VIRTIO_MMIO_QUEUE_NUM
            | VIRTIO_MMIO_QUEUE_DESC_LOW
            | VIRTIO_MMIO_QUEUE_DESC_HIGH
            | VIRTIO_MMIO_QUEUE_AVAIL_LOW
            | VIRTIO_MMIO_QUEUE_AVAIL_HIGH
            | VIRTIO_MMIO_QUEUE_USED_LOW
            | VIRTIO_MMIO_QUEUE_USED_HIGH => {
                let allowed = st.queue_config_allowed();
                match st.selected_queue() {
                    Some(q) if allowed && !q.ready() => configure_queue(q, offset as u32, value),
                    _ => tracing::debug!("virtio-mmio: queue register {offset:#x} write refused"),
                }
            }
            VIRTIO_MMIO_QUEUE_READY => {
                let allowed = st.queue_config_allowed();
                if let Some(q) = st.selected_queue() {
                    match value {
                        0 => q.set_ready(false),
                        1 if allowed => q.set_ready(true),
                        _ => tracing::debug!("virtio-mmio: QueueReady={value} refused"),
                    }
                }
            }
            VIRTIO_MMIO_QUEUE_NOTIFY => self.process_queue(st, value as usize),
            VIRTIO_MMIO_INTERRUPT_ACK => st.interrupt_status &= !value,
            VIRTIO_MMIO_STATUS => self.set_status(st, value),
            _ => tracing::debug!("virtio-mmio: write to read-only or unknown register {offset:#x}"),
        }
    }

    fn reset(st: &mut Transport<D>) {
        st.device.reset();
        st.device_features_sel = 0;
        st.driver_features_sel = 0;
        st.driver_features = 0;
        st.queue_sel = 0;
        for q in &mut st.queues {
            q.reset();
        }
        st.status = 0;
        st.interrupt_status = 0;
        st.activated = false;
    }

    /// The status state machine (virtio 1.2, 3.1.1): bits are only ever added, except by a
    /// write of zero (reset). FEATURES_OK sticks only for an acceptable feature set;
    /// DRIVER_OK activates the device if every ready queue lies in guest memory.
    fn set_status(&self, st: &mut Transport<D>, value: u32) {
        if value == 0 {
            Self::reset(st);
            return;
        }
        // NEEDS_RESET belongs to the device; the driver echoing it back changes nothing.
        // Bits the spec does not define are dropped.
        let value = value & DRIVER_STATUS_BITS;
        let old = st.status & !STATUS_NEEDS_RESET;
        if old & !value != 0 {
            tracing::debug!("virtio-mmio: status {old:#x} -> {value:#x} clears bits; ignored");
            return;
        }
        let added = value & !old;
        let mut new = value;
        if added & STATUS_FEATURES_OK != 0 {
            let offered = st.device.features();
            let acceptable = old & STATUS_DRIVER != 0
                && st.driver_features & !offered == 0
                && st.driver_features & VIRTIO_F_VERSION_1 != 0;
            if !acceptable {
                tracing::warn!(
                    "virtio-mmio: driver features {:#x} not acceptable (offered {offered:#x}); \
                     FEATURES_OK refused",
                    st.driver_features
                );
                new &= !STATUS_FEATURES_OK;
            }
        }
        if added & STATUS_DRIVER_OK != 0 {
            if new & STATUS_FEATURES_OK == 0 {
                tracing::warn!("virtio-mmio: DRIVER_OK without FEATURES_OK refused");
                new &= !STATUS_DRIVER_OK;
            } else {
                st.status = new | (st.status & STATUS_NEEDS_RESET);
                self.activate(st);
                return;
            }
        }
        st.status = new | (st.status & STATUS_NEEDS_RESET);
    }

    fn activate(&self, st: &mut Transport<D>) {
        let mem = self.mem.memory();
        let event_idx = st.driver_features & VIRTIO_RING_F_EVENT_IDX != 0;
        for (i, q) in st.queues.iter_mut().enumerate() {
            if !q.ready() {
                continue;
            }
            if !q.is_valid(&*mem) {
                tracing::warn!("virtio-mmio: queue {i} lies outside guest memory");
                self.needs_reset(st);
                return;
            }
            q.set_event_idx(event_idx);
        }
        st.device.activate(st.driver_features);
        st.activated = true;
    }

    /// Puts the device in DEVICE_NEEDS_RESET and tells the driver with a config interrupt.
    fn needs_reset(&self, st: &mut Transport<D>) {
        st.status |= STATUS_NEEDS_RESET;
        st.activated = false;
        if st.status & STATUS_DRIVER_OK != 0 {
            st.config_generation = st.config_generation.wrapping_add(1);
            self.raise(st, VIRTIO_MMIO_INT_CONFIG);
        }
    }

    fn raise(&self, st: &mut Transport<D>, cause: u32) {
        st.interrupt_status |= cause;
        if let Err(e) = self.irq.trigger() {
            tracing::warn!("virtio-mmio: {e}");
        }
    }

    /// Serves queue `index` ([`Self::serve_queue`]), then tells the driver if the device
    /// changed its configuration space meanwhile (or since the last time).
    fn process_queue(&self, st: &mut Transport<D>, index: usize) {
        self.serve_queue(st, index);
        if st.device.take_config_change() && st.activated {
            st.config_generation = st.config_generation.wrapping_add(1);
            self.raise(st, VIRTIO_MMIO_INT_CONFIG);
        }
    }

    /// Serves every available chain of queue `index`, then interrupts if the driver wants it.
    fn serve_queue(&self, st: &mut Transport<D>, index: usize) {
        if !st.activated {
            return;
        }
        let guard = self.mem.memory();
        let mem = &*guard;
        let Transport { device, queues, .. } = st;
        let Some(q) = queues.get_mut(index).filter(|q| q.ready()) else {
            return;
        };
        let mut served = false;
        let result = (|| -> Result<bool, virtio_queue::Error> {
            loop {
                q.disable_notification(mem)?;
                let mut out_of_work = false;
                loop {
                    // A device-paced queue (receive) keeps its buffers until there is data.
                    if !device.queue_has_work(index) {
                        out_of_work = true;
                        break;
                    }
                    // The iterator borrows the queue: take one chain and release it before
                    // add_used (a `while let` would hold the borrow across the body).
                    let next = q.iter(mem)?.next();
                    let Some(chain) = next else {
                        break;
                    };
                    let head = chain.head_index();
                    let len = device.process_chain(index, chain);
                    q.add_used(mem, head, len)?;
                    served = true;
                }
                // Re-enable notifications; if buffers arrived meanwhile, serve them too
                // (unless the device has nothing to put in them).
                if !q.enable_notification(mem)? || out_of_work {
                    break;
                }
            }
            Ok(served && q.needs_notification(mem)?)
        })();
        match result {
            Ok(true) => self.raise(st, VIRTIO_MMIO_INT_VRING),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!("virtio-mmio: queue {index}: {e}; device needs reset");
                if served {
                    self.raise(st, VIRTIO_MMIO_INT_VRING);
                }
                self.needs_reset(st);
            }
        }
    }
}

fn configure_queue(q: &mut Queue, reg: u32, value: u32) {
    match reg {
        VIRTIO_MMIO_QUEUE_NUM => {
            if value > u32::from(u16::MAX) {
                tracing::debug!("virtio-mmio: queue size {value} refused");
                return;
            }
            q.set_size(value as u16)
        }
        VIRTIO_MMIO_QUEUE_DESC_LOW => q.set_desc_table_address(Some(value), None),
        VIRTIO_MMIO_QUEUE_DESC_HIGH => q.set_desc_table_address(None, Some(value)),
        VIRTIO_MMIO_QUEUE_AVAIL_LOW => q.set_avail_ring_address(Some(value), None),
        VIRTIO_MMIO_QUEUE_AVAIL_HIGH => q.set_avail_ring_address(None, Some(value)),
        VIRTIO_MMIO_QUEUE_USED_LOW => q.set_used_ring_address(Some(value), None),
        VIRTIO_MMIO_QUEUE_USED_HIGH => q.set_used_ring_address(None, Some(value)),
        _ => {}
    }
}

impl<D, A> DeviceMmio for VirtioMmio<D, A>
where
    D: VirtioDevice,
    A: GuestAddressSpace,
{
    fn mmio_read(&self, _base: MmioAddress, offset: MmioAddressOffset, data: &mut [u8]) {
        self.read(offset, data)
    }

    fn mmio_write(&self, _base: MmioAddress, offset: MmioAddressOffset, data: &[u8]) {
        self.write(offset, data)
    }
}
