//! `leap+stream`: farvm's default prefetcher, the stream table in front of Leap, with region
//! read-around behind both; per process, a sandbox ([`crate::sandbox`]) may widen it with the
//! pages `next-n` proposes, when that process's own faults show they would save misses at
//! little waste.
//!
//! Per fault, the composite decides (the sandbox's home arm) and `next-n` proposes. At home,
//! `next-n`'s proposals are only scored against the faults that follow, never fetched; on the
//! wide arm they are added to the answer, a sample of them as markers whose hits the sandbox
//! counts (a marker hit of the composite's own stays the composite's), except while the
//! process is under memory pressure (below), where every extra page pushes out one about to be
//! used.
//!
//! The composite's own decision, per fault:
//! 1. The stream table sees the fault first. If it belongs to a *confirmed* stream, the
//!    stream's window is the answer: a stream is specific to one address region, so it wins over
//!    Leap's process-wide majority, which interleaved streams or a second thread would dilute.
//!    Leap only logs the fault in its history (no window sizing, so its `C_hit`/`PW` state is
//!    not charged with pages it did not fetch).
//! 2. Otherwise Leap decides as usual (majority trends that tolerate noise, strides larger than
//!    Δ_stream, speculative prefetch after a trend breaks).
//! 3. If neither answered, region read-around ([`crate::region`]) reads the rest of a small
//!    aligned block whose pages the process faults on out of order (allocator runs, hash
//!    tables, B-tree nodes, data segments); it logs every fault.
//! 4. If still nobody answered, run-ahead ([`crate::runahead`]) reads the next page as a
//!    marker, and a short run past each of its markers the process uses, gated by its own hit
//!    rate per process.
//!
//! While a process is under memory pressure ([`crate::pressure`]: its faults keep landing on
//! pages it faulted on, or had fetched, shortly before), `leap+stream` is cautious for it:
//! region read-around and run-ahead stay quiet and a newly confirmed stream starts with half
//! the first window. Under pressure every speculative page pushes out one the process is about to use
//! (`docs/prefetch-real-traces.md`: a numeric kernel with half its footprint local).
//!
//! The stream table here runs with two settings the plain `stream` prefetcher leaves off
//! (measured on traces of real programs, `docs/prefetch-real-traces.md`): a depth budget (a
//! window grows by at most one page per [`USED_PER_DEPTH`] pages its stream has used, so a
//! slowly consumed stream does not hold 64 pages that the LRU evicts before use), and dense
//! gaps (successive forward gaps of at most [`DENSE_GAP`] pages, even unequal, confirm a
//! stride-1 stream, as a scan whose misses skip pages produces).
//!
//! Hits: a visible hit goes to both. A marker hit goes to the component that issued the marker
//! (the stream if it owns it, then run-ahead, else Leap), so each keeps learning in injected mode: the stream
//! continues its pipeline, Leap credits its window (its markers are on in this composite).
//! The pages a Leap marker hit credits are also reported to the stream table as hits: they are
//! accesses it would otherwise never see, and a stream forming under Leap's windows would learn
//! the width of the gaps between them as its stride.

use crate::leap::{Leap, LeapParams};
use crate::next_n::NextN;
use crate::pressure::Pressure;
use crate::region::{Region, RegionParams};
use crate::runahead::RunAhead;
use crate::sandbox::{Sandbox, HOME, WIDE};
use crate::stream::{Stream, StreamParams};
use crate::{Candidates, Nanos, PageNo, Prefetcher, ProcessKey};

/// Depth budget of the stream table inside `leap+stream` (see the module documentation).
pub const USED_PER_DEPTH: u64 = 16;
/// Largest unequal gap that still confirms a stride-1 stream inside `leap+stream`.
pub const DENSE_GAP: u64 = 4;

/// Pages `next-n` proposes, added on the sandbox's wide arm ([`crate::sandbox`]).
pub const NEXT_N: usize = 8;

