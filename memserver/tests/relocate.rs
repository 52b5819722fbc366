//! Replicas that move while the slab is in use: a write that finds its server full is failed
//! with CapacityExhausted, the slab's replica is moved to a server with room, and the retried
//! write lands there (never hangs, no page lost); a replica moved on request (a pool drain)
//! keeps every page and leaves nothing on the old server, also when its target is a server added
//! to the client while it runs (a pool server that joined later).

mod common;

use std::time::{Duration, Instant};

use common::*;
use farvm_memclient::{Client, ClientError};
use farvm_memproto::PAGE_SIZE;

const NS: u64 = 7;

/// Writes `count` pages from `first` (version `v`), retrying a batch that found a full server
/// until it lands (bounded: a hang fails the test).
fn write_retrying(c: &Client, first: u64, count: u64, v: u64) -> u32 {
    let mut full_answers = 0;
    for chunk in (first..first + count).step_by(64) {
        let n = 64.min(first + count - chunk);
        let data: Vec<u8> = (chunk..chunk + n).flat_map(|p| page(NS, p, v)).collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match c.write(NS, chunk, &data) {
                Ok(()) => break,
                Err(ClientError::CapacityExhausted) => {
                    full_answers += 1;
                    assert!(Instant::now() < deadline, "the write never found room");
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("write at {chunk}: {e}"),
            }
        }
    }
    full_answers
}

/// A writer that rewrites slab 1 (pages 1024..2048) with versions 2 to 5 while the caller
/// moves it.
fn rewrite_slab_1(c: &std::sync::Arc<Client>) -> std::thread::JoinHandle<()> {
    let c = c.clone();
    std::thread::spawn(move || {
        for v in 2..6 {
            write_retrying(&c, 1024, 1024, v);
        }
    })
}

fn verify(c: &Client, first: u64, count: u64, v: u64) {
    let mut buf = vec![0u8; count as usize * PAGE_SIZE];
    let present = c.read(NS, first, &mut buf).unwrap();
    for (i, p) in present.iter().enumerate() {
        let pn = first + i as u64;
        assert!(*p, "page {pn} lost");
        assert_eq!(
            &buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE],
            &page(NS, pn, v)[..],
            "page {pn} stale or wrong"
        );
    }
}

#[test]
fn a_write_that_finds_its_server_full_is_re_placed_and_lands() {
    // Server 0 holds 256 pages; the slab's home is there; server 1 has room.
    let small = ServerProc::spawn("1M");
    let big = ServerProc::spawn("64M");
    let mut cfg = config(&[small.addr, big.addr]);
    cfg.replication = Some(1);
    cfg.slab_homes = vec![vec![0]];
    let c = Client::connect(cfg).unwrap();
    // 200 pages fit; 600 do not.
    write_retrying(&c, 0, 200, 1);
    let full = write_retrying(&c, 200, 400, 1);
    assert!(full > 0, "the small server never answered full");
    verify(&c, 0, 600, 1);
    assert_eq!(c.stats().replicas_moved, 1);
    assert_eq!(c.slabs_on(NS, small.addr), Vec::<u64>::new());
    assert_eq!(c.slabs_on(NS, big.addr), vec![0]);
    // The full server's copy was discarded.
    let st = c.stat(NS);
    assert_eq!(st[0].as_ref().unwrap().as_ref().unwrap().namespace_pages, 0);
    assert_eq!(
        st[1].as_ref().unwrap().as_ref().unwrap().namespace_pages,
        600
    );
}

