//! Prefetchers by name, so `farvm run --prefetcher NAME` and `farvm-lab trace eval --prefetcher`
//! build exactly the same policies from one [`Config`].

use crate::composite::LeapStream;
use crate::leap::{Leap, LeapParams};
use crate::next_n::NextN;
use crate::none::NoPrefetch;
use crate::readahead::ReadAhead;
use crate::stream::{Stream, StreamParams};
use crate::stride::Stride;
use crate::{Prefetcher, MAX_CANDIDATES};

/// Every prefetcher name, in table order.
pub const NAMES: &[&str] = &[
    "none",
    "next-n",
    "stride",
    "read-ahead",
    "leap",
    "stream",
    "leap+stream",
];

/// Every prefetcher name [`build`] accepts, baselines first, farvm's default last.
pub fn names() -> &'static [&'static str] {
    NAMES
}

/// The prefetcher farvm runs unless told otherwise.
pub const DEFAULT: &str = "leap+stream";

/// Tunables shared by all prefetchers (each reads the ones it has).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Config {
    /// Leap's ACCESSHISTORY length H_size.
    pub h_size: usize,
    /// Leap's N_split (first FINDTREND window = H_size / N_split).
    pub n_split: usize,
    /// Leap's PW_max; also read-ahead's maximum window.
    pub pw_max: usize,
    /// Stream table entries.
    pub stream_entries: usize,
    /// Δ_stream in pages.
    pub stream_delta: u64,
    /// Maximum pages per stream window.
    pub stream_max_depth: usize,
    /// N of `next-n`, and pages per `stride` prediction.
    pub next_n: usize,
    /// Per-process state (`true`) or one global history (`false`).
    pub per_process: bool,
    /// Per-process state slots, LRU-replaced.
    pub process_slots: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            h_size: 32,
            n_split: 4,
            pw_max: 8,
            stream_entries: 64,
            stream_delta: 64,
            stream_max_depth: 64,
            next_n: 8,
            per_process: true,
            process_slots: 64,
        }
    }
}

/// Why a prefetcher could not be built.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BuildError {
    #[error("unknown prefetcher `{0}` (known: none, next-n, stride, read-ahead, leap, stream, leap+stream)")]
    /// A name the registry does not know.
    Unknown(String),
    #[error("invalid prefetcher setting: {0}")]
    /// A setting out of range.
    Invalid(String),
}

impl Config {
    /// Checks every bound a prefetcher relies on.
    pub fn validate(&self) -> Result<(), BuildError> {
        let bad = |m: String| Err(BuildError::Invalid(m));
        if self.h_size < 2 || self.h_size > 4096 {
            return bad(format!("H_size must be in 2..=4096, got {}", self.h_size));
        }
        if self.n_split == 0 || self.n_split > self.h_size {
            return bad(format!(
                "N_split must be in 1..=H_size ({}), got {}",
                self.h_size, self.n_split
            ));
        }
        if self.pw_max == 0 || self.pw_max > MAX_CANDIDATES {
            return bad(format!(
                "PW_max must be in 1..={MAX_CANDIDATES}, got {}",
                self.pw_max
            ));
        }
        if self.stream_entries == 0 || self.stream_entries > 65_536 {
            return bad(format!(
                "stream table entries must be in 1..=65536, got {}",
                self.stream_entries
            ));
        }
        if self.stream_delta == 0 || self.stream_delta > 1 << 40 {
            return bad(format!(
                "Δ_stream must be in 1..=2^40 pages, got {}",
                self.stream_delta
            ));
        }
        if self.stream_max_depth < 2 || self.stream_max_depth > MAX_CANDIDATES {
            return bad(format!(
                "stream depth must be in 2..={MAX_CANDIDATES}, got {}",
                self.stream_max_depth
            ));
        }
        if self.next_n == 0 || self.next_n > MAX_CANDIDATES {
            return bad(format!(
                "next-n's N must be in 1..={MAX_CANDIDATES}, got {}",
                self.next_n
            ));
        }
        if self.process_slots == 0 || self.process_slots > 65_536 {
            return bad(format!(
                "process slots must be in 1..=65536, got {}",
                self.process_slots
            ));
        }
        Ok(())
    }

