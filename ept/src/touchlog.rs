//! The touch log: the order in which pages became resident (first mapped into the guest
//! view: a demand read, a zero fill, an injected prefetch, a VMM access) since the engine
//! started or the log was last restarted, each page once. A snapshot keeps the resident part
//! of it as the guest's working set in first-touch order, which a restore fetches in that
//! order (`farvm run --restore-pages working-set`, the idea of REAP, ASPLOS'21).
//!
//! Owns a bitmap of the pages logged and the log itself, both allocated once for all of
//! guest RAM (4 bytes and a bit per page: a 4 GiB guest's log is 4.1 MiB); recording is a
//! relaxed load for a page logged already and two atomic operations for a new one, from any
//! thread that installs a page, with no lock and no allocation.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

pub(crate) struct TouchLog {
    /// One bit per page: logged already.
    seen: Box<[AtomicU64]>,
    /// Page numbers in the order they were first installed (pages past 2^32 - 1, guests
    /// over 16 TiB, are not logged).
    order: Box<[AtomicU32]>,
    /// Entries claimed in `order` (may pass its length by racing claims; never read past).
    len: AtomicUsize,
}

impl TouchLog {
    /// A log for `pages` pages of guest RAM.
    pub fn new(pages: u64) -> Self {
        let pages = usize::try_from(pages).unwrap_or(usize::MAX);
        Self {
            seen: (0..pages.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            order: (0..pages.min(u32::MAX as usize))
                .map(|_| AtomicU32::new(u32::MAX))
                .collect(),
            len: AtomicUsize::new(0),
        }
    }

    /// Logs page `p` if it was not logged since the last restart.
    #[inline]
    pub fn record(&self, p: u64) {
        let Ok(page) = u32::try_from(p) else {
            return;
        };
        if page as usize >= self.order.len() {
            return;
        }
        let Some(word) = self.seen.get((p / 64) as usize) else {
            return;
        };
        let bit = 1u64 << (p % 64);
        // A plain load first: after its first install a page costs no write to the shared
        // word (installs of pages already logged are the common case).
        if word.load(Ordering::Relaxed) & bit != 0
            || word.fetch_or(bit, Ordering::Relaxed) & bit != 0
        {
            return;
        }
        let at = self.len.fetch_add(1, Ordering::Relaxed);
        if let Some(slot) = self.order.get(at) {
            slot.store(page, Ordering::Relaxed);
        }
    }

    /// Forgets every entry (the VMM calls it when a restored guest is about to run, so that
    /// what the restore itself loaded is not taken for the guest's touches).
    pub fn restart(&self) {
        for w in self.seen.iter() {
            w.store(0, Ordering::Relaxed);
        }
        self.len.store(0, Ordering::Relaxed);
    }

    /// The pages logged, in order.
    pub fn pages(&self) -> Vec<u64> {
        let n = self.len.load(Ordering::Acquire).min(self.order.len());
        self.order[..n]
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .filter(|&p| p != u32::MAX)
            .map(u64::from)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_page_is_logged_once_in_first_touch_order_until_restarted() {
        let log = TouchLog::new(200);
        for p in [7, 3, 7, 130, 3, 0, 199] {
            log.record(p);
        }
        log.record(200); // outside guest RAM: ignored
        assert_eq!(log.pages(), vec![7, 3, 130, 0, 199]);
        log.restart();
        assert!(log.pages().is_empty());
        log.record(3);
        log.record(9);
        assert_eq!(log.pages(), vec![3, 9]);
    }
}
