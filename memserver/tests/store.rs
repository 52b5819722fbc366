//! Loopback tests of the store semantics: random read/write/discard against a model with many
//! clients and namespaces, tenancy isolation, capacity exhaustion, priorities, timeouts,
//! malformed frames and the metrics endpoint.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;
use farvm_memclient::{
    namespace_for_name, Client, ClientError, Finished, IoBuf, Op, Priority, ReplyTo, Request,
};
use farvm_memproto::auth::Secret;
use farvm_memproto::frame::{decode, encode, Body, Frame, StatInfo};
use farvm_memproto::{PAGE_SIZE, PROTOCOL_VERSION};
use farvm_memserver::server::{Server, ServerConfig};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// 6 clients (threads) × 2 namespaces each on 3 servers with R = 2; random batched reads,
/// writes and discards (runs and scatter lists, crossing slab boundaries in the blocking
/// API); every read must equal the model's last write, absent pages must read as absent.
#[test]
fn random_ops_match_the_model() {
    let servers = start_servers(3, 1 << 16);
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let mut threads = Vec::new();
    for t in 0..6u64 {
        let addrs = addrs.clone();
        threads.push(std::thread::spawn(move || {
            let c = client(&addrs);
            assert_eq!(c.replication(), 2);
            let mut rng = Rng(0x1234_5678 + t * 7919);
            let nss = [t * 2 + 1, t * 2 + 2];
            // model: (ns, page) -> version (absent when missing)
            let mut model: HashMap<(u64, u64), u64> = HashMap::new();
            let (mut reads, mut checked) = (0u64, 0u64);
            let (tx, rx) = crossbeam_channel::bounded(4);
            let mut io = IoBuf::new(64);
            for step in 0..400u64 {
                let ns = nss[rng.below(2) as usize];
                // Pages in 0..3000 span three 1024-page slabs.
                let first = rng.below(3000);
                let n = 1 + rng.below(40) as usize;
                match rng.below(10) {
                    0..=3 => {
                        let mut data = vec![0u8; n * PAGE_SIZE];
                        for i in 0..n {
                            page_content(
                                ns,
                                first + i as u64,
                                step,
                                &mut data[i * PAGE_SIZE..(i + 1) * PAGE_SIZE],
                            );
                            model.insert((ns, first + i as u64), step);
                        }
                        c.write(ns, first, &data).expect("write");
                    }
                    4 => {
                        let freed = c.discard(ns, first, n).expect("discard");
                        let mut expect = 0;
                        for i in 0..n {
                            if model.remove(&(ns, first + i as u64)).is_some() {
                                expect += 1;
                            }
                        }
                        assert_eq!(freed, expect, "discard count");
                    }
                    5 | 6 => {
                        // Async scatter read within one slab.
                        let slab = first / 1024;
                        let pages: Vec<u64> =
                            (0..n).map(|_| slab * 1024 + rng.below(1024)).collect();
                        io.set_scatter(&pages).unwrap();
                        c.submit(
                            Request {
                                op: Op::Read,
                                ns,
                                priority: Priority::Prefetch,
                                io,
                                user_data: step,
                            },
                            ReplyTo::Channel(&tx),
                        )
                        .unwrap();
                        let done = rx.recv().unwrap();
                        assert_eq!(done.user_data, step);
                        done.result.expect("scatter read");
                        io = done.io;
                        for (i, &p) in pages.iter().enumerate() {
                            reads += 1;
                            match model.get(&(ns, p)) {
                                Some(&v) => {
                                    assert!(io.is_present(i), "page {p} of ns {ns} lost");
                                    assert_eq!(
                                        io.page(i),
                                        &page(ns, p, v)[..],
                                        "page {p} of ns {ns} wrong"
                                    );
                                    checked += 1;
                                }
                                None => assert!(
                                    !io.is_present(i),
                                    "page {p} of ns {ns} should be absent"
                                ),
                            }
                        }
                    }
                    _ => {
                        let mut out = vec![0xffu8; n * PAGE_SIZE];
                        let present = c.read(ns, first, &mut out).expect("read");
                        for i in 0..n {
                            let p = first + i as u64;
                            reads += 1;
                            let got = &out[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
                            match model.get(&(ns, p)) {
                                Some(&v) => {
                                    assert!(present[i], "page {p} lost");
                                    assert_eq!(got, &page(ns, p, v)[..], "page {p} wrong");
                                    checked += 1;
                                }
                                None => {
                                    assert!(!present[i]);
                                    assert!(
                                        got.iter().all(|&b| b == 0),
                                        "absent page not zero-filled"
                                    );
                                }
                            }
                        }
                    }
                }
            }
            // Final full check of both namespaces.
            for &ns in &nss {
                let mut out = vec![0u8; 3100 * PAGE_SIZE];
                let present = c.read(ns, 0, &mut out).unwrap();
                for p in 0..3100u64 {
                    let got = &out[p as usize * PAGE_SIZE..(p as usize + 1) * PAGE_SIZE];
                    match model.get(&(ns, p)) {
                        Some(&v) => assert_eq!(got, &page(ns, p, v)[..]),
                        None => assert!(!present[p as usize]),
                    }
                }
            }
            (reads, checked)
        }));
    }
    let mut total = (0, 0);
    for t in threads {
        let (r, c) = t.join().expect("client thread");
        total.0 += r;
        total.1 += c;
    }
    assert!(total.1 > 1000, "too few present pages checked: {total:?}");
    // Both replicas hold data: R = 2 means stored pages = 2 × distinct pages.
    let stored: u64 = servers.iter().map(|s| s.pages_stored()).sum();
    assert!(
        stored > 0 && stored.is_multiple_of(2),
        "replicated page count {stored}"
    );
}

#[test]
fn another_token_cannot_read_or_write_a_namespace() {
    let a = Secret::generate();
    let b = Secret::generate();
    let mut cfg = ServerConfig::loopback(1 << 24);
    cfg.tokens = vec![a.clone(), b.clone()];
    let srv = Server::start(cfg).unwrap();
    let with = |s: Option<Secret>| {
        let mut c = config(&[srv.addr()]);
        c.secret = s;
        Client::connect(c)
    };
    let ca = with(Some(a.clone())).expect("tenant A connects");
    let cb = with(Some(b)).expect("tenant B connects");
    let ns = namespace_for_name("vm-a");
    ca.write(ns, 5, &page(ns, 5, 1)).unwrap();
    let mut out = vec![0u8; PAGE_SIZE];
    assert_eq!(ca.read(ns, 5, &mut out).unwrap(), vec![true]);
    // B's client has no placement for A's namespace; make it ask the server by writing first.
    assert_eq!(cb.write(ns, 5, &page(ns, 5, 2)), Err(ClientError::Denied));
    // Placement now exists in B's client: its read reaches the server and is refused.
    assert_eq!(cb.read(ns, 5, &mut out), Err(ClientError::Denied));
    assert!(matches!(cb.stat(ns)[0], Some(Err(ClientError::Denied))));
    // A's data is untouched.
    ca.read(ns, 5, &mut out).unwrap();
    assert_eq!(out, page(ns, 5, 1));
    // Unknown secret and no secret are refused at the handshake.
    assert!(matches!(
        with(Some(Secret::generate())),
        Err(ClientError::Auth { .. })
    ));
    assert!(matches!(with(None), Err(ClientError::Auth { .. })));
    // The wire never carries the secret.
    assert!(!srv.metrics_text().contains(&a.to_hex()));
}

#[test]
fn capacity_exhaustion_is_a_typed_error_and_batches_are_all_or_nothing() {
    let srv = Server::start(ServerConfig::loopback(64 * PAGE_SIZE as u64)).unwrap();
    let c = client(&[srv.addr()]);
    let data: Vec<u8> = (0..60).flat_map(|p| page(9, p, 0)).collect();
    c.write(9, 0, &data).unwrap();
    // 10 more pages do not fit (4 free): nothing of the batch is stored.
    let more: Vec<u8> = (60..70).flat_map(|p| page(9, p, 0)).collect();
    assert_eq!(c.write(9, 60, &more), Err(ClientError::CapacityExhausted));
    assert_eq!(srv.pages_stored(), 60);
    // Overwriting existing pages needs no new slot.
    c.write(9, 0, &data[..10 * PAGE_SIZE]).unwrap();
    c.write(9, 60, &more[..4 * PAGE_SIZE]).unwrap();
    assert_eq!(
        c.write(9, 64, &page(9, 64, 0)),
        Err(ClientError::CapacityExhausted)
    );
    // Discard frees room.
    assert_eq!(c.discard(9, 0, 8).unwrap(), 8);
    c.write(9, 64, &more[4 * PAGE_SIZE..]).unwrap();
    let st = c.stat(9)[0].unwrap().unwrap();
    assert_eq!(
        (st.namespace_pages, st.used_pages, st.capacity_pages),
        (62, 62, 64)
    );
    assert!(srv
        .metrics_text()
        .contains("farvm_memserver_errors_total{op=\"write\",status=\"capacity_exhausted\"} 2"));
}

/// Writes pages 0..64 of namespace 3, then submits `n` prefetch reads of all 64 of them.
fn queue_prefetch_backlog(c: &Client, n: u64, tx: &crossbeam_channel::Sender<Finished>) {
    let data: Vec<u8> = (0..64).flat_map(|p| page(3, p, 0)).collect();
    c.write(3, 0, &data).unwrap();
    for i in 0..n {
        let mut io = IoBuf::new(64);
        io.set_run(0, 64).unwrap();
        c.submit(
            Request {
                op: Op::Read,
                ns: 3,
                priority: Priority::Prefetch,
                io,
                user_data: i,
            },
            ReplyTo::Channel(tx),
        )
        .unwrap();
    }
}

#[test]
fn demand_reads_overtake_queued_prefetches() {
    let srv = Server::start(ServerConfig::loopback(1 << 24)).unwrap();
    let mut cfg = config(&[srv.addr()]);
    cfg.conns_per_server = 1;
    cfg.window = 2;
    cfg.demand_reserve = 1;
    let c = Client::connect(cfg).unwrap();
    // A backlog deep enough (100 MiB of responses at one request in flight) that a test
    // thread descheduled on a loaded host still submits its demand read while most of it is
    // queued; the channel holds every completion so the client never blocks on it.
    let backlog = 400u64;
    let (tx, rx) = crossbeam_channel::bounded(backlog as usize + 1);
    queue_prefetch_backlog(&c, backlog, &tx);
    let mut io = IoBuf::new(1);
    io.set_run(7, 1).unwrap();
    // Completions already delivered before the demand read was submitted.
    let before = rx.len();
    c.submit(
        Request {
            op: Op::Read,
            ns: 3,
            priority: Priority::Demand,
            io,
            user_data: 999,
        },
        ReplyTo::Channel(&tx),
    )
    .unwrap();
    let order: Vec<u64> = (0..=backlog)
        .map(|_| rx.recv().unwrap().user_data)
        .collect();
    let pos = order.iter().position(|&u| u == 999).unwrap();
    // Prefetches are limited to one in flight, so at most that one (plus one the sender
    // thread may have been writing at that moment) finishes before the demand read.
    assert!(
        before + 10 < backlog as usize,
        "prefetches finished too fast to test ordering: {before} of {backlog}"
    );
    assert!(
        pos <= before + 2,
        "demand read finished at position {pos} (after {before} done): {order:?}"
    );
}

#[test]
fn synchronous_demand_reads_take_their_own_lane_past_a_prefetch_backlog() {
    let srv = Server::start(ServerConfig::loopback(1 << 24)).unwrap();
    let mut cfg = config(&[srv.addr()]);
    cfg.conns_per_server = 1;
    cfg.window = 256;
    cfg.demand_reserve = 0;
    cfg.depth = 256;
    assert!(cfg.demand_lane, "the lane is on by default");
    let c = Client::connect(cfg).unwrap();
    assert!(
        srv.metrics_text().contains("farvm_memserver_connections 2"),
        "one bulk connection plus the demand lane:\n{}",
        srv.metrics_text()
    );
    // 50 MiB of prefetch responses queued on the one bulk connection (served in order).
    let backlog = 200u64;
    let (tx, rx) = crossbeam_channel::bounded(backlog as usize);
    queue_prefetch_backlog(&c, backlog, &tx);
    let mut io = IoBuf::new(1);
    io.set_run(7, 1).unwrap();
    let done = c.submit_wait(Op::Read, 3, io);
    let finished_first = rx.len();
    assert_eq!(done.result, Ok(1));
    assert_eq!(done.io.page(0), &page(3, 7, 0)[..]);
    assert!(
        (finished_first as u64) < backlog,
        "the demand read waited for the whole prefetch backlog"
    );
    for _ in 0..backlog {
        let d = rx.recv().unwrap();
        assert_eq!(d.result, Ok(64));
    }
}

/// The server side of the handshake for an open-mode fake server (the client does not check
/// the MAC in open mode).
fn fake_handshake(s: &mut TcpStream) -> std::io::Result<()> {
    let mut out = Vec::new();
    let challenge = Body::Challenge {
        server_nonce: [1; 32],
        max_version: PROTOCOL_VERSION,
    };
    let f = Frame {
        req_id: 0,
        namespace: 0,
        body: challenge,
    };
    encode(&mut out, &f, false);
    s.write_all(&out)?;
    let mut hello = [0u8; 32 + 72];
    s.read_exact(&mut hello)?;
    out.clear();
    let f = Frame {
        req_id: 0,
        namespace: 0,
        body: Body::HelloResp {
            server_mac: [0; 32],
        },
    };
    encode(&mut out, &f, false);
    s.write_all(&out)
}

/// A fake server on loopback that runs `serve` on a thread for each connection.
fn fake_server(serve: fn(TcpStream)) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || serve(s));
        }
    });
    addr
}

