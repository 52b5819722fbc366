//! Declares the bench's opt-in cfg, `farvm_bench_aws_lc` (Cargo.toml says why it is a cfg).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(farvm_bench_aws_lc)");
}
