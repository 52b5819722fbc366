//! virtio-blk backed by a raw image file (or a host block device): read, write, flush and
//! get-id on one request queue, optionally read-only. The image is locked with `flock` (shared
//! when read-only, exclusive otherwise) so two VMs cannot write the same disk.
//!
//! Requests are framed as the spec requires, without assumptions about how the driver split
//! them into descriptors (virtio 1.2, 2.7.4): the device-readable bytes are the 16-byte header
//! followed by write data, the device-writable bytes are read data followed by the status
//! byte. Data moves through a fixed 64 KiB bounce buffer, so the guest cannot make the VMM
//! allocate. Any malformed request, a sector out of range or a buffer outside guest memory is
//! answered with `VIRTIO_BLK_S_IOERR`; an unknown request type with `VIRTIO_BLK_S_UNSUPP`.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO, VIRTIO_BLK_F_SEG_MAX,
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_queue::DescriptorChain;
use vm_memory::bitmap::Bitmap;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

use super::{
    VirtioDevice, VIRTIO_F_VERSION_1, VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};

/// Bytes per virtio-blk sector (fixed by the spec, whatever the image's block size).
pub const SECTOR_SIZE: u64 = 512;
/// Size of the request queue.
pub const QUEUE_SIZE: u16 = 256;
/// Data segments per request the driver may use (`seg_max`).
pub const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// Descriptors per request accepted (indirect tables can be longer than the queue).
const MAX_DESCRIPTORS: usize = 1024;
/// Largest piece of data moved per host read or write.
const CHUNK: usize = 64 * 1024;
/// `struct virtio_blk_outhdr`: type (u32), reserved (u32), sector (u64).
const HEADER_LEN: usize = 16;
const ID_BYTES: usize = VIRTIO_BLK_ID_BYTES as usize;

/// Configuration space: `struct virtio_blk_config` up to `blk_size` (the fields offered).
const CONFIG_CAPACITY: usize = 0;
const CONFIG_SEG_MAX: usize = 12;
const CONFIG_BLK_SIZE: usize = 20;
const CONFIG_LEN: usize = 24;

/// What disk to attach.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockConfig {
    /// A raw image file or a host block device.
    pub path: PathBuf,
    /// Refuse guest writes and offer `VIRTIO_BLK_F_RO`.
    pub read_only: bool,
    /// The serial the guest reads with GET_ID (at most 20 bytes); by default derived from the
    /// image's device and inode numbers.
    pub serial: Option<String>,
}

/// Why a disk could not be attached.
#[derive(Debug, thiserror::Error)]
pub enum BlockError {
    /// The image cannot be opened.
    #[error("cannot open disk image {}: {source}", path.display())]
    Open {
        /// The image.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Not a regular file or block device.
    #[error("disk image {} is neither a regular file nor a block device", path.display())]
    NotADisk {
        /// The image.
        path: PathBuf,
    },
    /// Another process holds a lock on the image.
    #[error("disk image {} is in use: another process holds a lock on it", path.display())]
    Locked {
        /// The image.
        path: PathBuf,
    },
    /// Smaller than one sector.
    #[error("disk image {} is {len} bytes, smaller than one 512-byte sector", path.display())]
    TooSmall {
        /// The image.
        path: PathBuf,
        /// Its size in bytes.
        len: u64,
    },
    /// The image is in a format farvm does not read (farvm's disks are raw).
    #[error(
        "disk image {} is a {format} image, but farvm reads raw images only (convert it with \
         `qemu-img convert -O raw IN OUT`)",
        path.display()
    )]
    NotRaw {
        /// The image.
        path: PathBuf,
        /// The format its header names.
        format: &'static str,
    },
    /// The serial does not fit the device's ID field.
    #[error("disk serial {serial:?} is longer than {ID_BYTES} bytes")]
    SerialTooLong {
        /// The serial given.
        serial: String,
    },
}