/// Reads and drops everything until the peer closes.
fn drain(s: &mut TcpStream) {
    let mut sink = [0u8; 65536];
    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
}

/// A server that completes the handshake and then never answers.
fn silent_server() -> SocketAddr {
    fake_server(|mut s| {
        if fake_handshake(&mut s).is_ok() {
            drain(&mut s);
        }
    })
}

/// A server that completes the handshake, reads two requests, answers both in one segment
/// (so one `recv` of the client gets both responses), then stays silent.
fn two_in_one_segment_server() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        let Ok((mut s, _)) = l.accept() else { return };
        fake_handshake(&mut s).expect("handshake");
        let mut inbuf: Vec<u8> = Vec::new();
        let mut answers = Vec::new();
        let mut chunk = [0u8; 65536];
        let mut seen = 0;
        while seen < 2 {
            match decode(&inbuf) {
                Ok((f, used)) => {
                    let (req_id, namespace) = (f.req_id, f.namespace);
                    match f.body {
                        Body::Write { sel, .. } => {
                            let written = sel.len() as u32;
                            let body = Body::WriteResp { written };
                            let f = Frame {
                                req_id,
                                namespace,
                                body,
                            };
                            encode(&mut answers, &f, false);
                            seen += 1;
                        }
                        // The client's capacity probe: answered at once.
                        _ => {
                            let body = Body::StatResp(StatInfo {
                                namespace_pages: 0,
                                used_pages: 0,
                                capacity_pages: 1 << 20,
                                instance: 7,
                            });
                            let mut one = Vec::new();
                            encode(
                                &mut one,
                                &Frame {
                                    req_id,
                                    namespace,
                                    body,
                                },
                                false,
                            );
                            s.write_all(&one).unwrap();
                        }
                    }
                    inbuf.drain(..used);
                }
                Err(_) => {
                    let n = s.read(&mut chunk).unwrap();
                    assert!(n > 0, "client closed early");
                    inbuf.extend_from_slice(&chunk[..n]);
                }
            }
        }
        s.write_all(&answers).unwrap();
        while matches!(s.read(&mut chunk), Ok(n) if n > 0) {}
    });
    addr
}

