//! Robustness of virtio-net against a hostile driver: garbage descriptor tables (direct and
//! indirect), avail rings and heads on both queues, with frames of every size arriving from the
//! backend and the backend vanishing, never panic and never touch memory outside guest RAM.
//!
//! "Outside guest RAM" is checked two ways. Guest RAM is two 64 KiB ranges with a hole between
//! them, each mapped between inaccessible guard pages, so a stray access just past a range
//! faults the test process. And after every case, every byte of guest RAM the device changed
//! must lie in a used ring or in a buffer some receive descriptor (direct or indirect) marked
//! device-writable: the device writes nowhere else, whatever the chains say.
//!
//! The test runs 100,000 cases (each a few kicks over up to 16 chains per queue). For the
//! 10⁶ executions of the bar, run
//! `FARVM_NET_FUZZ_CASES=1000000 cargo test --release -p farvm-devices --test net_fuzz`
//! (about ten times as long).

mod common;

use std::sync::Arc;

use common::net::*;
use common::*;
use farvm_devices::virtio::mmio::{STATUS_DRIVER_OK, STATUS_NEEDS_RESET};
use farvm_devices::virtio::net::RX_QUEUE;
use farvm_devices::virtio::{
    VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use proptest::prelude::*;
use vm_memory::mmap::MmapRegion;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap, GuestRegionMmap};

/// Guest RAM: [0, 64 KiB) and [128 KiB, 192 KiB).
const RANGES: [(u64, usize); 2] = [(0, 0x10000), (0x20000, 0x10000)];
/// Where indirect tables go (between the rings and the buffers).
const INDIRECT: u64 = 0x9000;
/// Buffers: the top of the first range (so some run into the hole) and the second range.
const BUF_A: u64 = 0xa000;
const BUF_B: u64 = 0x20000;
const PAGE: usize = 4096;
const F_MAC: u64 = 1 << 5;
const F_STATUS: u64 = 1 << 16;

/// Guest RAM mapped between guard pages, once per test thread (never unmapped: the test
/// process ends first).
fn guarded_memory() -> Mem {
    thread_local! {
        static MEM: Mem = {
            let regions = RANGES
                .iter()
                .map(|&(base, len)| {
                    // SAFETY: a fresh anonymous reservation of len + two guard pages, owned
                    // by nothing else; only its middle is made accessible.
                    let ptr = unsafe {
                        let p = libc::mmap(
                            std::ptr::null_mut(),
                            len + 2 * PAGE,
                            libc::PROT_NONE,
                            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                            -1,
                            0,
                        );
                        assert_ne!(p, libc::MAP_FAILED);
                        let mid = p.cast::<u8>().add(PAGE);
                        assert_eq!(
                            libc::mprotect(mid.cast(), len, libc::PROT_READ | libc::PROT_WRITE),
                            0
                        );
                        mid
                    };
                    // SAFETY: `ptr` is a live read-write mapping of `len` bytes that stays
                    // mapped for the life of the process.
                    let region = unsafe {
                        MmapRegion::build_raw(
                            ptr,
                            len,
                            libc::PROT_READ | libc::PROT_WRITE,
                            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                        )
                    }
                    .unwrap();
                    GuestRegionMmap::new(region, GuestAddress(base)).unwrap()
                })
                .collect();
            Arc::new(GuestMemoryMmap::from_regions(regions).unwrap())
        };
    }
    MEM.with(|m| m.clone())
}

#[derive(Clone, Copy, Debug)]
struct Desc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

fn buf_addr() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => BUF_A..0x10100,
        4 => BUF_B - 0x100..BUF_B + 0x10100,
        1 => any::<u64>(),
        1 => Just(u64::MAX - 8),
    ]
}

