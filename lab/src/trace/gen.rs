//! `farvm-lab trace gen`: writes a synthetic trace to a file or stdout.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use farvm_prefetch::trace::gen::Workload;
use farvm_prefetch::trace::{binary, text, Record};

/// Output format of `farvm-lab trace gen`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum FormatArg {
    /// `pid page` per line.
    Text,
    /// Compact varint records (see `farvm-lab trace --help`).
    Binary,
}

pub(super) const GEN_ABOUT: &str = "\
Write a synthetic page-access trace.

Each generator emits the pages a program touches, one record per move of an array reference
or pointer to a different 4 KiB page; data structures are laid out page-aligned from page 0.
Random generators are deterministic for a given --seed.

Examples:
  farvm-lab trace gen sequential --pages 1048576 -o seq.trace
  farvm-lab trace gen zipf --pages 1048576 --count 4194304 --theta 0.99 --format binary -o zipf.bin
  farvm-lab trace gen matmul --n 192 --block 32 -o mm.trace
  farvm-lab trace gen mix --scan-pages 524288 --polluter-pages 131072 -o mix.trace";

/// Arguments of `farvm-lab trace gen`.
#[derive(Args, Debug)]
#[command(long_about = GEN_ABOUT)]
pub struct GenArgs {
    #[command(subcommand)]
    kind: Kind,
    /// Output file (`-` = stdout).
    #[arg(long, short, global = true, default_value = "-")]
    out: PathBuf,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = FormatArg::Text)]
    format: FormatArg,
}

#[derive(Subcommand, Debug)]
enum Kind {
    /// Scans over pages 0..PAGES (Leap's Sequential microbenchmark).
    Sequential {
        #[arg(long, default_value_t = 1 << 20)]
        pages: u64,
        #[arg(long, default_value_t = 1)]
        passes: u32,
    },
    /// COUNT accesses to pages 0, S, 2S, ... (Leap's Stride-10 with S = 10).
    Stride {
        #[arg(long, default_value_t = 10)]
        stride: u64,
        #[arg(long, default_value_t = 1 << 20)]
        count: u64,
        #[arg(long, default_value_t = 1)]
        passes: u32,
    },
    /// COUNT accesses uniformly at random over PAGES pages.
    Random {
        #[arg(long, default_value_t = 1 << 20)]
        pages: u64,
        #[arg(long, default_value_t = 1 << 20)]
        count: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// COUNT accesses, page k with probability proportional to 1/(k+1)^THETA.
    Zipf {
        #[arg(long, default_value_t = 1 << 20)]
        pages: u64,
        #[arg(long, default_value_t = 1 << 20)]
        count: u64,
        #[arg(long, default_value_t = 0.99)]
        theta: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// C = A·B over N×N row-major f64 matrices (naive i-j-k, or tiled with --block).
    Matmul {
        #[arg(long, default_value_t = 192)]
        n: u64,
        /// Tile size (must divide N); 0 = naive loop.
        #[arg(long, default_value_t = 0)]
        block: u64,
    },
    /// Pull-based PageRank over a CSR graph with power-law (Zipf 0.8) edge sources.
    Pagerank {
        #[arg(long, default_value_t = 1 << 17)]
        vertices: u64,
        /// Average in-degree.
        #[arg(long, default_value_t = 8)]
        degree: u64,
        #[arg(long, default_value_t = 2)]
        iters: u32,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// Quicksort (Hoare partition) of ELEMENTS random u32.
    Quicksort {
        #[arg(long, default_value_t = 1 << 22)]
        elements: u64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// pid 1 scans SCAN_PAGES while pid 2 touches random pages of its own (SNU's polluter).
    Mix {
        #[arg(long, default_value_t = 1 << 20)]
        scan_pages: u64,
        #[arg(long, default_value_t = 1 << 17)]
        polluter_pages: u64,
        /// Probability that an access is the polluter's.
        #[arg(long, default_value_t = 0.5)]
        polluter_share: f64,
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
    /// One process, two threads scanning two arrays of PAGES pages, interleaved.
    TwoStream {
        #[arg(long, default_value_t = 1 << 19)]
        pages: u64,
    },
}

impl Kind {
    fn workload(&self) -> Workload {
        match *self {
            Kind::Sequential { pages, passes } => Workload::Sequential { pages, passes },
            Kind::Stride {
                stride,
                count,
                passes,
            } => Workload::Stride {
                stride,
                count,
                passes,
            },
            Kind::Random { pages, count, seed } => Workload::Random { pages, count, seed },
            Kind::Zipf {
                pages,
                count,
                theta,
                seed,
            } => Workload::Zipf {
                pages,
                count,
                theta,
                seed,
            },
            Kind::Matmul { n, block } => Workload::MatMul { n, block },
            Kind::Pagerank {
                vertices,
                degree,
                iters,
                seed,
            } => Workload::PageRank {
                vertices,
                degree,
                iters,
                seed,
            },
            Kind::Quicksort { elements, seed } => Workload::QuickSort { elements, seed },
            Kind::Mix {
                scan_pages,
                polluter_pages,
                polluter_share,
                seed,
            } => Workload::Mix {
                scan_pages,
                polluter_pages,
                polluter_share,
                seed,
            },
            Kind::TwoStream { pages } => Workload::TwoStream { pages },
        }
    }
}

/// Streams records to the chosen encoder, keeping the first I/O error.
fn write_all(w: &mut dyn Write, workload: &Workload, format: FormatArg) -> anyhow::Result<u64> {
    let mut count = 0u64;
    let mut io_err = None;
    match format {
        FormatArg::Text => {
            text::write_header(w, text::Fields::default())?;
            workload.generate(&mut |key, page| {
                if io_err.is_none() {
                    let r = Record {
                        key,
                        page,
                        time: count,
                        write: false,
                    };
                    io_err = text::write_record(w, &r, text::Fields::default()).err();
                    count += 1;
                }
            })?;
        }
        FormatArg::Binary => {
            let mut bw = binary::Writer::new(&mut *w, false)?;
            workload.generate(&mut |key, page| {
                if io_err.is_none() {
                    io_err = bw
                        .write(&Record {
                            key,
                            page,
                            time: count,
                            write: false,
                        })
                        .err();
                    count += 1;
                }
            })?;
            bw.finish()?;
        }
    }
    if let Some(e) = io_err {
        return Err(e).context("writing the trace");
    }
    w.flush().context("writing the trace")?;
    Ok(count)
}

pub fn run(args: GenArgs) -> anyhow::Result<()> {
    let workload = args.kind.workload();
    workload.validate()?;
    let count = if args.out.as_os_str() == "-" {
        let stdout = std::io::stdout();
        let mut w = BufWriter::new(stdout.lock());
        write_all(&mut w, &workload, args.format)?
    } else {
        let f =
            File::create(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
        let mut w = BufWriter::with_capacity(1 << 20, f);
        let n = write_all(&mut w, &workload, args.format)
            .with_context(|| format!("writing {}", args.out.display()))?;
        eprintln!("farvm-lab: wrote {n} records to {}", args.out.display());
        n
    };
    tracing::info!(records = count, "trace generated");
    Ok(())
}
