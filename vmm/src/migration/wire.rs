//! The migration stream on a TCP connection: a clear greeting (magic, version and, from the
//! source, the session salt), then frames sealed with the hosts' shared migration key
//! (`farvm_seal`'s stream: encrypted, authenticated, in order, one subkey per direction),
//! each a little-endian u32 length and the sealed bytes; a frame's plaintext is a kind byte
//! and its payload.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use farvm_seal::{
    stream_salt, Direction, PageKey, StreamOpener, StreamSealer, STREAM_OVERHEAD, STREAM_SALT_LEN,
};

use super::{io, MigrationError};

const MAGIC: &[u8; 8] = b"FARVMMIG";
/// The stream's version: both ends must speak the same.
const VERSION: u32 = 1;
/// The largest frame either end accepts (a batch of pages with their numbers, or a
/// manifest).
pub(crate) const MAX_FRAME: usize = 64 << 20;

/// What a frame carries (its first plaintext byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// Source → destination, first: the VM's description and RAM layout (JSON).
    Start = 1,
    /// Resident pages: records of page number (u64) and 4096 bytes.
    Pages = 2,
    /// Pages the destination holds that are zero or remote now (u64 page numbers).
    Drop = 3,
    /// Remote pages: the snapshot's `remote.pages` records (page u64, fingerprint u128).
    Remote = 4,
    /// The page key that sealed the remote pages (32 bytes).
    Key = 5,
    /// The manifest and the handover fence (JSON), last.
    Finish = 6,
    /// Destination → source: the outcome (JSON).
    Outcome = 7,
    /// Destination → source, first: empty; that it opens proves the two hosts share the key
    /// before anything is sent.
    Ready = 8,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Kind::Start,
            2 => Kind::Pages,
            3 => Kind::Drop,
            4 => Kind::Remote,
            5 => Kind::Key,
            6 => Kind::Finish,
            7 => Kind::Outcome,
            8 => Kind::Ready,
            _ => return None,
        })
    }
}

/// One end of a migration stream.
pub(crate) struct Channel {
    stream: TcpStream,
    sealer: StreamSealer,
    opener: StreamOpener,
    /// Bytes written to the socket so far.
    pub sent: u64,
}

impl Channel {
    /// The source's end: greets with a fresh salt and waits for the destination's greeting.
    pub fn open(mut stream: TcpStream, key: &PageKey) -> Result<Self, MigrationError> {
        let salt = stream_salt().map_err(|e| MigrationError::Key(e.to_string()))?;
        let mut hello = Vec::with_capacity(12 + STREAM_SALT_LEN);
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&VERSION.to_le_bytes());
        hello.extend_from_slice(&salt);
        stream
            .write_all(&hello)
            .map_err(io("greeting the destination"))?;
        read_greeting(&mut stream, "the destination's greeting")?;
        let mut ch = Self::keyed(stream, key, &salt, Direction::Forward);
        ch.read_timeout(Some(Duration::from_secs(30)))?;
        match ch.recv(&mut Vec::new())? {
            Kind::Ready => Ok(ch),
            k => Err(MigrationError::Protocol(format!(
                "the destination began with {k:?}"
            ))),
        }
    }

    /// The destination's end: reads the source's greeting and salt, greets back.
    pub fn accept(mut stream: TcpStream, key: &PageKey) -> Result<Self, MigrationError> {
        read_greeting(&mut stream, "the source's greeting")?;
        let mut salt = [0u8; STREAM_SALT_LEN];
        stream
            .read_exact(&mut salt)
            .map_err(io("the source's greeting"))?;
        let mut hello = Vec::with_capacity(12);
        hello.extend_from_slice(MAGIC);
        hello.extend_from_slice(&VERSION.to_le_bytes());
        stream
            .write_all(&hello)
            .map_err(io("greeting the source"))?;
        let mut ch = Self::keyed(stream, key, &salt, Direction::Back);
        ch.send(Kind::Ready, &mut Vec::new())?;
        Ok(ch)
    }

    fn keyed(
        stream: TcpStream,
        key: &PageKey,
        salt: &[u8; STREAM_SALT_LEN],
        mine: Direction,
    ) -> Self {
        let theirs = match mine {
            Direction::Forward => Direction::Back,
            Direction::Back => Direction::Forward,
        };
        Self {
            stream,
            sealer: StreamSealer::new(key, salt, mine),
            opener: StreamOpener::new(key, salt, theirs),
            sent: 0,
        }
    }

    /// Sets how long a read may wait (None: forever).
    pub fn read_timeout(&self, t: Option<Duration>) -> Result<(), MigrationError> {
        self.stream
            .set_read_timeout(t)
            .map_err(io("setting the stream's timeout"))
    }

    /// Seals and sends a frame of `kind` whose payload is `payload` (taken, to seal in
    /// place: it comes back empty with its capacity).
    pub fn send(&mut self, kind: Kind, payload: &mut Vec<u8>) -> Result<(), MigrationError> {
        payload.insert(0, kind as u8);
        self.sealer.seal(payload);
        let len = (payload.len() as u32).to_le_bytes();
        self.stream
            .write_all(&len)
            .and_then(|()| self.stream.write_all(payload))
            .map_err(io("sending to the other host"))?;
        self.sent += 4 + payload.len() as u64;
        payload.clear();
        Ok(())
    }

    /// Receives and opens the next frame into `buf` (its payload); returns its kind.
    pub fn recv(&mut self, buf: &mut Vec<u8>) -> Result<Kind, MigrationError> {
        let mut len = [0u8; 4];
        self.stream
            .read_exact(&mut len)
            .map_err(io("receiving from the other host"))?;
        let len = u32::from_le_bytes(len) as usize;
        if !(STREAM_OVERHEAD + 1..=MAX_FRAME + STREAM_OVERHEAD + 1).contains(&len) {
            return Err(MigrationError::Protocol(format!("a frame of {len} bytes")));
        }
        buf.clear();
        buf.resize(len, 0);
        self.stream
            .read_exact(buf)
            .map_err(io("receiving from the other host"))?;
        self.opener
            .open(buf)
            .map_err(|e| MigrationError::Unauthentic(e.to_string()))?;
        let kind = Kind::from_byte(buf[0])
            .ok_or_else(|| MigrationError::Protocol(format!("frame kind {}", buf[0])))?;
        buf.remove(0);
        Ok(kind)
    }
}

fn read_greeting(stream: &mut TcpStream, what: &'static str) -> Result<(), MigrationError> {
    let mut hello = [0u8; 12];
    stream.read_exact(&mut hello).map_err(io(what))?;
    if &hello[..8] != MAGIC {
        return Err(MigrationError::Protocol(format!(
            "{what} is not a farvm migration stream"
        )));
    }
    let v = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]);
    if v != VERSION {
        return Err(MigrationError::Protocol(format!(
            "{what} speaks version {v}; this farvm speaks {VERSION}"
        )));
    }
    Ok(())
}
