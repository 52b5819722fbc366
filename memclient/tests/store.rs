//! The page store (`PageStore`, the engine's `RemoteStore`) against real servers and fake
//! ones: reads and writes in runs and scatter lists, absent pages, synchronous demand reads,
//! a dead server, and reads whose response is cut short or carries a bad page — whose pages
//! must never be reported present, whatever bytes landed in them.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use farvm_memclient::{Client, ClientConfig, ClientError, IoBuf, PageStore, StoreConfig};
use farvm_memproto::frame::{decode, encode, Body, Frame, StatInfo, WIRE_PAGE};
use farvm_memproto::{wire_crc, PAGE_SIZE, PROTOCOL_VERSION, SEAL_LEN};
use farvm_memserver::server::{Server, ServerConfig};
use farvm_pageio::{
    Completion, CompletionSink, Op, PageBuf, Priority, ReadReq, RemoteStore, Status, StoreError,
    Version, WriteReq,
};

/// A demand read of `page` into `dst` (unsealed: the client has no page key).
fn demand(page: u64, dst: PageBuf) -> ReadReq {
    ReadReq {
        page,
        priority: Priority::Demand,
        dst,
        version: Version::UNKNOWN,
    }
}

struct Collect(StdMutex<Vec<Completion>>);
impl CompletionSink for Collect {
    fn complete(&self, batch: &[Completion]) {
        self.0.lock().unwrap().extend_from_slice(batch);
    }
}

#[repr(C, align(4096))]
struct Pages([[u8; PAGE_SIZE]; 80]);

fn wait_for(sink: &Collect, n: usize) -> Vec<Completion> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        {
            let g = sink.0.lock().unwrap();
            if g.len() >= n {
                return g.clone();
            }
        }
        assert!(Instant::now() < deadline, "completions did not arrive");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn writes_then_reads_scatter_and_runs_with_absent_pages() {
    let server = Server::start(ServerConfig::loopback(64 << 20)).unwrap();
    let client = Arc::new(Client::connect(ClientConfig::new(vec![server.addr()])).unwrap());
    let store = PageStore::new(
        client,
        StoreConfig {
            namespace: 7,
            slots: 4,
        },
    );
    let sink = Arc::new(Collect(StdMutex::new(Vec::new())));
    store.attach(sink.clone()).unwrap();
    let mut src = Box::new(Pages([[0; PAGE_SIZE]; 80]));
    for (i, p) in src.0.iter_mut().enumerate() {
        p.fill(i as u8 + 1);
    }
    // 40 contiguous pages (two groups) + 20 scattered ones.
    let pages: Vec<u64> = (100..140).chain((0..20).map(|i| 1000 + 3 * i)).collect();
    let writes: Vec<WriteReq> = pages
        .iter()
        .enumerate()
        .map(|(i, &p)| WriteReq {
            page: p,
            // SAFETY: `src` outlives the requests (we wait for every completion).
            src: unsafe { PageBuf::new(src.0[i].as_mut_ptr()) }.unwrap(),
            version: Version::UNKNOWN,
        })
        .collect();
    store.write(&writes).unwrap();
    let done = wait_for(&sink, pages.len());
    assert!(done
        .iter()
        .all(|c| c.op == Op::Write && c.status == Status::Ok));
    sink.0.lock().unwrap().clear();
    let mut dst = Box::new(Pages([[0; PAGE_SIZE]; 80]));
    let mut reads: Vec<ReadReq> = pages
        .iter()
        .enumerate()
        .map(|(i, &p)| ReadReq {
            page: p,
            priority: if i % 2 == 0 {
                Priority::Demand
            } else {
                Priority::Prefetch
            },
            // SAFETY: `dst` outlives the requests.
            dst: unsafe { PageBuf::new(dst.0[i].as_mut_ptr()) }.unwrap(),
            version: Version::UNKNOWN,
        })
        .collect();
    reads.push(ReadReq {
        page: 5000,
        priority: Priority::Demand,
        // SAFETY: as above.
        dst: unsafe { PageBuf::new(dst.0[79].as_mut_ptr()) }.unwrap(),
        version: Version::UNKNOWN,
    });
    store.read(&reads).unwrap();
    let done = wait_for(&sink, reads.len());
    for c in &done {
        if c.page == 5000 {
            assert_eq!(c.status, Status::Absent);
        } else {
            assert_eq!(c.status, Status::Ok, "page {}", c.page);
        }
    }
    for i in 0..pages.len() {
        assert!(dst.0[i].iter().all(|&b| b == i as u8 + 1), "page {i}");
    }
    // Every page read landed in the engine's pages, copied once from a receive buffer or
    // received in place: nothing went through a client buffer.
    let st = store.client().stats();
    assert_eq!(
        st.read_bytes_in_place + st.read_bytes_copied,
        (pages.len() * WIRE_PAGE) as u64,
        "{st:?}"
    );
    // Synchronous demand reads (the fault handler's path) see the same data, and their
    // completion comes back as the return value, not through the sink.
    sink.0.lock().unwrap().clear();
    let mut one = Box::new(Pages([[0; PAGE_SIZE]; 80]));
    for (i, &p) in pages.iter().enumerate().step_by(7) {
        // SAFETY: `one` outlives the call, which returns only once the data has landed.
        let b = unsafe { PageBuf::new(one.0[0].as_mut_ptr()) }.unwrap();
        assert_eq!(
            store.read_now(&demand(p, b)).map(|(s, _)| s),
            Some(Status::Ok),
            "page {p}"
        );
        assert!(one.0[0].iter().all(|&x| x == i as u8 + 1), "page {p}");
    }
    // SAFETY: as above.
    let b = unsafe { PageBuf::new(one.0[1].as_mut_ptr()) }.unwrap();
    assert_eq!(
        store.read_now(&demand(5000, b)).map(|(s, _)| s),
        Some(Status::Absent)
    );
    assert!(sink.0.lock().unwrap().is_empty());
    store.discard(&[100, 101, 102, 1000]).unwrap();
    store.stop();
    // SAFETY: as above.
    let b = unsafe { PageBuf::new(one.0[2].as_mut_ptr()) }.unwrap();
    assert_eq!(
        store.read_now(&demand(120, b)).map(|(s, _)| s),
        Some(Status::Failed(StoreError::Closed)),
        "a stopped store refuses"
    );
}

