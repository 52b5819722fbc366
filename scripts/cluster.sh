#!/usr/bin/env bash
# A rack of farvm hosts on one machine, for tests and demos: network namespaces as hosts on a
# private bridge, grouped into racks, with etcd, memory servers and VM hosts each in their own
# namespace.
#
#   scripts/cluster.sh up [--racks 3] [--servers-per-rack 2] [--hosts 4] [--delay-us 250]
#                         [--capacity 2G] [--token-file FILE] [--metrics-port PORT] [--name fvc]
#   scripts/cluster.sh status [--name fvc]
#   scripts/cluster.sh exec host1 -- target/release/farvm run --memserver ADDR ...
#   scripts/cluster.sh etcd-stop|etcd-start [--name fvc]   (an etcd outage, same data dir)
#   scripts/cluster.sh server-stop rK-msI [--name fvc]     (SIGKILL: its pages are gone)
#   scripts/cluster.sh server-start rK-msI [--pool-id ID] [--name fvc]
#                                   (an empty server again; --pool-id: under another id)
#   scripts/cluster.sh down [--name fvc]
#
# Layout (NAME = --name, default fvc; addresses exist only inside the namespaces):
#   bridge NAME-br (root namespace, no address); each namespace has eth0 on it, 10.77.0.0/16
#   NAME-etcd          10.77.0.2     etcd, client URL http://10.77.0.2:2379
#   NAME-rK-msI        10.77.K.1I    memory server I of rack K: farvm-memserver on :7070 (in-rack
#                                    address), its cross-rack address :17070 through the delay proxy;
#                                    with --metrics-port, Prometheus metrics on :PORT (in-rack address)
#   NAME-hostN         10.77.K.10N   VM host N, in rack K = ((N-1) mod racks) + 1
#
# Latency between racks: this machine's kernel has no netem, so each memory server's cross-rack
# address is farvm-delay-proxy (userspace, --delay-us each way). The pool registers the
# cross-rack address, since a slab's replicas are on distinct racks. In the KVM lab, whose
# kernel has sch_netem, per-rack delay can be put on the links instead, e.g. in each namespace:
#   tc qdisc add dev eth0 root handle 1: prio bands 4
#   tc qdisc add dev eth0 parent 1:4 handle 40: netem delay 250us
#   tc filter add dev eth0 parent 1: protocol ip u32 match ip dst 10.77.J.0/24 flowid 1:4  # per other rack J
#
# Racks: once etcd is up the script declares racks r1..rK in the pool (`farvm-pool racks add`),
# then starts each memory server as `farvm-memserver --pool URL --rack rK --pool-id rK-msI`; the
# pool refuses a server of an undeclared rack.
#
# Everything started is recorded under $FARVM_CLUSTER_RUN/NAME (default /run/farvm-cluster):
# `down` kills exactly those PIDs and deletes exactly those namespaces and links.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
BIN=${FARVM_BIN:-$ROOT/target/release}

usage() { sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "cluster: $*" >&2; exit 1; }

cmd=${1:-}; [[ -n $cmd ]] || usage 64
shift
NAME=fvc RACKS=3 SPR=2 HOSTS=4 DELAY_US=250 CAPACITY=2G TOKEN_FILE="" METRICS_PORT="" POOL_ID=""
EXEC_NS="" EXEC_ARGS=()
if [[ $cmd == exec || $cmd == server-stop || $cmd == server-start ]]; then
    [[ $# -ge 1 ]] || die "$cmd needs a namespace (e.g. host1, r1-ms2)"
    EXEC_NS=$1; shift
fi
while [[ $# -gt 0 ]]; do
    case $1 in
        --name) NAME=$2; shift 2 ;;
        --racks) RACKS=$2; shift 2 ;;
        --servers-per-rack) SPR=$2; shift 2 ;;
        --hosts) HOSTS=$2; shift 2 ;;
        --delay-us) DELAY_US=$2; shift 2 ;;
        --capacity) CAPACITY=$2; shift 2 ;;
        --token-file) TOKEN_FILE=$2; shift 2 ;;
        --metrics-port) METRICS_PORT=$2; shift 2 ;;
        --pool-id) POOL_ID=$2; shift 2 ;;
        --) shift; EXEC_ARGS=("$@"); break ;;
        -h|--help) usage 0 ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ $NAME =~ ^[a-z][a-z0-9]{0,5}$ ]] || die "--name must be 1-6 lower-case letters/digits (it prefixes interface names)"
