//! A virtio-mmio driver for tests: programs the transport registers the way Linux's
//! virtio_mmio driver does, lays out one split queue in guest memory and submits descriptor
//! chains built by hand (so tests can also build malformed ones).

#![allow(dead_code)]

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use farvm_devices::interrupt::{InterruptController, InterruptError, IrqLine};
use farvm_devices::virtio::block::{Block, BlockConfig};
use farvm_devices::virtio::mmio::*;
use farvm_devices::virtio::VIRTIO_F_VERSION_1;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Guest RAM for tests: 0..1 MiB and 2..3 MiB, a hole between them.
pub const RAM: [(u64, usize); 2] = [(0, 1 << 20), (2 << 20, 1 << 20)];
pub const HOLE: u64 = 1 << 20;
pub const DESC_TABLE: u64 = 0x1000;
pub const AVAIL_RING: u64 = 0x3000;
pub const USED_RING: u64 = 0x4000;
/// Where tests put request headers, data and status bytes.
pub const DATA: u64 = 0x10000;
pub const GSI: u32 = 5;

pub const REG_MAGIC: u64 = 0x000;
pub const REG_VERSION: u64 = 0x004;
pub const REG_DEVICE_ID: u64 = 0x008;
pub const REG_DEVICE_FEATURES: u64 = 0x010;
pub const REG_DEVICE_FEATURES_SEL: u64 = 0x014;
pub const REG_DRIVER_FEATURES: u64 = 0x020;
pub const REG_DRIVER_FEATURES_SEL: u64 = 0x024;
pub const REG_QUEUE_SEL: u64 = 0x030;
pub const REG_QUEUE_NUM_MAX: u64 = 0x034;
pub const REG_QUEUE_NUM: u64 = 0x038;
pub const REG_QUEUE_READY: u64 = 0x044;
pub const REG_QUEUE_NOTIFY: u64 = 0x050;
pub const REG_INTERRUPT_STATUS: u64 = 0x060;
pub const REG_INTERRUPT_ACK: u64 = 0x064;
pub const REG_STATUS: u64 = 0x070;
pub const REG_QUEUE_DESC_LOW: u64 = 0x080;
pub const REG_QUEUE_DESC_HIGH: u64 = 0x084;
pub const REG_QUEUE_AVAIL_LOW: u64 = 0x090;
pub const REG_QUEUE_AVAIL_HIGH: u64 = 0x094;
pub const REG_QUEUE_USED_LOW: u64 = 0x0a0;
pub const REG_QUEUE_USED_HIGH: u64 = 0x0a4;
pub const REG_CONFIG_GENERATION: u64 = 0x0fc;
pub const REG_CONFIG: u64 = 0x100;

pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;
pub const DESC_F_INDIRECT: u16 = 4;

