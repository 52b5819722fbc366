//! A snapshot sealed under a snapshot key (docs/sealing.md, "Snapshots at rest"): how its
//! files are encoded, on the way out ([`Sealing`]) and back in ([`Unsealed`]).
//!
//! The page file keeps its layout (page `i` of RAM at `i * 4 KiB`, zero pages as holes), each
//! written page encrypted in place by `farvm_seal::SnapshotSealer`, bound to its index in the
//! file and to the snapshot; its 16-byte tag is at `i * 16` in [`TAGS`] (holes elsewhere). A
//! pool snapshot's `remote.pages` is sealed in chunks of [`CHUNK_RECORDS`] records, each
//! followed by its tag, and its page key is stored wrapped in [`SEALED_KEY`] instead of
//! `page.key`. The manifest's machine state (every vCPU's registers, KVM's interrupt
//! controllers and clock, the devices' state) is sealed into its `machine` field. Its
//! [`SealRecord`] says how (scheme, the snapshot key's public id, the salt) and holds the
//! summary tag, over the manifest file's own bytes and every page's index and tag: a restore
//! checks it before it opens anything, so a page added, removed, swapped or replayed, or a
//! manifest field changed, is refused. The rest of the manifest (the VM's description, the
//! page file's record) is authenticated, not encrypted.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use farvm_seal::{
    PageKey, SnapshotOpener, SnapshotSealer, SNAPSHOT_SALT_LEN, SNAPSHOT_TAG_LEN, WRAPPED_KEY_LEN,
};
use serde::{Deserialize, Serialize};

use serde_json::Value;

use super::manifest::{self, Manifest, MANIFEST};
use super::remote::RECORD;
use super::SnapshotError;

/// The page tags' file name in a sealed snapshot.
pub const TAGS: &str = "memory.tags";
/// The wrapped page key's file name in a sealed pool snapshot.
pub const SEALED_KEY: &str = "page.key.sealed";
/// The [`SealRecord::scheme`] this farvm writes and reads.
pub const SCHEME: &str = "farvm-seal v1 snapshot: AES-256-GCM, HKDF-SHA256 subkey per snapshot";
/// Records of `remote.pages` sealed under one tag.
pub const CHUNK_RECORDS: usize = 4096;

const PAGE: usize = 4096;
const TAG: usize = SNAPSHOT_TAG_LEN;
/// Tags buffered before they are written (one page of the tags file).
const TAG_WINDOW: u64 = (PAGE / TAG) as u64;
/// The summary's value while the manifest's bytes are authenticated.
const UNSET: &str = "00000000000000000000000000000000";
/// The manifest's fields sealed into its `machine` field.
const MACHINE: [&str; 3] = ["vcpus", "kvm", "devices"];

/// The manifest's record of a sealed snapshot: never the key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SealRecord {
    /// [`SCHEME`].
    pub scheme: String,
    /// The snapshot key's public id (`farvm_seal::KeyId`), to tell a wrong key from damage.
    pub key_id: String,
    /// The snapshot's salt (its identity), hex.
    pub salt: String,
    /// The page tags' file ([`TAGS`]).
    pub tags: String,
    /// The summary tag over the manifest and every page's index and tag, hex.
    pub summary: String,
}

/// Creates (or truncates) `path` for a snapshot's content, mode 0600 whatever the umask or
/// an earlier file's mode: it holds guest pages, or what opens them.
pub(crate) fn create_private(path: &Path) -> Result<File, SnapshotError> {
    use std::os::unix::fs::PermissionsExt;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(SnapshotError::write(path))?;
    file.set_permissions(std::fs::Permissions::from_mode(0o600))
        .map_err(SnapshotError::write(path))?;
    Ok(file)
}

/// The save side: seals pages, records and the page key as they are written, then the
/// manifest ([`Sealing::write_manifest`]).
pub struct Sealing {
    sealer: SnapshotSealer,
    key_id: String,
    tags_path: PathBuf,
    tags: File,
    /// Tags of the pages `window_base..window_base + TAG_WINDOW`, not yet written.
    window: Box<[u8; PAGE]>,
    window_base: u64,
    /// Bytes of `window` holding tags to write (0: none).
    window_len: usize,
    records: Vec<u8>,
    records_chunk: u64,
}

impl Sealing {
    /// Starts sealing the snapshot in `dir` under `key` (creates [`TAGS`]).
    pub fn create(dir: &Path, key: &PageKey) -> Result<Self, SnapshotError> {
        let sealer = SnapshotSealer::create(key).map_err(|e| SnapshotError::Key(e.to_string()))?;
        let tags_path = dir.join(TAGS);
        let tags = create_private(&tags_path)?;
        Ok(Self {
            sealer,
            key_id: key.id().to_string(),
            tags_path,
            tags,
            window: Box::new([0; PAGE]),
            window_base: 0,
            window_len: 0,
            records: Vec::with_capacity(CHUNK_RECORDS * RECORD),
            records_chunk: 0,
        })
    }

