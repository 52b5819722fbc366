//! `farvm-lab trace`: generate page-access traces and replay them through prefetchers.
//!
//! The pure parts (formats, generators, evaluator, report) live in `farvm-prefetch`; this module
//! owns files, progress bars, tables and JSON.

mod compare;
mod convert;
mod eval;
mod gen;
mod progress;
mod report;
mod table;

use clap::{Args, Subcommand};

/// Long help of `farvm-lab trace` (main.rs may attach it to the `trace` subcommand).
pub const TRACE_ABOUT: &str = "\
Generate page-access traces and replay them through farvm's prefetchers.

A trace is a sequence of page accesses, `pid page [time_ns] [r|w]`. `farvm-lab trace eval` replays one
through a local memory of N pages (LRU; prefetched pages count against it) once per prefetcher
and prints, per prefetcher, what Leap's Table 2 reports: cache adds (pages prefetched), demand
misses, accuracy, coverage and timeliness.

Trace formats (auto-detected on read, zstd-compressed or not):
  text    one record per line: `pid page [time_ns] [r|w]`; decimal or 0x hex; fields separated
          by spaces, tabs or commas; `#` comments and blank lines ignored; the optional last
          field is the access kind (read or write).
  binary  `FVMTRACE`, version byte (1, or 2 with access kinds), flags byte (bit 0: timed, bit 1:
          access kinds), then per record LEB128 varints: pid (with kinds `pid << 1 | write`),
          zigzag page delta, [zigzag time delta]. About 2 bytes per record on a scan.
Untimed traces use the record index as time, so timeliness is then in accesses.