/// Regression: a poller used to stop receiving once its first completion was in, leaving the
/// second response — read off the socket in the same `recv` — in the connection's buffer.
/// The socket never signals it again, and the background receiver waited for more socket
/// data, so the request timed out. Now the poller delivers whole frames it already holds, and
/// the background receiver checks the buffer before the socket.
#[test]
fn a_response_left_in_the_receive_buffer_is_still_delivered() {
    let addr = two_in_one_segment_server();
    let mut cfg = config(&[addr]);
    cfg.conns_per_server = 1;
    cfg.demand_lane = false;
    cfg.write_lane = false;
    cfg.timeout = Duration::from_secs(10);
    let c = Client::connect(cfg).unwrap();
    let (tx, rx) = crossbeam_channel::bounded(4);
    for p in 0..2u64 {
        let mut io = IoBuf::new(1);
        io.set_run(p, 1).unwrap();
        io.page_mut(0).copy_from_slice(&page(1, p, 0));
        c.submit(
            Request {
                op: Op::Write,
                ns: 1,
                priority: Priority::Prefetch,
                io,
                user_data: p,
            },
            ReplyTo::Polled(&tx),
        )
        .unwrap();
    }
    // Both answers land in one segment; this poller stops after the first.
    let first = c.wait_completion(&rx);
    assert_eq!(first.result, Ok(1));
    let t0 = Instant::now();
    let second = rx
        .recv_timeout(Duration::from_secs(2))
        .expect("the second response, already received, was never delivered");
    assert_eq!(second.result, Ok(1));
    assert_ne!(first.user_data, second.user_data);
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
}

