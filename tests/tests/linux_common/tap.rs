//! A host tap for the Linux-guest network tests (`linux_net.rs`, `linux_debian.rs`, which
//! include this file): created with an address on the host side, removed on drop, or one
//! libvirt created given its address; and an HTTP GET to the guest on it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// A host tap with an address (`host_cidr`, e.g. `10.77.0.1/24`), removed on drop.
pub struct HostTap(String);

impl HostTap {
    pub fn create(name: &str, host_cidr: &str) -> HostTap {
        let _ = ip(&["link", "del", name]);
        let out = ip(&["tuntap", "add", "dev", name, "mode", "tap"]);
        assert!(
            out.status.success(),
            "ip tuntap add dev {name} mode tap: {} (the test needs root and the tun module)",
            String::from_utf8_lossy(&out.stderr)
        );
        address_tap(name, host_cidr);
        HostTap(name.to_string())
    }
}

impl Drop for HostTap {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.0]);
    }
}

/// Gives the existing tap `name` (ours, or one libvirt created for a domain) the host-side address
/// `host_cidr` and brings it up.
pub fn address_tap(name: &str, host_cidr: &str) {
    for args in [
        vec!["addr", "add", host_cidr, "dev", name],
        vec!["link", "set", name, "up"],
    ] {
        let out = ip(&args);
        assert!(
            out.status.success(),
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip").args(args).output().expect("run ip")
}

/// `GET path` from the HTTP server at `addr`: the body of its 200 answer, once it answers (the
/// guest's address and ARP take a moment), or a panic at `deadline`.
pub fn http_get(addr: SocketAddr, path: &str, deadline: Instant) -> Vec<u8> {
    let mut last = String::new();
    while Instant::now() < deadline {
        let got = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(60)))?;
            s.write_all(format!("GET {path} HTTP/1.0\r\nHost: guest\r\n\r\n").as_bytes())?;
            let mut r = Vec::new();
            s.read_to_end(&mut r)?;
            Ok(r)
        });
        match got {
            Ok(r) => {
                let end = r
                    .windows(4)
                    .position(|w| w == b"\r\n\r\n")
                    .unwrap_or_else(|| panic!("no HTTP header in {r:?}"));
                let head = String::from_utf8_lossy(&r[..end]);
                assert!(
                    head.starts_with("HTTP/1.") && head.contains(" 200 "),
                    "{head}"
                );
                return r[end + 4..].to_vec();
            }
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("no HTTP answer from {addr}: {last}");
}