Examples:
  farvm-lab trace gen sequential --pages 1048576 -o seq.trace
  farvm-lab trace gen stride --stride 10 --count 1048576 --format binary -o stride10.bin
  farvm-lab trace eval --trace seq.trace --local-pages 524288 --hits both
  farvm-lab trace eval --trace stride10.bin --local-pages 524288 --prefetcher leap,leap+stream --json
  farvm-lab trace report
  scripts/make-trace.sh sort          (a real program under valgrind lackey -> traces/sort.trace.zst)
  farvm-lab trace compare traces/*.trace.zst";

/// Arguments of `farvm-lab trace`.
#[derive(Args, Debug)]
#[command(long_about = TRACE_ABOUT)]
pub struct TraceArgs {
    #[command(subcommand)]
    command: TraceCommand,
}

#[derive(Subcommand, Debug)]
enum TraceCommand {
    /// Write a synthetic page-access trace.
    #[command(long_about = gen::GEN_ABOUT)]
    Gen(gen::GenArgs),
    /// Replay a trace through prefetchers and print accuracy, coverage and timeliness.
    #[command(long_about = eval::EVAL_ABOUT)]
    Eval(eval::EvalArgs),
    /// Generate the reference traces in memory and print the README results with pass/fail.
    #[command(long_about = report::REPORT_ABOUT)]
    Report(report::ReportArgs),
    /// Convert valgrind lackey's memory log of a program run into a trace.
    #[command(long_about = convert::FROM_LACKEY_ABOUT)]
    FromLackey(convert::FromLackeyArgs),
    /// Interleave single-process traces into one multi-process trace.
    #[command(long_about = convert::MIX_ABOUT)]
    Mix(convert::MixArgs),
    /// Replay trace files through every prefetcher; markdown tables and the real-trace rule.
    #[command(long_about = compare::COMPARE_ABOUT)]
    Compare(compare::CompareArgs),
}

/// Runs `farvm-lab trace`.
pub fn run(args: TraceArgs) -> anyhow::Result<()> {
    match args.command {
        TraceCommand::Gen(a) => gen::run(a),
        TraceCommand::Eval(a) => eval::run(a),
        TraceCommand::Report(a) => report::run(a),
        TraceCommand::FromLackey(a) => convert::from_lackey(a),
        TraceCommand::Mix(a) => convert::mix(a),
        TraceCommand::Compare(a) => compare::run(a),
    }
}

#[cfg(test)]
mod tests {
    use clap::{Args, Command, FromArgMatches};

    use super::*;

    fn parse(args: &[&str]) -> Result<TraceArgs, clap::Error> {
        let cmd = TraceArgs::augment_args(Command::new("trace"));
        let m = cmd.try_get_matches_from(std::iter::once("trace").chain(args.iter().copied()))?;
        TraceArgs::from_arg_matches(&m)
    }

    #[test]
    fn command_line_is_well_formed() {
        TraceArgs::augment_args(Command::new("trace")).debug_assert();
    }

    #[test]
    fn gen_then_eval_round_trip() {
        let dir = std::env::temp_dir().join(format!("farvm-trace-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for format in ["text", "binary"] {
            let path = dir.join(format!("seq.{format}"));
            let p = path.to_str().unwrap();
            run(parse(&[
                "gen",
                "sequential",
                "--pages",
                "5000",
                "--format",
                format,
                "-o",
                p,
            ])
            .unwrap())
            .unwrap();
            let t = farvm_prefetch::trace::read_trace(std::fs::File::open(&path).unwrap()).unwrap();
            assert_eq!(t.records.len(), 5000);
            assert!(t
                .records
                .iter()
                .enumerate()
                .all(|(i, r)| r.page == i as u64 && r.key == 1));
            run(parse(&[
                "eval",
                "--trace",
                p,
                "--local-pages",
                "100",
                "--hits",
                "both",
                "--json",
            ])
            .unwrap())
            .unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn lackey_log_to_trace_then_mix_and_compare() {
        let dir = std::env::temp_dir().join(format!("farvm-lackey-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("lackey.log");
        let mut text = String::from("==1== Lackey, an example Valgrind tool\n");
        for i in 0..3000u64 {
            text += &format!(
                "I  04000000,3\n L {:x},8\n S {:x},8\n",
                0x10000 + 4096 * i,
                0x900000
            );
        }
        std::fs::write(&log, text).unwrap();
        let one = dir.join("one.trace");
        let (l, o) = (log.to_str().unwrap(), one.to_str().unwrap());
        run(parse(&[
            "from-lackey",
            "--input",
            l,
            "-o",
            o,
            "--max-records",
            "2000",
        ])
        .unwrap())
        .unwrap();
        let t = farvm_prefetch::trace::read_trace(std::fs::File::open(&one).unwrap()).unwrap();
        assert_eq!(t.records.len(), 2000);
        assert!(t.kinds && t.records[0].page == 0x10 && !t.records[0].write);
        assert!(t.records.iter().any(|r| r.page == 0x900 && r.write));
        let mixed = dir.join("mix.trace");
        let m = mixed.to_str().unwrap();
        run(parse(&["mix", "--quantum", "7", o, o, "-o", m, "--format", "text"]).unwrap()).unwrap();
        let t = farvm_prefetch::trace::read_trace(std::fs::File::open(&mixed).unwrap()).unwrap();
        assert_eq!(t.records.len(), 4000);
        assert_eq!((t.records[6].key, t.records[7].key), (1, 2));
        // A scan: leap+stream meets the rule, so compare succeeds.
        run(parse(&["compare", o, m]).unwrap()).unwrap();
        assert!(parse(&["mix", o]).is_err(), "mix needs two traces");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let dir = std::env::temp_dir().join(format!("farvm-trace-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.trace");
        std::fs::write(&path, "1 2\n1 3 4\n").unwrap();
        let p = path.to_str().unwrap();
        let err = run(parse(&["eval", "--trace", p, "--local-pages", "10"]).unwrap()).unwrap_err();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
        let err = run(parse(&[
            "eval",
            "--trace",
            p,
            "--local-pages",
            "10",
            "--prefetcher",
            "lep",
        ])
        .unwrap())
        .unwrap_err();
        assert!(err.to_string().contains("unknown prefetcher `lep`"));
        assert!(
            parse(&["eval", "--trace", p]).is_err(),
            "--local-pages is required"
        );
        let err = run(parse(&["gen", "matmul", "--n", "10", "--block", "3"]).unwrap()).unwrap_err();
        assert!(err.to_string().contains("divide"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
