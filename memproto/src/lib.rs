//! farvm-memproto: what the memserver client and server share.
//!
//! - The wire protocol (version 4): constants, status codes ([`Status`]), the frame codec
//!   ([`frame`]) and the challenge–response handshake ([`auth`]). The normative description is
//!   `PROTOCOL.md` next to this crate.
//! - [`rdma`]: the transport-neutral half of one-sided RDMA access (region grants, work-request
//!   planning, queue-pair addresses), plain code that both sides use and that is tested without
//!   a device.

pub mod auth;
pub mod frame;
pub mod rdma;

pub use frame::{Body, Frame, FrameError, Header, Opcode, PageSel, StatInfo};

/// Page size served by the memory server.
pub const PAGE_SIZE: usize = 4096;
/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 4;
/// Bytes of a page's seal on the wire and in the server's store: opaque to the server, which
/// stores it beside the page and returns it verbatim. The VMM's `farvm-seal` writes its 40-byte
/// `Seal` there (key id, salt, counter, tag); an unsealed page carries zeros.
pub const SEAL_LEN: usize = 40;
/// Most pages one READ, WRITE or DISCARD frame may name (1 MiB of data).
pub const MAX_PAGES_PER_FRAME: usize = 256;

/// Outcome carried in a response header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    /// Success.
    Ok = 0,
    /// The request was well formed but not acceptable (e.g. HELLO after authentication).
    BadRequest = 1,
    /// Unknown key id or wrong proof.
    AuthFailed = 2,
    /// The namespace belongs to another tenant.
    Denied = 3,
    /// The server has no free page slot for the write; nothing of the batch was stored.
    CapacityExhausted = 4,
    /// A written page's crc32c did not match its data; nothing of the batch was stored.
    ChecksumMismatch = 5,
    /// The client's version is not served.
    VersionUnsupported = 6,
    /// A data request arrived before a successful HELLO.
    NotAuthenticated = 7,
    /// The memory pool reclaimed the namespace (its VM's lease expired and the pool's
    /// collector claimed it): nothing of the request was done, and the namespace is refused
    /// from then on, so a VMM that comes back late cannot recreate it.
    Reclaimed = 8,
}

impl Status {
    /// Parses a status byte.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Ok,
            1 => Self::BadRequest,
            2 => Self::AuthFailed,
            3 => Self::Denied,
            4 => Self::CapacityExhausted,
            5 => Self::ChecksumMismatch,
            6 => Self::VersionUnsupported,
            7 => Self::NotAuthenticated,
            8 => Self::Reclaimed,
            _ => return None,
        })
    }
}

/// crc32c (Castagnoli) of one page, as carried on the wire and stored next to each page.
///
/// `crc-fast` combines the crc32 instruction with carry-less-multiplication folding (PCLMULQDQ,
/// VPCLMULQDQ where the CPU has AVX-512), chosen at run time; the `crc32c` crate runs the crc32
/// instruction alone, in three lanes. `cargo bench -p farvm-memproto --bench page_checksum`
/// times both on this host.
pub fn page_crc(page: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, page) as u32
}

/// crc32c of a wire page's seal and data, as if contiguous: what a WRITE's and a READ
/// response's wire page carries (the writer computes it, the server stores it, the reader
/// checks it). Equal to [`page_crc`] over `seal ‖ data`.
pub fn wire_crc(seal: &[u8; SEAL_LEN], data: &[u8]) -> u32 {
    let mut d = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    d.update(seal);
    d.update(data);
    d.finalize() as u32
}

/// The wire crc32c of a page carrying an all-zero seal, from the crc32c of its 4096 data bytes
/// alone (what a one-sided RDMA page table holds): a server that keeps only the data's crc
/// answers with a wire crc that still covers what it stored end to end.
pub fn unsealed_wire_crc(data_crc: u32) -> u32 {
    let zero = page_crc(&[0u8; SEAL_LEN]) as u64;
    crc_fast::checksum_combine(
        crc_fast::CrcAlgorithm::Crc32Iscsi,
        zero,
        data_crc as u64,
        PAGE_SIZE as u64,
    ) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// crc32c bit by bit (reflected polynomial 0x82F63B78): what every peer of the protocol
    /// computes, whatever kernel it runs.
    fn crc32c_reference(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// `page_crc` is crc32c (Castagnoli) exactly: the standard check value, and pages of varied
    /// content at any alignment, so pages written by peers with another crc32c kernel verify.
    #[test]
    fn page_crc_is_crc32c() {
        assert_eq!(page_crc(b"123456789"), 0xE306_9283);
        let mut buf = vec![0u8; 2 * PAGE_SIZE + 64];
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (i.wrapping_mul(2_654_435_761) >> 11) as u8;
        }
        for off in [0, 1, 7, 63] {
            let page = &buf[off..off + PAGE_SIZE];
            assert_eq!(page_crc(page), crc32c_reference(page), "offset {off}");
        }
        assert_eq!(
            page_crc(&[0u8; PAGE_SIZE]),
            crc32c_reference(&[0u8; PAGE_SIZE])
        );
        // The wire crc covers seal and data as one stream, and the unsealed form is derived
        // from the data's crc alone.
        let seal: [u8; SEAL_LEN] = std::array::from_fn(|i| i as u8 ^ 0x5a);
        let mut joined = seal.to_vec();
        joined.extend_from_slice(&buf[..PAGE_SIZE]);
        assert_eq!(wire_crc(&seal, &buf[..PAGE_SIZE]), page_crc(&joined));
        assert_eq!(
            wire_crc(&seal, &buf[..PAGE_SIZE]),
            crc32c_reference(&joined)
        );
        assert_eq!(
            unsealed_wire_crc(page_crc(&buf[..PAGE_SIZE])),
            wire_crc(&[0; SEAL_LEN], &buf[..PAGE_SIZE])
        );
        // A flipped bit is caught.
        let good = page_crc(&buf[..PAGE_SIZE]);
        buf[4000] ^= 0x10;
        assert_ne!(page_crc(&buf[..PAGE_SIZE]), good);
    }
}
