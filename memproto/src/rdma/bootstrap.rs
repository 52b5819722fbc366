//! The RDMA bootstrap: what client and server exchange on the TCP control connection of an
//! RDMA session, after the handshake (PROTOCOL.md, "RDMA transport"), before any frame travels
//! over the queue pair.
//!
//! Client → server: its queue-pair endpoint and how many requests it keeps in flight at most
//! (the server posts that many receive buffers, so a request never meets an empty receive
//! queue). Server → client: its endpoint. Each frame then travels as one SEND into one
//! receive buffer of [`SLOT_BYTES`].

use super::endpoint::{QpEndpoint, ENDPOINT_WIRE_LEN};
use crate::frame::{HEADER_LEN, MAX_BODY};

/// Bytes of one send or receive buffer: the largest frame.
pub const SLOT_BYTES: usize = HEADER_LEN + MAX_BODY;
/// Most requests a client may keep in flight on one RDMA session.
pub const MAX_SLOTS: u16 = 256;
/// Wire size of the client's bootstrap message.
pub const CLIENT_HELLO_LEN: usize = ENDPOINT_WIRE_LEN + 2;

/// The client's bootstrap message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientHello {
    /// The client's queue pair.
    pub endpoint: QpEndpoint,
    /// Requests in flight at most (1..=[`MAX_SLOTS`]).
    pub slots: u16,
}

impl ClientHello {
    /// Encoding: the endpoint, then `slots` (u16, little endian).
    pub fn to_bytes(&self) -> [u8; CLIENT_HELLO_LEN] {
        let mut b = [0u8; CLIENT_HELLO_LEN];
        b[..ENDPOINT_WIRE_LEN].copy_from_slice(&self.endpoint.to_bytes());
        b[ENDPOINT_WIRE_LEN..].copy_from_slice(&self.slots.to_le_bytes());
        b
    }

    /// Decodes; `None` for a bad endpoint or a slot count outside 1..=[`MAX_SLOTS`].
    pub fn from_bytes(b: &[u8; CLIENT_HELLO_LEN]) -> Option<Self> {
        let endpoint = QpEndpoint::from_bytes(&b[..ENDPOINT_WIRE_LEN])?;
        let slots = u16::from_le_bytes([b[ENDPOINT_WIRE_LEN], b[ENDPOINT_WIRE_LEN + 1]]);
        (1..=MAX_SLOTS)
            .contains(&slots)
            .then_some(Self { endpoint, slots })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_hello_round_trips_and_bounds_slots() {
        let h = ClientHello {
            endpoint: QpEndpoint {
                qpn: 17,
                psn: 99,
                lid: 0,
                gid: [1; 16],
            },
            slots: 16,
        };
        assert_eq!(ClientHello::from_bytes(&h.to_bytes()), Some(h));
        for bad in [0, MAX_SLOTS + 1] {
            let b = ClientHello { slots: bad, ..h }.to_bytes();
            assert_eq!(ClientHello::from_bytes(&b), None);
        }
    }
}
