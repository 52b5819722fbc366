//! The engine's clock: nanoseconds since the engine started. Every timestamp the engine keeps
//! (per-page fault and I/O times, back-off deadlines, the error log's rate limit) is on it, so
//! times taken on different threads compare.

use std::time::Instant;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Clock(Instant);

impl Clock {
    pub fn start() -> Self {
        Self(Instant::now())
    }

    #[inline]
    pub fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
}
