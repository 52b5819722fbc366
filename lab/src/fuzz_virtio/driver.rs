//! The hostile driver: per execution it draws, from a seeded RNG, a bring-up of the device
//! through its virtio-mmio registers (feature negotiation, queue setup, status transitions,
//! with random register writes mixed in and steps skipped), descriptor tables (direct and
//! indirect; addresses in RAM, in the hole, past RAM, wrapping; lengths 0, small, huge; NEXT
//! pointing anywhere, loops; flags of every mix), available rings (valid and random heads, idx
//! jumps) and used rings, then kicks queues. Device-specific request contents come from the
//! target (block header, frame header) through [`ChainShape`].

use rand::RngExt;
use rand_xorshift::XorShiftRng;
pub use virtio_bindings::virtio_mmio::*;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::memory::{HOLE, RAM_END, RANGES};

/// A virtio-mmio register's offset (the constants are `u32`, bus offsets `u64`).
pub const fn reg(r: u32) -> u64 {
    r as u64
}
/// "virt": what the magic register must still read after every execution.
pub const MAGIC: u32 = 0x7472_6976;

pub const STATUS_ACKNOWLEDGE: u32 = 1;
pub const STATUS_DRIVER: u32 = 2;
pub const STATUS_DRIVER_OK: u32 = 4;
pub const STATUS_FEATURES_OK: u32 = 8;
pub const STATUS_NEEDS_RESET: u32 = 0x40;

pub const DESC_F_NEXT: u16 = 1;
pub const DESC_F_WRITE: u16 = 2;
pub const DESC_F_INDIRECT: u16 = 4;

/// Queue q's descriptor table; its available ring and used ring follow at +4 KiB and +8 KiB.
pub fn queue_base(q: usize) -> u64 {
    0x1000 + q as u64 * 0x1_0000
}
/// Indirect tables: eight of 64 descriptors.
const INDIRECT: u64 = 0x4_0000;
const INDIRECT_TABLE_LEN: u64 = 0x400;
/// Where request buffers usually go.
pub const DATA: u64 = 0x8_0000;
const DATA_SPAN: u64 = 0x4_0000;

/// One descriptor as the driver lays it out.
#[derive(Clone, Copy, Debug, Default)]
pub struct Desc {
    pub addr: u64,
    pub len: u32,
    pub flags: u16,
    pub next: u16,
}

/// A well-formed request the target wants in a chain (before mutation): buffers in order.
pub struct ChainShape {
    /// (address, length, device-writable)
    pub bufs: Vec<(u64, u32, bool)>,
}

/// Register access to the device under test.
pub trait Regs {
    fn load(&self, off: u64, data: &mut [u8]);
    fn store(&self, off: u64, data: &[u8]);
    fn r32(&self, off: u64) -> u32 {
        let mut b = [0u8; 4];
        self.load(off, &mut b);
        u32::from_le_bytes(b)
    }
    fn w32(&self, off: u64, v: u32) {
        self.store(off, &v.to_le_bytes());
    }
}

impl<D: farvm_devices::virtio::VirtioDevice> Regs for super::memory::Dev<D> {
    fn load(&self, off: u64, data: &mut [u8]) {
        self.read(off, data)
    }
    fn store(&self, off: u64, data: &[u8]) {
        self.write(off, data)
    }
}

/// The RNG-driven hostile driver.
pub struct Driver {
    pub rng: XorShiftRng,
}

const INTERESTING_LENS: [u32; 14] = [
    0, 1, 11, 12, 13, 15, 16, 17, 511, 512, 513, 4096, 65_536, 0x1_000c,
];
const REGISTERS: [u64; 21] = [
    reg(VIRTIO_MMIO_MAGIC_VALUE),
    reg(VIRTIO_MMIO_DEVICE_FEATURES),
    reg(VIRTIO_MMIO_DEVICE_FEATURES_SEL),
    reg(VIRTIO_MMIO_DRIVER_FEATURES),
    reg(VIRTIO_MMIO_DRIVER_FEATURES_SEL),
    reg(VIRTIO_MMIO_QUEUE_SEL),
    reg(VIRTIO_MMIO_QUEUE_NUM_MAX),
    reg(VIRTIO_MMIO_QUEUE_NUM),
    reg(VIRTIO_MMIO_QUEUE_READY),
    reg(VIRTIO_MMIO_QUEUE_NOTIFY),
    reg(VIRTIO_MMIO_INTERRUPT_STATUS),
    reg(VIRTIO_MMIO_INTERRUPT_ACK),
    reg(VIRTIO_MMIO_STATUS),
    reg(VIRTIO_MMIO_QUEUE_DESC_LOW),
    reg(VIRTIO_MMIO_QUEUE_DESC_HIGH),
    reg(VIRTIO_MMIO_QUEUE_AVAIL_LOW),
    reg(VIRTIO_MMIO_QUEUE_AVAIL_HIGH),
    reg(VIRTIO_MMIO_QUEUE_USED_LOW),
    reg(VIRTIO_MMIO_QUEUE_USED_HIGH),
    reg(VIRTIO_MMIO_CONFIG_GENERATION),
    reg(VIRTIO_MMIO_CONFIG),
];
const INTERESTING_VALUES: [u32; 12] = [0, 1, 2, 3, 7, 11, 15, 16, 255, 256, 0x1000, 0xffff_ffff];

