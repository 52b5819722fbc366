//! A stock Linux guest's network device: `farvm run --net tap=NAME` gives the KVM lab's Debian
//! kernel (with `scripts/linux-guest-image.sh`'s initramfs, which loads virtio_net) a virtio-net
//! device on a host tap, on remote memory at 40% local. The guest takes an address, serves a
//! page it generated and its data disk's 16 MiB blob with busybox httpd, and the host's HTTP
//! GETs on the tap's subnet return that page and the blob (its checksum); then the guest
//! streams 32 MiB of zeros to a host listener over TCP, every byte arriving (the rate is
//! printed, not asserted: the lab is QEMU-TCG), and powers off.
//!
//! Like the other Linux-guest tests it needs two-dimensional paging (the KVM lab stage of CI,
//! `.ci/lab-tests-linux`, with the `tun` module loaded: `scripts/kvm-lab test --modules tun`);
//! elsewhere it says so, and fails if `FARVM_REQUIRE_LINUX_BOOT=1`. It needs root (it creates
//! the tap and gives the host side an address).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

mod linux_common;

use linux_common::*;

/// The tap's subnet: the host side and the guest (addresses that exist only on the tap).
const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const HTTP_PORT: u16 = 8080;
/// Bytes the guest streams to the host (the lab is QEMU-TCG on a shared host: a stream that
/// checks the path, not a throughput run; scripts/io-compare-lab.sh measures that).
const STREAM_BYTES: u64 = 32 << 20;

/// A host tap with an address, removed on drop.
struct HostTap(String);

impl HostTap {
    fn create(name: &str) -> HostTap {
        let _ = ip(&["link", "del", name]);
        for args in [
            vec!["tuntap", "add", "dev", name, "mode", "tap"],
            vec!["addr", "add", "10.77.0.1/24", "dev", name],
            vec!["link", "set", name, "up"],
        ] {
            let out = ip(&args);
            assert!(
                out.status.success(),
                "ip {}: {} (the test needs root and the tun module)",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        HostTap(name.to_string())
    }
}

impl Drop for HostTap {
    fn drop(&mut self) {
        let _ = ip(&["link", "del", &self.0]);
    }
}

fn ip(args: &[&str]) -> std::process::Output {
    Command::new("ip").args(args).output().expect("run ip")
}

/// `GET path` from the guest's httpd: the body, once it answers (the guest's address and ARP
/// take a moment), or a panic at `deadline`.
fn http_get(path: &str, deadline: Instant) -> Vec<u8> {
    let addr = SocketAddr::from((GUEST_IP, HTTP_PORT));
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

#[test]
fn linux_guest_serves_http_on_its_tap_and_streams_to_the_host() {
    if !farvm_tests::kvm_available() {
        return;
    }
    if !linux_can_boot("its network device is tested in the KVM lab") {
        return;
    }
    let img = guest_image();
    let (dir, disk) = scratch_disk("net", &img);
    let tap_name = format!("fvn{}", std::process::id() % 100_000);
    let _tap = HostTap::create(&tap_name);
    let listener = TcpListener::bind((HOST_IP, 0)).expect("listen on the tap's host address");
    let port = listener.local_addr().unwrap().port();

    let timeout = farvm_tests::vm_timeout(Duration::from_secs(900));
    let deadline = Instant::now() + timeout + Duration::from_secs(30);
    let mut args = run_args(&img, &disk, timeout);
    args.extend([
        "--net".to_string(),
        format!("tap={tap_name},mac=52:54:00:77:00:02"),
    ]);
    let t0 = Instant::now();
    let mut vm = Farvm::spawn(&args);
    vm.wait_for("the guest's shell", deadline, |l| {
        l.contains("farvm-guest: ready (").then_some(())
    });
    eprintln!("guest ready after {:.1} s", t0.elapsed().as_secs_f64());

    // The guest's page: 64 hex digits it drew itself, printed on the console as well; and the
    // data disk's 16 MiB blob, read from virtio-blk and served over virtio-net.
    vm.type_line(&format!(
        "ip link set eth0 up && ip addr add {GUEST_IP}/24 dev eth0 && mkdir -p /tmp/www && \
         head -c 32 /dev/urandom | sha256sum | cut -c1-64 > /tmp/www/index.html && \
         cp /mnt/blob /tmp/www/blob && httpd -p {HTTP_PORT} -h /tmp/www && \
         set -- $(cat /tmp/www/index.html) && echo PAGE $1"
    ));
    let page = vm.wait_for("the guest's page", deadline, |l| marked_sum(l, "PAGE"));
    let body = http_get("/", deadline);
    assert_eq!(
        String::from_utf8_lossy(&body).trim(),
        page,
        "the page the guest generated, over HTTP"
    );
    let blob = dir.join("blob.got");
    let t = Instant::now();
    std::fs::write(&blob, http_get("/blob", deadline)).unwrap();
    eprintln!("GET /blob (16 MiB): {:.1} s", t.elapsed().as_secs_f64());
    assert_eq!(
        host_sha256(&format!("cat {}", blob.display())),
        img.blob_sha256,
        "the disk's blob, served by the guest"
    );

    // Guest to host: STREAM_BYTES of zeros; the host closes once it has them all.
    let receiver = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().expect("the guest connects");
        let mut buf = vec![0u8; 1 << 16];
        let (mut got, mut nonzero) = (0u64, 0u64);
        let mut first: Option<Instant> = None;
        while got < STREAM_BYTES {
            let n = s.read(&mut buf).expect("read the guest's stream");
            if n == 0 {
                break;
            }
            first.get_or_insert_with(Instant::now);
            // Progress every 4 MiB: a slow lab and a stalled stream look alike otherwise.
            if (got >> 22) != ((got + n as u64) >> 22) {
                eprintln!("stream: {} MiB", (got + n as u64) >> 20);
            }
            got += n as u64;
            nonzero += buf[..n].iter().filter(|&&b| b != 0).count() as u64;
        }
        let secs = first.map_or(0.0, |t| t.elapsed().as_secs_f64());
        (peer, got, nonzero, secs)
    });
    vm.type_line(&format!(
        "dd if=/dev/zero bs=65536 count={} 2>/dev/null | nc {HOST_IP} {port}; echo STREAM done",
        STREAM_BYTES / 65536
    ));
    vm.wait_for("the stream's end", deadline, |l| {
        (l.trim() == "STREAM done").then_some(())
    });
    let (peer, got, nonzero, secs) = receiver.join().unwrap();
    assert_eq!(peer.ip(), GUEST_IP, "the stream came from the guest");
    assert_eq!(
        got, STREAM_BYTES,
        "every byte of the guest's stream arrived"
    );
    assert_eq!(nonzero, 0, "and arrived intact");
    eprintln!(
        "guest -> host over the tap: {} MiB in {secs:.1} s = {:.1} MiB/s (QEMU-TCG lab: a \
         ratio against another VMM in the same lab means something, this number alone not)",
        STREAM_BYTES >> 20,
        (STREAM_BYTES >> 20) as f64 / secs.max(1e-9)
    );

    vm.type_line("poweroff");
    let (status, _) = vm.finish(deadline);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        status,
        Some(0),
        "farvm's exit status after the guest's poweroff"
    );
}