fn desc(indirect_ok: bool) -> impl Strategy<Value = Desc> {
    let len = prop_oneof![
        4 => 0u32..2048,
        1 => proptest::sample::select(vec![0u32, 1, 11, 12, 13, 1514, 1526, 0x1_0000, 0x1_000c]),
        1 => any::<u32>(),
    ];
    let flags = prop_oneof![
        6 => proptest::sample::select(vec![0u16, 1, 2, 3]),
        1 => if indirect_ok { Just(4u16).boxed() } else { Just(2u16).boxed() },
        1 => any::<u16>(),
    ];
    let next = prop_oneof![8 => 0u16..16, 1 => any::<u16>()];
    (buf_addr(), len, flags, next).prop_map(|(addr, len, flags, next)| Desc {
        addr,
        len,
        flags,
        next,
    })
}

/// One queue's tables: 16 descriptors, an indirect table of 8, the heads published and the
/// avail index written (sometimes not the count published).
#[derive(Clone, Debug)]
struct QueueInput {
    table: Vec<Desc>,
    indirect: Vec<Desc>,
    /// The length descriptors flagged INDIRECT give their table.
    indirect_len: u32,
    heads: Vec<u16>,
    avail_idx: Option<u16>,
}

fn queue_input() -> impl Strategy<Value = QueueInput> {
    (
        proptest::collection::vec(desc(true), 16),
        proptest::collection::vec(desc(false), 8),
        prop_oneof![3 => proptest::sample::select(vec![16u32, 48, 128]), 1 => any::<u32>()],
        proptest::collection::vec(prop_oneof![8 => 0u16..16, 1 => any::<u16>()], 0..20),
        prop_oneof![4 => Just(None), 1 => any::<u16>().prop_map(Some)],
    )
        .prop_map(
            |(table, indirect, indirect_len, heads, avail_idx)| QueueInput {
                table,
                indirect,
                indirect_len,
                heads,
                avail_idx,
            },
        )
}

#[derive(Clone, Copy, Debug)]
enum Op {
    KickRx,
    KickTx,
    /// The receive thread's path: the backend turned readable.
    NotifyRx,
    /// The backend goes away.
    Gone,
    /// The backend goes down (EIO on writes) or up again.
    ToggleDown,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => Just(Op::KickRx),
        4 => Just(Op::KickTx),
        4 => Just(Op::NotifyRx),
        1 => Just(Op::Gone),
        1 => Just(Op::ToggleDown),
    ]
}

fn write_desc(mem: &Mem, table: u64, index: usize, d: &Desc) {
    write_desc_at(mem, table, index as u16, d.addr, d.len, d.flags, d.next);
}

/// Lays out one queue's input; indirect descriptors point at this queue's indirect table.
fn lay_out(mem: &Mem, q: &QueueInput, desc: u64, avail: u64, used: u64, indirect: u64) {
    for (i, d) in q.table.iter().enumerate() {
        let mut d = *d;
        // Every INDIRECT descriptor points at the queue's indirect table (with any length),
        // so the writable buffers a case describes are all known before it runs.
        if d.flags & 4 != 0 {
            d.addr = indirect;
            d.len = q.indirect_len;
        }
        write_desc(mem, desc, i, &d);
    }
    for (i, d) in q.indirect.iter().enumerate() {
        write_desc(mem, indirect, i, d);
    }
    for (i, h) in q.heads.iter().enumerate() {
        mem.write_obj(*h, GuestAddress(avail + 4 + 2 * (i as u64 % 16)))
            .unwrap();
    }
    let idx = q.avail_idx.unwrap_or(q.heads.len() as u16);
    mem.write_obj(0u16, GuestAddress(avail)).unwrap();
    mem.write_obj(idx, GuestAddress(avail + 2)).unwrap();
    // used_event (after the ring) somewhere plausible.
    mem.write_obj(0u16, GuestAddress(avail + 4 + 2 * 16))
        .unwrap();
    // A clean used ring: flags, idx, ring, avail_event.
    mem.write_slice(&[0u8; 4 + 8 * 16 + 2], GuestAddress(used))
        .unwrap();
}

