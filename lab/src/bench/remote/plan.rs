//! The matrix `farvm-lab bench remote` runs: workloads (as given and placed), local shares and
//! prefetchers (the options, or the full or `--quick` defaults), checked before any VM starts.

use std::time::Duration;

use anyhow::{bail, Result};
use farvm_vmm::workload_spec::{plan, PlacedWorkload};

use super::runner::CellSetup;
use super::RemoteArgs;

const DEFAULT_WORKLOADS: [&str; 8] = [
    "seq:ws=32M",
    "stride:ws=32M",
    "random:ws=32M,ops=100000",
    "matmul:ws=8M",
    "matmul-blocked:ws=8M",
    "kv:ws=32M,ops=100000",
    "pagerank:ws=32M,iters=2",
    "quicksort:ws=16M",
];
const QUICK_WORKLOADS: [&str; 3] = ["seq:ws=32M", "stride:ws=32M", "kv:ws=32M,ops=100000"];
const DEFAULT_LOCALS: [f64; 3] = [100.0, 50.0, 25.0];
const QUICK_LOCALS: [f64; 2] = [100.0, 25.0];
const DEFAULT_PREFETCHERS: [&str; 7] = [
    "none",
    "read-ahead",
    "next-n",
    "stride",
    "leap",
    "stream",
    "leap+stream",
];
const QUICK_PREFETCHERS: [&str; 3] = ["none", "next-n", "leap+stream"];

/// The checked matrix of one invocation.
pub(super) struct Matrix {
    /// The workloads as given (or defaulted), for the report.
    pub specs: Vec<String>,
    pub placed: Vec<PlacedWorkload>,
    /// Each workload's boot blob (a `replay:trace=` spec's trace; empty otherwise).
    pub blobs: Vec<&'static [u8]>,
    /// Local memory shares, percent of the footprint.
    pub locals: Vec<f64>,
    pub prefetchers: Vec<String>,
    /// Runs per cell and per all-local baseline.
    pub repeat: usize,
    pub setup: CellSetup,
    /// `--cell-timeout` as given, seconds.
    pub cell_timeout_secs: u64,
    /// `--sealing-pairs`: every cell's runs also with sealing off.
    pub sealing_pairs: bool,
}

impl Matrix {
    /// The matrix `a` asks for; an error names the option that is wrong.
    pub fn new(a: &RemoteArgs) -> Result<Matrix> {
        let specs: Vec<String> = match (a.workloads.is_empty(), a.quick) {
            (false, _) => a.workloads.clone(),
            (true, true) => QUICK_WORKLOADS.iter().map(|s| s.to_string()).collect(),
            (true, false) => DEFAULT_WORKLOADS.iter().map(|s| s.to_string()).collect(),
        };
        let locals: Vec<f64> = match (a.locals.is_empty(), a.quick) {
            (false, _) => a.locals.clone(),
            (true, true) => QUICK_LOCALS.to_vec(),
            (true, false) => DEFAULT_LOCALS.to_vec(),
        };
        for l in &locals {
            if !(*l > 0.0 && *l <= 100.0) {
                bail!("--local {l}: must be a percentage in (0, 100]");
            }
        }
        let repeat = a.repeat.max(1) as usize;
        let prefetchers: Vec<String> = match (a.prefetchers.is_empty(), a.quick) {
            (false, _) => a.prefetchers.clone(),
            (true, true) => QUICK_PREFETCHERS.iter().map(|s| s.to_string()).collect(),
            (true, false) => DEFAULT_PREFETCHERS.iter().map(|s| s.to_string()).collect(),
        };
        for p in &prefetchers {
            if !farvm_prefetch::registry::names().contains(&p.as_str()) {
                bail!(
                    "unknown --prefetcher `{p}` (known: {})",
                    farvm_prefetch::registry::names().join(", ")
                );
            }
        }
        farvm_vmm::affinity::check_fault_path_cpu(a.fault_path_cpu).map_err(anyhow::Error::msg)?;
        let setup = CellSetup {
            fault_path_cpu: a.fault_path_cpu,
            page_space: a.page_space,
            ..CellSetup::default()
        };
        // One VM per workload: each spec is placed alone, a replayed trace with its blob.
        let mut placed = Vec::with_capacity(specs.len());
        let mut blobs = Vec::with_capacity(specs.len());
        for s in &specs {
            let p = plan(std::slice::from_ref(s), 1).map_err(anyhow::Error::msg)?;
            if p.workloads.len() != 1 {
                bail!(
                    "--workload {s}: the trace has {} processes; bench remote runs one process \
                     per VM (replay a single-process trace)",
                    p.workloads.len()
                );
            }
            placed.extend(p.workloads);
            // Leaked once per bench invocation: the cells of this workload share it.
            blobs.push(&*Box::leak(p.blob.into_boxed_slice()));
        }
        Ok(Matrix {
            specs,
            placed,
            blobs,
            locals,
            prefetchers,
            repeat,
            setup,
            cell_timeout_secs: a.cell_timeout,
            sealing_pairs: a.sealing_pairs,
        })
    }

    /// How long one remote-memory VM may run.
    pub fn cell_timeout(&self) -> Duration {
        Duration::from_secs(self.cell_timeout_secs.max(1))
    }

    /// Whether the footprint run of a workload stands as its (100%, none) cell.
    pub fn reuses_footprint_run(&self) -> bool {
        self.locals.iter().any(|&l| l >= 100.0) && self.prefetchers.iter().any(|p| p == "none")
    }

    /// VMs the matrix boots. Per workload: all-local, the footprint run (reused as the
    /// (100%, none) cell if the matrix has one), and the matrix (twice with sealing pairs).
    pub fn vm_runs(&self) -> usize {
        let reused = usize::from(self.reuses_footprint_run());
        let cells = self.locals.len() * self.prefetchers.len() * self.repeat;
        let pairs = if self.sealing_pairs { cells } else { 0 };
        self.placed.len() * (self.repeat + 1 + cells - reused + pairs)
    }
}
