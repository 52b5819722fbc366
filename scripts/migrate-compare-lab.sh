#!/usr/bin/env bash
# migrate-compare-lab: QEMU's pre-copy live migration and save to a file beside farvm's live
# migration and snapshot, of the same test guest (same RAM, same workload, same checksum), in
# one KVM lab run (scripts/kvm-lab; QEMU -accel kvm on the lab's /dev/kvm):
#   live  a guest of --live-memory (default 64 MiB) running a write-heavy
#         seq:ws=48M,passes=W,write=1,verify=1 and a read-heavy seq:ws=48M,passes=R,write=0.
#         QEMU: `farvm-lab bench qemu-migrate --mode live` (all guest RAM local, pre-copy to a
#         second QEMU over loopback TCP, QMP's query-migrate). farvm: the same guest at 25%
#         local on a pool on loopback (a private etcd, two farvm-memserver --pool, one rack
#         each), `farvm run --pool --control-socket` to `farvm run --incoming 127.0.0.1:PORT`
#         by `farvm migrate --json`. Both migrations start --settle seconds into the
#         workload's measured phase (QEMU: its third mailbox doorbell; farvm: `farvm stats`).
#   save  a guest of --save-memory (default 256 MiB) running
#         seq:ws=--save-ws,passes=--save-passes,write=1,verify=1. QEMU: `farvm-lab bench
#         qemu-migrate --mode save` (stop, migrate to exec:cat > FILE, a new QEMU -incoming
#         from it, cont). farvm: scripts/snapshot-bench.sh --variants "pool full" (a pool
#         snapshot of the 25%-local VM, and the full copy of the same VM on an embedded memory
#         server; restored eagerly).
# Every run must finish with the workload's native checksum. The lab is QEMU-TCG: only ratios
# within one run mean anything; the guest is smaller than the host tables' (docs/benchmarks.md)
# because TCG runs it 10-40x slower.
#
# USAGE
#   scripts/migrate-compare-lab.sh [OPTIONS]
#     --out DIR            where migrate-compare.md and the raw outputs go
#                          [docs/bench/migrate-compare-lab]
#     --live-memory SIZE   the live-migration guest's RAM [64M]
#     --write-passes N     passes of the write-heavy live workload [10]
#     --read-passes N      passes of the read-heavy live workload [10]
#     --save-memory SIZE   the save/restore guest's RAM [256M]
#     --save-ws SIZE       its working set [128M]
#     --save-passes N      its passes [2]
#     --settle SECS        seconds into the measured phase the live migrations start [1]
#     --save-settle SECS   seconds into the measured phase QEMU's save starts (farvm's
#                          snapshot-bench.sh saves as the phase starts) [1]
#     --mem SIZE           the lab's memory (L1) [6G]
#     --timeout SECS       the lab's time bound [3600]
#     --boot-timeout SECS  how long the lab may take to boot on a loaded host [1200]
#     --host               run everything on this machine instead of in the lab (its
#                          /dev/kvm, its QEMU): for where the lab cannot run a migrated guest
#                          (docs/benchmarks.md says when); --mem, --timeout and --boot-timeout
#                          then do nothing
#
# Needs QEMU (qemu-system-x86), etcd (etcd-server), jq, python3 and a release build of farvm,
# farvm-memserver and farvm-lab (in $CARGO_TARGET_DIR or target/; built when missing). Exit
# status: the lab's (the command's status; 124 timeout; 125 the lab could not run).
set -euo pipefail

