//! A randomized fault tester for the client's replica copies: writer threads keep rewriting
//! and re-reading pages (each page owned by one thread, as the paging engine owns a page while
//! it writes it back or reads it), while a chaos thread, driven by a seeded schedule, kills
//! and restarts memory servers, freezes them past the request timeout, moves slab replicas
//! between servers (a pool's drain and rebalance) and marks servers draining — every path that
//! copies or moves a slab races the writes.
//!
//! The property: every read returns, for each page, the last content a write of it reported
//! stored, or the content of a write that failed since (it may have reached a replica); a
//! page written once is never absent. Anything else — an older version, another page's
//! bytes, a hole — is a replica that missed a write, and the test fails naming the page,
//! the versions and the chaos events so far.
//!
//! `FARVM_CHAOS_SEED` replays a schedule (the seed is printed), `FARVM_CHAOS_SECS` sets how
//! long the chaos runs (default 12 s), `FARVM_CHAOS_ROUNDS` how many seeds one run tries
//! (default 2), `FARVM_CHAOS_ONLY` keeps only some kinds of fault (a comma list of `kill`,
//! `freeze`, `move`, `drain`), and `RUST_LOG` shows the client's own account.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use farvm_memclient::{Client, ClientError};
use farvm_memproto::PAGE_SIZE;

const NS: u64 = 11;
const SERVERS: usize = 5;
const SLAB_PAGES: u64 = 256;
const SLABS: u64 = 12;
const PAGES: u64 = SLAB_PAGES * SLABS;
/// Pages are owned by writer threads in blocks of this many (runs stay inside one block).
const BLOCK: u64 = 16;
const WRITERS: u64 = 3;

/// xorshift64*: a seeded, reproducible stream (the chaos schedule and the writers' choices).
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e3779b97f4a7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545f4914f6cdd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one writer knows of each of its pages: the version a write reported stored (0:
/// never), and versions whose write failed since (they may sit on a replica).
struct PageModel {
    stored: u64,
    maybe: Vec<u64>,
}

/// The chaos events so far, for the failure message.
#[derive(Default)]
struct Journal(Mutex<Vec<String>>);

impl Journal {
    fn note(&self, start: Instant, what: String) {
        let line = format!("{:>7.3}s {what}", start.elapsed().as_secs_f64());
        self.0.lock().unwrap().push(line);
    }
    fn dump(&self) -> String {
        self.0.lock().unwrap().join("\n")
    }
}

struct Shared {
    client: Client,
    addrs: Vec<SocketAddr>,
    stop: AtomicBool,
    version: AtomicU64,
    journal: Journal,
    start: Instant,
    /// The first violation seen (the test fails with it).
    violation: Mutex<Option<String>>,
}

impl Shared {
    fn fail(&self, what: String) {
        let mut v = self.violation.lock().unwrap();
        if v.is_none() {
            *v = Some(what);
        }
        self.stop.store(true, Ordering::Release);
    }
}

/// Which version `bytes` holds of page `p`, among `candidates`.
fn which_version(p: u64, bytes: &[u8], candidates: impl Iterator<Item = u64>) -> Option<u64> {
    let mut buf = vec![0u8; PAGE_SIZE];
    for v in candidates {
        page_content(NS, p, v, &mut buf);
        if buf == bytes {
            return Some(v);
        }
    }
    None
}

/// Checks a read of pages from `first` against `model` (which starts at page `model_first`);
/// Err names the violation.
fn check_read(
    first: u64,
    buf: &[u8],
    present: &[bool],
    model: &[PageModel],
    model_first: u64,
) -> Result<(), String> {
    for (i, &here) in present.iter().enumerate() {
        let p = first + i as u64;
        let m = &model[(p - model_first) as usize];
        let bytes = &buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
        if !here {
            if m.stored != 0 {
                return Err(format!(
                    "page {p} absent, though version {} was stored",
                    m.stored
                ));
            }
            continue;
        }
        let allowed = std::iter::once(m.stored)
            .filter(|&v| v != 0)
            .chain(m.maybe.iter().copied());
        if which_version(p, bytes, allowed).is_none() {
            let older = which_version(p, bytes, 1..m.stored.max(1));
            return Err(format!(
                "page {p}: read {}, expected version {} (or a failed write's {:?})",
                older.map_or("bytes of no version of this page".to_owned(), |v| format!(
                    "stale version {v}"
                )),
                m.stored,
                m.maybe
            ));
        }
    }
    Ok(())
}

fn writer(sh: &Shared, id: u64, seed: u64) -> Vec<PageModel> {
    let mut rng = Rng::new(seed ^ (id + 1).wrapping_mul(0xabcdef));
    let mut model: Vec<PageModel> = (0..PAGES)
        .map(|_| PageModel {
            stored: 0,
            maybe: Vec::new(),
        })
        .collect();
    let blocks: Vec<u64> = (0..PAGES / BLOCK).filter(|b| b % WRITERS == id).collect();
    let mut buf = vec![0u8; BLOCK as usize * PAGE_SIZE];
    while !sh.stop.load(Ordering::Acquire) {
        let b = blocks[rng.below(blocks.len() as u64) as usize];
        let off = rng.below(BLOCK);
        let n = 1 + rng.below(BLOCK - off);
        let first = b * BLOCK + off;
        let len = n as usize * PAGE_SIZE;
        if rng.below(3) != 0 {
            let v = sh.version.fetch_add(1, Ordering::Relaxed);
            for i in 0..n as usize {
                page_content(
                    NS,
                    first + i as u64,
                    v,
                    &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE],
                );
            }
            let r = sh.client.write(NS, first, &buf[..len]);
            for p in first..first + n {
                let m = &mut model[p as usize];
                match r {
                    Ok(()) => {
                        m.stored = v;
                        m.maybe.clear();
                    }
                    Err(_) => m.maybe.push(v),
                }
            }
        } else {
            match sh.client.read(NS, first, &mut buf[..len]) {
                Ok(present) => {
                    if let Err(e) = check_read(first, &buf[..len], &present, &model, 0) {
                        sh.fail(e);
                        break;
                    }
                }
                // A read may fail while servers die (the engine retries it); it must never
                // return wrong bytes, nor call a page lost while a replica of it lives.
                Err(ClientError::Lost) => {
                    sh.fail(format!(
                        "read of {first}+{n}: lost, though only one server failed at a time"
                    ));
                    break;
                }
                Err(_) => {}
            }
        }
    }
    model
}

