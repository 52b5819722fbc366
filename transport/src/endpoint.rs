//! [`Transport`] and [`Endpoint`]: what a link to a memory server is, and its URL text.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

/// How pages travel to and from one memory server. Non-exhaustive: a transport is added here
/// (its variant, scheme and name) without touching the crates that carry it; the client says
/// so clearly until it has a link for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Transport {
    /// The pipelined TCP protocol (memproto/PROTOCOL.md).
    #[default]
    Tcp,
    /// The protocol's frames over an RDMA reliable connection, bootstrapped on a TCP control
    /// connection to the server's RDMA listener (`farvm-memserver --rdma`).
    Rdma {
        /// Pages move by one-sided RDMA READ/WRITE on slabs the server grants; else every
        /// request travels as a SEND answered by a SEND (docs/rdma.md).
        one_sided: bool,
    },
}

impl Transport {
    /// RDMA with one-sided pages: what `rdma://` means unless the VM says otherwise.
    pub const RDMA: Transport = Transport::Rdma { one_sided: true };

    /// The URL scheme that names it (`tcp`, `rdma`). How RDMA moves pages is the client's
    /// choice and not part of a server's address.
    pub fn scheme(self) -> &'static str {
        match self {
            Transport::Tcp => "tcp",
            Transport::Rdma { .. } => "rdma",
        }
    }

    /// The transport a URL scheme names (`rdma` is one-sided).
    pub fn from_scheme(scheme: &str) -> Option<Transport> {
        match scheme {
            "tcp" => Some(Transport::Tcp),
            "rdma" => Some(Transport::RDMA),
            _ => None,
        }
    }

    /// The schemes [`Transport::from_scheme`] knows, for error messages.
    pub const SCHEMES: &'static [&'static str] = &["tcp", "rdma"];

    /// The same kind of transport with RDMA's page mode set to `one_sided` (TCP unchanged):
    /// a VM's `--rdma-pages` applied to every RDMA server it uses.
    pub fn with_rdma_pages(self, one_sided: bool) -> Transport {
        match self {
            Transport::Rdma { .. } => Transport::Rdma { one_sided },
            t => t,
        }
    }

    /// Whether `other` is the same kind of transport (TCP, RDMA), whatever RDMA's page mode.
    pub fn same_kind(self, other: Transport) -> bool {
        self.scheme() == other.scheme()
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Tcp => f.write_str("tcp"),
            Transport::Rdma { one_sided: true } => f.write_str("rdma (one-sided)"),
            Transport::Rdma { one_sided: false } => f.write_str("rdma (send/recv)"),
        }
    }
}

/// One memory server as a client reaches it: the listener's address and the transport it
/// serves there. A server's address is its identity for the client; the transport says which
/// link opens to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Its TCP listener, or its RDMA listener for an RDMA transport.
    pub addr: SocketAddr,
    /// How its pages travel.
    pub transport: Transport,
}

/// Why endpoint text is not an endpoint.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    /// A scheme no transport has.
    #[error(
        "`{text}`: unknown scheme `{scheme}://` (use HOST:PORT or {})",
        url_forms()
    )]
    UnknownScheme {
        /// The whole text.
        text: String,
        /// Its scheme.
        scheme: String,
    },
    /// No port.
    #[error("`{0}`: expected HOST:PORT (e.g. memsrv1:7070)")]
    NoPort(String),
    /// The host name did not resolve.
    #[error("cannot resolve `{text}`: {reason}")]
    Resolve {
        /// HOST:PORT.
        text: String,
        /// The resolver's error.
        reason: String,
    },
    /// The host name resolved to nothing.
    #[error("`{0}` resolves to no address")]
    NoAddress(String),
    /// A host name where only an address may stand (stored records).
    #[error("`{0}`: expected an IP address and port")]
    NotAnAddress(String),
}

impl Endpoint {
    /// A TCP server.
    pub fn tcp(addr: SocketAddr) -> Endpoint {
        Endpoint {
            addr,
            transport: Transport::Tcp,
        }
    }

    /// `[tcp://|rdma://]HOST:PORT`, a host name resolved now (its first address) so that a
    /// typo fails where it was written.
    pub fn parse(text: &str) -> Result<Endpoint, EndpointError> {
        let (transport, rest) = split_scheme(text)?;
        if let Ok(addr) = rest.parse::<SocketAddr>() {
            return Ok(Endpoint { addr, transport });
        }
        if !rest.contains(':') {
            return Err(EndpointError::NoPort(rest.to_string()));
        }
        let mut addrs = rest.to_socket_addrs().map_err(|e| EndpointError::Resolve {
            text: rest.to_string(),
            reason: e.to_string(),
        })?;
        let addr = addrs
            .next()
            .ok_or_else(|| EndpointError::NoAddress(rest.to_string()))?;
        Ok(Endpoint { addr, transport })
    }

