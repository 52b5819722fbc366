//! `farvm-pool`: the memory pool's operator commands, for hosts without the VMM (the same
//! commands as `farvm pool`; see `farvm_pool::cli`).

use clap::Parser;

use farvm_pool::cli::{PoolArgs, POOL_ABOUT};

#[derive(Parser, Debug)]
#[command(name = "farvm-pool", version, about = "farvm memory pool: servers, VMs, placement, drain and garbage collection in etcd", long_about = POOL_ABOUT)]
struct Cli {
    #[command(flatten)]
    args: PoolArgs,
}

fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    // Bad arguments exit 64 (EX_USAGE), as `farvm`'s do; --help and --version 0.
    let cli = Cli::try_parse().unwrap_or_else(|e| {
        let _ = e.print();
        std::process::exit(if e.use_stderr() { 64 } else { 0 });
    });
    match farvm_pool::cli::run(cli.args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("farvm-pool: error: {e:#}");
            std::process::ExitCode::from(farvm_pool::cli::exit_status(&e) as u8)
        }
    }
}
