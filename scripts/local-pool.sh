# local-pool.sh: a memory pool on loopback for the benchmark scripts, sourced (not run): a
# private etcd and two `farvm-memserver --pool` processes, racks r1 and r2, one server each.
#
#   local_pool_up NAME WORK BIN CAPACITY
#     starts etcd (data and logs in WORK, member NAME) and the two servers (BIN/farvm-memserver,
#     --capacity CAPACITY each, pool ids NAME-r1 and NAME-r2), waits until both are in the
#     pool; appends their process ids to the caller's `pids` array and sets `pool_url`.
#   local_pool_down
#     kills the processes in `pids` (the pool's and any the caller added), waits for them and
#     empties `pids`.
#   local_pool_on_exit WORK
#     starts `pids` empty and sets the EXIT trap: local_pool_down, then WORK removed.
#   free_port  prints a free TCP port on 127.0.0.1.

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

local_pool_down() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    pids=()
}

local_pool_on_exit() {
    local_pool_work=$1
    pids=()
    trap 'local_pool_down; rm -rf "$local_pool_work"' EXIT
}

local_pool_up() {
    local name=$1 work=$2 bin=$3 capacity=$4 cport pport r
    cport=$(free_port) pport=$(free_port)
    etcd --name "$name" --data-dir "$work/etcd" \
        --listen-client-urls "http://127.0.0.1:$cport" --advertise-client-urls "http://127.0.0.1:$cport" \
        --listen-peer-urls "http://127.0.0.1:$pport" --initial-advertise-peer-urls "http://127.0.0.1:$pport" \
        --initial-cluster "$name=http://127.0.0.1:$pport" >"$work/etcd.log" 2>&1 &
    pids+=($!)
    pool_url=http://127.0.0.1:$cport
    for _ in $(seq 300); do "$bin/farvm" pool --etcd "$pool_url" status >/dev/null 2>&1 && break; sleep 0.1; done
    "$bin/farvm" pool --etcd "$pool_url" racks add r1 r2 >/dev/null
    for r in r1 r2; do
        "$bin/farvm-memserver" --listen 127.0.0.1:0 --capacity "$capacity" --pool "$pool_url" \
            --rack "$r" --pool-id "$name-$r" >"$work/ms-$r.out" 2>"$work/ms-$r.log" &
        pids+=($!)
    done
    for _ in $(seq 300); do
        [ "$("$bin/farvm" pool --etcd "$pool_url" status --json | jq '.fleet.servers')" = 2 ] && return 0
        sleep 0.2
    done
    echo "local-pool: the two memory servers did not join the pool at $pool_url" >&2
    return 1
}
