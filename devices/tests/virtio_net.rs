//! virtio-net over virtio-mmio, driven through the register interface and rings as a guest
//! driver would: identification and config space, transmit and receive through a fake backend
//! (held frames, malformed chains, a backend that goes away), and through a real tap in a
//! fresh network namespace (a frame the guest sends comes out of the tap, a frame written into
//! the tap lands in a guest buffer, deleting the tap gives the guest a link-down). The tap
//! tests need root and iproute2, as CI has.

mod common;

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::net::*;
use common::*;
use farvm_devices::virtio::mmio::*;
use farvm_devices::virtio::net::{run_rx, NetError, Tap, NET_HDR_LEN, QUEUE_SIZE, RX_QUEUE};
use farvm_devices::virtio::{VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX};
use virtio_bindings::virtio_net::{VIRTIO_NET_F_CSUM, VIRTIO_NET_F_HOST_TSO4};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

const F_MAC: u64 = 1 << 5;
const F_STATUS: u64 = 1 << 16;
const FEATURES: u64 = VIRTIO_F_VERSION_1 | F_MAC | F_STATUS;
/// An ethertype for local experiments (IEEE 802): nothing else on the tap uses it.
const ETH_TEST: u16 = 0x88b5;
const INT_VRING: u32 = 1;
const INT_CONFIG: u32 = 2;

#[test]
fn identification_registers_and_config_space() {
    let r = net_rig(FakeBackend::default());
    assert_eq!(r.r32(REG_MAGIC), 0x7472_6976);
    assert_eq!(r.r32(REG_DEVICE_ID), 1);
    let f = r.device_features();
    assert_eq!(f & FEATURES, FEATURES);
    for q in 0..2 {
        r.w32(REG_QUEUE_SEL, q);
        assert_eq!(r.r32(REG_QUEUE_NUM_MAX), u32::from(QUEUE_SIZE));
    }
    r.w32(REG_QUEUE_SEL, 2);
    assert_eq!(r.r32(REG_QUEUE_NUM_MAX), 0, "receive and transmit only");
    let mut mac = [0u8; 6];
    r.dev.read(REG_CONFIG, &mut mac);
    assert_eq!(mac, MAC);
    assert_eq!(r.link_status(), 1, "link up");
    // Byte-wise reads and reads past the end.
    let mut b = [0u8; 1];
    r.dev.read(REG_CONFIG + 5, &mut b);
    assert_eq!(b[0], MAC[5]);
    assert_eq!(r.r32(REG_CONFIG + 8), 0);
    // The MAC is not writable through config space.
    r.dev.write(REG_CONFIG, &[0; 6]);
    r.dev.read(REG_CONFIG, &mut mac);
    assert_eq!(mac, MAC);
}

#[test]
fn transmit_sends_each_frame_with_a_clean_header() {
    let mut r = net_rig(FakeBackend::default());
    r.start(FEATURES);
    let frame = ether(ETH_TEST, b"hello from the guest");
    // A driver that puts garbage in the header (no offload was negotiated).
    let mut first = with_hdr(&frame);
    first[..NET_HDR_LEN].fill(0xa5);
    r.post_tx(0, &first);
    // A frame split over two descriptors: header, then the Ethernet frame.
    r.mem
        .write_slice(&[0u8; NET_HDR_LEN], GuestAddress(TX_BUFS + 0x1000))
        .unwrap();
    r.mem
        .write_slice(&frame, GuestAddress(TX_BUFS + 0x2000))
        .unwrap();
    r.post(
        1,
        &[
            (TX_BUFS + 0x1000, NET_HDR_LEN as u32, false),
            (TX_BUFS + 0x2000, frame.len() as u32, false),
        ],
    );
    let edges = r.edges.count();
    r.kick(1);
    assert_eq!(r.used_idx(1), 2);
    assert_eq!(r.used(1, 0).1, 0, "transmit buffers are not written");
    assert!(r.edges.count() > edges);
    assert_ne!(r.r32(REG_INTERRUPT_STATUS) & INT_VRING, 0);
    let sent = r.dev.with_device(|n| n.backend().sent.clone());
    assert_eq!(sent, vec![with_hdr(&frame), with_hdr(&frame)]);
    let stats = r.dev.with_device(|n| n.stats());
    assert_eq!(stats.tx_frames, 2);
    assert_eq!(stats.tx_bytes, 2 * frame.len() as u64);
}

