#!/usr/bin/env bash
# Measures save and restore of a VM on remote memory, as a markdown table: a pool VM's
# snapshot (resident pages only; its remote pages stay on the pool's memory servers) against
# the full-copy snapshot of the same VM on an embedded memory server (every page written),
# each in the clear and sealed under a snapshot key (`farvm snapshot --key-file`, restored
# with `--snapshot-key-file`; the key is drawn into the work directory for the run).
#
# Per variant: a test guest of --memory SIZE at 25% local runs a read-modify-write scan over
# a working set that fills its RAM; once the scan runs its measured phase the VM is saved
# (`farvm snapshot`), then restored (`farvm run --restore`) and run to the end. Columns:
#   bytes written   the snapshot directory's allocated bytes (du; the page file is sparse)
#   save s          how long the VM was paused for the save (`farvm snapshot`'s own count)
#   restore→run s   from starting `farvm run --restore` to its vCPUs starting (its log line
#                   "snapshot loaded; resuming the VM")
#   finish s        from starting `farvm run --restore` to the workload's end (the run's exit)
#
# The pool is local: a private etcd and two `farvm-memserver --pool` processes on loopback,
# one rack each (replication 2). Needs /dev/kvm, etcd (Debian's etcd-server) and a release
# build (`cargo build --release -p farvm-vmm -p farvm-memserver`).
#
# Usage: scripts/snapshot-bench.sh [--memory SIZE] [--ws SIZE] [--passes N]
#        (defaults: --memory 1G --ws 900M --passes 4)
#        [--variants "pool pool+sealed full full+sealed"] (the rows to run, in order)
set -euo pipefail

memory=1G ws=900M passes=4 variants="pool pool+sealed full full+sealed"
while [ $# -gt 0 ]; do
    case "$1" in
        --memory) memory=$2; shift 2 ;;
        --ws) ws=$2; shift 2 ;;
        --passes) passes=$2; shift 2 ;;
        --variants) variants=$2; shift 2 ;;
        -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "snapshot-bench: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
bin=${CARGO_TARGET_DIR:-$root/target}/release
farvm=$bin/farvm
memserver=$bin/farvm-memserver
for b in "$farvm" "$memserver"; do
    [ -x "$b" ] || { echo "snapshot-bench: $b missing: cargo build --release -p farvm-vmm -p farvm-memserver" >&2; exit 66; }
done
command -v etcd >/dev/null || { echo "snapshot-bench: etcd not found (apt install etcd-server)" >&2; exit 69; }

work=$(mktemp -d /tmp/farvm-snapbench.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The pool: etcd, two racks, two memory servers.
cport=$(free_port) pport=$(free_port)
etcd --name snapbench --data-dir "$work/etcd" \
    --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
    --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
    --initial-cluster "snapbench=http://127.0.0.1:$pport" >"$work/etcd.log" 2>&1 &
pids+=($!)
url=http://127.0.0.1:$cport
for _ in $(seq 100); do "$farvm" pool --etcd "$url" status >/dev/null 2>&1 && break; sleep 0.1; done
"$farvm" pool --etcd "$url" racks add r1 r2 >/dev/null
for r in r1 r2; do
    "$memserver" --listen 127.0.0.1:0 --capacity 4G --pool "$url" --rack "$r" --pool-id "ms-$r" \
        >"$work/ms-$r.out" 2>"$work/ms-$r.log" &
    pids+=($!)
done
for _ in $(seq 100); do
    [ "$("$farvm" pool --etcd "$url" status --json | jq '.fleet.servers')" = 2 ] && break
    sleep 0.2
done

workload="seq:ws=$ws,passes=$passes,write=1,verify=1"
# The snapshot key of the sealed variants.
key=$work/snapshot.key
(umask 077; head -c32 /dev/urandom >"$key")

# Runs one variant ($1: pool|full, +sealed for a sealed snapshot); prints its table row.
variant() {
    local row=$1 kind=${1%+sealed} dir=$work/${1/+/-} name=snapbench-${1/+/-}
    local save_key=() restore_key=()
    if [ "$kind" != "$row" ]; then
        save_key=(--key-file "$key") restore_key=(--snapshot-key-file "$key")
    fi
    mkdir -p "$dir"
    local args=(run --name "$name" --memory "$memory" --local-memory 25% --workload "$workload"
                --serial none --json --control-socket "$dir/vm.sock")
    [ "$kind" = pool ] && args+=(--pool "$url")
    "$farvm" "${args[@]}" >"$dir/first.json" 2>"$dir/first.log" &
    local vm=$!
    # Wait for the measured phase (the working set is resident or remote by then).
    until "$farvm" stats --socket "$dir/vm.sock" --json 2>/dev/null \
        | jq -e '.processes[0].phase == 2' >/dev/null 2>&1; do
        kill -0 "$vm" 2>/dev/null || { echo "snapshot-bench: the $kind VM exited early" >&2; cat "$dir/first.log" >&2; exit 70; }
        sleep 0.2
    done
    local saved
    saved=$("$farvm" snapshot --socket "$dir/vm.sock" --json "${save_key[@]}" "$dir/snap")
    wait "$vm"
    local bytes save_s
    bytes=$(du -sB1 "$dir/snap" | cut -f1)
    save_s=$(jq -r '.paused_secs' <<<"$saved")
    local t0 t_run t_end
    t0=$(date +%s.%N)
    "$farvm" --log info run --restore "$dir/snap" "${restore_key[@]}" --serial none --json \
        --no-control-socket \
        2> >(while IFS= read -r l; do echo "$(date +%s.%N) $l"; done >"$dir/restore.log") \
        >"$dir/restore.json"
    t_end=$(date +%s.%N)
    sleep 0.2
    t_run=$(grep -m1 'snapshot loaded; resuming the VM' "$dir/restore.log" | cut -d' ' -f1)
    local checksum
    # The raw digits: jq reads a u64 as a double.
    checksum=$(grep -oE '"checksum": ?[0-9]+' "$dir/restore.json" | head -1 | grep -oE '[0-9]+$')
    printf '| %s | %s | %s | %.2f | %.2f | %.2f | %s |\n' "$row" "$memory" \
        "$(numfmt --to=iec-i --suffix=B "$bytes")" "$save_s" \
        "$(echo "$t_run - $t0" | bc)" "$(echo "$t_end - $t0" | bc)" "$checksum"
}

echo "VM: --memory $memory --local-memory 25%, workload $workload"
echo
echo "| snapshot | guest RAM | bytes written | save s | restore→run s | finish s | checksum |"
echo "|---|---|---|---|---|---|---|"
for v in $variants; do
    case "$v" in
        pool|full|pool+sealed|full+sealed) variant "$v" ;;
        *) echo "snapshot-bench: unknown variant $v (pool, full, pool+sealed, full+sealed)" >&2; exit 64 ;;
    esac
done
