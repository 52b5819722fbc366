//! The RDMA transport against an in-process server: pages written over RDMA read back over
//! RDMA and counted by the server over TCP (one store behind both listeners), absent and discarded pages, STAT, many
//! requests in flight through the window; and, where no RDMA device serves the address, a
//! clear error instead of a hang or a crash.
//!
//! The round trips need an RDMA device: `FARVM_RDMA_IP` (the KVM lab's Soft-RoCE set-up
//! exports it; see `farvm_memserver::process::rdma_test_ip`).

mod common;

use std::net::SocketAddr;

use common::*;
use farvm_memclient::{Client, ClientConfig, ClientError, IoBuf, Op, ReplyTo, Transport};
use farvm_memproto::PAGE_SIZE;
use farvm_memserver::process::rdma_test_ip;
use farvm_memserver::server::metrics::Op as ServerOp;
use farvm_memserver::server::{Server, ServerConfig, ServerHandle};

fn rdma_server(ip: std::net::IpAddr, pages: u64) -> ServerHandle {
    let mut cfg = ServerConfig::loopback(pages * PAGE_SIZE as u64);
    cfg.listen = SocketAddr::new(ip, 0);
    cfg.rdma = Some(SocketAddr::new(ip, 0));
    Server::start(cfg).expect("server with an RDMA listener starts")
}

fn rdma_config(addr: SocketAddr) -> ClientConfig {
    let mut c = config(&[addr]);
    c.servers[0].transport = Transport::RDMA;
    c
}

#[test]
fn pages_round_trip_over_rdma_and_match_tcp() {
    let Some(ip) = rdma_test_ip("pages_round_trip_over_rdma_and_match_tcp") else {
        return;
    };
    let srv = rdma_server(ip, 1 << 14);
    let raddr = srv.rdma_addr().expect("RDMA listener");
    let c = Client::connect(rdma_config(raddr)).expect("client connects over RDMA");
    let ns = 7;
    // 600 pages: runs of up to 256 per frame, across a slab boundary (1024-page slabs).
    let first = 700;
    let mut data = vec![0u8; 600 * PAGE_SIZE];
    for (i, p) in data.chunks_mut(PAGE_SIZE).enumerate() {
        page_content(ns, first + i as u64, 1, p);
    }
    c.write(ns, first, &data).expect("write over RDMA");
    let mut back = vec![0u8; 700 * PAGE_SIZE];
    let present = c.read(ns, first, &mut back).expect("read over RDMA");
    assert!(present[..600].iter().all(|&p| p), "written pages present");
    assert!(
        present[600..].iter().all(|&p| !p),
        "never-written pages absent"
    );
    assert!(
        back[..600 * PAGE_SIZE] == data[..],
        "pages read over RDMA differ"
    );
    // One-sided: pages 700..1400 lie in four 256-page slabs (2..=5), granted to each of the
    // client's links that touched them; no READ or WRITE reached the server as a request.
    let grants = srv.rdma_grants();
    assert!(
        (4..=8).contains(&grants),
        "4 slabs, up to 2 links: {grants} grants"
    );
    assert_eq!(srv.requests(ServerOp::Write), 0, "writes were one-sided");
    assert_eq!(srv.requests(ServerOp::Read), 0, "reads were one-sided");

    // The same store behind the TCP listener: a client's slab placement is its own, so
    // another client asks the server itself (STAT) what the namespace holds.
    let t = client(&[srv.addr()]);
    let info = t.stat(ns)[0]
        .expect("stat answered over TCP")
        .expect("stat ok");
    assert_eq!(
        info.namespace_pages, 600,
        "pages written over RDMA, seen over TCP"
    );

    // Discard and STAT over RDMA.
    assert_eq!(c.discard(ns, first, 100).expect("discard"), 100);
    let st = c.stat(ns);
    let info = st[0].expect("stat answered").expect("stat ok");
    assert_eq!(info.namespace_pages, 500);
    let present = c
        .read(ns, first, &mut back[..200 * PAGE_SIZE])
        .expect("read");
    assert!(present[..100].iter().all(|&p| !p) && present[100..].iter().all(|&p| p));

    // Many single-page reads in flight at once: the window (16 per RDMA link) and the queue
    // behind it, completions polled by the poller thread.
    let (tx, rx) = crossbeam_channel::bounded(64);
    for i in 0..64u64 {
        let mut io = IoBuf::new(1);
        io.set_run(first + 100 + i * 7, 1).expect("run");
        c.submit(
            farvm_memclient::Request {
                op: Op::Read,
                ns,
                priority: farvm_memclient::Priority::Prefetch,
                io,
                user_data: i,
            },
            ReplyTo::Channel(&tx),
        )
        .map_err(|(e, _)| e)
        .expect("submit");
    }
    for _ in 0..64 {
        let done = rx.recv().expect("completion");
        done.result.expect("read ok");
        let p = first + 100 + done.user_data * 7;
        assert!(done.io.is_present(0));
        assert!(done.io.page(0) == page(ns, p, 1), "page {p} differs");
    }
    let s = c.stats();
    assert!(
        s.read_bytes_copied > 0 && s.dead_servers == 0,
        "reads landed through the RDMA link: {s:?}"
    );
    assert_eq!(
        srv.requests(ServerOp::Read),
        0,
        "prefetch reads were one-sided"
    );
    assert_eq!(srv.requests(ServerOp::Discard), 1, "the discard was a SEND");
    c.close();
}