/// The byte ranges the device may write: both used rings and every buffer a receive
/// descriptor (from the table or the indirect table as laid out) marks device-writable.
fn allowed_writes(mem: &Mem) -> Vec<(u64, u64)> {
    let mut ok = vec![
        (RX_USED, RX_USED + 4 + 8 * 16 + 2),
        (TX_USED, TX_USED + 4 + 8 * 16 + 2),
    ];
    let read_desc = |at: u64| -> (u64, u32, u16) {
        (
            mem.read_obj(GuestAddress(at)).unwrap(),
            mem.read_obj(GuestAddress(at + 8)).unwrap(),
            mem.read_obj(GuestAddress(at + 12)).unwrap(),
        )
    };
    let mut tables = vec![(RX_DESC, 16u64), (INDIRECT, 8)];
    // Descriptors in the receive indirect table written by the case.
    for (base, n) in tables.drain(..) {
        for i in 0..n {
            let (addr, len, flags) = read_desc(base + 16 * i);
            if flags & 2 != 0 {
                ok.push((addr, addr.saturating_add(u64::from(len))));
            }
        }
    }
    ok
}

fn snapshot(mem: &Mem) -> Vec<Vec<u8>> {
    RANGES
        .iter()
        .map(|&(base, len)| {
            let mut v = vec![0u8; len];
            mem.read_slice(&mut v, GuestAddress(base)).unwrap();
            v
        })
        .collect()
}

fn cases() -> u32 {
    std::env::var("FARVM_NET_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn garbage_descriptors_on_both_queues_never_panic_nor_write_outside_their_buffers(
        features in proptest::sample::select(vec![
            VIRTIO_F_VERSION_1 | F_MAC | F_STATUS,
            VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX,
            VIRTIO_F_VERSION_1 | VIRTIO_RING_F_INDIRECT_DESC | VIRTIO_RING_F_EVENT_IDX | F_MAC,
        ]),
        rx in queue_input(),
        tx in queue_input(),
        frames in proptest::collection::vec(
            prop_oneof![
                4 => 0usize..1600,
                1 => proptest::sample::select(vec![0usize, 11, 12, 13, 65_562, 70_000]),
            ],
            0..20,
        ),
        ops in proptest::collection::vec(op(), 1..6),
    ) {
        let mem = guarded_memory();
        let backend = FakeBackend {
            incoming: frames.iter().map(|&n| vec![0x5a; n]).collect(),
            ..FakeBackend::default()
        };
        let mut r = net_rig_in(backend, mem.clone());
        r.start(features);
        lay_out(&mem, &rx, RX_DESC, RX_AVAIL, RX_USED, INDIRECT);
        // The transmit queue's indirect table shares nothing with the receive one.
        lay_out(&mem, &tx, TX_DESC, TX_AVAIL, TX_USED, INDIRECT + 0x800);
        let before = snapshot(&mem);
        let allowed = allowed_writes(&mem);
        for op in &ops {
            match op {
                Op::KickRx => r.kick(0),
                Op::KickTx => r.kick(1),
                Op::NotifyRx => r.dev.notify_queue(RX_QUEUE as u32),
                Op::Gone => r.dev.with_device_mut(|n| n.backend_mut().gone = true),
                Op::ToggleDown => r.dev.with_device_mut(|n| {
                    let b = n.backend_mut();
                    b.down = !b.down;
                }),
            }
        }
        let after = snapshot(&mem);
        for (((base, _), b), a) in RANGES.iter().zip(&before).zip(&after) {
            for (i, (x, y)) in b.iter().zip(a).enumerate() {
                if x != y {
                    let gpa = base + i as u64;
                    prop_assert!(
                        allowed.iter().any(|&(s, e)| (s..e).contains(&gpa)),
                        "the device wrote {gpa:#x}, outside every writable buffer and used ring"
                    );
                }
            }
        }
        // Healthy queues complete every published chain they took; a broken one sets
        // NEEDS_RESET. Either way the device answers and a reset brings it back.
        let status = r.r32(REG_STATUS);
        prop_assert!(status & STATUS_NEEDS_RESET != 0 || status & STATUS_DRIVER_OK != 0);
        prop_assert_eq!(r.r32(REG_MAGIC), 0x7472_6976);
        r.w32(REG_STATUS, 0);
        prop_assert_eq!(r.r32(REG_STATUS), 0);
    }
}
