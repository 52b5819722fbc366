//! The client's read bench (`farvm-lab bench memserver`): 4 KiB read latency and throughput of a
//! memserver next to a raw TCP request/response floor (16 B request, 4096 B response,
//! TCP_NODELAY) measured in the same process, on the same loopback, in alternating slices.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use farvm_memproto::PAGE_SIZE;

use crate::{
    Client, ClientConfig, ClientError, Endpoint, IoBuf, Op, Priority, ReplyTo, Request, Transport,
};

/// Longest stretch measured on one side before switching to the other.
const SLICE: Duration = Duration::from_millis(100);

/// Bench failures.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// Floor sockets.
    #[error("floor i/o: {0}")]
    Io(#[from] std::io::Error),
    /// Histogram.
    #[error("histogram: {0}")]
    Hist(String),
}

/// Bench parameters.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Time per (transport, in-flight) cell and round.
    pub duration: Duration,
    /// In-flight depths.
    pub depths: Vec<usize>,
    /// Alternating rounds (floor, memserver, floor, memserver, ...).
    pub rounds: usize,
    /// Pages written before reading (reads pick among them at random).
    pub pages: u64,
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(2),
            depths: vec![1, 8, 32],
            rounds: 2,
            pages: 8192,
        }
    }
}

/// One measured cell.
#[derive(Debug, Clone, Copy)]
pub struct Cell {
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// Pages per second.
    pub pages_per_s: f64,
}

/// One row: floor vs memserver at one depth.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    /// Requests in flight.
    pub depth: usize,
    /// Raw TCP floor.
    pub floor: Cell,
    /// Memserver.
    pub memserver: Cell,
}

struct Acc {
    hist: Histogram<u64>,
    ops: u64,
    time: Duration,
}

impl Acc {
    fn new() -> Result<Self, BenchError> {
        Ok(Self {
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3)
                .map_err(|e| BenchError::Hist(e.to_string()))?,
            ops: 0,
            time: Duration::ZERO,
        })
    }
    fn cell(&self) -> Cell {
        Cell {
            p50_us: self.hist.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: self.hist.value_at_quantile(0.99) as f64 / 1000.0,
            pages_per_s: self.ops as f64 / self.time.as_secs_f64().max(1e-9),
        }
    }
}

/// The floor's server: answers every 16-byte request with 4096 bytes.
fn floor_server(l: TcpListener, stop: Arc<AtomicBool>) {
    for s in l.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(mut s) = s else { continue };
        std::thread::spawn(move || {
            let _ = s.set_nodelay(true);
            let page = [0x5au8; PAGE_SIZE];
            let mut req = [0u8; 16];
            while s.read_exact(&mut req).is_ok() {
                if s.write_all(&page).is_err() {
                    return;
                }
            }
        });
    }
}

fn run_floor(addr: SocketAddr, depth: usize, d: Duration, acc: &mut Acc) -> Result<(), BenchError> {
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let req = [1u8; 16];
    let mut resp = [0u8; PAGE_SIZE];
    let mut sent = std::collections::VecDeque::with_capacity(depth);
    let t0 = Instant::now();
    for _ in 0..depth {
        sent.push_back(Instant::now());
        s.write_all(&req)?;
    }
    while t0.elapsed() < d {
        s.read_exact(&mut resp)?;
        let st = sent.pop_front().unwrap_or(t0);
        let _ = acc.hist.record(st.elapsed().as_nanos() as u64);
        acc.ops += 1;
        sent.push_back(Instant::now());
        s.write_all(&req)?;
    }
    acc.time += t0.elapsed();
    // Drain the outstanding responses so the connection closes cleanly.
    for _ in 0..sent.len() {
        s.read_exact(&mut resp)?;
    }
    Ok(())
}

