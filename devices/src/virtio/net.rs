//! virtio-net (device ID 1) on a [`NetBackend`], usually a [`Tap`]: one receive queue (0) and
//! one transmit queue (1), the MAC address and link status in configuration space
//! (`VIRTIO_NET_F_MAC`, `VIRTIO_NET_F_STATUS`), frames headed by the 12-byte
//! `virtio_net_hdr_v1`. Transmit offloads are offered (`VIRTIO_NET_F_CSUM`,
//! `VIRTIO_NET_F_HOST_TSO4`, `VIRTIO_NET_F_HOST_TSO6`): a guest that takes them sends frames
//! of up to 64 KiB whose checksum and segmentation the tap (the host kernel) completes, so a
//! TCP stream costs one frame per 64 KiB instead of one per 1,500 bytes; the device passes a
//! header on only for offloads the driver accepted ([`tx_header_allowed`]) and drops any other
//! frame, and the kernel validates what it gets. Nothing is offloaded towards the guest: every
//! header the device sends it is zero but for `num_buffers = 1`.
//!
//! Transmit is paced by the driver like a block request: a kick on queue 1 sends every posted
//! frame. Receive is paced by the tap: the device says it has work for queue 0 only while it
//! holds a frame ([`super::VirtioDevice::queue_has_work`] reads the next one from the tap), so
//! the guest's receive buffers stay available until a frame arrives. A thread polling the tap
//! ([`run_rx`]) runs the queue when the tap turns readable, exactly as a driver kick would; the
//! transport stays the only owner of the queues and their lock. This was chosen over a second
//! trait for "devices with work of their own" because the transport would otherwise need a
//! second path that pops chains, and a receive queue is just a queue whose work comes from
//! elsewhere. When the guest has no buffer free, the frame stays held, the thread parks on the
//! device's wake eventfd instead of the (still readable) tap, and the driver's next kick
//! delivers it.
//!
//! Frames move through two fixed buffers allocated once (one per direction, large enough for a
//! 64 KiB frame), so nothing is allocated per packet. A malformed chain (a readable buffer in a
//! receive chain, a writable one in a transmit chain, a buffer outside guest memory, a frame
//! larger than the buffers) is consumed and counted, its frame dropped; guest memory is only
//! touched through vm-memory's checked accessors.
//!
//! The link status follows the tap: a tap that is down on the host (not yet brought up, or
//! `ip link set down`: writes fail with EIO) is a link down for the guest, and up again once
//! the tap is (the receive thread looks at the tap's flags every [`LINK_POLL`]). A tap that
//! goes away (deleted: EBADFD, ENODEV, ENXIO) is a link down for good: a deleted tap's file
//! cannot be attached again, and the receive thread ends. Every change sets the status in
//! configuration space and raises a config-change interrupt; the VMM carries on, the guest sees
//! a cable pulled.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_CSUM, VIRTIO_NET_F_HOST_TSO4, VIRTIO_NET_F_HOST_TSO6, VIRTIO_NET_F_MAC,
    VIRTIO_NET_F_STATUS, VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_NONE,
    VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6, VIRTIO_NET_S_LINK_UP,
};
use virtio_queue::DescriptorChain;
use vm_memory::{Bytes, GuestAddressSpace, GuestMemory};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

use super::mmio::VirtioMmio;
use super::{
    VirtioDevice, VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};

/// The receive queue's index.
pub const RX_QUEUE: usize = 0;
/// The transmit queue's index.
pub const TX_QUEUE: usize = 1;
/// Size of each queue.
pub const QUEUE_SIZE: u16 = 256;
/// Length of `struct virtio_net_hdr_v1` (the header every frame carries with VERSION_1).
pub const NET_HDR_LEN: usize = 12;
/// Largest Ethernet frame moved (64 KiB payload plus an Ethernet and a VLAN header).
pub const FRAME_MAX: usize = 65_550;
/// Size of each of the device's two frame buffers: a header and the largest frame.
pub const BUFFER_LEN: usize = NET_HDR_LEN + FRAME_MAX;
/// How often the receive thread looks at the tap's flags (up or down) when nothing happens.
pub const LINK_POLL: Duration = Duration::from_secs(1);
/// Offset of `num_buffers` in the header.
const NUM_BUFFERS: usize = 10;
/// Configuration space: `mac[6]`, `status` (u16).
const CONFIG_LEN: usize = 8;

