//! `farvm-lab trace from-lackey` and `farvm-lab trace mix`: traces of real programs.
//!
//! `from-lackey` turns valgrind lackey's memory log into a page-access trace (the parsing is
//! `farvm_prefetch::trace::lackey`); `mix` interleaves single-process traces into one
//! multi-process trace. `scripts/make-trace.sh` drives both for the committed traces.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use farvm_prefetch::trace::lackey::{convert, LackeyOptions};
use farvm_prefetch::trace::{binary, mix, read_trace, text, Record, Trace};

use super::gen::FormatArg;

pub(super) const FROM_LACKEY_ABOUT: &str = "\
Convert valgrind lackey's memory log into a page-access trace.

Input: the log of `valgrind --tool=lackey --trace-mem=yes --log-file=FILE PROGRAM ...` (a file, a
FIFO, or `-` for stdin). Each data access (` L` load, ` S` store, ` M` modify) becomes an access
to its 4 KiB page (an access that straddles two pages touches both); instruction fetches (`I`)
are dropped unless --instructions. Repeated accesses to a page collapse into one record, a write
if any of them stored: an access to one of the last --window distinct pages recorded is folded
into that page's record (--window 1: consecutive accesses only; the default 16 also folds
interleaved references such as `c[i] += a[i]`, which lose no miss in any memory of 16 pages or
more). Records keep their access kind (`r`/`w`), and all get
process key --pid. --skip drops the first records (start-up), --max-records stops reading after
that many records, so a long run gives a bounded trace.

Output: text (`pid page r|w`) or binary (version 2, with access kinds); compress it with `zstd`
if you like: every reader of traces detects zstd.

Examples:
  mkfifo log; valgrind --tool=lackey --trace-mem=yes --log-file=log xz -6 -c big.txt >/dev/null &
  farvm-lab trace from-lackey --input log --max-records 2000000 --format binary -o xz.trace
  farvm-lab trace from-lackey --input - --pid 2 -o prog.trace < lackey.log";

/// Arguments of `farvm-lab trace from-lackey`.
#[derive(Args, Debug)]
#[command(long_about = FROM_LACKEY_ABOUT)]
pub struct FromLackeyArgs {
    /// The lackey log (`-` = stdin).
    #[arg(long, default_value = "-")]
    input: PathBuf,
    /// Output file (`-` = stdout).
    #[arg(long, short, default_value = "-")]
    out: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = FormatArg::Binary)]
    format: FormatArg,
    /// Process key of every record.
    #[arg(long, default_value_t = 1)]
    pid: u64,
    /// Keep instruction fetches as reads of code pages.
    #[arg(long)]
    instructions: bool,
    /// Records (after collapsing) dropped from the start.
    #[arg(long, default_value_t = 0)]
    skip: u64,
    /// Records written at most; the conversion stops reading there.
    #[arg(long)]
    max_records: Option<u64>,
    /// Distinct recent pages an access is folded into (1 = consecutive accesses only).
    #[arg(long, default_value_t = LackeyOptions::default().window)]
    window: usize,
}

pub(super) const MIX_ABOUT: &str = "\
Interleave single-process traces into one multi-process trace.

Traces recorded from separate program runs share no clock, so the mix follows a deterministic
schedule: a round robin taking --quantum records from each input in turn (as processes whose
faults alternate in bursts), skipping inputs that have ended. Input i (from 1, in command-line
order) becomes process key i; records are renumbered; access kinds are kept if every input has
them.

Example:
  farvm-lab trace mix --quantum 100 numpy.trace.zst redis.trace.zst -o mix.trace";

/// Arguments of `farvm-lab trace mix`.
#[derive(Args, Debug)]
#[command(long_about = MIX_ABOUT)]
pub struct MixArgs {
    /// Input traces (any format, zstd-compressed or not).
    #[arg(required = true, num_args = 2..)]
    inputs: Vec<PathBuf>,
    /// Records taken from each input in turn.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    quantum: u64,
    /// Output file (`-` = stdout).
    #[arg(long, short, default_value = "-")]
    out: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = FormatArg::Binary)]
    format: FormatArg,
}