impl Driver {
    pub fn chance(&mut self, one_in: u32) -> bool {
        self.rng.random_range(0..one_in) == 0
    }

    /// A buffer address: mostly in the data area, sometimes over the rings and tables, at the
    /// end of a range (running into the hole or past RAM), in the second range, or anywhere.
    pub fn buf_addr(&mut self) -> u64 {
        match self.rng.random_range(0..20u32) {
            0..=12 => DATA + self.rng.random_range(0..DATA_SPAN),
            13 => HOLE - self.rng.random_range(0..0x2000u64),
            14 => RANGES[1].0 + self.rng.random_range(0..RANGES[1].1 as u64),
            15 => RAM_END - self.rng.random_range(0..0x2000u64),
            16 => self.rng.random(),
            17 => u64::MAX - self.rng.random_range(0..0x1000u64),
            _ => self.rng.random_range(0..DATA),
        }
    }

    pub fn len(&mut self) -> u32 {
        match self.rng.random_range(0..12u32) {
            0..=4 => self.rng.random_range(0..2048),
            5..=7 => INTERESTING_LENS[self.rng.random_range(0..INTERESTING_LENS.len())],
            8 => self.rng.random(),
            9 => u32::MAX - self.rng.random_range(0..16u32),
            _ => 512 * self.rng.random_range(1..=16u32),
        }
    }

    fn flags(&mut self) -> u16 {
        match self.rng.random_range(0..10u32) {
            0..=6 => [0, DESC_F_NEXT, DESC_F_WRITE, DESC_F_NEXT | DESC_F_WRITE]
                [self.rng.random_range(0..4usize)],
            7 => DESC_F_INDIRECT,
            8 => DESC_F_INDIRECT | self.rng.random_range(0..4u16),
            _ => self.rng.random(),
        }
    }

    fn next(&mut self, size: u16) -> u16 {
        if self.chance(8) {
            self.rng.random()
        } else {
            self.rng.random_range(0..size.clamp(1, 32))
        }
    }

    /// A descriptor drawn at random.
    pub fn random_desc(&mut self, size: u16) -> Desc {
        Desc {
            addr: self.buf_addr(),
            len: self.len(),
            flags: self.flags(),
            next: self.next(size),
        }
    }

    /// Mutates a descriptor of a well-formed chain (one field, sometimes).
    fn mutate(&mut self, d: &mut Desc, size: u16) {
        match self.rng.random_range(0..24u32) {
            0 => d.addr = self.buf_addr(),
            1 => d.len = self.len(),
            2 => d.flags ^= 1 << self.rng.random_range(0..3u32),
            3 => d.next = self.next(size),
            4 => d.flags = self.rng.random(),
            _ => {}
        }
    }

    /// A random value for a register write: interesting ones, or anything.
    pub fn reg_value(&mut self) -> u32 {
        if self.chance(3) {
            self.rng.random()
        } else {
            INTERESTING_VALUES[self.rng.random_range(0..INTERESTING_VALUES.len())]
        }
    }

    /// One random register access (any width, offsets known and unknown, config space).
    pub fn random_register_op(&mut self, dev: &impl Regs) {
        let off = match self.rng.random_range(0..8u32) {
            0..=5 => REGISTERS[self.rng.random_range(0..REGISTERS.len())],
            6 => reg(VIRTIO_MMIO_CONFIG) + self.rng.random_range(0..64u64),
            _ => self.rng.random_range(0..0x200u64),
        };
        let width = [4usize, 4, 4, 1, 2, 8, 0, 3][self.rng.random_range(0..8usize)];
        let mut data = [0u8; 8];
        if self.chance(3) {
            dev.load(off, &mut data[..width]);
        } else {
            data[..4].copy_from_slice(&self.reg_value().to_le_bytes());
            dev.store(off, &data[..width]);
        }
    }