    /// Seals `page`, the page at index `index` of the page file, in place and keeps its tag.
    pub fn page(&mut self, index: u64, page: &mut [u8]) -> Result<(), SnapshotError> {
        let page = as_page(page)?;
        let tag = self
            .sealer
            .seal_page(index, page)
            .map_err(|e| SnapshotError::State(e.to_string()))?;
        let base = index / TAG_WINDOW * TAG_WINDOW;
        if base != self.window_base {
            self.flush_tags()?;
            self.window_base = base;
        }
        let at = (index - base) as usize * TAG;
        self.window[at..at + TAG].copy_from_slice(&tag);
        self.window_len = self.window_len.max(at + TAG);
        Ok(())
    }

    fn flush_tags(&mut self) -> Result<(), SnapshotError> {
        if self.window_len > 0 {
            self.tags
                .write_all_at(
                    &self.window[..self.window_len],
                    self.window_base * TAG as u64,
                )
                .map_err(SnapshotError::write(&self.tags_path))?;
            self.window.fill(0);
            self.window_len = 0;
        }
        Ok(())
    }

    /// Adds one record of `remote.pages`, written to `out` sealed, a chunk at a time.
    pub fn record(&mut self, rec: &[u8; RECORD], out: &mut impl Write) -> std::io::Result<()> {
        self.records.extend_from_slice(rec);
        if self.records.len() == CHUNK_RECORDS * RECORD {
            self.flush_records(out)?;
        }
        Ok(())
    }

    /// Writes the last, partial chunk of records.
    pub fn flush_records(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if self.records.is_empty() {
            return Ok(());
        }
        let tag = self
            .sealer
            .seal_records(self.records_chunk, &mut self.records)
            .map_err(std::io::Error::other)?;
        self.records_chunk += 1;
        out.write_all(&self.records)?;
        out.write_all(&tag)?;
        self.records.clear();
        Ok(())
    }

    /// Writes the page key `key`, wrapped, into `dir`; returns the file's name.
    pub fn wrap_key(&mut self, dir: &Path, key: &PageKey) -> Result<String, SnapshotError> {
        let wrapped = self
            .sealer
            .wrap_key(key)
            .map_err(|e| SnapshotError::State(e.to_string()))?;
        let path = dir.join(SEALED_KEY);
        let mut f = create_private(&path)?;
        f.write_all(&wrapped)
            .and_then(|()| f.sync_all())
            .map_err(SnapshotError::write(&path))?;
        Ok(SEALED_KEY.to_string())
    }

    /// Writes the last tags, then `manifest` into `dir` with its [`SealRecord`]: its machine
    /// state sealed, and a summary that authenticates the file's bytes and every page sealed.
    pub fn write_manifest(
        mut self,
        manifest: &mut Manifest,
        dir: &Path,
    ) -> Result<(), SnapshotError> {
        self.flush_tags()?;
        self.tags
            .sync_all()
            .map_err(SnapshotError::write(&self.tags_path))?;
        manifest.sealed = Some(SealRecord {
            scheme: SCHEME.into(),
            key_id: self.key_id.clone(),
            salt: hex(self.sealer.salt()),
            tags: TAGS.into(),
            summary: UNSET.into(),
        });
        let path = dir.join(MANIFEST);
        let json = |e: serde_json::Error| SnapshotError::Write {
            path: path.clone(),
            source: std::io::Error::other(e),
        };
        let mut v = serde_json::to_value(&*manifest).map_err(json)?;
        let fields = v
            .as_object_mut()
            .ok_or_else(|| SnapshotError::State("the manifest is not a JSON object".into()))?;
        let machine: serde_json::Map<String, Value> = MACHINE
            .iter()
            .filter_map(|&k| fields.remove(k).map(|x| (k.to_string(), x)))
            .collect();
        let mut sealed = serde_json::to_vec(&machine).map_err(json)?;
        self.sealer
            .seal_machine(&mut sealed)
            .map_err(|e| SnapshotError::State(e.to_string()))?;
        fields.insert("machine".into(), Value::String(hex(&sealed)));
        let mut text = serde_json::to_vec(&v).map_err(json)?;
        let at = summary_at(&text, UNSET).ok_or_else(|| {
            SnapshotError::State("the manifest's summary field was not written".into())
        })?;
        let summary = hex(&self.sealer.finish(&text));
        text[at..at + UNSET.len()].copy_from_slice(summary.as_bytes());
        manifest::write_bytes(dir, &text)
    }
}

