//! virtio-blk over virtio-mmio, driven through the register interface as a guest driver would:
//! transport semantics, feature negotiation, queue setup, requests, and malformed input.

mod common;

use std::io::{Read, Seek, SeekFrom, Write};

use common::*;
use farvm_devices::virtio::block::{Block, BlockConfig, BlockError, QUEUE_SIZE, SEG_MAX};
use farvm_devices::virtio::mmio::*;
use farvm_devices::virtio::{
    VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use vm_memory::{Bytes, GuestAddress};

const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;
const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
const S_UNSUPP: u8 = 2;
const F_RO: u64 = 1 << 5;
const F_FLUSH: u64 = 1 << 9;

const HDR: u64 = DATA;
const BUF: u64 = DATA + 0x1000;
const STATUS: u64 = DATA + 0x100;

#[test]
fn identification_registers_and_config_space() {
    let r = rig_with(8, false);
    assert_eq!(r.r32(REG_MAGIC), 0x7472_6976);
    assert_eq!(r.r32(REG_VERSION), 2);
    assert_eq!(r.r32(REG_DEVICE_ID), 2);
    let f = r.device_features();
    assert_ne!(f & VIRTIO_F_VERSION_1, 0);
    assert_ne!(f & F_FLUSH, 0);
    assert_eq!(f & F_RO, 0);
    assert_ne!(f & VIRTIO_RING_F_EVENT_IDX, 0);
    assert_ne!(f & VIRTIO_RING_F_INDIRECT_DESC, 0);
    // Capacity in sectors, as two 32-bit reads and as one 64-bit read.
    assert_eq!(r.r32(REG_CONFIG), 8);
    assert_eq!(r.r32(REG_CONFIG + 4), 0);
    let mut cap = [0u8; 8];
    r.dev.read(REG_CONFIG, &mut cap);
    assert_eq!(u64::from_le_bytes(cap), 8);
    assert_eq!(r.r32(REG_CONFIG + 12), SEG_MAX);
    assert_eq!(r.r32(REG_CONFIG + 20), 512);
    // Past the end of config space: zeros.
    assert_eq!(r.r32(REG_CONFIG + 0x200), 0);
    r.w32(REG_QUEUE_SEL, 0);
    assert_eq!(r.r32(REG_QUEUE_NUM_MAX), u32::from(QUEUE_SIZE));
    r.w32(REG_QUEUE_SEL, 1);
    assert_eq!(r.r32(REG_QUEUE_NUM_MAX), 0, "there is one queue");
    assert_eq!(r.r32(REG_CONFIG_GENERATION), 0);

    let ro = rig_with(8, true);
    assert_ne!(ro.device_features() & F_RO, 0);
}

#[test]
fn registers_answer_only_aligned_32_bit_accesses() {
    let r = rig_with(8, false);
    let mut b2 = [0xffu8; 2];
    r.dev.read(REG_MAGIC, &mut b2);
    assert_eq!(b2, [0, 0]);
    let mut b4 = [0xffu8; 4];
    r.dev.read(REG_MAGIC + 1, &mut b4);
    assert_eq!(b4, [0; 4]);
    r.dev.write(REG_STATUS, &[1]);
    assert_eq!(r.r32(REG_STATUS), 0, "a byte write to Status is ignored");
}

#[test]
fn feature_negotiation_accepts_a_subset_with_version_1_only() {
    let r = rig_with(8, false);
    // Missing VERSION_1: FEATURES_OK does not stick.
    assert_eq!(r.negotiate(F_FLUSH) & STATUS_FEATURES_OK, 0);
    // A feature the device does not offer (bit 40).
    assert_eq!(
        r.negotiate(VIRTIO_F_VERSION_1 | 1 << 40) & STATUS_FEATURES_OK,
        0
    );
    // A proper subset.
    let s = r.negotiate(VIRTIO_F_VERSION_1 | F_FLUSH);
    assert_ne!(s & STATUS_FEATURES_OK, 0);
    assert_eq!(r.dev.acked_features(), VIRTIO_F_VERSION_1 | F_FLUSH);
    // After FEATURES_OK, feature writes are ignored.
    r.write_driver_features(VIRTIO_F_VERSION_1);
    assert_eq!(r.dev.acked_features(), VIRTIO_F_VERSION_1 | F_FLUSH);
}

#[test]
fn driver_features_need_the_driver_bit_first() {
    let r = rig_with(8, false);
    r.w32(REG_STATUS, STATUS_ACKNOWLEDGE);
    r.write_driver_features(VIRTIO_F_VERSION_1);
    assert_eq!(r.dev.acked_features(), 0);
}

#[test]
fn status_bits_only_accumulate_and_driver_ok_needs_features_ok() {
    let r = rig_with(8, false);
    r.w32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
    r.w32(
        REG_STATUS,
        STATUS_ACKNOWLEDGE | STATUS_DRIVER | STATUS_DRIVER_OK,
    );
    assert_eq!(r.r32(REG_STATUS), STATUS_ACKNOWLEDGE | STATUS_DRIVER);
    // Clearing a bit without a reset is ignored.
    r.w32(REG_STATUS, STATUS_ACKNOWLEDGE);
    assert_eq!(r.r32(REG_STATUS), STATUS_ACKNOWLEDGE | STATUS_DRIVER);
    r.w32(REG_STATUS, 0);
    assert_eq!(r.r32(REG_STATUS), 0);
}

#[test]
fn queue_registers_are_writable_only_between_features_ok_and_driver_ok() {
    let mut r = rig_with(8, false);
    // Before FEATURES_OK: refused.
    r.w32(REG_STATUS, STATUS_ACKNOWLEDGE | STATUS_DRIVER);
    r.w32(REG_QUEUE_SEL, 0);
    r.w32(REG_QUEUE_DESC_LOW, 0x5000);
    assert_eq!(r.r32(REG_QUEUE_DESC_LOW), 0);
    r.w32(REG_QUEUE_READY, 1);
    assert_eq!(r.r32(REG_QUEUE_READY), 0);

    r.start_default();
    assert_eq!(r.r32(REG_QUEUE_DESC_LOW), DESC_TABLE as u32);
    assert_eq!(r.r32(REG_QUEUE_AVAIL_LOW), AVAIL_RING as u32);
    assert_eq!(r.r32(REG_QUEUE_USED_LOW), USED_RING as u32);
    assert_eq!(r.r32(REG_QUEUE_READY), 1);
    // After DRIVER_OK: addresses are frozen.
    r.w32(REG_QUEUE_DESC_LOW, 0x8000);
    assert_eq!(r.r32(REG_QUEUE_DESC_LOW), DESC_TABLE as u32);
    // Reset returns the queue to its defaults.
    r.w32(REG_STATUS, 0);
    assert_eq!(r.r32(REG_QUEUE_READY), 0);
    assert_eq!(r.dev.acked_features(), 0);
}

#[test]
fn invalid_queue_size_and_misaligned_rings_are_refused() {
    let r = rig_with(8, false);
    r.negotiate(VIRTIO_F_VERSION_1);
    r.w32(REG_QUEUE_SEL, 0);
    r.w32(REG_QUEUE_NUM, 16);
    r.w32(REG_QUEUE_NUM, 100); // not a power of two: keeps 16
    r.w32(REG_QUEUE_NUM, 1 << 20);
    r.w32(REG_QUEUE_DESC_LOW, 0x1008); // descriptor tables are 16-byte aligned
    assert_eq!(r.r32(REG_QUEUE_DESC_LOW), 0);
}

#[test]
fn rings_outside_guest_memory_make_the_device_need_reset() {
    let r = rig_with(8, false);
    r.negotiate(VIRTIO_F_VERSION_1);
    r.setup_queue_at(16, HOLE, AVAIL_RING, USED_RING);
    r.driver_ok();
    let s = r.r32(REG_STATUS);
    assert_ne!(s & STATUS_NEEDS_RESET, 0);
    assert_eq!(
        r.r32(REG_INTERRUPT_STATUS) & 2,
        2,
        "config-change interrupt"
    );
    assert_eq!(r.edges.count(), 1);
    // A notify on a broken device does nothing; a reset recovers.
    r.kick();
    r.w32(REG_STATUS, 0);
    assert_eq!(r.r32(REG_STATUS), 0);
}

#[test]
fn read_write_roundtrip_with_interrupts() {
    let mut r = rig_with(16, false);
    r.start(VIRTIO_F_VERSION_1 | F_FLUSH);

    // Read sectors 2..4.
    r.header(HDR, T_IN, 2);
    let (len, st) = r.submit(
        &[(HDR, 16, false), (BUF, 1024, true), (STATUS, 1, true)],
        STATUS,
    );
    assert_eq!((len, st), (1025, S_OK));
    let data = r.read_guest(BUF, 1024);
    assert!(data[..512].iter().all(|&b| b == 2) && data[512..].iter().all(|&b| b == 3));
    assert_eq!(r.edges.count(), 1);
    assert_eq!(r.r32(REG_INTERRUPT_STATUS), 1);
    r.w32(REG_INTERRUPT_ACK, 1);
    assert_eq!(r.r32(REG_INTERRUPT_STATUS), 0);

    // Write sector 5 from a buffer in the second RAM region, then flush.
    let src = (2 << 20) + 0x800;
    r.mem.write_slice(&[0xab; 512], GuestAddress(src)).unwrap();
    r.header(HDR, T_OUT, 5);
    let (len, st) = r.submit(
        &[(HDR, 16, false), (src, 512, false), (STATUS, 1, true)],
        STATUS,
    );
    assert_eq!((len, st), (1, S_OK));
    r.header(HDR, T_FLUSH, 0);
    assert_eq!(
        r.submit(&[(HDR, 16, false), (STATUS, 1, true)], STATUS),
        (1, S_OK)
    );

    let mut on_disk = vec![0u8; 512];
    let mut f = r.image.reopen().unwrap();
    f.seek(SeekFrom::Start(5 * 512)).unwrap();
    f.read_exact(&mut on_disk).unwrap();
    assert!(on_disk.iter().all(|&b| b == 0xab));
    let stats = r.dev.with_device(Block::stats);
    assert_eq!((stats.reads, stats.writes, stats.flushes), (1, 1, 1));
    assert_eq!(
        (stats.bytes_read, stats.bytes_written, stats.errors),
        (1024, 512, 0)
    );
}

#[test]
fn requests_framed_in_any_descriptor_layout() {
    let mut r = rig_with(16, false);
    r.start_default();
    // Header split over two descriptors; data and status byte in one writable buffer.
    r.header(HDR, T_IN, 7);
    let (len, st) = r.submit(
        &[(HDR, 5, false), (HDR + 5, 11, false), (BUF, 513, true)],
        BUF + 512,
    );
    assert_eq!((len, st), (513, S_OK));
    assert!(r.read_guest(BUF, 512).iter().all(|&b| b == 7));
    // Header and write data in one readable buffer.
    r.header(HDR, T_OUT, 1);
    r.mem
        .write_slice(&[0x11; 512], GuestAddress(HDR + 16))
        .unwrap();
    let status = BUF + 0x800;
    let (_, st) = r.submit(&[(HDR, 16 + 512, false), (status, 1, true)], status);
    assert_eq!(st, S_OK);
    r.header(HDR, T_IN, 1);
    r.submit(
        &[(HDR, 16, false), (BUF, 512, true), (STATUS, 1, true)],
        STATUS,
    );
    assert!(r.read_guest(BUF, 512).iter().all(|&b| b == 0x11));
}

#[test]
fn get_id_returns_the_serial() {
    let mut r = rig_with(8, false);
    r.start_default();
    r.header(HDR, T_GET_ID, 0);
    let (len, st) = r.submit(
        &[(HDR, 16, false), (BUF, 20, true), (STATUS, 1, true)],
        STATUS,
    );
    assert_eq!((len, st), (21, S_OK));
    let id = r.read_guest(BUF, 20);
    assert_eq!(&id[..15], b"farvm-test-disk");
    assert!(id[15..].iter().all(|&b| b == 0));
}

#[test]
fn bad_sectors_and_lengths_are_io_errors() {
    let mut r = rig_with(8, false);
    r.start_default();
    for (sector, len) in [
        (8u64, 512u32),
        (7, 1024),
        (u64::MAX / 512, 512),
        (u64::MAX, 512),
        (0, 100),
    ] {
        r.header(HDR, T_IN, sector);
        let (_, st) = r.submit(
            &[(HDR, 16, false), (BUF, len, true), (STATUS, 1, true)],
            STATUS,
        );
        assert_eq!(st, S_IOERR, "read of {len} bytes at sector {sector}");
        r.header(HDR, T_OUT, sector);
        let (_, st) = r.submit(
            &[(HDR, 16, false), (BUF, len, false), (STATUS, 1, true)],
            STATUS,
        );
        assert_eq!(st, S_IOERR, "write of {len} bytes at sector {sector}");
    }
    assert_eq!(r.dev.with_device(Block::stats).errors, 10);
}

#[test]
fn unknown_request_types_are_unsupported() {
    let mut r = rig_with(8, false);
    r.start_default();
    for t in [2u32, 11, 13, 0x8000_0000] {
        r.header(HDR, t, 0);
        let (_, st) = r.submit(
            &[(HDR, 16, false), (BUF, 512, true), (STATUS, 1, true)],
            STATUS,
        );
        assert_eq!(st, S_UNSUPP, "type {t}");
    }
}

#[test]
fn read_only_disks_refuse_writes() {
    let mut r = rig_with(8, true);
    r.start(VIRTIO_F_VERSION_1 | F_RO);
    r.header(HDR, T_OUT, 0);
    let (_, st) = r.submit(
        &[(HDR, 16, false), (BUF, 512, false), (STATUS, 1, true)],
        STATUS,
    );
    assert_eq!(st, S_IOERR);
    r.header(HDR, T_IN, 0);
    let (_, st) = r.submit(
        &[(HDR, 16, false), (BUF, 512, true), (STATUS, 1, true)],
        STATUS,
    );
    assert_eq!(st, S_OK);
    r.header(HDR, T_FLUSH, 0);
    assert_eq!(
        r.submit(&[(HDR, 16, false), (STATUS, 1, true)], STATUS).1,
        S_OK
    );
    let mut first = [0u8; 512];
    r.image.reopen().unwrap().read_exact(&mut first).unwrap();
    assert!(first.iter().all(|&b| b == 0), "image unchanged");
}

#[test]
fn buffers_outside_guest_memory_are_io_errors() {
    let mut r = rig_with(8, false);
    r.start_default();
    // Read data into the hole, into the end of RAM, and across the end of a region.
    for (addr, len) in [
        (HOLE, 512u32),
        ((3 << 20) - 256, 512),
        (u64::MAX - 100, 512),
    ] {
        r.header(HDR, T_IN, 0);
        let (_, st) = r.submit(
            &[(HDR, 16, false), (addr, len, true), (STATUS, 1, true)],
            STATUS,
        );
        assert_eq!(st, S_IOERR, "data at {addr:#x}");
    }
    // Header in the hole.
    let (_, st) = r.submit(
        &[(HOLE, 16, false), (BUF, 512, true), (STATUS, 1, true)],
        STATUS,
    );
    assert_eq!(st, S_IOERR);
    // Write data from beyond RAM.
    r.header(HDR, T_OUT, 0);
    let (_, st) = r.submit(
        &[(HDR, 16, false), (5 << 20, 512, false), (STATUS, 1, true)],
        STATUS,
    );
    assert_eq!(st, S_IOERR);
    // Status byte itself outside guest memory: completed with length 0.
    r.header(HDR, T_IN, 0);
    let head = r.add_chain(&[(HDR, 16, false), (BUF, 512, true), (HOLE + 7, 1, true)]);
    r.publish(head);
    r.kick();
    assert_eq!(r.used(r.used_idx() - 1), (u32::from(head), 0));
}

#[test]
fn malformed_chains_complete_without_a_panic() {
    let mut r = rig_with(8, false);
    r.start_default();
    // Readable after writable.
    r.header(HDR, T_IN, 0);
    let (_, st) = r.submit(
        &[
            (HDR, 16, false),
            (BUF, 512, true),
            (HDR, 16, false),
            (STATUS, 1, true),
        ],
        STATUS,
    );
    assert_eq!(st, S_IOERR);
    // Header too short.
    let (_, st) = r.submit(&[(HDR, 8, false), (STATUS, 1, true)], STATUS);
    assert_eq!(st, S_IOERR);
    // No device-writable buffer: nowhere to put a status.
    let (len, _) = r.submit(&[(HDR, 16, false), (BUF, 512, false)], STATUS);
    assert_eq!(len, 0);
    // Zero-length status buffer.
    let (len, _) = r.submit(&[(HDR, 16, false), (STATUS, 0, true)], STATUS);
    assert_eq!(len, 0);
    // A descriptor loop: 0 -> 1 -> 0 ... (the chain is cut at the queue size).
    let head = r.next_desc;
    r.header(HDR, T_IN, 0);
    r.write_desc(DESC_TABLE, head, HDR, 16, DESC_F_NEXT, head + 1);
    r.write_desc(
        DESC_TABLE,
        head + 1,
        BUF,
        512,
        DESC_F_NEXT | DESC_F_WRITE,
        head,
    );
    r.next_desc += 2;
    r.publish(head);
    r.kick();
    assert_eq!(r.r32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
    // `next` pointing past the table ends the chain.
    let head = r.next_desc;
    r.write_desc(DESC_TABLE, head, HDR, 16, DESC_F_NEXT, 999);
    r.next_desc += 1;
    r.publish(head);
    r.kick();
    assert_eq!(r.used_idx(), r.avail_idx, "every chain was completed");
}

#[test]
fn a_head_index_past_the_queue_breaks_the_device_cleanly() {
    let mut r = rig_with(8, false);
    r.start_default();
    r.publish(200);
    r.kick();
    assert_ne!(r.r32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
    // A later notify is ignored, and the driver can reset and start over.
    r.kick();
    r.start_default();
    r.avail_idx = 0;
    r.header(HDR, T_IN, 0);
    assert_eq!(
        r.submit(
            &[(HDR, 16, false), (BUF, 512, true), (STATUS, 1, true)],
            STATUS
        )
        .1,
        S_OK
    );
}

#[test]
fn an_avail_index_running_ahead_breaks_the_device_cleanly() {
    let mut r = rig_with(8, false);
    r.start_default();
    r.mem
        .write_obj(100u16, GuestAddress(AVAIL_RING + 2))
        .unwrap();
    r.kick();
    assert_ne!(r.r32(REG_STATUS) & STATUS_NEEDS_RESET, 0);
}

#[test]
fn indirect_descriptor_tables_are_followed() {
    let mut r = rig_with(8, false);
    r.start(VIRTIO_F_VERSION_1 | VIRTIO_RING_F_INDIRECT_DESC);
    let table = DATA + 0x8000;
    r.header(HDR, T_IN, 3);
    r.write_desc(table, 0, HDR, 16, DESC_F_NEXT, 1);
    r.write_desc(table, 1, BUF, 512, DESC_F_NEXT | DESC_F_WRITE, 2);
    r.write_desc(table, 2, STATUS, 1, DESC_F_WRITE, 0);
    let head = r.next_desc;
    r.write_desc(DESC_TABLE, head, table, 48, DESC_F_INDIRECT, 0);
    r.next_desc += 1;
    r.publish(head);
    r.kick();
    assert_eq!(r.used(0), (u32::from(head), 513));
    assert_eq!(r.read_guest(STATUS, 1), [S_OK]);
    assert!(r.read_guest(BUF, 512).iter().all(|&b| b == 3));
}

#[test]
fn event_idx_suppresses_interrupts_until_used_event() {
    let mut r = rig_with(8, false);
    r.start(VIRTIO_F_VERSION_1 | VIRTIO_RING_F_EVENT_IDX);
    // used_event (after the avail ring) = 1: interrupt only once the used index passes 1.
    let used_event = AVAIL_RING + 4 + 2 * u64::from(r.queue_size);
    r.mem.write_obj(1u16, GuestAddress(used_event)).unwrap();
    r.header(HDR, T_FLUSH, 0);
    r.submit(&[(HDR, 16, false), (STATUS, 1, true)], STATUS);
    assert_eq!(
        r.edges.count(),
        0,
        "used index 1 has not passed used_event 1"
    );
    r.submit(&[(HDR, 16, false), (STATUS, 1, true)], STATUS);
    assert_eq!(r.edges.count(), 1);
    // The device asks to be notified at the next avail index (avail_event).
    let avail_event = USED_RING + 4 + 8 * u64::from(r.queue_size);
    let ae: u16 = r.mem.read_obj(GuestAddress(avail_event)).unwrap();
    assert_eq!(ae, r.avail_idx);
}

#[test]
fn notify_queue_serves_like_a_queue_notify_write() {
    let mut r = rig_with(8, false);
    r.start_default();
    r.header(HDR, T_IN, 1);
    let head = r.add_chain(&[(HDR, 16, false), (BUF, 512, true), (STATUS, 1, true)]);
    r.publish(head);
    r.dev.notify_queue(0);
    r.dev.notify_queue(7); // no such queue
    assert_eq!(r.used_idx(), 1);
}

#[test]
fn opening_images() {
    let img = image(4);
    let cfg = BlockConfig {
        path: img.path().to_owned(),
        read_only: false,
        serial: None,
    };
    let first = Block::open(&cfg).unwrap();
    assert_eq!(first.capacity_sectors(), 4);
    // The image is locked while attached.
    let err = Block::open(&cfg).unwrap_err();
    assert!(matches!(err, BlockError::Locked { .. }), "{err}");
    let ro = BlockConfig {
        read_only: true,
        ..cfg.clone()
    };
    assert!(matches!(Block::open(&ro), Err(BlockError::Locked { .. })));
    drop(first);
    // Two read-only users may share it.
    let a = Block::open(&ro).unwrap();
    let b = Block::open(&ro).unwrap();
    assert!(a.read_only() && b.read_only());
    drop((a, b));

    // A tail shorter than a sector is not addressable.
    let mut odd = image(2);
    odd.write_all(&[1; 100]).unwrap();
    let d = Block::open(&BlockConfig {
        path: odd.path().to_owned(),
        read_only: true,
        serial: None,
    })
    .unwrap();
    assert_eq!(d.capacity_sectors(), 2);

    let tiny = tempfile::NamedTempFile::new().unwrap();
    let err = Block::open(&BlockConfig {
        path: tiny.path().to_owned(),
        read_only: true,
        serial: None,
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("smaller than one 512-byte sector"),
        "{err}"
    );

    // A qcow2 image (its header) is refused, not served as raw sectors.
    let qcow2 = tempfile::NamedTempFile::new().unwrap();
    let mut head = b"QFI\xfb\0\0\0\x03".to_vec();
    head.resize(4096, 0);
    std::fs::write(qcow2.path(), &head).unwrap();
    let err = Block::open(&BlockConfig {
        path: qcow2.path().to_owned(),
        read_only: true,
        serial: None,
    })
    .unwrap_err();
    assert!(
        matches!(
            err,
            BlockError::NotRaw {
                format: "qcow2",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("qemu-img convert -O raw"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let err = Block::open(&BlockConfig {
        path: dir.path().to_owned(),
        read_only: true,
        serial: None,
    })
    .unwrap_err();
    assert!(matches!(err, BlockError::NotADisk { .. }), "{err}");

    let err = Block::open(&BlockConfig {
        path: "/nonexistent/disk.img".into(),
        read_only: true,
        serial: None,
    })
    .unwrap_err();
    assert!(err.to_string().contains("/nonexistent/disk.img"), "{err}");

    let err = Block::open(&BlockConfig {
        serial: Some("x".repeat(21)),
        ..ro
    })
    .unwrap_err();
    assert!(matches!(err, BlockError::SerialTooLong { .. }));
}