for n in "$RACKS" "$SPR" "$HOSTS" "$DELAY_US" ${METRICS_PORT:+"$METRICS_PORT"}; do [[ $n =~ ^[0-9]+$ ]] || die "'$n' is not a number"; done
((RACKS >= 1 && RACKS <= 9 && SPR >= 1 && SPR <= 9 && HOSTS >= 1 && HOSTS <= 99)) ||
    die "supported: 1-9 racks, 1-9 servers per rack, 1-99 hosts"

RUN=${FARVM_CLUSTER_RUN:-/run/farvm-cluster}/$NAME
ETCD_ADDR=10.77.0.2
ETCD_URL=http://$ETCD_ADDR:2379

need_root() {
    [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces, veth, bridge); run with sudo"
    command -v ip >/dev/null || die "needs iproute2 (the ip command): apt-get install iproute2"
    ip netns list >/dev/null 2>&1 || die "'ip netns' does not work here (no network-namespace support?)"
}

# State: one record per line, in creation order; down undoes them in reverse.
record() { echo "$*" >>"$RUN/state"; }

ns_of_host() { echo "$NAME-host$1"; }
rack_of_host() { echo $(( ($1 - 1) % RACKS + 1 )); }

add_ns() { # add_ns NS ADDR: a namespace with eth0 (ADDR/16) on the bridge
    local ns=$1 addr=$2 veth
    veth="$NAME-v$(( $(grep -c '^netns ' "$RUN/state" 2>/dev/null || true) ))"
    ip netns add "$ns"
    record netns "$ns"
    ip link add "$veth" type veth peer name eth0 netns "$ns"
    record link "$veth"
    ip link set "$veth" master "$NAME-br" up
    ip -n "$ns" addr add "$addr/16" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
}

spawn() { # spawn NS LABEL CMD...: runs CMD in NS in the background, records its PID
    local ns=$1 label=$2; shift 2
    # `ip netns exec` execs the command: the PID is the command's.
    # Appended: a restarted server's log follows its earlier life's.
    ip netns exec "$ns" "$@" >>"$RUN/$label.log" 2>&1 &
    local pid=$!
    record pid "$pid" "$label"
    echo "$pid"
}

wait_tcp() { # wait_tcp NS HOST PORT SECONDS
    local i
    for ((i = 0; i < $4 * 10; i++)); do
        ip netns exec "$1" bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null && return 0
        sleep 0.1
    done
    return 1
}

start_memserver() { # start_memserver NS RACK LABEL ADDR [POOL-ID]: the server, labelled LABEL
    local ns=$1 rack=$2 label=$3 addr=$4 id=${5:-$3} opts=()
    [[ -z $TOKEN_FILE ]] || opts+=(--token-file "$TOKEN_FILE")
    [[ -z $METRICS_PORT ]] || opts+=(--metrics "$addr:$METRICS_PORT")
    spawn "$ns" "$label" "$BIN/farvm-memserver" --listen "$addr:7070" --capacity "$CAPACITY" \
        "${opts[@]}" --pool "$ETCD_URL" --rack "$rack" --pool-id "$id" \
        --advertise "$addr:17070" >/dev/null
}

start_delay_proxy() { # start_delay_proxy NS LABEL ADDR: the server's cross-rack address
    spawn "$1" "$2-delay" "$BIN/farvm-delay-proxy" --listen "$3:17070" \
        --connect "$3:7070" --delay-us "$DELAY_US" >/dev/null
}