#[test]
fn a_dead_server_fails_requests_cleanly() {
    let server = Server::start(ServerConfig::loopback(16 << 20)).unwrap();
    let mut cfg = ClientConfig::new(vec![server.addr()]);
    cfg.timeout = Duration::from_millis(300);
    let client = Arc::new(Client::connect(cfg).unwrap());
    let store = PageStore::new(
        client,
        StoreConfig {
            namespace: 1,
            slots: 2,
        },
    );
    let sink = Arc::new(Collect(StdMutex::new(Vec::new())));
    store.attach(sink.clone()).unwrap();
    server.shutdown();
    let mut page = Box::new(Pages([[7; PAGE_SIZE]; 80]));
    let w = [WriteReq {
        page: 3,
        // SAFETY: `page` outlives the request.
        src: unsafe { PageBuf::new(page.0[0].as_mut_ptr()) }.unwrap(),
        version: Version::UNKNOWN,
    }];
    match store.write(&w) {
        Err(_) => {}
        Ok(()) => {
            let done = wait_for(&sink, 1);
            assert!(matches!(done[0].status, Status::Failed(_)));
        }
    }
    store.stop();
}

/// How a fake server answers a READ.
#[derive(Clone, Copy)]
enum ReadAnswer {
    /// Header, bitmap and the first half of the pages, then the connection is closed.
    Cut,
    /// Every page, page 3's crc32c wrong.
    BadCrc,
    /// Every page, but only after a pause far longer than a demand waiter polls, and in two
    /// parts (header and the first bytes of the first page, then the rest) with another
    /// pause between them.
    Late,
}

/// The bytes a fake server holds for `page`.
fn fake_content(page: u64) -> [u8; PAGE_SIZE] {
    [(page % 251) as u8 + 1; PAGE_SIZE]
}

/// The server side of the handshake in open mode (the client does not check the MAC then).
fn fake_handshake(s: &mut TcpStream) -> std::io::Result<()> {
    let mut out = Vec::new();
    let f = Frame {
        req_id: 0,
        namespace: 0,
        body: Body::Challenge {
            server_nonce: [1; 32],
            max_version: PROTOCOL_VERSION,
        },
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

/// A fake server: acknowledges writes and STATs (with more free room than any real test
/// server, so placement puts it first), answers READs per `answer`.
fn fake_server(answer: ReadAnswer) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || serve_fake(s, answer));
        }
    });
    addr
}

