//! Engine configuration: guest RAM size, local-memory budget (`--local-memory SIZE|N%`), free
//! reserve, prefetch limits and batch sizes. Validated once, before any thread starts.

use serde::{Deserialize, Serialize};

use crate::PAGE_SIZE;

/// A configuration the engine cannot run with.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("bad local-memory {input:?}: {why}")]
    /// `--local-memory` did not parse.
    LocalMemory {
        /// The value given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    #[error("guest memory size {0} is not a positive multiple of 4 KiB")]
    /// The guest memory size is zero or not page-aligned.
    MemorySize(u64),
    #[error("guest memory larger than 16 TiB")]
    /// The guest memory size exceeds what the page-state table addresses.
    MemoryTooLarge,
    #[error("guest memory size overflows usize")]
    /// The guest memory size does not fit this host's address space.
    MemoryOverflowsUsize,
    #[error("evict_batch must be in 1..=1024")]
    /// [`EngineConfig::evict_batch`] is out of range.
    EvictBatch,
    #[error(
        "local budget of {budget} pages is too small for a free reserve of {reserve} pages \
         (need at least reserve + 16)"
    )]
    /// The local budget leaves no room above the free reserve.
    BudgetBelowReserve {
        /// The budget, in pages.
        budget: u64,
        /// The free reserve, in pages.
        reserve: u64,
    },
}

/// How much guest RAM may be resident locally.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Budget {
    /// Everything may be resident (no eviction).
    Unlimited,
    /// At most this many bytes (rounded down to pages).
    Bytes(u64),
    /// Percent of guest RAM, in (0, 100].
    Percent(f64),
}

impl std::fmt::Display for Budget {
    /// As [`Budget::parse`] reads it: `all`, `25%`, `512M`, or bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Budget::Unlimited => f.write_str("all"),
            Budget::Percent(p) => write!(f, "{p}%"),
            Budget::Bytes(b) => {
                match [(40, 'T'), (30, 'G'), (20, 'M'), (10, 'K')]
                    .into_iter()
                    .find(|&(shift, _)| b >= 1 << shift && b % (1 << shift) == 0)
                {
                    Some((shift, unit)) => write!(f, "{}{unit}", b >> shift),
                    None => write!(f, "{b}"),
                }
            }
        }
    }
}

impl Budget {
    /// Parses `--local-memory`: `25%`, `512M`, `1G`, `4096K`, `123456` (bytes), `all`.
    pub fn parse(s: &str) -> Result<Self, ConfigError> {
        let bad = |why: &'static str| ConfigError::LocalMemory {
            input: s.to_string(),
            why,
        };
        let t = s.trim();
        if t.eq_ignore_ascii_case("all") || t.eq_ignore_ascii_case("unlimited") {
            return Ok(Self::Unlimited);
        }
        if let Some(pct) = t.strip_suffix('%') {
            let v: f64 = pct.trim().parse().map_err(|_| bad("not a number"))?;
            if !(v > 0.0 && v <= 100.0) {
                return Err(bad("percent must be in (0, 100]"));
            }
            return Ok(Self::Percent(v));
        }
        let bytes = farvm_units::parse_size(t).map_err(|e| match e {
            farvm_units::SizeError::NotANumber => bad("not a number"),
            farvm_units::SizeError::UnknownUnit => bad("unit must be K, M, G or T"),
            farvm_units::SizeError::TooLarge => bad("too large"),
            farvm_units::SizeError::NotWholeBytes => bad("not a whole number of bytes"),
        })?;
        if bytes == 0 {
            return Err(bad("must be positive"));
        }
        Ok(Self::Bytes(bytes))
    }

    /// The budget in pages for a guest of `total_pages`.
    pub fn pages(&self, total_pages: u64) -> u64 {
        match *self {
            Self::Unlimited => total_pages,
            Self::Bytes(b) => (b / PAGE_SIZE as u64).min(total_pages),
            Self::Percent(p) => ((total_pages as f64 * p / 100.0) as u64).clamp(1, total_pages),
        }
    }
}

/// Default probe sampling: 1 in 64 prefetches stays staged. Each probe costs the guest a
/// minor fault (tens of µs on this host): at 1 in 16, probes took ~15% of a sequential scan's
/// time at 25% local; at 1 in 64 the accuracy estimate still rests on ~150 samples per 10^4
/// prefetches (measured with `farvm run --probe-every`, README "Remote memory"). After its
/// first 256 probes the engine samples 4 times more sparsely (`fault/mod.rs`, `YOUNG_PROBES`).
pub const DEFAULT_PROBE_EVERY: u32 = 64;