/// The chaos schedule: one seeded action after another until `until`.
fn chaos(sh: &Shared, procs: &mut [ServerProc], seed: u64, until: Instant) {
    let mut rng = Rng::new(seed);
    let healthy = |sh: &Shared| {
        let s = sh.client.stats();
        s.degraded_slabs == 0 && s.suspended_slabs == 0
    };
    let only = std::env::var("FARVM_CHAOS_ONLY").unwrap_or_default();
    let allowed = |k: u64| {
        only.is_empty()
            || only
                .split(',')
                .any(|a| a == ["kill", "freeze", "move", "drain"][k as usize])
    };
    while Instant::now() < until && !sh.stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(20 + rng.below(180)));
        let s = rng.below(SERVERS as u64) as usize;
        let addr = sh.addrs[s];
        let action = rng.below(4);
        match action {
            _ if !allowed(action) => {}
            // Kill and restart empty on the same address (a server reboot): one failure at a
            // time, so every page keeps a live replica.
            0 if healthy(sh) => {
                procs[s].kill();
                sh.journal.note(sh.start, format!("killed server {s}"));
                std::thread::sleep(Duration::from_millis(rng.below(400)));
                procs[s] = ServerProc::spawn_at(&addr.to_string(), "64M");
                sh.journal
                    .note(sh.start, format!("restarted server {s} empty"));
            }
            // Freeze past the request timeout (a stalled host): its buffered requests apply
            // when it runs again.
            1 if healthy(sh) => {
                procs[s].signal(libc::SIGSTOP);
                let ms = 300 + rng.below(1700);
                sh.journal
                    .note(sh.start, format!("froze server {s} for {ms} ms"));
                std::thread::sleep(Duration::from_millis(ms));
                procs[s].signal(libc::SIGCONT);
                sh.journal.note(sh.start, format!("resumed server {s}"));
            }
            // Move some of its replicas elsewhere (a pool's rebalance).
            2 => {
                let to = (s + 1 + rng.below(SERVERS as u64 - 1) as usize) % SERVERS;
                let parity = rng.below(2);
                let r = sh
                    .client
                    .move_replicas(NS, addr, sh.addrs[to], &|k| k % 2 == parity);
                sh.journal.note(
                    sh.start,
                    format!("moved slabs ≡{parity} mod 2 from {s} to {to}: {r:?}"),
                );
            }
            // Drain: no new slabs there, every replica off it, then back in use.
            3 => {
                let _ = sh.client.set_draining(addr, true);
                let mut moved = 0;
                for slab in sh.client.slabs_on(NS, addr) {
                    let to = (s + 1 + rng.below(SERVERS as u64 - 1) as usize) % SERVERS;
                    if let Ok(k) = sh
                        .client
                        .move_replicas(NS, addr, sh.addrs[to], &|k| k == slab)
                    {
                        moved += k;
                    }
                }
                sh.journal
                    .note(sh.start, format!("drained server {s}: {moved} slabs moved"));
                let _ = sh.client.set_draining(addr, false);
            }
            _ => {}
        }
    }
}

