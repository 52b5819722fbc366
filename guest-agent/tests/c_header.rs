//! The C header the Linux agent includes (`linux/farvm_agent_abi.h`) agrees with this crate:
//! a probe program compiled by the C compiler (`$CC`, else `cc`) against the header prints
//! every constant, struct size and field offset, and each must equal the Rust value.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use farvm_guest_agent::device::ring::{self, ProcEvent, RingHeader};
use farvm_guest_agent::device::{self, cmd, feature, reg, result, status};
use farvm_guest_agent::slot::{AgentSlot, SLOT_MAGIC};
use farvm_guest_agent::ABI_VERSION;

/// (C expression, the Rust value it must have).
fn expected() -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = Vec::new();
    let mut c = |name: &str, value: u64| v.push((name.to_string(), value));
    c("FARVM_SLOT_MAGIC", SLOT_MAGIC);
    c("FARVM_ABI_VERSION", ABI_VERSION.into());
    c("FARVM_WINDOW_SIZE", device::WINDOW_SIZE);
    c("FARVM_DEVICE_MAGIC", device::DEVICE_MAGIC.into());
    c("FARVM_AGENT_VERSION", device::AGENT_VERSION.into());
    c("FARVM_AGENT_VERSION_MIN", device::AGENT_VERSION_MIN.into());
    c("FARVM_SLOT_STRIDE", device::SLOT_STRIDE);
    c("FARVM_MAX_SLOTS", device::MAX_SLOTS.into());
    for (n, r) in [
        ("MAGIC", reg::MAGIC),
        ("VERSION_MAX", reg::VERSION_MAX),
        ("VERSION_MIN", reg::VERSION_MIN),
        ("NCPUS", reg::NCPUS),
        ("FEATURES", reg::FEATURES),
        ("VERSION", reg::VERSION),
        ("STATUS", reg::STATUS),
        ("RESULT", reg::RESULT),
        ("SLOTS_LO", reg::SLOTS_LO),
        ("SLOTS_HI", reg::SLOTS_HI),
        ("SLOTS_COUNT", reg::SLOTS_COUNT),
        ("RING_LO", reg::RING_LO),
        ("RING_HI", reg::RING_HI),
        ("RING_BYTES", reg::RING_BYTES),
        ("COMMAND", reg::COMMAND),
        ("DOORBELL", reg::DOORBELL),
        ("RING_TAKEN", reg::RING_TAKEN),
        ("RING_REFUSED", reg::RING_REFUSED),
    ] {
        c(&format!("FARVM_REG_{n}"), r);
    }
    for (n, x) in [
        ("REGISTER_SLOTS", cmd::REGISTER_SLOTS),
        ("UNREGISTER_SLOTS", cmd::UNREGISTER_SLOTS),
        ("REGISTER_RING", cmd::REGISTER_RING),
        ("UNREGISTER_RING", cmd::UNREGISTER_RING),
        ("RESET", cmd::RESET),
    ] {
        c(&format!("FARVM_CMD_{n}"), x.into());
    }
    for (n, x) in [
        ("OK", result::OK),
        ("BAD_VERSION", result::BAD_VERSION),
        ("NOT_NEGOTIATED", result::NOT_NEGOTIATED),
        ("BAD_ADDRESS", result::BAD_ADDRESS),
        ("BAD_COUNT", result::BAD_COUNT),
        ("UNKNOWN_COMMAND", result::UNKNOWN_COMMAND),
        ("BAD_RING", result::BAD_RING),
    ] {
        c(&format!("FARVM_RESULT_{n}"), x.into());
    }
    c("FARVM_STATUS_NEGOTIATED", status::NEGOTIATED.into());
    c("FARVM_STATUS_SLOTS", status::SLOTS.into());
    c("FARVM_STATUS_RING", status::RING.into());
    c("FARVM_FEATURE_SLOTS", feature::SLOTS.into());
    c("FARVM_FEATURE_PROCESS_RING", feature::PROCESS_RING.into());
    c("FARVM_RING_MAGIC", ring::RING_MAGIC);
    c("FARVM_RING_VERSION", ring::RING_VERSION.into());
    c("FARVM_RING_MAX_CAPACITY", ring::MAX_CAPACITY.into());
    c("FARVM_NAME_BYTES", ring::NAME_BYTES as u64);
    c("FARVM_EVENT_PRESENT", ring::kind::PRESENT.into());
    c("FARVM_EVENT_START", ring::kind::START.into());
    c("FARVM_EVENT_RENAME", ring::kind::RENAME.into());
    c("FARVM_EVENT_EXIT", ring::kind::EXIT.into());

    macro_rules! layout {
        ($c:literal, $t:ty, [$($f:ident),*]) => {{
            v.push((format!("sizeof(struct {})", $c), std::mem::size_of::<$t>() as u64));
            $(v.push((
                format!("offsetof(struct {}, {})", $c, stringify!($f)),
                std::mem::offset_of!($t, $f) as u64,
            ));)*
        }};
    }
    layout!(
        "farvm_agent_slot",
        AgentSlot,
        [magic, generation, cpu, version, pid, cr3, switches]
    );
    layout!(
        "farvm_ring_header",
        RingHeader,
        [magic, version, capacity, head, tail, dropped]
    );
    v.push((
        "offsetof(struct farvm_ring_header, reserved)".into(),
        std::mem::offset_of!(RingHeader, _reserved) as u64,
    ));
    layout!(
        "farvm_proc_event",
        ProcEvent,
        [kind, pid, ppid, uid, time_ns, name]
    );
    v.push((
        "sizeof(((struct farvm_proc_event *)0)->name)".into(),
        ring::NAME_BYTES as u64,
    ));
    v
}

#[test]
fn the_c_header_matches_the_rust_abi() {
    let header = Path::new(env!("CARGO_MANIFEST_DIR")).join("linux/farvm_agent_abi.h");
    let dir = std::env::temp_dir().join(format!("farvm-abi-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let want = expected();
    let mut src = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include \"{}\"\nint main(void) {{\n",
        header.display()
    );
    for (expr, _) in &want {
        src.push_str(&format!(
            "    printf(\"%s %llu\\n\", \"{}\", (unsigned long long)({expr}));\n",
            expr.replace('"', "\\\"")
        ));
    }
    src.push_str(
        "    printf(\"%s %s\\n\", \"FARVM_ACPI_HID\", FARVM_ACPI_HID);\n    return 0;\n}\n",
    );
    let c = dir.join("probe.c");
    let exe = dir.join("probe");
    std::fs::write(&c, src).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&c)
        .output()
        .unwrap_or_else(|e| {
            panic!("this test compiles the C header with `{cc}` (set CC to a C compiler): {e}")
        });
    assert!(
        out.status.success(),
        "the C header does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8(run.stdout).unwrap();
    let got: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.rsplit_once(' ')).collect();
    let mut bad = Vec::new();
    for (expr, value) in &want {
        match got.get(expr.as_str()) {
            Some(v) if *v == value.to_string() => {}
            other => bad.push(format!("{expr}: C says {other:?}, Rust says {value}")),
        }
    }
    assert_eq!(got.get("FARVM_ACPI_HID"), Some(&device::ACPI_HID));
    assert!(
        bad.is_empty(),
        "C header and Rust ABI disagree:\n{}",
        bad.join("\n")
    );
}