/// With one-sided pages off (`farvm run --rdma-pages send-recv`), every page travels as a
/// SEND the server's thread answers: the same pages come back, the server counts each READ
/// and WRITE as a request, and it grants no slab.
#[test]
fn pages_round_trip_over_send_recv_when_one_sided_is_off() {
    let Some(ip) = rdma_test_ip("pages_round_trip_over_send_recv_when_one_sided_is_off") else {
        return;
    };
    let srv = rdma_server(ip, 1 << 14);
    let raddr = srv.rdma_addr().expect("RDMA listener");
    let mut cfg = rdma_config(raddr);
    cfg.servers[0].transport = Transport::Rdma { one_sided: false };
    let c = Client::connect(cfg).expect("client connects over RDMA");
    let (ns, first) = (9, 300);
    let mut data = vec![0u8; 300 * PAGE_SIZE];
    for (i, p) in data.chunks_mut(PAGE_SIZE).enumerate() {
        page_content(ns, first + i as u64, 2, p);
    }
    c.write(ns, first, &data).expect("write over SEND/RECV");
    let mut back = vec![0u8; 300 * PAGE_SIZE];
    let present = c.read(ns, first, &mut back).expect("read over SEND/RECV");
    assert!(present.iter().all(|&p| p), "written pages present");
    assert!(back == data, "pages read over SEND/RECV differ");
    assert!(srv.requests(ServerOp::Write) >= 2, "writes were SENDs");
    assert!(srv.requests(ServerOp::Read) >= 2, "reads were SENDs");
    assert_eq!(srv.rdma_grants(), 0, "no slab granted");
    c.close();
}

/// Reads on granted slabs are RDMA READs the server never handles, and they agree with what
/// the server's own index holds: one-sided writes are counted by the server's STAT, and a
/// namespace dropped on the server reads back absent over one-sided READ, as over TCP.
#[test]
fn reads_on_granted_slabs_are_one_sided() {
    let Some(ip) = rdma_test_ip("reads_on_granted_slabs_are_one_sided") else {
        return;
    };
    let srv = rdma_server(ip, 1 << 14);
    let raddr = srv.rdma_addr().expect("RDMA listener");
    let c = Client::connect(rdma_config(raddr)).expect("client connects over RDMA");
    let ns = 11;
    let mut data = vec![0u8; 300 * PAGE_SIZE];
    for (i, p) in data.chunks_mut(PAGE_SIZE).enumerate() {
        page_content(ns, i as u64, 3, p);
    }
    c.write(ns, 0, &data).expect("write over RDMA");
    assert!(srv.rdma_grants() >= 2, "pages 0..300 lie in two slabs");
    let before = srv.requests(ServerOp::Read);
    let mut back = vec![0u8; 300 * PAGE_SIZE];
    let mut grants = 0;
    for round in 0..3 {
        let present = c.read(ns, 0, &mut back).expect("read over RDMA");
        assert!(present.iter().all(|&p| p), "round {round}: all present");
        assert!(back == data, "round {round}: pages differ");
        if round == 0 {
            // Every link that reads has its grants now.
            grants = srv.rdma_grants();
        }
    }
    assert_eq!(
        srv.requests(ServerOp::Read),
        before,
        "no READ reached the server as a SEND"
    );
    assert_eq!(srv.requests(ServerOp::Write), 0, "no WRITE either");
    assert_eq!(
        srv.rdma_grants(),
        grants,
        "a link asks for a slab's grant once"
    );
    let st = c.stat(ns);
    let info = st[0].expect("stat answered").expect("stat ok");
    assert_eq!(
        info.namespace_pages, 300,
        "the server counts one-sided pages"
    );

    // The server reclaims the namespace (as the pool's collector does): a read never returns
    // the old bytes as if stored. A one-sided read of a slab granted before finds the pages
    // absent; any part of the read that goes through the server is refused as reclaimed, and
    // then that is what the whole read says (what the lab shows).
    assert_eq!(srv.reclaim_namespace(ns), 300);
    match c.read(ns, 0, &mut back) {
        Err(ClientError::Reclaimed) => {}
        Ok(present) => assert!(
            present.iter().all(|&p| !p),
            "reclaimed pages read back absent"
        ),
        Err(e) => panic!("read after the reclaim: {e}"),
    }
    c.close();
}

/// Without an RDMA device on the route (this host; or 127.0.0.1 in the lab, whose devices sit
/// on a veth pair), connecting over RDMA fails at once with the operator's message.
#[test]
fn rdma_without_a_device_on_the_route_is_a_clear_error() {
    if std::fs::read_dir("/sys/class/infiniband").is_ok_and(|d| {
        d.flatten().any(|e| {
            std::fs::read_to_string(e.path().join("ports/1/gids/1"))
                .is_ok_and(|g| g.contains("ffff:7f00:0001"))
        })
    }) {
        eprintln!("an RDMA device serves 127.0.0.1 here: nothing to check");
        return;
    }
    let srv = Server::start(ServerConfig {
        rdma: Some("127.0.0.1:0".parse().unwrap()),
        ..ServerConfig::loopback(1 << 20)
    })
    .expect("the listener starts without a device (sessions fail, not the server)");
    let addr = srv.rdma_addr().expect("RDMA listener");
    match Client::connect(rdma_config(addr)) {
        Ok(_) => panic!("an RDMA link came up on 127.0.0.1 without a device"),
        Err(ClientError::Rdma { addr: a, reason }) => {
            assert_eq!(a, addr);
            assert!(reason.starts_with("no RDMA device"), "reason: {reason}");
            let msg = ClientError::Rdma { addr: a, reason }.to_string();
            assert!(msg.contains(&addr.to_string()), "{msg}");
        }
        Err(e) => panic!("expected ClientError::Rdma, got {e:?}"),
    }
    // The TCP listener is unaffected.
    let t = client(&[srv.addr()]);
    t.write(1, 0, &page(1, 0, 0)).expect("TCP still serves");
}
