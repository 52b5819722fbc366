//! `farvm`: the command-line front end. Each subcommand lives in `cli/<name>.rs`; this file only
//! parses arguments, sets up logging and maps errors to exit codes.

mod cli;

use clap::{Parser, Subcommand};

/// farvm — virtual machines whose memory lives on remote memory servers.
///
/// farvm runs KVM guests whose RAM is only partly local: the rest lives on memory servers
/// elsewhere in the rack, fetched on demand and prefetched ahead of the guest.
#[derive(Parser, Debug)]
#[command(name = "farvm", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// Log filter (tracing-subscriber syntax), e.g. `info`, `farvm_ept=debug`.
    #[arg(long, global = true, env = "FARVM_LOG", default_value = "warn")]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Evaluate prefetchers on page-access traces (generate traces, replay them).
    Trace(cli::trace::TraceArgs),
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Trace(args) => cli::trace::run(args),
    };
    if let Err(err) = result {
        eprintln!("farvm: error: {err:#}");
        std::process::exit(1);
    }
}
