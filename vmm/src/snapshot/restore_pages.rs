//! How a restore brings a pool VM's resident pages back (`farvm run --restore DIR
//! --restore-pages MODE`): all of them from the page file before the guest's first
//! instruction (`eager`), or none, each read from the page file on the guest's first touch
//! ([`super::page_file_store`]) with the engine's prefetcher off (`lazy`) or on
//! (`lazy-prefetch`), or none but the recorded working set (`working-set.pages`, the pages
//! in the order the saved run first touched them), fetched in that order in batches before
//! the first instruction (`working-set`) or behind the running guest (`working-set-async`).
//! Remote pages are read from the pool on first touch in every mode.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use farvm_ept::{Engine, EngineError};
use serde::Serialize;

use super::page_file_store::SnapshotPageFile;

/// Pages fetched per batch of a working set (one batch of reads, then waited for).
const BATCH: usize = 256;
const PAGE: u64 = 4096;

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

/// Fetches `pages` into `engine` in their order, [`BATCH`] at a time, each batch's reads
/// started together and waited for, until done or `stop` is set, counting them in `file`'s
/// stats; returns the pages fetched.
pub fn fetch(
    engine: &Engine,
    pages: &[u64],
    file: Option<&SnapshotPageFile>,
    stop: &AtomicBool,
) -> Result<u64, EngineError> {
    let mut done = 0;
    for batch in pages.chunks(BATCH) {
        if stop.load(Ordering::Acquire) {
            break;
        }
        engine.fetch_pages(batch)?;
        for &p in batch {
            engine.ensure_resident(p * PAGE, PAGE)?;
        }
        done += batch.len() as u64;
        if let Some(f) = file {
            f.working_set_fetched(batch.len() as u64);
        }
    }
    Ok(done)
}

/// [`fetch`] on a thread of its own (`restore-ws`), racing the guest; `stop` ends it early
/// (the VM's remote memory sets it and joins the thread before stopping the engine).
pub fn fetch_in_background(
    engine: Arc<Engine>,
    pages: Vec<u64>,
    file: Option<Arc<SnapshotPageFile>>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("restore-ws".into())
        .spawn(move || {
            let started = std::time::Instant::now();
            match fetch(&engine, &pages, file.as_deref(), &stop) {
                Ok(n) => tracing::info!(
                    pages = n,
                    secs = started.elapsed().as_secs_f64(),
                    "working set fetched behind the running guest"
                ),
                Err(e) => tracing::warn!("fetching the working set: {e}"),
            }
        })
}