/// One seed: servers, client, writers and chaos, then a full check once the client healed.
fn run_seed(seed: u64, secs: u64) {
    let mut procs: Vec<ServerProc> = (0..SERVERS).map(|_| ServerProc::spawn("64M")).collect();
    let addrs: Vec<SocketAddr> = procs.iter().map(|p| p.addr).collect();
    let mut cfg = config(&addrs);
    cfg.replication = Some(2);
    cfg.slab_pages = SLAB_PAGES;
    cfg.timeout = Duration::from_secs(1);
    cfg.connect_timeout = Duration::from_millis(500);
    let sh = Arc::new(Shared {
        client: Client::connect(cfg).expect("client connects"),
        addrs,
        stop: AtomicBool::new(false),
        version: AtomicU64::new(1),
        journal: Journal::default(),
        start: Instant::now(),
        violation: Mutex::new(None),
    });
    let writers: Vec<_> = (0..WRITERS)
        .map(|id| {
            let sh = sh.clone();
            std::thread::spawn(move || writer(&sh, id, seed))
        })
        .collect();
    chaos(
        &sh,
        &mut procs,
        seed,
        Instant::now() + Duration::from_secs(secs),
    );
    sh.stop.store(true, Ordering::Release);
    let models: Vec<Vec<PageModel>> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let fail = |what: String| -> ! {
        panic!(
            "seed {seed} (FARVM_CHAOS_SEED={seed} replays the schedule): {what}\nchaos events:\n{}",
            sh.journal.dump()
        )
    };
    if let Some(v) = sh.violation.lock().unwrap().take() {
        fail(v);
    }
    // Healed: every slab back at R live replicas (the maintenance thread re-replicates).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = sh.client.stats();
        if s.degraded_slabs == 0 && s.suspended_slabs == 0 {
            break;
        }
        if Instant::now() > deadline {
            fail(format!("the client never healed: {s:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Every page, as its owner last knew it.
    let mut buf = vec![0u8; SLAB_PAGES as usize * PAGE_SIZE];
    for slab in 0..SLABS {
        let first = slab * SLAB_PAGES;
        let present = loop {
            match sh.client.read(NS, first, &mut buf) {
                Ok(p) => break p,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => fail(format!("final read of slab {slab}: {e}")),
            }
        };
        for (i, &here) in present.iter().enumerate() {
            let p = first + i as u64;
            let owner = ((p / BLOCK) % WRITERS) as usize;
            let bytes = &buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
            let one = &models[owner][p as usize..p as usize + 1];
            if let Err(e) = check_read(p, bytes, &[here], one, p) {
                fail(format!("after the chaos: {e}"));
            }
        }
    }
    eprintln!(
        "seed {seed}: {} writes, client {:?}",
        sh.version.load(Ordering::Relaxed) - 1,
        sh.client.stats()
    );
}

#[test]
fn writes_survive_kills_freezes_moves_and_drains_racing_them() {
    // The client's own account (servers out of service, copies, moves) with RUST_LOG set.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .try_init();
    let secs = env_u64("FARVM_CHAOS_SECS", 12);
    let seeds: Vec<u64> = match std::env::var("FARVM_CHAOS_SEED") {
        Ok(s) => vec![s.parse().expect("FARVM_CHAOS_SEED: a number")],
        Err(_) => {
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64;
            (0..env_u64("FARVM_CHAOS_ROUNDS", 2))
                .map(|i| base.wrapping_add(i))
                .collect()
        }
    };
    for seed in seeds {
        eprintln!("chaos seed {seed}, {secs} s");
        run_seed(seed, secs);
    }
}
