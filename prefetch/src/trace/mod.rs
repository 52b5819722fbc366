//! Page-access traces: the record type, the two file formats and the synthetic generators.
//!
//! A trace is a sequence of `(process key, page number[, time][, kind])` records, one per access
//! (in farvm: one per guest touch of a page that may be remote). Times are nanoseconds when the
//! trace carries them; otherwise the record index stands in for time, so timeliness is then
//! measured in accesses. The access kind (read or write) is optional too: traces converted from
//! real programs ([`lackey`]) keep it, synthetic ones have none (every record reads).
//!
//! Formats (all read by [`read_trace`], which tells them apart by their magic):
//! - text ([`text`]): one record per line, `pid page [time_ns] [r|w]`, decimal or `0x`
//!   hexadecimal, `#` comments and blank lines ignored;
//! - binary ([`binary`]): the magic `FVMTRACE`, a version byte, a flags byte, then each record
//!   as LEB128 varints: pid (with the kind in its low bit in version 2), zigzag page delta, and
//!   (if timed) zigzag time delta — about two bytes per record on a scan;
//! - either of them compressed with zstd (`.zst`, detected by the zstd frame magic).
//!
//! The codecs work over `std::io::Read`/`Write`; opening files is the caller's business.

pub mod binary;
pub mod gen;
pub mod lackey;
pub mod mix;
pub mod rng;
pub mod text;

use std::io::{BufReader, Read};

use crate::{Nanos, PageNo, ProcessKey};

/// One access.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// The process that made the access.
    pub key: ProcessKey,
    /// The page accessed.
    pub page: PageNo,
    /// Nanoseconds if the trace is timed, else the record index.
    pub time: Nanos,
    /// The access wrote the page (always `false` in a trace without kinds).
    pub write: bool,
}

/// A whole trace in memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// The accesses in order.
    pub records: Vec<Record>,
    /// `true` if `time` is in nanoseconds, `false` if it is the record index.
    pub timed: bool,
    /// `true` if records say whether they read or wrote (`Record::write`).
    pub kinds: bool,
}

impl Trace {
    /// An untimed trace from `(key, page)` pairs.
    pub fn from_pairs(pairs: impl IntoIterator<Item = (ProcessKey, PageNo)>) -> Self {
        let records = pairs
            .into_iter()
            .enumerate()
            .map(|(i, (key, page))| Record {
                key,
                page,
                time: i as u64,
                write: false,
            })
            .collect();
        Self {
            records,
            timed: false,
            kinds: false,
        }
    }

    /// Distinct `(process key, page)` pairs: the memory the trace needs to run without a miss
    /// after its first touches.
    pub fn footprint(&self) -> usize {
        let mut pairs: Vec<(ProcessKey, PageNo)> =
            self.records.iter().map(|r| (r.key, r.page)).collect();
        pairs.sort_unstable();
        pairs.dedup();
        pairs.len()
    }
}

/// On-disk trace format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// One `pid page [time_ns]` line per record.
    Text,
    /// The `FVMTRACE` varint format (about two bytes per record on a scan).
    Binary,
}

/// Why a trace could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("trace I/O error: {0}")]
    /// Reading or writing the file failed.
    Io(#[from] std::io::Error),
    #[error("line {line}: {msg}")]
    /// A text trace line that does not parse.
    Text {
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        msg: String,
    },
    #[error("binary trace, record {record} (byte {offset}): {msg}")]
    /// A binary trace record that does not decode.
    Binary {
        /// Index of the record.
        record: u64,
        /// Byte offset in the file.
        offset: u64,
        /// What is wrong.
        msg: String,
    },
    /// A zstd-compressed trace could not be decompressed.
    #[error("zstd-compressed trace: {0}")]
    Zstd(String),
}

/// The first bytes of a zstd frame.
pub const ZSTD_MAGIC: &[u8; 4] = &[0x28, 0xb5, 0x2f, 0xfd];

/// Reads a whole trace in any format: binary if it starts with the binary magic, text otherwise,
/// either one possibly inside a zstd stream.
pub fn read_trace<R: Read>(mut reader: R) -> Result<Trace, TraceError> {
    read_maybe_compressed(&mut reader, true)
}

