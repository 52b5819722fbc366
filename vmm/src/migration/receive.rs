//! The destination of a live migration (module doc of [`super`]): waits for the source on a
//! TCP address, receives the stream into a snapshot directory (the page file filled as pages
//! arrive, the remote-page list, the manifest; the page key stays in memory, never on disk),
//! and answers the source once
//! the VM it builds from that directory is loaded and owns the namespace
//! ([`Arrival::answer`]). The VM is built while the pre-copy arrives ([`Arriving`]), so the
//! guest's pause holds only its load.

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
use crate::snapshot::remote::{file_offset, REMOTE_PAGES};
use crate::snapshot::Snapshot;

const PAGE: usize = 4096;
/// How long the source may be silent mid-stream.
const IDLE: Duration = Duration::from_secs(60);

/// A destination waiting for its source.
pub struct Incoming {
    listener: TcpListener,
}

/// A migration under way: the source's first frames (the VM's description and key) are in,
/// the pre-copy is arriving. The VM is built from [`Arriving::spec`] and
/// [`Arriving::prepare`] meanwhile; [`Arriving::receive`] takes the rest.
pub struct Arriving {
    dir: PathBuf,
    ch: Channel,
    start: Start,
    /// The page key the pool's pages are sealed under, if they are.
    key: Option<PageKey>,
}

/// A migration received: the snapshot directory it was laid out in, and the stream to
/// answer the source on.
pub struct Arrival {
    dir: PathBuf,
    /// When the source's last frame arrived.
    at: std::time::Instant,
    fence: i64,
    /// The source's wall clock when it read the paused VM's state (ns since the Unix epoch).
    state_read_at_ns: Option<u64>,
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

    /// Waits for the source, under the shared migration `key`, and reads its first frames
    /// into `dir` (created; it must not hold a snapshot).
    pub fn accept(self, dir: &Path, key: &PageKey) -> Result<Arriving, MigrationError> {
        let (stream, from) = self.listener.accept().map_err(io("accepting the source"))?;
        tracing::info!(%from, "migration: the source connected");
        let _ = stream.set_nodelay(true);
        let mut ch = Channel::accept(stream, key)?;
        ch.read_timeout(Some(IDLE))?;
        std::fs::create_dir_all(dir).map_err(io("creating the migration directory"))?;
        let mut buf = Vec::new();
        let start: Start = match ch.recv(&mut buf)? {
            Kind::Start => serde_json::from_slice(&buf)
                .map_err(|e| MigrationError::Protocol(format!("the start frame: {e}")))?,
            k => return Err(MigrationError::Protocol(format!("first frame {k:?}"))),
        };
        let mut page_key = None;
        if start.sealed {
            match ch.recv(&mut buf)? {
                Kind::Key => page_key = Some(read_key(&mut buf)?),
                k => {
                    return Err(MigrationError::Protocol(format!(
                        "expected the page key, got {k:?}"
                    )))
                }
            }
        }
        Ok(Arriving {
            dir: dir.to_path_buf(),
            ch,
            start,
            key: page_key,
        })
    }
}

impl std::os::fd::AsFd for Incoming {
    /// The listening socket: readable once a source connects (a caller may wait on it,
    /// bounded, before [`Incoming::accept`]).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.listener.as_fd()
    }
}

impl Arriving {
    /// The migrating VM's description.
    pub fn spec(&self) -> crate::spec::VmSpec {
        self.start.spec.clone()
    }

    /// Readies the configuration of the VM to build (from [`Arriving::spec`]): its build
    /// writes nothing into guest RAM, and it joins the VM's placement in the pool without
    /// owning it (the takeover comes once it is loaded).
    pub fn prepare(&self, cfg: &mut crate::builder::VmConfig) -> Result<(), MigrationError> {
        cfg.restoring = true;
        let vm = self
            .start
            .pool_vm
            .parse()
            .map_err(|e| MigrationError::Protocol(format!("pool VM id: {e}")))?;
        let remote = cfg
            .remote
            .as_mut()
            .filter(|r| r.pool.is_some())
            .ok_or_else(|| {
                MigrationError::Protocol("the migrating VM's description has no pool".into())
            })?;
        remote.pool_restore = Some(crate::remote::PoolRestore {
            vm,
            key: self.key.clone(),
            key_file: None,
            // Set from the source's last frame (`Snapshot::restore_into`).
            takeover_fence: Some(0),
        });
        Ok(())
    }

