//! `farvm`: the operator's command-line front end (`run`, `status`, `stats`, `shutdown`, `rotate-key`, `snapshot`, `pool`, `api`,
//! and, started as `cloud-hypervisor`, libvirt's VMM). Each subcommand lives in
//! `cli/<name>.rs`; this file only parses arguments, sets up logging and maps errors to exit
//! codes. Benchmarks and trace tools are the lab's (`farvm-lab`).

mod cli;

use clap::{Parser, Subcommand};
use farvm_vmm::exit_code;

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
    /// Boot a VM (the built-in test guest by default) and run workloads in it.
    #[command(long_about = cli::run::LONG_ABOUT)]
    Run(Box<cli::run::RunArgs>),
    /// Print a running VM's statistics (from its control socket).
    #[command(long_about = cli::control::STATS_ABOUT)]
    Stats(cli::control::StatsArgs),
    /// Print a running VM's status (vCPUs, current guest pids, memory).
    #[command(long_about = cli::control::STATUS_ABOUT)]
    Status(cli::control::StatusArgs),
    /// Shut a running VM down cleanly (through its control socket).
    #[command(long_about = cli::control::SHUTDOWN_ABOUT)]
    Shutdown(cli::control::ShutdownArgs),
    /// Rotate a running VM's page key (old pages re-sealed, then the old key dropped).
    #[command(long_about = cli::control::ROTATE_KEY_ABOUT)]
    RotateKey(cli::control::RotateKeyArgs),
    /// Save a running VM into a snapshot directory and stop it (`run --restore` resumes it).
    #[command(long_about = cli::snapshot::SNAPSHOT_ABOUT)]
    Snapshot(cli::snapshot::SnapshotArgs),
    /// Live-migrate a running pool VM to another host (`run --incoming` waits for it there).
    #[command(long_about = cli::migrate::MIGRATE_ABOUT)]
    Migrate(cli::migrate::MigrateArgs),
    /// The memory pool: status, gc, drain, rebalance (etcd at --etcd URL or $FARVM_POOL).
    #[command(long_about = farvm_pool::cli::POOL_ABOUT)]
    Pool(farvm_pool::cli::PoolArgs),
    /// Guest images built into farvm (`farvm image export DIR`: the test-guest kernel).
    #[command(long_about = cli::image::IMAGE_ABOUT)]
    Image(cli::image::ImageArgs),
    /// Serve Cloud Hypervisor's REST API for one VM (what libvirt's ch driver drives).
    #[command(long_about = cli::api::API_ABOUT)]
    Api(cli::api::ApiArgs),
}

fn main() {
    farvm_vmm::signals::default_sigpipe();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if let Some(code) = cli::cloud_hypervisor::answer(&args) {
        std::process::exit(code);
    }
    let cli: Cli = exit_code::parse_args_from(args);
    if matches!(cli.command, Command::Run(_) | Command::Api(_)) {
        farvm_vmm::signals::ignore_sigpipe();
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Run(args) => cli::run::run(*args),
        Command::Stats(args) => cli::control::stats(args).map(|()| 0),
        Command::Status(args) => cli::control::status(args).map(|()| 0),
        Command::Shutdown(args) => cli::control::shutdown(args).map(|()| 0),
        Command::RotateKey(args) => cli::control::rotate_key(args).map(|()| 0),
        Command::Snapshot(args) => cli::snapshot::run(args).map(|()| 0),
        Command::Migrate(args) => cli::migrate::run(args).map(|()| 0),
        Command::Image(args) => cli::image::run(args).map(|()| 0),
        Command::Pool(args) => farvm_pool::cli::run(args).map(|()| 0).map_err(|e| {
            let code = farvm_pool::cli::exit_status(&e);
            cli::Failure::new(code, format!("{e:#}")).into()
        }),
        Command::Api(args) => cli::api::run(args),
    };
    match result {
        Ok(code) => std::process::exit(code),
        Err(err) => {
            eprintln!("farvm: error: {}", exit_code::error_chain(&*err));
            let code = err.downcast_ref::<cli::Failure>().map_or(1, |f| f.code);
            std::process::exit(code);
        }
    }
}