fn run_memserver(
    c: &Client,
    cfg: &BenchConfig,
    duration: Duration,
    depth: usize,
    acc: &mut Acc,
    bufs: &mut Vec<IoBuf>,
) -> Result<(), BenchError> {
    let (tx, rx) = crossbeam_channel::bounded(depth);
    let mut sent = vec![Instant::now(); depth];
    let mut rng = 0x2545f4914f6cdd1du64;
    let next_page = |rng: &mut u64| {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng % cfg.pages
    };
    let t0 = Instant::now();
    if depth == 1 {
        // One request at a time: the demand-read path (submit and receive on this thread).
        let mut io = bufs.pop().unwrap_or_else(|| IoBuf::new(1));
        while t0.elapsed() < duration {
            io.set_run(next_page(&mut rng), 1)?;
            let st = Instant::now();
            let done = c.submit_wait(Op::Read, 1, io);
            let _ = acc.hist.record(st.elapsed().as_nanos() as u64);
            acc.ops += 1;
            io = done.io;
            done.result?;
            if !io.is_present(0) {
                return Err(ClientError::Protocol("bench page unexpectedly absent").into());
            }
        }
        bufs.push(io);
        acc.time += t0.elapsed();
        return Ok(());
    }
    for (i, slot) in sent.iter_mut().enumerate() {
        let mut io = bufs.pop().unwrap_or_else(|| IoBuf::new(1));
        io.set_run(next_page(&mut rng), 1)?;
        *slot = Instant::now();
        submit_polled(c, io, i as u64, &tx)?;
    }
    let mut outstanding = depth;
    while outstanding > 0 {
        let done = c.wait_completion(&rx);
        let i = done.user_data as usize;
        done.result?;
        if !done.io.is_present(0) {
            return Err(ClientError::Protocol("bench page unexpectedly absent").into());
        }
        let _ = acc.hist.record(sent[i].elapsed().as_nanos() as u64);
        acc.ops += 1;
        let mut io = done.io;
        if t0.elapsed() < duration {
            io.set_run(next_page(&mut rng), 1)?;
            sent[i] = Instant::now();
            submit_polled(c, io, i as u64, &tx)?;
        } else {
            bufs.push(io);
            outstanding -= 1;
        }
    }
    acc.time += t0.elapsed();
    Ok(())
}

/// A demand read of namespace 1, answered on `tx` and received by the caller's poller.
fn submit_polled(
    c: &Client,
    io: IoBuf,
    user_data: u64,
    tx: &crossbeam_channel::Sender<crate::Finished>,
) -> Result<(), BenchError> {
    let req = Request {
        op: Op::Read,
        ns: 1,
        priority: Priority::Demand,
        io,
        user_data,
    };
    c.submit(req, ReplyTo::Polled(tx))
        .map_err(|(e, _)| e.into())
}

/// Bytes of server capacity the bench stores (its pages plus slack).
pub fn capacity_bytes(cfg: &BenchConfig) -> u64 {
    (cfg.pages + 1024) * PAGE_SIZE as u64
}

/// Runs the bench against the memserver at `server` (open mode, room for
/// [`capacity_bytes`]); `progress` is called with a line per finished cell.
pub fn run(
    cfg: &BenchConfig,
    server: SocketAddr,
    mut progress: impl FnMut(&str),
) -> Result<Vec<Row>, BenchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let fl = TcpListener::bind("127.0.0.1:0")?;
    let faddr = fl.local_addr()?;
    let st = stop.clone();
    let floor_thread = std::thread::spawn(move || floor_server(fl, st));

    // One connection, like the floor; window large enough for the deepest setting.
    let client = bench_client(cfg, Endpoint::tcp(server))?;
    let maxd = cfg.depths.iter().copied().max().unwrap_or(1);
    let fill = vec![0xa5u8; 256 * PAGE_SIZE];
    let mut p = 0;
    while p < cfg.pages {
        let n = (cfg.pages - p).min(256) as usize;
        client.write(1, p, &fill[..n * PAGE_SIZE])?;
        p += n as u64;
    }
    let mut bufs: Vec<IoBuf> = (0..maxd).map(|_| IoBuf::new(1)).collect();
    let mut rows = Vec::new();
    for &depth in &cfg.depths {
        let (mut fa, mut ma) = (Acc::new()?, Acc::new()?);
        // Alternate floor and memserver in slices of at most `SLICE`, not whole rounds: on
        // this shared 2-core host the load (and with it the wake-up latency: ~14 µs per
        // round trip when busy, ~60 µs when the cores idle) changes within seconds, and a
        // change must hit both sides alike for the same-run ratio to mean anything.
        let slices = (cfg.duration.as_nanos() / SLICE.as_nanos()).max(1) as u32;
        let slice = cfg.duration / slices;
        for _ in 0..cfg.rounds.max(1) * slices as usize {
            run_floor(faddr, depth, slice, &mut fa)?;
            run_memserver(&client, cfg, slice, depth, &mut ma, &mut bufs)?;
        }
        let row = Row {
            depth,
            floor: fa.cell(),
            memserver: ma.cell(),
        };
        progress(&format!(
            "in-flight {depth:>2}: floor p50 {:.1} µs, memserver p50 {:.1} µs",
            row.floor.p50_us, row.memserver.p50_us
        ));
        rows.push(row);
    }
    stop.store(true, Ordering::Release);
    let _ = TcpStream::connect(faddr);
    let _ = floor_thread.join();
    client.close();
    Ok(rows)
}

