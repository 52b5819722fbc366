//! A TCP proxy that delays every byte by a fixed one-way latency in each direction, for
//! emulating the distance between racks where the kernel has no `netem`. Bytes keep their
//! order and the pipe keeps streaming while data is in flight (latency, not a bandwidth cap).

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Forwards connections accepted on `listener` to `upstream`, adding `delay` each way.
/// Serves until the listener fails.
pub fn serve(listener: TcpListener, upstream: SocketAddr, delay: Duration) -> io::Result<()> {
    loop {
        let (client, peer) = listener.accept()?;
        thread::spawn(move || {
            if let Err(e) = proxy(client, upstream, delay) {
                tracing::debug!(%peer, %upstream, error = %e, "delay proxy connection ended");
            }
        });
    }
}

/// Serves on a background thread; returns the address it listens on.
pub fn spawn(listen: SocketAddr, upstream: SocketAddr, delay: Duration) -> io::Result<SocketAddr> {
    let listener = TcpListener::bind(listen)?;
    let addr = listener.local_addr()?;
    thread::Builder::new()
        .name("delay-proxy".into())
        .spawn(move || serve(listener, upstream, delay))?;
    Ok(addr)
}

fn proxy(client: TcpStream, upstream: SocketAddr, delay: Duration) -> io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let up = pipe(client.try_clone()?, server.try_clone()?, delay)?;
    let down = pipe(server, client, delay)?;
    let _ = up.join();
    let _ = down.join();
    Ok(())
}

/// Copies `from` → `to`, each chunk released `delay` after it was read.
fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    delay: Duration,
) -> io::Result<thread::JoinHandle<()>> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::Builder::new()
        .name("delay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            // Dropping tx tells the writer to finish after what is in flight.
        })?;
    thread::Builder::new()
        .name("delay-write".into())
        .spawn(move || {
            while let Ok((due, chunk)) = rx.recv() {
                let now = Instant::now();
                if due > now {
                    thread::sleep(due - now);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwards_both_ways_in_order() {
        let echo = TcpListener::bind("127.0.0.1:0").unwrap();
        let echo_addr = echo.local_addr().unwrap();
        thread::spawn(move || {
            let (mut s, _) = echo.accept().unwrap();
            let mut buf = [0u8; 4096];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => s.write_all(&buf[..n]).unwrap(),
                }
            }
        });
        let addr = spawn(
            "127.0.0.1:0".parse().unwrap(),
            echo_addr,
            Duration::from_millis(5),
        )
        .unwrap();
        let mut c = TcpStream::connect(addr).unwrap();
        let sent: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut writer = c.try_clone().unwrap();
        let data = sent.clone();
        let w = thread::spawn(move || {
            writer.write_all(&data).unwrap();
            writer.shutdown(Shutdown::Write).unwrap();
        });
        let mut got = Vec::new();
        c.read_to_end(&mut got).unwrap();
        w.join().unwrap();
        assert_eq!(got, sent);
    }
}
