//! A snapshot's page file: guest RAM, every region in order, page `i` of RAM at offset
//! `i * 4 KiB`. Pages of zeros are holes (the file is sparse), so untouched RAM costs no disk.
//! The manifest keeps the file's length, how many pages were written and an XXH3-128 digest of
//! those pages (as stored: sealed, in a sealed snapshot) with their numbers, which a restore
//! checks. A sealed snapshot's pages are sealed and opened by [`super::sealed`].
//!
//! Pages are read and written through [`GuestRam`], so on remote memory every page — resident
//! or on a memory server — is copied by the paging engine (a remote page is read back from its
//! server, a chunk's remote pages in one batch; a page never written reads as zeros without
//! being fetched).

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use twox_hash::XxHash3_128;
use vm_memory::{Bytes, GuestAddress};

use super::sealed::{self, Sealing, Unsealed};
use super::SnapshotError;
use crate::vstate::memory::{GuestRam, MemError};

const PAGE: usize = 4096;
/// Pages copied per access to guest RAM.
const CHUNK: usize = 256 * PAGE;

/// Where guest RAM's pages are and what they hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryRecord {
    /// The page file's name inside the snapshot's directory.
    pub file: String,
    /// Guest RAM's regions, `(gpa, len)`, in file order.
    pub regions: Vec<(u64, u64)>,
    /// The page file's length (all of guest RAM).
    pub bytes: u64,
    /// Pages written (not zero).
    pub pages_written: u64,
    /// XXH3-128 of every written page's number (u64, little-endian) and bytes, in file
    /// order, in hex.
    pub digest: String,
}

fn is_zero(page: &[u8]) -> bool {
    page.iter().all(|&b| b == 0)
}

/// Writes the pages of `ram` to `path` (created, mode 0600), sealed by `seal` if given;
/// returns their record.
pub fn save(
    ram: &GuestRam,
    path: &Path,
    file_name: &str,
    mut seal: Option<&mut Sealing>,
) -> Result<MemoryRecord, SnapshotError> {
    let io = SnapshotError::write(path);
    let file = sealed::create_private(path)?;
    let mut hasher = XxHash3_128::new();
    let mut buf = vec![0u8; CHUNK];
    let (mut offset, mut written) = (0u64, 0u64);
    let mut regions = Vec::new();
    for r in ram.regions() {
        regions.push((r.gpa(), r.len()));
        let mut done = 0u64;
        while done < r.len() {
            let n = CHUNK.min((r.len() - done) as usize);
            let mem = |e: MemError| SnapshotError::Memory(e.to_string());
            ram.fetch_ahead(r.gpa() + done, n as u64).map_err(mem)?;
            ram.read_slice(&mut buf[..n], GuestAddress(r.gpa() + done))
                .map_err(mem)?;
            for (i, page) in buf[..n].chunks_mut(PAGE).enumerate() {
                if is_zero(page) {
                    continue;
                }
                let at = offset + done + (i * PAGE) as u64;
                if let Some(s) = seal.as_deref_mut() {
                    s.page(at / PAGE as u64, page)?;
                }
                hasher.write(&(at / PAGE as u64).to_le_bytes());
                hasher.write(page);
                file.write_all_at(page, at).map_err(&io)?;
                written += 1;
            }
            done += n as u64;
        }
        offset += r.len();
    }
    file.set_len(offset).map_err(&io)?;
    file.sync_all().map_err(&io)?;
    Ok(MemoryRecord {
        file: file_name.to_string(),
        regions,
        bytes: offset,
        pages_written: written,
        digest: format!("{:032x}", hasher.finish_128()),
    })
}

/// Loads the page file at `path` into `ram` (a VM built from the snapshot's description with
/// `VmConfig::restoring`, so its guest RAM is untouched): only the file's data extents are
/// read (`SEEK_DATA`), so a restore costs time in the pages the file holds, not in guest
/// RAM's size; a zero page inside an extent is left alone. The digest is checked over what
/// was read; a mismatch is [`SnapshotError::Corrupt`]. A sealed snapshot's pages are opened
/// by `sealed` once hashed.
pub fn load(
    ram: &GuestRam,
    path: &Path,
    rec: &MemoryRecord,
    sealed: Option<&Unsealed>,
) -> Result<(), SnapshotError> {
    let have: Vec<(u64, u64)> = ram.regions().iter().map(|r| (r.gpa(), r.len())).collect();
    if have != rec.regions {
        return Err(SnapshotError::corrupt(
            path,
            format!(
                "its RAM regions {:x?} are not the VM's {have:x?}",
                rec.regions
            ),
        ));
    }
    let file = File::open(path).map_err(SnapshotError::read(path))?;
    let len = file.metadata().map_err(SnapshotError::read(path))?.len();
    if len != rec.bytes {
        return Err(SnapshotError::corrupt(
            path,
            format!("{len} bytes, the manifest says {}", rec.bytes),
        ));
    }
    let mut hasher = XxHash3_128::new();
    let mut buf = vec![0u8; CHUNK];
    let (mut offset, mut written) = (0u64, 0u64);
    let mem = |e: MemError| SnapshotError::Memory(e.to_string());
    for &(gpa, rlen) in &rec.regions {
        let end = offset + rlen;
        let mut at = offset;
        while let Some((from, to)) =
            data_extent(&file, at, end).map_err(SnapshotError::read(path))?
        {
            let mut pos = from;
            while pos < to {
                let n = CHUNK.min((to - pos) as usize);
                file.read_exact_at(&mut buf[..n], pos)
                    .map_err(SnapshotError::read(path))?;
                for (i, page) in buf[..n].chunks_mut(PAGE).enumerate() {
                    if is_zero(page) {
                        continue;
                    }
                    let file_at = pos + (i * PAGE) as u64;
                    hasher.write(&(file_at / PAGE as u64).to_le_bytes());
                    hasher.write(page);
                    if let Some(s) = sealed {
                        s.open_page(path, file_at / PAGE as u64, page)?;
                    }
                    ram.write_slice(page, GuestAddress(gpa + file_at - offset))
                        .map_err(mem)?;
                    written += 1;
                }
                pos += n as u64;
            }
            at = to;
        }
        offset = end;
    }
    let digest = format!("{:032x}", hasher.finish_128());
    if written != rec.pages_written || digest != rec.digest {
        return Err(SnapshotError::corrupt(
            path,
            format!(
                "{written} pages with digest {digest}, the manifest says {} with {}",
                rec.pages_written, rec.digest
            ),
        ));
    }
    Ok(())
}

/// The first data extent of `file` at or after `at` and before `end`, page-aligned:
/// `(from, to)`, or None when only holes remain.
fn data_extent(file: &File, at: u64, end: u64) -> std::io::Result<Option<(u64, u64)>> {
    use std::os::fd::AsRawFd;
    if at >= end {
        return Ok(None);
    }
    let seek = |off: u64, whence: i32| -> std::io::Result<Option<u64>> {
        // SAFETY: lseek on a file descriptor this function borrows; no memory is passed.
        let r = unsafe { libc::lseek(file.as_raw_fd(), off as libc::off_t, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
            e => Err(e),
        }
    };
    let Some(from) = seek(at, libc::SEEK_DATA)? else {
        return Ok(None);
    };
    let from = from / PAGE as u64 * PAGE as u64;
    if from >= end {
        return Ok(None);
    }
    let to = seek(from, libc::SEEK_HOLE)?.unwrap_or(end);
    Ok(Some((
        from.max(at),
        to.div_ceil(PAGE as u64)
            .saturating_mul(PAGE as u64)
            .min(end),
    )))
}
