//! `farvm trace`: generate page-access traces and replay them through prefetchers.

use clap::Args;

#[derive(Args, Debug)]
pub struct TraceArgs {}

pub fn run(_args: TraceArgs) -> anyhow::Result<()> {
    anyhow::bail!("farvm trace is not implemented yet")
}
