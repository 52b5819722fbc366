//! The `next-n` baseline (Leap Table 2's "Next-N-Line"): on every miss, fetch the N pages that
//! follow it. Stateless, so it is the same per process or global.

use crate::{Candidates, Nanos, PageNo, Prefetcher, ProcessKey};

/// Fetches `page+1 ..= page+n` on every miss.
#[derive(Debug)]
pub struct NextN {
    n: usize,
}

impl NextN {
    /// Proposes the `n` pages after every demand miss.
    pub fn new(n: usize) -> Self {
        Self { n }
    }
}

impl Prefetcher for NextN {
    fn name(&self) -> &'static str {
        "next-n"
    }
    fn on_fault(&mut self, _key: ProcessKey, page: PageNo, _now: Nanos, out: &mut Candidates) {
        out.clear();
        // One progression, no duplicate checks: it runs on every fault of `leap+stream` too
        // (the sandbox scores it, `crate::sandbox`).
        if let Some(first) = page.checked_add(1) {
            out.push_progression(first, 1, self.n);
        }
    }
    fn on_hit(&mut self, _key: ProcessKey, _page: PageNo, _now: Nanos) {}
    fn forget(&mut self, _key: ProcessKey) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_pages_without_overflow() {
        let mut p = NextN::new(3);
        let mut out = Candidates::new();
        p.on_fault(1, 10, 0, &mut out);
        assert_eq!(out.as_slice(), &[11, 12, 13]);
        p.on_fault(1, u64::MAX - 1, 0, &mut out);
        assert_eq!(out.as_slice(), &[u64::MAX]);
    }
}
