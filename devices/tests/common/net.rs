//! A virtio-net driver for tests: brings the device up with its two queues laid out in guest
//! memory, posts receive buffers and transmit chains built by hand, and a fake backend whose
//! frames the test controls (and which can "go away" like a deleted tap).

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use farvm_devices::interrupt::IrqLine;
use farvm_devices::virtio::mmio::*;
use farvm_devices::virtio::net::{MacAddr, Net, NetBackend, NET_HDR_LEN};
use vm_memory::{Bytes, GuestAddress};

use super::*;

pub const MAC: MacAddr = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
/// Queue 0 (receive) rings.
pub const RX_DESC: u64 = 0x1000;
pub const RX_AVAIL: u64 = 0x3000;
pub const RX_USED: u64 = 0x4000;
/// Queue 1 (transmit) rings.
pub const TX_DESC: u64 = 0x5000;
pub const TX_AVAIL: u64 = 0x7000;
pub const TX_USED: u64 = 0x8000;
/// Receive buffers: slot i at `RX_BUFS + i * RX_BUF_LEN`.
pub const RX_BUFS: u64 = 0x20000;
pub const RX_BUF_LEN: u32 = 2048;
/// Transmit frames: slot i at `TX_BUFS + i * 0x1000`.
pub const TX_BUFS: u64 = 0x60000;
pub const NET_QUEUE: u16 = 16;

/// Frames a test hands the device, frames the device sent, whether the "tap" is gone (EBADFD)
/// or down (EIO on writes), and the carrier it reports.
#[derive(Default)]
pub struct FakeBackend {
    pub incoming: VecDeque<Vec<u8>>,
    pub sent: Vec<Vec<u8>>,
    pub gone: bool,
    pub down: bool,
    pub carrier: Option<bool>,
}

impl NetBackend for FakeBackend {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.gone {
            return Err(io::Error::from_raw_os_error(libc::EBADFD));
        }
        let Some(f) = self.incoming.pop_front() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        // Like a tap: a frame longer than the buffer is cut.
        let n = f.len().min(buf.len());
        buf[..n].copy_from_slice(&f[..n]);
        Ok(n)
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        if self.gone {
            return Err(io::Error::from_raw_os_error(libc::EBADFD));
        }
        if self.down {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.sent.push(frame.to_vec());
        Ok(())
    }

    fn poll_fd(&self) -> Option<RawFd> {
        None
    }

    fn carrier(&self) -> Option<bool> {
        self.carrier
    }
}

/// One split queue as the test driver sees it.
pub struct Ring {
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    pub next_desc: u16,
    pub avail_idx: u16,
}

impl Ring {
    fn new(desc: u64, avail: u64, used: u64) -> Self {
        Ring {
            desc,
            avail,
            used,
            next_desc: 0,
            avail_idx: 0,
        }
    }
}

pub struct NetRig<B: NetBackend> {
    pub dev: Arc<VirtioMmio<Net<B>, Mem>>,
    pub mem: Mem,
    pub edges: Arc<Edges>,
    pub rx: Ring,
    pub tx: Ring,
}

pub fn net_rig<B: NetBackend>(backend: B) -> NetRig<B> {
    net_rig_in(backend, guest_memory())
}

/// A rig whose guest memory is `mem` (it must hold the rings at their fixed addresses).
pub fn net_rig_in<B: NetBackend>(backend: B, mem: Mem) -> NetRig<B> {
    let edges = Arc::new(Edges::default());
    let net = Net::new(backend, MAC).unwrap();
    let dev =
        Arc::new(VirtioMmio::new(net, mem.clone(), IrqLine::new(edges.clone(), GSI)).unwrap());
    NetRig {
        dev,
        mem,
        edges,
        rx: Ring::new(RX_DESC, RX_AVAIL, RX_USED),
        tx: Ring::new(TX_DESC, TX_AVAIL, TX_USED),
    }
}

/// An Ethernet frame from `MAC` to broadcast with `ethertype` and `payload`.
pub fn ether(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&MAC);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// `frame` headed by a zero 12-byte virtio_net_hdr_v1.
pub fn with_hdr(frame: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8; NET_HDR_LEN];
    v.extend_from_slice(frame);
    v
}

impl<B: NetBackend> Regs for NetRig<B> {
    fn load(&self, off: u64, data: &mut [u8]) {
        self.dev.read(off, data)
    }

    fn store(&self, off: u64, data: &[u8]) {
        self.dev.write(off, data)
    }
}

