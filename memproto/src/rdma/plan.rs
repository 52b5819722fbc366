//! Work-request planning for one-sided transfers: turns a page batch into as few RDMA
//! READ/WRITE work requests as possible by merging pages that are contiguous both remotely
//! (same rkey, next address) and in the local buffer, up to a per-request byte limit.
//!
//! `wr_id` carries the batch tag (high 32 bits) and the first page's index in the batch (low
//! 32 bits), so a completion identifies which pages it covers without any lookup table.

use super::region::{RegionError, RegionMap};
use crate::PAGE_SIZE;

/// One planned work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkRequest {
    /// Batch tag and first page index.
    pub wr_id: u64,
    /// Server the request goes to.
    pub server: u16,
    /// Remote address.
    pub remote_addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Offset in the local (registered) buffer.
    pub local_offset: usize,
    /// Bytes.
    pub len: u32,
}

/// Builds `wr_id` from a batch tag and a page index.
pub fn wr_id(tag: u32, first: u32) -> u64 {
    (tag as u64) << 32 | first as u64
}

/// Splits a `wr_id` into (tag, first page index).
pub fn split_wr_id(id: u64) -> (u32, u32) {
    ((id >> 32) as u32, id as u32)
}

/// Plans transfers of `pages` (page i at local offset i × 4096) into `out` (cleared first;
/// reuse it to avoid allocation). `max_bytes` ≥ 4096 bounds each request.
pub fn plan(
    regions: &RegionMap,
    ns: u64,
    pages: &[u64],
    tag: u32,
    max_bytes: u32,
    out: &mut Vec<WorkRequest>,
) -> Result<(), RegionError> {
    out.clear();
    let max_bytes = max_bytes.max(PAGE_SIZE as u32);
    for (i, &p) in pages.iter().enumerate() {
        let loc = regions.locate(ns, p)?;
        if let Some(last) = out.last_mut() {
            let contiguous = last.server == loc.server
                && last.rkey == loc.rkey
                && last.remote_addr + last.len as u64 == loc.addr
                && last.local_offset + last.len as usize == i * PAGE_SIZE
                && last.len + PAGE_SIZE as u32 <= max_bytes;
            if contiguous {
                last.len += PAGE_SIZE as u32;
                continue;
            }
        }
        out.push(WorkRequest {
            wr_id: wr_id(tag, i as u32),
            server: loc.server,
            remote_addr: loc.addr,
            rkey: loc.rkey,
            local_offset: i * PAGE_SIZE,
            len: PAGE_SIZE as u32,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::region::RemoteRegion;

    fn map() -> RegionMap {
        let mut m = RegionMap::new(256).unwrap();
        let r = |server, addr| RemoteRegion {
            server,
            addr,
            rkey: server as u32 + 10,
            pages: 256,
        };
        m.insert(1, 0, r(0, 0x100000)).unwrap();
        m.insert(1, 1, r(0, 0x100000 + 256 * 4096)).unwrap(); // adjacent remotely
        m.insert(1, 2, r(1, 0x900000)).unwrap();
        m
    }

    #[test]
    fn contiguous_runs_merge_and_breaks_split() {
        let m = map();
        let mut out = Vec::new();
        // 250..262 is contiguous across the slab boundary (adjacent grants, same rkey).
        let pages: Vec<u64> = (250..262).chain([300, 301, 520]).collect();
        plan(&m, 1, &pages, 9, 1 << 20, &mut out).unwrap();
        assert_eq!(out.len(), 3, "{out:?}");
        assert_eq!(out[0].len, 12 * 4096);
        assert_eq!(out[0].remote_addr, 0x100000 + 250 * 4096);
        assert_eq!(split_wr_id(out[1].wr_id), (9, 12));
        assert_eq!(out[1].len, 2 * 4096);
        assert_eq!(
            (out[2].server, out[2].rkey, out[2].local_offset),
            (1, 11, 14 * 4096)
        );
    }

    #[test]
    fn byte_limit_and_reversed_order_split() {
        let m = map();
        let mut out = Vec::new();
        plan(&m, 1, &[0, 1, 2, 3, 4], 1, 2 * 4096, &mut out).unwrap();
        assert_eq!(
            out.iter().map(|w| w.len / 4096).collect::<Vec<_>>(),
            vec![2, 2, 1]
        );
        // Remotely contiguous but locally reversed: no merge.
        plan(&m, 1, &[5, 4], 1, 1 << 20, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert!(plan(&m, 2, &[0], 1, 4096, &mut out).is_err());
    }
}