/// A server of wire-protocol version 1: its CHALLENGE carries version 1 in the header and as
/// the highest version served, and it reads nothing after that.
fn version_1_server() -> SocketAddr {
    fake_server(|mut s| {
        let mut out = Vec::new();
        let f = Frame {
            req_id: 0,
            namespace: 0,
            body: Body::Challenge {
                server_nonce: [1; 32],
                max_version: 1,
            },
        };
        encode(&mut out, &f, false);
        out[4] = 1;
        if s.write_all(&out).is_ok() {
            drain(&mut s);
        }
    })
}

#[test]
fn a_server_of_another_protocol_version_is_refused_by_name() {
    let addr = version_1_server();
    let err = Client::connect(config(&[addr]))
        .err()
        .expect("connect must fail");
    assert_eq!(
        err,
        ClientError::Version {
            addr,
            server: 1,
            client: PROTOCOL_VERSION
        }
    );
    let msg = err.to_string();
    assert!(
        msg.contains("speaks wire protocol version 1") && msg.contains("same release"),
        "{msg}"
    );
}

/// A client of the previous wire version (3: no seal in a wire page) is answered with
/// `VersionUnsupported` naming both versions, and its connection closed; nothing is stored.
#[test]
fn a_client_of_an_older_protocol_version_is_refused_by_name() {
    let srv = Server::start(ServerConfig::loopback(1 << 24)).unwrap();
    let mut old = TcpStream::connect(srv.addr()).unwrap();
    old.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut chal = [0u8; 32 + 33];
    old.read_exact(&mut chal).unwrap();
    let hello = Frame {
        req_id: 0,
        namespace: 0,
        body: Body::Hello {
            key_id: [0; 8],
            client_nonce: [3; 32],
            mac: [0; 32],
        },
    };
    let mut out = Vec::new();
    encode(&mut out, &hello, false);
    out[4] = PROTOCOL_VERSION - 1;
    old.write_all(&out).unwrap();
    let mut answer = Vec::new();
    old.read_to_end(&mut answer).unwrap();
    let (f, used) = decode(&answer).expect("an error frame of this server's version");
    assert_eq!(used, answer.len(), "then the connection closes");
    let Body::Error { status, message } = f.body else {
        panic!("expected an error answer, got {:?}", f.body);
    };
    assert_eq!(status, farvm_memproto::Status::VersionUnsupported);
    let (ours, theirs) = (PROTOCOL_VERSION, PROTOCOL_VERSION - 1);
    assert!(
        message.contains(&format!(
            "speaks wire protocol version {ours}, the client {theirs}"
        )),
        "{message}"
    );
    assert_eq!(srv.pages_stored(), 0);
}

