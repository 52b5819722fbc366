//! How a restore brings a pool VM's resident pages back (`farvm run --restore DIR
//! --restore-pages MODE`): all of them from the page file before the guest's first
//! instruction (`eager`), or none, each read from the page file on the guest's first touch
//! (`crate::remote::page_file`) with the engine's prefetcher off (`lazy`) or on
//! (`lazy-prefetch`), or none but the recorded working set (`working-set.pages`, the pages
//! in the order the saved run first touched them), fetched in that order in batches before
//! the first instruction (`working-set`) or behind the running guest (`working-set-async`).
//! Remote pages are read from the pool on first touch in every mode. The page file's store is
//! `crate::remote::page_file`, the working set's fetch `crate::remote::working_set`.

use serde::Serialize;

/// How a restore brings the resident pages back (module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum RestorePages {
    /// Every resident page loaded from the page file before the guest runs.
    #[default]
    Eager,
    /// None loaded; each read from the page file on the guest's first touch, prefetcher off.
    Lazy,
    /// As `lazy`, with the VM's prefetcher on.
    LazyPrefetch,
    /// The recorded working set fetched in recorded order before the guest runs; the rest
    /// as `lazy-prefetch`.
    WorkingSet,
    /// As `working-set`, but fetched while the guest runs.
    WorkingSetAsync,
}

impl RestorePages {
    /// Loads the page file before the guest runs.
    pub fn is_eager(self) -> bool {
        self == RestorePages::Eager
    }

    /// The mode's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            RestorePages::Eager => "eager",
            RestorePages::Lazy => "lazy",
            RestorePages::LazyPrefetch => "lazy-prefetch",
            RestorePages::WorkingSet => "working-set",
            RestorePages::WorkingSetAsync => "working-set-async",
        }
    }

    /// Fetches the recorded working set.
    pub fn uses_working_set(self) -> bool {
        matches!(
            self,
            RestorePages::WorkingSet | RestorePages::WorkingSetAsync
        )
    }
}
