//! Links the kernel freestanding with kernel.ld (VMA 0xFFFFFFFF80100000, LMA 0x100000) and
//! embeds the ring-3 program whose path is in FARVM_USER_ELF (set by images/build.rs or
//! ../build.sh).
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    for arg in [
        "-nostartfiles",
        "-nostdlib",
        "-static",
        "-no-pie",
        "-Wl,--build-id=none",
        "-Wl,-z,norelro",
        "-Wl,-z,max-page-size=4096",
        "-Wl,--gc-sections",
    ] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
    println!("cargo:rustc-link-arg-bins=-Wl,-T,{dir}/kernel.ld");
    println!("cargo:rerun-if-changed=kernel.ld");
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=FARVM_USER_ELF");
    match std::env::var("FARVM_USER_ELF") {
        Ok(p) if std::path::Path::new(&p).is_file() => {
            println!("cargo:rustc-env=FARVM_USER_ELF={p}");
        }
        _ => panic!(
            "FARVM_USER_ELF must name the built ring-3 program (build the test guest with \
             images/testguest/build.sh or through the farvm-images crate)"
        ),
    }
}
