//! Slab grants for one-sided access: what a client asks for on the TCP control connection of
//! an RDMA session, and what the server answers (PROTOCOL.md, "One-sided pages").
//!
//! A granted slab is [`GRANT_SLAB_PAGES`] pages of a namespace laid out contiguously in the
//! server's arena and registered for remote read and write, followed by its page table: one
//! little-endian u64 [`MetaWord`] per page (crc32c and a presence bit). The client reads and
//! writes both with RDMA READ/WRITE; the server's own index reads the same words, so TCP and
//! two-sided requests see what one-sided writes stored and the other way round.

use super::region::RemoteRegion;
use crate::PAGE_SIZE;

/// Pages per granted slab.
pub const GRANT_SLAB_PAGES: u64 = 256;
/// Bytes of a granted slab's data (its page table follows at this offset).
pub const GRANT_DATA_BYTES: u64 = GRANT_SLAB_PAGES * PAGE_SIZE as u64;
/// Bytes of one page-table entry.
pub const META_BYTES: usize = 8;
/// Arena pages a granted slab occupies: its data, then one page holding its page table.
pub const GRANT_EXTENT_PAGES: u64 = GRANT_SLAB_PAGES + 1;

/// Wire size of a grant request: tag, namespace, slab.
pub const GRANT_REQUEST_LEN: usize = 17;
/// Wire size of a grant reply: status, then the region.
pub const GRANT_REPLY_LEN: usize = 1 + super::region::REGION_WIRE_LEN;
/// First byte of a grant request.
pub const GRANT_TAG: u8 = 0x47;

/// One page's entry in a granted slab's page table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetaWord(pub u64);

impl MetaWord {
    const PRESENT: u64 = 1 << 32;

    /// The entry of a present page with checksum `crc`.
    pub fn present(crc: u32) -> Self {
        Self(Self::PRESENT | crc as u64)
    }

    /// The entry of an absent page.
    pub const ABSENT: Self = Self(0);

    /// Whether the page is stored.
    pub fn is_present(self) -> bool {
        self.0 & Self::PRESENT != 0
    }

    /// The page's crc32c (meaningful when present).
    pub fn crc(self) -> u32 {
        self.0 as u32
    }
}

/// A client's request for the grant of slab `slab` of namespace `ns`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GrantRequest {
    /// Namespace.
    pub ns: u64,
    /// Slab (page index / [`GRANT_SLAB_PAGES`]).
    pub slab: u64,
}

impl GrantRequest {
    /// Encoding: [`GRANT_TAG`], ns u64, slab u64 (little endian).
    pub fn to_bytes(&self) -> [u8; GRANT_REQUEST_LEN] {
        let mut b = [0u8; GRANT_REQUEST_LEN];
        b[0] = GRANT_TAG;
        b[1..9].copy_from_slice(&self.ns.to_le_bytes());
        b[9..17].copy_from_slice(&self.slab.to_le_bytes());
        b
    }

    /// Decodes; `None` without the tag.
    pub fn from_bytes(b: &[u8; GRANT_REQUEST_LEN]) -> Option<Self> {
        if b[0] != GRANT_TAG {
            return None;
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[1..9]);
        let ns = u64::from_le_bytes(a);
        a.copy_from_slice(&b[9..17]);
        Some(Self {
            ns,
            slab: u64::from_le_bytes(a),
        })
    }
}

/// Encodes a grant reply: status byte (`crate::Status` as u8; 0 = OK), then the region
/// (all zero unless OK).
pub fn reply_bytes(status: u8, region: &RemoteRegion) -> [u8; GRANT_REPLY_LEN] {
    let mut b = [0u8; GRANT_REPLY_LEN];
    b[0] = status;
    if status == 0 {
        b[1..].copy_from_slice(&region.to_bytes());
    }
    b
}

/// Decodes a grant reply: `Ok(region)` or `Err(status byte)`; a malformed OK reply is
/// `Err(0xff)`.
pub fn parse_reply(b: &[u8; GRANT_REPLY_LEN]) -> Result<RemoteRegion, u8> {
    if b[0] != 0 {
        return Err(b[0]);
    }
    let r = RemoteRegion::from_bytes(&b[1..]).map_err(|_| 0xffu8)?;
    if r.pages != GRANT_SLAB_PAGES || !r.addr.is_multiple_of(PAGE_SIZE as u64) {
        return Err(0xff);
    }
    Ok(r)
}

/// Remote address of page `page`'s page-table entry, in the slab granted as `r`.
pub fn meta_addr(r: &RemoteRegion, page: u64) -> u64 {
    r.addr + GRANT_DATA_BYTES + (page % GRANT_SLAB_PAGES) * META_BYTES as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_round_trip() {
        let q = GrantRequest { ns: 9, slab: 3 };
        assert_eq!(GrantRequest::from_bytes(&q.to_bytes()), Some(q));
        let mut bad = q.to_bytes();
        bad[0] = 0;
        assert_eq!(GrantRequest::from_bytes(&bad), None);
        let r = RemoteRegion {
            server: 0,
            addr: 0x7f00_0000_0000,
            rkey: 77,
            pages: GRANT_SLAB_PAGES,
        };
        assert_eq!(parse_reply(&reply_bytes(0, &r)), Ok(r));
        assert_eq!(parse_reply(&reply_bytes(3, &r)), Err(3));
        let odd = RemoteRegion { pages: 5, ..r };
        assert_eq!(parse_reply(&reply_bytes(0, &odd)), Err(0xff));
        assert_eq!(meta_addr(&r, 3 * 256 + 2), r.addr + GRANT_DATA_BYTES + 16);
    }

    #[test]
    fn meta_words_carry_presence_and_crc() {
        let m = MetaWord::present(0xdead_beef);
        assert!(m.is_present());
        assert_eq!(m.crc(), 0xdead_beef);
        assert!(!MetaWord::ABSENT.is_present());
        assert!(!MetaWord(0xdead_beef).is_present());
    }
}
