//! A minimal blocking HTTP/1.0 client: one `GET`, the status and the body. For tests and
//! command-line clients of farvm's own endpoints (TCP or Unix socket), not a general client.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crate::listen::BoundAddr;

/// How long a request may take (connect, send, read).
const TIMEOUT: Duration = Duration::from_secs(5);

/// A response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// The body, as text.
    pub body: String,
}

/// `GET path` from the server at `addr`.
pub fn get(addr: &BoundAddr, path: &str) -> io::Result<Response> {
    let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    let mut raw = Vec::new();
    match addr {
        BoundAddr::Tcp(a) => {
            let mut s = TcpStream::connect_timeout(a, TIMEOUT)?;
            s.set_read_timeout(Some(TIMEOUT))?;
            s.set_write_timeout(Some(TIMEOUT))?;
            s.write_all(request.as_bytes())?;
            s.read_to_end(&mut raw)?;
        }
        BoundAddr::Unix(p) => {
            let mut s = UnixStream::connect(p)?;
            s.set_read_timeout(Some(TIMEOUT))?;
            s.set_write_timeout(Some(TIMEOUT))?;
            s.write_all(request.as_bytes())?;
            s.read_to_end(&mut raw)?;
        }
    }
    parse(&String::from_utf8_lossy(&raw))
}

fn parse(text: &str) -> io::Result<Response> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "malformed HTTP response");
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(bad)?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(bad)?;
    let content_type = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        .map(|(_, v)| v.trim().to_string());
    Ok(Response {
        status,
        content_type,
        body: body.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_headers_and_body() {
        let r = parse("HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\n\r\nnope\n").unwrap();
        assert_eq!(r.status, 404);
        assert_eq!(r.content_type.as_deref(), Some("text/plain"));
        assert_eq!(r.body, "nope\n");
        assert!(parse("garbage").is_err());
    }
}
