//! Bad domain XML: every error names the element and the line.

use farvm_vmconfig::{ConfigError, Domain};

/// A valid domain with `body` spliced in after `<name>` (so line numbers are predictable:
/// `body` starts on line 3).
fn with(body: &str) -> String {
    format!(
        "<domain type='kvm'>\n  <name>d</name>\n{body}\n  <memory>65536</memory>\n  <os><type>hvm</type></os>\n</domain>\n"
    )
}

fn err(xml: &str) -> (String, u32, String) {
    match Domain::parse(xml) {
        Ok(p) => panic!("accepted: {xml}\n{:?}", p.domain),
        Err(ConfigError::Invalid {
            element,
            line,
            message,
        }) => (element, line, message),
        Err(ConfigError::Xml { line, message }) => ("(xml)".into(), line, message),
        Err(other) => panic!("unexpected error kind: {other}"),
    }
}

#[test]
fn malformed_xml_names_the_line() {
    let (el, line, msg) =
        err("<domain type='kvm'>\n  <name>d</name>\n  <memory>1</vcpu>\n</domain>");
    assert_eq!((el.as_str(), line), ("(xml)", 3), "{msg}");
    let (_, line, msg) = err("<domain type='kvm'>\n\n  <name>d&bogus;</name>\n</domain>");
    assert_eq!(line, 3);
    assert!(msg.contains("unknown entity"), "{msg}");
    let (_, _, msg) = err("");
    assert!(msg.contains("no root element"), "{msg}");
}

#[test]
fn bad_values_name_element_and_line() {
    let cases: &[(&str, &str, u32, &str)] = &[
        ("  <vcpu>0</vcpu>", "vcpu", 3, "farvm runs 1 to 255"),
        ("  <vcpu>256</vcpu>", "vcpu", 3, "farvm runs 1 to 255"),
        ("  <vcpu>two</vcpu>", "vcpu", 3, "not a vCPU count"),
        ("  <vcpu current='3'>2</vcpu>", "vcpu", 3, "current="),
        ("  <uuid>not-a-uuid</uuid>", "uuid", 3, "not a UUID"),
        (
            "  <currentMemory>1048576</currentMemory>",
            "currentMemory",
            3,
            "at most <memory>",
        ),
        (
            "  <currentMemory unit='parsec'>1</currentMemory>",
            "currentMemory",
            3,
            "unknown unit",
        ),
        (
            "  <on_poweroff>explode</on_poweroff>",
            "on_poweroff",
            3,
            "not an action",
        ),
        (
            "  <on_reboot>coredump-destroy</on_reboot>",
            "on_reboot",
            3,
            "only in <on_crash>",
        ),
        ("  <name>again</name>", "name", 3, "given twice"),
        (
            "\n  <devices><serial type='file'/></devices>",
            "serial",
            4,
            "<source path",
        ),
        (
            "  <devices><console/></devices>",
            "console",
            3,
            "needs a type",
        ),
        // Settings farvm cannot honour are refused, not dropped: the guest would differ.
        (
            "  <memoryBacking>\n    <hugepages/>\n  </memoryBacking>",
            "hugepages",
            4,
            "<memoryBacking><hugepages> is not supported",
        ),
        (
            "  <memoryBacking><locked/></memoryBacking>",
            "locked",
            3,
            "remove <memoryBacking>",
        ),
        (
            "  <numatune><memory mode='strict' nodeset='0'/></numatune>",
            "numatune",
            3,
            "one NUMA node",
        ),
        (
            "  <cpu>\n    <numa><cell id='0' cpus='0' memory='65536'/></numa>\n  </cpu>",
            "numa",
            4,
            "guest NUMA cells are not supported",
        ),
    ];
    for (body, element, line, needle) in cases {
        let (el, l, msg) = err(&with(body));
        assert_eq!((el.as_str(), l), (*element, *line), "{body}: {msg}");
        assert!(msg.contains(needle), "{body}: {msg}");
    }
}

