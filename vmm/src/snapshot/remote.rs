//! The remote part of a pool VM's snapshot: its remote pages stay on the pool's memory
//! servers, so the snapshot holds only the resident pages (in the page file, as
//! [`super::pages`] lays it out) and a record of the rest — the VM's id in the pool (its
//! namespace derives from it), every remote page's number and the fingerprint of the content
//! the servers hold (`remote.pages`: 24-byte records, page u64 and fingerprint u128, both
//! little-endian, in page order; its low 64 bits are the page's write version), and the page
//! key (`page.key`, mode 0600) that sealed them. In a sealed snapshot ([`super::sealed`]) the
//! records are sealed in chunks and the key is stored wrapped. A restore takes the remote pages back as
//! remote, the engine reading each from the servers on the guest's first touch. A clear
//! snapshot also lists its resident pages for a lazy restore ([`super::page_lists`]).

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use farvm_ept::{Engine, EngineError, SavedPage};
use serde::{Deserialize, Serialize};
use twox_hash::XxHash3_128;

use super::page_lists::{ListWriter, RESIDENT_PAGES, WORKING_SET};
use super::pages::MemoryRecord;
use super::sealed::{self, Sealing, Unsealed};
use super::SnapshotError;
use crate::remote::{RemoteSaving, SnapshotPageFile};
use crate::vstate::memory::GuestRam;

/// The remote pages file's name in a snapshot's directory.
pub const REMOTE_PAGES: &str = "remote.pages";
/// The page key file's name.
pub const KEY: &str = "page.key";
/// Bytes of one record of the remote pages file.
pub(crate) const RECORD: usize = 24;
const PAGE: u64 = 4096;

/// The manifest's record of the remote part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteRecord {
    /// The VM's id in the pool (the snapshot's id there: `farvm pool status`).
    pub pool_vm: String,
    /// Its namespace on the memory servers.
    pub namespace: u64,
    /// The remote pages file's name.
    pub file: String,
    /// Remote pages listed there.
    pub pages: u64,
    /// XXH3-128 of the file, in hex.
    pub digest: String,
    /// The page key file's name, if the pages are sealed.
    pub key_file: Option<String>,
}

pub(crate) use crate::remote::file_offset;

/// What a save or a migration should take page `p` for: a page the engine lists remote but
/// that `file` (a lazy restore's) still serves is on no server, so its bytes are read from
/// the file into `buf` and it counts as resident; any other page is as the engine listed it.
pub fn listed_page<'a>(
    file: Option<&SnapshotPageFile>,
    p: u64,
    listed: SavedPage<'a>,
    buf: &'a mut [u8],
) -> Result<SavedPage<'a>, SnapshotError> {
    match (listed, file) {
        (SavedPage::Remote(_), Some(file)) if file.holds(p) => {
            file.read_page(p, buf)?;
            Ok(SavedPage::Resident(buf))
        }
        (listed, _) => Ok(listed),
    }
}

/// A writer that hashes what it writes (the remote pages file's digest is of its bytes).
struct Hashed<W> {
    out: W,
    hasher: XxHash3_128,
}

