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

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

mod linux_common;
#[path = "linux_common/tap.rs"]
mod tap;

use linux_common::*;
use tap::{http_get, HostTap};

/// The tap's subnet: the host side and the guest (addresses that exist only on the tap).
const HOST_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const GUEST_IP: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const HTTP_PORT: u16 = 8080;
/// Bytes the guest streams to the host (the lab is QEMU-TCG on a shared host: a stream that
/// checks the path, not a throughput run; scripts/io-compare-lab.sh measures that).
const STREAM_BYTES: u64 = 32 << 20;

#[test]
fn linux_guest_serves_http_on_its_tap_and_streams_to_the_host() {
    if !linux_test_can_run("its network device is tested in the KVM lab") {
        return;
    }
    let img = guest_image();
    let (dir, disk) = scratch_disk("net", &img);
    let tap_name = format!("fvn{}", std::process::id() % 100_000);
    let _tap = HostTap::create(&tap_name, "10.77.0.1/24");
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
    let guest = SocketAddr::from((GUEST_IP, HTTP_PORT));
    let body = http_get(guest, "/", deadline);
    assert_eq!(
        String::from_utf8_lossy(&body).trim(),
        page,
        "the page the guest generated, over HTTP"
    );
    let blob = dir.join("blob.got");
    let t = Instant::now();
    std::fs::write(&blob, http_get(guest, "/blob", deadline)).unwrap();
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
    let (status, rest) = vm.finish(deadline);
    std::fs::remove_dir_all(&dir).ok();
    assert_eq!(
        status,
        Some(0),
        "farvm's exit status after the guest's poweroff"
    );
    let report = json_report(&rest);
    assert_eq!(report["exit_status"], 0, "{report}");
}
