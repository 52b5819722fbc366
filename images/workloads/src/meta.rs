//! The workload table: ids, CLI names, access patterns and named parameters with defaults.
//!
//! Ids are `farvm_guest_agent::boot::workload`; `ProcessSpec::params[i]` carries the i-th
//! named parameter, 0 meaning its default.

pub use farvm_guest_agent::boot::workload as id;

use crate::Params;

/// One named parameter of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    /// Its key in a workload spec.
    pub name: &'static str,
    /// Used when the plan passes 0.
    pub default: u64,
    /// One line for `--help`.
    pub help: &'static str,
}

/// One workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkloadInfo {
    /// Its id in the guest ABI (`farvm_guest_agent::boot::workload`).
    pub id: u32,
    /// CLI name (`--workload NAME:...`).
    pub name: &'static str,
    /// One line: what it computes.
    pub summary: &'static str,
    /// How it touches memory (what a prefetcher sees).
    pub pattern: &'static str,
    /// Named parameters, in `ProcessSpec::params` order (at most 4).
    pub params: &'static [ParamInfo],
    /// Working set when the spec gives no `ws`.
    pub default_ws: u64,
    /// Smallest accepted working set.
    pub min_ws: u64,
    /// False for workloads that only make sense in the guest (`crash`).
    pub native: bool,
}

const MIB: u64 = 1 << 20;

const fn p(name: &'static str, default: u64, help: &'static str) -> ParamInfo {
    ParamInfo {
        name,
        default,
        help,
    }
}

