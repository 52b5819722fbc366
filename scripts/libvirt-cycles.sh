#!/usr/bin/env bash
# Back-to-back `virsh start` / `virsh destroy` cycles of one test-guest domain whose host config
# serves metrics, under the libvirt scripts/libvirt-ch.sh built: counts the starts that fail and
# the cycles whose VM did not serve its metrics.
#
# Usage: scripts/libvirt-cycles.sh [CYCLES]   (default 50; needs /dev/kvm, libvirt built, and
#        target/release/farvm: cargo build --release; FARVM_BIN names another farvm)
#
# Prints one line per cycle (its seconds, and any failure) and a summary; exits 0 only if every
# start succeeded and every VM served its metrics.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cycles=${1:-50}
[[ $cycles =~ ^[0-9]+$ ]] || { echo "libvirt-cycles: CYCLES must be a number" >&2; exit 64; }
farvm=${FARVM_BIN:-$REPO/target/release/farvm}
[[ -x $farvm ]] || { echo "libvirt-cycles: no $farvm (cargo build --release)" >&2; exit 1; }
command -v curl >/dev/null || { echo "libvirt-cycles: needs curl (apt-get install curl)" >&2; exit 1; }

# The daemon runs as an unprivileged user: what it reads must be readable by it.
dir=$(mktemp -d "${TMPDIR:-/tmp}/farvm-libvirt-cycles.XXXXXX")
chmod 755 "$dir"
"$farvm" image export "$dir" >/dev/null
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
printf '[domain."cycles"]\nmetrics = "127.0.0.1:%s"\n' "$port" >"$dir/farvm.toml"
cat >"$dir/cycles.xml" <<XML
<domain type='kvm'>
  <name>cycles</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64'>hvm</type>
    <kernel>$dir/farvm-testguest.elf</kernel>
    <cmdline>farvm.workload=seq:ws=16M,passes=100000</cmdline>
  </os>
  <devices><console type='pty'><target type='virtio' port='0'/></console></devices>
</domain>
XML
export FARVM_LIBVIRT_STATE=$dir/session FARVM_BIN=$farvm FARVM_CONFIG=$dir/farvm.toml
lv() { bash "$REPO/scripts/libvirt-ch.sh" "$@"; }
lv start >/dev/null
trap 'lv stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
lv virsh define "$dir/cycles.xml" >/dev/null

failed=0 unserved=0
for ((i = 1; i <= cycles; i++)); do
    t0=$(date +%s%N) note=""
    if ! out=$(lv virsh start cycles 2>&1); then
        failed=$((failed + 1)) note=" start failed: ${out//$'\n'/ }"
    # (Read whole before matching: `grep -q` leaving early would SIGPIPE curl under pipefail.)
    elif ! metrics=$(curl -sf -m 5 "http://127.0.0.1:$port/metrics") || ! grep -q '^farvm_' <<<"$metrics"; then
        unserved=$((unserved + 1)) note=" metrics not served"
    fi
    lv virsh destroy cycles >/dev/null 2>&1 || true
    echo "cycle $i: $(((($(date +%s%N) - t0) / 1000000))) ms$note"
done
echo "libvirt-cycles: $cycles cycles: $((cycles - failed)) starts succeeded, $failed failed; $unserved VMs did not serve metrics"
((failed == 0 && unserved == 0))
