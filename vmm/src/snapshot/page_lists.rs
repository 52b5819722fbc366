//! The two page lists a pool VM's snapshot keeps beside its page file for a lazy restore
//! (`farvm run --restore-pages`, [`super::RestorePages`]):
//!
//! - `resident.pages`: every page the page file holds, with the fingerprint (XXH3-128) of its
//!   content: 24-byte records, page u64 and fingerprint u128, little-endian, in page order,
//!   then a 16-byte trailer, the XXH3-128 of the records. A lazy restore takes these pages as
//!   remote with these fingerprints, so the paging engine checks each page read from the file
//!   on its first touch, as it checks a page read from a memory server.
//! - `working-set.pages`: the resident pages in the order they first became resident in the
//!   run that was saved (the engine's touch log; pages it did not log follow in page order):
//!   page numbers, u64 little-endian, then the same trailer. A `working-set` restore fetches
//!   them in that order.
//!
//! A snapshot written by a farvm without them restores eagerly only.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use twox_hash::XxHash3_128;

use super::SnapshotError;

/// The resident pages' fingerprints file's name.
pub const RESIDENT_PAGES: &str = "resident.pages";
/// The working set's file name.
pub const WORKING_SET: &str = "working-set.pages";
const TRAILER: usize = 16;
const RESIDENT_RECORD: usize = 24;

/// Writes one list: records, then the trailer (module doc).
pub(crate) struct ListWriter {
    path: PathBuf,
    out: BufWriter<File>,
    hasher: XxHash3_128,
    records: u64,
}

impl ListWriter {
    /// Creates `name` in `dir`.
    pub fn create(dir: &Path, name: &str) -> Result<Self, SnapshotError> {
        let path = dir.join(name);
        let out = BufWriter::new(File::create(&path).map_err(SnapshotError::write(&path))?);
        Ok(Self {
            path,
            out,
            hasher: XxHash3_128::new(),
            records: 0,
        })
    }

    fn record(&mut self, bytes: &[u8]) -> Result<(), SnapshotError> {
        self.hasher.write(bytes);
        self.records += 1;
        self.out
            .write_all(bytes)
            .map_err(SnapshotError::write(&self.path))
    }

    /// Appends a resident page and its fingerprint.
    pub fn resident(&mut self, page: u64, fp: u128) -> Result<(), SnapshotError> {
        let mut rec = [0u8; RESIDENT_RECORD];
        rec[..8].copy_from_slice(&page.to_le_bytes());
        rec[8..].copy_from_slice(&fp.to_le_bytes());
        self.record(&rec)
    }

    /// Appends a page number.
    pub fn page(&mut self, page: u64) -> Result<(), SnapshotError> {
        self.record(&page.to_le_bytes())
    }

    /// Writes the trailer and syncs; returns the records written.
    pub fn finish(mut self) -> Result<u64, SnapshotError> {
        let io = SnapshotError::write(&self.path);
        self.out
            .write_all(&self.hasher.finish_128().to_le_bytes())
            .map_err(&io)?;
        let file = self.out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(&io)?;
        Ok(self.records)
    }
}

/// The records of list `name` in `dir`, each `record` bytes, checked against its trailer.
/// `Ok(None)`: the snapshot has no such list.
fn read_list(dir: &Path, name: &str, record: usize) -> Result<Option<Vec<u8>>, SnapshotError> {
    let path = dir.join(name);
    let mut data = Vec::new();
    match File::open(&path) {
        Ok(mut f) => f
            .read_to_end(&mut data)
            .map_err(SnapshotError::read(&path))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SnapshotError::read(&path)(e)),
    };
    if data.len() < TRAILER || !(data.len() - TRAILER).is_multiple_of(record) {
        return Err(SnapshotError::corrupt(
            &path,
            format!(
                "{} bytes is no whole number of {record}-byte records and a trailer",
                data.len()
            ),
        ));
    }
    let trailer = data.split_off(data.len() - TRAILER);
    let digest = XxHash3_128::oneshot(&data).to_le_bytes();
    if trailer != digest {
        return Err(SnapshotError::corrupt(
            &path,
            "its records do not match their digest".into(),
        ));
    }
    Ok(Some(data))
}

/// The resident pages and their fingerprints (`resident.pages`), or None if the snapshot has
/// no such list.
pub fn read_resident(dir: &Path) -> Result<Option<Vec<(u64, u128)>>, SnapshotError> {
    Ok(
        read_list(dir, RESIDENT_PAGES, RESIDENT_RECORD)?.map(|data| {
            data.chunks_exact(RESIDENT_RECORD)
                .map(|r| {
                    let (p, fp) = r.split_at(8);
                    (
                        u64::from_le_bytes(p.try_into().unwrap_or_default()),
                        u128::from_le_bytes(fp.try_into().unwrap_or_default()),
                    )
                })
                .collect()
        }),
    )
}

/// The working set in recorded order (`working-set.pages`), or None if the snapshot has none.
pub fn read_working_set(dir: &Path) -> Result<Option<Vec<u64>>, SnapshotError> {
    Ok(read_list(dir, WORKING_SET, 8)?.map(|data| {
        data.chunks_exact(8)
            .map(|r| u64::from_le_bytes(r.try_into().unwrap_or_default()))
            .collect()
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_back_and_damage_is_refused() {
        let dir = std::env::temp_dir().join(format!("farvm-page-lists-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(read_resident(&dir).unwrap().is_none());
        let mut w = ListWriter::create(&dir, RESIDENT_PAGES).unwrap();
        w.resident(3, 0xabc).unwrap();
        w.resident(9, u128::MAX).unwrap();
        assert_eq!(w.finish().unwrap(), 2);
        assert_eq!(
            read_resident(&dir).unwrap(),
            Some(vec![(3, 0xabc), (9, u128::MAX)])
        );
        let mut w = ListWriter::create(&dir, WORKING_SET).unwrap();
        for p in [9, 3] {
            w.page(p).unwrap();
        }
        w.finish().unwrap();
        assert_eq!(read_working_set(&dir).unwrap(), Some(vec![9, 3]));

        let path = dir.join(WORKING_SET);
        let mut data = std::fs::read(&path).unwrap();
        data[0] ^= 1;
        std::fs::write(&path, &data).unwrap();
        assert!(matches!(
            read_working_set(&dir),
            Err(SnapshotError::Corrupt { .. })
        ));
        std::fs::write(&path, &data[..20]).unwrap();
        assert!(matches!(
            read_working_set(&dir),
            Err(SnapshotError::Corrupt { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
