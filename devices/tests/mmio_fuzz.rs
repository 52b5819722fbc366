//! Robustness of the guest-facing register interfaces: random register traffic, and random
//! descriptor tables and rings behind a correctly started device, never panic, never touch
//! memory outside the guest's, and leave the device answering.

mod common;

use common::*;
use farvm_devices::bus::{DevicePio, PioAddress};
use farvm_devices::power::PowerDevice;
use farvm_devices::virtio::mmio::{STATUS_DRIVER_OK, STATUS_NEEDS_RESET};
use farvm_devices::virtio::{
    VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use proptest::prelude::*;
use vm_memory::{Bytes, GuestAddress};

/// Register offsets worth hitting often, plus anything else in the window.
fn offset() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => proptest::sample::select(vec![
            REG_MAGIC, REG_DEVICE_FEATURES, REG_DEVICE_FEATURES_SEL, REG_DRIVER_FEATURES,
            REG_DRIVER_FEATURES_SEL, REG_QUEUE_SEL, REG_QUEUE_NUM_MAX, REG_QUEUE_NUM,
            REG_QUEUE_READY, REG_QUEUE_NOTIFY, REG_INTERRUPT_STATUS, REG_INTERRUPT_ACK,
            REG_STATUS, REG_QUEUE_DESC_LOW, REG_QUEUE_DESC_HIGH, REG_QUEUE_AVAIL_LOW,
            REG_QUEUE_AVAIL_HIGH, REG_QUEUE_USED_LOW, REG_QUEUE_USED_HIGH,
            REG_CONFIG_GENERATION, REG_CONFIG,
        ]),
        1 => 0u64..0x1000,
        1 => any::<u64>(),
    ]
}

/// Values that make progress through the state machine, plus anything.
fn value() -> impl Strategy<Value = u32> {
    prop_oneof![
        2 => proptest::sample::select(vec![0u32, 1, 2, 3, 7, 11, 15, 16, 0x1000, 0x3000, 0x4000]),
        1 => any::<u32>(),
    ]
}

#[derive(Clone, Debug)]
enum Op {
    Read { off: u64, width: usize },
    Write { off: u64, width: usize, value: u32 },
}

fn op() -> impl Strategy<Value = Op> {
    let width = proptest::sample::select(vec![1usize, 2, 4, 4, 4, 8, 0, 3]);
    prop_oneof![
        (offset(), width.clone()).prop_map(|(off, width)| Op::Read { off, width }),
        (offset(), width, value()).prop_map(|(off, width, value)| Op::Write { off, width, value }),
    ]
}

fn apply(r: &Rig, op: &Op) {
    match *op {
        Op::Read { off, width } => {
            let mut b = vec![0u8; width];
            r.dev.read(off, &mut b);
        }
        Op::Write { off, width, value } => {
            let mut b = value.to_le_bytes().to_vec();
            b.resize(width, 0);
            r.dev.write(off, &b);
        }
    }
}

/// One request as a driver might build it, with the ways a buggy or hostile one gets it wrong.
#[derive(Clone, Debug)]
struct Request {
    req_type: u32,
    sector: u64,
    header_len: u32,
    header_writable: bool,
    data: Vec<(u64, u32, bool)>,
    status: (u64, u32, bool),
    /// Overwrite (descriptor index in the chain, flags, next) of one descriptor.
    corrupt: Option<(u16, u16, u16)>,
}

fn guest_addr() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => (DATA + 0x1000..DATA + 0x8000).prop_map(|a| a & !0x1ff),
        1 => HOLE - 0x400..HOLE + 0x400,
        1 => (3u64 << 20) - 0x400..(3u64 << 20) + 0x400,
        1 => any::<u64>(),
    ]
}

