#!/usr/bin/env bash
# Builds the test guest by hand (images/build.rs does the same for `cargo build`):
# the ring-3 program first, then the kernel that embeds it. Output: the kernel ELF path.
#   images/testguest/build.sh [TARGET_DIR]     (default: images/testguest/target)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
target="${1:-$here/target}"
unset RUSTFLAGS CARGO_ENCODED_RUSTFLAGS CARGO_TARGET_DIR CARGO_BUILD_TARGET RUSTC_WRAPPER \
      RUSTC_WORKSPACE_WRAPPER CARGO_MAKEFLAGS
(cd "$here/user" && cargo build --release --target-dir "$target/user")
user_elf="$target/user/x86_64-unknown-linux-gnu/release/farvm-testguest-user"
(cd "$here/kernel" && FARVM_USER_ELF="$user_elf" cargo build --release --target-dir "$target/kernel")
echo "$target/kernel/x86_64-unknown-linux-gnu/release/farvm-testguest-kernel"