/// The components of the composite's own decision.
struct Own {
    leap: Leap,
    stream: Stream,
    region: Region,
    runahead: RunAhead,
    pressure: Pressure,
}

impl Own {
    /// The composite's own decision (the sandbox's [`HOME`] arm).
    /// Returns whether the process is under memory pressure.
    fn decide(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) -> bool {
        let pressed = self.pressure.on_fault(key, page);
        self.stream.set_cautious(pressed);
        self.stream.on_fault(key, page, now, out);
        if out.is_empty() {
            self.leap.on_fault(key, page, now, out);
        } else {
            self.leap.observe(key, page);
        }
        let decide = out.is_empty() && !pressed;
        self.region.on_fault(key, page, decide, out);
        if decide && out.is_empty() {
            self.runahead.on_fault(key, page, out);
        }
        self.pressure.fetched(key, out.as_slice());
        pressed
    }
}

/// Stream table first, Leap as fallback, region read-around last; per process, the sandbox may
/// add `next-n`'s pages.
pub struct LeapStream {
    own: Own,
    next_n: NextN,
    sandbox: Sandbox,
    /// `next-n`'s proposals (scored at home, added on the wide arm).
    shadow: Candidates,
}

impl LeapStream {
    /// A stream table with `stream`'s settings in front of a Leap detector with `leap`'s.
    pub fn new(leap: LeapParams, stream: StreamParams) -> Self {
        let own = Own {
            leap: Leap::new(LeapParams {
                markers: true,
                ..leap
            }),
            stream: Stream::new(StreamParams {
                dense_gap: DENSE_GAP,
                used_per_depth: USED_PER_DEPTH,
                ..stream
            }),
            region: Region::new(RegionParams {
                slots: leap.slots,
                ..RegionParams::default()
            }),
            runahead: RunAhead::new(leap.slots),
            pressure: Pressure::new(leap.slots),
        };
        Self {
            own,
            next_n: NextN::new(NEXT_N),
            sandbox: Sandbox::new(leap.slots),
            shadow: Candidates::new(),
        }
    }

    /// How many times a process changed the arm it follows.
    pub fn switches(&self) -> u64 {
        self.sandbox.switches()
    }
}

impl Prefetcher for LeapStream {
    fn name(&self) -> &'static str {
        "leap+stream"
    }

    fn on_fault(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        let (slot, arm) = self.sandbox.on_fault(key, page, now);
        let pressed = self.own.decide(key, page, now, out);
        // At home `next-n`'s proposals are scored; on the wide arm they are added (nothing is
        // added under memory pressure).
        let widen = arm == WIDE && !pressed;
        if arm == HOME || widen {
            self.next_n.on_fault(key, page, now, &mut self.shadow);
        }
        if widen {
            let from = out.len();
            for &p in self.shadow.as_slice() {
                out.push(p);
            }
            self.sandbox.mark_added(slot, out, from);
        }
        self.sandbox.fetched(slot, out.as_slice());
        if arm == HOME {
            self.sandbox.proposed(slot, self.shadow.as_slice());
        }
    }

    fn on_hit(&mut self, key: ProcessKey, page: PageNo, now: Nanos) {
        self.own.stream.on_hit(key, page, now);
        self.own.leap.on_hit(key, page, now);
    }

    fn on_late_hit(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        // The stream answers a late hit in its window with a window further ahead; Leap's
        // windows are fetched only on its own decisions (a hit is history to it).
        self.own.stream.late_hit(key, page, out);
        self.own.leap.on_hit(key, page, now);
    }

    fn on_marker_hit(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        if self.sandbox.marker_hit(key, page) {
            out.clear();
            return;
        }
        if !(self.own.stream.marker_hit(key, page, out)
            || self.own.runahead.marker_hit(key, page, out))
        {
            leap_marker_hit(
                &mut self.own.leap,
                &mut self.own.stream,
                key,
                page,
                now,
                out,
            );
        }
        if let Some(slot) = self.sandbox.slot(key) {
            self.sandbox.fetched(slot, out.as_slice());
        }
    }

    fn forget(&mut self, key: ProcessKey) {
        self.own.stream.forget(key);
        self.own.leap.forget(key);
        self.own.region.forget(key);
        self.own.runahead.forget(key);
        self.own.pressure.forget(key);
        self.sandbox.forget(key);
    }
}

