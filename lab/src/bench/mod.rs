//! `farvm-lab bench`: benchmarks printed as tables of ratios against a baseline measured in the
//! same run. One module per subcommand; `remote/` also holds the remote-memory cell runner the
//! A/B benches (`ab.rs`) build on.

mod ab;
mod compare;
mod local;
mod memserver;
mod page_cycle;
mod page_space;
mod placement;
mod pool;
mod qemu_migrate;
mod remote;
mod stage2;

use anyhow::Result;
use clap::{Args, Subcommand};

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub which: BenchCmd,
}

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Guest (test guest, local memory) vs native time for each workload.
    #[command(long_about = local::LOCAL_ABOUT)]
    Local(local::LocalArgs),
    /// Remote memory: workloads x local share x prefetcher vs all-local and the TCP floor.
    #[command(long_about = remote::REMOTE_ABOUT)]
    Remote(remote::RemoteArgs),
    /// Fault path pinned to one CPU vs left to the scheduler, and the host's wake-up costs.
    #[command(long_about = placement::PLACEMENT_ABOUT)]
    Placement(placement::PlacementArgs),
    /// Prefetching on guest-virtual vs guest-physical page numbers, two frame layouts.
    #[command(name = "page-space", long_about = page_space::PAGE_SPACE_ABOUT)]
    PageSpace(page_space::PageSpaceArgs),
    /// One page cycle of KVM-mapped guest memory: memfd + CONTINUE vs anonymous + UFFDIO_MOVE.
    #[command(name = "page-cycle", long_about = page_cycle::PAGE_CYCLE_ABOUT)]
    PageCycle(page_cycle::PageCycleArgs),
    /// Guest-visible page access: no prefetch, prefetch with stage-2 pre-fault off, and on.
    #[command(long_about = stage2::STAGE2_ABOUT)]
    Stage2(stage2::Stage2Args),
    /// farvm vs kernel swap (zram, loop swapfile) under a memory cgroup, and all-local.
    #[command(long_about = compare::COMPARE_ABOUT)]
    Compare(compare::CompareArgs),
    /// One memory server: 4 KiB reads vs a raw TCP floor, or TCP vs RDMA (`--rdma IP`).
    #[command(long_about = memserver::MEMSERVER_ABOUT)]
    Memserver(memserver::MemserverArgs),
    /// A memory pool: 1..8 concurrent VMs on 1..4 memory servers, paging rate and latency.
    #[command(long_about = pool::POOL_ABOUT)]
    Pool(pool::PoolArgs),
    /// QEMU's pre-copy live migration and save to a file of the test guest, through QMP.
    #[command(name = "qemu-migrate", long_about = qemu_migrate::QEMU_MIGRATE_ABOUT)]
    QemuMigrate(qemu_migrate::QemuMigrateArgs),
}

pub fn run(a: BenchArgs) -> Result<()> {
    match a.which {
        BenchCmd::Local(l) => local::run(l),
        BenchCmd::Remote(r) => remote::run(r),
        BenchCmd::Placement(p) => placement::run(p),
        BenchCmd::PageSpace(p) => page_space::run(p),
        BenchCmd::PageCycle(p) => page_cycle::run(p),
        BenchCmd::Stage2(s) => stage2::run(s),
        BenchCmd::Compare(c) => compare::run(c),
        BenchCmd::Pool(p) => pool::run(p),
        BenchCmd::Memserver(m) => memserver::run(m),
        BenchCmd::QemuMigrate(q) => qemu_migrate::run(q),
    }
}
