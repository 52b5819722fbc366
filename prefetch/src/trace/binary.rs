//! The compact binary trace format.
//!
//! Layout: `FVMTRACE` (8 bytes), version `1` (1 byte), flags (1 byte; bit 0 = timed), then per
//! record, as unsigned LEB128 varints: pid; the page delta from the previous record (zigzag);
//! if timed, the time delta from the previous record (zigzag). The first record's deltas are
//! from 0. The file ends after the last complete record; a truncated record is an error.

use std::io::{BufRead, Write};

use super::{Record, Trace, TraceError};

/// The file magic.
pub const MAGIC: &[u8; 8] = b"FVMTRACE";
/// The only version written and read.
pub const VERSION: u8 = 1;
const FLAG_TIMED: u8 = 1;

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn put_varint<W: Write>(w: &mut W, mut v: u64) -> std::io::Result<()> {
    let mut buf = [0u8; 10];
    let mut n = 0;
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            buf[n] = b;
            n += 1;
            break;
        }
        buf[n] = b | 0x80;
        n += 1;
    }
    w.write_all(&buf[..n])
}

/// Streaming writer: header on creation, one record per call.
pub struct Writer<W: Write> {
    w: W,
    timed: bool,
    prev_page: u64,
    prev_time: u64,
}

impl<W: Write> Writer<W> {
    /// Starts a binary trace on `w` (writes the header); `timed` traces carry a time per record.
    pub fn new(mut w: W, timed: bool) -> std::io::Result<Self> {
        w.write_all(MAGIC)?;
        w.write_all(&[VERSION, if timed { FLAG_TIMED } else { 0 }])?;
        Ok(Self {
            w,
            timed,
            prev_page: 0,
            prev_time: 0,
        })
    }

    /// Appends one record (delta- and varint-encoded).
    pub fn write(&mut self, r: &Record) -> std::io::Result<()> {
        put_varint(&mut self.w, r.key)?;
        put_varint(
            &mut self.w,
            zigzag(r.page.wrapping_sub(self.prev_page) as i64),
        )?;
        self.prev_page = r.page;
        if self.timed {
            put_varint(
                &mut self.w,
                zigzag(r.time.wrapping_sub(self.prev_time) as i64),
            )?;
            self.prev_time = r.time;
        }
        Ok(())
    }

    /// Flushes and returns the underlying writer.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.w.flush()?;
        Ok(self.w)
    }
}

/// Writes a whole trace.
pub fn write<W: Write>(w: W, trace: &Trace) -> std::io::Result<()> {
    let mut wr = Writer::new(w, trace.timed)?;
    for r in &trace.records {
        wr.write(r)?;
    }
    wr.finish().map(|_| ())
}

/// Reads the body of a binary trace (after the magic).
pub fn read_body<R: BufRead>(mut r: R) -> Result<Trace, TraceError> {
    let mut offset = MAGIC.len() as u64;
    let mut record = 0u64;
    let fail = |record: u64, offset: u64, msg: &str| TraceError::Binary {
        record,
        offset,
        msg: msg.to_string(),
    };
    let mut hdr = [0u8; 2];
    r.read_exact(&mut hdr)
        .map_err(|_| fail(0, offset, "truncated header (version and flags missing)"))?;
    if hdr[0] != VERSION {
        return Err(fail(
            0,
            offset,
            &format!(
                "unsupported version {} (this build reads {VERSION})",
                hdr[0]
            ),
        ));
    }
    if hdr[1] & !FLAG_TIMED != 0 {
        return Err(fail(
            0,
            offset + 1,
            &format!("unknown flags {:#04x}", hdr[1]),
        ));
    }
    let timed = hdr[1] & FLAG_TIMED != 0;
    offset += 2;
    let mut trace = Trace {
        records: Vec::new(),
        timed,
    };
    let (mut page, mut time) = (0u64, 0u64);
    // Reads one varint; Ok(None) at a clean end of input (only allowed for the first field).
    let varint = |r: &mut R, offset: &mut u64| -> Result<Option<u64>, String> {
        let mut v = 0u64;
        let mut shift = 0;
        loop {
            let buf = r.fill_buf().map_err(|e| e.to_string())?;
            let Some(&b) = buf.first() else {
                return if shift == 0 {
                    Ok(None)
                } else {
                    Err("truncated varint".into())
                };
            };
            r.consume(1);
            *offset += 1;
            if shift == 63 && b > 1 {
                return Err("varint overflows 64 bits".into());
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(Some(v));
            }
            shift += 7;
            if shift > 63 {
                return Err("varint longer than 10 bytes".into());
            }
        }
    };
    loop {
        let start = offset;
        let key = match varint(&mut r, &mut offset) {
            Ok(Some(k)) => k,
            Ok(None) => break,
            Err(m) => return Err(fail(record, start, &m)),
        };
        let mut field = |r: &mut R, what: &str| -> Result<u64, TraceError> {
            match varint(r, &mut offset) {
                Ok(Some(v)) => Ok(v),
                Ok(None) => Err(fail(
                    record,
                    start,
                    &format!("truncated record ({what} missing)"),
                )),
                Err(m) => Err(fail(record, start, &format!("{what}: {m}"))),
            }
        };
        page = page.wrapping_add(unzigzag(field(&mut r, "page")?) as u64);
        if timed {
            time = time.wrapping_add(unzigzag(field(&mut r, "time")?) as u64);
        } else {
            time = record;
        }
        trace.records.push(Record { key, page, time });
        record += 1;
    }
    Ok(trace)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::read_trace;

    #[test]
    fn zigzag_round_trips() {
        for v in [0i64, 1, -1, i64::MAX, i64::MIN, 12345, -98765] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn scan_is_about_two_bytes_per_record() {
        let t = Trace::from_pairs((0..1000u64).map(|p| (1, p)));
        let mut buf = Vec::new();
        write(&mut buf, &t).unwrap();
        assert_eq!(buf.len(), 10 + 2 * 1000);
    }

    #[test]
    fn corrupt_input_is_a_clear_error() {
        let t = Trace::from_pairs([(1, 300), (2, 5)]);
        let mut buf = Vec::new();
        write(&mut buf, &t).unwrap();
        // Truncated inside the second record.
        let cut = &buf[..buf.len() - 1];
        match read_trace(cut) {
            Err(TraceError::Binary { record: 1, .. }) => {}
            other => panic!("expected an error on record 1, got {other:?}"),
        }
        let mut bad = buf.clone();
        bad[8] = 9;
        assert!(read_trace(&bad[..])
            .unwrap_err()
            .to_string()
            .contains("unsupported version 9"));
        assert!(read_trace(&MAGIC[..])
            .unwrap_err()
            .to_string()
            .contains("truncated header"));
        let mut long = MAGIC.to_vec();
        long.extend_from_slice(&[1, 0]);
        long.extend_from_slice(&[0xff; 11]);
        assert!(read_trace(&long[..]).is_err());
    }
}