    /// Maybe a few random register accesses (the driver misbehaving between steps).
    fn noise(&mut self, dev: &impl Regs) {
        if self.chance(12) {
            for _ in 0..self.rng.random_range(1..4u32) {
                self.random_register_op(dev);
            }
        }
    }

    /// A queue size: mostly a power of two up to the maximum, sometimes not.
    pub fn queue_size(&mut self, max: u16) -> u16 {
        match self.rng.random_range(0..16u32) {
            0 => self.rng.random(),
            1 => 0,
            2 => max.saturating_add(1),
            3 => self.rng.random_range(1..=max),
            _ => 1 << self.rng.random_range(0..=max.trailing_zeros()),
        }
    }

    /// A ring address: mostly the queue's, sometimes anywhere (unaligned, in the hole, past RAM).
    fn ring_addr(&mut self, usual: u64) -> u64 {
        match self.rng.random_range(0..40u32) {
            0 => self.rng.random(),
            1 => HOLE - self.rng.random_range(0..0x1000u64),
            2 => RAM_END - self.rng.random_range(0..0x1000u64),
            3 => usual + 1,
            _ => usual,
        }
    }

    /// Resets the device and brings it up through the status state machine with `features`
    /// (masked, sometimes garbage) and `sizes[q]` per queue; random register traffic between
    /// the steps, steps sometimes skipped. Returns the rings each queue was given.
    pub fn bring_up(
        &mut self,
        dev: &impl Regs,
        offered: u64,
        sizes: &[u16],
    ) -> Vec<(u64, u64, u64)> {
        dev.w32(reg(VIRTIO_MMIO_STATUS), 0);
        dev.w32(reg(VIRTIO_MMIO_INTERRUPT_ACK), 3);
        let mut status = 0;
        for bit in [STATUS_ACKNOWLEDGE, STATUS_DRIVER] {
            if !self.chance(64) {
                status |= bit;
            }
            dev.w32(reg(VIRTIO_MMIO_STATUS), status);
            self.noise(dev);
        }
        let features = match self.rng.random_range(0..16u32) {
            0 => self.rng.random(),
            1 => offered & !(1 << 32),
            _ => offered & (self.rng.random::<u64>() | 1 << 32),
        };
        for (sel, half) in [(0, features as u32), (1, (features >> 32) as u32)] {
            dev.w32(reg(VIRTIO_MMIO_DRIVER_FEATURES_SEL), sel);
            dev.w32(reg(VIRTIO_MMIO_DRIVER_FEATURES), half);
        }
        self.noise(dev);
        status |= STATUS_FEATURES_OK;
        dev.w32(reg(VIRTIO_MMIO_STATUS), status);
        let mut rings = Vec::with_capacity(sizes.len());
        for (q, &size) in sizes.iter().enumerate() {
            let base = queue_base(q);
            let (desc, avail, used) = (
                self.ring_addr(base),
                self.ring_addr(base + 0x1000),
                self.ring_addr(base + 0x2000),
            );
            dev.w32(reg(VIRTIO_MMIO_QUEUE_SEL), q as u32);
            dev.w32(reg(VIRTIO_MMIO_QUEUE_NUM), u32::from(size));
            for (lo, v) in [
                (reg(VIRTIO_MMIO_QUEUE_DESC_LOW), desc),
                (reg(VIRTIO_MMIO_QUEUE_AVAIL_LOW), avail),
                (reg(VIRTIO_MMIO_QUEUE_USED_LOW), used),
            ] {
                dev.w32(lo, v as u32);
                dev.w32(lo + 4, (v >> 32) as u32);
            }
            self.noise(dev);
            if !self.chance(64) {
                dev.w32(reg(VIRTIO_MMIO_QUEUE_READY), 1);
            }
            rings.push((desc, avail, used));
        }
        if !self.chance(64) {
            dev.w32(reg(VIRTIO_MMIO_STATUS), status | STATUS_DRIVER_OK);
        }
        self.noise(dev);
        rings
    }

