//! Runs workloads natively and prints name, time, ops and checksum — the same numbers the test
//! guest reports for the same spec, for quick comparisons by hand:
//!
//! `cargo run --release -p farvm-workloads --features std --example native -- seq:ws=64M kv`
use farvm_workloads::{parse_spec, run, StdEnv};

fn main() {
    let specs: Vec<String> = std::env::args().skip(1).collect();
    if specs.is_empty() {
        eprintln!("usage: native SPEC... (e.g. seq:ws=64M,passes=4)");
        std::process::exit(2);
    }
    println!(
        "{:<16} {:>12} {:>12} {:>18}",
        "workload", "time_ms", "ops", "checksum"
    );
    for s in &specs {
        let spec = match parse_spec(s) {
            Ok(spec) => spec,
            Err(e) => {
                eprintln!("native: {e}");
                std::process::exit(2);
            }
        };
        let mut heap = vec![0u64; (spec.ws_bytes.div_ceil(4096) * 512) as usize];
        match run(
            spec.workload.id,
            &spec.params(),
            &mut heap,
            &mut StdEnv::default(),
        ) {
            Ok(o) => println!(
                "{:<16} {:>12.3} {:>12} {:#018x}",
                spec.workload.name,
                o.elapsed_ns as f64 / 1e6,
                o.ops,
                o.checksum
            ),
            Err(e) => println!("{:<16} error: {e}", spec.workload.name),
        }
    }
}
