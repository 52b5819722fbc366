//! Page-access traces: the record type, the two file formats and the synthetic generators.
//!
//! A trace is a sequence of `(process key, page number[, time])` records, one per access (in
//! farvm: one per guest touch of a page that may be remote). Times are nanoseconds when the
//! trace carries them; otherwise the record index stands in for time, so timeliness is then
//! measured in accesses.
//!
//! Formats (both read by [`read_trace`], which tells them apart by the binary magic):
//! - text ([`text`]): one record per line, `pid page` or `pid page time_ns`, decimal or `0x`
//!   hexadecimal, `#` comments and blank lines ignored;
//! - binary ([`binary`]): the magic `FVMTRACE`, a version byte, a flags byte, then each record
//!   as LEB128 varints: pid, zigzag page delta, and (if timed) zigzag time delta — about two
//!   bytes per record on a scan.
//!
//! The codecs work over `std::io::Read`/`Write`; opening files is the caller's business.

pub mod binary;
pub mod gen;
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
}

/// A whole trace in memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// The accesses in order.
    pub records: Vec<Record>,
    /// `true` if `time` is in nanoseconds, `false` if it is the record index.
    pub timed: bool,
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
            })
            .collect();
        Self {
            records,
            timed: false,
        }
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
}

/// Reads a whole trace in either format (binary if it starts with the magic).
pub fn read_trace<R: Read>(reader: R) -> Result<Trace, TraceError> {
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
    if n == head.len() && head == *binary::MAGIC {
        binary::read_body(reader)
    } else {
        text::read(std::io::Cursor::new(head[..n].to_vec()).chain(reader))
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
                time: 0
            }]
        );
    }
}
