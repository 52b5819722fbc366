//! Replication under failure: a replica server process is SIGKILLed mid-stream; the client
//! must finish with zero lost or wrong pages, without hanging, and re-replicate when a spare
//! server exists. A sole server that stops answering for a while is put back in service with
//! its pages; one that restarted (and so lost them) is never read as "absent" pages.

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use farvm_memclient::{Client, ClientError, IoBuf, Op, Priority, ReplyTo, Request};
use farvm_memproto::PAGE_SIZE;

const PAGES: u64 = 4096; // 4 slabs of 1024 pages

/// Writes versions of all pages in a loop, reading back and verifying as it goes, and kills
/// `victim` after `kill_after` batches. Returns (model, pages verified).
fn stream_with_kill(
    c: &Client,
    procs: &mut [ServerProc],
    victim: usize,
    kill_after: u64,
) -> (HashMap<u64, u64>, u64) {
    let ns = 42;
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut verified = 0;
    let (tx, rx) = crossbeam_channel::bounded(8);
    let mut bufs: Vec<IoBuf> = (0..4).map(|_| IoBuf::new(64)).collect();
    for batch in 0..240u64 {
        // Four concurrent 64-page writes (pipelined), then four concurrent reads.
        let base = (batch * 256) % PAGES;
        for k in 0..4u64 {
            let mut io = bufs.pop().unwrap();
            let first = base + k * 64;
            io.set_run(first, 64).unwrap();
            for i in 0..64 {
                page_content(ns, first + i as u64, batch, io.page_mut(i));
            }
            c.submit(
                Request {
                    op: Op::Write,
                    ns,
                    priority: Priority::Demand,
                    io,
                    user_data: k,
                },
                ReplyTo::Channel(&tx),
            )
            .unwrap();
        }
        // Kill while these writes are in flight.
        if batch == kill_after {
            procs[victim].kill();
        }
        for _ in 0..4 {
            let d = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("write completion (no hang)");
            d.result.expect("write survives a replica loss");
            let first = d.io.page_index(0);
            for i in 0..64 {
                model.insert(first + i, batch);
            }
            bufs.push(d.io);
        }
        // Read back a different region too (older versions).
        let rbase = (base + 1024 + (batch % 3) * 64) % PAGES;
        for k in 0..4u64 {
            let mut io = bufs.pop().unwrap();
            io.set_run(rbase + k * 64, 64).unwrap();
            c.submit(
                Request {
                    op: Op::Read,
                    ns,
                    priority: Priority::Demand,
                    io,
                    user_data: k,
                },
                ReplyTo::Channel(&tx),
            )
            .unwrap();
        }
        for _ in 0..4 {
            let d = rx
                .recv_timeout(Duration::from_secs(10))
                .expect("read completion (no hang)");
            d.result.expect("read fails over to the surviving replica");
            for i in 0..64 {
                let p = d.io.page_index(i);
                match model.get(&p) {
                    Some(&v) => {
                        assert!(d.io.is_present(i), "page {p} lost");
                        assert_eq!(d.io.page(i), &page(ns, p, v)[..], "page {p} wrong");
                        verified += 1;
                    }
                    None => assert!(!d.io.is_present(i)),
                }
            }
            bufs.push(d.io);
        }
    }
    (model, verified)
}

fn verify_all(c: &Client, model: &HashMap<u64, u64>) {
    let mut out = vec![0u8; PAGES as usize * PAGE_SIZE];
    let present = c.read(42, 0, &mut out).expect("final read");
    let mut bad = 0;
    for p in 0..PAGES {
        let got = &out[p as usize * PAGE_SIZE..(p as usize + 1) * PAGE_SIZE];
        match model.get(&p) {
            Some(&v) => {
                if !present[p as usize] || got != &page(42, p, v)[..] {
                    bad += 1;
                }
            }
            None => assert!(!present[p as usize]),
        }
    }
    assert_eq!(bad, 0, "lost or wrong pages after the failure");
}

#[test]
fn sigkill_one_of_two_replicas_loses_nothing() {
    let mut procs = vec![ServerProc::spawn("256M"), ServerProc::spawn("256M")];
    let addrs: Vec<SocketAddr> = procs.iter().map(|p| p.addr).collect();
    let c = client(&addrs);
    assert_eq!(c.replication(), 2);
    let t0 = Instant::now();
    let (model, verified) = stream_with_kill(&c, &mut procs, 1, 60);
    assert!(verified > 10_000, "verified only {verified} pages");
    verify_all(&c, &model);
    let st = c.stats();
    assert_eq!(st.dead_servers, 1);
    // Only one server is left: the slabs run degraded (no spare to copy to).
    assert!(st.degraded_slabs > 0);
    assert!(t0.elapsed() < Duration::from_secs(60));
}