fn read_maybe_compressed(reader: &mut dyn Read, may_be_zstd: bool) -> Result<Trace, TraceError> {
    let mut reader = BufReader::with_capacity(1 << 16, reader);
    let mut head = [0u8; binary::MAGIC.len()];
    let mut n = 0;
    while n < head.len() {
        match reader.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let head_reader = std::io::Cursor::new(head[..n].to_vec()).chain(reader);
    if may_be_zstd && n >= ZSTD_MAGIC.len() && head[..ZSTD_MAGIC.len()] == *ZSTD_MAGIC {
        let mut decoder = ruzstd::decoding::StreamingDecoder::new(head_reader)
            .map_err(|e| TraceError::Zstd(e.to_string()))?;
        // A compressed trace holds one uncompressed trace (never a second layer).
        return read_maybe_compressed(&mut decoder, false).map_err(|e| match e {
            TraceError::Io(io) => TraceError::Zstd(io.to_string()),
            other => other,
        });
    }
    let mut reader = head_reader;
    if n == head.len() && head == *binary::MAGIC {
        let mut skip = [0u8; binary::MAGIC.len()];
        reader.read_exact(&mut skip)?;
        binary::read_body(reader)
    } else {
        text::read(reader)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(timed: bool) -> Trace {
        let mut t = Trace::from_pairs([(1, 5), (1, 6), (2, u64::MAX), (1, 0), (7, 3)]);
        if timed {
            for (i, r) in t.records.iter_mut().enumerate() {
                r.time = 1_000 * (5 - i as u64);
            }
            t.timed = true;
        }
        t
    }

    #[test]
    fn both_formats_round_trip_and_are_detected() {
        for timed in [false, true] {
            let t = sample(timed);
            let mut txt = Vec::new();
            text::write(&mut txt, &t).unwrap();
            assert_eq!(read_trace(&txt[..]).unwrap(), t);
            let mut bin = Vec::new();
            binary::write(&mut bin, &t).unwrap();
            assert_eq!(read_trace(&bin[..]).unwrap(), t);
        }
    }

    #[test]
    fn zstd_compressed_traces_are_detected() {
        // `printf '1 5 w\n2 7 r\n' | zstd -c | xxd -i`
        let text_zst: &[u8] = &[
            0x28, 0xb5, 0x2f, 0xfd, 0x04, 0x58, 0x61, 0x00, 0x00, 0x31, 0x20, 0x35, 0x20, 0x77,
            0x0a, 0x32, 0x20, 0x37, 0x20, 0x72, 0x0a, 0x12, 0xb1, 0x4b, 0x4c,
        ];
        let t = read_trace(text_zst).unwrap();
        assert!(t.kinds);
        assert_eq!(
            t.records
                .iter()
                .map(|r| (r.key, r.page, r.write))
                .collect::<Vec<_>>(),
            [(1, 5, true), (2, 7, false)]
        );
        let mut cut = text_zst.to_vec();
        cut.truncate(12);
        assert!(matches!(read_trace(&cut[..]), Err(TraceError::Zstd(_))));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = rng::SplitMix64::new(99);
        for round in 0..2_000 {
            let len = rng.below(64) as usize;
            let mut bytes: Vec<u8> = if round % 2 == 0 {
                binary::MAGIC.to_vec()
            } else {
                Vec::new()
            };
            if round % 4 == 0 {
                bytes.extend_from_slice(&[binary::VERSION, (round % 3) as u8]);
            }
            bytes.extend((0..len).map(|_| rng.next_u64() as u8));
            let _ = read_trace(&bytes[..]);
            // Text-ish input: digits, separators, newlines and junk.
            let alphabet = b"0123456789 x#\n,\t-";
            let text: Vec<u8> = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
                .collect();
            let _ = read_trace(&text[..]);
            let mut zst = ZSTD_MAGIC.to_vec();
            zst.extend((0..len).map(|_| rng.next_u64() as u8));
            let _ = read_trace(&zst[..]);
        }
    }

    #[test]
    fn empty_and_tiny_inputs() {
        assert_eq!(read_trace(&b""[..]).unwrap().records.len(), 0);
        assert_eq!(
            read_trace(&b"1 2"[..]).unwrap().records,
            [Record {
                key: 1,
                page: 2,
                time: 0,
                write: false
            }]
        );
    }
}
