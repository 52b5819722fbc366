//! Generated domains written as XML and read back are the same domain; so are generated host
//! layers' local shares.

use std::path::PathBuf;

use farvm_vmconfig::domain::{CharBackend, CharDevice, Disk, Interface, LifecycleAction, Os, Uuid};
use farvm_vmconfig::{Domain, LocalShare, Overrides, PageSpace, Pool, Servers};
use proptest::option;
use proptest::prelude::*;

/// Text without leading/trailing whitespace (the reader trims), with characters XML must
/// escape.
fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9&<>'\"/_.-]([a-zA-Z0-9 &<>'\"/_.=:-]{0,30}[a-zA-Z0-9&<>'\"/_.-])?"
}

fn path() -> impl Strategy<Value = PathBuf> {
    "/[a-z0-9_.-]{1,12}(/[a-zA-Z0-9 &'_.-]{0,12}[a-z0-9])?".prop_map(PathBuf::from)
}

fn host_port() -> impl Strategy<Value = String> {
    prop_oneof![
        ("[a-z][a-z0-9.-]{0,15}", 1u16..).prop_map(|(h, p)| format!("{h}:{p}")),
        (any::<[u8; 4]>(), 1u16..)
            .prop_map(|(a, p)| format!("{}:{p}", std::net::Ipv4Addr::from(a))),
        (any::<[u16; 8]>(), 1u16..)
            .prop_map(|(a, p)| format!("[{}]:{p}", std::net::Ipv6Addr::from(a))),
    ]
}

fn action(crash: bool) -> impl Strategy<Value = LifecycleAction> {
    proptest::sample::select(
        LifecycleAction::ALL
            .into_iter()
            .filter(move |a| crash || a.allowed_outside_crash())
            .collect::<Vec<_>>(),
    )
}

fn char_device() -> impl Strategy<Value = CharDevice> {
    (
        prop_oneof![
            Just(CharBackend::Pty),
            Just(CharBackend::Null),
            Just(CharBackend::Stdio),
            path().prop_map(CharBackend::File),
        ],
        option::of(proptest::sample::select(vec![
            "serial",
            "virtio",
            "isa-serial",
        ])),
        option::of(0u32..4),
    )
        .prop_map(|(backend, t, port)| CharDevice {
            backend,
            target_type: t.map(str::to_string),
            target_port: port,
        })
}

fn overrides() -> impl Strategy<Value = Overrides> {
    let servers = option::of(prop_oneof![
        proptest::collection::vec(host_port(), 1..4).prop_map(Servers::Memservers),
        (option::of(text()), proptest::collection::vec(text(), 1..3))
            .prop_map(|(name, endpoints)| Servers::Pool(Pool { name, endpoints })),
    ]);
    let share = option::of(prop_oneof![
        Just(LocalShare::All),
        (1u32..=10_000).prop_map(|p| LocalShare::Percent(f64::from(p) / 100.0)),
        (1u64..(1 << 50)).prop_map(LocalShare::Bytes),
    ]);
    (
        (option::of(any::<bool>()), servers, share),
        (
            option::of(proptest::sample::select(
                farvm_prefetch::registry::names().to_vec(),
            )),
            option::of(1u32..16),
            option::of(path()),
            option::of(prop_oneof![
                Just(PageSpace::Virtual),
                Just(PageSpace::Physical)
            ]),
            option::of(any::<u32>()),
            option::of(host_port().prop_filter("an IP address", |s| {
                s.parse::<std::net::SocketAddr>().is_ok()
            })),
        ),
    )
        .prop_map(
            |(
                (local_only, servers, local_memory),
                (pf, replicas, token_file, page_space, probe_every, metrics),
            )| {
                Overrides {
                    local_only,
                    servers,
                    local_memory,
                    prefetcher: pf.map(str::to_string),
                    replicas,
                    token_file,
                    memory_key_file: None,
                    migration_key_file: None,
                    snapshot_key_file: None,
                    page_space,
                    probe_every,
                    metrics,
                }
            },
        )
}

fn domain() -> impl Strategy<Value = Domain> {
    let os = (
        option::of(Just("x86_64".to_string())),
        option::of("pc(-q35-[0-9.]{1,4})?"),
        option::of((path(), option::of(path()), option::of(text()))),
    )
        .prop_map(|(arch, machine, boot)| {
            let (kernel, initrd, cmdline) = match boot {
                Some((k, i, c)) => (Some(k), i, c),
                None => (None, None, None),
            };
            Os {
                os_type: "hvm".into(),
                arch,
                machine,
                kernel,
                initrd,
                cmdline,
            }
        });
    (
        (
            text().prop_filter("no / in names", |n| !n.contains('/')),
            option::of(any::<[u8; 16]>()),
        ),
        (1u64..(1 << 40)).prop_flat_map(|kib| (Just(kib), option::of(1..=kib))),
        1u32..=255,
        os,
        (
            option::of(action(false)),
            option::of(action(false)),
            option::of(action(true)),
        ),
        (
            option::of(path()),
            option::of(char_device()),
            option::of(char_device()),
            proptest::collection::vec((path(), any::<bool>(), any::<bool>()), 0..4),
            proptest::collection::vec(
                (
                    "[a-z][a-z0-9_-]{0,14}",
                    option::of(any::<[u8; 6]>().prop_map(|mut m| {
                        m[0] &= !1;
                        m
                    })),
                ),
                0..3,
            ),
        ),
        option::of(overrides()),
    )
        .prop_map(
            |(
                (name, uuid),
                (kib, cur),
                vcpus,
                os,
                (off, reb, crash),
                (emu, serial, console, disks, nics),
                farvm,
            )| Domain {
                domain_type: "kvm".into(),
                name,
                uuid: uuid.map(Uuid),
                memory: kib * 1024,
                current_memory: cur.map(|c| c * 1024),
                vcpus,
                os,
                on_poweroff: off,
                on_reboot: reb,
                on_crash: crash,
                emulator: emu,
                serial,
                console,
                disks: disks
                    .into_iter()
                    .enumerate()
                    .map(|(i, (source, block, readonly))| Disk {
                        source,
                        block,
                        target: Disk::target_of(i).unwrap(),
                        readonly,
                    })
                    .collect(),
                interfaces: nics
                    .into_iter()
                    .map(|(tap, mac)| Interface { tap, mac })
                    .collect(),
                farvm,
                lines: Default::default(),
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn domain_xml_round_trips(d in domain()) {
        let xml = d.to_xml();
        let back = Domain::parse(&xml).map_err(|e| TestCaseError::fail(format!("{e}\n{xml}")))?;
        prop_assert_eq!(back.domain, d, "{}", xml);
    }

    #[test]
    fn local_share_round_trips(s in prop_oneof![
        Just(LocalShare::All),
        (1u32..=1_000_000).prop_map(|p| LocalShare::Percent(f64::from(p) / 10_000.0)),
        (1u64..).prop_map(LocalShare::Bytes),
    ]) {
        prop_assert_eq!(LocalShare::parse(&s.to_string()), Ok(s));
    }
}