fn serve_fake(mut s: TcpStream, answer: ReadAnswer) {
    if fake_handshake(&mut s).is_err() {
        return;
    }
    let mut inbuf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        let (out, cut) = match decode(&inbuf) {
            Ok((f, used)) => {
                let (req_id, namespace) = (f.req_id, f.namespace);
                let mut out = Vec::new();
                let mut cut = None;
                let reply = |body| Frame {
                    req_id,
                    namespace,
                    body,
                };
                match f.body {
                    Body::Write { sel, .. } => encode(
                        &mut out,
                        &reply(Body::WriteResp {
                            written: sel.len() as u32,
                        }),
                        false,
                    ),
                    Body::Discard(_) => {
                        encode(&mut out, &reply(Body::DiscardResp { freed: 0 }), false)
                    }
                    Body::Read(sel) => {
                        let n = sel.len();
                        let mut pages = Vec::with_capacity(n * WIRE_PAGE);
                        for i in 0..n {
                            let data = fake_content(sel.index(i));
                            let mut crc = wire_crc(&[0; SEAL_LEN], &data);
                            if matches!(answer, ReadAnswer::BadCrc) && i == 3 {
                                crc ^= 1;
                            }
                            pages.extend_from_slice(&crc.to_le_bytes());
                            pages.extend_from_slice(&[0; SEAL_LEN]);
                            pages.extend_from_slice(&data);
                        }
                        let bitmap = vec![0xffu8; n.div_ceil(8)];
                        let mut bitmap = bitmap;
                        if n % 8 != 0 {
                            *bitmap.last_mut().unwrap() = (1u8 << (n % 8)) - 1;
                        }
                        let body = Body::ReadResp {
                            count: n as u32,
                            bitmap: &bitmap,
                            pages: &pages,
                        };
                        encode(&mut out, &reply(body), false);
                        if matches!(answer, ReadAnswer::Cut) {
                            cut = Some(out.len() - (n - n / 2) * WIRE_PAGE);
                        }
                    }
                    _ => encode(
                        &mut out,
                        &reply(Body::StatResp(StatInfo {
                            namespace_pages: 0,
                            used_pages: 0,
                            capacity_pages: 1 << 30,
                            instance: 7,
                        })),
                        false,
                    ),
                }
                inbuf.drain(..used);
                (out, cut)
            }
            Err(_) => {
                match s.read(&mut chunk) {
                    Ok(n) if n > 0 => inbuf.extend_from_slice(&chunk[..n]),
                    _ => return,
                }
                continue;
            }
        };
        if matches!(answer, ReadAnswer::Late) && out.len() > 64 {
            std::thread::sleep(Duration::from_millis(5));
            if s.write_all(&out[..64]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
            if s.write_all(&out[64..]).is_err() {
                return;
            }
            continue;
        }
        match cut {
            Some(at) => {
                let _ = s.write_all(&out[..at]);
                let _ = s.flush();
                // Give the client time to receive the part it got before the end.
                std::thread::sleep(Duration::from_millis(50));
                let _ = s.shutdown(std::net::Shutdown::Both);
                return;
            }
            None => {
                if s.write_all(&out).is_err() {
                    return;
                }
            }
        }
    }
}

/// Eight engine pages for a read, filled with a marker.
fn read_reqs(dst: &mut Pages, first: u64) -> Vec<ReadReq> {
    (0..8)
        .map(|i| {
            dst.0[i].fill(0xee);
            ReadReq {
                page: first + i as u64,
                priority: Priority::Prefetch,
                // SAFETY: `dst` outlives the requests (the tests wait for every completion).
                dst: unsafe { PageBuf::new(dst.0[i].as_mut_ptr()) }.unwrap(),
                version: Version::UNKNOWN,
            }
        })
        .collect()
}

/// Writes pages `first..first+8` through `store` so their slab is placed.
fn place(store: &PageStore, sink: &Collect, first: u64) {
    let mut src = Box::new(Pages([[0; PAGE_SIZE]; 80]));
    let writes: Vec<WriteReq> = (0..8)
        .map(|i| {
            src.0[i] = fake_content(first + i as u64);
            WriteReq {
                page: first + i as u64,
                // SAFETY: `src` outlives the requests (we wait for their completions).
                src: unsafe { PageBuf::new(src.0[i].as_mut_ptr()) }.unwrap(),
                version: Version::UNKNOWN,
            }
        })
        .collect();
    store.write(&writes).unwrap();
    let done = wait_for(sink, 8);
    assert!(done.iter().all(|c| c.status == Status::Ok), "{done:?}");
    sink.0.lock().unwrap().clear();
}

/// A store on `servers`; `demand_poll`: `ClientConfig::demand_poll`.
fn store_on(
    servers: Vec<SocketAddr>,
    replication: usize,
    demand_poll: Duration,
) -> (Arc<PageStore>, Arc<Collect>) {
    let mut cfg = ClientConfig::new(servers);
    cfg.demand_poll = demand_poll;
    cfg.replication = Some(replication);
    cfg.timeout = Duration::from_secs(5);
    let client = Arc::new(Client::connect(cfg).unwrap());
    let store = PageStore::new(
        client,
        StoreConfig {
            namespace: 9,
            slots: 4,
        },
    );
    let sink = Arc::new(Collect(StdMutex::new(Vec::new())));
    store.attach(sink.clone()).unwrap();
    (store, sink)
}

