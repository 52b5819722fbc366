//! The engine benchmark's sequential (and stride-3) re-read replayed through the engine model
//! (`eval::engine`), for several read latencies and engine limits:
//! `cargo run --release -p farvm-prefetch --example engine_model`.
//! Environment: `LOCAL` (frames, 4096), `INFL` (prefetch reads in flight, 128), `DCAP`
//! (deferral queue, 1024), `DAGE` (deferral age limit in accesses, 2048).

use farvm_prefetch::eval::engine::{replay_engine, EngineModelConfig};
use farvm_prefetch::trace::Trace;
use farvm_prefetch::{build, Config};

fn env(k: &str, d: u64) -> u64 {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

fn main() {
    let n = 16384u64;
    let base = EngineModelConfig {
        local_pages: env("LOCAL", 4096) as usize,
        max_inflight: env("INFL", 128) as usize,
        defer_cap: env("DCAP", 1024) as usize,
        defer_max_age: env("DAGE", 2048),
        ..EngineModelConfig::default()
    };
    println!("write pass (zero fills) then re-read of {n} pages; {base:?}\n");
    println!("| pattern | prefetcher | latency | markers | demand faults | late hits | proposals | redundant | deferred | dropped | evicted unused | ticks |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for stride in [1u64, 3] {
        let pass: Vec<u64> = (0..n).map(|i| (i * stride) % n).collect();
        let t = Trace::from_pairs(pass.iter().chain(pass.iter()).map(|&p| (1, p)));
        for name in ["none", "next-n", "stream", "leap+stream"] {
            for latency in [64u64, 256, 1024] {
                for mc in [true, false] {
                    let cfg = EngineModelConfig {
                        latency,
                        marker_continuation: mc,
                        ..base
                    };
                    let mut pf = build(name, &Config::default()).expect("prefetcher");
                    let s = replay_engine(&t, pf.as_mut(), &cfg).expect("replay");
                    println!(
                        "| stride {stride} | {name} | {latency} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                        if mc { "on_marker_hit" } else { "on_hit" },
                        s.demand_faults,
                        s.late_hits,
                        s.proposals,
                        s.redundant,
                        s.deferred,
                        s.dropped,
                        s.evicted_unused,
                        s.ticks
                    );
                }
            }
        }
    }
}