/// Request counters (for tests and metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockStats {
    /// Read requests served.
    pub reads: u64,
    /// Write requests served.
    pub writes: u64,
    /// Flush requests served.
    pub flushes: u64,
    /// Bytes read from the image.
    pub bytes_read: u64,
    /// Bytes written to the image.
    pub bytes_written: u64,
    /// Requests answered with IOERR or UNSUPP, or that had no status byte.
    pub errors: u64,
}

/// A contiguous guest buffer of a request.
#[derive(Clone, Copy, Debug)]
struct Seg {
    addr: GuestAddress,
    len: u64,
}

#[derive(Debug)]
enum ReqError {
    Unsupported,
    Io,
}

/// The virtio-blk device model.
pub struct Block {
    file: File,
    path: PathBuf,
    read_only: bool,
    capacity_sectors: u64,
    id: [u8; ID_BYTES],
    config: [u8; CONFIG_LEN],
    acked_features: u64,
    stats: BlockStats,
    readable: Vec<Seg>,
    writable: Vec<Seg>,
    bounce: Vec<u8>,
    /// The request's data buffers as host pieces (address, length), for one `preadv` or
    /// `pwritev` per [`IOV_BATCH`] pieces instead of a syscall and a copy per piece.
    pieces: Vec<(usize, usize)>,
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block")
            .field("path", &self.path)
            .field("read_only", &self.read_only)
            .field("capacity_sectors", &self.capacity_sectors)
            .finish()
    }
}

fn lock_image(file: &File, path: &Path, read_only: bool) -> Result<(), BlockError> {
    let op = if read_only {
        libc::LOCK_SH
    } else {
        libc::LOCK_EX
    } | libc::LOCK_NB;
    // SAFETY: flock(2) on a file descriptor this function borrows for the call; no memory is
    // passed to the kernel.
    let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
    if rc == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Err(BlockError::Locked {
            path: path.to_owned(),
        })
    } else {
        Err(BlockError::Open {
            path: path.to_owned(),
            source: err,
        })
    }
}

/// The container format whose magic `head` (an image's first bytes) starts with, if any.
fn image_format(head: &[u8; 8]) -> Option<&'static str> {
    match head {
        [b'Q', b'F', b'I', 0xfb, ..] => Some("qcow2"),
        [b'Q', b'E', b'D', 0, ..] => Some("qed"),
        [b'K', b'D', b'M', b'V', ..] => Some("vmdk"),
        b"vhdxfile" => Some("vhdx"),
        b"conectix" => Some("vpc"),
        _ => None,
    }
}