#[test]
fn offloads_the_driver_took_reach_the_tap_and_others_are_refused() {
    use farvm_devices::virtio::net::TX_OFFLOADS;
    let mut r = net_rig(FakeBackend::default());
    assert_eq!(r.device_features() & TX_OFFLOADS, TX_OFFLOADS);
    // The driver takes checksum offload and TSO over IPv4, not over IPv6.
    r.start(FEATURES | 1 << VIRTIO_NET_F_CSUM | 1 << VIRTIO_NET_F_HOST_TSO4);
    let frame = ether(ETH_TEST, &[7; 3000]);
    let header = |flags: u8, gso: u8| {
        let mut f = with_hdr(&frame);
        f[0] = flags;
        f[1] = gso;
        f[4..6].copy_from_slice(&1448u16.to_le_bytes()); // gso_size
        f[6..8].copy_from_slice(&34u16.to_le_bytes()); // csum_start
        f[8..10].copy_from_slice(&16u16.to_le_bytes()); // csum_offset
        f[10..12].copy_from_slice(&9u16.to_le_bytes()); // num_buffers: not for the tap
        f
    };
    let tso4 = header(1, 1); // NEEDS_CSUM, GSO_TCPV4
    let csum_only = header(1 | 2, 0); // DATA_VALID is not the driver's to send: cleared
    let tso6 = header(1, 4); // not accepted
    let tso_without_csum = header(0, 1);
    let udp = header(1, 3);
    for (slot, f) in [&tso4, &csum_only, &tso6, &tso_without_csum, &udp]
        .into_iter()
        .enumerate()
    {
        r.post_tx(slot as u64, f);
    }
    r.kick(1);
    let sent = r.dev.with_device(|n| n.backend().sent.clone());
    let mut want_tso4 = tso4.clone();
    want_tso4[10..12].fill(0);
    let mut want_csum = csum_only.clone();
    want_csum[0] = 1;
    want_csum[10..12].fill(0);
    assert_eq!(
        sent,
        vec![want_tso4, want_csum],
        "the two allowed frames, as the tap needs them"
    );
    let stats = r.dev.with_device(|n| n.stats());
    assert_eq!(
        (stats.tx_frames, stats.tx_dropped, stats.malformed),
        (2, 3, 3)
    );
}

#[test]
fn receive_buffers_wait_for_frames_and_frames_wait_for_buffers() {
    let mut r = net_rig(FakeBackend::default());
    r.start(FEATURES | VIRTIO_RING_F_EVENT_IDX);
    // Buffers and no frame: nothing is used.
    r.post_rx(0);
    r.post_rx(1);
    r.kick(0);
    r.dev.notify_queue(RX_QUEUE as u32);
    assert_eq!(r.used_idx(0), 0);
    // Three frames (the tap's header bytes are garbage: the device writes its own).
    let frames: Vec<Vec<u8>> = (0..3u8)
        .map(|i| {
            let mut f = vec![0x77u8; NET_HDR_LEN];
            f.extend(ether(ETH_TEST, &[i; 60]));
            f
        })
        .collect();
    push_frames(&r, frames.clone());
    r.dev.notify_queue(RX_QUEUE as u32);
    assert_eq!(r.used_idx(0), 2, "two buffers, two frames delivered");
    for n in 0..2u16 {
        let got = r.rx_frame(n);
        let mut hdr = [0u8; NET_HDR_LEN];
        hdr[10] = 1; // num_buffers
        assert_eq!(got[..NET_HDR_LEN], hdr, "header of frame {n}");
        assert_eq!(got[NET_HDR_LEN..], frames[usize::from(n)][NET_HDR_LEN..]);
    }
    // The third is held until the driver posts a buffer; its kick delivers it.
    assert_eq!(r.dev.with_device(|n| n.stats()).rx_frames, 2);
    r.post_rx(2);
    r.kick(0);
    assert_eq!(r.used_idx(0), 3);
    assert_eq!(r.rx_frame(2)[NET_HDR_LEN..], frames[2][NET_HDR_LEN..]);
    let stats = r.dev.with_device(|n| n.stats());
    assert_eq!((stats.rx_frames, stats.rx_dropped), (3, 0));
}

