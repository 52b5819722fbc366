//! Eviction spans: the ranges the evictor unmaps for a round of victims.
//!
//! The kernel flushes the TLB (an IPI to every other CPU running the VM's threads, and a KVM
//! remote flush for the guest view) once per range it unmaps dirty shared page-table entries
//! from, and every entry `UFFDIO_CONTINUE` installs is dirty. A round of scattered victims
//! (a stride, a hash table) unmapped run by run therefore costs one shootdown per victim.
//! Bridging the gaps between victims whose pages have no mapping anyway (never written,
//! remote, or being evicted) turns such a round into a few long ranges: one flush each.
//!
//! Bridging is a cost choice only. A page in a gap that got mapped after its state was read
//! here (a prefetch landing meanwhile) is unmapped with the range; it is `LOCAL` with its data
//! in the memfd, so the guest's next touch faults and the fault handler maps it again, as for a
//! page the evictor gave back. The memfd data of gap pages is never touched: ranges are only
//! unmapped (`MADV_DONTNEED`), pages are freed (`MADV_REMOVE`) run by run of victims alone.

use crate::state::{self as st, state_of, PageTable};

/// Longest gap of unmapped pages bridged between two victims. Unmapping an empty range costs
/// a page-table walk and a KVM rmap lookup per page, far less than a shootdown.
pub(crate) const MAX_GAP: u64 = 64;

/// Whether page state `s` has no guest or alias mapping to lose (no data in the memfd, or
/// already unmapped by an eviction).
fn unmapped(s: u32) -> bool {
    matches!(s, st::NEVER | st::REMOTE | st::EVICTING)
}

/// Fills `out` with ranges `(first page, pages)` covering every page of `pages` (ascending,
/// distinct): consecutive victims share a range when at most [`MAX_GAP`] pages lie between
/// them and all of those are unmapped by their state now.
pub(crate) fn bridge(table: &PageTable, pages: &[u64], out: &mut Vec<(u64, u64)>) {
    out.clear();
    let mut iter = pages.iter().copied();
    let Some(first) = iter.next() else {
        return;
    };
    let (mut start, mut last) = (first, first);
    for p in iter {
        debug_assert!(p > last, "victims must be ascending and distinct");
        let gap = p - last - 1;
        if gap > MAX_GAP || !(last + 1..p).all(|g| unmapped(state_of(table.load(g)))) {
            out.push((start, last - start + 1));
            start = p;
        }
        last = p;
    }
    out.push((start, last - start + 1));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(states: &[u32]) -> PageTable {
        let t = PageTable::new(states.len() as u64);
        for (p, &s) in states.iter().enumerate() {
            t.cas(p as u64, st::NEVER, s).unwrap();
        }
        t
    }

    #[test]
    fn bridges_gaps_of_unmapped_pages_only() {
        use st::{EVICTING as E, INFLIGHT as I, LOCAL as L, NEVER as N, REMOTE as R};
        //                 0  1  2  3  4  5  6  7  8  9
        let t = table(&[E, R, N, E, L, E, I, E, E, R]);
        let mut out = Vec::new();
        // 0..3 bridged over REMOTE and NEVER; 3|5 split by LOCAL 4; 5|7 split by INFLIGHT 6;
        // 7, 8 adjacent.
        bridge(&t, &[0, 3, 5, 7, 8], &mut out);
        assert_eq!(out, vec![(0, 4), (5, 1), (7, 2)]);
        bridge(&t, &[], &mut out);
        assert!(out.is_empty());
        bridge(&t, &[9], &mut out);
        assert_eq!(out, vec![(9, 1)]);
    }

    /// A page in a bridged gap that is mapped and holds data (its state was read as
    /// unmapped before a prefetch landed in it) keeps its data through the round's unmap and
    /// free; only the victims are freed.
    #[test]
    fn a_page_mapped_in_a_bridged_gap_keeps_its_data() {
        use crate::sys::mem::GuestRam;
        use crate::PAGE_SIZE;
        let ram = GuestRam::new(16 * PAGE_SIZE).expect("memfd");
        let word = |p: u64| 0x5eed_0000_0000_0000 | p;
        for p in 0..8u64 {
            // SAFETY: page `p` < 16 lies inside the guest view; nothing else maps it here.
            unsafe { core::ptr::write_volatile(ram.guest_page_addr(p) as *mut u64, word(p)) };
        }
        // Victims 0, 2, 4; 1 and 3 read as unmapped (stale: they hold data and are mapped).
        let t = table(&[
            st::EVICTING,
            st::REMOTE,
            st::EVICTING,
            st::NEVER,
            st::EVICTING,
        ]);
        let mut spans = Vec::new();
        let victims = [0, 2, 4];
        bridge(&t, &victims, &mut spans);
        assert_eq!(spans, vec![(0, 5)]);
        let before = ram.resident_count().unwrap();
        ram.zap_guest_spans(&spans).unwrap();
        ram.unmap_alias_spans(&spans).unwrap();
        ram.free(&victims).unwrap();
        assert_eq!(
            ram.resident_count().unwrap(),
            before - 3,
            "the victims are freed"
        );
        for p in 0..8u64 {
            let want = if victims.contains(&p) { 0 } else { word(p) };
            // SAFETY: in bounds of both views; reading faults the memfd page back in.
            let (alias, guest) = unsafe {
                (
                    core::ptr::read_volatile(ram.alias_page(p) as *const u64),
                    core::ptr::read_volatile(ram.guest_page_addr(p) as *const u64),
                )
            };
            assert_eq!((alias, guest), (want, want), "page {p}");
        }
        // A span reaching past guest RAM is refused, not advised.
        for bad in [(15, 2), (u64::MAX, 2)] {
            let e = ram.zap_guest_spans(&[bad]).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{bad:?}");
            assert!(ram.unmap_alias_spans(&[bad]).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn never_bridges_more_than_max_gap() {
        let n = (2 * MAX_GAP + 4) as usize;
        let t = table(&vec![st::REMOTE; n]);
        let mut out = Vec::new();
        let far = MAX_GAP + 1; // MAX_GAP pages between 0 and `far`: bridged
        bridge(&t, &[0, far, n as u64 - 1], &mut out);
        // `far`..n-1 has MAX_GAP + 1 pages between: not bridged.
        assert_eq!(out, vec![(0, far + 1), (n as u64 - 1, 1)]);
    }
}
