//! The virtio-blk target: the production [`Block`] device on a small raw image in a scratch
//! directory, driven by the hostile [`Driver`]. Besides not panicking, not hanging and not
//! touching memory outside guest RAM, the image must change only in sectors some OUT request
//! the driver posted asked to write: before and after the kicks, the target decodes every chain
//! the device can reach (every head in the available ring, walked as virtio-queue walks it,
//! indirect tables included) and collects the sector ranges OUT headers name; any other sector
//! that differs from the image's shadow copy is a violation.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use farvm_devices::interrupt::IrqLine;
use farvm_devices::virtio::block::{Block, BlockConfig, BlockStats, SECTOR_SIZE};
use farvm_devices::virtio::mmio::VirtioMmio;
use farvm_devices::virtio::VirtioDevice;
use rand::RngExt;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::driver::*;
use super::memory::{Dev, Mem, RAM_END};
use super::{Counts, NoInterrupts, Target};

/// Image size: 256 sectors (128 KiB).
const SECTORS: u64 = 256;
const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;

pub struct BlkTarget {
    mem: Mem,
    dev: Dev<Block>,
    image: std::fs::File,
    shadow: Vec<u8>,
    now: Vec<u8>,
    allowed: Vec<(u64, u64)>,
    /// Guest bytes the device reads to decide what to write (headers, descriptors, rings)
    /// and bytes it may write (device-writable buffers, the used ring), as [start, end).
    read_by_device: Vec<(u64, u64)>,
    written_by_device: Vec<(u64, u64)>,
    seen: Vec<bool>,
    base_stats: BlockStats,
    counts: Counts,
    /// Keeps the scratch directory (and the image) alive.
    _dir: tempfile::TempDir,
}

impl BlkTarget {
    pub fn new(mem: Mem, scratch: &Path) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("farvm-fuzz-virtio-")
            .tempdir_in(scratch)
            .with_context(|| format!("scratch directory in {}", scratch.display()))?;
        let path = dir.path().join("disk.img");
        let shadow: Vec<u8> = (0..SECTORS * SECTOR_SIZE)
            .map(|i| (i / SECTOR_SIZE) as u8 ^ (i % 251) as u8)
            .collect();
        std::fs::write(&path, &shadow).context("writing the fuzzed image")?;
        let block = Block::open(&BlockConfig {
            path: path.clone(),
            read_only: false,
            serial: Some("fuzz".into()),
        })?;
        let image = std::fs::File::open(&path)?;
        let dev = VirtioMmio::new(block, mem.clone(), IrqLine::new(Arc::new(NoInterrupts), 0))?;
        Ok(BlkTarget {
            mem,
            dev,
            image,
            now: shadow.clone(),
            shadow,
            allowed: Vec::new(),
            read_by_device: Vec::new(),
            written_by_device: Vec::new(),
            seen: vec![false; 1 << 16],
            base_stats: BlockStats::default(),
            counts: Counts::default(),
            _dir: dir,
        })
    }

    /// A request as a well-formed chain would carry it: header, data, status byte.
    fn request(&mut self, drv: &mut Driver) -> ChainShape {
        let mem = &*self.mem;
        let req_type = match drv.rng.random_range(0..20u32) {
            0..=6 => T_IN,
            7..=13 => T_OUT,
            14..=15 => T_FLUSH,
            16..=17 => T_GET_ID,
            _ => drv.rng.random(),
        };
        let sectors = drv.rng.random_range(1..=8u64);
        let sector = match drv.rng.random_range(0..16u32) {
            0 => drv.rng.random(),
            1 => SECTORS - drv.rng.random_range(0..sectors + 1),
            2 => u64::MAX / SECTOR_SIZE - drv.rng.random_range(0..4u64),
            _ => drv.rng.random_range(0..SECTORS),
        };
        let hdr = DATA + drv.rng.random_range(0..0x3000u64) * 16;
        let mut header = [0u8; 16];
        header[..4].copy_from_slice(&req_type.to_le_bytes());
        header[8..].copy_from_slice(&sector.to_le_bytes());
        let _ = mem.write_slice(&header, GuestAddress(hdr));
        let mut bufs = vec![(hdr, 16, false)];
        let data_len = match req_type {
            T_GET_ID => 20,
            T_IN | T_OUT => (sectors * SECTOR_SIZE) as u32,
            _ => 0,
        };
        let mut left = data_len;
        while left > 0 {
            let n = if drv.chance(3) {
                drv.rng.random_range(1..=left)
            } else {
                left
            };
            let at = if drv.chance(4) {
                drv.buf_addr()
            } else {
                DATA + 0x1_0000 + drv.rng.random_range(0..0x2_0000u64)
            };
            if req_type == T_OUT && drv.chance(2) {
                let fill = [drv.rng.random::<u8>(); 64];
                let _ = mem.write_slice(&fill, GuestAddress(at));
            }
            bufs.push((at, n, req_type != T_OUT));
            left -= n;
        }
        bufs.push((DATA + drv.rng.random_range(0..0x4_0000u64), 1, true));
        ChainShape { bufs }
    }

    /// Sector ranges (bytes) the OUT requests reachable from the available ring name, and
    /// the guest bytes those chains and the rings occupy.
    fn collect_allowed(&mut self) {
        let mem: &GuestMemoryMmap = &self.mem;
        self.dev.w32(reg(VIRTIO_MMIO_QUEUE_SEL), 0);
        let desc = reg64(&self.dev, reg(VIRTIO_MMIO_QUEUE_DESC_LOW));
        let avail = reg64(&self.dev, reg(VIRTIO_MMIO_QUEUE_AVAIL_LOW));
        let used = reg64(&self.dev, reg(VIRTIO_MMIO_QUEUE_USED_LOW));
        let span = |at: u64, len: u64| (at, at.saturating_add(len));
        self.read_by_device.push(span(avail, 6 + 2 * 256));
        self.written_by_device.push(span(used, 6 + 8 * 256));
        self.seen.iter_mut().for_each(|s| *s = false);
        for slot in 0..256u64 {
            let mut raw = [0u8; 2];
            if !read_guest(mem, avail.wrapping_add(4 + 2 * slot), &mut raw) {
                continue;
            }
            let head = u16::from_le_bytes(raw);
            if std::mem::replace(&mut self.seen[usize::from(head)], true) {
                continue;
            }
            let spans = Spans {
                read: &mut self.read_by_device,
                written: &mut self.written_by_device,
            };
            if let Some(range) = out_range(mem, desc, head, spans) {
                self.allowed.push(range);
            }
        }
    }

    /// Whether the device may write guest bytes it also reads to decide what to write: then a
    /// chain served early can rewrite a later chain's header or descriptors in the middle of
    /// a kick, and the OUT requests decoded before and after the kicks need not be all the
    /// device saw.
    fn self_modifying(&self) -> bool {
        self.written_by_device.iter().any(|&(wa, wb)| {
            self.read_by_device
                .iter()
                .any(|&(ra, rb)| wa < rb && ra < wb)
        })
    }
}