fn request() -> impl Strategy<Value = Request> {
    let req_type = prop_oneof![
        3 => proptest::sample::select(vec![0u32, 1, 4, 8]),
        1 => any::<u32>(),
    ];
    let sector = prop_oneof![4 => 0u64..10, 1 => any::<u64>()];
    let len = prop_oneof![
        4 => proptest::sample::select(vec![512u32, 1024, 2048]),
        1 => 0u32..0x1000,
        1 => any::<u32>(),
    ];
    let data = proptest::collection::vec(
        (
            guest_addr(),
            len,
            prop_oneof![3 => Just(None), 1 => any::<bool>().prop_map(Some)],
        ),
        0..4,
    );
    (
        req_type,
        sector,
        prop_oneof![5 => Just(16u32), 1 => 0u32..64],
        prop_oneof![9 => Just(false), 1 => Just(true)],
        data,
        (
            guest_addr(),
            prop_oneof![9 => Just(1u32), 1 => 0u32..4],
            prop_oneof![9 => Just(true), 1 => Just(false)],
        ),
        prop_oneof![4 => Just(None), 1 => any::<(u16, u16, u16)>().prop_map(Some)],
    )
        .prop_map(
            |(req_type, sector, header_len, header_writable, data, status, corrupt)| {
                // Data buffers are device-writable for reads and get-id, readable otherwise,
                // unless the strategy forces a direction.
                let natural = matches!(req_type, 0 | 8);
                let data = data
                    .into_iter()
                    .map(|(a, l, w)| (a, l, w.unwrap_or(natural)))
                    .collect();
                Request {
                    req_type,
                    sector,
                    header_len,
                    header_writable,
                    data,
                    status,
                    corrupt,
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_register_traffic_never_panics(
        ops in proptest::collection::vec(op(), 1..300),
        garbage in proptest::collection::vec(any::<u8>(), 0x5000),
        started in any::<bool>(),
    ) {
        let mut r = rig_with(8, false);
        // Half the runs begin from a device the driver brought up properly.
        if started {
            r.start_default();
        }
        // Whatever the rings turn out to be, they hold garbage.
        r.mem.write_slice(&garbage, GuestAddress(0)).unwrap();
        for op in &ops {
            apply(&r, op);
        }
        // The device still answers its identity.
        prop_assert_eq!(r.r32(REG_MAGIC), 0x7472_6976);
        r.w32(REG_STATUS, 0);
        prop_assert_eq!(r.r32(REG_STATUS), 0);
    }

    #[test]
    fn random_requests_behind_a_started_device_never_panic(
        features in proptest::sample::select(vec![
            VIRTIO_F_VERSION_1,
            VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX,
            VIRTIO_F_VERSION_1 | VIRTIO_RING_F_INDIRECT_DESC | VIRTIO_RING_F_EVENT_IDX,
        ]),
        requests in proptest::collection::vec(request(), 1..8),
        avail_idx in prop_oneof![4 => Just(None), 1 => any::<u16>().prop_map(Some)],
        kicks in 1usize..3,
    ) {
        let mut r = rig_with(8, false);
        r.start(features);
        let mut published = 0u16;
        for (i, req) in requests.iter().enumerate() {
            let hdr = DATA + 0x20 * i as u64;
            r.header(hdr, req.req_type, req.sector);
            let mut bufs = vec![(hdr, req.header_len, req.header_writable)];
            bufs.extend(req.data.iter().copied());
            bufs.push(req.status);
            if r.next_desc as usize + bufs.len() > usize::from(r.queue_size) {
                break;
            }
            let head = r.add_chain(&bufs);
            if let Some(&(at, flags, next)) = req.corrupt.as_ref() {
                let at = head + at % bufs.len() as u16;
                r.mem.write_obj(flags, GuestAddress(DESC_TABLE + 16 * u64::from(at) + 12)).unwrap();
                r.mem.write_obj(next, GuestAddress(DESC_TABLE + 16 * u64::from(at) + 14)).unwrap();
            }
            r.publish(head);
            published += 1;
        }
        if let Some(idx) = avail_idx {
            r.mem.write_obj(idx, GuestAddress(AVAIL_RING + 2)).unwrap();
        }
        for _ in 0..kicks {
            r.kick();
        }
        let status = r.r32(REG_STATUS);
        if avail_idx.is_none() {
            // Chains that the queue could hold: a healthy device completes every one.
            prop_assert_eq!(status & STATUS_NEEDS_RESET, 0);
            prop_assert_ne!(status & STATUS_DRIVER_OK, 0);
            prop_assert_eq!(r.used_idx(), published);
        }
        // Either way a reset brings the device back.
        r.w32(REG_STATUS, 0);
        prop_assert_eq!(r.r32(REG_STATUS), 0);
    }

    #[test]
    fn random_power_register_traffic_only_reports_real_requests(
        ops in proptest::collection::vec((0u16..8, proptest::collection::vec(any::<u8>(), 0..4)), 1..100),
    ) {
        let (dev, rx) = PowerDevice::with_channel();
        let mut expected = 0;
        for (off, data) in &ops {
            dev.pio_write(PioAddress(0x600), *off, data);
            let mut b = vec![0u8; data.len()];
            dev.pio_read(PioAddress(0x600), *off, &mut b);
            if let Some(&v) = data.first() {
                if (*off == 0 && v & 0x3c == 0x34) || (*off == 2 && v == 1) {
                    expected += 1;
                }
            }
        }
        prop_assert_eq!(rx.try_iter().count(), expected);
    }
}
