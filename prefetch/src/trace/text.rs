//! The text trace format: `pid page [time_ns] [r|w]` per line.
//!
//! Numbers are decimal or `0x` hexadecimal; fields are separated by spaces, tabs or commas;
//! `#` starts a comment; blank lines are skipped. The optional last field is the access kind,
//! `r` (read) or `w` (write). Either every record has a time or none has, and either every
//! record has a kind or none has (the first record decides each). Errors name the line.

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
    let mut kinds: Option<bool> = None;
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
            return Err(err(format!(
                "expected `pid page [time_ns] [r|w]`, got `{s}`"
            )));
        };
        let mut time = fields.next();
        let mut kind = None;
        if let Some(k) = time.and_then(parse_kind) {
            (time, kind) = (None, Some(k));
        } else if let Some(f) = fields.next() {
            kind = Some(
                parse_kind(f)
                    .ok_or_else(|| err(format!("access kind must be `r` or `w`, got `{f}`")))?,
            );
        }
        if fields.next().is_some() {
            return Err(err(format!(
                "too many fields in `{s}` (expected `pid page [time_ns] [r|w]`)"
            )));
        }
        agree(&mut timed, time.is_some(), "time").map_err(err)?;
        agree(&mut kinds, kind.is_some(), "access kind").map_err(err)?;
        let key = parse_num(pid).map_err(|m| err(format!("pid: {m}")))?;
        let page = parse_num(page).map_err(|m| err(format!("page: {m}")))?;
        let time = match time {
            Some(t) => parse_num(t).map_err(|m| err(format!("time: {m}")))?,
            None => trace.records.len() as u64,
        };
        trace.records.push(Record {
            key,
            page,
            time,
            write: kind.unwrap_or(false),
        });
    }
    trace.timed = timed.unwrap_or(false);
    trace.kinds = kinds.unwrap_or(false);
    Ok(trace)
}

/// `r` → read (`false`), `w` → write (`true`).
fn parse_kind(field: &str) -> Option<bool> {
    match field {
        "r" | "R" => Some(false),
        "w" | "W" => Some(true),
        _ => None,
    }
}

/// Every record has the optional field `what` or none has; the first record decides.
fn agree(seen: &mut Option<bool>, has: bool, what: &str) -> Result<(), String> {
    match *seen {
        None => *seen = Some(has),
        Some(true) if !has => return Err(format!("missing {what}: earlier records have one")),
        Some(false) if has => return Err(format!("unexpected {what}: earlier records have none")),
        _ => {}
    }
    Ok(())
}

/// Which optional fields the records of a text trace carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fields {
    /// Records carry a time.
    pub timed: bool,
    /// Records carry an access kind (read or write).
    pub kinds: bool,
}

impl Fields {
    /// The fields `trace` carries.
    pub fn of(trace: &Trace) -> Self {
        Self {
            timed: trace.timed,
            kinds: trace.kinds,
        }
    }
}

/// Writes the header comment of a text trace.
pub fn write_header<W: Write + ?Sized>(w: &mut W, fields: Fields) -> std::io::Result<()> {
    writeln!(
        w,
        "# farvm page-access trace: pid page{}{}",
        if fields.timed { " time_ns" } else { "" },
        if fields.kinds { " r|w" } else { "" }
    )
}

/// Writes one record line.
pub fn write_record<W: Write + ?Sized>(
    w: &mut W,
    r: &Record,
    fields: Fields,
) -> std::io::Result<()> {
    write!(w, "{} {}", r.key, r.page)?;
    if fields.timed {
        write!(w, " {}", r.time)?;
    }
    if fields.kinds {
        write!(w, " {}", if r.write { 'w' } else { 'r' })?;
    }
    writeln!(w)
}

/// Writes a whole trace.
pub fn write<W: Write + ?Sized>(w: &mut W, trace: &Trace) -> std::io::Result<()> {
    let fields = Fields::of(trace);
    write_header(w, fields)?;
    for r in &trace.records {
        write_record(w, r, fields)?;
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
    fn access_kinds_follow_the_optional_time() {
        let t = read("1 16 w\n1 17 r\n".as_bytes()).unwrap();
        assert!(t.kinds && !t.timed);
        assert_eq!(
            t.records.iter().map(|r| r.write).collect::<Vec<_>>(),
            [true, false]
        );
        let t = read("1 16 100 W\n".as_bytes()).unwrap();
        assert!(t.kinds && t.timed);
        assert_eq!((t.records[0].time, t.records[0].write), (100, true));
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
        assert_eq!(err_line("1 2 w\n1 3\n").0, 2);
        assert_eq!(err_line("1 2\n1 3 r\n").0, 2);
        assert!(err_line("1 2 5 x\n").1.contains("`r` or `w`"));
        assert_eq!(err_line("1 2 5 w 1\n").0, 1);
        let bytes = b"1 2\n\xff\xfe 3\n";
        assert!(matches!(
            read(&bytes[..]),
            Err(TraceError::Text { line: 2, .. })
        ));
    }
}