/// One row of the transport comparison: the same memserver over TCP, over RDMA with
/// one-sided pages, and over RDMA with SEND/RECV.
#[derive(Debug, Clone, Copy)]
pub struct TransportRow {
    /// Requests in flight.
    pub depth: usize,
    /// Through the server's TCP listener.
    pub tcp: Cell,
    /// Through its RDMA listener, pages by RDMA READ (the default).
    pub rdma: Cell,
    /// Through its RDMA listener, every request a SEND answered by a SEND.
    pub send_recv: Cell,
}

/// A bench client of `server` (one bulk connection, window for the deepest setting).
fn bench_client(cfg: &BenchConfig, server: Endpoint) -> Result<Client, BenchError> {
    let mut ccfg = ClientConfig::new([server]);
    ccfg.conns_per_server = 1;
    let maxd = cfg.depths.iter().copied().max().unwrap_or(1);
    ccfg.window = maxd.max(1);
    ccfg.demand_reserve = 0;
    ccfg.depth = maxd.max(1) * 2;
    Ok(Client::connect(ccfg)?)
}

/// What [`run_transports`] measured: a row per depth, and the CPU time the process (server
/// and clients) used while its links were open and idle.
#[derive(Debug, Clone)]
pub struct TransportRun {
    /// One row per depth.
    pub rows: Vec<TransportRow>,
    /// CPU time of the whole process over [`IDLE_SPAN`] with the three clients connected and
    /// nothing in flight, ms.
    pub idle_cpu_ms: f64,
    /// The same with only the TCP client left: the difference is what the two idle RDMA
    /// clients (client and server side) cost.
    pub idle_tcp_only_ms: f64,
}

/// How long [`run_transports`] leaves the links idle to measure their CPU cost.
pub const IDLE_SPAN: Duration = Duration::from_secs(2);