#[test]
fn required_and_root_checks() {
    let (el, _, msg) = err("<domain type='qemu'><name>d</name></domain>");
    assert_eq!(el, "domain");
    assert!(msg.contains("type 'kvm'"), "{msg}");
    let (el, _, msg) =
        err("<domain type='kvm'><memory>1</memory><os><type>hvm</type></os></domain>");
    assert_eq!(el, "domain");
    assert!(msg.contains("<name>"), "{msg}");
    let (_, _, msg) = err("<domain type='kvm'><name>d</name><os><type>hvm</type></os></domain>");
    assert!(msg.contains("<memory>"), "{msg}");
    let (el, _, msg) = err(
        "<domain type='kvm'><name>d</name><memory>0</memory><os><type>hvm</type></os></domain>",
    );
    assert_eq!(el, "memory");
    assert!(msg.contains("more than 0"), "{msg}");
    let (el, _, msg) = err(
        "<domain type='kvm'><name>d</name><memory>1</memory><os><type>xen</type></os></domain>",
    );
    assert_eq!(el, "type");
    assert!(msg.contains("hvm"), "{msg}");
    let (el, _, _) = err("<domain type='kvm'><name>d</name><memory>1</memory><os><type arch='aarch64'>hvm</type></os></domain>");
    assert_eq!(el, "type");
    let (el, _, msg) = err("<domain type='kvm'><name>d</name><memory>1</memory><os><type>hvm</type><cmdline>x</cmdline></os></domain>");
    assert_eq!(el, "os");
    assert!(msg.contains("need a <kernel>"), "{msg}");
    let (el, _, _) = err("<vm type='kvm'/>");
    assert_eq!(el, "vm");
    let (el, _, _) = err("<domain type='kvm'><name>a/b</name></domain>");
    assert_eq!(el, "name");
}

#[test]
fn farvm_metadata_is_namespace_checked() {
    let meta = |inner: &str| {
        with(&format!(
            "  <metadata>\n    <farvm:remote-memory xmlns:farvm='https://farvm.dev/xmlns/domain/1'>\n      {inner}\n    </farvm:remote-memory>\n  </metadata>"
        ))
    };
    // Line of `inner`: 5.
    let cases: &[(&str, &str, &str)] = &[
        ("<memserver address='a:1'/>", "memserver", "must be in its namespace"),
        ("<farvm:memservers address='a:1'/>", "farvm:memservers", "has no element"),
        ("<farvm:memserver/>", "farvm:memserver", "needs address"),
        ("<farvm:memserver address='nope'/>", "farvm:memserver", "HOST:PORT"),
        ("<farvm:memserver address='a:1' port='2'/>", "farvm:memserver", "unknown attribute `port`"),
        ("<farvm:local-memory>150%</farvm:local-memory>", "farvm:local-memory", "(0, 100]"),
        ("<farvm:local-memory unit='MiB'>0</farvm:local-memory>", "farvm:local-memory", "more than 0"),
        ("<farvm:prefetcher>psychic</farvm:prefetcher>", "farvm:prefetcher", "unknown prefetcher"),
        ("<farvm:replicas>0</farvm:replicas>", "farvm:replicas", "at least 1"),
        ("<farvm:page-space>both</farvm:page-space>", "farvm:page-space", "virtual or physical"),
        ("<farvm:local-only>maybe</farvm:local-only>", "farvm:local-only", "yes or no"),
        ("<farvm:metrics address='localhost'/>", "farvm:metrics", "IP address and port"),
        ("<farvm:pool name='p'/>", "farvm:pool", "at least one"),
        ("<farvm:token-file/>", "farvm:token-file", "is empty"),
        ("<farvm:replicas>2</farvm:replicas><farvm:replicas>3</farvm:replicas>", "farvm:replicas", "given twice"),
        (
            "<farvm:memserver address='a:1'/><farvm:pool><farvm:endpoint>http://e</farvm:endpoint></farvm:pool>",
            "farvm:pool",
            "not both",
        ),
    ];
    for (inner, element, needle) in cases {
        let (el, line, msg) = err(&meta(inner));
        assert_eq!((el.as_str(), line), (*element, 5), "{inner}: {msg}");
        assert!(msg.contains(needle), "{inner}: {msg}");
    }
}

#[test]
fn lookalike_metadata_is_pointed_out_not_used() {
    let xml = with(
        "  <metadata>\n    <x:remote-memory xmlns:x='https://farvm.dev/xmlns/domain/0'/>\n  </metadata>",
    );
    let p = Domain::parse(&xml).unwrap();
    assert_eq!(p.domain.farvm, None);
    assert_eq!(p.warnings.len(), 1);
    assert_eq!(p.warnings[0].line, 4);
    assert!(
        p.warnings[0].message.contains("not farvm's"),
        "{}",
        p.warnings[0]
    );
}