    /// `[tcp://|rdma://]IP:PORT` without name resolution: the form stored in records.
    pub fn parse_address(text: &str) -> Result<Endpoint, EndpointError> {
        let (transport, rest) = split_scheme(text)?;
        let addr = rest
            .parse::<SocketAddr>()
            .map_err(|_| EndpointError::NotAnAddress(text.to_string()))?;
        Ok(Endpoint { addr, transport })
    }

    /// The same server with RDMA's page mode set (see [`Transport::with_rdma_pages`]).
    pub fn with_rdma_pages(self, one_sided: bool) -> Endpoint {
        Endpoint {
            transport: self.transport.with_rdma_pages(one_sided),
            ..self
        }
    }
}

/// `tcp://HOST:PORT or rdma://HOST:PORT`: every scheme's URL form, for error messages.
fn url_forms() -> String {
    let forms: Vec<String> = Transport::SCHEMES
        .iter()
        .map(|s| format!("{s}://HOST:PORT"))
        .collect();
    forms.join(" or ")
}

fn split_scheme(text: &str) -> Result<(Transport, &str), EndpointError> {
    match text.split_once("://") {
        None => Ok((Transport::Tcp, text)),
        Some((scheme, rest)) => Transport::from_scheme(scheme)
            .map(|t| (t, rest))
            .ok_or_else(|| EndpointError::UnknownScheme {
                text: text.to_string(),
                scheme: scheme.to_string(),
            }),
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(addr: SocketAddr) -> Endpoint {
        Endpoint::tcp(addr)
    }
}

/// The URL: `IP:PORT` for TCP (the form every tool has always printed), `rdma://IP:PORT`.
impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.transport {
            Transport::Tcp => write!(f, "{}", self.addr),
            t => write!(f, "{}://{}", t.scheme(), self.addr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_the_transport() {
        let tcp = Endpoint::parse("127.0.0.1:7070").unwrap();
        assert_eq!(tcp, Endpoint::tcp("127.0.0.1:7070".parse().unwrap()));
        assert_eq!(Endpoint::parse("tcp://127.0.0.1:7070").unwrap(), tcp);
        let rdma = Endpoint::parse("rdma://10.2.0.2:7071").unwrap();
        assert_eq!(rdma.addr, "10.2.0.2:7071".parse().unwrap());
        assert_eq!(rdma.transport, Transport::Rdma { one_sided: true });
        assert_eq!(rdma.to_string(), "rdma://10.2.0.2:7071");
        assert_eq!(tcp.to_string(), "127.0.0.1:7070");
        assert_eq!(Endpoint::parse("[::1]:7").unwrap().addr.port(), 7);
        assert_eq!(Endpoint::parse("localhost:7070").unwrap().addr.port(), 7070);
    }

    #[test]
    fn bad_text_says_what_is_wrong() {
        let e = Endpoint::parse("udp://1.2.3.4:5").unwrap_err();
        assert!(matches!(e, EndpointError::UnknownScheme { ref scheme, .. } if scheme == "udp"));
        assert!(e.to_string().contains("rdma://HOST:PORT"), "{e}");
        assert_eq!(
            Endpoint::parse("rdma://nohostport").unwrap_err(),
            EndpointError::NoPort("nohostport".into())
        );
        assert!(matches!(
            Endpoint::parse("no-such-host.invalid:1").unwrap_err(),
            EndpointError::Resolve { .. } | EndpointError::NoAddress(_)
        ));
        assert!(matches!(
            Endpoint::parse_address("localhost:7070").unwrap_err(),
            EndpointError::NotAnAddress(_)
        ));
    }

    #[test]
    fn rdma_page_mode_is_the_clients() {
        let rdma = Endpoint::parse("rdma://10.2.0.2:7071").unwrap();
        let send = rdma.with_rdma_pages(false);
        assert_eq!(send.transport, Transport::Rdma { one_sided: false });
        assert_eq!(send.transport.to_string(), "rdma (send/recv)");
        assert!(send.transport.same_kind(rdma.transport));
        // The address does not carry the page mode: it reads back one-sided.
        assert_eq!(Endpoint::parse_address(&send.to_string()).unwrap(), rdma);
        let tcp = Endpoint::tcp("1.2.3.4:5".parse().unwrap());
        assert_eq!(tcp.with_rdma_pages(false), tcp);
        assert!(!tcp.transport.same_kind(rdma.transport));
    }
}