impl<B: NetBackend> NetRig<B> {
    /// The whole Linux-style bring-up with `features`, both queues at `NET_QUEUE` entries.
    pub fn start(&mut self, features: u64) {
        let status = self.negotiate(features);
        assert_ne!(status & STATUS_FEATURES_OK, 0, "features refused");
        for (q, ring) in [(0u32, &self.rx), (1, &self.tx)] {
            self.w32(REG_QUEUE_SEL, q);
            self.w32(REG_QUEUE_NUM, u32::from(NET_QUEUE));
            for (lo, v) in [
                (REG_QUEUE_DESC_LOW, ring.desc),
                (REG_QUEUE_AVAIL_LOW, ring.avail),
                (REG_QUEUE_USED_LOW, ring.used),
            ] {
                self.w32(lo, v as u32);
                self.w32(lo + 4, (v >> 32) as u32);
            }
            self.w32(REG_QUEUE_READY, 1);
        }
        self.driver_ok();
        assert_eq!(self.r32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
        self.rx = Ring::new(RX_DESC, RX_AVAIL, RX_USED);
        self.tx = Ring::new(TX_DESC, TX_AVAIL, TX_USED);
    }

    /// Puts a chain of `(addr, len, device_writable)` in queue `q`'s table and publishes it
    /// (no kick); returns the head.
    pub fn post(&mut self, q: usize, bufs: &[(u64, u32, bool)]) -> u16 {
        let ring = if q == 0 { &self.rx } else { &self.tx };
        let (table, head) = (ring.desc, ring.next_desc);
        for (i, &(addr, len, w)) in bufs.iter().enumerate() {
            let idx = (head + i as u16) % NET_QUEUE;
            let last = i + 1 == bufs.len();
            let flags = if w { DESC_F_WRITE } else { 0 } | if last { 0 } else { DESC_F_NEXT };
            write_desc_at(
                &self.mem,
                table,
                idx,
                addr,
                len,
                flags,
                (idx + 1) % NET_QUEUE,
            );
        }
        let ring = if q == 0 { &mut self.rx } else { &mut self.tx };
        ring.next_desc = (head + bufs.len() as u16) % NET_QUEUE;
        let slot = u64::from(ring.avail_idx % NET_QUEUE);
        let avail = ring.avail;
        ring.avail_idx = ring.avail_idx.wrapping_add(1);
        let idx = ring.avail_idx;
        self.mem
            .write_obj(head, GuestAddress(avail + 4 + 2 * slot))
            .unwrap();
        self.mem.write_obj(idx, GuestAddress(avail + 2)).unwrap();
        head
    }

    /// Posts receive buffer `slot` (one writable descriptor of `RX_BUF_LEN` bytes).
    pub fn post_rx(&mut self, slot: u64) -> u16 {
        self.post(
            0,
            &[(RX_BUFS + slot * u64::from(RX_BUF_LEN), RX_BUF_LEN, true)],
        )
    }

    /// Writes `frame` (header included) into transmit slot `slot` and posts it.
    pub fn post_tx(&mut self, slot: u64, frame: &[u8]) -> u16 {
        let at = TX_BUFS + slot * 0x1000;
        self.mem.write_slice(frame, GuestAddress(at)).unwrap();
        self.post(1, &[(at, frame.len() as u32, false)])
    }

    pub fn kick(&self, q: u32) {
        self.w32(REG_QUEUE_NOTIFY, q);
    }

    pub fn used_idx(&self, q: usize) -> u16 {
        let used = if q == 0 { RX_USED } else { TX_USED };
        self.mem.read_obj(GuestAddress(used + 2)).unwrap()
    }

    /// Used element `n` of queue `q`: (descriptor id, length).
    pub fn used(&self, q: usize, n: u16) -> (u32, u32) {
        let used = if q == 0 { RX_USED } else { TX_USED };
        let base = used + 4 + 8 * u64::from(n % NET_QUEUE);
        (
            self.mem.read_obj(GuestAddress(base)).unwrap(),
            self.mem.read_obj(GuestAddress(base + 4)).unwrap(),
        )
    }

    pub fn read_guest(&self, at: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(at)).unwrap();
        v
    }

    /// The received bytes (header included) of receive used element `n`, buffers posted with
    /// [`NetRig::post_rx`] in slot order from 0.
    pub fn rx_frame(&self, n: u16) -> Vec<u8> {
        let (id, len) = self.used(0, n);
        self.read_guest(
            RX_BUFS + u64::from(id) * u64::from(RX_BUF_LEN),
            len as usize,
        )
    }

    /// Link status from configuration space (bit 0: up).
    pub fn link_status(&self) -> u16 {
        let mut b = [0u8; 2];
        self.dev.read(REG_CONFIG + 6, &mut b);
        u16::from_le_bytes(b)
    }
}
