//! `farvm-lab`: the lab's command-line front end — benchmarks of VMs with remote memory
//! (`bench`, in `bench/`) and prefetcher trace tools (`trace`, in `trace/`), with their markdown
//! and JSON reports and PNG charts (`plot.rs`), and the memory pool's randomized fault tester
//! (`nemesis`, in `nemesis/`), the fuzzer of the memory server's decoder and the page sealing
//! (`fuzz`, in `fuzz/`) and the virtio devices' fuzzer (`fuzz-virtio`, in `fuzz_virtio/`). The
//! operator's binary `farvm` runs none of this.
//! This file only parses arguments, sets up logging and maps errors to exit codes.

mod bench;
mod fuzz;
mod fuzz_virtio;
mod nemesis;
mod plot;
mod trace;

use clap::{Parser, Subcommand};
use farvm_vmm::exit_code;

/// farvm-lab — benchmarks and trace tools for farvm.
///
/// farvm-lab measures farvm: it boots test-guest VMs with remote memory and reports their times
/// as ratios against baselines measured in the same run (`bench`), and evaluates prefetchers on
/// page-access traces (`trace`), runs the memory pool under randomized faults (`nemesis`), and
/// fuzzes the memory server's decoder and the page sealing (`fuzz`) and the virtio-blk and
/// virtio-net devices as a hostile guest driver (`fuzz-virtio`).
#[derive(Parser, Debug)]
#[command(name = "farvm-lab", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// Log filter (tracing-subscriber syntax), e.g. `info`, `farvm_ept=debug`.
    #[arg(long, global = true, env = "FARVM_LOG", default_value = "warn")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Benchmarks (`farvm-lab bench local`: guest vs native workload times).
    Bench(bench::BenchArgs),
    /// Evaluate prefetchers on page-access traces (generate traces, replay them).
    #[command(long_about = trace::TRACE_ABOUT)]
    Trace(trace::TraceArgs),
    /// Randomized fault tester: VMs on a memory pool under drawn faults, then invariants.
    #[command(long_about = nemesis::NEMESIS_ABOUT)]
    Nemesis(nemesis::NemesisArgs),
    /// Fuzz the memory server's request decoder and the page sealing together.
    #[command(long_about = fuzz::FUZZ_ABOUT)]
    Fuzz(fuzz::FuzzArgs),
    /// Fuzz the virtio-blk or virtio-net device with a hostile guest driver's descriptors.
    #[command(name = "fuzz-virtio", long_about = fuzz_virtio::FUZZ_VIRTIO_ABOUT)]
    FuzzVirtio(fuzz_virtio::FuzzVirtioArgs),
}

fn main() {
    farvm_vmm::signals::default_sigpipe();
    let cli: Cli = exit_code::parse_args();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Bench(args) => bench::run(args),
        Command::Trace(args) => trace::run(args),
        Command::Nemesis(args) => nemesis::run(args),
        Command::Fuzz(args) => fuzz::run(args),
        Command::FuzzVirtio(args) => fuzz_virtio::run(args),
    };
    if let Err(err) = result {
        // Every failure after parsing is a failed run (EXIT STATUS 1 in each command's help).
        eprintln!(
            "farvm-lab: error: {}",
            farvm_vmm::exit_code::error_chain(&*err)
        );
        std::process::exit(1);
    }
}
