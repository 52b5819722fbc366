//! The queue-pair address exchanged (over the TCP control connection) before one-sided RDMA:
//! QP number, starting packet sequence number, LID and GID.

/// Wire size of an endpoint.
pub const ENDPOINT_WIRE_LEN: usize = 26;

/// One side of a reliable-connected queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEndpoint {
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Initial packet sequence number (24 bits).
    pub psn: u32,
    /// Port LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// Port GID (RoCE addressing).
    pub gid: [u8; 16],
}

impl QpEndpoint {
    /// Little-endian encoding: qpn u32, psn u32, lid u16, gid 16 bytes.
    pub fn to_bytes(&self) -> [u8; ENDPOINT_WIRE_LEN] {
        let mut b = [0u8; ENDPOINT_WIRE_LEN];
        b[0..4].copy_from_slice(&self.qpn.to_le_bytes());
        b[4..8].copy_from_slice(&self.psn.to_le_bytes());
        b[8..10].copy_from_slice(&self.lid.to_le_bytes());
        b[10..26].copy_from_slice(&self.gid);
        b
    }

    /// Decodes; `None` if the length is wrong or a 24-bit field overflows.
    pub fn from_bytes(b: &[u8]) -> Option<Self> {
        if b.len() != ENDPOINT_WIRE_LEN {
            return None;
        }
        let qpn = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let psn = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        if qpn >> 24 != 0 || psn >> 24 != 0 {
            return None;
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[10..26]);
        Some(Self {
            qpn,
            psn,
            lid: u16::from_le_bytes([b[8], b[9]]),
            gid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_round_trip_and_validation() {
        let e = QpEndpoint {
            qpn: 0x12345,
            psn: 0xabcdef,
            lid: 3,
            gid: [7; 16],
        };
        assert_eq!(QpEndpoint::from_bytes(&e.to_bytes()), Some(e));
        let mut b = e.to_bytes();
        b[3] = 1; // qpn above 24 bits
        assert_eq!(QpEndpoint::from_bytes(&b), None);
        assert_eq!(QpEndpoint::from_bytes(&b[..20]), None);
    }
}
