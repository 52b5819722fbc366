//! The ACPI tables, written into guest memory and parsed back the way a kernel finds them:
//! RSDP → XSDT → FADT → DSDT, and the MADT; checksums, lengths, the fields Linux reads.

use farvm_devices::acpi::{
    build_acpi_tables, write_acpi_tables, AcpiConfig, AcpiError, AcpiPlacement, InterruptOverride,
};
use farvm_devices::layout::{MmioDeviceInfo, ACPI_RSDP_ADDR};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

fn mem() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 2 << 20)]).unwrap()
}

fn sum(bytes: &[u8]) -> u8 {
    bytes.iter().fold(0u8, |a, b| a.wrapping_add(*b))
}

fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(b[off..off + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

/// Reads the table at `addr`: its header says how long it is; the checksum must be zero.
fn table(mem: &GuestMemoryMmap, addr: u64, signature: &[u8; 4]) -> Vec<u8> {
    let mut hdr = [0u8; 36];
    mem.read_slice(&mut hdr, GuestAddress(addr)).unwrap();
    assert_eq!(&hdr[0..4], signature, "signature at {addr:#x}");
    let len = u32_at(&hdr, 4) as usize;
    assert!(len >= 36);
    let mut t = vec![0u8; len];
    mem.read_slice(&mut t, GuestAddress(addr)).unwrap();
    assert_eq!(
        sum(&t),
        0,
        "{} checksum",
        String::from_utf8_lossy(signature)
    );
    assert_eq!(&t[10..16], b"FARVM ", "OEM ID");
    t
}

/// A Generic Address Structure for an 8-bit system-I/O register at `port`.
fn io_gas(port: u16) -> [u8; 12] {
    let mut g = [1u8, 8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    g[4..6].copy_from_slice(&port.to_le_bytes());
    g
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

struct Parsed {
    fadt: Vec<u8>,
    dsdt: Vec<u8>,
    madt: Vec<u8>,
}

/// Follows RSDP → XSDT → FADT/MADT, FADT → DSDT.
fn parse(mem: &GuestMemoryMmap, rsdp_addr: u64) -> Parsed {
    let mut rsdp = [0u8; 36];
    mem.read_slice(&mut rsdp, GuestAddress(rsdp_addr)).unwrap();
    assert_eq!(&rsdp[0..8], b"RSD PTR ");
    assert_eq!(sum(&rsdp[..20]), 0, "RSDP checksum (ACPI 1.0 part)");
    assert_eq!(sum(&rsdp), 0, "RSDP extended checksum");
    assert_eq!(rsdp[15], 2, "revision 2: XSDT");
    assert_eq!(u32_at(&rsdp, 20), 36);
    let xsdt = table(mem, u64_at(&rsdp, 24), b"XSDT");
    let entries: Vec<u64> = (36..xsdt.len())
        .step_by(8)
        .map(|o| u64_at(&xsdt, o))
        .collect();
    assert_eq!(entries.len(), 2);
    let fadt = table(mem, entries[0], b"FACP");
    let madt = table(mem, entries[1], b"APIC");
    assert_eq!(u32_at(&fadt, 40), 0, "32-bit DSDT pointer unused");
    let dsdt = table(mem, u64_at(&fadt, 140), b"DSDT");
    Parsed { fadt, dsdt, madt }
}

#[test]
fn tables_chain_from_the_rsdp_with_valid_checksums() {
    let m = mem();
    let mut cfg = AcpiConfig::new(4);
    cfg.virtio_mmio = vec![
        MmioDeviceInfo::slot(0).unwrap(),
        MmioDeviceInfo::slot(1).unwrap(),
    ];
    let placed = write_acpi_tables(&m, &AcpiPlacement::default(), &cfg).unwrap();
    assert_eq!(placed.rsdp_addr, ACPI_RSDP_ADDR);
    let p = parse(&m, placed.rsdp_addr);

    // FADT: ACPI 6.5, hardware-reduced, reset register supported, no fixed buttons.
    assert_eq!(p.fadt.len(), 276);
    assert_eq!((p.fadt[8], p.fadt[131]), (6, 5), "FADT revision 6.5");
    let flags = u32_at(&p.fadt, 112);
    for bit in [20, 10, 4, 5] {
        assert_ne!(flags & 1 << bit, 0, "FADT flag bit {bit}");
    }
    let iapc = u16_at(&p.fadt, 109);
    assert_eq!(iapc & 0b10, 0, "no 8042");
    assert_ne!(iapc & 1 << 2, 0, "no VGA");
    assert_ne!(iapc & 1 << 5, 0, "no CMOS RTC");
    assert_eq!(p.fadt[116..128], io_gas(0x602), "RESET_REG");
    assert_eq!(p.fadt[128], 1, "RESET_VALUE");
    assert_eq!(p.fadt[244..256], io_gas(0x600), "SLEEP_CONTROL_REG");
    assert_eq!(p.fadt[256..268], io_gas(0x601), "SLEEP_STATUS_REG");
    assert_eq!(&p.fadt[268..276], b"FARVM\0\0\0");
    assert!(
        p.fadt[148..244].iter().all(|&b| b == 0),
        "no legacy PM blocks"
    );

    // MADT: LAPIC address, PCAT_COMPAT, then the entries.
    assert_eq!(u32_at(&p.madt, 36), 0xfee0_0000);
    assert_eq!(u32_at(&p.madt, 40), 1);
    let mut lapics = Vec::new();
    let mut ioapics = Vec::new();
    let mut nmis = 0;
    let mut off = 44;
    while off < p.madt.len() {
        let (ty, len) = (p.madt[off], p.madt[off + 1] as usize);
        assert!(
            len >= 2 && off + len <= p.madt.len(),
            "entry at {off} overruns the MADT"
        );
        let e = &p.madt[off..off + len];
        match ty {
            0 => {
                assert_eq!(len, 8);
                lapics.push((e[2], e[3], u32_at(e, 4)));
            }
            1 => {
                assert_eq!(len, 12);
                ioapics.push((e[2], u32_at(e, 4), u32_at(e, 8)));
            }
            4 => {
                assert_eq!(e, [4, 6, 0xff, 0, 0, 1]);
                nmis += 1;
            }
            other => panic!("unexpected MADT entry type {other}"),
        }
        off += len;
    }
    assert_eq!(off, p.madt.len());
    assert_eq!(lapics, (0..4).map(|i| (i, i, 1)).collect::<Vec<_>>());
    assert_eq!(ioapics, vec![(0, 0xfec0_0000, 0)]);
    assert_eq!(nmis, 1);

    // DSDT: _S5_ = {5, 5}, COM1 and the virtio devices with their resources.
    assert_eq!(p.dsdt[8], 2, "DSDT revision 2: 64-bit integers");
    let aml = &p.dsdt[36..];
    assert!(
        contains(aml, b"_S5_\x12\x06\x02\x0a\x05\x0a\x05"),
        "Name(_S5_, Package(2){{5, 5}})"
    );
    assert!(contains(aml, b"COM1"));
    assert!(contains(aml, &[0x41, 0xd0, 0x05, 0x01]), "EisaId(PNP0501)");
    assert!(
        contains(aml, &[0x47, 1, 0xf8, 3, 0xf8, 3, 1, 8]),
        "IO(Decode16, 0x3F8, 0x3F8, 1, 8)"
    );
    assert!(
        contains(aml, &[0x89, 6, 0, 3, 1, 4, 0, 0, 0]),
        "Interrupt(Edge, ActiveHigh) {{4}}"
    );
    assert!(contains(aml, b"LNRO0005\0"));
    for (name, base, gsi) in [(b"V000", 0xd000_0000u32, 5u8), (b"V001", 0xd000_1000, 6)] {
        assert!(contains(aml, name));
        let mut mem32 = vec![0x86, 9, 0, 1];
        mem32.extend_from_slice(&base.to_le_bytes());
        mem32.extend_from_slice(&0x1000u32.to_le_bytes());
        assert!(contains(aml, &mem32), "Memory32Fixed for {base:#x}");
        assert!(
            contains(aml, &[0x89, 6, 0, 3, 1, gsi, 0, 0, 0]),
            "Interrupt {{{gsi}}}"
        );
    }

    // The reserved ranges cover every table, and no table overlaps another.
    let mut spans: Vec<(u64, u64)> = placed
        .tables
        .iter()
        .map(|t| (t.addr, t.addr + t.bytes.len() as u64))
        .collect();
    for &(a, e) in &spans {
        assert!(placed
            .reserved
            .iter()
            .any(|&(ra, rl)| ra <= a && e <= ra + rl));
    }
    spans.sort_unstable();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
}

#[test]
fn interrupt_overrides_are_listed() {
    let m = mem();
    let mut cfg = AcpiConfig::new(1);
    cfg.serial = None;
    cfg.interrupt_overrides = vec![InterruptOverride {
        source: 0,
        gsi: 2,
        flags: 0,
    }];
    let placed = write_acpi_tables(&m, &AcpiPlacement::default(), &cfg).unwrap();
    let p = parse(&m, placed.rsdp_addr);
    assert!(contains(&p.madt[44..], &[2, 10, 0, 0, 2, 0, 0, 0, 0, 0]));
    assert!(!contains(&p.dsdt, b"COM1"));
}

#[test]
fn largest_machine_fits_the_bios_area() {
    let mut cfg = AcpiConfig::new(255);
    cfg.virtio_mmio = (0..19).map(|i| MmioDeviceInfo::slot(i).unwrap()).collect();
    let t = build_acpi_tables(&AcpiPlacement::default(), &cfg).unwrap();
    assert_eq!(
        t.reserved.len(),
        1,
        "RSDP and tables are one contiguous range"
    );
    let (a, l) = t.reserved[0];
    assert!(a >= 0xe0000 && a + l <= 0x100000);
}

#[test]
fn bad_configurations_are_refused() {
    let p = AcpiPlacement::default();
    for vcpus in [0, 256] {
        assert_eq!(
            build_acpi_tables(&p, &AcpiConfig::new(vcpus)),
            Err(AcpiError::VcpuCount { vcpus })
        );
    }
    let small = AcpiPlacement {
        tables_end: p.tables + 200,
        ..p
    };
    assert!(matches!(
        build_acpi_tables(&small, &AcpiConfig::new(1)),
        Err(AcpiError::DoesNotFit { .. })
    ));
    let misaligned = AcpiPlacement {
        rsdp: p.rsdp + 4,
        ..p
    };
    assert!(matches!(
        build_acpi_tables(&misaligned, &AcpiConfig::new(1)),
        Err(AcpiError::RsdpAlignment(_))
    ));
    let overlapping = AcpiPlacement {
        rsdp: p.tables + 0x40,
        ..p
    };
    assert!(matches!(
        build_acpi_tables(&overlapping, &AcpiConfig::new(1)),
        Err(AcpiError::RsdpOverlap { .. })
    ));
    let mut cfg = AcpiConfig::new(1);
    cfg.virtio_mmio = vec![MmioDeviceInfo {
        base: 0xd000_0000,
        size: 0x1000,
        gsi: 24,
    }];
    assert_eq!(build_acpi_tables(&p, &cfg), Err(AcpiError::Gsi { gsi: 24 }));
    cfg.virtio_mmio[0] = MmioDeviceInfo {
        base: 0xffff_f800,
        size: 0x1000,
        gsi: 5,
    };
    assert!(matches!(
        build_acpi_tables(&p, &cfg),
        Err(AcpiError::MmioAbove4G { .. })
    ));
    cfg.virtio_mmio[0].base = 0xffff_f000;
    assert!(
        build_acpi_tables(&p, &cfg).is_ok(),
        "a window ending exactly at 4 GiB fits"
    );

    // Guest memory without the BIOS area.
    let tiny = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x1000)]).unwrap();
    let err = write_acpi_tables(&tiny, &p, &AcpiConfig::new(1)).unwrap_err();
    assert!(matches!(err, AcpiError::GuestMemory { .. }), "{err}");
}