/// User plus system CPU time of this process so far.
fn process_cpu() -> Duration {
    // SAFETY: rusage is plain data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer on the stack.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Runs the read bench against one memserver through its TCP listener `tcp` and its RDMA
/// listener `rdma` (one-sided, and SEND/RECV), alternating in slices as [`run`] does, so the
/// ratios of the transports hold within the run whatever the load. Each client writes the
/// pages, then reads them. Then every link stays open with nothing in flight for
/// [`IDLE_SPAN`], and the process's CPU time over it is measured (the server runs in this
/// process too).
pub fn run_transports(
    cfg: &BenchConfig,
    tcp: SocketAddr,
    rdma: SocketAddr,
    mut progress: impl FnMut(&str),
) -> Result<TransportRun, BenchError> {
    let over_tcp = bench_client(cfg, Endpoint::tcp(tcp))?;
    let rdma = |one_sided| Endpoint {
        addr: rdma,
        transport: Transport::Rdma { one_sided },
    };
    let over_rdma = bench_client(cfg, rdma(true))?;
    let over_sr = bench_client(cfg, rdma(false))?;
    // Each client writes the pages itself (a client reads only slabs it placed); all land
    // in the same namespace of the one server.
    let fill = vec![0xa5u8; 256 * PAGE_SIZE];
    for c in [&over_tcp, &over_rdma, &over_sr] {
        let mut p = 0;
        while p < cfg.pages {
            let n = (cfg.pages - p).min(256) as usize;
            c.write(1, p, &fill[..n * PAGE_SIZE])?;
            p += n as u64;
        }
    }
    let maxd = cfg.depths.iter().copied().max().unwrap_or(1);
    let mut bufs: Vec<IoBuf> = (0..maxd).map(|_| IoBuf::new(1)).collect();
    let mut rows = Vec::new();
    for &depth in &cfg.depths {
        let (mut ta, mut ra, mut sa) = (Acc::new()?, Acc::new()?, Acc::new()?);
        let slices = (cfg.duration.as_nanos() / SLICE.as_nanos()).max(1) as u32;
        let slice = cfg.duration / slices;
        for _ in 0..cfg.rounds.max(1) * slices as usize {
            run_memserver(&over_tcp, cfg, slice, depth, &mut ta, &mut bufs)?;
            run_memserver(&over_rdma, cfg, slice, depth, &mut ra, &mut bufs)?;
            run_memserver(&over_sr, cfg, slice, depth, &mut sa, &mut bufs)?;
        }
        let row = TransportRow {
            depth,
            tcp: ta.cell(),
            rdma: ra.cell(),
            send_recv: sa.cell(),
        };
        progress(&format!(
            "in-flight {depth:>2}: TCP p50 {:.1} µs, RDMA one-sided p50 {:.1} µs, RDMA \
             SEND/RECV p50 {:.1} µs",
            row.tcp.p50_us, row.rdma.p50_us, row.send_recv.p50_us
        ));
        rows.push(row);
    }
    // Let the last completions and the pollers settle, then measure the idle links: all
    // three clients, then the TCP one alone.
    let idle = || {
        std::thread::sleep(Duration::from_millis(200));
        let before = process_cpu();
        std::thread::sleep(IDLE_SPAN);
        (process_cpu() - before).as_secs_f64() * 1e3
    };
    let idle_cpu_ms = idle();
    over_rdma.close();
    over_sr.close();
    let idle_tcp_only_ms = idle();
    progress(&format!(
        "idle: {idle_cpu_ms:.1} ms of CPU in {:.0} s with the three clients connected, \
         {idle_tcp_only_ms:.1} ms with the TCP one alone",
        IDLE_SPAN.as_secs_f64()
    ));
    over_tcp.close();
    Ok(TransportRun {
        rows,
        idle_cpu_ms,
        idle_tcp_only_ms,
    })
}

/// Formats the transport comparison: each transport's p50 and pages/s, and the RDMA / TCP
/// ratios (one-sided and SEND/RECV), then the idle links' CPU time.
pub fn transport_table(run: &TransportRun) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "| in flight | TCP p50 µs | TCP pages/s | one-sided p50 µs | one-sided pages/s | SEND/RECV p50 µs | SEND/RECV pages/s | pages/s one-sided/TCP | pages/s SEND/RECV/TCP | pages/s one-sided/SEND/RECV |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|");
    for r in &run.rows {
        let _ = writeln!(
            o,
            "| {} | {:.1} | {:.0} | {:.1} | {:.0} | {:.1} | {:.0} | {:.3} | {:.3} | {:.3} |",
            r.depth,
            r.tcp.p50_us,
            r.tcp.pages_per_s,
            r.rdma.p50_us,
            r.rdma.pages_per_s,
            r.send_recv.p50_us,
            r.send_recv.pages_per_s,
            r.rdma.pages_per_s / r.tcp.pages_per_s,
            r.send_recv.pages_per_s / r.tcp.pages_per_s,
            r.rdma.pages_per_s / r.send_recv.pages_per_s
        );
    }
    let _ = writeln!(
        o,
        "\nidle, nothing in flight: {:.1} ms of CPU (server and clients) in {:.0} s with the \
         three clients connected, {:.1} ms with the TCP one alone",
        run.idle_cpu_ms,
        IDLE_SPAN.as_secs_f64(),
        run.idle_tcp_only_ms
    );
    o
}