/// Every workload, in id order.
pub static WORKLOADS: &[WorkloadInfo] = &[
    WorkloadInfo {
        id: id::SEQ_SCAN,
        name: "seq",
        summary: "sequential scan of the working set (sum, or read-modify-write)",
        pattern: "ascending 8-byte words over the whole working set, `passes` times",
        params: &[
            p("passes", 4, "measured passes over the working set"),
            p("write", 0, "0 = read-only passes, 1 = read-modify-write passes"),
            p(
                "verify",
                0,
                "1 = check every word read against what the scan wrote (write=1 only)",
            ),
        ],
        default_ws: 64 * MIB,
        min_ws: 4096,
        native: true,
    },
    WorkloadInfo {
        id: id::STRIDE,
        name: "stride",
        summary: "strided read-modify-write of one 64-byte line every `stride` bytes",
        pattern: "lines at 0, s, 2s, ... then 64, s+64, 2s+64, ...: every line once per pass, \
                  in stride order (Leap's Stride-10 with s = 40960)",
        params: &[
            p("stride", 40960, "stride in bytes (multiple of 64)"),
            p("passes", 2, "measured passes"),
        ],
        default_ws: 64 * MIB,
        min_ws: 4096,
        native: true,
    },
    WorkloadInfo {
        id: id::RANDOM_RMW,
        name: "random",
        summary: "uniform random read-modify-write of 8-byte words",
        pattern: "uniformly random words over the whole working set (no locality)",
        params: &[p("ops", 4_000_000, "measured read-modify-writes")],
        default_ws: 64 * MIB,
        min_ws: 4096,
        native: true,
    },
    WorkloadInfo {
        id: id::MATMUL_NAIVE,
        name: "matmul",
        summary: "f64 matrix multiply C = A x B, naive i-j-k loops",
        pattern: "rows of A sequentially, columns of B with an n*8-byte stride (ladder \
                  pattern), C sequentially",
        params: &[p(
            "n",
            0,
            "matrix order; 0 = the largest n with 3*n*n*8 <= ws, at most 512",
        )],
        default_ws: 8 * MIB,
        min_ws: 4096,
        native: true,
    },
    WorkloadInfo {
        id: id::MATMUL_BLOCKED,
        name: "matmul-blocked",
        summary: "f64 matrix multiply C = A x B, cache-blocked i-k-j loops",
        pattern: "block x block tiles of A, B and C, rows within tiles",
        params: &[
            p(
                "n",
                0,
                "matrix order; 0 = the largest n with 3*n*n*8 <= ws, at most 512",
            ),
            p("block", 64, "tile size"),
        ],
        default_ws: 8 * MIB,
        min_ws: 4096,
        native: true,
    },
    WorkloadInfo {
        id: id::ZIPF_KV,
        name: "kv",
        summary: "open-addressing hash table, Zipf-distributed keys, get/set mix",
        pattern: "64-byte slots hashed over the working set; hot keys (Zipf) hit a few \
                  scattered pages, the tail is random",
        params: &[
            p("ops", 2_000_000, "measured operations"),
            p("keys", 0, "distinct keys; 0 = half the slots (load factor 0.5)"),
            p("theta", 990, "Zipf exponent x 1000 (990 = 0.99)"),
            p("set_pct", 5, "percent of operations that are sets (rest: gets)"),
        ],
        default_ws: 64 * MIB,
        min_ws: 8192,
        native: true,
    },
    WorkloadInfo {
        id: id::PAGERANK,
        name: "pagerank",
        summary: "PageRank (pull, damping 0.85) on an R-MAT power-law graph in CSR",
        pattern: "sequential over CSR offsets/edges and ranks, random gathers of source \
                  contributions (power-law: hot low vertex ids)",
        params: &[
            p("iters", 5, "measured PageRank iterations"),
            p("degree", 8, "average degree (edges = degree << scale)"),
            p("scale", 0, "log2 vertices; 0 = the largest that fits in ws"),
        ],
        default_ws: 64 * MIB,
        min_ws: 64 * 1024,
        native: true,
    },
    WorkloadInfo {
        id: id::QUICKSORT,
        name: "quicksort",
        summary: "in-place quicksort of ws/4 random u32",
        pattern: "two converging sequential streams per partition, recursing into \
                  ever smaller ranges",
        params: &[],
        default_ws: 64 * MIB,
        min_ws: 4096,
        native: true,
    },
    WorkloadInfo {
        id: id::REPLAY,
        name: "replay",
        summary: "replays one process of a page-access trace (the boot blob) over its footprint",
        pattern: "the traced program's own: its pages in trace order, reads and writes as \
                  recorded (`farvm run --workload replay:trace=FILE` makes the blob)",
        params: &[
            p("section", 0, "the trace process to replay (set by the VMM, one per process)"),
            p("passes", 1, "times the trace is replayed in the measured phase"),
        ],
        default_ws: 0,
        min_ws: 0,
        native: true,
    },
    WorkloadInfo {
        id: id::SPARSE,
        name: "sparse",
        summary: "writes `pages` pages spread over the working set, then rewrites them; \
                  the rest of the working set is never touched",
        pattern: "one page in each of `pages` equal stretches of the working set, at a \
                  seeded offset; ascending and descending passes",
        params: &[
            p("pages", 1024, "pages touched (at most ws / 4096)"),
            p("passes", 2, "measured read-modify-write passes over those pages"),
        ],
        default_ws: 64 * MIB,
        min_ws: 4096,
        native: true,
    },
    WorkloadInfo {
        id: id::ISOLATION,
        name: "isolation",
        summary: "writes a per-process tag over the heap, yields, verifies it (isolation check)",
        pattern: "sequential writes then sequential reads, `rounds` times, yielding between",
        params: &[p("rounds", 4, "write/yield/verify rounds")],
        default_ws: 4 * MIB,
        min_ws: 4096,
        native: true,
    },
    WorkloadInfo {
        id: id::CRASH,
        name: "crash",
        summary: "faults in ring 3 on purpose; the kernel must kill only this process",
        pattern: "none",
        params: &[p(
            "kind",
            0,
            "0 = #PF (write to an unmapped page), 1 = #UD, 2 = #DE, 3 = #GP (privileged instruction); \
             passed as-is (0 is a valid kind)",
        )],
        default_ws: 4096,
        min_ws: 0,
        native: false,
    },
    WorkloadInfo {
        id: id::INT_OPS,
        name: "intops",
        summary: "dependent integer arithmetic, no memory (CPU-bound, for preemption tests)",
        pattern: "none (registers only)",
        params: &[p("iters", 100_000_000, "loop iterations")],
        default_ws: 0,
        min_ws: 0,
        native: true,
    },
];

/// The workload with CLI name `name`.
pub fn find_by_name(name: &str) -> Option<&'static WorkloadInfo> {
    WORKLOADS.iter().find(|w| w.name == name)
}

/// The workload with id `id`.
pub fn find_by_id(id: u32) -> Option<&'static WorkloadInfo> {
    WORKLOADS.iter().find(|w| w.id == id)
}

/// The i-th named parameter's value (its default when the plan passes 0; 0 if no such param).
pub fn param(info: &WorkloadInfo, p: &Params, i: usize) -> u64 {
    match (p.params.get(i), info.params.get(i)) {
        (Some(&v), Some(_)) if v != 0 => v,
        (_, Some(pi)) => pi.default,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for (i, w) in WORKLOADS.iter().enumerate() {
            assert!(w.params.len() <= 4, "{}", w.name);
            assert_eq!(find_by_id(w.id), Some(w));
            assert_eq!(find_by_name(w.name), Some(w));
            for v in &WORKLOADS[i + 1..] {
                assert_ne!(w.id, v.id);
                assert_ne!(w.name, v.name);
            }
        }
        assert!(find_by_name("nope").is_none());
    }
}