#[test]
fn a_replica_moved_on_request_keeps_every_page_while_writes_go_on() {
    let procs: Vec<ServerProc> = (0..3).map(|_| ServerProc::spawn("64M")).collect();
    let addrs: Vec<_> = procs.iter().map(|p| p.addr).collect();
    let mut cfg = config(&addrs);
    cfg.replication = Some(2);
    cfg.slab_homes = vec![vec![0, 1]];
    let c = std::sync::Arc::new(Client::connect(cfg).unwrap());
    write_retrying(&c, 0, 3 * 1024, 1); // 3 slabs, all on servers 0 and 1
    c.set_draining(addrs[0], true).unwrap();
    // Writers keep rewriting slab 1 while it moves.
    let w = rewrite_slab_1(&c);
    let moved = c.move_replicas(NS, addrs[0], addrs[2], &|_| true).unwrap();
    w.join().unwrap();
    assert_eq!(moved, 3);
    assert!(c.slabs_on(NS, addrs[0]).is_empty());
    verify(&c, 0, 1024, 1);
    verify(&c, 1024, 1024, 5);
    verify(&c, 2048, 1024, 1);
    let st = c.stat(NS);
    assert_eq!(st[0].as_ref().unwrap().as_ref().unwrap().namespace_pages, 0);
    assert_eq!(
        st[2].as_ref().unwrap().as_ref().unwrap().namespace_pages,
        3 * 1024
    );
    // A draining server takes no new slab.
    write_retrying(&c, 8 * 1024, 1, 1);
    assert!(!c.slabs_on(NS, addrs[0]).contains(&8));
}

#[test]
fn a_server_added_while_the_client_runs_takes_a_moved_replica_while_writes_go_on() {
    // The client starts with two servers; a third (a server that joined the pool later) is
    // added, and a replica moves onto it while the slab is rewritten.
    let procs: Vec<ServerProc> = (0..3).map(|_| ServerProc::spawn("64M")).collect();
    let addrs: Vec<_> = procs.iter().map(|p| p.addr).collect();
    let mut cfg = config(&addrs[..2]);
    cfg.replication = Some(2);
    cfg.slab_homes = vec![vec![0, 1]]; // one pool slab: every client slab's home
    let c = std::sync::Arc::new(Client::connect(cfg).unwrap());
    write_retrying(&c, 0, 2 * 1024, 1);
    assert!(
        c.move_replicas(NS, addrs[0], addrs[2], &|_| true).is_err(),
        "a server the client does not know is refused as a target"
    );
    assert!(c.add_server(addrs[2].into()).unwrap(), "the server is new");
    assert!(!c.add_server(addrs[2].into()).unwrap(), "added once");
    let w = rewrite_slab_1(&c);
    let moved = c.move_replicas(NS, addrs[0], addrs[2], &|_| true).unwrap();
    w.join().unwrap();
    assert_eq!(moved, 2);
    assert!(c.slabs_on(NS, addrs[0]).is_empty());
    assert_eq!(c.slabs_on(NS, addrs[2]), vec![0, 1]);
    verify(&c, 0, 1024, 1);
    verify(&c, 1024, 1024, 5);
    let st = c.stat(NS);
    assert_eq!(st.len(), 3, "the added server is one of the client's");
    assert_eq!(st[0].as_ref().unwrap().as_ref().unwrap().namespace_pages, 0);
    assert_eq!(
        st[2].as_ref().unwrap().as_ref().unwrap().namespace_pages,
        2 * 1024
    );
    // The pool slab's home follows the move: a slab first written now goes to the new
    // server, not back to the one it left (where the pool would not know of it).
    c.set_slab_home(0, &[addrs[2].into(), addrs[1].into()])
        .unwrap();
    write_retrying(&c, 3 * 1024, 1024, 1);
    assert_eq!(c.slabs_on(NS, addrs[2]), vec![0, 1, 3]);
    assert!(c.slabs_on(NS, addrs[0]).is_empty());
    assert!(
        c.set_slab_home(1, &[addrs[2].into()]).is_err(),
        "no pool slab 1"
    );
    // A server that does not answer is added out of service, and taken for nothing.
    let gone = {
        let p = ServerProc::spawn("64M");
        p.addr
    };
    assert!(c.add_server(gone.into()).unwrap());
    assert_eq!(c.stat(NS).len(), 4);
    assert!(c.stat(NS)[3].is_none(), "out of service");
    write_retrying(&c, 4 * 1024, 1024, 1);
    assert!(c.slabs_on(NS, gone).is_empty());
    verify(&c, 3 * 1024, 2048, 1);
}
