//! Converts valgrind lackey's memory trace into page-access records.
//!
//! `valgrind --tool=lackey --trace-mem=yes` logs every memory access of a program, one per line:
//! `I  addr,size` (instruction fetch), ` L addr,size` (load), ` S addr,size` (store) and
//! ` M addr,size` (modify: a load and a store), addresses in hexadecimal; valgrind's own
//! messages start with `==pid==` or `--pid--`. The conversion keeps data accesses (instruction
//! fetches only if asked), maps each to its 4 KiB page (an access that straddles two pages
//! touches both), and collapses repeated accesses to a page into one record, a write if any of
//! them stored. It can skip the first records (start-up) and stop after a number of records, so a
//! trace of a long run stays bounded.
//!
//! Collapsing: an access to one of the last `window` distinct pages recorded is folded into that
//! page's record. With `window` = 1 that is exactly "consecutive accesses to the same page". A
//! real program interleaves references (a loop reading `a[i]` and writing `c[i]`, the stack
//! between heap accesses), which consecutive collapsing cannot fold: every element would become
//! two records. The synthetic generators fold per reference; a real trace names no references,
//! so a short window of recent pages stands in for them (default 16). A page in the window is
//! resident in any LRU memory of at least `window` pages, so folding loses no miss; it only
//! skips recency updates of pages touched again within the window. Records leave the window in
//! first-touch order, carrying the write flag of every access folded into them.

use std::io::BufRead;

use super::Record;
use crate::{PageNo, ProcessKey};

/// Conversion settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LackeyOptions {
    /// Process key of every record.
    pub key: ProcessKey,
    /// Keep instruction fetches (`I` lines) as reads of code pages.
    pub instructions: bool,
    /// Records (after collapsing) dropped from the start.
    pub skip: u64,
    /// Records written at most (after `skip`); the conversion stops reading there.
    pub max_records: Option<u64>,
    /// Distinct recent pages an access is folded into (1 = consecutive accesses only; at most
    /// [`MAX_WINDOW`]).
    pub window: usize,
}

/// Largest collapsing window.
pub const MAX_WINDOW: usize = 256;

impl Default for LackeyOptions {
    fn default() -> Self {
        Self {
            key: 1,
            instructions: false,
            skip: 0,
            max_records: None,
            window: 16,
        }
    }
}

/// What a conversion read and wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LackeySummary {
    /// Lines read.
    pub lines: u64,
    /// Accesses kept (before collapsing).
    pub accesses: u64,
    /// Records dropped by `skip`.
    pub skipped: u64,
    /// Records written.
    pub records: u64,
    /// Of `records`, writes.
    pub writes: u64,
    /// The conversion stopped at `max_records` before the end of the input.
    pub truncated: bool,
}

/// Why a lackey log could not be converted.
#[derive(Debug, thiserror::Error)]
pub enum LackeyError {
    /// The log could not be read.
    #[error("reading the lackey log: {0}")]
    Io(std::io::Error),
    #[error("lackey log line {line}: {msg}")]
    /// A line is malformed.
    Line {
        /// Its number.
        line: u64,
        /// What is wrong.
        msg: String,
    },
    /// A record could not be written.
    #[error("writing a record: {0}")]
    Sink(std::io::Error),
    /// The collapsing window is out of range.
    #[error("collapsing window must be in 1..={MAX_WINDOW}, got {0}")]
    Window(usize),
}

const PAGE_SHIFT: u32 = 12;

/// Parses `addr,size` (hexadecimal address, decimal size).
fn parse_access(field: &[u8]) -> Result<(u64, u64), String> {
    let text = || String::from_utf8_lossy(field).into_owned();
    let comma = field
        .iter()
        .position(|&b| b == b',')
        .ok_or_else(|| format!("expected `addr,size`, got `{}`", text()))?;
    let (addr, size) = (&field[..comma], &field[comma + 1..]);
    if addr.is_empty() || addr.len() > 16 {
        return Err(format!("bad address in `{}`", text()));
    }
    let mut a = 0u64;
    for &b in addr {
        let d = (b as char)
            .to_digit(16)
            .ok_or_else(|| format!("bad hexadecimal address in `{}`", text()))?;
        a = a << 4 | u64::from(d);
    }
    let size = std::str::from_utf8(size)
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&s| s <= 1 << 16)
        .ok_or_else(|| format!("bad access size in `{}`", text()))?;
    Ok((a, size.max(1)))
}