/// Where a walk records the guest bytes a chain occupies.
struct Spans<'a> {
    read: &'a mut Vec<(u64, u64)>,
    written: &'a mut Vec<(u64, u64)>,
}

fn reg64(dev: &impl Regs, low: u64) -> u64 {
    u64::from(dev.r32(low)) | u64::from(dev.r32(low + 4)) << 32
}

/// Walks the chain at `head` as virtio-queue does (for the largest queue, so the device's walk
/// is a prefix of it) and, if its device-readable bytes start with an OUT header, returns the
/// byte range of the image the request may write.
fn out_range(
    mem: &GuestMemoryMmap,
    desc_table: u64,
    head: u16,
    spans: Spans<'_>,
) -> Option<(u64, u64)> {
    let (mut table, mut size, mut next, mut ttl) = (desc_table, 256u32, u32::from(head), 256u32);
    let mut indirect = false;
    let mut header = [0u8; 16];
    let mut got = 0usize;
    let mut readable = 0u64;
    let mut writable: Vec<(u64, u64)> = Vec::new();
    while ttl > 0 && next < size {
        let mut raw = [0u8; 16];
        let at = table.checked_add(16 * u64::from(next))?;
        if !read_guest(mem, at, &mut raw) {
            break;
        }
        spans.read.push((at, at + 16));
        let addr = u64::from_le_bytes(raw[..8].try_into().ok()?);
        let len = u32::from_le_bytes(raw[8..12].try_into().ok()?);
        let flags = u16::from_le_bytes([raw[12], raw[13]]);
        if flags & DESC_F_INDIRECT != 0 {
            if indirect || len % 16 != 0 || len / 16 > u32::from(u16::MAX) {
                break;
            }
            (table, size, next, ttl, indirect) = (addr, len / 16, 0, len / 16, true);
            continue;
        }
        if flags & DESC_F_WRITE != 0 {
            let end = addr.saturating_add(u64::from(len)).min(RAM_END);
            writable.push((addr, end));
        } else {
            // The header's bytes decide what the device writes; the data's only what.
            let n = (16 - got).min(len as usize);
            if n > 0 {
                spans.read.push((addr, addr.saturating_add(n as u64)));
            }
            if n > 0 && read_guest(mem, addr, &mut header[got..got + n]) {
                got += n;
            }
            readable += u64::from(len);
        }
        if flags & DESC_F_NEXT == 0 {
            break;
        }
        next = u32::from(u16::from_le_bytes([raw[14], raw[15]]));
        ttl -= 1;
    }
    let req_type =
        (got == 16).then(|| u32::from_le_bytes([header[0], header[1], header[2], header[3]]));
    // What the device writes into the guest: read data (IN, GET_ID) into every writable
    // buffer, otherwise the status byte only (the last byte of the last writable buffer).
    match req_type {
        Some(T_IN | T_GET_ID) => spans.written.extend_from_slice(&writable),
        _ => {
            if let Some(&(a, b)) = writable.last().filter(|(a, b)| b > a) {
                spans.written.push((b - 1, b.max(a + 1)));
            }
        }
    }
    if req_type != Some(T_OUT) {
        return None;
    }
    let start = u64::from_le_bytes(header[8..].try_into().ok()?).checked_mul(SECTOR_SIZE)?;
    Some((start, start.saturating_add(readable.saturating_sub(16))))
}

