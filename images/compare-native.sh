#!/usr/bin/env bash
# Guest (test guest, one process, heap premapped) vs native time and checksum per workload spec,
# best of REPS runs of each, run alternately so both see the same host load.
#   images/compare-native.sh REPS SPEC...      e.g. images/compare-native.sh 3 seq:ws=64M kv:ws=64M
# Needs `farvm` and the native runner built in release:
#   cargo build --release -p farvm-vmm --bin farvm
#   cargo build --release -p farvm-workloads --features std --example native
set -euo pipefail
dir="${CARGO_TARGET_DIR:-$(dirname "$0")/../target}/release"
farvm="$dir/farvm"; native="$dir/examples/native"
reps="$1"; shift
printf '%-32s %12s %12s %7s  %s\n' spec guest_ms native_ms ratio checksum
for spec in "$@"; do
    g=; n=; gc=; nc=
    for _ in $(seq "$reps"); do
        read -r t c < <("$farvm" run --vcpus 1 --memory 1400M --timeout 600 --premap -w "$spec" \
            | awk '$1 == "1" { print $5, $7 }')
        gc=$c; g=$(awk -v a="${g:-1e18}" -v b="$t" 'BEGIN { print (b < a) ? b : a }')
        read -r t c < <("$native" "$spec" | tail -1 | awk '{ print $2, $4 }')
        nc=$c; n=$(awk -v a="${n:-1e18}" -v b="$t" 'BEGIN { print (b < a) ? b : a }')
    done
    same=$([[ "$gc" == "$nc" ]] && echo "same $gc" || echo "DIFFERENT guest $gc native $nc")
    awk -v s="$spec" -v g="$g" -v n="$n" -v c="$same" \
        'BEGIN { printf "%-32s %12.2f %12.2f %7.2f  %s\n", s, g, n, g / n, c }'
done