/// Folds accesses into the records of the window, and applies skip / max as records leave it.
struct Collapser<'a> {
    opts: LackeyOptions,
    /// Pending records, oldest first (a ring of `opts.window` entries).
    window: Vec<(PageNo, bool)>,
    /// Index of the oldest pending record.
    oldest: usize,
    summary: LackeySummary,
    sink: &'a mut dyn FnMut(&Record) -> std::io::Result<()>,
}

impl Collapser<'_> {
    /// Returns `Ok(false)` once `max_records` are written.
    fn access(&mut self, page: PageNo, write: bool) -> Result<bool, LackeyError> {
        // The newest record is the likeliest match: look at it first.
        let n = self.window.len();
        let newest = (self.oldest + n.max(1) - 1) % n.max(1);
        let hit = (0..n)
            .map(|k| (newest + n - k) % n)
            .find(|&i| self.window[i].0 == page);
        if let Some(i) = hit {
            self.window[i].1 |= write;
            return Ok(true);
        }
        if n < self.opts.window {
            self.window.push((page, write));
            return Ok(true);
        }
        let (old_page, old_write) = self.window[self.oldest];
        self.window[self.oldest] = (page, write);
        self.oldest = (self.oldest + 1) % n;
        self.emit(old_page, old_write)
    }

    /// Emits every pending record, oldest first.
    fn flush(&mut self) -> Result<bool, LackeyError> {
        let n = self.window.len();
        for k in 0..n {
            let (page, write) = self.window[(self.oldest + k) % n];
            if !self.emit(page, write)? {
                return Ok(false);
            }
        }
        self.window.clear();
        self.oldest = 0;
        Ok(true)
    }

    fn emit(&mut self, page: PageNo, write: bool) -> Result<bool, LackeyError> {
        if self.summary.skipped < self.opts.skip {
            self.summary.skipped += 1;
            return Ok(true);
        }
        let r = Record {
            key: self.opts.key,
            page,
            time: self.summary.records,
            write,
        };
        (self.sink)(&r).map_err(LackeyError::Sink)?;
        self.summary.records += 1;
        self.summary.writes += u64::from(write);
        Ok(self
            .opts
            .max_records
            .is_none_or(|m| self.summary.records < m))
    }
}