# Runs inside the lab: every measurement, raw outputs into $LAB_OUT.
inside() {
    local bin=$1 live_mem=$2 wpasses=$3 rpasses=$4 save_mem=$5 save_ws=$6 save_passes=$7
    local settle=$8 save_settle=$9
    local out=$LAB_OUT
    # Global: the EXIT trap removes it after this function has returned.
    work=$(mktemp -d /var/tmp/farvm-migcmp.XXXXXX)
    local write="seq:ws=48M,passes=$wpasses,write=1,verify=1"
    local read="seq:ws=48M,passes=$rpasses,write=0"
    local save="seq:ws=$save_ws,passes=$save_passes,write=1,verify=1"
    local_pool_on_exit "$work"
    "$bin/farvm-lab" bench qemu-migrate --version >/dev/null
    # The lab's /dev has no /dev/fd, which snapshot-bench.sh's process substitution needs.
    [ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
    qemu-system-x86_64 --version | head -1 >"$out/versions.txt"

    echo "migrate-compare: QEMU live migration" >&2
    "$bin/farvm-lab" bench qemu-migrate --mode live --memory "$live_mem" --settle "$settle" \
        --workload "$write" --workload "$read" --work "$work" --out "$out/qemu-live" \
        >"$out/qemu-live.md" || true
    echo "migrate-compare: QEMU save and restore" >&2
    "$bin/farvm-lab" bench qemu-migrate --mode save --memory "$save_mem" --settle "$save_settle" \
        --workload "$save" --work "$work" --out "$out/qemu-save" >"$out/qemu-save.md" || true

    echo "migrate-compare: farvm live migration" >&2
    local url
    local_pool_up migcmp "$work" "$bin" 2G
    url=$pool_url
    local key=$work/migration.key
    (umask 077; head -c32 /dev/urandom >"$key")
    : >"$out/farvm-live.jsonl"
    local tag w
    for tag in write read; do
        w=$write
        [ "$tag" = read ] && w=$read
        farvm_live "$bin" "$url" "$key" "$live_mem" "$tag" "$w" "$settle" "$work" \
            >>"$out/farvm-live.jsonl" || echo "migrate-compare: farvm $tag-heavy failed" >&2
    done
    local_pool_down

    echo "migrate-compare: farvm save and restore" >&2
    CARGO_TARGET_DIR=$(dirname "$bin") "$(dirname "$0")/snapshot-bench.sh" --memory "$save_mem" \
        --ws "$save_ws" --passes "$save_passes" --variants "pool full" >"$out/farvm-save.md" || true
}

# shellcheck source=scripts/local-pool.sh
. "$(dirname "$0")/local-pool.sh"

# One farvm live migration on loopback (in the lab or on this host); prints one JSON line: the
# workload, `farvm migrate --json`'s report, the seconds from the migration's start to the
# destination's end, and the destination's checksum (the raw digits: jq reads a u64 as a
# double); or, when the destination's guest failed, the workload and `failed`.
farvm_live() {
    local bin=$1 url=$2 key=$3 mem=$4 tag=$5 w=$6 settle=$7 work=$8
    local sock=$work/$tag.sock port
    port=$(free_port)
    "$bin/farvm" run --name "migcmp-$tag" --pool "$url" --pool-host lab-src --memory "$mem" \
        --local-memory 25% --workload "$w" --serial none --json --control-socket "$sock" \
        >"$work/$tag-src.json" 2>"$work/$tag-src.log" &
    local src=$!
    "$bin/farvm" run --incoming "127.0.0.1:$port" --migration-key-file "$key" \
        --pool-host lab-dst --name "migcmp-$tag-dst" --serial none --json --no-control-socket \
        >"$work/$tag-dst.json" 2>"$work/$tag-dst.log" &
    local dst=$!
    until grep -q 'waiting for a migrating VM' "$work/$tag-dst.log" 2>/dev/null; do
        kill -0 "$dst" 2>/dev/null || { cat "$work/$tag-dst.log" >&2; return 1; }
        sleep 0.2
    done
    until "$bin/farvm" stats --socket "$sock" --json 2>/dev/null \
        | jq -e '.processes[0].phase == 2' >/dev/null 2>&1; do
        kill -0 "$src" 2>/dev/null || { cat "$work/$tag-src.log" >&2; kill "$dst"; return 1; }
        sleep 0.2
    done
    sleep "$settle"
    local t0 report t_end checksum
    t0=$(date +%s.%N)
    report=$("$bin/farvm" migrate --json --socket "$sock" --to "127.0.0.1:$port" --key-file "$key") \
        || { echo "farvm migrate failed" >&2; kill "$src" "$dst" 2>/dev/null; return 1; }
    wait "$src" || true
    if ! wait "$dst"; then
        cat "$work/$tag-dst.log" >&2
        # The destination's own account of the failure, for the table.
        jq -cn --arg w "$w" --arg why "$(grep -m1 -E 'killed|failed|error' "$work/$tag-dst.log")" \
            '{workload: $w, failed: ("the destination: " + $why)}'
        return 1
    fi
    t_end=$(date +%s.%N)
    checksum=$(grep -oE '"checksum": ?[0-9]+' "$work/$tag-dst.json" | head -1 | grep -oE '[0-9]+$')
    jq -cn --arg w "$w" --argjson m "$report" --argjson finish "$(echo "$t_end - $t0" | bc)" \
        --arg checksum "$checksum" \
        '{workload: $w, migrate: $m, finish_secs: $finish, checksum: $checksum}'
}

if [[ ${1:-} == --inside ]]; then
    shift
    inside "$@"
    exit 0
fi

cd "$(dirname "$0")/.."
out=docs/bench/migrate-compare-lab
live_mem=64M wpasses=10 rpasses=10
save_mem=256M save_ws=128M save_passes=2
settle=1 save_settle=1
lab_mem=6G timeout=3600 boot_timeout=1200 where=lab
while (($#)); do
    case "$1" in
    --out) out=$2; shift 2 ;;
    --live-memory) live_mem=$2; shift 2 ;;
    --write-passes) wpasses=$2; shift 2 ;;
    --read-passes) rpasses=$2; shift 2 ;;
    --save-memory) save_mem=$2; shift 2 ;;
    --save-ws) save_ws=$2; shift 2 ;;
    --save-passes) save_passes=$2; shift 2 ;;
    --settle) settle=$2; shift 2 ;;
    --save-settle) save_settle=$2; shift 2 ;;
    --mem) lab_mem=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --boot-timeout) boot_timeout=$2; shift 2 ;;
    --host) where=host; shift ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "migrate-compare-lab: unknown option $1 (see --help)" >&2; exit 64 ;;
    esac