impl Target for BlkTarget {
    fn execute(&mut self, drv: &mut Driver) -> Result<()> {
        let offered = self.dev.with_device(|b| b.features());
        let size = drv.queue_size(256);
        // The rings are written before the bring-up: a stray kick among its last register
        // writes then serves this execution's chains, not the last one's, which the check
        // (decoding from the queue addresses the bring-up set) would not know.
        let requests = drv.rng.random_range(0..8usize);
        let shapes: Vec<ChainShape> = (0..requests).map(|_| self.request(drv)).collect();
        let random_chains = if drv.chance(3) {
            drv.rng.random_range(1..4)
        } else {
            0
        };
        drv.lay_out_queue(&self.mem, 0, size, &shapes, random_chains);
        self.allowed.clear();
        self.read_by_device.clear();
        self.written_by_device.clear();
        drv.bring_up(&self.dev, offered, &[size]);
        let activated = self.dev.r32(reg(VIRTIO_MMIO_STATUS)) & STATUS_DRIVER_OK != 0;
        self.collect_allowed();
        for _ in 0..drv.rng.random_range(1..=3u32) {
            if drv.chance(16) {
                drv.random_register_op(&self.dev);
            }
            drv.kick(&self.dev, 0);
        }
        self.collect_allowed();
        if self.dev.r32(reg(VIRTIO_MMIO_MAGIC_VALUE)) != MAGIC {
            bail!("the transport no longer answers (magic register)");
        }
        // The image changed only where an OUT request asked.
        self.image.read_exact_at(&mut self.now, 0)?;
        let checked = !self.self_modifying();
        self.counts.add(
            "image checks (the rest: buffers overlap requests)",
            u64::from(checked),
        );
        if !checked {
            self.shadow.copy_from_slice(&self.now);
        } else if self.now != self.shadow {
            for s in 0..SECTORS {
                let r = (s * SECTOR_SIZE) as usize..((s + 1) * SECTOR_SIZE) as usize;
                if self.now[r.clone()] == self.shadow[r.clone()] {
                    continue;
                }
                let (a, b) = (r.start as u64, r.end as u64);
                if !self.allowed.iter().any(|&(lo, hi)| lo <= a && b <= hi) {
                    self.dev.w32(reg(VIRTIO_MMIO_QUEUE_SEL), 0);
                    bail!(
                        "sector {s} of the image changed, but no OUT request posted covers it \
                         (rings at desc {:#x}, avail {:#x}, used {:#x}; OUT ranges {:x?})",
                        reg64(&self.dev, reg(VIRTIO_MMIO_QUEUE_DESC_LOW)),
                        reg64(&self.dev, reg(VIRTIO_MMIO_QUEUE_AVAIL_LOW)),
                        reg64(&self.dev, reg(VIRTIO_MMIO_QUEUE_USED_LOW)),
                        self.allowed
                    );
                }
                self.shadow[r.clone()].copy_from_slice(&self.now[r]);
            }
        }
        let status = self.dev.r32(reg(VIRTIO_MMIO_STATUS));
        let stats = self.dev.with_device(|b| b.stats());
        let c = &mut self.counts;
        c.add("driver-ok reached", u64::from(activated));
        c.add("needs-reset", u64::from(status & STATUS_NEEDS_RESET != 0));
        c.add("reads completed", stats.reads - self.base_stats.reads);
        c.add("writes completed", stats.writes - self.base_stats.writes);
        c.add("flushes completed", stats.flushes - self.base_stats.flushes);
        c.add(
            "requests rejected (IOERR, UNSUPP, no status byte)",
            stats.errors - self.base_stats.errors,
        );
        c.add(
            "bytes read from image",
            stats.bytes_read - self.base_stats.bytes_read,
        );
        c.add(
            "bytes written to image",
            stats.bytes_written - self.base_stats.bytes_written,
        );
        self.base_stats = stats;
        Ok(())
    }

    fn counts(&self) -> &Counts {
        &self.counts
    }
}
