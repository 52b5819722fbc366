//! Fetching a restored snapshot's recorded working set (`farvm run --restore-pages
//! working-set|working-set-async`): its pages in recorded order, a batch of reads at a time,
//! before the guest runs or on a thread of its own (`restore-ws`) behind it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use farvm_ept::{Engine, EngineError};

use super::page_file::SnapshotPageFile;

/// Pages fetched per batch (one batch of reads, then waited for).
const BATCH: usize = 256;
const PAGE: u64 = 4096;

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
