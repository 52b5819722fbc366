//! Generated `vm.create` configurations written as JSON and parsed back are the same
//! configuration; what `vm.info` reports parses back to it too (libvirt sends the one and reads
//! the other).

use std::path::PathBuf;

use farvm_chapi::create::{
    ConsoleConfig, ConsoleMode, CreateSpec, DiskSpec, NetSpec, MEMORY_ALIGN,
};
use proptest::option;
use proptest::prelude::*;

fn path() -> impl Strategy<Value = PathBuf> {
    "/[a-zA-Z0-9 _.\"\\\\-]{1,20}(/[a-zA-Z0-9 _.-]{1,12})?".prop_map(PathBuf::from)
}

fn console() -> impl Strategy<Value = ConsoleConfig> {
    prop_oneof![
        Just(ConsoleConfig::mode(ConsoleMode::Off)),
        Just(ConsoleConfig::mode(ConsoleMode::Null)),
        Just(ConsoleConfig::mode(ConsoleMode::Pty)),
        Just(ConsoleConfig::mode(ConsoleMode::Tty)),
        path().prop_map(|p| ConsoleConfig {
            mode: ConsoleMode::File,
            file: Some(p),
        }),
    ]
}

/// A console/serial pair farvm accepts: at most one destination, or both a pty.
fn consoles() -> impl Strategy<Value = (ConsoleConfig, ConsoleConfig)> {
    (console(), console()).prop_filter("one console device", |(c, s)| {
        let dest = |x: &ConsoleConfig| {
            matches!(
                x.mode,
                ConsoleMode::Pty | ConsoleMode::Tty | ConsoleMode::File
            )
        };
        !(dest(c) && dest(s)) || (c.mode == ConsoleMode::Pty && s.mode == ConsoleMode::Pty)
    })
}

fn spec() -> impl Strategy<Value = CreateSpec> {
    (
        1u32..=255,
        1u64..(1 << 28),
        path(),
        option::of("[ -~]{0,40}"),
        option::of(path()),
        consoles(),
        (
            proptest::collection::vec((path(), any::<bool>(), option::of("[a-z0-9_]{1,8}")), 0..3),
            proptest::collection::vec(
                (
                    "[a-z][a-z0-9]{0,14}",
                    option::of("52:54:00:[0-9a-f]{2}:[0-9a-f]{2}:[0-9a-f]{2}"),
                    option::of("[a-z0-9_]{1,8}"),
                ),
                0..3,
            ),
        ),
    )
        .prop_map(
            |(vcpus, pages, kernel, cmdline, initramfs, (console, serial), (disks, net))| {
                CreateSpec {
                    vcpus,
                    memory: pages * MEMORY_ALIGN,
                    kernel,
                    cmdline,
                    initramfs,
                    console,
                    serial,
                    disks: disks
                        .into_iter()
                        .map(|(path, readonly, id)| DiskSpec {
                            path,
                            readonly,
                            direct: false,
                            id,
                        })
                        .collect(),
                    net: net
                        .into_iter()
                        .map(|(tap, mac, id)| NetSpec { tap, mac, id })
                        .collect(),
                }
            },
        )
}

proptest! {
    #[test]
    fn create_body_round_trips(s in spec()) {
        let body = serde_json::to_vec(&s.to_json()).unwrap();
        let back = CreateSpec::parse(&body).unwrap();
        prop_assert_eq!(&back, &s);
        // vm.info's config (with a pty path filled in) is again a body farvm accepts.
        let info = s.config_json(Some(std::path::Path::new("/dev/pts/3")));
        let back = CreateSpec::parse(&serde_json::to_vec(&info).unwrap()).unwrap();
        prop_assert_eq!(back, s);
    }

    #[test]
    fn any_bytes_give_a_spec_or_a_4xx(body in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Err(e) = CreateSpec::parse(&body) {
            prop_assert!(e.status() == 400, "{}", e);
        }
    }
}
