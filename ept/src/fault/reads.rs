//! The fault handler's read batches: reads of one round collected per priority and submitted
//! together through the store port, demand reads first served one by one on this thread where
//! the store can (`RemoteStore::read_now`). Fixed arrays: no allocation per read.

use std::sync::Arc;

use crate::installer::Installer;
use crate::pagemeta::PageMeta;
use crate::port::StorePort;
use crate::store::{Priority, ReadReq, Version};

/// Reads per store call.
const BATCH: usize = 64;

struct Batch {
    /// `reqs[..n]` are queued; the rest are placeholders (never submitted).
    reqs: [ReadReq; BATCH],
    n: usize,
}

pub(super) struct Reads {
    demand: Batch,
    prefetch: Batch,
    port: Arc<StorePort>,
    meta: Arc<PageMeta>,
    installer: Arc<Installer>,
}

impl Reads {
    pub fn new(port: Arc<StorePort>, meta: Arc<PageMeta>, installer: Arc<Installer>) -> Self {
        let empty = |priority| Batch {
            reqs: [ReadReq {
                page: 0,
                priority,
                dst: installer.page_buf(0),
                version: Version::UNKNOWN,
            }; BATCH],
            n: 0,
        };
        Self {
            demand: empty(Priority::Demand),
            prefetch: empty(Priority::Prefetch),
            port,
            meta,
            installer,
        }
    }

    /// Queues a read of page `p`, which the caller moved to INFLIGHT (the read owns it until
    /// its completion).
    pub fn push(&mut self, p: u64, priority: Priority, now: u64) {
        self.meta.set_io_at(p, now);
        let batch = match priority {
            Priority::Demand => &mut self.demand,
            Priority::Prefetch => &mut self.prefetch,
        };
        batch.reqs[batch.n] = ReadReq {
            page: p,
            priority,
            dst: self.installer.page_buf(p),
            version: self.meta.version(p),
        };
        batch.n += 1;
        if batch.n == BATCH {
            match priority {
                Priority::Demand => self.flush_demand(),
                Priority::Prefetch => self.flush_prefetch(),
            }
        }
    }

    /// Assigns a batch's pages free frames to land in (anon backing: pool positions, no
    /// syscall), neighbours in consecutive frames so that each run installs with one move, and
    /// points each request at its page's landing place.
    fn assign_frames(installer: &Installer, reqs: &mut [ReadReq]) {
        let mut pages = [0u64; BATCH];
        for (d, r) in pages.iter_mut().zip(reqs.iter()) {
            *d = r.page;
        }
        let pages = &mut pages[..reqs.len()];
        pages.sort_unstable();
        installer.assign_frames(pages);
        for r in reqs.iter_mut() {
            r.dst = installer.page_buf(r.page);
        }
    }

    /// Submits the queued demand reads: each served on this thread where the store can, the
    /// rest as one batch.
    pub fn flush_demand(&mut self) {
        let b = &mut self.demand;
        let n = std::mem::take(&mut b.n);
        Self::assign_frames(&self.installer, &mut b.reqs[..n]);
        let mut left = 0;
        for i in 0..n {
            let r = b.reqs[i];
            if !self.port.read_now(&r) {
                b.reqs[left] = r;
                left += 1;
            }
        }
        self.port.read(&b.reqs[..left]);
    }

    pub fn flush_prefetch(&mut self) {
        let b = &mut self.prefetch;
        let n = std::mem::take(&mut b.n);
        Self::assign_frames(&self.installer, &mut b.reqs[..n]);
        self.port.read(&b.reqs[..n]);
    }
}