/// A marker hit that is not the stream table's: Leap's window was consumed. Its pages are
/// accesses the stream table never saw as faults; without them a stream forming under Leap's
/// windows sees only the gaps between windows and confirms their width as its stride
/// (measured: a sequential re-read in the engine model faulted once per Leap window, ~3.6k
/// times per 16k pages). So they go to the stream table as hits, then Leap answers.
#[inline]
pub fn leap_marker_hit(
    leap: &mut Leap,
    stream: &mut Stream,
    key: ProcessKey,
    page: PageNo,
    now: Nanos,
    out: &mut Candidates,
) {
    if let Some((first, d, n)) = leap.marker_window(key, page) {
        for i in 0..n {
            stream.hit(key, first.wrapping_add_signed(d.wrapping_mul(i as i64)));
        }
    } else {
        stream.hit(key, page);
    }
    leap.on_marker_hit(key, page, now, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_wins_inside_a_confirmed_stream() {
        let mut p = LeapStream::new(LeapParams::default(), StreamParams::default());
        let mut out = Candidates::new();
        for t in 0..3 {
            p.on_fault(1, 100 + t, t, &mut out);
        }
        assert_eq!(out.as_slice(), &[103, 104, 105, 106]);
    }

    #[test]
    fn consumed_leap_windows_teach_the_stream_its_stride() {
        // Leap learned +1 (say, from the zero-fill faults of a write pass) and prefetches
        // windows along it; the guest consumes them unseen (injected), so the stream table only
        // sees the faults between Leap's windows, whose distance is the window width.
        let mut p = LeapStream::new(LeapParams::default(), StreamParams::default());
        let mut out = Candidates::new();
        let mut more = Candidates::new();
        for t in 0..20 {
            p.on_fault(1, 10_000 + t, t, &mut out);
        }
        let mut page = 0u64;
        let mut confirmed_at = None;
        for t in 0..40 {
            p.on_fault(1, page, t, &mut out);
            // The stream of the first pass stays confirmed; wait for a second one.
            if p.own.stream.confirmed_streams(1) > 1 {
                confirmed_at.get_or_insert(page);
                break;
            }
            let mut next = page + 1;
            for (c, m) in out.clone().iter() {
                if m {
                    p.on_marker_hit(1, c, t, &mut more);
                }
                next = next.max(c + 1);
            }
            page = next;
        }
        assert!(
            confirmed_at.is_some(),
            "the stream confirmed along Leap's windows"
        );
        let first = out.as_slice()[0];
        let stride = out.as_slice()[1] as i64 - first as i64;
        assert_eq!(
            stride, 1,
            "stride of the accesses, not of the gaps: {out:?}"
        );
    }

    #[test]
    fn leap_covers_strides_beyond_delta_stream() {
        let mut p = LeapStream::new(LeapParams::default(), StreamParams::default());
        let mut out = Candidates::new();
        for t in 0..10 {
            p.on_fault(1, 1000 * t, t, &mut out);
        }
        assert_eq!(out.as_slice(), &[10_000], "Leap: one page along the trend");
        assert!(out.is_marker(0));
        let mut more = Candidates::new();
        p.on_marker_hit(1, 10_000, 11, &mut more);
        p.on_fault(1, 11_000, 12, &mut out);
        assert_eq!(
            out.as_slice(),
            &[12_000, 13_000],
            "the marker hit grew Leap's window"
        );
    }
}