/// Formats the result table and the target checks.
pub fn table(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "| in flight | floor p50 µs | floor p99 µs | floor pages/s | memserver p50 µs | memserver p99 µs | memserver pages/s | p50 ratio | pages/s ratio |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        let _ = writeln!(
            o,
            "| {} | {:.1} | {:.1} | {:.0} | {:.1} | {:.1} | {:.0} | {:.3} | {:.3} |",
            r.depth,
            r.floor.p50_us,
            r.floor.p99_us,
            r.floor.pages_per_s,
            r.memserver.p50_us,
            r.memserver.p99_us,
            r.memserver.pages_per_s,
            r.memserver.p50_us / r.floor.p50_us,
            r.memserver.pages_per_s / r.floor.pages_per_s
        );
    }
    if let Some(r) = rows.iter().find(|r| r.depth == 1) {
        let x = r.memserver.p50_us / r.floor.p50_us;
        let _ = writeln!(
            o,
            "target: p50 at 1 in flight <= 1.20x floor: {x:.3}x {}",
            if x <= 1.2 { "MET" } else { "MISSED" }
        );
    }
    if let Some(r) = rows.iter().find(|r| r.depth == 32) {
        let x = r.memserver.pages_per_s / r.floor.pages_per_s;
        let _ = writeln!(
            o,
            "target: pages/s at 32 in flight >= 0.80x floor: {x:.3}x {}",
            if x >= 0.8 { "MET" } else { "MISSED" }
        );
    }
    o
}

/// The raw TCP streaming rate of 4 KiB pages over loopback ([`tcp_stream`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamRate {
    /// Pages per second.
    pub pages_per_s: f64,
    /// CPU time of the writer and the reader thread together per page moved, µs: what the
    /// transport alone costs the host, the part of any remote-memory design's CPU per page
    /// that no engine change removes.
    pub cpu_us_per_page: f64,
}

/// CPU time of the calling thread so far (the scheduler's run time, as
/// `/proc/thread-self/schedstat` shows it).
pub fn thread_cpu() -> Duration {
    // SAFETY: timespec is plain data; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer on the stack; CLOCK_THREAD_CPUTIME_ID needs no other state.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// 4 KiB pages per second one loopback TCP connection carries when a thread writes pages
/// back to back and another reads them, and the CPU both threads spend per page: the
/// transport's ceiling, with no protocol at all.
pub fn tcp_stream(d: Duration) -> std::io::Result<StreamRate> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let writer = std::thread::spawn(move || -> std::io::Result<Duration> {
        let (mut s, _) = l.accept()?;
        let page = [0x5Au8; 4096];
        let cpu0 = thread_cpu();
        // Until the reader hangs up.
        while s.write_all(&page).is_ok() {}
        Ok(thread_cpu().saturating_sub(cpu0))
    });
    let mut c = TcpStream::connect(addr)?;
    let mut buf = vec![0u8; 256 << 10];
    let cpu0 = thread_cpu();
    let t0 = Instant::now();
    let mut bytes = 0u64;
    while t0.elapsed() < d {
        let n = c.read(&mut buf)?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
    }
    let secs = t0.elapsed().as_secs_f64();
    let reader_cpu = thread_cpu().saturating_sub(cpu0);
    drop(c);
    // The writer's time includes the pages still in the socket's buffers when the reader
    // stopped (at most a few hundred KiB against ~1 GB a second): a slight overcount.
    let writer_cpu = writer
        .join()
        .map_err(|_| std::io::Error::other("the TCP stream's writer thread panicked"))??;
    let pages = bytes as f64 / 4096.0;
    Ok(StreamRate {
        pages_per_s: pages / secs.max(1e-9),
        cpu_us_per_page: (reader_cpu + writer_cpu).as_secs_f64() * 1e6 / pages.max(1.0),
    })
}

/// p50 and p99 (µs) of a 16 B request / 4 KiB response ping-pong on loopback whose client
/// polls the socket (never sleeps) while it waits.
pub fn tcp_spinning_floor(d: Duration) -> std::io::Result<(f64, f64)> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let page = [0xA5u8; 4096];
        let mut req = [0u8; 16];
        while s.read_exact(&mut req).is_ok() {
            s.write_all(&page)?;
        }
        Ok(())
    });
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    c.set_nonblocking(true)?;
    let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut resp = [0u8; 4096];
    let t0 = Instant::now();
    while t0.elapsed() < d {
        let st = Instant::now();
        c.write_all(&[1u8; 16])?;
        let mut got = 0;
        while got < resp.len() {
            match c.read(&mut resp[got..]) {
                Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(e),
            }
        }
        let _ = hist.record(st.elapsed().as_nanos() as u64);
    }
    drop(c);
    let _ = server.join();
    Ok((
        hist.value_at_quantile(0.5) as f64 / 1e3,
        hist.value_at_quantile(0.99) as f64 / 1e3,
    ))
}