/// Queues frames in the fake backend, as a tap would receive them.
fn push_frames(r: &NetRig<FakeBackend>, frames: Vec<Vec<u8>>) {
    r.dev
        .with_device_mut(|n| n.backend_mut().incoming.extend(frames));
}

#[test]
fn malformed_chains_drop_their_frame_and_the_device_carries_on() {
    let mut r = net_rig(FakeBackend::default());
    r.start(FEATURES);
    let frame = with_hdr(&ether(ETH_TEST, &[9; 200]));
    push_frames(&r, vec![frame.clone(); 5]);
    // Receive: a device-readable buffer, a buffer too small, a buffer in the hole between the
    // RAM ranges, a buffer past the end of RAM, then a good one split in two.
    r.post(0, &[(RX_BUFS, RX_BUF_LEN, false)]);
    r.post(0, &[(RX_BUFS, 100, true)]);
    r.post(0, &[(HOLE + 0x100, RX_BUF_LEN, true)]);
    r.post(0, &[(u64::MAX - 16, RX_BUF_LEN, true)]);
    r.post(
        0,
        &[
            (RX_BUFS, NET_HDR_LEN as u32, true),
            (RX_BUFS + 0x100, 1000, true),
        ],
    );
    r.kick(0);
    assert_eq!(r.used_idx(0), 5);
    for n in 0..4 {
        assert_eq!(
            r.used(0, n).1,
            0,
            "malformed receive chain {n} reports no bytes"
        );
    }
    assert_eq!(r.used(0, 4).1, frame.len() as u32);
    assert_eq!(
        r.read_guest(RX_BUFS + 0x100, frame.len() - NET_HDR_LEN),
        frame[NET_HDR_LEN..]
    );
    let s = r.dev.with_device(|n| n.stats());
    assert_eq!((s.rx_frames, s.rx_dropped), (1, 4));

    // Transmit: a device-writable buffer, a buffer outside RAM, a 1 MiB descriptor (larger
    // than any frame), a runt without a frame after its header, then a good frame.
    r.mem.write_slice(&frame, GuestAddress(TX_BUFS)).unwrap();
    r.post(1, &[(TX_BUFS, frame.len() as u32, true)]);
    r.post(1, &[(HOLE, frame.len() as u32, false)]);
    r.post(1, &[(0, 1 << 20, false)]);
    r.post(1, &[(TX_BUFS, NET_HDR_LEN as u32, false)]);
    r.post(1, &[(TX_BUFS, frame.len() as u32, false)]);
    r.kick(1);
    assert_eq!(r.used_idx(1), 5);
    let (sent, s) = r.dev.with_device(|n| (n.backend().sent.clone(), n.stats()));
    assert_eq!(sent, vec![frame]);
    assert_eq!((s.tx_frames, s.tx_dropped, s.malformed), (1, 4, 7));
    assert_eq!(r.r32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
}

#[test]
fn a_backend_that_goes_away_takes_the_link_down_with_a_config_interrupt() {
    let mut r = net_rig(FakeBackend::default());
    r.start(FEATURES);
    r.post_rx(0);
    r.w32(REG_INTERRUPT_ACK, 3);
    let generation = r.r32(REG_CONFIG_GENERATION);
    r.dev.with_device_mut(|n| n.backend_mut().gone = true);
    r.dev.notify_queue(RX_QUEUE as u32);
    assert_eq!(r.link_status(), 0, "link down");
    assert!(!r.dev.with_device(|n| n.link_up()));
    assert_ne!(r.r32(REG_INTERRUPT_STATUS) & INT_CONFIG, 0);
    assert_ne!(r.r32(REG_CONFIG_GENERATION), generation);
    assert_eq!(r.used_idx(0), 0, "receive buffers stay with the guest");
    // Transmit still completes (the frames are dropped); the device never needs a reset.
    r.post_tx(0, &with_hdr(&ether(ETH_TEST, &[1; 64])));
    r.kick(1);
    assert_eq!(r.used_idx(1), 1);
    assert_eq!(r.dev.with_device(|n| n.stats()).tx_dropped, 1);
    assert_eq!(r.r32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
    // The same when the transmit path is the first to notice.
    let mut r = net_rig(FakeBackend::default());
    r.start(FEATURES);
    r.dev.with_device_mut(|n| n.backend_mut().gone = true);
    r.post_tx(0, &with_hdr(&ether(ETH_TEST, &[1; 64])));
    r.kick(1);
    assert_eq!(r.link_status(), 0);
    assert_ne!(r.r32(REG_INTERRUPT_STATUS) & INT_CONFIG, 0);
}

/// A runt from the backend (no frame after the header) is dropped and ends that run of the
/// queue; the next run delivers what follows it.
#[test]
fn runts_from_the_backend_are_dropped() {
    let mut r = net_rig(FakeBackend::default());
    r.start(FEATURES);
    let good = with_hdr(&ether(ETH_TEST, &[3; 64]));
    push_frames(&r, vec![vec![0; NET_HDR_LEN], good.clone()]);
    r.post_rx(0);
    r.dev.notify_queue(RX_QUEUE as u32);
    assert_eq!(r.used_idx(0), 0);
    assert_eq!(r.dev.with_device(|n| n.stats()).rx_dropped, 1);
    r.dev.notify_queue(RX_QUEUE as u32);
    assert_eq!(r.used_idx(0), 1);
    assert_eq!(r.rx_frame(0)[NET_HDR_LEN..], good[NET_HDR_LEN..]);
}

/// A backend that is down (EIO, or a carrier reported off) is a link down the guest is told
/// about, and up again when frames pass or the carrier returns; the device never needs a
/// reset and the receive thread would go on.
#[test]
fn a_backend_that_is_down_takes_the_link_down_until_it_is_up() {
    let mut r = net_rig(FakeBackend {
        carrier: Some(false),
        ..FakeBackend::default()
    });
    assert_eq!(r.link_status(), 0, "a tap down at start: link down");
    r.start(FEATURES);
    r.dev.with_device_mut(|n| {
        n.backend_mut().carrier = Some(true);
        n.refresh_link();
    });
    r.w32(REG_INTERRUPT_ACK, 3);
    r.dev.notify_queue(RX_QUEUE as u32);
    assert_eq!(r.link_status(), 1);
    assert_ne!(r.r32(REG_INTERRUPT_STATUS) & INT_CONFIG, 0);
    // The host takes the tap down: the next transmission fails with EIO.
    r.dev.with_device_mut(|n| n.backend_mut().down = true);
    r.w32(REG_INTERRUPT_ACK, 3);
    let generation = r.r32(REG_CONFIG_GENERATION);
    let frame = with_hdr(&ether(ETH_TEST, &[5; 64]));
    r.post_tx(0, &frame);
    r.kick(1);
    assert_eq!(r.used_idx(1), 1);
    assert_eq!(r.link_status(), 0);
    assert_ne!(r.r32(REG_INTERRUPT_STATUS) & INT_CONFIG, 0);
    assert_ne!(r.r32(REG_CONFIG_GENERATION), generation);
    assert!(!r.dev.with_device(|n| n.gone()), "down, not gone");
    // Up again: the next frame passes and the link is back.
    r.dev.with_device_mut(|n| n.backend_mut().down = false);
    r.w32(REG_INTERRUPT_ACK, 3);
    r.post_tx(1, &frame);
    r.kick(1);
    assert_eq!(r.link_status(), 1);
    assert_ne!(r.r32(REG_INTERRUPT_STATUS) & INT_CONFIG, 0);
    let s = r.dev.with_device(|n| n.stats());
    assert_eq!((s.tx_frames, s.tx_dropped), (1, 1));
    assert_eq!(r.r32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
}

#[test]
fn a_reset_drops_the_held_frame() {
    let mut r = net_rig(FakeBackend::default());
    r.start(FEATURES);
    push_frames(&r, vec![with_hdr(&ether(ETH_TEST, &[1; 64]))]);
    r.dev.notify_queue(RX_QUEUE as u32);
    r.start(FEATURES);
    r.post_rx(0);
    r.kick(0);
    assert_eq!(r.used_idx(0), 0, "the frame from before the reset is gone");
}

// ---- a real tap, in a network namespace of its own ----

/// A network namespace for one test; dropping it deletes it (and any tap left in it).
struct NetNs {
    name: String,
}

static NS_SEQ: AtomicU32 = AtomicU32::new(0);

fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    assert_eq!(
        uid, 0,
        "this test creates a network namespace and a tap device: run it as root (CI does)"
    );
}

impl NetNs {
    fn new() -> Self {
        require_root();
        let name = format!(
            "farvm-net-{}-{}",
            std::process::id(),
            NS_SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let o = Command::new("ip")
            .args(["netns", "add", &name])
            .output()
            .expect("run `ip` (iproute2)");
        assert!(
            o.status.success(),
            "`ip netns add {name}` failed (this test needs iproute2 and network namespaces): {o:?}"
        );
        NetNs { name }
    }

    fn ip(&self, args: &[&str]) {
        let o = Command::new("ip")
            .arg("-n")
            .arg(&self.name)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "ip -n {} {args:?}: {o:?}", self.name);
    }

    /// Runs `f` on a thread that joined the namespace (taps and sockets it creates live
    /// there; their descriptors work from any thread afterwards).
    fn within<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        std::thread::scope(|s| {
            s.spawn(|| {
                let ns = std::fs::File::open(format!("/run/netns/{}", self.name)).unwrap();
                // SAFETY: setns(2) on a namespace file this closure holds open; it changes
                // only this (short-lived) thread's network namespace.
                let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                assert_eq!(rc, 0, "setns: {}", io::Error::last_os_error());
                // No IPv6 autoconfiguration chatter on the tap (the namespace's own sysctl;
                // absent when the host has no IPv6).
                let _ = std::fs::write("/proc/sys/net/ipv6/conf/default/disable_ipv6", "1");
                let _ = std::fs::write("/proc/sys/net/ipv6/conf/all/disable_ipv6", "1");
                f()
            })
            .join()
            .unwrap()
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

const TAP: &str = "fvtap0";

/// A packet socket on `TAP` for frames of type `ETH_TEST`: the host's side of the tap.
fn host_socket() -> OwnedFd {
    // SAFETY: socket(2) with constant arguments; the result is checked before use.
    let fd = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(ETH_TEST.to_be()),
        )
    };
    assert!(fd >= 0, "AF_PACKET socket: {}", io::Error::last_os_error());
    // SAFETY: `fd` was just returned by socket(2) and is owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(TAP).unwrap();
    // SAFETY: if_nametoindex reads a NUL-terminated string that lives for the call.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    assert_ne!(ifindex, 0, "no interface {TAP}");
    // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
    let mut sa: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sa.sll_family = libc::AF_PACKET as u16;
    sa.sll_protocol = ETH_TEST.to_be();
    sa.sll_ifindex = ifindex as i32;
    // SAFETY: bind(2) reads `sa`, a live sockaddr_ll whose size is passed.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as u32,
        )
    };
    assert_eq!(rc, 0, "bind: {}", io::Error::last_os_error());
    let tv = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };
    // SAFETY: setsockopt(2) reads a timeval that lives for the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as u32,
        )
    };
    assert_eq!(rc, 0);
    fd
}