    /// Receives the rest of the stream (the pre-copy, the last changes, the state and the
    /// fence) into the directory.
    pub fn receive(mut self) -> Result<Arrival, MigrationError> {
        let (fin, received) = receive_into(&mut self.ch, &self.dir, &self.start)?;
        Ok(Arrival {
            dir: self.dir,
            at: std::time::Instant::now(),
            fence: fin.fence,
            state_read_at_ns: fin.state_read_at_ns,
            ch: self.ch,
            bytes_received: received,
        })
    }

    /// The directory the stream is laid out in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Arrival {
    /// The snapshot to load into the VM: it takes the namespace over on the source's fence.
    pub fn snapshot(&self) -> Result<Snapshot, MigrationError> {
        Ok(Snapshot::open(&self.dir, None)?.arriving(self.fence))
    }

    /// The directory the stream was laid out in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// How long ago the source read the paused VM's state (its wall clock against this
    /// host's): what the guest's clocks move forward by before it runs here. None if the
    /// source did not say, or the two clocks disagree (a negative gap, or over an hour).
    pub fn paused_for(&self) -> Option<std::time::Duration> {
        crate::snapshot::clock::since(self.state_read_at_ns?)
    }

    /// Moves the guest's clocks of `vm`, loaded from `snap` (this arrival's snapshot), forward
    /// by the time it was paused ([`Arrival::paused_for`]); call last before the guest runs.
    /// When the hosts' clocks disagree, says so and leaves them where they stopped.
    pub fn resume_clocks(&self, snap: &Snapshot, vm: &crate::vm::Vm) -> Result<(), MigrationError> {
        match self.paused_for() {
            Some(gap) => Ok(snap.advance_clocks(vm, gap)?),
            None => {
                tracing::warn!(
                    "migration: the source's and this host's wall clocks disagree (or the source \
                     did not say when it paused the VM): the guest's clocks resume where they \
                     stopped"
                );
                Ok(())
            }
        }
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

/// The page key received in `buf` (then wiped): kept in memory only, so the incoming
/// directory never holds it.
fn read_key(buf: &mut [u8]) -> Result<PageKey, MigrationError> {
    let bytes: [u8; 32] = (&*buf)
        .try_into()
        .map_err(|_| MigrationError::Protocol(format!("a page key of {} bytes", buf.len())))?;
    buf.fill(0);
    Ok(PageKey::from_bytes(bytes))
}

/// Receives frames until the source's last; returns it (the manifest written) and the bytes
/// received.
fn receive_into(
    ch: &mut Channel,
    dir: &Path,
    start: &Start,
) -> Result<(Finish, u64), MigrationError> {
    let mut buf = Vec::new();
    let mut received = 0u64;
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
    let pages = crate::snapshot::sealed::create_private(&pages_path)?;
    pages.set_len(start.bytes).map_err(write(&pages_path))?;
    let remote_path = dir.join(REMOTE_PAGES);
    let mut remote = crate::snapshot::sealed::create_private(&remote_path)?;
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
            Kind::Finish => {
                let fin: Finish = serde_json::from_slice(&buf)
                    .map_err(|e| MigrationError::Protocol(format!("the last frame: {e}")))?;
                // No fsync: the directory is read back at once and removed (a crash here
                // leaves the VM with its source, which cancels the handover).
                fin.manifest.write(dir)?;
                return Ok((fin, received));
            }
            k => return Err(MigrationError::Protocol(format!("unexpected frame {k:?}"))),
        }
    }
}