impl Block {
    /// Opens and locks the image.
    pub fn open(cfg: &BlockConfig) -> Result<Self, BlockError> {
        let path = cfg.path.clone();
        let open_err = |source| BlockError::Open {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .read(true)
            .write(!cfg.read_only)
            .open(&path)
            .map_err(open_err)?;
        let meta = file.metadata().map_err(open_err)?;
        if !(meta.is_file() || meta.file_type().is_block_device()) {
            return Err(BlockError::NotADisk { path });
        }
        lock_image(&file, &path, cfg.read_only)?;
        let len = file.seek(SeekFrom::End(0)).map_err(open_err)?;
        if len < SECTOR_SIZE {
            return Err(BlockError::TooSmall { path, len });
        }
        // The guest would read an image file's own headers as its disk: libvirt's driver sends
        // a path without its format, so the header decides.
        let mut head = [0u8; 8];
        file.read_exact_at(&mut head, 0).map_err(open_err)?;
        if let Some(format) = image_format(&head) {
            return Err(BlockError::NotRaw { path, format });
        }
        let serial = match &cfg.serial {
            Some(s) if s.len() > ID_BYTES => {
                return Err(BlockError::SerialTooLong { serial: s.clone() })
            }
            Some(s) => s.clone(),
            None => format!("{:x}-{:x}", meta.dev(), meta.ino()),
        };
        let mut id = [0u8; ID_BYTES];
        let n = serial.len().min(ID_BYTES);
        id[..n].copy_from_slice(&serial.as_bytes()[..n]);

        // A tail shorter than a sector is not addressable.
        let capacity_sectors = len / SECTOR_SIZE;
        let mut config = [0u8; CONFIG_LEN];
        config[CONFIG_CAPACITY..CONFIG_CAPACITY + 8]
            .copy_from_slice(&capacity_sectors.to_le_bytes());
        config[CONFIG_SEG_MAX..CONFIG_SEG_MAX + 4].copy_from_slice(&SEG_MAX.to_le_bytes());
        config[CONFIG_BLK_SIZE..CONFIG_BLK_SIZE + 4]
            .copy_from_slice(&(SECTOR_SIZE as u32).to_le_bytes());
        Ok(Block {
            file,
            path,
            read_only: cfg.read_only,
            capacity_sectors,
            id,
            config,
            acked_features: 0,
            stats: BlockStats::default(),
            readable: Vec::with_capacity(QUEUE_SIZE as usize),
            writable: Vec::with_capacity(QUEUE_SIZE as usize),
            bounce: vec![0; CHUNK],
            pieces: Vec::with_capacity(2 * QUEUE_SIZE as usize),
        })
    }

    /// Size in 512-byte sectors.
    pub fn capacity_sectors(&self) -> u64 {
        self.capacity_sectors
    }

    /// Whether guest writes are refused.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// The features the driver accepted at activation.
    pub fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// Request counters so far.
    pub fn stats(&self) -> BlockStats {
        self.stats
    }

    /// Checks `len` bytes at `sector` lie inside the image; returns the byte offset.
    fn byte_range(&self, sector: u64, len: u64) -> Result<u64, ReqError> {
        if !len.is_multiple_of(SECTOR_SIZE) {
            return Err(ReqError::Io);
        }
        let start = sector.checked_mul(SECTOR_SIZE).ok_or(ReqError::Io)?;
        let end = start.checked_add(len).ok_or(ReqError::Io)?;
        if end > self.capacity_sectors * SECTOR_SIZE {
            return Err(ReqError::Io);
        }
        Ok(start)
    }

    /// Serves the request whose buffers are in `self.readable` / `self.writable` (status byte
    /// already split off); returns the bytes written to the guest.
    fn execute<M: GuestMemory>(&mut self, mem: &M) -> (Result<(), ReqError>, u32) {
        let mut header = [0u8; HEADER_LEN];
        let mut got = 0;
        let r = for_each_piece(&self.readable, 0, HEADER_LEN as u64, |addr, n| {
            mem.read_slice(&mut header[got..got + n], addr)
                .map_err(|_| ReqError::Io)?;
            got += n;
            Ok(())
        });
        if r.is_err() || got < HEADER_LEN {
            return (Err(ReqError::Io), 0);
        }
        let req_type = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let mut sector = [0u8; 8];
        sector.copy_from_slice(&header[8..16]);
        let sector = u64::from_le_bytes(sector);
        match req_type {
            VIRTIO_BLK_T_IN => self.read_sectors(mem, sector),
            VIRTIO_BLK_T_OUT => (self.write_sectors(mem, sector), 0),
            VIRTIO_BLK_T_FLUSH => (self.flush(), 0),
            VIRTIO_BLK_T_GET_ID => self.get_id(mem),
            _ => (Err(ReqError::Unsupported), 0),
        }
    }

    fn read_sectors<M: GuestMemory>(
        &mut self,
        mem: &M,
        sector: u64,
    ) -> (Result<(), ReqError>, u32) {
        let len = total_len(&self.writable);
        let mut pos = match self.byte_range(sector, len) {
            Ok(p) => p,
            Err(e) => return (Err(e), 0),
        };
        if host_pieces(
            mem,
            &self.writable,
            0,
            len,
            Direction::Read,
            &mut self.pieces,
        ) {
            let r = vectored_io(&self.file, &self.pieces, pos, Direction::Read)
                .map_err(|_| ReqError::Io);
            self.stats.reads += 1;
            let read = if r.is_ok() { len } else { 0 };
            self.stats.bytes_read += read;
            return (r, read as u32);
        }
        let Block {
            file,
            bounce,
            writable,
            ..
        } = self;
        let mut written = 0u32;
        let r = for_each_piece(writable, 0, len, |addr, n| {
            let buf = &mut bounce[..n];
            file.read_exact_at(buf, pos).map_err(|_| ReqError::Io)?;
            mem.write_slice(buf, addr).map_err(|_| ReqError::Io)?;
            pos += n as u64;
            written += n as u32;
            Ok(())
        });
        self.stats.reads += 1;
        self.stats.bytes_read += u64::from(written);
        (r, written)
    }

    fn write_sectors<M: GuestMemory>(&mut self, mem: &M, sector: u64) -> Result<(), ReqError> {
        if self.read_only {
            return Err(ReqError::Io);
        }
        let len = total_len(&self.readable) - HEADER_LEN as u64;
        let mut pos = self.byte_range(sector, len)?;
        if host_pieces(
            mem,
            &self.readable,
            HEADER_LEN as u64,
            len,
            Direction::Write,
            &mut self.pieces,
        ) {
            self.stats.writes += 1;
            vectored_io(&self.file, &self.pieces, pos, Direction::Write)
                .map_err(|_| ReqError::Io)?;
            self.stats.bytes_written += len;
            return Ok(());
        }
        let Block {
            file,
            bounce,
            readable,
            stats,
            ..
        } = self;
        stats.writes += 1;
        for_each_piece(readable, HEADER_LEN as u64, len, |addr, n| {
            let buf = &mut bounce[..n];
            mem.read_slice(buf, addr).map_err(|_| ReqError::Io)?;
            file.write_all_at(buf, pos).map_err(|_| ReqError::Io)?;
            pos += n as u64;
            stats.bytes_written += n as u64;
            Ok(())
        })
    }

    fn flush(&mut self) -> Result<(), ReqError> {
        self.stats.flushes += 1;
        if self.read_only {
            return Ok(());
        }
        self.file.sync_data().map_err(|e| {
            tracing::warn!("virtio-blk: flushing {}: {e}", self.path.display());
            ReqError::Io
        })
    }

    fn get_id<M: GuestMemory>(&mut self, mem: &M) -> (Result<(), ReqError>, u32) {
        let n = total_len(&self.writable).min(ID_BYTES as u64);
        let mut done = 0usize;
        let id = self.id;
        let r = for_each_piece(&self.writable, 0, n, |addr, len| {
            mem.write_slice(&id[done..done + len], addr)
                .map_err(|_| ReqError::Io)?;
            done += len;
            Ok(())
        });
        (r, done as u32)
    }
}

/// Pieces one `preadv`/`pwritev` names at most (well under Linux's IOV_MAX of 1024; a longer
/// request takes several calls).
const IOV_BATCH: usize = 64;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Read,
    Write,
}