/// A multi-page read whose response stops halfway (the server closes the connection): half
/// the pages have landed in the engine's buffers, but none is reported present. With no
/// other replica, every page fails.
#[test]
fn a_read_cut_short_reports_every_page_failed() {
    let (store, sink) = store_on(vec![fake_server(ReadAnswer::Cut)], 1, Duration::ZERO);
    place(&store, &sink, 16);
    let mut dst = Box::new(Pages([[0; PAGE_SIZE]; 80]));
    store.read(&read_reqs(&mut dst, 16)).unwrap();
    let done = wait_for(&sink, 8);
    assert_eq!(done.len(), 8);
    for c in &done {
        assert_eq!(c.op, Op::Read);
        assert!(
            matches!(c.status, Status::Failed(StoreError::Unavailable)),
            "page {} of a cut response: {:?}",
            c.page,
            c.status
        );
    }
    // The first pages did land (received straight into the engine's buffers) — and still
    // count as failed.
    assert_eq!(dst.0[0], fake_content(16));
    store.stop();
}

/// A multi-page read with one bad page: the whole request fails (no page present), through
/// the store and through the client API alike.
#[test]
fn a_read_with_one_bad_page_reports_no_page_present() {
    let addr = fake_server(ReadAnswer::BadCrc);
    let (store, sink) = store_on(vec![addr], 1, Duration::ZERO);
    place(&store, &sink, 32);
    let mut dst = Box::new(Pages([[0; PAGE_SIZE]; 80]));
    store.read(&read_reqs(&mut dst, 32)).unwrap();
    let done = wait_for(&sink, 8);
    for c in &done {
        assert_eq!(
            c.status,
            Status::Failed(StoreError::Protocol),
            "page {}",
            c.page
        );
    }
    let c = store.client();
    let mut io = IoBuf::new(8);
    io.set_run(32, 8).unwrap();
    let d = c.submit_wait(Op::Read, 9, io);
    assert_eq!(d.result, Err(ClientError::ChecksumMismatch));
    assert_eq!(d.io.present_count(), 0);
    store.stop();
}

/// A read cut short on the first replica is retried on the second: the right bytes end up in
/// the engine's buffers over whatever the first one left there.
#[test]
fn a_read_cut_short_fails_over_and_lands_the_right_pages() {
    let real = Server::start(ServerConfig::loopback(16 << 20)).unwrap();
    // The fake reports far more free room: placement puts it first, so reads go to it first.
    let (store, sink) = store_on(
        vec![fake_server(ReadAnswer::Cut), real.addr()],
        2,
        Duration::ZERO,
    );
    place(&store, &sink, 48);
    let mut dst = Box::new(Pages([[0; PAGE_SIZE]; 80]));
    store.read(&read_reqs(&mut dst, 48)).unwrap();
    let done = wait_for(&sink, 8);
    for c in &done {
        assert_eq!(c.status, Status::Ok, "page {}", c.page);
    }
    for i in 0..8 {
        assert_eq!(dst.0[i], fake_content(48 + i as u64), "page {}", 48 + i);
    }
    let st = store.client().stats();
    assert_eq!((st.dead_servers, st.read_failovers), (1, 1), "{st:?}");
    store.stop();
}

/// A demand read (`read_now`, received on the calling thread, which here polls briefly before
/// it blocks: `ClientConfig::demand_poll`) whose response comes well after the poll gave up, in two parts: the waiter blocks
/// and still lands the page whole; demand reads answered at once (a real server) land too.
#[test]
fn a_demand_read_lands_whether_its_response_comes_during_the_poll_or_after_it() {
    let poll = Duration::from_micros(50);
    let (store, sink) = store_on(vec![fake_server(ReadAnswer::Late)], 1, poll);
    place(&store, &sink, 0);
    let mut dst = Box::new(Pages([[0; PAGE_SIZE]; 80]));
    for (i, p) in [7u64, 3, 5].into_iter().enumerate() {
        // SAFETY: `dst` outlives the call, which returns once the data has landed.
        let b = unsafe { PageBuf::new(dst.0[i].as_mut_ptr()) }.unwrap();
        assert_eq!(
            store.read_now(&demand(p, b)).map(|(s, _)| s),
            Some(Status::Ok),
            "page {p}"
        );
        assert_eq!(dst.0[i], fake_content(p), "page {p}");
    }
    store.stop();

    let real = Server::start(ServerConfig::loopback(16 << 20)).unwrap();
    let (store, sink) = store_on(vec![real.addr()], 1, poll);
    place(&store, &sink, 0);
    for round in 0..50 {
        let p = round % 8;
        // SAFETY: as above.
        let b = unsafe { PageBuf::new(dst.0[10].as_mut_ptr()) }.unwrap();
        assert_eq!(
            store.read_now(&demand(p, b)).map(|(s, _)| s),
            Some(Status::Ok),
            "page {p}"
        );
        assert_eq!(dst.0[10], fake_content(p), "page {p}");
    }
    store.stop();
}
