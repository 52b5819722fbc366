//! When a live migration's pre-copy ends: once what is left to send fits the downtime limit
//! at the rate the pre-copy has measured (QEMU's rule: pending bytes ≤ bandwidth × limit),
//! checked after every frame, not only between rounds; rounds that stop converging end it
//! anyway, and the pause then takes longer than the limit.
//!
//! Checking after every frame matters for a VM whose resident set moves while it runs (a scan
//! through more memory than is local): pages sent early in a round are evicted to the pool
//! before the pause and were sent for nothing, so every round that need not run adds bytes.
//! When all the resident pages fit the limit, the pre-copy ends after its first frames and
//! the pause sends the rest: the bytes sent are close to the resident pages' bytes.

use std::time::{Duration, Instant};

/// The source's part of the pause the pre-copy aims for by default (`farvm migrate
/// --downtime-limit`): sending what is left, the machine state and the remote-page list.
pub const DEFAULT_DOWNTIME_LIMIT: Duration = Duration::from_millis(100);
/// Pre-copy rounds at most.
const MAX_ROUNDS: u32 = 10;
/// Pages sent before the rate measured within a round is trusted.
const RATE_AFTER: u64 = 256;

/// The pre-copy's progress and its measured rate.
pub(crate) struct Precopy {
    limit: Duration,
    /// When the first round began (the rate is measured from here).
    started: Option<Instant>,
    /// Pages sent in every round so far.
    sent: u64,
    /// Rounds begun.
    rounds: u32,
    /// Pages this round is expected to send: the resident pages in the first round (updated
    /// as it runs), the previous round's count in the next ones.
    expected: u64,
    /// Pages sent in this round.
    in_round: u64,
    /// Pages the previous round sent.
    last_round: Option<u64>,
}

impl Precopy {
    pub fn new(limit: Duration) -> Self {
        Precopy {
            limit,
            started: None,
            sent: 0,
            rounds: 0,
            expected: 0,
            in_round: 0,
            last_round: None,
        }
    }

    /// A round begins, with `resident` pages resident now.
    pub fn begin_round(&mut self, resident: u64) {
        self.started.get_or_insert_with(Instant::now);
        self.rounds += 1;
        self.in_round = 0;
        self.expected = self.last_round.unwrap_or(resident);
    }

    /// The time one page took, sending and visiting included (None before any was sent).
    fn per_page(&self) -> Option<Duration> {
        let started = self.started?;
        (self.sent > 0).then(|| started.elapsed() / self.sent.min(u32::MAX as u64) as u32)
    }

    /// How long sending `pages` more would take at the measured rate.
    fn estimate(&self, pages: u64) -> Option<Duration> {
        self.per_page()
            .map(|p| p.saturating_mul(pages.min(u32::MAX as u64) as u32))
    }

    /// Pages left to send if the guest were paused now (an estimate).
    pub fn pending(&self) -> u64 {
        self.expected.saturating_sub(self.in_round)
    }

    /// `n` pages more were sent in this round (a frame went out); `resident` is asked for
    /// the resident pages now in the first round. True: what is left fits the limit, pause.
    pub fn sent(&mut self, n: u64, resident: impl FnOnce() -> u64) -> bool {
        self.sent += n;
        self.in_round += n;
        if self.last_round.is_none() {
            self.expected = resident();
        }
        self.sent >= RATE_AFTER && self.fits(self.pending())
    }

    fn fits(&self, pages: u64) -> bool {
        self.estimate(pages).is_none_or(|t| t <= self.limit)
    }

    /// The round ended, having sent `n` pages in all. True: run another round (what it would
    /// leave for the pause does not fit the limit yet, and the rounds still converge).
    pub fn another_round(&mut self, n: u64) -> bool {
        let shrinking = self.last_round.is_none_or(|l| n * 10 < l * 9);
        self.last_round = Some(n);
        // What a pause now would send: about what the round found changed.
        self.expected = n;
        self.in_round = 0;
        !self.fits(n) && shrinking && self.rounds < MAX_ROUNDS
    }

    /// The pause's estimated length for `pages` left to send (0 when no rate was measured).
    pub fn pause_estimate(&self, pages: u64) -> Duration {
        self.estimate(pages).unwrap_or_default()
    }

    /// The limit it aims for.
    pub fn limit(&self) -> Duration {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rate of `per_page` is made up by backdating the start.
    fn measured(limit_ms: u64, sent: u64, per_page: Duration) -> Precopy {
        let mut p = Precopy::new(Duration::from_millis(limit_ms));
        p.begin_round(10_000);
        p.started = Some(Instant::now() - per_page * sent as u32);
        p.sent = sent;
        p.in_round = sent;
        p
    }

    #[test]
    fn the_first_round_stops_once_the_resident_rest_fits() {
        // 10 µs a page, a 50 ms limit: 5,000 pages fit.
        let mut p = measured(50, 4_000, Duration::from_micros(10));
        // 9,000 resident, 4,000 sent: 5,000 left, borderline; 8,000 resident: fits.
        assert!(!p.sent(0, || 9_100));
        assert!(p.sent(64, || 8_000));
    }

    #[test]
    fn no_decision_before_the_rate_is_measured() {
        let mut p = Precopy::new(Duration::from_millis(50));
        p.begin_round(100);
        assert!(
            !p.sent(64, || 100),
            "64 pages are too few to measure a rate"
        );
    }

    #[test]
    fn rounds_continue_only_while_they_shrink_and_the_rest_does_not_fit() {
        let mut p = measured(1, 5_000, Duration::from_micros(10));
        // 1 ms fits 100 pages.
        assert!(p.another_round(5_000), "first round: 5,000 left");
        p.begin_round(0);
        assert_eq!(p.pending(), 5_000);
        assert!(!p.another_round(4_800), "4% fewer: not converging");
        let mut q = measured(1, 5_000, Duration::from_micros(10));
        assert!(q.another_round(5_000));
        q.begin_round(0);
        assert!(!q.another_round(50), "50 pages fit 1 ms");
    }

    #[test]
    fn at_most_ten_rounds() {
        let mut p = measured(0, 1_000_000, Duration::from_micros(10));
        let mut n = 1_000_000u64;
        let mut rounds = 1;
        while p.another_round(n) {
            p.begin_round(0);
            n /= 2;
            rounds += 1;
        }
        assert_eq!(rounds, MAX_ROUNDS);
    }
}
