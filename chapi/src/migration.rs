//! The `vm.send-migration` and `vm.receive-migration` bodies, as `ch-remote` sends them (Cloud
//! Hypervisor's `VmSendMigrationData` and `VmReceiveMigrationData`): `{"destination_url":
//! "tcp:HOST:PORT", "local": false}` and `{"receiver_url": "tcp:HOST:PORT"}`. farvm migrates
//! between hosts over TCP only: a `unix:` URL (Cloud Hypervisor's migration on one host) and
//! `"local": true` are refused with a 400 naming what farvm takes.

use std::net::SocketAddr;

use serde::Deserialize;

use crate::error::ApiError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendBody {
    destination_url: String,
    /// Cloud Hypervisor's local migration (guest memory handed over as file descriptors on
    /// one host): farvm has none.
    local: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReceiveBody {
    receiver_url: String,
}

fn body<'a, T: Deserialize<'a>>(endpoint: &str, body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::BadJson(format!("{endpoint}: {e}")))
}

/// `HOST:PORT` of a `tcp:HOST:PORT` URL; anything else is a 400 naming what farvm takes.
fn tcp_address<'a>(field: &str, url: &'a str) -> Result<&'a str, ApiError> {
    let bad = |why: &str| {
        ApiError::BadConfig(format!(
            "{field}: `{url}` {why} (farvm migrates over TCP only: tcp:HOST:PORT)"
        ))
    };
    if url.starts_with("unix:") {
        return Err(bad("is a Unix socket"));
    }
    let addr = url
        .strip_prefix("tcp:")
        .ok_or_else(|| bad("is not a tcp: URL"))?;
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| bad("has no port"))?;
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(bad("is not HOST:PORT"));
    }
    Ok(addr)
}

/// The destination (`HOST:PORT`, a name or an address) a `vm.send-migration` body sends to.
pub fn destination(b: &[u8]) -> Result<String, ApiError> {
    let b: SendBody = body("vm.send-migration", b)?;
    if b.local == Some(true) {
        return Err(ApiError::BadConfig(
            "local: farvm has no local migration (guest memory handed over on one host); send \
             to another farvm with {\"destination_url\": \"tcp:HOST:PORT\"}"
                .into(),
        ));
    }
    tcp_address("destination_url", &b.destination_url).map(str::to_string)
}

/// The address a `vm.receive-migration` body listens on (an IP address and port: the
/// address of this host to bind).
pub fn receiver(b: &[u8]) -> Result<SocketAddr, ApiError> {
    let b: ReceiveBody = body("vm.receive-migration", b)?;
    let addr = tcp_address("receiver_url", &b.receiver_url)?;
    addr.parse().map_err(|_| {
        ApiError::BadConfig(format!(
            "receiver_url: `{}` does not name an IP address and port of this host to listen on",
            b.receiver_url
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_name_a_tcp_address() {
        let d = destination(br#"{"destination_url":"tcp:host-b:6000","local":false}"#).unwrap();
        assert_eq!(d, "host-b:6000");
        let d = destination(br#"{"destination_url":"tcp:[::1]:6000"}"#).unwrap();
        assert_eq!(d, "[::1]:6000");
        let r = receiver(br#"{"receiver_url":"tcp:0.0.0.0:6000"}"#).unwrap();
        assert_eq!(r, "0.0.0.0:6000".parse().unwrap());

        let e = destination(br#"{"destination_url":"unix:/run/mig.sock"}"#).unwrap_err();
        assert_eq!(e.status(), 400);
        assert!(
            e.to_string().contains("Unix socket") && e.to_string().contains("tcp:HOST:PORT"),
            "{e}"
        );
        let e = receiver(br#"{"receiver_url":"unix:/run/mig.sock"}"#).unwrap_err();
        assert!(e.to_string().contains("TCP only"), "{e}");
        let e = destination(br#"{"destination_url":"tcp:h:6000","local":true}"#).unwrap_err();
        assert!(e.to_string().contains("no local migration"), "{e}");
        for bad in ["tcp:h", "tcp::6000", "tcp:h:99999", "file:///d", "h:6000"] {
            let body = format!(r#"{{"destination_url":"{bad}"}}"#);
            let e = destination(body.as_bytes()).unwrap_err();
            assert_eq!(e.status(), 400, "{bad}: {e}");
        }
        let e = receiver(br#"{"receiver_url":"tcp:host-b:6000"}"#).unwrap_err();
        assert!(e.to_string().contains("IP address"), "{e}");
        let e = receiver(br#"{"receiver_url":"tcp:0.0.0.0:6000","x":1}"#).unwrap_err();
        assert_eq!(e.status(), 400);
        assert_eq!(destination(b"").unwrap_err().status(), 400);
    }
}