/// A MAC address.
pub type MacAddr = [u8; 6];

/// Where the device's frames come from and go to. Frames in both directions are headed by a
/// [`NET_HDR_LEN`]-byte `virtio_net_hdr_v1`.
pub trait NetBackend: Send {
    /// Reads the next frame into `buf` and returns its length (header included); fails with
    /// `WouldBlock` when none is waiting. Must not block.
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
    /// Sends one frame (header included).
    fn send(&mut self, frame: &[u8]) -> io::Result<()>;
    /// A file descriptor that polls readable when [`NetBackend::recv`] has a frame, for the
    /// receive thread; `None` for backends that are polled by other means (tests).
    fn poll_fd(&self) -> Option<RawFd>;
    /// Whether the backend can carry frames now (a tap: up on the host); `None` when it cannot
    /// tell.
    fn carrier(&self) -> Option<bool> {
        None
    }
    /// Lets go of the backend's resources (a tap's file: a tap farvm created goes with it);
    /// afterwards every call fails. For a VM that stops while others still hold its devices.
    fn close(&mut self) {}
}

/// Why a network device could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// `/dev/net/tun` could not be opened.
    #[error("cannot open /dev/net/tun: {0}")]
    OpenTun(#[source] io::Error),
    /// The interface name does not fit `IFNAMSIZ`.
    #[error("tap name {name:?} is empty, longer than 15 bytes or contains a NUL")]
    BadName {
        /// The name given.
        name: String,
    },
    /// TUNSETIFF failed (no permission, a tun device of that name, a multi-queue tap).
    #[error("cannot attach tap {name}: {source}")]
    Attach {
        /// The interface.
        name: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A file descriptor handed over is not an attached tap.
    #[error("file descriptor {fd} is not an attached tap device: {reason}")]
    NotATap {
        /// The descriptor.
        fd: RawFd,
        /// What is wrong with it.
        reason: String,
    },
    /// The tap could not be configured (vnet header size, non-blocking mode).
    #[error("cannot configure tap {name}: {what}: {source}")]
    Configure {
        /// The interface.
        name: String,
        /// The step that failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The device's wake eventfd could not be created.
    #[error("virtio-net eventfd: {0}")]
    EventFd(#[source] io::Error),
}

/// Frame counters (for tests and metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetStats {
    /// Frames delivered to the guest.
    pub rx_frames: u64,
    /// Bytes delivered to the guest (frames, without headers).
    pub rx_bytes: u64,
    /// Frames from the backend dropped (no fitting buffer, a malformed receive chain, a runt).
    pub rx_dropped: u64,
    /// Frames the guest sent that reached the backend.
    pub tx_frames: u64,
    /// Bytes sent (frames, without headers).
    pub tx_bytes: u64,
    /// Frames the guest sent that were dropped (malformed, too large, link down, refused).
    pub tx_dropped: u64,
    /// Chains consumed as malformed, either queue.
    pub malformed: u64,
}

// <linux/if_tun.h>: ioctls on /dev/net/tun and its flags (libc does not carry them).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNGETIFF: libc::c_ulong = 0x8004_54d2;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
const IFNAMSIZ: usize = 16;
const IFF_UP: libc::c_short = 0x1;

/// `struct ifreq` as TUNSETIFF / TUNGETIFF use it: the name and the flags of its union.
#[repr(C)]
struct IfReq {
    name: [u8; IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl IfReq {
    fn zeroed() -> Self {
        IfReq {
            name: [0; IFNAMSIZ],
            flags: 0,
            _pad: [0; 22],
        }
    }
}

/// A tap interface opened through `/dev/net/tun` (or handed over already open): non-blocking,
/// with 12-byte vnet headers.
#[derive(Debug)]
pub struct Tap {
    /// `None` once closed.
    file: Option<File>,
    name: String,
    /// A socket in the namespace the tap was opened in, to read its flags (SIOCGIFFLAGS);
    /// `None` if none could be made (the link is then judged by reads and writes alone).
    ctl: Option<OwnedFd>,
}

/// A datagram socket for interface ioctls in the calling thread's network namespace.
fn ctl_socket() -> Option<OwnedFd> {
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        tracing::debug!("tap: no control socket: {}", io::Error::last_os_error());
        return None;
    }
    // SAFETY: `fd` was just returned by socket(2) and is owned by nothing else.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// TUNGETIFF on `fd`: the attached interface's name and flags.
fn tun_get_iff(fd: RawFd) -> io::Result<IfReq> {
    let mut req = IfReq::zeroed();
    // SAFETY: TUNGETIFF writes one `struct ifreq` into `req`, a live, properly sized
    // `#[repr(C)]` ifreq; the descriptor is borrowed for the call.
    let rc = unsafe { libc::ioctl(fd, TUNGETIFF as _, &mut req) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(req)
}

impl Tap {
    /// Attaches to tap `name`, creating it if it does not exist (it then lives as long as this
    /// file: the VMM's exit removes it). Needs CAP_NET_ADMIN, or a persistent tap owned by the
    /// caller.
    pub fn open(name: &str) -> Result<Self, NetError> {
        if name.is_empty() || name.len() >= IFNAMSIZ || name.contains('\0') {
            return Err(NetError::BadName { name: name.into() });
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open("/dev/net/tun")
            .map_err(NetError::OpenTun)?;
        let mut req = IfReq::zeroed();
        req.name[..name.len()].copy_from_slice(name.as_bytes());
        req.flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
        // SAFETY: TUNSETIFF reads and writes one `struct ifreq`; `req` is a live, properly
        // sized (40-byte) `#[repr(C)]` ifreq for the duration of the call.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) };
        if rc < 0 {
            return Err(NetError::Attach {
                name: name.into(),
                source: io::Error::last_os_error(),
            });
        }
        let tap = Tap {
            file: Some(file),
            name: name.into(),
            ctl: ctl_socket(),
        };
        tap.set_vnet_hdr_size()?;
        Ok(tap)
    }

    /// Takes over `fd`, a tap already attached by someone else (libvirt passes them over the
    /// API socket). It must have been attached as a tap with IFF_NO_PI and IFF_VNET_HDR; it is
    /// made non-blocking.
    pub fn from_fd(fd: OwnedFd) -> Result<Self, NetError> {
        let raw = fd.as_raw_fd();
        let not_a_tap = |reason: String| NetError::NotATap { fd: raw, reason };
        let req = tun_get_iff(raw).map_err(|e| not_a_tap(format!("TUNGETIFF: {e}")))?;
        let len = req.name.iter().position(|&b| b == 0).unwrap_or(IFNAMSIZ);
        let name = String::from_utf8_lossy(&req.name[..len]).into_owned();
        let flags = req.flags;
        if flags & IFF_TAP == 0 {
            return Err(not_a_tap(format!("{name} is a tun (layer 3) device")));
        }
        if flags & IFF_NO_PI == 0 || flags & IFF_VNET_HDR == 0 {
            return Err(not_a_tap(format!(
                "{name} was attached without IFF_NO_PI and IFF_VNET_HDR (flags {flags:#x})"
            )));
        }
        if flags & IFF_MULTI_QUEUE != 0 {
            tracing::info!("tap {name}: multi-queue tap, farvm uses this one queue");
        }
        // SAFETY: F_GETFL/F_SETFL on a descriptor we own; no memory is passed.
        let rc = unsafe {
            let fl = libc::fcntl(raw, libc::F_GETFL);
            if fl < 0 {
                fl
            } else {
                libc::fcntl(raw, libc::F_SETFL, fl | libc::O_NONBLOCK)
            }
        };
        if rc < 0 {
            return Err(NetError::Configure {
                name,
                what: "O_NONBLOCK",
                source: io::Error::last_os_error(),
            });
        }
        let tap = Tap {
            file: Some(File::from(fd)),
            name,
            ctl: ctl_socket(),
        };
        tap.set_vnet_hdr_size()?;
        Ok(tap)
    }

    fn set_vnet_hdr_size(&self) -> Result<(), NetError> {
        let size: libc::c_int = NET_HDR_LEN as libc::c_int;
        // SAFETY: TUNSETVNETHDRSZ reads one int from the pointer; `size` lives for the call.
        let rc = match &self.file {
            // SAFETY: TUNSETVNETHDRSZ reads one int from the pointer; `size` lives for the
            // call and the descriptor is borrowed for it.
            Some(f) => unsafe { libc::ioctl(f.as_raw_fd(), TUNSETVNETHDRSZ as _, &size) },
            None => return Ok(()),
        };
        if rc < 0 {
            return Err(NetError::Configure {
                name: self.name.clone(),
                what: "TUNSETVNETHDRSZ",
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn file(&self) -> io::Result<&File> {
        self.file
            .as_ref()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }
}

impl NetBackend for Tap {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.file()?.read(buf)
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        // A tap takes a frame per write, whole or not at all.
        let n = self.file()?.write(frame)?;
        if n != frame.len() {
            return Err(io::Error::new(io::ErrorKind::WriteZero, "short tap write"));
        }
        Ok(())
    }

    fn poll_fd(&self) -> Option<RawFd> {
        self.file.as_ref().map(|f| f.as_raw_fd())
    }

    fn carrier(&self) -> Option<bool> {
        let ctl = self.ctl.as_ref()?;
        // The interface's current name (it may have been renamed since it was opened).
        let mut req = tun_get_iff(self.file.as_ref()?.as_raw_fd()).ok()?;
        req.flags = 0;
        // SAFETY: SIOCGIFFLAGS reads the name from and writes the flags into `req`, a live,
        // properly sized `#[repr(C)]` ifreq; the socket is borrowed for the call.
        let rc = unsafe { libc::ioctl(ctl.as_raw_fd(), libc::SIOCGIFFLAGS as _, &mut req) };
        // ENODEV: the tap is in another namespace than the control socket; cannot tell.
        (rc == 0).then_some(req.flags & IFF_UP != 0)
    }

    fn close(&mut self) {
        self.file = None;
    }
}

/// Whether `e` means the backend is gone for good (the tap was deleted).
fn backend_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBADFD | libc::ENODEV | libc::ENXIO | libc::EBADF)
    )
}

/// Whether `e` means the backend cannot carry frames for now (a tap that is down: EIO).
fn backend_down(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EIO)
}

/// The virtio-net device model (module doc).
pub struct Net<B: NetBackend> {
    backend: B,
    mac: MacAddr,
    link_up: bool,
    /// The backend went away: the link stays down.
    gone: bool,
    config_changed: bool,
    acked_features: u64,
    active: bool,
    /// The frame held for the receive queue (`rx_len` bytes, 0 when none).
    rx_buf: Box<[u8]>,
    rx_len: usize,
    tx_buf: Box<[u8]>,
    stats: NetStats,
    /// Set by the receive thread when it stops polling the backend (a frame is held, or the
    /// driver is not ready); whoever changes that writes `wake`.
    parked: AtomicBool,
    /// The receive queue ran (the transport asked for work) since the receive thread last
    /// looked: if not, the queue is not ready and polling the backend would spin.
    rx_ran: AtomicBool,
    wake: EventFd,
}

impl<B: NetBackend> std::fmt::Debug for Net<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net")
            .field("mac", &format_mac(&self.mac))
            .field("link_up", &self.link_up)
            .field("stats", &self.stats)
            .finish()
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: &MacAddr) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// What the receive thread should wait for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxWait {
    /// The backend's fd turning readable.
    Backend,
    /// The device's wake eventfd (the driver freed a buffer or became ready).
    Wake,
    /// Nothing: the backend is gone, the link down for good.
    LinkDown,
}

impl<B: NetBackend> Net<B> {
    /// A device with address `mac` on `backend`; the link is up if the backend says it can
    /// carry frames (or cannot tell).
    pub fn new(backend: B, mac: MacAddr) -> Result<Self, NetError> {
        let link_up = backend.carrier().unwrap_or(true);
        Ok(Net {
            backend,
            mac,
            link_up,
            gone: false,
            config_changed: false,
            acked_features: 0,
            active: false,
            rx_buf: vec![0; BUFFER_LEN].into_boxed_slice(),
            rx_len: 0,
            tx_buf: vec![0; BUFFER_LEN].into_boxed_slice(),
            stats: NetStats::default(),
            parked: AtomicBool::new(false),
            rx_ran: AtomicBool::new(false),
            wake: EventFd::new(EFD_NONBLOCK).map_err(NetError::EventFd)?,
        })
    }

    /// The MAC address the guest reads.
    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// Whether the link is up (the backend is there and can carry frames).
    pub fn link_up(&self) -> bool {
        self.link_up
    }

    /// Whether the backend went away for good.
    pub fn gone(&self) -> bool {
        self.gone
    }

    /// Closes the backend (its receive thread must have ended): the device stays, the link
    /// is gone. A stopped VM's devices may outlive it in others' hands; its tap must not (the
    /// next boot opens it again).
    pub fn close_backend(&mut self) {
        self.backend.close();
        self.gone = true;
        self.link_up = false;
        self.rx_len = 0;
    }

    /// Looks at the backend's carrier (a tap up or down on the host) and follows it; the
    /// receive thread calls this every [`LINK_POLL`]. A change is reported to the guest with
    /// the next run of a queue.
    pub fn refresh_link(&mut self) {
        if let Some(up) = self.backend.carrier() {
            self.set_link(up);
        }
    }

    /// Sets the link status (nothing once the backend is gone); a change raises a config
    /// interrupt.
    fn set_link(&mut self, up: bool) {
        if self.gone || self.link_up == up {
            return;
        }
        tracing::info!(
            "virtio-net {}: link {}",
            format_mac(&self.mac),
            if up { "up" } else { "down" }
        );
        self.link_up = up;
        self.config_changed = true;
    }

    /// Frame counters so far.
    pub fn stats(&self) -> NetStats {
        self.stats
    }

    /// The features the driver accepted at activation.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, mutably (tests feed fake backends through it).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// Whether a frame from the backend waits for a receive buffer.
    pub fn rx_held(&self) -> bool {
        self.rx_len > 0
    }

    /// The eventfd the receive thread waits on while parked.
    pub fn wake_fd(&self) -> RawFd {
        self.wake.as_raw_fd()
    }

    /// For the receive thread, after it ran the receive queue: what to wait for next. While a
    /// frame is held (no guest buffer) or the driver has no receive queue ready, polling the
    /// readable backend would spin, so the thread parks on the wake eventfd until a buffer is
    /// used or the driver (re)activates the device.
    pub fn rx_wait(&self) -> RxWait {
        if self.gone {
            return RxWait::LinkDown;
        }
        let ran = self.rx_ran.swap(false, Ordering::SeqCst);
        if self.rx_len > 0 || !self.active || !ran {
            self.parked.store(true, Ordering::SeqCst);
            RxWait::Wake
        } else {
            RxWait::Backend
        }
    }

    fn unpark(&self) {
        if self.parked.swap(false, Ordering::SeqCst) {
            if let Err(e) = self.wake.write(1) {
                tracing::warn!("virtio-net: waking the receive thread: {e}");
            }
        }
    }

    /// Takes the link down for good and tells the guest (module doc).
    fn backend_lost(&mut self, e: &io::Error) {
        if self.gone {
            return;
        }
        tracing::warn!(
            "virtio-net {}: backend gone ({e}); link down",
            format_mac(&self.mac)
        );
        self.set_link(false);
        self.gone = true;
        self.rx_len = 0;
        // A parked receive thread learns it can end.
        self.unpark();
    }

    /// Reads the next frame from the backend into `rx_buf`; whether one is now held. Anything
    /// but a frame ends this run of the queue (the receive thread comes back while the backend
    /// stays readable), so a backend that keeps answering nonsense cannot hold the lock.
    fn fetch_frame(&mut self) -> bool {
        match self.backend.recv(&mut self.rx_buf) {
            Ok(n) if n > NET_HDR_LEN && n <= BUFFER_LEN => {
                self.rx_len = n;
                // Frames flow: whatever the link was thought to be, it carries.
                self.set_link(true);
                true
            }
            Ok(n) => {
                // A runt (or a backend claiming more than the buffer): nothing to deliver.
                tracing::debug!("virtio-net: {n}-byte frame from the backend dropped");
                self.stats.rx_dropped += 1;
                false
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
            Err(e) if backend_gone(&e) => {
                self.backend_lost(&e);
                false
            }
            Err(e) if backend_down(&e) => {
                self.set_link(false);
                false
            }
            Err(e) => {
                tracing::debug!("virtio-net: backend read: {e}");
                self.stats.rx_dropped += 1;
                false
            }
        }
    }

    /// Writes the held frame into the receive chain; returns the used length.
    fn receive<M: GuestMemory>(&mut self, chain: DescriptorChain<&M>) -> u32 {
        let len = std::mem::take(&mut self.rx_len);
        self.unpark();
        if len == 0 {
            // queue_has_work said yes, so a frame is held; defensive only.
            return 0;
        }
        let mem = chain.memory();
        // No offloads: the header is all zero but for num_buffers (always one buffer without
        // VIRTIO_NET_F_MRG_RXBUF). The tap leaves those two bytes of its 12 untouched.
        self.rx_buf[..NET_HDR_LEN].fill(0);
        self.rx_buf[NUM_BUFFERS..NET_HDR_LEN].copy_from_slice(&1u16.to_le_bytes());
        let mut done = 0usize;
        let mut malformed = false;
        for desc in chain.clone() {
            if !desc.is_write_only() {
                malformed = true;
                break;
            }
            let n = (desc.len() as usize).min(len - done);
            if n == 0 {
                continue;
            }
            if mem
                .write_slice(&self.rx_buf[done..done + n], desc.addr())
                .is_err()
            {
                malformed = true;
                break;
            }
            done += n;
            if done == len {
                break;
            }
        }
        if malformed || done < len {
            if malformed {
                self.stats.malformed += 1;
            }
            self.stats.rx_dropped += 1;
            return 0;
        }
        self.stats.rx_frames += 1;
        self.stats.rx_bytes += (len - NET_HDR_LEN) as u64;
        len as u32
    }

    /// Gathers the frame of a transmit chain and sends it; returns the used length (0).
    fn transmit<M: GuestMemory>(&mut self, chain: DescriptorChain<&M>) -> u32 {
        let mem = chain.memory();
        let mut len = 0usize;
        let mut malformed = false;
        for desc in chain.clone() {
            let n = desc.len() as usize;
            if desc.is_write_only() || n > self.tx_buf.len() - len {
                malformed = true;
                break;
            }
            if mem
                .read_slice(&mut self.tx_buf[len..len + n], desc.addr())
                .is_err()
            {
                malformed = true;
                break;
            }
            len += n;
        }
        if malformed || len <= NET_HDR_LEN {
            self.stats.malformed += 1;
            self.stats.tx_dropped += 1;
            return 0;
        }
        // A link thought down is tried anyway: a tap brought up since then takes the frame
        // (and the link comes back), a tap still down refuses it.
        if self.gone {
            self.stats.tx_dropped += 1;
            return 0;
        }
        // The tap acts on the header (checksum, segmentation): only what the driver accepted.
        // A driver that took no offload gets its header ignored (zeroed), as before offloads.
        let header = &mut self.tx_buf[..NET_HDR_LEN];
        if self.acked_features & TX_OFFLOADS == 0 {
            header.fill(0);
        } else if !tx_header_allowed(header, self.acked_features) {
            self.stats.malformed += 1;
            self.stats.tx_dropped += 1;
            return 0;
        }
        header[NUM_BUFFERS..].fill(0);
        match self.backend.send(&self.tx_buf[..len]) {
            Ok(()) => {
                self.stats.tx_frames += 1;
                self.stats.tx_bytes += (len - NET_HDR_LEN) as u64;
                self.set_link(true);
            }
            Err(e) if backend_gone(&e) => {
                self.backend_lost(&e);
                self.stats.tx_dropped += 1;
            }
            Err(e) if backend_down(&e) => {
                self.set_link(false);
                self.stats.tx_dropped += 1;
            }
            Err(e) => {
                tracing::debug!("virtio-net: backend write: {e}");
                self.stats.tx_dropped += 1;
            }
        }
        0
    }
}

/// The transmit offloads offered: the tap completes checksums and segments TCP.
pub const TX_OFFLOADS: u64 =
    1 << VIRTIO_NET_F_CSUM | 1 << VIRTIO_NET_F_HOST_TSO4 | 1 << VIRTIO_NET_F_HOST_TSO6;

/// Whether a transmitted frame's header asks only for what `acked` (the driver's features)
/// allows: a partial checksum with `VIRTIO_NET_F_CSUM`, TCP segmentation over IPv4 or IPv6
/// with `VIRTIO_NET_F_HOST_TSO4` / `_TSO6` (and a partial checksum, as segmentation needs).
/// Flags other than `NEEDS_CSUM` are cleared; any other segmentation type (UDP, ECN) is
/// refused. The kernel checks the header's offsets against the frame.
pub fn tx_header_allowed(header: &mut [u8], acked: u64) -> bool {
    let has = |f: u32| acked & (1 << f) != 0;
    let needs_csum = u32::from(header[0]) & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0;
    if needs_csum && !has(VIRTIO_NET_F_CSUM) {
        return false;
    }
    header[0] &= VIRTIO_NET_HDR_F_NEEDS_CSUM as u8;
    match u32::from(header[1]) {
        VIRTIO_NET_HDR_GSO_NONE => true,
        VIRTIO_NET_HDR_GSO_TCPV4 => needs_csum && has(VIRTIO_NET_F_HOST_TSO4),
        VIRTIO_NET_HDR_GSO_TCPV6 => needs_csum && has(VIRTIO_NET_F_HOST_TSO6),
        _ => false,
    }
}

impl<B: NetBackend> VirtioDevice for Net<B> {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn features(&self) -> u64 {
        VIRTIO_F_VERSION_1
            | VIRTIO_RING_F_EVENT_IDX
            | VIRTIO_RING_F_INDIRECT_DESC
            | 1 << VIRTIO_NET_F_MAC
            | 1 << VIRTIO_NET_F_STATUS
            | TX_OFFLOADS
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut config = [0u8; CONFIG_LEN];
        config[..6].copy_from_slice(&self.mac);
        let status = if self.link_up {
            VIRTIO_NET_S_LINK_UP as u16
        } else {
            0
        };
        config[6..8].copy_from_slice(&status.to_le_bytes());
        for (i, d) in data.iter_mut().enumerate() {
            *d = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
                .and_then(|o| config.get(o).copied())
                .unwrap_or(0);
        }
    }

    fn write_config(&mut self, offset: u64, _data: &[u8]) {
        // The MAC is writable only with the legacy interface or VIRTIO_NET_F_CTRL_MAC_ADDR.
        tracing::debug!("virtio-net: config write at {offset:#x} ignored");
    }

    fn activate(&mut self, acked_features: u64) {
        self.acked_features = acked_features;
        self.active = true;
        self.unpark();
    }

    fn reset(&mut self) {
        self.acked_features = 0;
        self.active = false;
        self.rx_len = 0;
    }

    fn process_chain<M: GuestMemory>(&mut self, queue: usize, chain: DescriptorChain<&M>) -> u32 {
        match queue {
            RX_QUEUE => self.receive(chain),
            TX_QUEUE => self.transmit(chain),
            _ => 0,
        }
    }

    fn queue_has_work(&mut self, queue: usize) -> bool {
        if queue != RX_QUEUE {
            return true;
        }
        *self.rx_ran.get_mut() = true;
        if self.gone || !self.active {
            return false;
        }
        if self.rx_len > 0 {
            return true;
        }
        // One run of the queue fetches at most one frame per available buffer: the guest
        // cannot refill while the transport holds the lock, so a flooding tap cannot keep it.
        self.fetch_frame()
    }

    fn take_config_change(&mut self) -> bool {
        std::mem::take(&mut self.config_changed)
    }
}

/// The receive thread's loop for `dev`: waits for the backend to turn readable (or for the
/// device's wake eventfd while parked) and runs the receive queue, and every [`LINK_POLL`]
/// without either looks at the backend's carrier, until `stop` is written or the backend is
/// gone. Errors are the poller's own (poll(2) failing), never the guest's.
pub fn run_rx<B, A>(dev: &VirtioMmio<Net<B>, A>, stop: &EventFd) -> io::Result<()>
where
    B: NetBackend,
    A: GuestAddressSpace,
{
    let (backend_fd, wake_fd) = dev.with_device(|n| (n.backend.poll_fd(), n.wake_fd()));
    let Some(backend_fd) = backend_fd else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "backend has no fd to poll",
        ));
    };
    loop {
        // POLLERR / POLLHUP on a tap means it is gone: running the queue reads the error
        // and takes the link down (if the driver is ready; otherwise the thread parks).
        dev.notify_queue(RX_QUEUE as u32);
        let wait = dev.with_device(|n| n.rx_wait());
        let fd = match wait {
            RxWait::LinkDown => return Ok(()),
            RxWait::Backend => backend_fd,
            RxWait::Wake => wake_fd,
        };
        let mut fds = [
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let timeout = LINK_POLL.as_millis() as libc::c_int;
        // SAFETY: poll(2) on two pollfd structs in a live local array whose length is passed.
        let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if fds[0].revents != 0 {
            return Ok(());
        }
        if rc == 0 {
            // The next run of the queue reports a change to the guest.
            dev.with_device_mut(|n| n.refresh_link());
        }
        if wait == RxWait::Wake {
            // Non-blocking: a spurious wake just reads EAGAIN.
            let _ = dev.with_device(|n| n.wake.read());
        }
    }
}
