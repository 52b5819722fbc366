//! A client whose placement a memory pool owns (`ClientConfig::pool_placement`) never puts a
//! replica on a server of its own choosing: a slab that lost a replica waits for the pool to
//! name a server (its home) and is filled there; a home server that restarted empty is
//! refilled where the pool's records say the replica is; a full server's slab moves only
//! onto a server of its home. Every page stays readable throughout.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use farvm_memclient::{Client, ClientConfig, ClientError};
use farvm_memproto::PAGE_SIZE;

const NS: u64 = 9;
/// Client slabs of 1024 pages (`common::config`).
const SLAB: u64 = 1024;

/// A client of `servers` with R = `r`, whose one pool slab (so every client slab) has its
/// home on the servers at `home`.
fn pool_client(servers: &[SocketAddr], r: usize, home: &[u16]) -> Client {
    let mut cfg: ClientConfig = config(servers);
    cfg.replication = Some(r);
    cfg.slab_homes = vec![home.to_vec()];
    cfg.pool_placement = true;
    cfg.timeout = Duration::from_millis(500);
    Client::connect(cfg).expect("client connects")
}

fn write(c: &Client, first: u64, count: u64, v: u64) {
    let data: Vec<u8> = (first..first + count)
        .flat_map(|p| page(NS, p, v))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    // A write that met a server dying is failed and retried, as the paging engine does.
    while let Err(e) = c.write(NS, first, &data) {
        assert!(Instant::now() < deadline, "the write never landed: {e}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn verify(c: &Client, first: u64, count: u64, v: u64) {
    let mut buf = vec![0u8; count as usize * PAGE_SIZE];
    let present = c.read(NS, first, &mut buf).expect("read");
    for (i, p) in present.iter().enumerate() {
        let pn = first + i as u64;
        assert!(*p, "page {pn} lost");
        assert!(
            buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE] == page(NS, pn, v)[..],
            "page {pn} stale or wrong"
        );
    }
}

/// Bound on waits for the client's own recovery (fills, rejoins).
const PATIENCE: Duration = Duration::from_secs(30);

#[test]
fn a_lost_replica_waits_for_the_pools_choice_and_is_filled_there() {
    let mut procs: Vec<ServerProc> = (0..4).map(|_| ServerProc::spawn("64M")).collect();
    let addrs: Vec<SocketAddr> = procs.iter().map(|p| p.addr).collect();
    let c = pool_client(&addrs, 2, &[0, 1]);
    write(&c, 0, 3 * SLAB, 1);
    assert_eq!(c.slabs_on(NS, addrs[0]), vec![0, 1, 2]);
    assert_eq!(c.slabs_on(NS, addrs[1]), vec![0, 1, 2]);

    procs[1].kill();
    // Writes meet the dead server and take it out of service.
    write(&c, 0, 3 * SLAB, 2);
    wait_for("the dead server noticed", &c, PATIENCE, |c| {
        c.stats().dead_servers == 1
    });
    // The client has spare servers 2 and 3 but puts nothing there: the pool has not chosen.
    std::thread::sleep(Duration::from_secs(1));
    let st = c.stats();
    assert_eq!((st.degraded_slabs, st.slabs_rereplicated), (3, 0), "{st:?}");
    assert!(c.slabs_on(NS, addrs[2]).is_empty() && c.slabs_on(NS, addrs[3]).is_empty());
    verify(&c, 0, 3 * SLAB, 2);

    // The pool's repair picks server 3 (as its follower does: the slab's new home).
    c.set_slab_home(0, &[addrs[0].into(), addrs[3].into()])
        .expect("pool slab 0 exists");
    wait_for("the slabs refilled", &c, PATIENCE, |c| {
        c.stats().degraded_slabs == 0
    });
    assert_eq!(c.slabs_on(NS, addrs[3]), vec![0, 1, 2]);
    assert!(
        c.slabs_on(NS, addrs[2]).is_empty(),
        "a server the pool did not choose"
    );
    // Server 3 holds every page: losing server 0 too loses nothing.
    procs[0].kill();
    verify(&c, 0, 3 * SLAB, 2);
}

#[test]
fn a_home_server_that_restarted_empty_is_refilled_where_the_pool_records_it() {
    let mut procs: Vec<ServerProc> = (0..3).map(|_| ServerProc::spawn("64M")).collect();
    let addrs: Vec<SocketAddr> = procs.iter().map(|p| p.addr).collect();
    let c = pool_client(&addrs, 2, &[0, 1]);
    write(&c, 0, 2 * SLAB, 1);

    procs[1].kill();
    procs[1] = ServerProc::spawn_at(&addrs[1].to_string(), "64M");
    write(&c, 0, 2 * SLAB, 2);
    wait_for("the restarted server back in service", &c, PATIENCE, |c| {
        c.stats().rejoined_servers >= 1
    });
    wait_for("the slabs refilled", &c, PATIENCE, |c| {
        c.stats().degraded_slabs == 0
    });
    assert_eq!(c.slabs_on(NS, addrs[1]), vec![0, 1]);
    assert!(
        c.slabs_on(NS, addrs[2]).is_empty(),
        "a server the pool did not choose"
    );
    let st = c.stat(NS);
    assert!(st[2].as_ref().unwrap().as_ref().unwrap().namespace_pages == 0);
    // The refilled server holds every page: losing server 0 loses nothing.
    procs[0].kill();
    verify(&c, 0, 2 * SLAB, 2);
}

#[test]
fn a_full_servers_slab_moves_only_onto_a_server_of_its_pool_home() {
    // Server 0 holds 256 pages and is the slab's home; server 1 has room but is not chosen.
    let small = ServerProc::spawn("1M");
    let big = ServerProc::spawn("64M");
    let c = pool_client(&[small.addr, big.addr], 1, &[0]);
    write(&c, 0, 200, 1);
    let data: Vec<u8> = (200..600).flat_map(|p| page(NS, p, 1)).collect();
    let mut full = 0;
    for _ in 0..10 {
        match c.write(NS, 200, &data) {
            Err(ClientError::CapacityExhausted) => full += 1,
            other => panic!("a full home server answered {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(full, 10);
    assert_eq!(c.stats().replicas_moved, 0);
    assert_eq!(c.slabs_on(NS, small.addr), vec![0]);
    assert!(c.slabs_on(NS, big.addr).is_empty());

    // The pool moves the slab's home to server 1: the next full answer moves it there.
    c.set_slab_home(0, &[big.addr.into()]).unwrap();
    write(&c, 200, 400, 1);
    assert_eq!(c.stats().replicas_moved, 1);
    assert_eq!(c.slabs_on(NS, big.addr), vec![0]);
    assert!(c.slabs_on(NS, small.addr).is_empty());
    verify(&c, 0, 600, 1);
}

#[test]
fn pool_placement_without_homes_is_refused() {
    let server = ServerProc::spawn("16M");
    let mut cfg = config(&[server.addr]);
    cfg.pool_placement = true;
    assert!(matches!(
        Client::connect(cfg),
        Err(ClientError::InvalidRequest(_))
    ));
}

#[test]
fn a_frozen_home_server_that_comes_back_is_refilled_where_the_pool_kept_it_and_scrubbed_elsewhere()
{
    let mut procs: Vec<ServerProc> = (0..3).map(|_| ServerProc::spawn("64M")).collect();
    let addrs: Vec<SocketAddr> = procs.iter().map(|p| p.addr).collect();
    // Two pool slabs, both on servers 0 and 1: client slabs 0 and 2 are pool slab 0's, 1 and
    // 3 pool slab 1's.
    let mut cfg: ClientConfig = config(&addrs);
    cfg.replication = Some(2);
    cfg.slab_homes = vec![vec![0, 1], vec![0, 1]];
    cfg.pool_placement = true;
    cfg.timeout = Duration::from_millis(300);
    let c = Client::connect(cfg).expect("client connects");
    write(&c, 0, 4 * SLAB, 1);
    procs[1].signal(libc::SIGSTOP);
    write(&c, 0, 4 * SLAB, 2);
    wait_for("the frozen server noticed", &c, PATIENCE, |c| {
        c.stats().dead_servers == 1
    });
    // The pool repairs pool slab 1 onto server 2; pool slab 0 keeps server 1 in its home.
    c.set_slab_home(1, &[addrs[0].into(), addrs[2].into()])
        .unwrap();
    wait_for("pool slab 1 refilled", &c, PATIENCE, |c| {
        c.slabs_on(NS, addrs[2]) == [1, 3]
    });
    procs[1].signal(libc::SIGCONT);
    wait_for("everything at R = 2", &c, PATIENCE, |c| {
        c.stats().rejoined_servers >= 1 && c.stats().degraded_slabs == 0
    });
    assert_eq!(c.slabs_on(NS, addrs[1]), vec![0, 2]);
    wait_for(
        "server 1's copies of slabs 1 and 3 discarded",
        &c,
        PATIENCE,
        |c| {
            c.stat(NS)[1]
                .as_ref()
                .and_then(|r| r.as_ref().ok())
                .is_some_and(|st| st.namespace_pages == 2 * SLAB)
        },
    );
    // Server 0 goes: slabs 0 and 2 are read from server 1, 1 and 3 from server 2.
    procs[0].kill();
    verify(&c, 0, 4 * SLAB, 2);
}
