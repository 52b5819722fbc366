#!/usr/bin/env bash
# Builds the farvm guest agent for the KVM lab's Debian kernel, reproducibly, outside the clone:
#   farvm_agent.ko   the kernel module, against the kernel's Debian headers
#                    (linux-headers-<version> from the lab's suite, via `scripts/kvm-lab headers`)
#   farvm-agentd     the process-table daemon, a static x86-64 binary (runs in any guest)
#   farvm-workload   farvm's workloads as a static program (`farvm-workload seq:ws=32M`), for
#                    guests that need processes touching memory (tests, demonstrations)
#
# USAGE
#   guest-agent/linux/build.sh [--kdir DIR] [--out DIR]
#     --kdir DIR   a kernel build tree to build the module against instead of the lab kernel's
#     --out DIR    where to put farvm_agent.ko and farvm-agentd
#                  [${FARVM_AGENT_CACHE:-${XDG_CACHE_HOME:-~/.cache}/farvm/guest-agent}/<kernel release>]
# Prints the output directory on stdout. Needs make, the kernel's compiler (gcc-12 for Debian
# bookworm kernels), pahole (dwarves) and cargo.
set -Eeuo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
KDIR="" OUT=""
while (($#)); do
    case $1 in
    --kdir) KDIR=${2:?--kdir DIR}; shift 2 ;;
    --out) OUT=${2:?--out DIR}; shift 2 ;;
    -h | --help) sed -n '2,/^set -Eeuo/{/^set -Eeuo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "build.sh: unknown argument $1 (--help)" >&2; exit 64 ;;
    esac
done
[[ -n $KDIR ]] || KDIR=$("$REPO/scripts/kvm-lab" headers) || { echo "build.sh: cannot get the lab kernel's headers" >&2; exit 1; }
[[ -f $KDIR/Makefile ]] || { echo "build.sh: $KDIR is not a kernel build tree (no Makefile)" >&2; exit 1; }
KREL=$(make -s -C "$KDIR" kernelrelease 2>/dev/null || basename "$KDIR")
OUT=${OUT:-${FARVM_AGENT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/farvm/guest-agent}/$KREL}
mkdir -p "$OUT/module"
OUT=$(cd "$OUT" && pwd -P)
# One builder per output directory at a time: tests run concurrently, and a second build would
# delete the module directory under the first one's Kbuild. A second caller waits, then rebuilds
# the same bytes.
exec 7>"$OUT/.lock"
flock 7

# Same inputs, same bytes: fixed timestamps and build paths.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo 0)}
export KBUILD_BUILD_TIMESTAMP="@$SOURCE_DATE_EPOCH" KBUILD_BUILD_USER=farvm KBUILD_BUILD_HOST=farvm
# The module is built in a copy of its sources (Kbuild writes next to them).
rm -rf "$OUT/module"
mkdir -p "$OUT/module"
cp "$HERE"/Kbuild "$HERE"/farvm_agent.c "$HERE"/farvm_agent_abi.h "$OUT/module/"
make -s -C "$KDIR" M="$OUT/module" modules >&2
cp "$OUT/module/farvm_agent.ko" "$OUT/farvm_agent.ko"

# The daemon: static (glibc with crt-static), its own target directory so these flags do not
# invalidate the workspace's build.
static_build() {
    RUSTFLAGS="-C target-feature=+crt-static --remap-path-prefix=$REPO=." \
        cargo build -q --release --locked --target x86_64-unknown-linux-gnu \
        --manifest-path "$REPO/Cargo.toml" --target-dir "$OUT/cargo" "$@" >&2
}
static_build -p farvm-agentd
cp "$OUT/cargo/x86_64-unknown-linux-gnu/release/farvm-agentd" "$OUT/farvm-agentd"
static_build -p farvm-workloads --features std --example native
cp "$OUT/cargo/x86_64-unknown-linux-gnu/release/examples/native" "$OUT/farvm-workload"
echo "$OUT"