#[derive(Clone, Debug, Serialize, Deserialize)]
/// The paging engine's settings for one VM.
pub struct EngineConfig {
    /// Guest RAM size in bytes (guest-physical `0..mem_bytes`).
    pub mem_bytes: u64,
    /// How much of it may be resident locally.
    pub budget: Budget,
    /// Pages kept free below the budget so demand faults never wait for reclaim; prefetches
    /// may not use them. 0 = automatic (max(2 * evict_batch, budget / 16)).
    pub free_reserve_pages: u64,
    /// Maximum prefetch reads outstanding at once (markers may exceed it, see `fault.rs`).
    pub max_prefetch_inflight: u32,
    /// Pages zapped / written back per eviction round (>= 64 amortises the zap, see notes).
    pub evict_batch: usize,
    /// Besides the prefetcher's own markers, leave every N-th injected candidate staged as a
    /// probe so the hit rate of injected prefetching stays measurable (0 = off); every 4N-th
    /// after the first 256 probes (1 stays 1).
    pub probe_every: u32,
    /// Prefetching on/off (the prefetcher is still told nothing when off).
    pub prefetch: bool,
    /// Back-off before a failed demand read is retried, in milliseconds.
    pub retry_backoff_ms: u64,
    /// Give pages that refault soon after eviction an extra CLOCK chance (see `evict.rs`).
    pub refault_protect: bool,
    /// Deferred prefetch candidates older than this (µs) are dropped as stale.
    pub prefetch_defer_max_us: u64,
    /// One prefetch history for the whole guest (guest-physical pages), even when a guest agent
    /// names processes: the baseline per-process histories are compared with. Per-process
    /// statistics are kept either way.
    pub global_history: bool,
    /// Keep a record of this many resolved faults (guest page, kind, the process the agent
    /// slot named) for attribution checks (`faultlog`); 0 = off.
    pub fault_log_records: usize,
    /// Guest RAM's backing: anonymous memory whose pages move with UFFDIO_MOVE (the default
    /// where the kernel has it) or a memfd (`backing.rs`). [`EngineConfig::new`] takes it from
    /// the environment variable `FARVM_GUEST_MEMORY` (`memfd` or `anon`) when set, so that a
    /// whole test suite can run on either.
    #[serde(default)]
    pub guest_memory: crate::GuestMemory,
}

/// `FARVM_GUEST_MEMORY` (`memfd` or `anon`), or the default when unset. A value that is
/// neither is not a silent fallback: it is logged, so a test suite meant to run on `anon` does
/// not pass on memfd unnoticed.
fn guest_memory_from_env() -> crate::GuestMemory {
    match std::env::var("FARVM_GUEST_MEMORY") {
        Err(_) => crate::GuestMemory::default(),
        Ok(v) => crate::GuestMemory::parse(&v).unwrap_or_else(|| {
            tracing::error!(
                "FARVM_GUEST_MEMORY={v:?} is neither memfd nor anon: using the default, {:?}",
                crate::GuestMemory::default()
            );
            crate::GuestMemory::default()
        }),
    }
}

impl EngineConfig {
    /// Defaults for `mem_bytes` of guest RAM: no budget (all may be resident), prefetching on.
    pub fn new(mem_bytes: u64) -> Self {
        Self {
            mem_bytes,
            budget: Budget::Unlimited,
            free_reserve_pages: 0,
            max_prefetch_inflight: 256,
            evict_batch: 64,
            probe_every: DEFAULT_PROBE_EVERY,
            prefetch: true,
            retry_backoff_ms: 5,
            refault_protect: true,
            prefetch_defer_max_us: 1000,
            global_history: false,
            fault_log_records: 0,
            guest_memory: guest_memory_from_env(),
        }
    }

    /// Guest RAM in 4 KiB pages.
    pub fn total_pages(&self) -> u64 {
        self.mem_bytes / PAGE_SIZE as u64
    }

    /// (budget pages, reserve pages) after validation.
    pub fn resolve(&self) -> Result<(u64, u64), ConfigError> {
        if self.mem_bytes == 0 || !self.mem_bytes.is_multiple_of(PAGE_SIZE as u64) {
            return Err(ConfigError::MemorySize(self.mem_bytes));
        }
        if self.total_pages() > u32::MAX as u64 {
            return Err(ConfigError::MemoryTooLarge);
        }
        if usize::try_from(self.mem_bytes).is_err() {
            return Err(ConfigError::MemoryOverflowsUsize);
        }
        if self.evict_batch == 0 || self.evict_batch > 1024 {
            return Err(ConfigError::EvictBatch);
        }
        let budget = self.budget.pages(self.total_pages());
        let reserve = if self.free_reserve_pages == 0 {
            (2 * self.evict_batch as u64).max(budget / 16)
        } else {
            self.free_reserve_pages
        };
        if self.budget != Budget::Unlimited && budget < reserve + 16 {
            return Err(ConfigError::BudgetBelowReserve { budget, reserve });
        }
        Ok((budget, reserve.min(budget)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes_and_percentages() {
        assert_eq!(Budget::parse("25%").unwrap(), Budget::Percent(25.0));
        assert_eq!(Budget::parse("512M").unwrap(), Budget::Bytes(512 << 20));
        assert_eq!(Budget::parse("1g").unwrap(), Budget::Bytes(1 << 30));
        assert_eq!(Budget::parse("8192").unwrap(), Budget::Bytes(8192));
        assert_eq!(Budget::parse("all").unwrap(), Budget::Unlimited);
        for s in ["25%", "512M", "1G", "8192", "4097", "all", "12.5%"] {
            let b = Budget::parse(s).unwrap();
            assert_eq!(Budget::parse(&b.to_string()).unwrap(), b, "{s} -> {b}");
        }
        assert_eq!(Budget::parse("8192").unwrap().to_string(), "8K");
        for bad in ["", "0", "0%", "120%", "12Q", "-5M", "abc", "99999999999T"] {
            assert!(Budget::parse(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!(Budget::Percent(25.0).pages(1000), 250);
        assert_eq!(Budget::Bytes(1 << 30).pages(1000), 1000);
    }

    #[test]
    fn rejects_budget_below_reserve() {
        let mut c = EngineConfig::new(64 << 20);
        c.budget = Budget::Bytes(64 << 10);
        assert!(c.resolve().is_err());
        c.budget = Budget::Percent(25.0);
        let (b, r) = c.resolve().unwrap();
        assert_eq!(b, 4096);
        assert_eq!(r, 256);
    }
}