/// Where the summary's hex value `value` starts in a manifest's bytes (its last occurrence:
/// the seal record is the manifest's last field).
fn summary_at(text: &[u8], value: &str) -> Option<usize> {
    let needle = format!("\"summary\":\"{value}\"");
    text.windows(needle.len())
        .rposition(|w| w == needle.as_bytes())
        .map(|p| p + needle.len() - 1 - value.len())
}

/// `page` as one whole page.
fn as_page(page: &mut [u8]) -> Result<&mut [u8; PAGE], SnapshotError> {
    let len = page.len();
    page.try_into()
        .map_err(|_| SnapshotError::Memory(format!("a page of {len} bytes")))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of the hex string `s`.
fn unhex_vec(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// The `N` bytes of the hex string `s`.
fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    unhex_vec(s)?.try_into().ok()
}

/// The restore side: a sealed snapshot whose summary checked under the key given, ready to
/// open its pages, records and page key.
pub struct Unsealed {
    opener: SnapshotOpener,
    /// Every sealed page's index in the page file and tag, in index order.
    tags: Vec<(u64, [u8; TAG])>,
    page_key: Option<PageKey>,
}

impl std::fmt::Debug for Unsealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unsealed")
            .field("pages", &self.tags.len())
            .finish_non_exhaustive()
    }
}

impl Unsealed {
    /// Checks the sealed manifest `v` (read from the bytes `text`) of the snapshot in `dir`
    /// under `key`: the key's id, then the summary over the manifest and the page tags, then
    /// the machine state (opened into `v`), the page key's wrapping and a pool snapshot's
    /// remote-page list. Nothing is loaded yet.
    pub fn check(
        dir: &Path,
        text: &[u8],
        v: &mut Value,
        key: &PageKey,
    ) -> Result<Self, SnapshotError> {
        let path = dir.join(MANIFEST);
        let corrupt = |reason: String| SnapshotError::corrupt(&path, reason);
        let rec: SealRecord = serde_json::from_value(v["sealed"].clone())
            .map_err(|e| corrupt(format!("its seal record: {e}")))?;
        if rec.scheme != SCHEME {
            return Err(corrupt(format!(
                "sealed with `{}`; this farvm reads `{SCHEME}`",
                rec.scheme
            )));
        }
        if rec.key_id != key.id().to_string() {
            return Err(SnapshotError::KeyWrong {
                dir: dir.to_path_buf(),
                sealed: rec.key_id.clone(),
                given: key.id().to_string(),
            });
        }
        let salt: [u8; SNAPSHOT_SALT_LEN] =
            unhex(&rec.salt).ok_or_else(|| corrupt("its seal's salt is not hex".into()))?;
        let summary: [u8; TAG] =
            unhex(&rec.summary).ok_or_else(|| corrupt("its seal's summary is not hex".into()))?;
        let at = summary_at(text, &rec.summary)
            .ok_or_else(|| corrupt("its seal's summary is not where it was written".into()))?;
        let mut unset = text.to_vec();
        unset[at..at + UNSET.len()].copy_from_slice(UNSET.as_bytes());
        if Path::new(&rec.tags).file_name().and_then(|f| f.to_str()) != Some(rec.tags.as_str()) {
            return Err(corrupt(format!(
                "the tags file `{}` is not a file name inside the snapshot",
                rec.tags
            )));
        }
        let bytes = v["memory"]["bytes"]
            .as_u64()
            .ok_or_else(|| corrupt("no page file length".into()))?;
        let tags = read_tags(&dir.join(&rec.tags), bytes)?;
        let opener = SnapshotOpener::new(key, &salt);
        opener
            .check_summary(&unset, tags.iter().map(|(i, t)| (*i, t)), &summary)
            .map_err(|e| {
                corrupt(format!(
                    "{e}: manifest.json, {} or the page file's holes were changed",
                    rec.tags
                ))
            })?;
        // Authentic from here: the machine state goes back where the manifest keeps it.
        let fields = v
            .as_object_mut()
            .ok_or_else(|| corrupt("not a JSON object".into()))?;
        let mut machine = fields
            .remove("machine")
            .and_then(|m| m.as_str().and_then(unhex_vec))
            .ok_or_else(|| corrupt("no sealed machine state".into()))?;
        opener
            .open_machine(&mut machine)
            .map_err(|e| corrupt(e.to_string()))?;
        let machine: serde_json::Map<String, Value> = serde_json::from_slice(&machine)
            .map_err(|e| corrupt(format!("its machine state: {e}")))?;
        fields.extend(machine);
        let page_key = match v["pool"]["key_file"].as_str() {
            Some(file) if file == SEALED_KEY => {
                let kpath = dir.join(file);
                let data = std::fs::read(&kpath).map_err(SnapshotError::read(&kpath))?;
                let wrapped: [u8; WRAPPED_KEY_LEN] = data
                    .as_slice()
                    .try_into()
                    .map_err(|_| SnapshotError::corrupt(&kpath, format!("{} bytes", data.len())))?;
                Some(
                    opener
                        .unwrap_key(&wrapped)
                        .map_err(|e| SnapshotError::corrupt(&kpath, e.to_string()))?,
                )
            }
            Some(file) => {
                return Err(corrupt(format!(
                    "sealed, but its page key is in `{file}`, not {SEALED_KEY}"
                )))
            }
            None => None,
        };
        let unsealed = Self {
            opener,
            tags,
            page_key,
        };
        // A pool snapshot's remote-page list is checked now too (and opened again when it is
        // adopted), so an altered one is refused before the VM is built.
        if let (Some(file), Some(records)) =
            (v["pool"]["file"].as_str(), v["pool"]["pages"].as_u64())
        {
            let rpath = dir.join(file);
            let data = std::fs::read(&rpath).map_err(SnapshotError::read(&rpath))?;
            unsealed.open_records(&rpath, data, records)?;
        }
        Ok(unsealed)
    }