#[test]
fn requests_time_out_with_a_typed_error() {
    let addr = silent_server();
    let mut cfg = config(&[addr]);
    cfg.timeout = Duration::from_millis(300);
    let c = Client::connect(cfg).unwrap();
    let t0 = Instant::now();
    // The first write places the slab; the silent server never answers.
    let r = c.write(1, 0, &page(1, 0, 0));
    assert!(
        matches!(
            r,
            Err(ClientError::NoLiveReplica) | Err(ClientError::Timeout)
        ),
        "{r:?}"
    );
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "timeout not bounded: {:?}",
        t0.elapsed()
    );
    assert_eq!(c.stats().dead_servers, 1);
}

#[test]
fn malformed_frame_closes_only_that_connection() {
    let srv = Server::start(ServerConfig {
        metrics: Some("127.0.0.1:0".parse().unwrap()),
        ..ServerConfig::loopback(1 << 24)
    })
    .unwrap();
    let good = client(&[srv.addr()]);
    good.write(1, 0, &page(1, 0, 0)).unwrap();
    let mut bad = TcpStream::connect(srv.addr()).unwrap();
    let mut chal = [0u8; 32 + 33];
    bad.read_exact(&mut chal).unwrap();
    assert!(decode(&chal).is_ok());
    bad.write_all(&[0xde; 64]).unwrap();
    bad.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 16];
    assert_eq!(
        bad.read(&mut b).unwrap_or(0),
        0,
        "server must close the bad connection"
    );
    // The good client is unaffected.
    let mut out = vec![0u8; PAGE_SIZE];
    assert_eq!(good.read(1, 0, &mut out).unwrap(), vec![true]);
    assert_eq!(out, page(1, 0, 0));
    // Metrics over HTTP.
    let mut m = TcpStream::connect(srv.metrics_addr().unwrap()).unwrap();
    m.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    m.read_to_string(&mut text).unwrap();
    assert!(text.starts_with("HTTP/1.1 200 OK"));
    assert!(text.contains("farvm_memserver_pages_stored 1"), "{text}");
    assert!(text.contains("farvm_memserver_malformed_frames_total 1"));
    assert!(text.contains("farvm_memserver_op_latency_seconds_count{op=\"read\"} 1"));
}

