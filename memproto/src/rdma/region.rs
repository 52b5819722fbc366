//! Remote-region bookkeeping for one-sided access: which registered server memory (address,
//! rkey) backs each slab of a namespace, and where a given page lives in it.
//!
//! A server grants a slab as one contiguous, page-aligned range of its registered arena; the
//! client then computes every page's remote address locally, with bounds checks, so a bad
//! grant can never make the client touch memory outside it.

use rustc_hash::FxHashMap;

use crate::PAGE_SIZE;

/// Bookkeeping errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum RegionError {
    /// No region granted for this page's slab.
    #[error("page {page} of namespace {ns} has no remote region")]
    Unmapped {
        /// Namespace.
        ns: u64,
        /// Page.
        page: u64,
    },
    /// The region's size is not one slab, its address is not page aligned, or it wraps.
    #[error("invalid remote region: {0}")]
    Invalid(&'static str),
}

/// A contiguous range of a server's registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteRegion {
    /// Server index (client's server list).
    pub server: u16,
    /// Remote virtual address of the first page.
    pub addr: u64,
    /// Remote key of the memory region.
    pub rkey: u32,
    /// Length in pages.
    pub pages: u64,
}

/// Wire size of a region grant.
pub const REGION_WIRE_LEN: usize = 22;

impl RemoteRegion {
    /// Encodes a grant (little endian: server u16, addr u64, rkey u32, pages u64).
    pub fn to_bytes(&self) -> [u8; REGION_WIRE_LEN] {
        let mut b = [0u8; REGION_WIRE_LEN];
        b[0..2].copy_from_slice(&self.server.to_le_bytes());
        b[2..10].copy_from_slice(&self.addr.to_le_bytes());
        b[10..14].copy_from_slice(&self.rkey.to_le_bytes());
        b[14..22].copy_from_slice(&self.pages.to_le_bytes());
        b
    }

    /// Decodes a grant.
    pub fn from_bytes(b: &[u8]) -> Result<Self, RegionError> {
        if b.len() != REGION_WIRE_LEN {
            return Err(RegionError::Invalid("grant must be 22 bytes"));
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        Ok(Self {
            server: u16::from_le_bytes([b[0], b[1]]),
            addr: u64_at(2),
            rkey: u32::from_le_bytes([b[10], b[11], b[12], b[13]]),
            pages: u64_at(14),
        })
    }
}

/// Where one page lives remotely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemotePage {
    /// Server index.
    pub server: u16,
    /// Remote address.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
}

/// (namespace, slab) → region.
#[derive(Debug)]
pub struct RegionMap {
    slab_pages: u64,
    map: FxHashMap<(u64, u64), RemoteRegion>,
}

impl RegionMap {
    /// An empty map for slabs of `slab_pages` pages.
    pub fn new(slab_pages: u64) -> Result<Self, RegionError> {
        if slab_pages == 0 {
            return Err(RegionError::Invalid("slab of 0 pages"));
        }
        Ok(Self {
            slab_pages,
            map: FxHashMap::default(),
        })
    }

    /// Records the grant for slab `slab` of `ns` (replacing an older one).
    pub fn insert(&mut self, ns: u64, slab: u64, r: RemoteRegion) -> Result<(), RegionError> {
        if r.pages != self.slab_pages {
            return Err(RegionError::Invalid("region is not exactly one slab"));
        }
        if !r.addr.is_multiple_of(PAGE_SIZE as u64) {
            return Err(RegionError::Invalid("region address not page aligned"));
        }
        let bytes = r
            .pages
            .checked_mul(PAGE_SIZE as u64)
            .ok_or(RegionError::Invalid("region too large"))?;
        r.addr
            .checked_add(bytes)
            .ok_or(RegionError::Invalid("region wraps the address space"))?;
        self.map.insert((ns, slab), r);
        Ok(())
    }

    /// Drops a grant (server died or slab moved).
    pub fn remove(&mut self, ns: u64, slab: u64) -> Option<RemoteRegion> {
        self.map.remove(&(ns, slab))
    }

    /// Drops every grant on `server`; returns how many.
    pub fn remove_server(&mut self, server: u16) -> usize {
        let before = self.map.len();
        self.map.retain(|_, r| r.server != server);
        before - self.map.len()
    }

    /// The grant of the slab holding `page` of `ns`.
    pub fn region(&self, ns: u64, page: u64) -> Result<RemoteRegion, RegionError> {
        self.map
            .get(&(ns, page / self.slab_pages))
            .copied()
            .ok_or(RegionError::Unmapped { ns, page })
    }

    /// Whether the slab holding `page` of `ns` is granted.
    pub fn contains(&self, ns: u64, page: u64) -> bool {
        self.map.contains_key(&(ns, page / self.slab_pages))
    }

    /// Remote location of `page` of `ns`.
    pub fn locate(&self, ns: u64, page: u64) -> Result<RemotePage, RegionError> {
        let slab = page / self.slab_pages;
        let r = self
            .map
            .get(&(ns, slab))
            .ok_or(RegionError::Unmapped { ns, page })?;
        let off = (page % self.slab_pages) * PAGE_SIZE as u64;
        Ok(RemotePage {
            server: r.server,
            addr: r.addr + off,
            rkey: r.rkey,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn region(addr: u64) -> RemoteRegion {
        RemoteRegion {
            server: 1,
            addr,
            rkey: 0xabcd,
            pages: 1024,
        }
    }

    #[test]
    fn locate_computes_addresses_within_the_grant() {
        let mut m = RegionMap::new(1024).unwrap();
        m.insert(7, 2, region(0x10_0000)).unwrap();
        let p = m.locate(7, 2 * 1024 + 5).unwrap();
        assert_eq!(
            p,
            RemotePage {
                server: 1,
                addr: 0x10_0000 + 5 * 4096,
                rkey: 0xabcd
            }
        );
        assert_eq!(
            m.locate(7, 3 * 1024 - 1).unwrap().addr,
            0x10_0000 + 1023 * 4096
        );
        assert_eq!(
            m.locate(7, 3 * 1024),
            Err(RegionError::Unmapped { ns: 7, page: 3072 })
        );
        assert!(m.locate(8, 2048).is_err());
        assert_eq!(m.region(7, 2 * 1024 + 9), Ok(region(0x10_0000)));
        assert!(m.contains(7, 2048) && !m.contains(7, 3072));
        assert_eq!(m.remove_server(1), 1);
        assert!(m.locate(7, 2048).is_err());
    }

    #[test]
    fn bad_grants_are_rejected() {
        let mut m = RegionMap::new(1024).unwrap();
        assert!(m.insert(1, 0, region(0x1001)).is_err());
        assert!(m
            .insert(
                1,
                0,
                RemoteRegion {
                    pages: 1023,
                    ..region(0)
                }
            )
            .is_err());
        assert!(m.insert(1, 0, region(u64::MAX - 4095)).is_err());
        assert!(RegionMap::new(0).is_err());
    }

    #[test]
    fn grant_round_trips_on_the_wire() {
        let r = RemoteRegion {
            server: 3,
            addr: 0xdead_b000,
            rkey: 77,
            pages: 1 << 18,
        };
        assert_eq!(RemoteRegion::from_bytes(&r.to_bytes()).unwrap(), r);
        assert!(RemoteRegion::from_bytes(&[0u8; 5]).is_err());
    }
}