/// Counts edges per line (the VMM's irqfd or KVM_IRQ_LINE in production).
#[derive(Default)]
pub struct Edges(pub AtomicU32);
impl InterruptController for Edges {
    fn trigger(&self, gsi: u32) -> Result<(), InterruptError> {
        if gsi != GSI {
            return Err(InterruptError::NotConnected { gsi });
        }
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}
impl Edges {
    pub fn count(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

pub type Mem = Arc<GuestMemoryMmap>;
pub type Dev = VirtioMmio<Block, Mem>;

pub fn guest_memory() -> Mem {
    let ranges: Vec<_> = RAM.iter().map(|&(a, l)| (GuestAddress(a), l)).collect();
    Arc::new(GuestMemoryMmap::from_ranges(&ranges).unwrap())
}

/// A temporary disk image of `sectors` sectors, sector `i` filled with byte `i as u8`.
pub fn image(sectors: u64) -> tempfile::NamedTempFile {
    use std::io::Write;
    let mut f = tempfile::NamedTempFile::new().unwrap();
    for i in 0..sectors {
        f.write_all(&[i as u8; 512]).unwrap();
    }
    f.flush().unwrap();
    f
}

/// 32-bit register access to a virtio-mmio device, and the bring-up steps every test driver
/// shares on top of it.
pub trait Regs {
    /// A guest load from register `off`.
    fn load(&self, off: u64, data: &mut [u8]);
    /// A guest store to register `off`.
    fn store(&self, off: u64, data: &[u8]);

    fn r32(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.load(off, &mut b);
        u32::from_le_bytes(b)
    }

    fn w32(&self, off: u64, v: u32) {
        self.store(off, &v.to_le_bytes());
    }

    fn device_features(&self) -> u64 {
        self.w32(REG_DEVICE_FEATURES_SEL, 0);
        let lo = self.r32(REG_DEVICE_FEATURES);
        self.w32(REG_DEVICE_FEATURES_SEL, 1);
        let hi = self.r32(REG_DEVICE_FEATURES);
        u64::from(hi) << 32 | u64::from(lo)
    }

    fn write_driver_features(&self, f: u64) {
        self.w32(REG_DRIVER_FEATURES_SEL, 0);
        self.w32(REG_DRIVER_FEATURES, f as u32);
        self.w32(REG_DRIVER_FEATURES_SEL, 1);
        self.w32(REG_DRIVER_FEATURES, (f >> 32) as u32);
    }

    /// Reset, ACKNOWLEDGE, DRIVER, features, FEATURES_OK; returns the status read back.
    fn negotiate(&self, features: u64) -> u32 {
        self.w32(REG_STATUS, 0);
        self.w32(REG_STATUS, STATUS_ACKNOWLEDGE);
        self.w32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
        self.write_driver_features(features);
        self.w32(
            REG_STATUS,
            STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_FEATURES_OK,
        );
        self.r32(REG_STATUS)
    }

    fn driver_ok(&self) {
        let s = self.r32(REG_STATUS);
        self.w32(REG_STATUS, s | STATUS_DRIVER_OK);
    }
}

/// Writes descriptor `index` of the table at `table` in `mem`.
pub fn write_desc_at(
    mem: &Mem,
    table: u64,
    index: u16,
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
) {
    let mut d = [0u8; 16];
    d[0..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[12..14].copy_from_slice(&flags.to_le_bytes());
    d[14..16].copy_from_slice(&next.to_le_bytes());
    mem.write_slice(&d, GuestAddress(table + 16 * u64::from(index)))
        .unwrap();
}

pub struct Rig {
    pub dev: Dev,
    pub mem: Mem,
    pub edges: Arc<Edges>,
    pub image: tempfile::NamedTempFile,
    /// Next free descriptor index.
    pub next_desc: u16,
    /// The driver's avail index.
    pub avail_idx: u16,
    pub queue_size: u16,
}

pub fn rig_with(sectors: u64, read_only: bool) -> Rig {
    let image = image(sectors);
    let block = Block::open(&BlockConfig {
        path: image.path().to_owned(),
        read_only,
        serial: Some("farvm-test-disk".into()),
    })
    .unwrap();
    let mem = guest_memory();
    let edges = Arc::new(Edges::default());
    let dev = VirtioMmio::new(block, mem.clone(), IrqLine::new(edges.clone(), GSI)).unwrap();
    Rig {
        dev,
        mem,
        edges,
        image,
        next_desc: 0,
        avail_idx: 0,
        queue_size: 16,
    }
}

impl Regs for Rig {
    fn load(&self, off: u64, data: &mut [u8]) {
        self.dev.read(off, data)
    }

    fn store(&self, off: u64, data: &[u8]) {
        self.dev.write(off, data)
    }
}

impl Rig {
    /// Programs queue 0 with the rings at `desc`, `avail`, `used`.
    pub fn setup_queue_at(&self, size: u16, desc: u64, avail: u64, used: u64) {
        self.w32(REG_QUEUE_SEL, 0);
        assert_eq!(self.r32(REG_QUEUE_READY), 0);
        self.w32(REG_QUEUE_NUM, u32::from(size));
        self.w32(REG_QUEUE_DESC_LOW, desc as u32);
        self.w32(REG_QUEUE_DESC_HIGH, (desc >> 32) as u32);
        self.w32(REG_QUEUE_AVAIL_LOW, avail as u32);
        self.w32(REG_QUEUE_AVAIL_HIGH, (avail >> 32) as u32);
        self.w32(REG_QUEUE_USED_LOW, used as u32);
        self.w32(REG_QUEUE_USED_HIGH, (used >> 32) as u32);
        self.w32(REG_QUEUE_READY, 1);
    }

    /// The whole Linux-style bring-up with `features`; the device ends DRIVER_OK.
    pub fn start(&mut self, features: u64) {
        let s = self.negotiate(features);
        assert_ne!(s & STATUS_FEATURES_OK, 0, "features {features:#x} refused");
        self.setup_queue_at(self.queue_size, DESC_TABLE, AVAIL_RING, USED_RING);
        self.driver_ok();
        assert_eq!(self.r32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
    }

    pub fn start_default(&mut self) {
        self.start(VIRTIO_F_VERSION_1);
    }

    /// Writes descriptor `index` of the table at `table`.
    pub fn write_desc(&self, table: u64, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        write_desc_at(&self.mem, table, index, addr, len, flags, next);
    }

    /// Puts a chain of `(addr, len, device_writable)` buffers in the descriptor table and
    /// returns its head.
    pub fn add_chain(&mut self, bufs: &[(u64, u32, bool)]) -> u16 {
        let head = self.next_desc;
        for (i, &(addr, len, w)) in bufs.iter().enumerate() {
            let idx = (head + i as u16) % self.queue_size;
            let last = i + 1 == bufs.len();
            let flags = if w { DESC_F_WRITE } else { 0 } | if last { 0 } else { DESC_F_NEXT };
            self.write_desc(
                DESC_TABLE,
                idx,
                addr,
                len,
                flags,
                (idx + 1) % self.queue_size,
            );
        }
        self.next_desc = (head + bufs.len() as u16) % self.queue_size;
        head
    }

    /// Publishes `head` in the avail ring.
    pub fn publish(&mut self, head: u16) {
        let slot = u64::from(self.avail_idx % self.queue_size);
        self.mem
            .write_obj(head, GuestAddress(AVAIL_RING + 4 + 2 * slot))
            .unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.mem
            .write_obj(self.avail_idx, GuestAddress(AVAIL_RING + 2))
            .unwrap();
    }

    pub fn kick(&self) {
        self.w32(REG_QUEUE_NOTIFY, 0);
    }

    pub fn used_idx(&self) -> u16 {
        self.mem.read_obj(GuestAddress(USED_RING + 2)).unwrap()
    }

    /// Used element `n`: (descriptor id, length).
    pub fn used(&self, n: u16) -> (u32, u32) {
        let base = USED_RING + 4 + 8 * u64::from(n % self.queue_size);
        (
            self.mem.read_obj(GuestAddress(base)).unwrap(),
            self.mem.read_obj(GuestAddress(base + 4)).unwrap(),
        )
    }

    /// Writes a request header at `at`.
    pub fn header(&self, at: u64, req_type: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&req_type.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem.write_slice(&h, GuestAddress(at)).unwrap();
    }

    /// Submits a chain, kicks, and returns (used length, status byte at `status_at`).
    pub fn submit(&mut self, bufs: &[(u64, u32, bool)], status_at: u64) -> (u32, u8) {
        self.mem.write_obj(0xeeu8, GuestAddress(status_at)).ok();
        let before = self.used_idx();
        let head = self.add_chain(bufs);
        self.publish(head);
        self.kick();
        assert_eq!(
            self.used_idx(),
            before.wrapping_add(1),
            "the request was not completed"
        );
        let (id, len) = self.used(before);
        assert_eq!(id, u32::from(head));
        (
            len,
            self.mem.read_obj(GuestAddress(status_at)).unwrap_or(0xee),
        )
    }

    pub fn read_guest(&self, at: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(at)).unwrap();
        v
    }
}

pub mod net;
