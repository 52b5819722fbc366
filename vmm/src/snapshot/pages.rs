//! A snapshot's page file: guest RAM, every region in order, page `i` of RAM at offset
//! `i * 4 KiB`. Pages of zeros are holes (the file is sparse), so untouched RAM costs no disk.
//! The manifest keeps the file's length, how many pages were written and an XXH3-128 digest of
//! those pages with their numbers, which a restore checks.
//!
//! Pages are read and written through [`GuestRam`], so on remote memory every page — resident
//! or on a memory server — is copied by the paging engine (a remote page is read back from its
//! server, a chunk's remote pages in one batch; a page never written reads as zeros without
//! being fetched).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use twox_hash::XxHash3_128;
use vm_memory::{Bytes, GuestAddress};

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

/// Writes the pages of `ram` to `path` (created); returns their record.
pub fn save(ram: &GuestRam, path: &Path, file_name: &str) -> Result<MemoryRecord, SnapshotError> {
    let io = SnapshotError::write(path);
    let file = File::create(path).map_err(&io)?;
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
            for (i, page) in buf[..n].chunks(PAGE).enumerate() {
                if is_zero(page) {
                    continue;
                }
                let at = offset + done + (i * PAGE) as u64;
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

/// Loads the page file at `path` into `ram` (a VM built from the snapshot's description, not
/// started): a page the file holds is written; a zero page is written only where the fresh VM
/// already holds something (its boot data), so untouched RAM stays untouched. The digest is
/// checked over what was read; a mismatch is [`SnapshotError::Corrupt`].
pub fn load(ram: &GuestRam, path: &Path, rec: &MemoryRecord) -> Result<(), SnapshotError> {
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
    let mut file = File::open(path).map_err(SnapshotError::read(path))?;
    let len = file.metadata().map_err(SnapshotError::read(path))?.len();
    if len != rec.bytes {
        return Err(SnapshotError::corrupt(
            path,
            format!("{len} bytes, the manifest says {}", rec.bytes),
        ));
    }
    let mut hasher = XxHash3_128::new();
    let (mut buf, mut current) = (vec![0u8; CHUNK], vec![0u8; PAGE]);
    let (mut offset, mut written) = (0u64, 0u64);
    let mem = |e: MemError| SnapshotError::Memory(e.to_string());
    for &(gpa, rlen) in &rec.regions {
        let mut done = 0u64;
        while done < rlen {
            let n = CHUNK.min((rlen - done) as usize);
            file.read_exact(&mut buf[..n])
                .map_err(SnapshotError::read(path))?;
            for (i, page) in buf[..n].chunks(PAGE).enumerate() {
                let at = GuestAddress(gpa + done + (i * PAGE) as u64);
                if is_zero(page) {
                    ram.read_slice(&mut current, at).map_err(mem)?;
                    if !is_zero(&current) {
                        ram.write_slice(page, at).map_err(mem)?;
                    }
                    continue;
                }
                let index = (offset + done) / PAGE as u64 + i as u64;
                hasher.write(&index.to_le_bytes());
                hasher.write(page);
                ram.write_slice(page, at).map_err(mem)?;
                written += 1;
            }
            done += n as u64;
        }
        offset += rlen;
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
