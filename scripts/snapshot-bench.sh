#!/usr/bin/env bash
# Measures save and restore of a VM on remote memory, as a markdown table: a pool VM's
# snapshot (resident pages only; its remote pages stay on the pool's memory servers) against
# the full-copy snapshot of the same VM on an embedded memory server (every page written),
# each in the clear and sealed under a snapshot key (`farvm snapshot --key-file`, restored
# with `--snapshot-key-file`; the key is drawn into the work directory for the run), and the
# clear pool snapshot restored in each mode of `farvm run --restore-pages`.
#
# Per variant: a test guest of --memory SIZE at 25% local runs a read-modify-write scan that
# verifies every word it reads, over a working set of --ws SIZE; once the scan runs its
# measured phase the VM is saved (`farvm snapshot`), then restored (`farvm run --restore`)
# and run to the end. A pool snapshot is restored once, so each variant saves a VM of its
# own. Variants: pool, pool+sealed, full, full+sealed (restored eagerly), pool:MODE (the
# clear pool snapshot restored with --restore-pages MODE: lazy, lazy-prefetch, working-set,
# working-set-async). Columns:
#   bytes written   the snapshot directory's allocated bytes (du; the page file is sparse)
#   save s          how long the VM was paused for the save (`farvm snapshot`'s own count)
#   restore→run s   from starting `farvm run --restore` to its vCPUs starting (its log line
#                   "snapshot loaded; resuming the VM")
#   finish s        from starting `farvm run --restore` to the workload's end (the run's exit)
#   × pool          finish s over the `pool` row's (eager, clear), when that row ran first
#   file pages      pages read from the page file (eager: all it holds; the other modes: the
#                   restore's `paging.lazy_restore.page_file_reads`)
#   pool pages      pages read from the memory servers after the restore (demand and
#                   prefetch reads, less those the page file served)
#
# The pool is local: a private etcd and two `farvm-memserver --pool` processes on loopback,
# one rack each (replication 2). Needs /dev/kvm, etcd (Debian's etcd-server), jq and a
# release build (`cargo build --release -p farvm-vmm -p farvm-memserver`).
#
# Usage: scripts/snapshot-bench.sh [--memory SIZE] [--ws SIZE] [--passes N]
#        (defaults: --memory 1G --ws 900M --passes 4)
#        [--variants "pool pool+sealed full full+sealed"] (the rows to run, in order; add
#        pool:lazy, pool:lazy-prefetch, pool:working-set, pool:working-set-async for the
#        restore modes)
set -euo pipefail

memory=1G ws=900M passes=4
variants="pool pool+sealed full full+sealed"
while [ $# -gt 0 ]; do
    case "$1" in
        --memory) memory=$2; shift 2 ;;
        --ws) ws=$2; shift 2 ;;
        --passes) passes=$2; shift 2 ;;
        --variants) variants=$2; shift 2 ;;
        -h|--help) sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "snapshot-bench: unknown argument $1 (see --help)" >&2; exit 64 ;;
    esac
done

for v in $variants; do
    case "$v" in
        pool|full|pool+sealed|full+sealed) ;;
        pool:eager|pool:lazy|pool:lazy-prefetch|pool:working-set|pool:working-set-async) ;;
        *) echo "snapshot-bench: unknown variant $v (pool, full, pool+sealed, full+sealed, pool:MODE)" >&2; exit 64 ;;
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
# shellcheck source=scripts/local-pool.sh
. "$root/scripts/local-pool.sh"
local_pool_on_exit "$work"

# The pool: etcd, two racks, two memory servers.
local_pool_up snapbench "$work" "$bin" 8G
url=$pool_url

workload="seq:ws=$ws,passes=$passes,write=1,verify=1"
# The snapshot key of the sealed variants.
key=$work/snapshot.key
(umask 077; head -c32 /dev/urandom >"$key")

# Runs one variant ($1: pool|full, +sealed for a sealed snapshot, :MODE for a restore mode);
# prints its table row.
pool_finish=
variant() {
    local row=$1 mode=eager
    case "$row" in *:*) mode=${row#*:} ;; esac
    local base=${row%%:*}
    local kind=${base%+sealed} tag=${row//[+:]/-}
    local dir=$work/$tag name=snapbench-$tag
    local save_key=() restore_key=()
    if [ "$kind" != "$base" ]; then
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
        kill -0 "$vm" 2>/dev/null || { echo "snapshot-bench: the $row VM exited early" >&2; cat "$dir/first.log" >&2; exit 70; }
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
    "$farvm" --log info run --restore "$dir/snap" "${restore_key[@]}" --restore-pages "$mode" \
        --serial none --json --no-control-socket \
        2> >(while IFS= read -r l; do echo "$(date +%s.%N) $l"; done >"$dir/restore.log") \
        >"$dir/restore.json"
    t_end=$(date +%s.%N)
    sleep 0.2
    t_run=$(grep -m1 'snapshot loaded; resuming the VM' "$dir/restore.log" | cut -d' ' -f1)
    local checksum
    # The raw digits: jq reads a u64 as a double.
    checksum=$(grep -oE '"checksum": ?[0-9]+' "$dir/restore.json" | head -1 | grep -oE '[0-9]+$')
    local finish file_pages pool_pages ratio
    finish=$(echo "$t_end - $t0" | bc)
    file_pages=$(jq -r --argjson written "$(jq '.memory.pages_written' "$dir/snap/manifest.json")" \
        '.paging.lazy_restore.page_file_reads // $written' "$dir/restore.json")
    pool_pages=$(jq -r '.paging.engine.counters as $c
        | $c.remote_reads_demand + $c.remote_reads_prefetch
          - (.paging.lazy_restore.page_file_reads // 0)' "$dir/restore.json")
    [ "$row" = pool ] && pool_finish=$finish
    ratio=-
    [ -n "$pool_finish" ] && ratio=$(printf '%.2f' "$(echo "$finish / $pool_finish" | bc -l)")
    printf '| %s | %s | %s | %.2f | %.2f | %.2f | %s | %s | %s | %s |\n' "$base" "$mode" \
        "$(numfmt --to=iec-i --suffix=B "$bytes")" "$save_s" \
        "$(echo "$t_run - $t0" | bc)" "$finish" "$ratio" "$file_pages" "$pool_pages" "$checksum"
}

echo "VM: --memory $memory --local-memory 25%, workload $workload"
echo
echo "| snapshot | restore | bytes written | save s | restore→run s | finish s | × pool | file pages | pool pages | checksum |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for v in $variants; do
    variant "$v"
done
