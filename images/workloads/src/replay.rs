//! `replay`: one process of a page-access trace, replayed over a region sized to its footprint.
//!
//! The trace reaches the workload as a *replay blob* (the test guest's boot blob, mapped
//! read-only into the process; natively, a byte slice): one section per trace process, each
//! holding that process's accesses in trace order as page indices into its own footprint
//! (distinct pages numbered in order of first touch), with the access kind. Process `section`
//! of a plan replays section `section` over a heap of `footprint` pages.
//!
//! Layout (little-endian): `MAGIC: u64`, `sections: u64`, then per section
//! `[first_record: u64, records: u64, footprint_pages: u64]`, then every record as a `u32`:
//! `page_index << 1 | write`. `first_record` counts records from the start of the record area
//! (which begins right after the section table).
//!
//! Phases: setup fills the region from the seed (every page written, as a program's data
//! exists before the traced run touches it); no warm-up (a warm-up replay would leave the
//! region's pages where the measured replay expects to find them first); the measured phase
//! touches, per record, one word of the recorded page (a different word per record), reads it
//! into a running hash and, for a write record, stores the hash back. The checksum folds the
//! hash and every word of the region.

use crate::fold::{combine, fold_words};
use crate::scan::fill;
use crate::{measured, phase, Env, Error, Outcome};

/// First word of a replay blob: "FARVMRPL".
pub const MAGIC: u64 = u64::from_le_bytes(*b"FARVMRPL");
/// Words per 4 KiB page.
const WORDS_PER_PAGE: usize = 512;
/// Bytes of the blob header before the section table.
const HEADER: usize = 16;
/// Bytes of one section-table entry.
const ENTRY: usize = 24;

/// One section of a replay blob: the accesses of one trace process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section<'a> {
    /// Its records, `page_index << 1 | write`, as little-endian `u32` bytes.
    records: &'a [u8],
    /// Distinct pages it touches (the region it needs, in pages).
    pub footprint_pages: u64,
}

impl Section<'_> {
    /// Records in this section.
    pub fn len(&self) -> usize {
        self.records.len() / 4
    }

    /// Whether the section has no records.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Record `i`: (page index, write).
    pub fn get(&self, i: usize) -> (u64, bool) {
        let b = &self.records[4 * i..4 * i + 4];
        let v = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        (u64::from(v >> 1), v & 1 == 1)
    }
}

fn word(blob: &[u8], at: usize) -> Option<u64> {
    let b = blob.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(b);
    Some(u64::from_le_bytes(a))
}

/// Number of sections in `blob`, if it is a replay blob.
pub fn sections(blob: &[u8]) -> Option<u64> {
    (word(blob, 0)? == MAGIC).then_some(())?;
    word(blob, 8)
}

/// Section `index` of `blob`, checked against the blob's bounds.
pub fn section(blob: &[u8], index: u64) -> Option<Section<'_>> {
    let n = sections(blob)?;
    if index >= n {
        return None;
    }
    let table = usize::try_from(index).ok()?.checked_mul(ENTRY)? + HEADER;
    let start = usize::try_from(n)
        .ok()?
        .checked_mul(ENTRY)?
        .checked_add(HEADER)?;
    let first = usize::try_from(word(blob, table)?).ok()?;
    let count = usize::try_from(word(blob, table + 8)?).ok()?;
    let footprint_pages = word(blob, table + 16)?;
    let from = start.checked_add(first.checked_mul(4)?)?;
    let to = from.checked_add(count.checked_mul(4)?)?;
    let records = blob.get(from..to)?;
    let s = Section {
        records,
        footprint_pages,
    };
    // Every page index must lie inside the footprint.
    (0..s.len())
        .all(|i| s.get(i).0 < footprint_pages)
        .then_some(s)
}

/// Replays section `index` of `blob` over `heap` (at least its footprint), `passes` times.
pub(crate) fn run(
    heap: &mut [u64],
    blob: &[u8],
    index: u64,
    seed: u64,
    passes: u64,
    env: &mut dyn Env,
) -> Result<Outcome, Error> {
    let s = section(blob, index).ok_or(Error::BadBlob { section: index })?;
    let need = s.footprint_pages.saturating_mul(4096);
    if (heap.len() as u64) * 8 < need {
        return Err(Error::HeapTooSmall {
            need,
            have: heap.len() as u64 * 8,
        });
    }
    if passes == 0 || passes > 1000 {
        return Err(Error::BadParam {
            name: "passes",
            value: passes,
        });
    }
    let region = &mut heap[..(s.footprint_pages as usize) * WORDS_PER_PAGE];
    env.phase(phase::SETUP);
    fill(region, seed, 9);
    env.phase(phase::WARMUP);
    let (h, ns) = measured(env, || {
        let mut h = seed;
        let mut n = 0u64;
        for _ in 0..passes {
            for i in 0..s.len() {
                let (page, write) = s.get(i);
                // A different word of the page per record (odd multiplier: all 512 in turn).
                let w = (n.wrapping_mul(0x9E37) as usize) & (WORDS_PER_PAGE - 1);
                let at = page as usize * WORDS_PER_PAGE + w;
                h = (h ^ region[at])
                    .wrapping_mul(0x100_0000_01B3)
                    .rotate_left(7);
                if write {
                    region[at] = h;
                }
                n += 1;
            }
        }
        h
    });
    Ok(Outcome {
        checksum: combine(h, fold_words(region)),
        ops: s.len() as u64 * passes,
        elapsed_ns: ns,
    })
}

