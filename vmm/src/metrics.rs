//! The Prometheus endpoint of `farvm run --metrics ADDR`: a minimal HTTP/1.0 server on one
//! thread (`metrics`) that answers `GET /metrics` (and `GET /`) with the text exposition
//! format produced by a caller-supplied function; anything else gets 404. One request per
//! connection, a short read timeout, so a slow client cannot wedge it.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Renders the metrics text on each scrape.
pub type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// A running endpoint; stops on drop.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl MetricsServer {
    /// Binds `addr` (port 0: ephemeral) and serves `render()` from a thread.
    pub fn start(addr: SocketAddr, render: Render) -> io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                while !stop2.load(Ordering::Acquire) {
                    match listener.accept() {
                        Ok((s, _)) => {
                            if let Err(e) = serve_one(s, &render) {
                                tracing::debug!("metrics client: {e}");
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        Err(e) => {
                            tracing::warn!("metrics endpoint accept: {e}");
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                }
            })?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve_one(s: TcpStream, render: &Render) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut r = BufReader::new(s.try_clone()?);
    let mut line = String::new();
    r.read_line(&mut line)?;
    // Drain the headers (up to the blank line) so the client sees a clean close.
    let mut h = String::new();
    for _ in 0..100 {
        h.clear();
        if r.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut w = s;
    if method == "GET" && (path == "/metrics" || path == "/") {
        let body = render();
        write!(
            w,
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
    } else {
        let body = "not found: try GET /metrics\n";
        write!(
            w,
            "HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
    }
    w.flush()
}

/// Fetches `http://addr/path` (for tests and `farvm` itself; no external client needed).
pub fn scrape(addr: SocketAddr, path: &str) -> io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut text = String::new();
    io::Read::read_to_string(&mut s, &mut text)?;
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_metrics_and_404s_the_rest() {
        let m = MetricsServer::start(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(|| "farvm_test_total 3\n".to_string()),
        )
        .unwrap();
        let (code, body) = scrape(m.addr(), "/metrics").unwrap();
        assert_eq!(code, 200);
        assert_eq!(body, "farvm_test_total 3\n");
        let (code, _) = scrape(m.addr(), "/nope").unwrap();
        assert_eq!(code, 404);
    }
}