done
for tool in qemu-system-x86_64 etcd jq python3 bc; do
    command -v "$tool" >/dev/null || { echo "migrate-compare-lab: $tool not found" >&2; exit 69; }
done
bin=${CARGO_TARGET_DIR:-$(pwd)/target}/release
for b in farvm farvm-memserver farvm-lab; do
    if [[ ! -x $bin/$b ]]; then
        cargo build --release -p farvm-vmm -p farvm-memserver -p farvm-lab
        break
    fi
done

# Not under /tmp: inside the lab /tmp is the lab's own tmpfs, and the output must be shared.
run_out=${FARVM_LAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/farvm/kvm-lab}/runs/migrate-compare-$(date -u +%Y%m%dT%H%M%S)-$$
mkdir -p "$run_out"
rc=0
inside_args=(--inside "$bin" "$live_mem" "$wpasses" "$rpasses" "$save_mem" "$save_ws"
    "$save_passes" "$settle" "$save_settle")
if [[ $where == lab ]]; then
    scripts/kvm-lab run --mem "$lab_mem" --timeout "$timeout" --boot-timeout "$boot_timeout" \
        --out "$run_out" -- "$(pwd)/scripts/migrate-compare-lab.sh" "${inside_args[@]}" || rc=$?
else
    LAB_OUT=$run_out "$(pwd)/scripts/migrate-compare-lab.sh" "${inside_args[@]}" || rc=$?
fi
mkdir -p "$out"
for f in versions.txt qemu-live.md qemu-save.md farvm-live.jsonl farvm-save.md \
    qemu-live/qemu-migrate.json qemu-save/qemu-migrate.json; do
    [[ -f $run_out/$f ]] && cp "$run_out/$f" "$out/${f//\//-}"
done
if [[ ! -s $out/farvm-live.jsonl && ! -f $out/qemu-live-qemu-migrate.json ]]; then
    echo "migrate-compare-lab: no results (lab status $rc); console: $run_out/console.log" >&2
    exit "$((rc ? rc : 1))"
fi
python3 "$(pwd)/scripts/migrate-compare-lab.d/tables.py" "$out" "$where" "$live_mem" "$save_mem" \
    >"$out/migrate-compare.md"
cat "$out/migrate-compare.md"
echo "migrate-compare-lab: results in $out (raw: $run_out)" >&2
exit "$rc"
