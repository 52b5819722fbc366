//! `leap+stream`: farvm's default prefetcher, the stream table in front of Leap.
//!
//! Arbitration, per fault:
//! 1. The stream table sees the fault first. If it belongs to a *confirmed* stream, the
//!    stream's window is the answer: a stream is specific to one address region, so it wins over
//!    Leap's process-wide majority, which interleaved streams or a second thread would dilute.
//!    Leap only logs the fault in its history (no window sizing, so its `C_hit`/`PW` state is
//!    not charged with pages it did not fetch).
//! 2. Otherwise Leap decides as usual (majority trends that tolerate noise, strides larger than
//!    Δ_stream, speculative prefetch after a trend breaks).
//!
//! Hits: a visible hit goes to both. A marker hit goes to the component that issued the marker
//! (the stream if it owns it, else Leap), so each keeps learning in injected mode: the stream
//! continues its pipeline, Leap credits its window (its markers are on in this composite).

use crate::leap::{Leap, LeapParams};
use crate::stream::{Stream, StreamParams};
use crate::{Candidates, Nanos, PageNo, Prefetcher, ProcessKey};

/// Stream table first, Leap as fallback.
pub struct LeapStream {
    leap: Leap,
    stream: Stream,
}

impl LeapStream {
    pub fn new(leap: LeapParams, stream: StreamParams) -> Self {
        Self {
            leap: Leap::new(LeapParams {
                markers: true,
                ..leap
            }),
            stream: Stream::new(stream),
        }
    }
}

impl Prefetcher for LeapStream {
    fn name(&self) -> &'static str {
        "leap+stream"
    }

    fn on_fault(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        self.stream.on_fault(key, page, now, out);
        if out.is_empty() {
            self.leap.on_fault(key, page, now, out);
        } else {
            self.leap.observe(key, page);
        }
    }

    fn on_hit(&mut self, key: ProcessKey, page: PageNo, now: Nanos) {
        self.stream.on_hit(key, page, now);
        self.leap.on_hit(key, page, now);
    }

    fn on_marker_hit(&mut self, key: ProcessKey, page: PageNo, now: Nanos, out: &mut Candidates) {
        if !self.stream.marker_hit(key, page, out) {
            self.leap.on_marker_hit(key, page, now, out);
        }
    }

    fn forget(&mut self, key: ProcessKey) {
        self.stream.forget(key);
        self.leap.forget(key);
    }
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