/// Fills `pieces` with the host addresses of the bytes `skip..skip + limit` of the buffers
/// `segs` form, which the device is about to `dir` (a read fills guest memory: its pages are
/// marked dirty); false (and the caller copies through the bounce buffer) when some of them
/// are not plain guest memory.
fn host_pieces<M: GuestMemory>(
    mem: &M,
    segs: &[Seg],
    skip: u64,
    limit: u64,
    dir: Direction,
    pieces: &mut Vec<(usize, usize)>,
) -> bool {
    let access = match dir {
        Direction::Read => Permissions::Write,
        Direction::Write => Permissions::Read,
    };
    pieces.clear();
    for_each_piece(segs, skip, limit, |addr, n| {
        for slice in mem.get_slices(addr, n, access).map_err(|_| ReqError::Io)? {
            let slice = slice.map_err(|_| ReqError::Io)?;
            if dir == Direction::Read {
                slice.bitmap().mark_dirty(0, slice.len());
            }
            pieces.push((slice.ptr_guard_mut().as_ptr() as usize, slice.len()));
        }
        Ok(())
    })
    .is_ok()
}

/// Reads (or writes) the file at `pos` into (from) `pieces` of guest memory, `IOV_BATCH` pieces
/// a call, resuming after short transfers.
fn vectored_io(
    file: &File,
    pieces: &[(usize, usize)],
    mut pos: u64,
    dir: Direction,
) -> io::Result<()> {
    let empty = libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    };
    for batch in pieces.chunks(IOV_BATCH) {
        let mut iov = [empty; IOV_BATCH];
        for (v, &(addr, len)) in iov.iter_mut().zip(batch) {
            *v = libc::iovec {
                iov_base: addr as *mut libc::c_void,
                iov_len: len,
            };
        }
        let mut first = 0;
        while first < batch.len() {
            let off = libc::off_t::try_from(pos)
                .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            let rest = &iov[first..batch.len()];
            // SAFETY: every iovec names a stretch of guest memory that `host_pieces` got from
            // the VM's memory map, which stays mapped while `mem` is borrowed (for this call);
            // the kernel reads or writes only those bytes. The guest may touch the same
            // buffers meanwhile: that is its own race, as on real hardware.
            let n = unsafe {
                match dir {
                    Direction::Read => {
                        libc::preadv(file.as_raw_fd(), rest.as_ptr(), rest.len() as i32, off)
                    }
                    Direction::Write => {
                        libc::pwritev(file.as_raw_fd(), rest.as_ptr(), rest.len() as i32, off)
                    }
                }
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let mut done = n as usize;
            pos += done as u64;
            while first < batch.len() && done >= iov[first].iov_len {
                done -= iov[first].iov_len;
                first += 1;
            }
            if done > 0 {
                let v = &mut iov[first];
                v.iov_base = (v.iov_base as usize + done) as *mut libc::c_void;
                v.iov_len -= done;
            }
        }
    }
    Ok(())
}