label_pid() { awk -v l="$1" '$1 == "pid" && $3 == l { p = $2 } END { print p }' "$RUN/state"; }

server_ns() { # server_ns rK-msI: checks the name against the running cluster's shape
    [[ $1 =~ ^r([0-9])-ms([0-9])$ ]] || die "'$1' is not a memory server (rK-msI)"
    (( BASH_REMATCH[1] >= 1 && BASH_REMATCH[1] <= RACKS && BASH_REMATCH[2] >= 1 && BASH_REMATCH[2] <= SPR )) ||
        die "cluster '$NAME' has no memory server $1 ($RACKS rack(s) x $SPR)"
}

server_stop() { # SIGKILL (a crash: nothing deregisters) and forget its PID
    need_root
    load_shape
    server_ns "$EXEC_NS"
    local pid
    pid=$(label_pid "$EXEC_NS")
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || die "memory server $EXEC_NS of cluster '$NAME' is not running"
    kill -KILL "$pid"
    while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    sed -i "/^pid $pid $EXEC_NS\$/d" "$RUN/state"
    echo "cluster '$NAME': memory server $EXEC_NS killed (pid $pid)"
}

server_start() { # the server again, empty, under its own pool id or --pool-id
    need_root
    load_shape
    server_ns "$EXEC_NS"
    local pid rack addr
    pid=$(label_pid "$EXEC_NS")
    [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null || die "memory server $EXEC_NS of cluster '$NAME' is running already (pid $pid)"
    [[ -z $pid ]] || sed -i "/^pid $pid $EXEC_NS\$/d" "$RUN/state"
    rack=${EXEC_NS%%-*}
    addr="10.77.${rack#r}.1${EXEC_NS##*-ms}"
    start_memserver "$NAME-$EXEC_NS" "$rack" "$EXEC_NS" "$addr" "${POOL_ID:-$EXEC_NS}"
    pid=$(label_pid "$EXEC_NS")
    wait_tcp "$NAME-$EXEC_NS" "$addr" 7070 30 || die "memory server $EXEC_NS did not start; see $RUN/$EXEC_NS.log"
    echo "cluster '$NAME': memory server $EXEC_NS started as ${POOL_ID:-$EXEC_NS} (pid $pid)"
}

declare_racks() { # the pool's racks r1..rRACKS
    local k i out racks=()
    for ((k = 1; k <= RACKS; k++)); do racks+=("r$k"); done
    # etcd accepts connections before it answers them when the machine is loaded: retry for
    # up to 15 s.
    for ((i = 0; i < 30; i++)); do
        out=$(ip netns exec "$NAME-etcd" "$BIN/farvm-pool" --etcd "$ETCD_URL" racks add "${racks[@]}" 2>&1) &&
            return 0
        sleep 0.5
    done
    die "declaring racks ${racks[*]} in the pool failed: $out"
}

start_etcd() { # etcd in its namespace, on the cluster's data dir (a restart keeps the data)
    spawn "$NAME-etcd" etcd etcd --name "$NAME" --data-dir "$RUN/etcd" \
        --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
        --listen-peer-urls "http://$ETCD_ADDR:2380" --initial-advertise-peer-urls "http://$ETCD_ADDR:2380" \
        --initial-cluster "$NAME=http://$ETCD_ADDR:2380" --logger zap --log-level warn >/dev/null
    wait_tcp "$NAME-etcd" "$ETCD_ADDR" 2379 30 || die "etcd did not start; see $RUN/etcd.log"
}

etcd_pid() { awk '$1 == "pid" && $3 == "etcd" { p = $2 } END { print p }' "$RUN/state"; }

etcd_stop() { # stops the cluster's etcd (SIGTERM, then SIGKILL) and forgets its PID
    need_root
    load_shape
    local pid i
    pid=$(etcd_pid)
    [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || die "etcd of cluster '$NAME' is not running"
    kill -TERM "$pid"
    for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    sed -i "/^pid $pid etcd\$/d" "$RUN/state"
    echo "cluster '$NAME': etcd stopped (pid $pid)"
}

etcd_start() {
    need_root
    load_shape
    local pid
    pid=$(etcd_pid)
    [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null || die "etcd of cluster '$NAME' is running already (pid $pid)"
    start_etcd
    echo "cluster '$NAME': etcd started (pid $(etcd_pid))"
}

up() {
    need_root
    [[ ! -e $RUN/state ]] || die "cluster '$NAME' is up already ($RUN/state); run: $0 down --name $NAME"
    command -v etcd >/dev/null || die "needs etcd (Debian package etcd-server; scripts/setup.sh installs it)"
    for b in farvm farvm-memserver farvm-pool farvm-delay-proxy; do
        [[ -x $BIN/$b ]] || die "missing $BIN/$b: build with cargo build --release --workspace --bins"
    done
    [[ -z $TOKEN_FILE || -r $TOKEN_FILE ]] || die "cannot read --token-file $TOKEN_FILE"
    for ns in $(ip netns list | awk '{print $1}'); do
        [[ $ns != "$NAME"-* ]] || die "namespace $ns exists but no cluster state does; remove it or pick another --name"
    done
    mkdir -p "$RUN"
    : >"$RUN/state"
    # What server-start needs to start a server as up did.
    record opt "delay_us=$DELAY_US capacity=$CAPACITY metrics_port=$METRICS_PORT token_file=$TOKEN_FILE"
    trap 'rc=$?; if ((rc)); then echo "cluster: up failed; tearing down what was created" >&2; down_quiet; fi' EXIT

    ip link add "$NAME-br" type bridge
    record link "$NAME-br"
    ip link set "$NAME-br" up

    add_ns "$NAME-etcd" "$ETCD_ADDR"
    mkdir -p "$RUN/etcd"
    start_etcd
    declare_racks

    local k i n
    for ((k = 1; k <= RACKS; k++)); do
        for ((i = 1; i <= SPR; i++)); do
            add_ns "$NAME-r$k-ms$i" "10.77.$k.1$i"
            start_memserver "$NAME-r$k-ms$i" "r$k" "r$k-ms$i" "10.77.$k.1$i"
            start_delay_proxy "$NAME-r$k-ms$i" "r$k-ms$i" "10.77.$k.1$i"
        done
    done
    for ((n = 1; n <= HOSTS; n++)); do
        add_ns "$(ns_of_host "$n")" "10.77.$(rack_of_host "$n").$((100 + n))"
    done
    trap - EXIT

    # Wait until every memory server is in the pool.
    local want=$((RACKS * SPR)) got=0
    for ((i = 0; i < 100; i++)); do
        got=$(ip netns exec "$(ns_of_host 1)" "$BIN/farvm-pool" --etcd "$ETCD_URL" status --json 2>/dev/null |
            grep -c '"wire_version"' || true)
        ((got >= want)) && break
        sleep 0.2
    done
    ((got >= want)) || echo "cluster: warning: only $got of $want memory servers registered" >&2
    echo "cluster '$NAME' up: $RACKS rack(s) x $SPR memory server(s), $HOSTS host(s), ${DELAY_US}us each way across racks"
    summary
}

summary() {
    echo "etcd:    $ETCD_URL (namespace $NAME-etcd)"
    local k i n
    for ((k = 1; k <= RACKS; k++)); do
        for ((i = 1; i <= SPR; i++)); do
            echo "rack r$k: r$k-ms$i  in-rack 10.77.$k.1$i:7070  cross-rack 10.77.$k.1$i:17070  (namespace $NAME-r$k-ms$i)"
        done
    done
    for ((n = 1; n <= HOSTS; n++)); do
        echo "host$n:   rack r$(rack_of_host "$n"), 10.77.$(rack_of_host "$n").$((100 + n))  (run: $0 exec host$n --name $NAME -- CMD)"
    done
}

load_shape() { # recover --racks/--servers-per-rack/--hosts from the state of a running cluster
    [[ -e $RUN/state ]] || die "cluster '$NAME' is not up (no $RUN/state)"
    RACKS=$(grep -o "^netns $NAME-r[0-9]*-ms1\$" "$RUN/state" | wc -l)
    SPR=$(grep -o "^netns $NAME-r1-ms[0-9]*\$" "$RUN/state" | wc -l)
    HOSTS=$(grep -o "^netns $NAME-host[0-9]*\$" "$RUN/state" | wc -l)
    local opt
    for opt in $(sed -n 's/^opt //p' "$RUN/state"); do
        case $opt in
            delay_us=*) DELAY_US=${opt#*=} ;;
            capacity=*) CAPACITY=${opt#*=} ;;
            metrics_port=*) METRICS_PORT=${opt#*=} ;;
            token_file=*) TOKEN_FILE=${opt#*=} ;;
        esac
    done
}

status() {
    need_root
    load_shape
    echo "cluster '$NAME' ($RUN):"
    local kind a b namespaces
    # Listed once and matched from a string: `ip netns list | grep -q` can SIGPIPE ip, and
    # pipefail would then call a present namespace MISSING.
    namespaces=$(ip netns list | awk '{ print $1 }')
    while read -r kind a b; do
        case $kind in
            pid) if kill -0 "$a" 2>/dev/null; then echo "  process $b: pid $a running"; else echo "  process $b: pid $a NOT RUNNING (see $RUN/$b.log)"; fi ;;
            netns) grep -qxF "$a" <<<"$namespaces" && echo "  namespace $a" || echo "  namespace $a MISSING" ;;
        esac
    done <"$RUN/state"
    summary
    echo
    ip netns exec "$(ns_of_host 1)" "$BIN/farvm-pool" --etcd "$ETCD_URL" status || true
}

down_quiet() {
    [[ -e $RUN/state ]] || return 0
    local kind a b pids=()
    while read -r kind a b; do [[ $kind == pid ]] && pids+=("$a"); done <"$RUN/state"
    # Only the PIDs this cluster started; TERM first (announcers deregister, VMs shut down).
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for ((i = 0; i < 30; i++)); do
        local alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    # Namespaces and links, newest first. Deleting a namespace removes its eth0 and the peer.
    tac "$RUN/state" | while read -r kind a b; do
        case $kind in
            netns) ip netns pids "$a" 2>/dev/null | xargs -r kill -KILL 2>/dev/null || true
                   ip netns del "$a" 2>/dev/null || true ;;
            link) ! ip link show "$a" >/dev/null 2>&1 || ip link del "$a" ;;
        esac
    done
    rm -rf "$RUN"
}

down() {
    need_root
    [[ -e $RUN/state ]] || die "cluster '$NAME' is not up (no $RUN/state)"
    down_quiet
    echo "cluster '$NAME' down"
}

case $cmd in
    up) up ;;
    down) down ;;
    status) status ;;
    etcd-stop) etcd_stop ;;
    etcd-start) etcd_start ;;
    server-stop) server_stop ;;
    server-start) server_start ;;
    exec)
        need_root
        load_shape
        ((${#EXEC_ARGS[@]})) || die "exec needs a command after --"
        case $EXEC_NS in
            etcd|host[0-9]*|r[0-9]-ms[0-9]) ns="$NAME-$EXEC_NS" ;;
            *) die "unknown namespace '$EXEC_NS' (etcd, hostN, rK-msI)" ;;
        esac
        exec ip netns exec "$ns" "${EXEC_ARGS[@]}" ;;
    -h|--help|help) usage 0 ;;
    *) die "unknown command '$cmd' (up, down, status, exec, etcd-stop, etcd-start, server-stop, server-start)" ;;
esac