impl<W: Write> Write for Hashed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.out.write(buf)?;
        self.hasher.write(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// An error of the engine's listing, or of writing what it lists.
enum SaveFailure {
    Engine(EngineError),
    Snapshot(SnapshotError),
}

impl From<EngineError> for SaveFailure {
    fn from(e: EngineError) -> Self {
        SaveFailure::Engine(e)
    }
}

/// Writes the resident pages of the pool VM `saving` (RAM `ram`) into `dir`'s page file,
/// its remote pages' record into [`REMOTE_PAGES`] and its key into [`KEY`]; reads nothing
/// back from the servers. The VM is paused. With `seal`, pages, records and key are sealed.
pub fn save(
    saving: &RemoteSaving,
    ram: &GuestRam,
    dir: &Path,
    pages_file: &str,
    pool_vm: &str,
    mut seal: Option<&mut Sealing>,
) -> Result<(MemoryRecord, RemoteRecord), SnapshotError> {
    let path = dir.join(pages_file);
    let io = SnapshotError::write(&path);
    let file = sealed::create_private(&path)?;
    let regions: Vec<(u64, u64)> = ram.regions().iter().map(|r| (r.gpa(), r.len())).collect();
    let bytes: u64 = regions.iter().map(|r| r.1).sum();
    let remote_path = dir.join(REMOTE_PAGES);
    let remote_io = SnapshotError::write(&remote_path);
    let mut remote = Hashed {
        out: BufWriter::new(sealed::create_private(&remote_path)?),
        hasher: XxHash3_128::new(),
    };
    let mut sealed_page = [0u8; PAGE as usize];
    let mut hasher = XxHash3_128::new();
    let (mut written, mut remote_pages) = (0u64, 0u64);
    // A sealed snapshot keeps no page lists: the fingerprints would be a clear record of
    // its pages' content (it restores eagerly only).
    let mut resident_list = if seal.is_none() {
        Some(ListWriter::create(dir, RESIDENT_PAGES)?)
    } else {
        None
    };
    let mut in_file = vec![0u64; (bytes / PAGE).div_ceil(64) as usize + 1];
    let mut from_old_file = vec![0u8; PAGE as usize];
    let listed = saving
        .engine
        .save_pages(|p, what| -> Result<(), SaveFailure> {
            let what = listed_page(
                saving.snapshot_pages.as_deref(),
                p,
                what,
                &mut from_old_file,
            )
            .map_err(SaveFailure::Snapshot)?;
            match what {
                SavedPage::Resident(data) => {
                    if data.iter().all(|&b| b == 0) {
                        return Ok(());
                    }
                    let Some(at) = file_offset(&regions, p) else {
                        return Ok(()); // the MMIO hole: no RAM, never written by the guest
                    };
                    if let Some(list) = resident_list.as_mut() {
                        list.resident(p, XxHash3_128::oneshot(data))
                            .map_err(SaveFailure::Snapshot)?;
                    }
                    let data = match seal.as_deref_mut() {
                        Some(s) => {
                            sealed_page.copy_from_slice(data);
                            s.page(at / PAGE, &mut sealed_page)
                                .map_err(SaveFailure::Snapshot)?;
                            &sealed_page[..]
                        }
                        None => data,
                    };
                    hasher.write(&(at / PAGE).to_le_bytes());
                    hasher.write(data);
                    file.write_all_at(data, at)
                        .map_err(|e| SaveFailure::Snapshot(io(e)))?;
                    if let Some(w) = in_file.get_mut((p / 64) as usize) {
                        *w |= 1 << (p % 64);
                    }
                    written += 1;
                }
                SavedPage::Remote(fp) => {
                    let mut rec = [0u8; RECORD];
                    rec[..8].copy_from_slice(&p.to_le_bytes());
                    rec[8..].copy_from_slice(&fp.to_le_bytes());
                    match seal.as_deref_mut() {
                        Some(s) => s.record(&rec, &mut remote),
                        None => remote.write_all(&rec),
                    }
                    .map_err(|e| SaveFailure::Snapshot(remote_io(e)))?;
                    remote_pages += 1;
                }
            }
            Ok(())
        });
    match listed {
        Ok(()) => {}
        Err(SaveFailure::Engine(e)) => return Err(SnapshotError::Memory(e.to_string())),
        Err(SaveFailure::Snapshot(e)) => return Err(e),
    }
    file.set_len(bytes).map_err(&io)?;
    file.sync_all().map_err(&io)?;
    if let Some(list) = resident_list {
        list.finish()?;
        write_working_set(&saving.engine, dir, &mut in_file)?;
    }
    if let Some(s) = seal.as_deref_mut() {
        s.flush_records(&mut remote).map_err(&remote_io)?;
    }
    let remote_digest = remote.hasher.finish_128();
    let remote = remote
        .out
        .into_inner()
        .map_err(|e| remote_io(e.into_error()))?;
    remote.sync_all().map_err(&remote_io)?;
    let key = saving
        .keys
        .as_ref()
        .map(|k| k.settled_key())
        .transpose()
        .map_err(|e| SnapshotError::State(e.to_string()))?;
    let key_file = match (&key, seal) {
        (Some(key), Some(s)) => Some(s.wrap_key(dir, key)?),
        (Some(key), None) => {
            let path = dir.join(KEY);
            key.write_file(&path).map_err(|e| SnapshotError::Write {
                path,
                source: std::io::Error::other(e.to_string()),
            })?;
            Some(KEY.to_string())
        }
        (None, _) => None,
    };
    Ok((
        MemoryRecord {
            file: pages_file.to_string(),
            regions,
            bytes,
            pages_written: written,
            digest: format!("{:032x}", hasher.finish_128()),
        },
        RemoteRecord {
            pool_vm: pool_vm.to_string(),
            namespace: saving.namespace,
            file: REMOTE_PAGES.to_string(),
            pages: remote_pages,
            digest: format!("{remote_digest:032x}"),
            key_file,
        },
    ))
}

/// Writes the working set (`working-set.pages`): the pages of the page file (`in_file`, one
/// bit per page, cleared here) in the order the engine's touch log has them, then those it
/// did not log, in page order.
fn write_working_set(
    engine: &Engine,
    dir: &Path,
    in_file: &mut [u64],
) -> Result<(), SnapshotError> {
    let mut list = ListWriter::create(dir, WORKING_SET)?;
    let pages = in_file.len() as u64 * 64;
    let mut take = |p: u64| -> Option<u64> {
        let w = in_file.get_mut((p / 64) as usize)?;
        let bit = 1 << (p % 64);
        let had = *w & bit != 0;
        *w &= !bit;
        had.then_some(p)
    };
    for p in engine.touch_order() {
        if let Some(p) = take(p) {
            list.page(p)?;
        }
    }
    for i in 0..pages {
        if let Some(p) = take(i) {
            list.page(p)?;
        }
    }
    list.finish()?;
    Ok(())
}

/// Reads the remote pages file of `rec` in `dir` (opened by `sealed` in a sealed snapshot)
/// and takes each page back as remote in `engine` (a fresh VM's, before it runs). The file
/// must match the record.
pub fn adopt(
    engine: &Engine,
    dir: &Path,
    rec: &RemoteRecord,
    sealed: Option<&Unsealed>,
) -> Result<(), SnapshotError> {
    let path = dir.join(&rec.file);
    let mut data = Vec::new();
    File::open(&path)
        .and_then(|mut f| f.read_to_end(&mut data))
        .map_err(SnapshotError::read(&path))?;
    let digest = format!("{:032x}", XxHash3_128::oneshot(&data));
    if digest != rec.digest {
        return Err(SnapshotError::corrupt(
            &path,
            format!("digest {digest}; the manifest says {}", rec.digest),
        ));
    }
    if let Some(s) = sealed {
        data = s.open_records(&path, data, rec.pages)?;
    }
    if data.len() as u64 != rec.pages * RECORD as u64 {
        return Err(SnapshotError::corrupt(
            &path,
            format!(
                "{} bytes with digest {digest}; the manifest says {} pages with {}",
                data.len(),
                rec.pages,
                rec.digest
            ),
        ));
    }
    for r in data.chunks_exact(RECORD) {
        let page = u64::from_le_bytes(r[..8].try_into().unwrap_or_default());
        let fp = u128::from_le_bytes(r[8..].try_into().unwrap_or_default());
        engine
            .adopt_remote(page, fp)
            .map_err(|e| SnapshotError::Memory(e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_map_to_the_page_file_across_the_mmio_hole() {
        let regions = [(0, 3 << 30), (4 << 30, 1 << 30)];
        assert_eq!(file_offset(&regions, 0), Some(0));
        assert_eq!(file_offset(&regions, 5), Some(5 * PAGE));
        assert_eq!(file_offset(&regions, (3 << 30) / PAGE), None);
        assert_eq!(file_offset(&regions, (4 << 30) / PAGE), Some(3 << 30));
        assert_eq!(file_offset(&regions, (5 << 30) / PAGE), None);
    }
}