fn host_send(sock: &OwnedFd, frame: &[u8]) {
    // SAFETY: send(2) reads `frame`, which lives for the call.
    let n = unsafe { libc::send(sock.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
    assert_eq!(
        n,
        frame.len() as isize,
        "send: {}",
        io::Error::last_os_error()
    );
}

fn host_recv(sock: &OwnedFd) -> Vec<u8> {
    let mut buf = vec![0u8; 2048];
    // SAFETY: recv(2) writes at most `buf.len()` bytes into `buf`, which lives for the call.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
    assert!(
        n >= 0,
        "no frame from the tap within 5 s: {}",
        io::Error::last_os_error()
    );
    buf.truncate(n as usize);
    buf
}

/// A device on tap `TAP` in a fresh namespace, the tap up, and the host's socket on it.
fn tap_rig() -> (NetNs, NetRig<Tap>, OwnedFd) {
    let ns = NetNs::new();
    let tap = ns.within(|| Tap::open(TAP)).expect("open the tap");
    assert_eq!(tap.name(), TAP);
    ns.ip(&["link", "set", TAP, "up"]);
    let sock = ns.within(host_socket);
    let mut r = net_rig(tap);
    r.start(FEATURES | VIRTIO_RING_F_EVENT_IDX);
    (ns, r, sock)
}

/// The receive thread for `r`, stopped (and joined) by writing the returned eventfd.
fn spawn_rx(
    r: &NetRig<Tap>,
) -> (
    Arc<EventFd>,
    std::sync::mpsc::Receiver<io::Result<()>>,
    std::thread::JoinHandle<()>,
) {
    let stop = Arc::new(EventFd::new(EFD_NONBLOCK).unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let dev = r.dev.clone();
    let s = stop.clone();
    let h = std::thread::spawn(move || {
        let _ = tx.send(run_rx(&dev, &s));
    });
    (stop, rx, h)
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_frame_the_guest_sends_comes_out_of_the_tap() {
    let (_ns, mut r, sock) = tap_rig();
    let frame = ether(
        ETH_TEST,
        b"guest to host through a real tap, padded to sixty bytes",
    );
    r.post_tx(0, &with_hdr(&frame));
    r.kick(1);
    assert_eq!(r.used_idx(1), 1);
    assert_eq!(host_recv(&sock), frame);
    assert_eq!(r.dev.with_device(|n| n.stats()).tx_frames, 1);
}

#[test]
fn a_frame_written_into_the_tap_lands_in_a_guest_buffer() {
    let (_ns, mut r, sock) = tap_rig();
    let (stop, done, h) = spawn_rx(&r);
    // A frame arrives before the guest posted any buffer: the device holds it (the thread
    // parks instead of spinning on the readable tap) and the driver's kick delivers it.
    let mut first = vec![0xff; 6];
    first.extend_from_slice(&[2, 0, 0, 0, 0, 1]);
    first.extend_from_slice(&ETH_TEST.to_be_bytes());
    first.extend_from_slice(&[0x11; 100]);
    host_send(&sock, &first);
    wait_for("the device to take the frame", || {
        r.dev.with_device(|n| n.rx_held())
    });
    let edges = r.edges.count();
    r.post_rx(0);
    r.kick(0);
    assert_eq!(r.used_idx(0), 1);
    let got = r.rx_frame(0);
    let mut hdr = [0u8; NET_HDR_LEN];
    hdr[10] = 1;
    assert_eq!(got[..NET_HDR_LEN], hdr);
    assert_eq!(got[NET_HDR_LEN..], first[..]);
    assert!(r.edges.count() > edges, "the guest was interrupted");
    // With buffers posted, the thread (woken by that delivery) takes frames as they come.
    for slot in 1..4 {
        r.post_rx(slot);
    }
    r.kick(0);
    let mut second = first.clone();
    second[14..].fill(0x22);
    host_send(&sock, &second);
    wait_for("the second frame", || r.used_idx(0) == 2);
    assert_eq!(r.rx_frame(1)[NET_HDR_LEN..], second[..]);
    stop.write(1).unwrap();
    h.join().unwrap();
    done.recv().unwrap().unwrap();
    let s = r.dev.with_device(|n| n.stats());
    assert_eq!((s.rx_frames, s.rx_dropped), (2, 0));
}

#[test]
fn deleting_the_tap_mid_run_gives_the_guest_a_link_down() {
    let (ns, mut r, sock) = tap_rig();
    for slot in 0..4 {
        r.post_rx(slot);
    }
    r.kick(0);
    let (_stop, done, h) = spawn_rx(&r);
    let frame = ether(ETH_TEST, &[0x33; 80]);
    r.post_tx(0, &with_hdr(&frame));
    r.kick(1);
    assert_eq!(host_recv(&sock), frame);
    r.w32(REG_INTERRUPT_ACK, 3);
    let generation = r.r32(REG_CONFIG_GENERATION);
    drop(sock);
    ns.ip(&["link", "del", TAP]);
    // The receive thread sees the tap fail, takes the link down and ends on its own.
    let result = done
        .recv_timeout(Duration::from_secs(5))
        .expect("the receive thread ends when the tap is gone");
    result.unwrap();
    h.join().unwrap();
    assert_eq!(r.link_status(), 0, "link down in config space");
    assert_ne!(
        r.r32(REG_INTERRUPT_STATUS) & INT_CONFIG,
        0,
        "config interrupt"
    );
    assert_ne!(r.r32(REG_CONFIG_GENERATION), generation);
    assert_eq!(r.r32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
    // The guest's transmissions still complete, dropped.
    r.post_tx(1, &with_hdr(&frame));
    r.kick(1);
    assert_eq!(r.used_idx(1), 2);
    assert_eq!(r.dev.with_device(|n| n.stats()).tx_dropped, 1);
}

/// The link follows the tap's state on the host: down before it is brought up, up within a
/// second of `ip link set up` (the receive thread looks), down at the first transmission after
/// `ip link set down`, and up again; the receive thread keeps running throughout.
#[test]
fn the_link_follows_the_tap_up_and_down() {
    let ns = NetNs::new();
    let tap = ns.within(|| Tap::open(TAP)).expect("open the tap");
    let mut r = net_rig(tap);
    assert_eq!(r.link_status(), 0, "a tap not yet up");
    r.start(FEATURES);
    let (stop, done, h) = spawn_rx(&r);
    ns.ip(&["link", "set", TAP, "up"]);
    wait_for("the link to come up", || r.link_status() == 1);
    assert_ne!(r.r32(REG_INTERRUPT_STATUS) & INT_CONFIG, 0);
    r.w32(REG_INTERRUPT_ACK, 3);
    ns.ip(&["link", "set", TAP, "down"]);
    r.post_tx(0, &with_hdr(&ether(ETH_TEST, &[6; 64])));
    r.kick(1);
    assert_eq!(r.link_status(), 0, "EIO from a tap that is down");
    assert_ne!(r.r32(REG_INTERRUPT_STATUS) & INT_CONFIG, 0);
    ns.ip(&["link", "set", TAP, "up"]);
    wait_for("the link to come back", || r.link_status() == 1);
    assert!(done.try_recv().is_err(), "the receive thread still runs");
    stop.write(1).unwrap();
    h.join().unwrap();
    done.recv().unwrap().unwrap();
}

#[test]
fn bad_tap_names_and_descriptors_are_refused_clearly() {
    assert!(matches!(Tap::open(""), Err(NetError::BadName { .. })));
    assert!(matches!(
        Tap::open("a-name-longer-than-15"),
        Err(NetError::BadName { .. })
    ));
    // A descriptor that is not a tap.
    let f = std::fs::File::open("/dev/null").unwrap();
    let e = Tap::from_fd(f.into()).unwrap_err();
    assert!(matches!(e, NetError::NotATap { .. }), "{e}");
    assert!(e.to_string().contains("not an attached tap"), "{e}");
}

#[test]
fn a_tap_handed_over_as_a_descriptor_works() {
    let ns = NetNs::new();
    let tap = ns.within(|| Tap::open(TAP)).unwrap();
    // What libvirt does: it opens the tap and passes the descriptor on.
    let fd: OwnedFd = tap_into_fd(tap);
    let tap = Tap::from_fd(fd).expect("a tap descriptor is accepted");
    assert_eq!(tap.name(), TAP);
    ns.ip(&["link", "set", TAP, "up"]);
    let sock = ns.within(host_socket);
    let mut r = net_rig(tap);
    r.start(FEATURES);
    let frame = ether(ETH_TEST, &[0x44; 64]);
    r.post_tx(0, &with_hdr(&frame));
    r.kick(1);
    assert_eq!(host_recv(&sock), frame);
}

/// The descriptor inside a `Tap` (a dup: the tap attachment belongs to the open file).
fn tap_into_fd(tap: Tap) -> OwnedFd {
    use farvm_devices::virtio::net::NetBackend;
    let raw = tap.poll_fd().unwrap();
    // SAFETY: dup(2) of a descriptor `tap` keeps open for the call.
    let dup = unsafe { libc::dup(raw) };
    assert!(dup >= 0);
    drop(tap);
    // SAFETY: `dup` was just returned by dup(2) and is owned by nothing else.
    unsafe { OwnedFd::from_raw_fd(dup) }
}
