//! The `none` baseline: never prefetches (every first access is a demand miss).

use crate::{Candidates, Nanos, PageNo, Prefetcher, ProcessKey};

/// Proposes nothing.
#[derive(Debug, Default)]
pub struct NoPrefetch;

impl Prefetcher for NoPrefetch {
    fn name(&self) -> &'static str {
        "none"
    }
    fn on_fault(&mut self, _key: ProcessKey, _page: PageNo, _now: Nanos, out: &mut Candidates) {
        out.clear();
    }
    fn on_hit(&mut self, _key: ProcessKey, _page: PageNo, _now: Nanos) {}
    fn forget(&mut self, _key: ProcessKey) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_nothing() {
        let mut p = NoPrefetch;
        let mut out = Candidates::new();
        out.push(3);
        p.on_fault(1, 10, 0, &mut out);
        assert!(out.is_empty());
    }
}