    /// Writes queue `q`'s descriptor table, indirect tables, available ring (heads of
    /// `shapes`, well-formed chains mutated, and random chains) and used ring, all at the
    /// queue's usual addresses, for a queue of `size` entries (the number the driver wrote,
    /// whatever the device made of it).
    pub fn lay_out_queue(
        &mut self,
        mem: &GuestMemoryMmap,
        q: usize,
        size: u16,
        shapes: &[ChainShape],
        random_chains: usize,
    ) {
        let base = queue_base(q);
        let table_len = size.clamp(1, 256);
        let mut table = [Desc::default(); 256];
        for d in table.iter_mut().take(usize::from(table_len)) {
            *d = self.random_desc(table_len);
        }
        let mut heads: Vec<u16> = Vec::with_capacity(shapes.len() + random_chains);
        let mut cursor: u16 = 0;
        for (i, shape) in shapes.iter().enumerate() {
            let n = shape.bufs.len() as u16;
            let mut descs: Vec<Desc> = shape
                .bufs
                .iter()
                .map(|&(addr, len, w)| Desc {
                    addr,
                    len,
                    flags: if w { DESC_F_WRITE } else { 0 },
                    next: 0,
                })
                .collect();
            let indirect = self.chance(4) && i < 8;
            let start = if indirect { 0 } else { cursor };
            if !indirect && u32::from(cursor) + u32::from(n) > u32::from(table_len) {
                break;
            }
            let count = descs.len();
            for (k, d) in descs.iter_mut().enumerate() {
                if k + 1 < count {
                    d.flags |= DESC_F_NEXT;
                    d.next = start + k as u16 + 1;
                }
                if self.chance(6) {
                    self.mutate(d, table_len);
                }
            }
            if indirect {
                let at = INDIRECT + i as u64 * INDIRECT_TABLE_LEN;
                write_descs(mem, at, &descs);
                let head = cursor % table_len;
                let mut len = (count as u32) * 16;
                if self.chance(8) {
                    len = self.len();
                }
                table[usize::from(head)] = Desc {
                    addr: if self.chance(16) { self.buf_addr() } else { at },
                    len,
                    flags: DESC_F_INDIRECT | if self.chance(16) { self.flags() } else { 0 },
                    next: 0,
                };
                heads.push(head);
                cursor = cursor.saturating_add(1);
            } else {
                for (k, d) in descs.into_iter().enumerate() {
                    table[usize::from(cursor) + k] = d;
                }
                heads.push(cursor);
                cursor += n;
            }
        }
        for _ in 0..random_chains {
            heads.push(self.next(table_len));
        }
        write_descs(mem, base, &table[..usize::from(table_len)]);
        // Available ring: flags, idx, ring[size], used_event.
        let avail = base + 0x1000;
        let idx = match self.rng.random_range(0..16u32) {
            0 => self.rng.random(),
            1 => heads.len() as u16 + self.rng.random_range(1..=table_len),
            _ => heads.len() as u16,
        };
        let flags: u16 = if self.chance(8) { self.rng.random() } else { 0 };
        let _ = mem.write_obj(flags, GuestAddress(avail));
        let _ = mem.write_obj(idx, GuestAddress(avail + 2));
        for slot in 0..usize::from(table_len) {
            let head = match heads.get(slot) {
                Some(&h) if !self.chance(32) => h,
                _ => self.next(table_len),
            };
            let _ = mem.write_obj(head, GuestAddress(avail + 4 + 2 * slot as u64));
        }
        let used_event: u16 = if self.chance(4) { self.rng.random() } else { 0 };
        let _ = mem.write_obj(
            used_event,
            GuestAddress(avail + 4 + 2 * u64::from(table_len)),
        );
        // Used ring: flags and idx zero (sometimes not), avail_event.
        let used = base + 0x2000;
        let used_idx: u16 = if self.chance(32) {
            self.rng.random()
        } else {
            0
        };
        let _ = mem.write_obj(0u16, GuestAddress(used));
        let _ = mem.write_obj(used_idx, GuestAddress(used + 2));
    }

    /// Kicks: mostly the queue meant, sometimes another index (valid or not).
    pub fn kick(&mut self, dev: &impl Regs, q: usize) {
        let index = match self.rng.random_range(0..24u32) {
            0 => self.rng.random(),
            1 => self.rng.random_range(0..4u32),
            _ => q as u32,
        };
        dev.w32(reg(VIRTIO_MMIO_QUEUE_NOTIFY), index);
    }
}

fn write_descs(mem: &GuestMemoryMmap, at: u64, descs: &[Desc]) {
    let mut raw = [0u8; 16];
    for (i, d) in descs.iter().enumerate() {
        raw[..8].copy_from_slice(&d.addr.to_le_bytes());
        raw[8..12].copy_from_slice(&d.len.to_le_bytes());
        raw[12..14].copy_from_slice(&d.flags.to_le_bytes());
        raw[14..16].copy_from_slice(&d.next.to_le_bytes());
        let _ = mem.write_slice(&raw, GuestAddress(at + 16 * i as u64));
    }
}

/// Reads `len` bytes of guest memory at `addr` if they are all in guest RAM.
pub fn read_guest(mem: &GuestMemoryMmap, addr: u64, buf: &mut [u8]) -> bool {
    mem.read_slice(buf, GuestAddress(addr)).is_ok()
}