/// The three ways to wait: inline `submit_wait`, a polled channel + `wait_completion`, and a
/// plain channel fed by the background receiver; plus the blocking read's presence flags.
#[test]
fn all_completion_paths_deliver_the_right_pages() {
    let servers = start_servers(2, 1 << 14);
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.addr()).collect();
    let c = client(&addrs);
    let pages: Vec<u64> = (0..512).collect();
    let data: Vec<u8> = pages.iter().flat_map(|&p| page(5, p, 3)).collect();
    c.write(5, 0, &data).unwrap();
    // Inline demand read.
    let mut io = IoBuf::new(8);
    io.set_scatter(&[3, 700, 9]).unwrap();
    let done = c.submit_wait(Op::Read, 5, io);
    assert_eq!(done.result, Ok(2));
    assert!(done.io.is_present(0) && !done.io.is_present(1) && done.io.is_present(2));
    assert_eq!(done.io.page(2), &page(5, 9, 3)[..]);
    // Polled: 16 outstanding, collected on this thread.
    let (tx, rx) = crossbeam_channel::bounded(16);
    for i in 0..16u64 {
        let mut io = IoBuf::new(4);
        io.set_run(i * 4, 4).unwrap();
        c.submit(
            Request {
                op: Op::Read,
                ns: 5,
                priority: Priority::Prefetch,
                io,
                user_data: i,
            },
            ReplyTo::Polled(&tx),
        )
        .unwrap();
    }
    let mut seen = [false; 16];
    for _ in 0..16 {
        let d = c.wait_completion(&rx);
        assert_eq!(d.result, Ok(4));
        for k in 0..4 {
            let p = d.user_data * 4 + k as u64;
            assert_eq!(d.io.page(k), &page(5, p, 3)[..]);
        }
        seen[d.user_data as usize] = true;
    }
    assert!(seen.iter().all(|&s| s));
    // Polled requests whose caller stops polling are still delivered by the background
    // receiver (within its park interval).
    let mut io = IoBuf::new(1);
    io.set_run(1, 1).unwrap();
    c.submit(
        Request {
            op: Op::Read,
            ns: 5,
            priority: Priority::Prefetch,
            io,
            user_data: 99,
        },
        ReplyTo::Polled(&tx),
    )
    .unwrap();
    let d = rx
        .recv_timeout(Duration::from_secs(2))
        .expect("background delivery");
    assert_eq!((d.user_data, d.result), (99, Ok(1)));
    // Blocking read with presence: absent pages are zero-filled.
    let mut out = vec![0xffu8; 2 * PAGE_SIZE];
    let present = c.read(5, 511, &mut out).unwrap();
    assert_eq!(present, [true, false]);
    assert_eq!(&out[..PAGE_SIZE], &page(5, 511, 3)[..]);
    assert!(out[PAGE_SIZE..2 * PAGE_SIZE].iter().all(|&b| b == 0));
}