    /// The pool snapshot's page key, unwrapped.
    pub fn page_key(&self) -> Option<&PageKey> {
        self.page_key.as_ref()
    }

    /// Opens `page`, the page at index `index` of the page file `path`, in place.
    pub fn open_page(&self, path: &Path, index: u64, page: &mut [u8]) -> Result<(), SnapshotError> {
        let page = as_page(page)?;
        let tag = self
            .tags
            .binary_search_by_key(&index, |(i, _)| *i)
            .map(|k| &self.tags[k].1)
            .map_err(|_| {
                SnapshotError::corrupt(
                    path,
                    format!("page {index} holds data it was not sealed with"),
                )
            })?;
        self.opener
            .open_page(index, page, tag)
            .map_err(|e| SnapshotError::corrupt(path, e.to_string()))
    }

    /// Opens the sealed `remote.pages` bytes `data` (at `path`) of `records` records; returns
    /// the records.
    pub fn open_records(
        &self,
        path: &Path,
        mut data: Vec<u8>,
        records: u64,
    ) -> Result<Vec<u8>, SnapshotError> {
        let chunks = records.div_ceil(CHUNK_RECORDS as u64);
        let want = records * RECORD as u64 + chunks * TAG as u64;
        if data.len() as u64 != want {
            return Err(SnapshotError::corrupt(
                path,
                format!("{} bytes; {records} sealed records take {want}", data.len()),
            ));
        }
        let mut out = Vec::with_capacity((records * RECORD as u64) as usize);
        for (i, chunk) in data.chunks_mut(CHUNK_RECORDS * RECORD + TAG).enumerate() {
            let (body, tag) = chunk.split_at_mut(chunk.len() - TAG);
            let tag: [u8; TAG] = (&*tag).try_into().unwrap_or([0; TAG]);
            self.opener
                .open_records(i as u64, body, &tag)
                .map_err(|e| SnapshotError::corrupt(path, e.to_string()))?;
            out.extend_from_slice(body);
        }
        Ok(out)
    }
}

/// The tags file of a page file of `bytes` bytes: every non-zero tag with its page index.
fn read_tags(path: &Path, bytes: u64) -> Result<Vec<(u64, [u8; TAG])>, SnapshotError> {
    let data = std::fs::read(path).map_err(SnapshotError::read(path))?;
    let pages = bytes / PAGE as u64;
    if data.len() as u64 > pages * TAG as u64 {
        return Err(SnapshotError::corrupt(
            path,
            format!("{} bytes for a page file of {pages} pages", data.len()),
        ));
    }
    Ok(data
        .chunks_exact(TAG)
        .enumerate()
        .filter(|(_, t)| t.iter().any(|&b| b != 0))
        .map(|(i, t)| (i as u64, t.try_into().unwrap_or([0; TAG])))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_is_found_where_it_was_written() {
        let text = br#"{"vm":{"name":"\"summary\":\"00000000000000000000000000000000\""},"sealed":{"summary":"00000000000000000000000000000000"}}"#;
        let at = summary_at(text, UNSET).unwrap();
        assert_eq!(&text[at - 1..at], b"\"");
        assert_eq!(&text[at + UNSET.len()..], b"\"}}");
        assert_eq!(unhex::<2>("0aff"), Some([10, 255]));
        assert_eq!(unhex::<2>("0ag0"), None);
        assert_eq!(hex(&[10, 255]), "0aff");
    }
}
