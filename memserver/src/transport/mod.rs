//! The page-transport abstraction shared by TCP and RDMA.
//!
//! [`PageTransport`] is what a VMM-side store needs: read a batch of pages (with presence)
//! and write a batch. The TCP implementation is the replicated [`Client`]. The one-sided RDMA
//! implementation (feature `rdma`, [`rdma`]) reads and writes the server's registered arena
//! directly; its device-independent parts — remote region bookkeeping ([`region`]), work
//! request planning ([`plan`]) and completion-status mapping ([`wc`]) — are plain code,
//! unit-tested here because this machine has no RDMA device.

pub use farvm_memproto::rdma::{endpoint, plan, region};
#[cfg(feature = "rdma")]
pub mod rdma;
pub mod wc;

use crate::client::{Client, ClientError, IoBuf, OpKind, Priority};
use crate::protocol::{MAX_PAGES_PER_FRAME, PAGE_SIZE};

/// A way to move pages between this host and memory servers.
pub trait PageTransport: Send + Sync {
    /// Short name for logs ("tcp", "rdma").
    fn name(&self) -> &'static str;
    /// Reads `pages` of `ns` into `dst` (`pages.len()` × 4096 bytes); `present[i]` tells
    /// whether page i was stored (absent pages are zero-filled in `dst`).
    fn read_pages(
        &self,
        ns: u64,
        pages: &[u64],
        dst: &mut [u8],
        present: &mut [bool],
    ) -> Result<(), ClientError>;
    /// Writes `pages` of `ns` from `src` (`pages.len()` × 4096 bytes).
    fn write_pages(&self, ns: u64, pages: &[u64], src: &[u8]) -> Result<(), ClientError>;
}

fn check_shapes(pages: &[u64], bytes: usize) -> Result<(), ClientError> {
    if bytes != pages.len() * PAGE_SIZE {
        return Err(ClientError::InvalidRequest(
            "buffer length must be 4096 x number of pages",
        ));
    }
    Ok(())
}

/// Groups consecutive entries of `pages` that share a slab, at most 256 per group.
fn groups(pages: &[u64], slab_pages: u64) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= pages.len() {
            return None;
        }
        let slab = pages[at] / slab_pages;
        let start = at;
        while at < pages.len() && at - start < MAX_PAGES_PER_FRAME && pages[at] / slab_pages == slab
        {
            at += 1;
        }
        Some(start..at)
    })
}

impl PageTransport for Client {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn read_pages(
        &self,
        ns: u64,
        pages: &[u64],
        dst: &mut [u8],
        present: &mut [bool],
    ) -> Result<(), ClientError> {
        check_shapes(pages, dst.len())?;
        if present.len() != pages.len() {
            return Err(ClientError::InvalidRequest("present.len() != pages.len()"));
        }
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut io = IoBuf::new(MAX_PAGES_PER_FRAME);
        for g in groups(pages, self.slab_pages()) {
            io.set_scatter(&pages[g.clone()])?;
            self.submit(OpKind::Read, ns, Priority::Demand, io, 0, &tx)
                .map_err(|(e, _)| e)?;
            let c = crate::client::wait(&rx, self.spin());
            io = c.io;
            c.result?;
            for (k, i) in g.enumerate() {
                let d = &mut dst[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
                present[i] = io.is_present(k);
                if present[i] {
                    d.copy_from_slice(io.page(k));
                } else {
                    d.fill(0);
                }
            }
        }
        Ok(())
    }

    fn write_pages(&self, ns: u64, pages: &[u64], src: &[u8]) -> Result<(), ClientError> {
        check_shapes(pages, src.len())?;
        let (tx, rx) = crossbeam_channel::bounded(1);
        let mut io = IoBuf::new(MAX_PAGES_PER_FRAME);
        for g in groups(pages, self.slab_pages()) {
            io.set_scatter(&pages[g.clone()])?;
            io.data_mut()
                .copy_from_slice(&src[g.start * PAGE_SIZE..g.end * PAGE_SIZE]);
            self.submit(OpKind::Write, ns, Priority::Demand, io, 0, &tx)
                .map_err(|(e, _)| e)?;
            let c = crate::client::wait(&rx, self.spin());
            io = c.io;
            c.result?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::groups;

    #[test]
    fn groups_split_at_slab_boundaries_and_frame_limit() {
        let pages: Vec<u64> = (1020..1030).chain(5000..5300).collect();
        let g: Vec<_> = groups(&pages, 1024).collect();
        // 1020..1024 | 1024..1030 | 5000..5120 | 5120..5300 (180 pages, under the frame limit)
        assert_eq!(g, vec![0..4, 4..10, 10..130, 130..310]);
        let long: Vec<u64> = (0..600).collect();
        let g: Vec<_> = groups(&long, 1 << 18).collect();
        assert_eq!(g, vec![0..256, 256..512, 512..600]);
    }
}