/// Builds a replay blob from `(process, page, write)` accesses in trace order (feature `std`):
/// one section per process, in order of first appearance, pages numbered per process in order
/// of first touch. Returns the blob and, per section, the trace's process key.
#[cfg(feature = "std")]
pub fn encode(
    accesses: impl IntoIterator<Item = (u64, u64, bool)>,
) -> Result<(std::vec::Vec<u8>, std::vec::Vec<u64>), EncodeError> {
    use std::collections::HashMap;
    use std::vec::Vec;
    struct Proc {
        key: u64,
        pages: HashMap<u64, u32>,
        records: Vec<u32>,
    }
    let mut procs: Vec<Proc> = Vec::new();
    let mut by_key: HashMap<u64, usize> = HashMap::new();
    for (key, page, write) in accesses {
        let p = *by_key.entry(key).or_insert_with(|| {
            procs.push(Proc {
                key,
                pages: HashMap::new(),
                records: Vec::new(),
            });
            procs.len() - 1
        });
        let proc = &mut procs[p];
        let next = proc.pages.len() as u32;
        let idx = *proc.pages.entry(page).or_insert(next);
        if idx >= 1 << 31 {
            return Err(EncodeError::TooManyPages);
        }
        proc.records.push(idx << 1 | u32::from(write));
    }
    if procs.is_empty() {
        return Err(EncodeError::Empty);
    }
    if procs.len() > farvm_guest_agent::boot::MAX_PROCS {
        return Err(EncodeError::TooManyProcesses(procs.len()));
    }
    let total: usize = procs.iter().map(|p| p.records.len()).sum();
    let mut blob = Vec::with_capacity(HEADER + ENTRY * procs.len() + 4 * total);
    blob.extend_from_slice(&MAGIC.to_le_bytes());
    blob.extend_from_slice(&(procs.len() as u64).to_le_bytes());
    let mut first = 0u64;
    for p in &procs {
        blob.extend_from_slice(&first.to_le_bytes());
        blob.extend_from_slice(&(p.records.len() as u64).to_le_bytes());
        blob.extend_from_slice(&(p.pages.len() as u64).to_le_bytes());
        first += p.records.len() as u64;
    }
    for p in &procs {
        for r in &p.records {
            blob.extend_from_slice(&r.to_le_bytes());
        }
    }
    Ok((blob, procs.iter().map(|p| p.key).collect()))
}

/// Why a trace cannot become a replay blob.
#[cfg(feature = "std")]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The trace has no records.
    Empty,
    /// More processes than the test guest runs.
    TooManyProcesses(usize),
    /// A process touches 2^31 distinct pages or more.
    TooManyPages,
}

#[cfg(feature = "std")]
impl core::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EncodeError::Empty => write!(f, "the trace has no records"),
            EncodeError::TooManyProcesses(n) => write!(
                f,
                "the trace has {n} processes; the test guest runs at most {}",
                farvm_guest_agent::boot::MAX_PROCS
            ),
            EncodeError::TooManyPages => {
                write!(f, "a process touches 2^31 or more distinct pages")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for EncodeError {}

#[cfg(all(test, feature = "std"))]
mod tests {
    use super::*;
    use crate::testenv::Fake;

    fn trace() -> std::vec::Vec<(u64, u64, bool)> {
        let mut t = std::vec::Vec::new();
        for i in 0..300u64 {
            t.push((7, 1000 + (i * 5) % 40, i % 3 == 0));
            if i % 2 == 0 {
                t.push((3, 0x7fff_0000 + i % 7, false));
            }
        }
        t
    }

    #[test]
    fn encodes_one_section_per_process_with_its_footprint() {
        let (blob, keys) = encode(trace()).unwrap();
        assert_eq!(keys, [7, 3]);
        assert_eq!(sections(&blob), Some(2));
        let a = section(&blob, 0).unwrap();
        let b = section(&blob, 1).unwrap();
        assert_eq!((a.len(), a.footprint_pages), (300, 8));
        assert_eq!((b.len(), b.footprint_pages), (150, 7));
        assert_eq!(a.get(0), (0, true), "first page touched is index 0");
        assert_eq!(a.get(1), (1, false));
        assert!(section(&blob, 2).is_none());
        assert!(section(&blob[..blob.len() - 1], 1).is_none(), "truncated");
        assert_eq!(encode(std::vec::Vec::new()), Err(EncodeError::Empty));
    }

    #[test]
    fn replay_is_deterministic_and_sees_every_write() {
        let (blob, _) = encode(trace()).unwrap();
        let mut heap = std::vec![0u64; 8 * 512];
        let a = run(&mut heap, &blob, 0, 5, 1, &mut Fake::default()).unwrap();
        let mut heap2 = std::vec![0u64; 8 * 512];
        let b = run(&mut heap2, &blob, 0, 5, 1, &mut Fake::default()).unwrap();
        assert_eq!(a.checksum, b.checksum);
        assert_eq!(a.ops, 300);
        let mut heap3 = std::vec![0u64; 8 * 512];
        let c = run(&mut heap3, &blob, 0, 6, 1, &mut Fake::default()).unwrap();
        assert_ne!(a.checksum, c.checksum, "the seed matters");
        // A blob whose records are all reads leaves the filled region as it was.
        let reads: std::vec::Vec<_> = trace().into_iter().map(|(k, p, _)| (k, p, false)).collect();
        let (rblob, _) = encode(reads).unwrap();
        let mut heap4 = std::vec![0u64; 8 * 512];
        let r = run(&mut heap4, &rblob, 0, 5, 1, &mut Fake::default()).unwrap();
        assert_ne!(r.checksum, a.checksum);
        let mut small = std::vec![0u64; 7 * 512];
        assert!(matches!(
            run(&mut small, &blob, 0, 5, 1, &mut Fake::default()),
            Err(Error::HeapTooSmall { .. })
        ));
        assert_eq!(
            run(&mut heap, &blob, 2, 5, 1, &mut Fake::default()),
            Err(Error::BadBlob { section: 2 })
        );
    }
}