/// Converts the lackey log read from `input`, handing each record to `sink` in order (times are
/// record indices). Stops early, with `truncated` set, after `max_records`.
pub fn convert<R: BufRead>(
    mut input: R,
    opts: &LackeyOptions,
    sink: &mut dyn FnMut(&Record) -> std::io::Result<()>,
) -> Result<LackeySummary, LackeyError> {
    if opts.window == 0 || opts.window > MAX_WINDOW {
        return Err(LackeyError::Window(opts.window));
    }
    let mut c = Collapser {
        opts: *opts,
        window: Vec::with_capacity(opts.window),
        oldest: 0,
        summary: LackeySummary::default(),
        sink,
    };
    if opts.max_records == Some(0) {
        c.summary.truncated = true;
        return Ok(c.summary);
    }
    let mut buf = Vec::with_capacity(128);
    loop {
        buf.clear();
        if input.read_until(b'\n', &mut buf).map_err(LackeyError::Io)? == 0 {
            break;
        }
        c.summary.lines += 1;
        let line = c.summary.lines;
        let l = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let l = l.strip_suffix(b"\r").unwrap_or(l);
        if l.is_empty() || l.starts_with(b"==") || l.starts_with(b"--") {
            continue;
        }
        let (write, field) = match l {
            [b'I', b' ', rest @ ..] => {
                if !opts.instructions {
                    continue;
                }
                (false, rest)
            }
            [b' ', b'L', b' ', rest @ ..] => (false, rest),
            [b' ', b'S' | b'M', b' ', rest @ ..] => (true, rest),
            _ => {
                return Err(LackeyError::Line {
                    line,
                    msg: format!(
                        "not a lackey access (`I`, ` L`, ` S`, ` M`) or valgrind message: `{}`",
                        String::from_utf8_lossy(&l[..l.len().min(80)])
                    ),
                })
            }
        };
        let field = field.trim_ascii();
        let (addr, size) = parse_access(field).map_err(|msg| LackeyError::Line { line, msg })?;
        c.summary.accesses += 1;
        let first = addr >> PAGE_SHIFT;
        let last = addr.saturating_add(size - 1) >> PAGE_SHIFT;
        for page in first..=last {
            if !c.access(page, write)? {
                c.summary.truncated = true;
                return Ok(c.summary);
            }
        }
    }
    c.flush()?;
    Ok(c.summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(log: &str, opts: LackeyOptions) -> Result<(Vec<(u64, bool)>, LackeySummary), String> {
        let mut out = Vec::new();
        let s = convert(log.as_bytes(), &opts, &mut |r| {
            assert_eq!(r.key, opts.key);
            out.push((r.page, r.write));
            Ok(())
        })
        .map_err(|e| e.to_string())?;
        Ok((out, s))
    }

    const LOG: &str = "\
==42== Lackey, an example Valgrind tool
==42== Command: ./prog
I  04016e20,3
 L 1ffefff8c8,8
 S 1ffefff8d0,8
I  04016e23,5
 L 0403a000,4
 M 0403a010,4
 L 0403bffe,4
 L 1ffefff8c8,8
==42== Counted 1 calls to main()
";

    fn consecutive() -> LackeyOptions {
        LackeyOptions {
            window: 1,
            ..LackeyOptions::default()
        }
    }

    #[test]
    fn collapses_same_page_runs_and_keeps_writes() {
        let (recs, s) = run(LOG, consecutive()).unwrap();
        assert_eq!(
            recs,
            [
                (0x1ffefff, true),
                (0x403a, true),
                (0x403b, false),
                (0x403c, false),
                (0x1ffefff, false)
            ],
            "a straddling load touches both pages"
        );
        assert_eq!((s.accesses, s.records, s.writes), (6, 5, 2));
        assert!(!s.truncated);
        // The default window folds the stack page's second visit into its first record.
        let (recs, _) = run(LOG, LackeyOptions::default()).unwrap();
        assert_eq!(
            recs,
            [
                (0x1ffefff, true),
                (0x403a, true),
                (0x403b, false),
                (0x403c, false)
            ]
        );
    }

    #[test]
    fn a_window_folds_interleaved_streams() {
        // c[i] += a[i] over 2 pages each: load a, load c, store c, element by element.
        let mut log = String::new();
        for i in 0..1024u64 {
            log += &format!(
                " L {:x},8\n L {:x},8\n S {:x},8\n",
                0x10000 + 8 * i,
                0x20000 + 8 * i,
                0x20000 + 8 * i
            );
        }
        let (recs, _) = run(&log, consecutive()).unwrap();
        assert_eq!(
            recs.len(),
            2048,
            "consecutive collapsing: one record per access pair"
        );
        let opts = LackeyOptions {
            window: 2,
            ..LackeyOptions::default()
        };
        let (recs, _) = run(&log, opts).unwrap();
        assert_eq!(
            recs,
            [(0x10, false), (0x20, true), (0x11, false), (0x21, true)]
        );
        let opts = LackeyOptions {
            window: 0,
            ..LackeyOptions::default()
        };
        assert!(run(&log, opts).unwrap_err().contains("window"));
    }

    #[test]
    fn instructions_skip_and_max() {
        let opts = LackeyOptions {
            instructions: true,
            ..LackeyOptions::default()
        };
        let (recs, _) = run(LOG, opts).unwrap();
        assert_eq!(recs[0], (0x4016, false));
        let opts = LackeyOptions {
            key: 7,
            skip: 1,
            max_records: Some(2),
            ..consecutive()
        };
        let (recs, s) = run(LOG, opts).unwrap();
        assert_eq!(recs, [(0x403a, true), (0x403b, false)]);
        assert!(s.truncated);
        assert_eq!(s.skipped, 1);
    }

    #[test]
    fn bad_lines_are_errors_naming_the_line() {
        for (log, line) in [
            ("I  0400,3\n L zz,8\n", 2),
            (" L 0400\n", 1),
            (" S 0400,-1\n", 1),
            ("hello\n", 1),
            (" L 11112222333344445,8\n", 1),
        ] {
            let err = run(log, LackeyOptions::default()).unwrap_err();
            assert!(err.contains(&format!("line {line}")), "{log:?}: {err}");
        }
        let (recs, _) = run(" L ffffffffffffffff,8\n", LackeyOptions::default()).unwrap();
        assert_eq!(recs, [(u64::MAX >> 12, false)], "no overflow at the top");
    }
}