fn total_len(segs: &[Seg]) -> u64 {
    segs.iter().map(|s| s.len).sum()
}

/// Calls `f(addr, n)` for consecutive pieces of the byte stream the buffers `segs` form,
/// starting `skip` bytes in and covering at most `limit` bytes, each piece at most `CHUNK`.
fn for_each_piece(
    segs: &[Seg],
    mut skip: u64,
    mut limit: u64,
    mut f: impl FnMut(GuestAddress, usize) -> Result<(), ReqError>,
) -> Result<(), ReqError> {
    for s in segs {
        if limit == 0 {
            break;
        }
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        let mut off = skip;
        skip = 0;
        while off < s.len && limit > 0 {
            let n = (s.len - off).min(CHUNK as u64).min(limit);
            let addr = s.addr.checked_add(off).ok_or(ReqError::Io)?;
            f(addr, n as usize)?;
            off += n;
            limit -= n;
        }
    }
    Ok(())
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn features(&self) -> u64 {
        let mut f = VIRTIO_F_VERSION_1
            | VIRTIO_RING_F_EVENT_IDX
            | VIRTIO_RING_F_INDIRECT_DESC
            | 1 << VIRTIO_BLK_F_FLUSH
            | 1 << VIRTIO_BLK_F_SEG_MAX
            | 1 << VIRTIO_BLK_F_BLK_SIZE;
        if self.read_only {
            f |= 1 << VIRTIO_BLK_F_RO;
        }
        f
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        for (i, d) in data.iter_mut().enumerate() {
            *d = offset
                .checked_add(i as u64)
                .and_then(|o| usize::try_from(o).ok())
                .and_then(|o| self.config.get(o).copied())
                .unwrap_or(0);
        }
    }

    fn write_config(&mut self, offset: u64, _data: &[u8]) {
        tracing::debug!("virtio-blk: config write at {offset:#x} ignored (no writable fields)");
    }

    fn activate(&mut self, acked_features: u64) {
        self.acked_features = acked_features;
    }

    fn reset(&mut self) {
        self.acked_features = 0;
    }

    fn process_chain<M: GuestMemory>(&mut self, _queue: usize, chain: DescriptorChain<&M>) -> u32 {
        let mem = chain.memory();
        self.readable.clear();
        self.writable.clear();
        let mut last_writable: Option<Seg> = None;
        let mut malformed = false;
        for desc in chain.clone() {
            let seg = Seg {
                addr: desc.addr(),
                len: u64::from(desc.len()),
            };
            let list = if desc.is_write_only() {
                last_writable = Some(seg);
                &mut self.writable
            } else {
                // Device-readable buffers must all come first (2.7.4.2).
                malformed |= !self.writable.is_empty();
                &mut self.readable
            };
            if list.len() < MAX_DESCRIPTORS {
                list.push(seg);
            } else {
                malformed = true;
            }
        }
        // The status byte is the last byte of the last device-writable buffer.
        let status_addr = match last_writable
            .filter(|s| s.len > 0)
            .and_then(|s| s.addr.checked_add(s.len - 1))
        {
            Some(a) => a,
            None => {
                tracing::debug!("virtio-blk: request without a status byte");
                self.stats.errors += 1;
                return 0;
            }
        };
        if let Some(last) = self.writable.last_mut() {
            last.len = last.len.saturating_sub(1);
        }
        let (result, written) = if malformed {
            (Err(ReqError::Io), 0)
        } else {
            self.execute(mem)
        };
        let status = match result {
            Ok(()) => VIRTIO_BLK_S_OK,
            Err(ReqError::Io) => VIRTIO_BLK_S_IOERR,
            Err(ReqError::Unsupported) => VIRTIO_BLK_S_UNSUPP,
        } as u8;
        if status != VIRTIO_BLK_S_OK as u8 {
            self.stats.errors += 1;
        }
        match mem.write_obj(status, status_addr) {
            Ok(()) => written + 1,
            Err(_) => {
                tracing::debug!(
                    "virtio-blk: status byte at {:#x} outside guest memory",
                    status_addr.raw_value()
                );
                0
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectored_io_moves_every_piece_across_several_batches() {
        // 150 pieces of uneven sizes (more than two batches), scattered in one buffer.
        let sizes: Vec<usize> = (0..150).map(|i| 512 + (i * 37) % 700).collect();
        let total: usize = sizes.iter().sum();
        let content: Vec<u8> = (0..total + 4096).map(|i| (i * 7 % 251) as u8).collect();
        let file = tempfile::tempfile().unwrap();
        file.write_all_at(&content, 0).unwrap();

        let mut buf = vec![0u8; 2 * total];
        let base = buf.as_mut_ptr() as usize;
        let mut pieces = Vec::new();
        let mut at = 0;
        for &n in &sizes {
            pieces.push((base + at, n));
            at += n + 3; // gaps between the pieces
        }
        vectored_io(&file, &pieces, 4096, Direction::Read).unwrap();
        let mut at = 0;
        let mut off = 4096;
        for &n in &sizes {
            assert_eq!(&buf[at..at + n], &content[off..off + n]);
            at += n + 3;
            off += n;
        }

        // And back out, elsewhere in the file.
        vectored_io(&file, &pieces, 0, Direction::Write).unwrap();
        let mut back = vec![0u8; total];
        file.read_exact_at(&mut back, 0).unwrap();
        assert_eq!(back, content[4096..4096 + total]);

        // Reading past the end of the file is an error, not a hang or a short success.
        let len = content.len() as u64;
        assert!(vectored_io(&file, &pieces, len - 100, Direction::Read).is_err());
    }
}
