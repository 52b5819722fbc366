//! The text trace format: `pid page [time_ns]` per line.
//!
//! Numbers are decimal or `0x` hexadecimal; fields are separated by spaces, tabs or commas;
//! `#` starts a comment; blank lines are skipped. Either every record has a time or none has
//! (the first record decides). Errors name the line.

use std::io::{BufRead, Write};

use super::{Record, Trace, TraceError};

fn parse_num(field: &str) -> Result<u64, String> {
    let r = if let Some(hex) = field
        .strip_prefix("0x")
        .or_else(|| field.strip_prefix("0X"))
    {
        u64::from_str_radix(hex, 16)
    } else {
        field.parse::<u64>()
    };
    r.map_err(|e| format!("`{field}` is not an unsigned 64-bit number ({e})"))
}

/// Reads a text trace.
pub fn read<R: BufRead>(mut reader: R) -> Result<Trace, TraceError> {
    let mut trace = Trace::default();
    let mut timed: Option<bool> = None;
    let mut buf = Vec::new();
    let mut line = 0u64;
    loop {
        buf.clear();
        if reader.read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        line += 1;
        let err = |msg: String| TraceError::Text { line, msg };
        let s = std::str::from_utf8(&buf).map_err(|_| err("not valid UTF-8 text".into()))?;
        let s = s.split('#').next().unwrap_or("").trim();
        if s.is_empty() {
            continue;
        }
        let mut fields = s
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|f| !f.is_empty());
        let (Some(pid), Some(page)) = (fields.next(), fields.next()) else {
            return Err(err(format!("expected `pid page [time_ns]`, got `{s}`")));
        };
        let time = fields.next();
        if fields.next().is_some() {
            return Err(err(format!(
                "too many fields in `{s}` (expected `pid page [time_ns]`)"
            )));
        }
        let has_time = time.is_some();
        match timed {
            None => timed = Some(has_time),
            Some(t) if t != has_time => {
                return Err(err(if t {
                    "missing time: earlier records have one".into()
                } else {
                    "unexpected time: earlier records have none".into()
                }))
            }
            _ => {}
        }
        let key = parse_num(pid).map_err(|m| err(format!("pid: {m}")))?;
        let page = parse_num(page).map_err(|m| err(format!("page: {m}")))?;
        let time = match time {
            Some(t) => parse_num(t).map_err(|m| err(format!("time: {m}")))?,
            None => trace.records.len() as u64,
        };
        trace.records.push(Record { key, page, time });
    }
    trace.timed = timed.unwrap_or(false);
    Ok(trace)
}

/// Writes the header comment of a text trace.
pub fn write_header<W: Write + ?Sized>(w: &mut W, timed: bool) -> std::io::Result<()> {
    if timed {
        writeln!(w, "# farvm page-access trace: pid page time_ns")
    } else {
        writeln!(w, "# farvm page-access trace: pid page")
    }
}

/// Writes one record line.
pub fn write_record<W: Write + ?Sized>(w: &mut W, r: &Record, timed: bool) -> std::io::Result<()> {
    if timed {
        writeln!(w, "{} {} {}", r.key, r.page, r.time)
    } else {
        writeln!(w, "{} {}", r.key, r.page)
    }
}

/// Writes a whole trace.
pub fn write<W: Write + ?Sized>(w: &mut W, trace: &Trace) -> std::io::Result<()> {
    write_header(w, trace.timed)?;
    for r in &trace.records {
        write_record(w, r, trace.timed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_line(input: &str) -> (u64, String) {
        match read(input.as_bytes()) {
            Err(TraceError::Text { line, msg }) => (line, msg),
            other => panic!("expected a text error, got {other:?}"),
        }
    }

    #[test]
    fn parses_comments_hex_and_separators() {
        let t = read("# header\n\n1 0x10\n2,17 # trailing\n\t3\t18\n".as_bytes()).unwrap();
        let pages: Vec<_> = t.records.iter().map(|r| (r.key, r.page, r.time)).collect();
        assert_eq!(pages, [(1, 16, 0), (2, 17, 1), (3, 18, 2)]);
        assert!(!t.timed);
    }

    #[test]
    fn bad_lines_name_the_line() {
        assert_eq!(err_line("1 2\n1 x\n").0, 2);
        assert!(err_line("1 2\n1 x\n").1.contains("page"));
        assert_eq!(err_line("1 2\n\n7\n").0, 3);
        assert_eq!(err_line("1 2 3 4\n").0, 1);
        assert_eq!(err_line("1 2 3\n1 2\n").0, 2);
        assert_eq!(err_line("1 2\n1 2 3\n").0, 2);
        assert_eq!(err_line("1 99999999999999999999\n").0, 1);
        assert_eq!(err_line("-1 2\n").0, 1);
        let bytes = b"1 2\n\xff\xfe 3\n";
        assert!(matches!(
            read(&bytes[..]),
            Err(TraceError::Text { line: 2, .. })
        ));
    }
}
