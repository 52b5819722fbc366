//! CPU per page of the VMM's side of the data path with pages sealed (`ClientConfig::page_key`)
//! and not, through the page store the VMM uses, against an in-process memory server on
//! loopback: write-backs (sealed in the send buffer on the submitting thread) and demand reads
//! (`read_now`: received, checked and opened on the calling thread). What is measured is the
//! calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`), not wall time, so the server's work
//! and waits for it do not count and a loaded host blurs it less; sealed and unsealed rounds
//! alternate and the table shows each one's median. docs/sealing.md quotes it.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use farvm_memclient::bench::thread_cpu;
use farvm_memclient::{Client, ClientConfig, PageKey, PageStore, StoreConfig};
use farvm_memserver::server::{Server, ServerConfig};
use farvm_pageio::{
    Completion, CompletionSink, PageBuf, Priority, ReadReq, RemoteStore, Version, WriteReq,
    PAGE_SIZE,
};

/// Pages per round, and per write batch (one memserver request).
const PAGES: usize = 4096;
const BATCH: usize = 32;
const ROUNDS: usize = 9;

#[derive(Default)]
struct Sink {
    done: Mutex<usize>,
    cv: Condvar,
}

impl CompletionSink for Sink {
    fn complete(&self, batch: &[Completion]) {
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) += batch.len();
        self.cv.notify_all();
    }
}

struct Side {
    store: Arc<PageStore>,
    sink: Arc<Sink>,
    pages: Vec<u8>,
}

impl Side {
    fn new(server: std::net::SocketAddr, key: Option<PageKey>) -> Side {
        let mut cfg = ClientConfig::new(vec![server]);
        cfg.slab_pages = 1 << 18;
        cfg.timeout = Duration::from_secs(30);
        cfg.page_key = key;
        let client = Arc::new(Client::connect(cfg).expect("client connects"));
        let store = PageStore::new(
            client,
            StoreConfig {
                namespace: 1,
                slots: 8,
            },
        );
        let sink = Arc::new(Sink::default());
        store.attach(sink.clone()).expect("attach");
        let mut pages = vec![0u8; PAGES * PAGE_SIZE];
        for (i, b) in pages.iter_mut().enumerate() {
            *b = (i.wrapping_mul(2_654_435_761) >> 13) as u8;
        }
        Side { store, sink, pages }
    }

    fn buf(&mut self, p: usize) -> PageBuf {
        // SAFETY: `pages` outlives every request (each round waits for its completions) and
        // a page is in one request at a time.
        unsafe { PageBuf::new(self.pages[p * PAGE_SIZE..].as_mut_ptr()) }.expect("non-null")
    }

    /// µs of this thread's CPU per page written back, then per page read on demand.
    fn round(&mut self) -> (f64, f64) {
        *self.sink.done.lock().unwrap() = 0;
        let t0 = thread_cpu();
        for first in (0..PAGES).step_by(BATCH) {
            let reqs: [WriteReq; BATCH] = std::array::from_fn(|i| WriteReq {
                page: (first + i) as u64,
                src: self.buf(first + i),
                version: Version(first as u64 + i as u64 + 1),
            });
            self.store.write(&reqs).expect("write submitted");
            let mut done = self.sink.done.lock().unwrap();
            while *done < first + BATCH {
                done = self.sink.cv.wait(done).unwrap();
            }
        }
        let t1 = thread_cpu();
        for p in 0..PAGES {
            let req = ReadReq {
                page: p as u64,
                priority: Priority::Demand,
                dst: self.buf(p),
                version: Version(p as u64 + 1),
            };
            let (status, _) = self.store.read_now(&req).expect("read on this thread");
            assert_eq!(status, farvm_pageio::Status::Ok, "page {p}");
        }
        let t2 = thread_cpu();
        let us = |d: Duration| d.as_secs_f64() * 1e6 / PAGES as f64;
        (us(t1 - t0), us(t2 - t1))
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let server = Server::start(ServerConfig::loopback(64 << 20)).expect("server starts");
    let mut sealed = Side::new(server.addr(), Some(PageKey::generate().expect("a key")));
    let mut clear = Side::new(server.addr(), None);
    let (mut sw, mut sr, mut cw, mut cr) = (vec![], vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        let (w, r) = sealed.round();
        sw.push(w);
        sr.push(r);
        let (w, r) = clear.round();
        cw.push(w);
        cr.push(r);
    }
    let (sw, sr, cw, cr) = (median(sw), median(sr), median(cw), median(cr));
    println!(
        "CPU of the submitting thread per 4 KiB page, median of {ROUNDS} alternating rounds of \
         {PAGES} pages (µs):\n"
    );
    println!("| | write-back | demand read |");
    println!("|---|---:|---:|");
    println!("| sealed | {sw:.2} | {sr:.2} |");
    println!("| not sealed | {cw:.2} | {cr:.2} |");
    println!("| sealing costs | {:.2} | {:.2} |", sw - cw, sr - cr);
}
