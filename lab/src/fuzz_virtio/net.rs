//! The virtio-net target: the production [`Net`] device on a [`SocketBackend`], one end of a
//! `SOCK_SEQPACKET` socketpair standing in for the tap (a real tap needs CAP_NET_ADMIN; the
//! device only sees the [`NetBackend`] seam, whose tap implementation reads and writes one frame
//! per call exactly like a seqpacket socket). The fuzzer holds the other end: it sends frames of
//! every size (runts, exactly a header, full size, oversized) for the receive queue and counts
//! what the device transmits, which must equal the frames the device says it sent.
//!
//! Now and then the backend vanishes mid-run (its descriptor closed: reads and writes fail with
//! EBADF, as a deleted tap's do): the device must take the link down (config status without
//! `VIRTIO_NET_S_LINK_UP`, a config-change interrupt once the driver is up), not exit; the next
//! execution starts on a fresh device.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use anyhow::{bail, Result};
use farvm_devices::interrupt::{InterruptController, InterruptError, IrqLine};
use farvm_devices::virtio::mmio::VirtioMmio;
use farvm_devices::virtio::net::{
    Net, NetBackend, NetStats, BUFFER_LEN, NET_HDR_LEN, RX_QUEUE, TX_QUEUE,
};
use farvm_devices::virtio::VirtioDevice;
use rand::RngExt;
use vm_memory::{Bytes, GuestAddress};

use super::driver::*;
use super::memory::{Dev, Mem};
use super::{Counts, Target};

/// One end of a seqpacket socketpair as the device's backend; `None` once it vanished.
pub struct SocketBackend {
    fd: Option<OwnedFd>,
}

fn errno() -> io::Error {
    io::Error::last_os_error()
}

impl SocketBackend {
    /// A socketpair: the backend, and the peer end the fuzzer drives.
    fn pair() -> io::Result<(SocketBackend, OwnedFd)> {
        let mut fds = [0; 2];
        // SAFETY: socketpair(2) writes two descriptors into `fds`, a live two-int array.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(errno());
        }
        // SAFETY: both descriptors were just created by socketpair(2) and are owned by nothing
        // else.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok((SocketBackend { fd: Some(a) }, b))
    }

    fn raw(&self) -> io::Result<RawFd> {
        self.fd
            .as_ref()
            .map(|f| f.as_raw_fd())
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    /// The backend goes away (as a deleted tap): every later call fails with EBADF.
    fn vanish(&mut self) {
        self.fd = None;
    }
}

impl NetBackend for SocketBackend {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: recv(2) writes at most `buf.len()` bytes into `buf`, borrowed for the call.
        let n = unsafe { libc::recv(self.raw()?, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(errno());
        }
        Ok(n as usize)
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: send(2) reads `frame.len()` bytes from `frame`, borrowed for the call.
        let n = unsafe {
            libc::send(
                self.raw()?,
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            return Err(errno());
        }
        if n as usize != frame.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short send"));
        }
        Ok(())
    }

    fn poll_fd(&self) -> Option<RawFd> {
        self.fd.as_ref().map(|f| f.as_raw_fd())
    }

    fn close(&mut self) {
        self.vanish();
    }
}

/// Counts config-change and used-buffer edges (the transport raises the line for either).
#[derive(Default)]
struct Edges(AtomicU32);

impl InterruptController for Edges {
    fn trigger(&self, _gsi: u32) -> Result<(), InterruptError> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

pub struct NetTarget {
    mem: Mem,
    dev: Dev<Net<SocketBackend>>,
    peer: OwnedFd,
    edges: Arc<Edges>,
    base_stats: NetStats,
    frame: Vec<u8>,
    counts: Counts,
}

const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
/// `status` in configuration space (after the MAC).
const CONFIG_STATUS: u64 = 6;
const INT_CONFIG: u32 = 2;

impl NetTarget {
    pub fn new(mem: Mem) -> Result<Self> {
        let edges = Arc::new(Edges::default());
        let (dev, peer) = Self::device(&mem, &edges)?;
        Ok(NetTarget {
            mem,
            dev,
            peer,
            edges,
            base_stats: NetStats::default(),
            frame: vec![0; BUFFER_LEN + 4096],
            counts: Counts::default(),
        })
    }