    fn leap(&self) -> LeapParams {
        LeapParams {
            h_size: self.h_size,
            n_split: self.n_split,
            pw_max: self.pw_max,
            slots: self.process_slots,
            per_process: self.per_process,
            markers: false,
        }
    }

    fn stream(&self) -> StreamParams {
        StreamParams {
            entries: self.stream_entries,
            delta: self.stream_delta,
            init_depth: 4.min(self.stream_max_depth),
            max_depth: self.stream_max_depth,
            per_process: self.per_process,
        }
    }
}

/// Builds the prefetcher called `name` (see [`names`]). All its memory is allocated here.
pub fn build(name: &str, cfg: &Config) -> Result<Box<dyn Prefetcher>, BuildError> {
    cfg.validate()?;
    let slots = cfg.process_slots;
    Ok(match name {
        "none" => Box::new(NoPrefetch),
        "next-n" => Box::new(NextN::new(cfg.next_n)),
        "stride" => Box::new(Stride::new(cfg.next_n, slots, cfg.per_process)),
        "read-ahead" => Box::new(ReadAhead::new(cfg.pw_max, slots, cfg.per_process)),
        "leap" => Box::new(Leap::new(cfg.leap())),
        "stream" => Box::new(Stream::new(cfg.stream())),
        "leap+stream" => Box::new(LeapStream::new(cfg.leap(), cfg.stream())),
        other => return Err(BuildError::Unknown(other.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_builds_and_reports_its_name() {
        for &n in names() {
            let p = build(n, &Config::default()).unwrap();
            assert_eq!(p.name(), n);
        }
        assert!(names().contains(&DEFAULT));
    }

    /// Pages from a trace are untrusted: extreme values and strides across the ends of the u64
    /// range must never panic (debug builds check overflow).
    #[test]
    fn extreme_pages_never_panic() {
        let edges = [
            0,
            1,
            2,
            u64::MAX,
            u64::MAX - 1,
            1 << 63,
            (1 << 63) - 1,
            (1 << 63) + 1,
        ];
        let mut seq: Vec<u64> = Vec::new();
        for &e in &edges {
            for k in 0..12u64 {
                seq.push(e.wrapping_add(k));
                seq.push(e.wrapping_sub(k));
                seq.push(e.wrapping_add(k.wrapping_mul(1 << 62)));
            }
        }
        for &n in names() {
            for per_process in [true, false] {
                let mut p = build(
                    n,
                    &Config {
                        per_process,
                        ..Config::default()
                    },
                )
                .unwrap();
                let mut out = crate::Candidates::new();
                let mut more = crate::Candidates::new();
                for (t, &page) in seq.iter().enumerate() {
                    let key = (t % 3) as u64;
                    p.on_fault(key, page, t as u64, &mut out);
                    for (c, marker) in out.clone().iter() {
                        if marker {
                            p.on_marker_hit(key, c, t as u64, &mut more);
                        } else {
                            p.on_hit(key, c, t as u64);
                        }
                    }
                    p.on_hit(key, page ^ 1, t as u64);
                    p.on_marker_hit(key, page.wrapping_add(1), t as u64, &mut more);
                }
            }
        }
    }

    #[test]
    fn bad_names_and_settings_are_errors() {
        assert!(matches!(
            build("leap2", &Config::default()),
            Err(BuildError::Unknown(_))
        ));
        let cfg = Config {
            pw_max: 65,
            ..Config::default()
        };
        assert!(matches!(build("leap", &cfg), Err(BuildError::Invalid(_))));
        let cfg = Config {
            n_split: 0,
            ..Config::default()
        };
        assert!(build("leap", &cfg).is_err());
    }
}