#[test]
fn sigkill_with_a_spare_re_replicates_then_survives_a_second_kill() {
    let mut procs = vec![
        ServerProc::spawn("256M"),
        ServerProc::spawn("256M"),
        ServerProc::spawn("256M"),
    ];
    let addrs: Vec<SocketAddr> = procs.iter().map(|p| p.addr).collect();
    let c = client(&addrs);
    let (model, _) = stream_with_kill(&c, &mut procs, 0, 40);
    verify_all(&c, &model);
    // Wait for the copier to restore R = 2 on the two survivors.
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.stats().degraded_slabs > 0 {
        assert!(
            Instant::now() < deadline,
            "re-replication did not finish: {:?}",
            c.stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(c.stats().slabs_rereplicated > 0);
    // Every page now has two live copies: losing another server still loses nothing.
    procs[1].kill();
    verify_all(&c, &model);
}

/// Writes `PAGES` pages of version 1 into namespace 42 through `c`.
fn write_all(c: &Client) -> HashMap<u64, u64> {
    let mut data = vec![0u8; PAGES as usize * PAGE_SIZE];
    for p in 0..PAGES {
        page_content(
            42,
            p,
            1,
            &mut data[p as usize * PAGE_SIZE..(p as usize + 1) * PAGE_SIZE],
        );
    }
    c.write(42, 0, &data).expect("write every page");
    (0..PAGES).map(|p| (p, 1)).collect()
}

fn wait_rejoined(c: &Client, n: u64) {
    wait_for(
        "the server back in service",
        c,
        Duration::from_secs(20),
        |c| c.stats().rejoined_servers >= n,
    );
}

#[test]
fn frozen_sole_server_is_put_back_in_service_with_its_pages() {
    let server = ServerProc::spawn("64M");
    let mut cfg = config(&[server.addr]);
    cfg.timeout = Duration::from_millis(300);
    let c = Client::connect(cfg).expect("client connects");
    let model = write_all(&c);
    server.signal(libc::SIGSTOP);
    let mut out = vec![0u8; 64 * PAGE_SIZE];
    let e = c
        .read(42, 0, &mut out)
        .expect_err("a frozen sole server cannot answer");
    assert_eq!(e, ClientError::NoLiveReplica, "{e}");
    let st = c.stats();
    assert_eq!((st.dead_servers, st.suspended_slabs), (1, 4), "{st:?}");
    // Out of service, the slabs are kept, not dropped: requests fail, nothing is "absent".
    assert_eq!(c.read(42, 0, &mut out), Err(ClientError::NoLiveReplica));
    server.signal(libc::SIGCONT);
    wait_rejoined(&c, 1);
    assert_eq!(c.stats().suspended_slabs, 0, "{:?}", c.stats());
    verify_all(&c, &model);
}

#[test]
fn restarted_sole_server_reports_its_pages_lost_never_absent_until_written_again() {
    let mut server = ServerProc::spawn("64M");
    let addr = server.addr;
    let c = client(&[addr]);
    write_all(&c);
    server.kill();
    let _restarted = ServerProc::spawn_at(&addr.to_string(), "64M");
    wait_rejoined(&c, 1);
    // The new process is empty; reading our pages from it as "never written" (zeros) would be
    // silent corruption. They are reported lost instead.
    let mut out = vec![0u8; 64 * PAGE_SIZE];
    assert_eq!(c.read(42, 0, &mut out), Err(ClientError::Lost));
    // A page written again after the loss lives again (its slab is placed afresh); its lost
    // neighbours in that slab stay lost, not "never written".
    let rewritten: Vec<u8> = page(42, 0, 2);
    c.write(42, 0, &rewritten).expect("write into a lost slab");
    let mut back = vec![0u8; PAGE_SIZE];
    assert_eq!(c.read(42, 0, &mut back).expect("read back"), vec![true]);
    assert_eq!(back, rewritten);
    assert_eq!(c.read(42, 1, &mut back), Err(ClientError::Lost));
    // The server itself is usable again for new data.
    let fresh: Vec<u8> = page(7, 0, 3);
    c.write(7, 0, &fresh)
        .expect("write to the restarted server");
    let mut back = vec![0u8; PAGE_SIZE];
    assert_eq!(c.read(7, 0, &mut back).expect("read back"), vec![true]);
    assert_eq!(back, fresh);
}

#[test]
fn a_frozen_replica_that_comes_back_keeps_no_copy_of_slabs_re_replicated_elsewhere() {
    let procs: Vec<ServerProc> = (0..3).map(|_| ServerProc::spawn("64M")).collect();
    let addrs: Vec<SocketAddr> = procs.iter().map(|p| p.addr).collect();
    let mut cfg = config(&addrs);
    cfg.timeout = Duration::from_millis(300);
    let c = Client::connect(cfg).expect("client connects");
    write_all(&c);
    let frozen = (0..3)
        .find(|&i| !c.slabs_on(42, addrs[i]).is_empty())
        .expect("a server holds slabs");
    let held = c.slabs_on(42, addrs[frozen]);
    procs[frozen].signal(libc::SIGSTOP);
    // Writes time out on it: it leaves service and its slabs are re-replicated elsewhere.
    let model = write_all(&c);
    wait_for("re-replication", &c, Duration::from_secs(30), |c| {
        c.stats().degraded_slabs == 0 && c.stats().dead_servers > 0
    });
    assert!(c.slabs_on(42, addrs[frozen]).is_empty());
    procs[frozen].signal(libc::SIGCONT);
    wait_rejoined(&c, 1);
    // Its copies of those slabs, which nothing reads any more, are discarded, not kept for
    // good.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = c.stat(42);
        let pages = st[frozen]
            .as_ref()
            .unwrap()
            .as_ref()
            .unwrap()
            .namespace_pages;
        if pages == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the server that came back still holds {pages} pages of slabs {held:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    verify_all(&c, &model);
}
