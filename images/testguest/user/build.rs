//! Links the ring-3 program freestanding with user.ld (at 0x400000).
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
    println!("cargo:rustc-link-arg-bins=-Wl,-T,{dir}/user.ld");
    println!("cargo:rerun-if-changed=user.ld");
    println!("cargo:rerun-if-changed=build.rs");
}
