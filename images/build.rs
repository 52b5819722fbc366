//! Builds the test guest (images/testguest, its own cargo workspace) and hands the kernel ELF to
//! `lib.rs` through `FARVM_TESTGUEST_ELF`.
//!
//! Two nested `cargo build --release` runs, each from its crate's directory so that its
//! `.cargo/config.toml` (kernel: no SSE, kernel code model; user: SSE on) applies: first the
//! ring-3 program, then the kernel, which embeds it (`FARVM_USER_ELF`). Each gets its own target
//! directory under OUT_DIR. The environment cargo gives build scripts (RUSTFLAGS, the outer
//! target dir, wrappers such as clippy-driver, the jobserver, ...) is cleared so the nested
//! builds see only their own configuration; the toolchain is the one pinned by
//! rust-toolchain.toml (found from the nested crates' directories).

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    let tg = manifest.join("testguest");
    let root = manifest
        .parent()
        .expect("images/ has a parent")
        .to_path_buf();

    for p in [
        tg.join("Cargo.toml"),
        tg.join("Cargo.lock"),
        tg.join("build.sh"),
        tg.join("rt"),
        tg.join("user/src"),
        tg.join("user/build.rs"),
        tg.join("user/user.ld"),
        tg.join("user/Cargo.toml"),
        tg.join("user/.cargo/config.toml"),
        tg.join("kernel/src"),
        tg.join("kernel/build.rs"),
        tg.join("kernel/kernel.ld"),
        tg.join("kernel/Cargo.toml"),
        tg.join("kernel/.cargo/config.toml"),
        manifest.join("workloads/src"),
        manifest.join("workloads/Cargo.toml"),
        root.join("guest-agent/src"),
        root.join("guest-agent/Cargo.toml"),
        root.join("rust-toolchain.toml"),
    ] {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let user_target = out.join("user-target");
    build(&cargo, &tg.join("user"), &user_target, &[]);
    let user_elf = user_target.join("x86_64-unknown-linux-gnu/release/farvm-testguest-user");
    let kernel_target = out.join("kernel-target");
    build(
        &cargo,
        &tg.join("kernel"),
        &kernel_target,
        &[("FARVM_USER_ELF", user_elf.as_os_str())],
    );
    let kernel_elf = kernel_target.join("x86_64-unknown-linux-gnu/release/farvm-testguest-kernel");
    let dest = out.join("testguest.elf");
    std::fs::copy(&kernel_elf, &dest).unwrap_or_else(|e| {
        panic!(
            "copying {} to {}: {e}",
            kernel_elf.display(),
            dest.display()
        )
    });
    println!("cargo:rustc-env=FARVM_TESTGUEST_ELF={}", dest.display());
    println!(
        "cargo:rustc-env=FARVM_TESTGUEST_USER_ELF={}",
        user_elf.display()
    );
}

/// `cargo build --release` in `dir` with a clean environment.
fn build(cargo: &std::ffi::OsStr, dir: &Path, target: &Path, extra: &[(&str, &std::ffi::OsStr)]) {
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir)
        .args(["build", "--release", "--target-dir"])
        .arg(target);
    // Keep cargo's home, registry and terminal settings; drop everything cargo set for this
    // build script or that changes how rustc is invoked.
    for (k, _) in env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        let keep = matches!(k, "CARGO_HOME" | "CARGO_NET_OFFLINE" | "CARGO_TERM_COLOR")
            || k.starts_with("CARGO_HTTP_")
            || k.starts_with("CARGO_REGISTRIES_")
            || k.starts_with("CARGO_NET_");
        let drop = k.starts_with("CARGO_")
            || k.starts_with("RUSTC")
            || k.starts_with("RUSTDOC")
            || k.starts_with("DEP_")
            || matches!(
                k,
                "RUSTFLAGS"
                    | "MAKEFLAGS"
                    | "MFLAGS"
                    | "TARGET"
                    | "HOST"
                    | "OUT_DIR"
                    | "PROFILE"
                    | "OPT_LEVEL"
                    | "DEBUG"
                    | "NUM_JOBS"
                    | "CLIPPY_ARGS"
                    | "CLIPPY_CONF_DIR"
                    | "LLVM_PROFILE_FILE"
            );
        if drop && !keep {
            cmd.env_remove(k);
        }
    }
    for (k, v) in extra {
        cmd.env(k, v);
    }
    let output = cmd.output().unwrap_or_else(|e| {
        panic!(
            "cannot run cargo for the test guest in {}: {e}",
            dir.display()
        )
    });
    if !output.status.success() {
        panic!(
            "building the test guest in {} failed ({}):\n{}",
            dir.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
