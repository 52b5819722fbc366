//! farvm-memproto: what the memserver client and server share.
//!
//! - The wire protocol (version 2): constants, status codes ([`Status`]), the frame codec
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
pub const PROTOCOL_VERSION: u8 = 2;
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
            _ => return None,
        })
    }
}

/// crc32c (Castagnoli) of one page, as carried on the wire and stored next to each page.
pub fn page_crc(page: &[u8]) -> u32 {
    crc32c::crc32c(page)
}
