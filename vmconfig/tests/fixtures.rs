//! The domain XML fixtures: each is valid libvirt XML (checked with libvirt's own
//! `virt-xml-validate`) and reads as expected.

use std::path::{Path, PathBuf};
use std::process::Command;

use farvm_vmconfig::domain::{CharBackend, Interface, LifecycleAction};
use farvm_vmconfig::{Domain, LocalShare, PageSpace, ParsedDomain, Servers};

fn fixtures_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures_dir())
        .expect("tests/fixtures exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "xml"))
        .collect();
    v.sort();
    assert!(v.len() >= 5, "fixtures missing: {v:?}");
    v
}

fn parse(name: &str) -> ParsedDomain {
    let text = std::fs::read_to_string(fixtures_dir().join(name)).unwrap();
    Domain::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn every_fixture_is_valid_libvirt_xml() {
    let probe = Command::new("virt-xml-validate").arg("--help").output();
    if probe.is_err() {
        panic!(
            "virt-xml-validate is not installed: this test checks the fixtures against libvirt's \
             schema. Install Debian's libvirt-clients (scripts/setup.sh does)."
        );
    }
    for f in fixtures() {
        let o = Command::new("virt-xml-validate")
            .arg(&f)
            .arg("domain")
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{} is not valid libvirt domain XML:\n{}{}",
            f.display(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

#[test]
fn every_fixture_parses_and_round_trips() {
    for f in fixtures() {
        let text = std::fs::read_to_string(&f).unwrap();
        let p = Domain::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let again = Domain::parse(&p.domain.to_xml()).unwrap();
        assert_eq!(again.domain, p.domain, "{}", f.display());
        // Nothing unsupported is written back; what is still warned about was warned about
        // before (e.g. a currentMemory below memory).
        for w in &again.warnings {
            assert!(
                p.warnings.iter().any(|o| o.element == w.element),
                "{}: new warning {w}",
                f.display()
            );
        }
    }
}

#[test]
fn written_xml_is_valid_libvirt_xml() {
    let dir = std::env::temp_dir().join(format!("farvm-vmconfig-written-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in fixtures() {
        let p = parse(f.file_name().unwrap().to_str().unwrap());
        let out = dir.join(f.file_name().unwrap());
        std::fs::write(&out, p.domain.to_xml()).unwrap();
        let o = Command::new("virt-xml-validate")
            .arg(&out)
            .arg("domain")
            .output()
            .expect("virt-xml-validate (Debian libvirt-clients) is needed");
        assert!(
            o.status.success(),
            "XML written for {} is not valid:\n{}\n{}",
            f.display(),
            p.domain.to_xml(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn minimal() {
    let p = parse("minimal.xml");
    let d = &p.domain;
    assert_eq!(d.name, "minimal");
    assert_eq!(d.memory, 512 << 20);
    assert_eq!(d.vcpus, 1);
    assert_eq!(d.os.os_type, "hvm");
    assert_eq!(d.os.kernel, None);
    assert_eq!((d.serial.as_ref(), d.console.as_ref()), (None, None));
    assert_eq!(d.farvm, None);
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
}

#[test]
fn testguest() {
    let p = parse("testguest.xml");
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let d = &p.domain;
    assert_eq!(d.name, "web-1");
    assert_eq!(
        d.uuid.unwrap().to_string(),
        "4dea22b3-1d52-d8f3-2516-782e98ab3fa0"
    );
    assert_eq!((d.memory, d.current_memory), (512 << 20, Some(512 << 20)));
    assert_eq!(d.vcpus, 2);
    assert_eq!(d.os.arch.as_deref(), Some("x86_64"));
    assert_eq!(
        d.os.kernel.as_deref(),
        Some(Path::new("/var/lib/farvm/farvm-testguest.elf"))
    );
    assert_eq!(
        d.os.cmdline.as_deref(),
        Some("farvm.workload=seq:ws=32M farvm.workload=random:ws=16M,cpu=1")
    );
    assert_eq!(d.on_poweroff, Some(LifecycleAction::Destroy));
    assert_eq!(d.on_reboot, Some(LifecycleAction::Restart));
    assert_eq!(
        d.emulator.as_deref(),
        Some(Path::new("/usr/local/bin/cloud-hypervisor"))
    );
    assert_eq!(d.serial, None);
    let console = d.console.as_ref().unwrap();
    assert_eq!(console.backend, CharBackend::Pty);
    assert_eq!(console.target_type.as_deref(), Some("virtio"));
    let f = d.farvm.as_ref().unwrap();
    assert_eq!(
        f.servers,
        Some(Servers::Memservers(vec![
            "10.0.0.5:7070".into(),
            "memsrv2.example:7070".into()
        ]))
    );
    assert_eq!(f.local_memory, Some(LocalShare::Percent(25.0)));
    assert_eq!(f.prefetcher.as_deref(), Some("stride"));
    assert_eq!(f.replicas, Some(2));
    assert_eq!(
        f.token_file.as_deref(),
        Some(Path::new("/etc/farvm/tokens/web-1"))
    );
    assert_eq!(f.page_space, Some(PageSpace::Physical));
    assert_eq!(f.probe_every, Some(32));
    assert_eq!(f.metrics.as_deref(), Some("127.0.0.1:9300"));
    assert_eq!(f.local_only, None);
}

/// The operator's Debian VM (scripts/debian-guest-image.sh, booted in the KVM lab by
/// tests/tests/linux_debian.rs): direct kernel boot with root=/dev/vda, one raw disk, one tap.
#[test]
fn debian() {
    let p = parse("debian.xml");
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let d = &p.domain;
    assert_eq!(
        (d.name.as_str(), d.memory, d.vcpus),
        ("debian-1", 256 << 20, 2)
    );
    assert_eq!(
        d.os.kernel.as_deref(),
        Some(Path::new("/var/lib/farvm/debian/vmlinuz"))
    );
    assert_eq!(
        d.os.initrd.as_deref(),
        Some(Path::new("/var/lib/farvm/debian/initrd.img"))
    );
    let cmdline = d.os.cmdline.as_deref().unwrap();
    for word in [
        "console=ttyS0",
        "root=/dev/vda",
        "rw",
        "farvm_ip=192.168.100.2/24",
    ] {
        assert!(cmdline.split(' ').any(|w| w == word), "{word} in {cmdline}");
    }
    assert_eq!(d.disks.len(), 1);
    let disk = &d.disks[0];
    assert_eq!(disk.source, Path::new("/var/lib/farvm/debian/root.img"));
    assert_eq!(
        (disk.target.as_str(), disk.block, disk.readonly),
        ("vda", false, false)
    );
    assert_eq!(
        d.interfaces,
        [Interface {
            tap: "deb0".into(),
            mac: Some([0x52, 0x54, 0x00, 0xde, 0xb1, 0x02]),
        }]
    );
    assert_eq!(d.serial.as_ref().unwrap().backend, CharBackend::Pty);
    let f = d.farvm.as_ref().unwrap();
    assert_eq!(f.local_memory, Some(LocalShare::Percent(25.0)));
    assert_eq!(f.servers, None);
}

#[test]
fn units() {
    let p = parse("units.xml");
    let d = &p.domain;
    assert_eq!(d.memory, 1 << 30);
    // 1000 MB = 10^9 bytes = 976562.5 KiB, rounded up as libvirt does.
    assert_eq!(d.current_memory, Some(976_563 * 1024));
    assert_eq!(d.vcpus, 2);
    assert_eq!(d.os.machine.as_deref(), Some("pc"));
    assert_eq!(d.os.initrd.as_deref(), Some(Path::new("/boot/initrd.img")));
    assert_eq!(d.on_crash, Some(LifecycleAction::CoredumpDestroy));
    let serial = d.serial.as_ref().unwrap();
    assert_eq!(
        serial.backend,
        CharBackend::File("/var/log/farvm/units.console".into())
    );
    assert_eq!(serial.target_port, Some(0));
    let w: Vec<&str> = p.warnings.iter().map(|w| w.element.as_str()).collect();
    assert_eq!(w, ["currentMemory", "vcpu@current"], "{:?}", p.warnings);
    assert!(p.warnings[0].message.contains("balloon"));
    assert!(p.warnings[1].message.contains("hotplug"));
}

#[test]
fn unsupported_elements_are_each_named() {
    let p = parse("unsupported.xml");
    let got: Vec<(String, u32)> = p
        .warnings
        .iter()
        .map(|w| (w.element.clone(), w.line))
        .collect();
    let want = [
        ("vcpu@cpuset", 5),
        ("os/boot", 8),
        ("features", 10),
        ("cpu", 14),
        ("clock", 15),
        ("devices/interface/rom", 24),
        ("devices/serial", 27),
        ("devices/memballoon", 28),
    ];
    let want: Vec<(String, u32)> = want.iter().map(|(e, l)| (e.to_string(), *l)).collect();
    assert_eq!(got, want);
    for w in &p.warnings {
        let s = w.to_string();
        assert!(
            s.starts_with(&format!("domain XML line {}: <", w.line)),
            "{s}"
        );
    }
    // The first serial is used, the second reported.
    assert_eq!(p.domain.serial.as_ref().unwrap().backend, CharBackend::Pty);
    assert!(p.warnings[6].message.contains("one serial"));
    // The raw disk is the guest's /dev/vda.
    assert_eq!(p.domain.disks.len(), 1);
    assert_eq!(p.domain.disks[0].target, "vda");
    assert_eq!(p.domain.lines.disks, [17]);
}

/// Disks: raw files and block devices are read; a format, device or bus farvm does not have
/// is an error naming the element and line, never a disk the guest would misread.
#[test]
fn disks_are_read_or_refused_by_line() {
    let with = |disks: &str| {
        Domain::parse(&format!(
            "<domain type='kvm'>\n<name>d</name>\n<memory>65536</memory>\n\
             <os><type>hvm</type></os>\n<devices>\n{disks}</devices>\n</domain>\n"
        ))
    };
    let p = with(
        "<disk type='file' device='disk'><driver name='qemu' type='raw'/>\
         <source file='/img/root.img'/><target dev='vda' bus='virtio'/></disk>\n\
         <disk type='block'><source dev='/dev/sdb'/><target dev='vdb'/><readonly/></disk>\n",
    )
    .unwrap();
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let d = &p.domain.disks;
    assert_eq!(d.len(), 2);
    assert_eq!(
        (d[0].source.to_str(), d[0].block, d[0].readonly),
        (Some("/img/root.img"), false, false)
    );
    assert_eq!(
        (d[1].source.to_str(), d[1].block, d[1].readonly),
        (Some("/dev/sdb"), true, true)
    );
    assert_eq!(p.domain.lines.disks, [6, 7]);
    for (disk, want) in [
        (
            "<disk type='file'><driver name='qemu' type='qcow2'/><source file='/a'/><target dev='vda'/></disk>",
            "format qcow2: farvm reads raw images only",
        ),
        (
            "<disk type='file' device='cdrom'><source file='/a.iso'/><target dev='vda'/></disk>",
            "device='cdrom'",
        ),
        (
            "<disk type='file'><source file='/a'/><target dev='sda' bus='scsi'/></disk>",
            "bus='scsi'",
        ),
        ("<disk type='network'><source protocol='nbd'/><target dev='vda'/></disk>", "type='network'"),
        ("<disk type='file'><target dev='vda'/></disk>", "needs a <source>"),
    ] {
        let e = with(&format!("{disk}\n")).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains("line 6"), "{disk}: {e}");
    }
}

/// Network interfaces: a tap (`type='ethernet'`) with its MAC is read; another type, model or
/// a bad MAC or tap name is an error naming the element and line.
#[test]
fn interfaces_are_read_or_refused_by_line() {
    let with = |nics: &str| {
        Domain::parse(&format!(
            "<domain type='kvm'>\n<name>d</name>\n<memory>65536</memory>\n\
             <os><type>hvm</type></os>\n<devices>\n{nics}</devices>\n</domain>\n"
        ))
    };
    let p = with(
        "<interface type='ethernet'><mac address='52:54:00:ab:cd:ef'/>\
         <target dev='vnet0' managed='no'/><model type='virtio'/></interface>\n\
         <interface type='ethernet'><target dev='tap-b'/></interface>\n",
    )
    .unwrap();
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let n = &p.domain.interfaces;
    assert_eq!(
        n,
        &[
            Interface {
                tap: "vnet0".into(),
                mac: Some([0x52, 0x54, 0, 0xab, 0xcd, 0xef])
            },
            Interface {
                tap: "tap-b".into(),
                mac: None
            }
        ]
    );
    assert_eq!(p.domain.lines.interfaces, [6, 7]);
    for (nic, element, want) in [
        (
            "<interface type='network'><source network='default'/><model type='virtio'/></interface>",
            "<interface>",
            "type='network': farvm attaches existing tap devices only",
        ),
        (
            "<interface type='bridge'><source bridge='br0'/></interface>",
            "<interface>",
            "type='bridge'",
        ),
        ("<interface type='user'/>", "<interface>", "type='user'"),
        (
            "<interface type='ethernet'><model type='virtio'/></interface>",
            "<interface>",
            "needs a <target>",
        ),
        (
            "<interface type='ethernet'><target dev='a-name-far-too-long'/></interface>",
            "<target>",
            "is not a network interface name",
        ),
        (
            "<interface type='ethernet'><target dev='t0'/><model type='e1000'/></interface>",
            "<model>",
            "type='e1000': farvm's network device is virtio",
        ),
        (
            "<interface type='ethernet'><target dev='t0'/><mac address='01:00:5e:00:00:01'/></interface>",
            "<mac>",
            "multicast",
        ),
        (
            "<interface type='ethernet'><target dev='t0'/><mac address='52:54:zz:00:00:01'/></interface>",
            "<mac>",
            "is not a MAC address",
        ),
    ] {
        let e = with(&format!("{nic}\n")).unwrap_err().to_string();
        assert!(
            e.contains(want) && e.contains("line 6") && e.contains(element),
            "{nic}: {e}"
        );
    }
}

#[test]
fn libvirt_boilerplate_is_not_warned_about() {
    let stored = parse("libvirt-ch-dumpxml.xml");
    assert!(stored.warnings.is_empty(), "{:?}", stored.warnings);
    let mut original = parse("testguest.xml").domain;
    original.os.kernel = stored.domain.os.kernel.clone();
    original.emulator = stored.domain.emulator.clone();
    assert_eq!(stored.domain, original);
}

#[test]
fn pool_default_namespace_and_other_metadata() {
    let p = parse("pool.xml");
    assert!(p.warnings.is_empty(), "{:?}", p.warnings);
    let d = &p.domain;
    assert_eq!(
        d.uuid.unwrap().to_string(),
        "0f6a1c2e-9b8d-47e3-a5c4-d3b2a1908f7e"
    );
    assert_eq!(d.memory, 2 << 30);
    assert_eq!(d.vcpus, 4);
    assert_eq!(d.on_poweroff, Some(LifecycleAction::Preserve));
    assert_eq!(d.on_reboot, Some(LifecycleAction::Destroy));
    assert_eq!(d.on_crash, Some(LifecycleAction::CoredumpRestart));
    assert_eq!(d.serial.as_ref().unwrap().backend, CharBackend::Stdio);
    let f = d.farvm.as_ref().unwrap();
    match &f.servers {
        Some(Servers::Pool(pool)) => {
            assert_eq!(pool.name.as_deref(), Some("rack-1"));
            assert_eq!(
                pool.endpoints,
                ["http://10.0.0.2:2379", "http://10.0.0.3:2379"]
            );
        }
        other => panic!("expected a pool, got {other:?}"),
    }
    assert_eq!(f.local_only, Some(false));
    assert_eq!(f.local_memory, Some(LocalShare::Bytes(256 << 20)));
}
