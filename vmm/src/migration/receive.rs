//! The destination of a live migration (module doc of [`super`]): waits for the source on a
//! TCP address, receives the stream into a snapshot directory (the page file filled as pages
//! arrive, the remote-page list, the page key, the manifest), and answers the source once
//! the VM it builds from that directory is loaded and owns the namespace
//! ([`Arrival::answer`]).

use std::fs::File;
use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use farvm_seal::PageKey;

use super::send::{Finish, Outcome, Start};
use super::wire::{Channel, Kind};
use super::{io, MigrationError};
use crate::snapshot::manifest::PAGES;
use crate::snapshot::remote::{file_offset, KEY, REMOTE_PAGES};
use crate::snapshot::Snapshot;

const PAGE: usize = 4096;
/// How long the source may be silent mid-stream.
const IDLE: Duration = Duration::from_secs(60);

/// A destination waiting for its source.
pub struct Incoming {
    listener: TcpListener,
}

/// A migration received: the snapshot directory it was laid out in, and the stream to
/// answer the source on.
pub struct Arrival {
    dir: PathBuf,
    /// When the source's last frame arrived.
    at: std::time::Instant,
    fence: i64,
    ch: Channel,
    /// Bytes received (the resident pages, the remote list, the state).
    pub bytes_received: u64,
}

impl Incoming {
    /// Listens on `addr` for one source.
    pub fn listen(addr: SocketAddr) -> Result<Self, MigrationError> {
        let listener = TcpListener::bind(addr).map_err(io("listening for the source"))?;
        Ok(Self { listener })
    }

    /// The address listened on.
    pub fn addr(&self) -> Result<SocketAddr, MigrationError> {
        self.listener
            .local_addr()
            .map_err(io("listening for the source"))
    }

    /// Waits for the source and receives its VM into `dir` (created; it must not hold a
    /// snapshot), under the shared migration `key`.
    pub fn receive(self, dir: &Path, key: &PageKey) -> Result<Arrival, MigrationError> {
        let (stream, from) = self.listener.accept().map_err(io("accepting the source"))?;
        tracing::info!(%from, "migration: the source connected");
        let _ = stream.set_nodelay(true);
        let mut ch = Channel::accept(stream, key)?;
        ch.read_timeout(Some(IDLE))?;
        std::fs::create_dir_all(dir).map_err(io("creating the migration directory"))?;
        let (fence, received) = receive_into(&mut ch, dir)?;
        Ok(Arrival {
            dir: dir.to_path_buf(),
            at: std::time::Instant::now(),
            fence,
            ch,
            bytes_received: received,
        })
    }
}

impl std::os::fd::AsFd for Incoming {
    /// The listening socket: readable once a source connects (a caller may wait on it,
    /// bounded, before [`Incoming::receive`]).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

impl Arrival {
    /// The snapshot to build the VM from: it takes the namespace over on the source's fence.
    pub fn snapshot(&self) -> Result<Snapshot, MigrationError> {
        Ok(Snapshot::open(&self.dir)?.arriving(self.fence))
    }

    /// The directory the stream was laid out in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Tells the source how it ended: Ok once the VM is loaded and owns the namespace (the
    /// source stops), or why it failed (the source runs on).
    pub fn answer(mut self, result: Result<(), String>) -> Result<(), MigrationError> {
        let mut buf = serde_json::to_vec(&Outcome {
            error: result.err(),
            secs: self.at.elapsed().as_secs_f64(),
        })
        .map_err(|e| MigrationError::Protocol(e.to_string()))?;
        self.ch.send(Kind::Outcome, &mut buf)
    }
}

/// Receives frames until the source's last; returns the fence and the bytes received.
fn receive_into(ch: &mut Channel, dir: &Path) -> Result<(i64, u64), MigrationError> {
    let mut buf = Vec::new();
    let mut received = 0u64;
    let start: Start = match ch.recv(&mut buf)? {
        Kind::Start => serde_json::from_slice(&buf)
            .map_err(|e| MigrationError::Protocol(format!("the start frame: {e}")))?,
        k => return Err(MigrationError::Protocol(format!("first frame {k:?}"))),
    };
    let pages_path = dir.join(PAGES);
    let write = |p: &Path| {
        let p = p.to_path_buf();
        move |source| {
            MigrationError::Snapshot(crate::snapshot::SnapshotError::Write {
                path: p.clone(),
                source,
            })
        }
    };
    let pages = File::create(&pages_path).map_err(write(&pages_path))?;
    pages.set_len(start.bytes).map_err(write(&pages_path))?;
    let remote_path = dir.join(REMOTE_PAGES);
    let mut remote = File::create(&remote_path).map_err(write(&remote_path))?;
    let zero = [0u8; PAGE];
    let at = |p: u64| {
        file_offset(&start.regions, p)
            .ok_or_else(|| MigrationError::Protocol(format!("page {p} is not in guest RAM")))
    };
    loop {
        let kind = ch.recv(&mut buf)?;
        received += buf.len() as u64;
        match kind {
            Kind::Pages => {
                if buf.len() % (8 + PAGE) != 0 {
                    return Err(MigrationError::Protocol("a torn page frame".into()));
                }
                for rec in buf.chunks_exact(8 + PAGE) {
                    let p = u64::from_le_bytes(rec[..8].try_into().unwrap_or_default());
                    pages
                        .write_all_at(&rec[8..], at(p)?)
                        .map_err(write(&pages_path))?;
                }
            }
            Kind::Drop => {
                for rec in buf.chunks_exact(8) {
                    let p = u64::from_le_bytes(rec.try_into().unwrap_or_default());
                    pages
                        .write_all_at(&zero, at(p)?)
                        .map_err(write(&pages_path))?;
                }
            }
            Kind::Remote => remote.write_all(&buf).map_err(write(&remote_path))?,
            Kind::Key => {
                let bytes: [u8; 32] = buf.as_slice().try_into().map_err(|_| {
                    MigrationError::Protocol(format!("a page key of {} bytes", buf.len()))
                })?;
                buf.fill(0);
                PageKey::from_bytes(bytes)
                    .write_file(&dir.join(KEY))
                    .map_err(|e| MigrationError::Key(e.to_string()))?;
            }
            Kind::Finish => {
                let fin: Finish = serde_json::from_slice(&buf)
                    .map_err(|e| MigrationError::Protocol(format!("the last frame: {e}")))?;
                // No fsync: the directory is read back at once and removed (a crash here
                // leaves the VM with its source, which cancels the handover).
                fin.manifest.write(dir)?;
                return Ok((fin.fence, received));
            }
            k => return Err(MigrationError::Protocol(format!("unexpected frame {k:?}"))),
        }
    }
}
