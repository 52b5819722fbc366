//! The ACPI tables as ACPICA's disassembler sees them: `iasl -d` must parse every table
//! without complaint, and recompiling the disassembled DSDT must give back the same AML.
//! Needs `iasl` (Debian's acpica-tools, installed by scripts/setup.sh).

use std::path::{Path, PathBuf};
use std::process::Command;

use farvm_devices::acpi::{build_acpi_tables, AcpiConfig, AcpiPlacement};
use farvm_devices::layout::{MmioDeviceInfo, AGENT_MMIO_BASE, AGENT_MMIO_SIZE};

fn iasl() -> PathBuf {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("iasl"))
            .find(|p| p.is_file())
    });
    found.unwrap_or_else(|| {
        panic!("iasl not found on PATH: install Debian's acpica-tools (scripts/setup.sh does)")
    })
}

fn run(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(iasl())
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running iasl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "iasl {args:?} failed:\n{text}");
    text
}

#[test]
fn iasl_disassembles_every_table_cleanly() {
    let mut cfg = AcpiConfig::new(2);
    cfg.virtio_mmio = vec![MmioDeviceInfo::slot(0).unwrap()];
    cfg.agent = Some((AGENT_MMIO_BASE, AGENT_MMIO_SIZE));
    let tables = build_acpi_tables(&AcpiPlacement::default(), &cfg).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for t in &tables.tables {
        let name = String::from_utf8_lossy(&t.signature).trim().to_lowercase();
        std::fs::write(dir.path().join(format!("{name}.dat")), &t.bytes).unwrap();
    }
    let mut dsl = std::collections::HashMap::new();
    for name in ["xsdt", "facp", "apic", "dsdt"] {
        let log = run(dir.path(), &["-d", &format!("{name}.dat")]);
        for bad in ["Warning", "Error", "Invalid", "****"] {
            assert!(
                !log.contains(bad),
                "iasl -d {name}.dat said {bad:?}:\n{log}"
            );
        }
        let text = std::fs::read_to_string(dir.path().join(format!("{name}.dsl"))).unwrap();
        for bad in ["Invalid", "****", "Unknown"] {
            assert!(!text.contains(bad), "{name}.dsl contains {bad:?}:\n{text}");
        }
        dsl.insert(name, text);
    }
    let has = |name: &str, what: &str| {
        assert!(
            dsl[name].contains(what),
            "{name}.dsl lacks {what:?}:\n{}",
            dsl[name]
        );
    };
    has("facp", "Hardware Reduced (V5) : 1");
    has("facp", "Reset Register Supported (V2) : 1");
    has("facp", "8042 Present on ports 60/64 (V2) : 0");
    has("facp", "Value to cause reset : 01");
    has("apic", "PC-AT Compatibility : 1");
    assert_eq!(dsl["apic"].matches("[Processor Local APIC]").count(), 2);
    has("apic", "[I/O APIC]");
    has("apic", "[Local APIC NMI]");
    has("dsdt", "Name (_S5, Package (0x02)");
    has("dsdt", "EisaId (\"PNP0501\")");
    has("dsdt", "Name (_HID, \"LNRO0005\")");
    has(
        "dsdt",
        "Interrupt (ResourceConsumer, Edge, ActiveHigh, Exclusive, ,, )",
    );
    has("dsdt", "Device (_SB.FARV)");
    has("dsdt", "Name (_HID, \"FARV0001\")");
    has(
        "dsdt",
        "Memory32Fixed (ReadWrite,\n                0xD0800000,         // Address Base\n                0x00001000,         // Address Length",
    );

    // Compiling the disassembly gives back the same AML body.
    std::fs::rename(dir.path().join("dsdt.dsl"), dir.path().join("again.dsl")).unwrap();
    run(dir.path(), &["again.dsl"]);
    let recompiled = std::fs::read(dir.path().join("again.aml")).unwrap();
    let ours = &tables
        .tables
        .iter()
        .find(|t| &t.signature == b"DSDT")
        .unwrap()
        .bytes;
    assert_eq!(
        recompiled[36..],
        ours[36..],
        "AML body differs after an iasl round trip"
    );
}