    fn device(mem: &Mem, edges: &Arc<Edges>) -> Result<(Dev<Net<SocketBackend>>, OwnedFd)> {
        let (backend, peer) = SocketBackend::pair()?;
        let net = Net::new(backend, MAC)?;
        let irq = IrqLine::new(edges.clone(), 0);
        Ok((VirtioMmio::new(net, mem.clone(), irq)?, peer))
    }

    /// Receive buffers: writable, of every size.
    fn rx_shape(&mut self, drv: &mut Driver) -> ChainShape {
        let n = drv.rng.random_range(1..=3usize);
        let bufs = (0..n)
            .map(|_| {
                let len = match drv.rng.random_range(0..4u32) {
                    0 => drv.len(),
                    1 => BUFFER_LEN as u32,
                    _ => drv.rng.random_range(1..2048),
                };
                (DATA + drv.rng.random_range(0..0x3_0000u64), len, true)
            })
            .collect();
        ChainShape { bufs }
    }

    /// A frame to transmit: header (sometimes asking for offloads) and payload, in pieces.
    fn tx_shape(&mut self, drv: &mut Driver) -> ChainShape {
        let mem = &*self.mem;
        let hdr_at = DATA + 0x3_0000 + drv.rng.random_range(0..0x1000u64) * 16;
        let mut header = [0u8; NET_HDR_LEN];
        if drv.chance(3) {
            header[0] = drv.rng.random_range(0..4u8);
            header[1] = [0u8, 1, 3, 4, 0x80, drv.rng.random()][drv.rng.random_range(0..6usize)];
            drv.rng.fill(&mut header[2..]);
        }
        let _ = mem.write_slice(&header, GuestAddress(hdr_at));
        let mut bufs = vec![(hdr_at, NET_HDR_LEN as u32, false)];
        let payload = match drv.rng.random_range(0..8u32) {
            0 => 0,
            1 => BUFFER_LEN as u32 - NET_HDR_LEN as u32 + drv.rng.random_range(0..2u32),
            _ => drv.rng.random_range(1..1600u32),
        };
        let mut left = payload;
        while left > 0 {
            let n = if drv.chance(3) {
                drv.rng.random_range(1..=left)
            } else {
                left
            };
            bufs.push((DATA + drv.rng.random_range(0..0x3_0000u64), n, false));
            left -= n;
        }
        ChainShape { bufs }
    }

    /// Frames from the "tap" for the receive queue.
    fn feed_frames(&mut self, drv: &mut Driver) {
        for _ in 0..drv.rng.random_range(0..4u32) {
            let len = match drv.rng.random_range(0..10u32) {
                0 => 0,
                1 => drv.rng.random_range(1..=NET_HDR_LEN + 1),
                2 => BUFFER_LEN,
                3 => BUFFER_LEN + drv.rng.random_range(1..4096usize),
                _ => drv.rng.random_range(NET_HDR_LEN + 1..1600),
            };
            // SAFETY: send(2) reads `len` bytes of `self.frame` (longer than any `len` drawn).
            unsafe {
                libc::send(
                    self.peer.as_raw_fd(),
                    self.frame.as_ptr().cast(),
                    len,
                    libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                )
            };
        }
    }

