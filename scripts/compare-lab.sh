#!/usr/bin/env bash
# compare-lab: `farvm-lab bench compare` in the KVM lab (scripts/kvm-lab), where the kernel has
# nbd and zram: farvm remote memory (loopback memserver) beside kernel swap to zram, to a loop
# swapfile on tmpfs and to an NBD device served by Debian's nbd-server over loopback TCP (the
# Infiniswap-style baseline), and QEMU under the same cgroup and swap, in one lab run. The lab
# kernel has no cgroup-v1 memory controller: the bench uses cgroup v2 there (memory.high).
#
# USAGE
#   scripts/compare-lab.sh [--out DIR] [--timeout SECS] [-- FARVM-LAB-COMPARE-ARGS...]
#     --out DIR       where compare.md/.json and the charts are copied [docs/bench/compare-lab]
#     --timeout SECS  the lab's time bound [5400]
#     --boot-timeout SECS  how long the lab may take to boot on a loaded host [1200]
#   Default bench arguments: --swap all --repeat 1 --cell-timeout 600 and the workloads
#   seq:ws=8M, stride:ws=8M. The lab is QEMU-TCG: read ratios, never times.
#
# Installs nbd-server and nbd-client (apt) when missing: the lab runs the host's binaries. Builds
# farvm, farvm-memserver and farvm-lab (release) when missing. Exit status: the lab's (CMD's
# status; 124 timeout; 125 the lab could not run).
set -euo pipefail
cd "$(dirname "$0")/.."

out=docs/bench/compare-lab
timeout=5400
boot_timeout=1200
while (($#)); do
    case "$1" in
    --out) out=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --boot-timeout) boot_timeout=$2; shift 2 ;;
    --) shift; break ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "compare-lab: unknown option $1 (see --help)" >&2; exit 64 ;;
    esac
done
args=("$@")
if ((${#args[@]} == 0)); then
    args=(--swap all --repeat 1 --cell-timeout 600 --workload seq:ws=8M --workload stride:ws=8M)
fi

need=()
for pkg in nbd-server nbd-client; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
    echo "compare-lab: installing ${need[*]}" >&2
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
for bin in farvm farvm-memserver farvm-lab; do
    if [[ ! -x target/release/$bin ]]; then
        cargo build --release -p farvm-vmm -p farvm-memserver -p farvm-lab
        break
    fi
done

# Not under /tmp: inside the lab /tmp is the lab's own tmpfs, and the output must be shared.
run_out=${FARVM_LAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/farvm/kvm-lab}/runs/compare-$(date -u +%Y%m%dT%H%M%S)-$$
mkdir -p "$run_out"
rc=0
# Inside the lab: a cgroup-v2 hierarchy on /sys/fs/cgroup (the lab's init mounts none), then the
# bench with its output in the lab's writable $LAB_OUT.
scripts/kvm-lab run --modules nbd,zram --timeout "$timeout" --boot-timeout "$boot_timeout" \
    --out "$run_out" \
    'mountpoint -q /sys/fs/cgroup || mount -t cgroup2 none /sys/fs/cgroup; ' \
    "target/release/farvm-lab bench compare --out \"\$LAB_OUT/compare\" ${args[*]}" || rc=$?
if [[ -f $run_out/compare/compare.md ]]; then
    mkdir -p "$out"
    cp "$run_out"/compare/compare.* "$run_out"/compare/*.png "$out"/ 2>/dev/null || true
    # The recorded command names the lab's output directory as compare-lab.sh passed it
    # ($LAB_OUT/compare), not this machine's cache path, which means nothing to a reader.
    sed -i "s|$run_out/compare|\$LAB_OUT/compare|g" "$out"/compare.md "$out"/compare.json
    echo "compare-lab: results in $out (lab console: $run_out/console.log)" >&2
else
    echo "compare-lab: no results (status $rc); lab console: $run_out/console.log" >&2
fi
exit "$rc"