/// A text or binary record encoder over an output file or stdout.
enum Encoder<'a> {
    Text(&'a mut dyn Write, text::Fields),
    Binary(binary::Writer<&'a mut dyn Write>),
}

impl<'a> Encoder<'a> {
    fn new(w: &'a mut dyn Write, format: FormatArg, kinds: bool) -> std::io::Result<Self> {
        Ok(match format {
            FormatArg::Text => {
                let fields = text::Fields {
                    timed: false,
                    kinds,
                };
                text::write_header(w, fields)?;
                Encoder::Text(w, fields)
            }
            FormatArg::Binary => Encoder::Binary(binary::Writer::with_kinds(w, false, kinds)?),
        })
    }

    fn write(&mut self, r: &Record) -> std::io::Result<()> {
        match self {
            Encoder::Text(w, f) => text::write_record(*w, r, *f),
            Encoder::Binary(b) => b.write(r),
        }
    }

    fn finish(self) -> std::io::Result<()> {
        match self {
            Encoder::Text(w, _) => w.flush(),
            Encoder::Binary(b) => b.finish().map(|_| ()),
        }
    }
}

/// Runs `body` with a buffered writer on `out` (`-` = stdout).
fn with_output(
    out: &PathBuf,
    body: impl FnOnce(&mut dyn Write) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    if out.as_os_str() == "-" {
        let stdout = std::io::stdout();
        let mut w = BufWriter::new(stdout.lock());
        body(&mut w)
    } else {
        let f = File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        body(&mut w).with_context(|| format!("writing {}", out.display()))
    }
}

pub fn from_lackey(a: FromLackeyArgs) -> anyhow::Result<()> {
    let opts = LackeyOptions {
        key: a.pid,
        instructions: a.instructions,
        skip: a.skip,
        max_records: a.max_records,
        window: a.window,
    };
    let input: Box<dyn std::io::Read> = if a.input.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(File::open(&a.input).with_context(|| format!("opening {}", a.input.display()))?)
    };
    let input = BufReader::with_capacity(1 << 20, input);
    let mut summary = None;
    with_output(&a.out, |w| {
        let mut enc = Encoder::new(w, a.format, true)?;
        let s = convert(input, &opts, &mut |r| enc.write(r))
            .with_context(|| format!("converting {}", a.input.display()))?;
        enc.finish()?;
        summary = Some(s);
        Ok(())
    })?;
    if let Some(s) = summary {
        eprintln!(
            "farvm-lab: {} lackey lines, {} accesses -> {} records ({} writes, {} skipped){}",
            s.lines,
            s.accesses,
            s.records,
            s.writes,
            s.skipped,
            if s.truncated {
                ", stopped at --max-records"
            } else {
                ""
            }
        );
    }
    Ok(())
}

pub fn mix(a: MixArgs) -> anyhow::Result<()> {
    let mut inputs = Vec::with_capacity(a.inputs.len());
    for p in &a.inputs {
        let f = File::open(p).with_context(|| format!("opening {}", p.display()))?;
        let t: Trace = read_trace(f).with_context(|| format!("reading {}", p.display()))?;
        inputs.push(t);
    }
    let quantum = usize::try_from(a.quantum).unwrap_or(usize::MAX);
    let mixed = mix::interleave(&inputs, quantum);
    with_output(&a.out, |w| {
        let mut enc = Encoder::new(w, a.format, mixed.kinds)?;
        for r in &mixed.records {
            enc.write(r)?;
        }
        enc.finish()?;
        Ok(())
    })?;
    eprintln!(
        "farvm-lab: mixed {} traces into {} records",
        inputs.len(),
        mixed.records.len()
    );
    Ok(())
}