    /// Frames the device sent since the last call.
    fn drain_sent(&mut self) -> u64 {
        let mut frames = 0;
        loop {
            // SAFETY: recv(2) writes at most `self.frame.len()` bytes into `self.frame`.
            let n = unsafe {
                libc::recv(
                    self.peer.as_raw_fd(),
                    self.frame.as_mut_ptr().cast(),
                    self.frame.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            // Nothing waiting (or the backend's end closed): the device never sends frames as
            // short as a header, so an empty read is the end of the stream.
            if n <= 0 {
                return frames;
            }
            frames += 1;
        }
    }
}

impl Target for NetTarget {
    fn execute(&mut self, drv: &mut Driver) -> Result<()> {
        let offered = self.dev.with_device(|n| n.features());
        let sizes = [drv.queue_size(256), drv.queue_size(256)];
        drv.bring_up(&self.dev, offered, &sizes);
        let activated = self.dev.r32(reg(VIRTIO_MMIO_STATUS)) & STATUS_DRIVER_OK != 0;
        for (q, &size) in sizes.iter().enumerate() {
            let chains = drv.rng.random_range(0..6usize);
            let shapes: Vec<ChainShape> = (0..chains)
                .map(|_| {
                    if q == RX_QUEUE {
                        self.rx_shape(drv)
                    } else {
                        self.tx_shape(drv)
                    }
                })
                .collect();
            let random_chains = if drv.chance(3) {
                drv.rng.random_range(1..4)
            } else {
                0
            };
            drv.lay_out_queue(&self.mem, q, size, &shapes, random_chains);
        }
        self.feed_frames(drv);
        let vanish = drv.chance(2000);
        let edges_before = self.edges.0.load(Ordering::Relaxed);
        for k in 0..drv.rng.random_range(1..=4u32) {
            if vanish && k == 0 {
                self.dev.with_device_mut(|n| n.backend_mut().vanish());
            }
            if drv.chance(16) {
                drv.random_register_op(&self.dev);
            }
            let q = if drv.chance(2) { RX_QUEUE } else { TX_QUEUE };
            drv.kick(&self.dev, q);
        }
        // The receive thread's part: the backend turned readable, the queue runs.
        self.dev.notify_queue(RX_QUEUE as u32);
        if self.dev.r32(reg(VIRTIO_MMIO_MAGIC_VALUE)) != MAGIC {
            bail!("the transport no longer answers (magic register)");
        }
        let stats = self.dev.with_device(|n| n.stats());
        let sent = self.drain_sent();
        if sent != stats.tx_frames - self.base_stats.tx_frames {
            bail!(
                "the device counted {} frames sent, the backend got {sent}",
                stats.tx_frames - self.base_stats.tx_frames
            );
        }
        let gone = self.dev.with_device(|n| n.gone());
        let status = self.dev.r32(reg(VIRTIO_MMIO_STATUS));
        let c = &mut self.counts;
        c.add("driver-ok reached", u64::from(activated));
        c.add("needs-reset", u64::from(status & STATUS_NEEDS_RESET != 0));
        c.add(
            "frames received by the guest",
            stats.rx_frames - self.base_stats.rx_frames,
        );
        c.add(
            "frames sent by the guest",
            stats.tx_frames - self.base_stats.tx_frames,
        );
        c.add(
            "received frames dropped",
            stats.rx_dropped - self.base_stats.rx_dropped,
        );
        c.add(
            "sent frames dropped",
            stats.tx_dropped - self.base_stats.tx_dropped,
        );
        c.add(
            "malformed chains consumed",
            stats.malformed - self.base_stats.malformed,
        );
        c.add("backend vanished", u64::from(vanish));
        self.base_stats = stats;
        if gone {
            // The link must read down; a driver that was up must have had a config interrupt.
            let mut st = [0u8; 2];
            self.dev
                .read(reg(VIRTIO_MMIO_CONFIG) + CONFIG_STATUS, &mut st);
            if u16::from_le_bytes(st) & 1 != 0 {
                bail!("the backend is gone but the guest still reads the link up");
            }
            let live = status & STATUS_DRIVER_OK != 0 && status & STATUS_NEEDS_RESET == 0;
            if live {
                let raised = self.edges.0.load(Ordering::Relaxed) != edges_before;
                if !raised || self.dev.r32(reg(VIRTIO_MMIO_INTERRUPT_STATUS)) & INT_CONFIG == 0 {
                    bail!("the backend is gone but the driver got no config-change interrupt");
                }
                c.add("link down reported to a live driver", 1);
            }
            let (dev, peer) = Self::device(&self.mem, &self.edges)?;
            self.dev = dev;
            self.peer = peer;
            self.base_stats = NetStats::default();
        } else {
            // Frames the device left in the "tap" stay for the next execution only up to a
            // point: the fuzzer drains the backend's queue through the device's own reads.
            self.dev.with_device_mut(|n| {
                let mut spare = [0u8; 64];
                while n.backend_mut().recv(&mut spare).is_ok() {}
            });
        }
        Ok(())
    }

    fn counts(&self) -> &Counts {
        &self.counts
    }
}
