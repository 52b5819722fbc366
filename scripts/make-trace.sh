#!/usr/bin/env bash
# Makes page-access traces of real programs: each program runs under valgrind's lackey
# (`valgrind --tool=lackey --trace-mem=yes`), whose memory log (a file, followed by `tail -f`)
# streams into `farvm-lab trace from-lackey` (data accesses -> 4 KiB pages, repeated accesses collapsed,
# reads and writes kept, bounded by --max-records), and the trace is compressed with zstd.
#
# Usage:
#   scripts/make-trace.sh WORKLOAD... [--out DIR]
#     WORKLOAD: the tuning set sqlite redis numpy sort xz mix; the test set cc1 perl pydict
#     pagerank java node bzip2 mix2; or tuning, test, all (traces/README.md)
#   scripts/make-trace.sh run NAME MAX_RECORDS -- COMMAND [ARGS...]   any program
# Output: DIR/NAME.trace.zst (DIR defaults to traces/). Inputs are generated with fixed seeds,
# so a rerun gives the same trace up to scheduling (the redis trace depends on how requests
# batch up in the server's event loop). Needs: valgrind, zstd, python3, and per workload
# sqlite3, redis-server, python3-numpy (Debian's /usr/bin/python3), coreutils sort, xz-utils;
# farvm-lab is taken from $FARVM_LAB or target/release/farvm-lab. Valgrind runs under
# `nice -n 10`.
set -euo pipefail
cd "$(dirname "$0")/.."

LAB=${FARVM_LAB:-target/release/farvm-lab}
PY=/usr/bin/python3
OUT=traces
# Records kept per trace (the committed traces' lengths; override with MAX_RECORDS). Under
# lackey a program runs ~1000x slower than natively, so each trace is the first part of its run.
max_for() {
    local default
    case $1 in
    sqlite) default=2166399 ;;
    redis) default=2935998 ;;
    numpy) default=4334804 ;;
    sort) default=694443 ;;
    xz) default=1500000 ;;
    cc1) default=1677581 ;;
    perl | pagerank) default=2000000 ;;
    pydict | java | node | bzip2) default=1000000 ;;
    *) default=20000000 ;;
    esac
    echo "${MAX_RECORDS:-$default}"
}

die() {
    echo "make-trace: $*" >&2
    exit 1
}
need() {
    for c in "$@"; do
        command -v "$c" >/dev/null 2>&1 || die "needs \`$c\` (apt-get install the Debian package that has it)"
    done
}
[[ -x $LAB ]] || die "no $LAB: build it with \`cargo build --release -p farvm-lab\` or set FARVM_LAB"
need valgrind zstd

WORK=$(mktemp -d /tmp/farvm-make-trace.XXXXXX)
trap 'jobs -p | xargs -r kill 2>/dev/null || true; rm -rf "$WORK"' EXIT

# lackey_start NAME MAX_RECORDS COMMAND...: starts COMMAND (standard input from $STDIN, default
# /dev/null) under lackey and the converter on its log; sets VG and CONV to their pids.
lackey_start() {
    local name=$1 max=$2
    shift 2
    # A regular file, not a FIFO: valgrind writes its log in small pieces, which through a pipe
    # cost a wake-up each (measured: half the speed).
    : >"$WORK/$name.log"
    nice -n 10 valgrind --tool=lackey --trace-mem=yes --log-file="$WORK/$name.log" "$@" \
        <"${STDIN:-/dev/null}" >"$WORK/$name.stdout" 2>"$WORK/$name.stderr" &
    VG=$!
    tail -c +1 -f --pid="$VG" "$WORK/$name.log" |
        "$LAB" trace from-lackey --max-records "$max" --format binary -o "$WORK/$name.trace" &
    CONV=$!
}

# lackey_finish NAME: waits until the program ends or the converter has its records, then
# compresses the trace into $OUT.
lackey_finish() {
    local name=$1
    while kill -0 "$VG" 2>/dev/null && kill -0 "$CONV" 2>/dev/null; do sleep 1; done
    # The trace is complete: stop the program at once (a SIGTERM handler could run on for long
    # under valgrind).
    kill -KILL "$VG" 2>/dev/null || true
    wait "$VG" 2>/dev/null || true
    wait "$CONV" || die "$name: conversion failed"
    rm -f "$WORK/$name.log"
    mkdir -p "$OUT"
    zstd -q -19 -f "$WORK/$name.trace" -o "$OUT/$name.trace.zst"
    echo "make-trace: $OUT/$name.trace.zst ($(stat -c %s "$OUT/$name.trace.zst") bytes)"
}

# A redis client that dies with the server is no failure once the converter has its records.
client_done() {
    kill -0 "$CONV" 2>/dev/null && die "$1" || true
}

# Batch program: NAME MAX COMMAND...
trace_run() {
    lackey_start "$@"
    lackey_finish "$1"
}

# OLTP-like: TPC-B-style transactions on an in-memory SQLite database of 20,000 accounts.
trace_sqlite() {
    need sqlite3 python3
    $PY - "$WORK/oltp.sql" <<'EOF'
import random, sys
r = random.Random(1)
n = 20_000
with open(sys.argv[1], "w") as f:
    f.write("CREATE TABLE accounts(id INTEGER PRIMARY KEY, branch INTEGER, balance INTEGER, filler TEXT);\n")
    f.write("CREATE TABLE history(id INTEGER PRIMARY KEY, account INTEGER, delta INTEGER, filler TEXT);\n")
    f.write(f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<{n}) "
            "INSERT INTO accounts SELECT x, x % 100, 0, printf('%080d', x) FROM c;\n")
    f.write("CREATE INDEX accounts_branch ON accounts(branch);\n")
    for t in range(3_000):
        a, d = r.randrange(1, n + 1), r.randrange(-5000, 5000)
        f.write(f"BEGIN; UPDATE accounts SET balance = balance + {d} WHERE id = {a}; "
                f"SELECT balance FROM accounts WHERE id = {a}; "
                f"INSERT INTO history(account, delta, filler) VALUES ({a}, {d}, '{'x' * 40}'); COMMIT;\n")
EOF
    STDIN="$WORK/oltp.sql" trace_run sqlite "$(max_for sqlite)" sqlite3 :memory:
}

# Key-value server: redis-server with 10,000 keys of 512 bytes, then 30,000 Zipf(0.99) GETs
# from a small pipelining client (Python standard library).
trace_redis() {
    need redis-server python3
    local port=16399
    lackey_start redis "$(max_for redis)" redis-server --port $port --save '' --appendonly no \
        --io-threads 1 --daemonize no
    $PY - $port <<'EOF' || client_done "redis client failed"
import random, socket, sys, time
port = int(sys.argv[1])
for _ in range(600):
    try:
        s = socket.create_connection(("127.0.0.1", port))
        break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit("redis-server did not start")
f = s.makefile("rb")
def cmd(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out
def reply():
    line = f.readline()
    if line[:1] == b"$":
        n = int(line[1:])
        if n >= 0:
            f.read(n + 2)
    elif line[:1] == b"-":
        sys.exit("redis error: %r" % line)
def batch(cmds):
    s.sendall(b"".join(cmds))
    for _ in cmds:
        reply()
r = random.Random(1)
keys, batch_size = 10_000, 50
for i in range(0, keys, batch_size):
    batch([cmd("SET", "key:%d" % k, r.randbytes(256).hex()) for k in range(i, i + batch_size)])
# Zipf(0.99) over ranks; ranks map to keys by a fixed shuffle (popularity is not key order).
ranks = list(range(keys))
r.shuffle(ranks)
weights = [1.0 / (k + 1) ** 0.99 for k in range(keys)]
gets = r.choices(ranks, weights=weights, k=30_000)
for i in range(0, len(gets), batch_size):
    batch([cmd("GET", "key:%d" % k) for k in gets[i:i + batch_size]])
try:
    s.sendall(cmd("SHUTDOWN", "NOSAVE"))
except OSError:
    pass
EOF
    lackey_finish redis
}

# Numeric kernel: NumPy on float64 matrices: a transposed copy of a 512x512 matrix (strided
# reads), a triad, and C = A @ B on 256x256 (Debian's NumPy calls the system BLAS for it).
trace_numpy() {
    need python3
    $PY -c 'import numpy' 2>/dev/null || die "needs python3-numpy for $PY"
    # Environment for the traced program is set outside valgrind: lackey does not follow an exec.
    OPENBLAS_NUM_THREADS=1 trace_run numpy "$(max_for numpy)" $PY -c '
import numpy as np
rng = np.random.default_rng(1)
a = rng.random((512, 512))
b = rng.random((512, 512))
t = a.T.copy()
s = 2.5 * a + b
c = a[:256, :256] @ b[:256, :256]
print(float(t.sum() + s.sum() + c.sum()))'
}

# Sort: GNU sort of 100,000 random lines (about 2 MB), one thread, all in memory.
trace_sort() {
    need sort python3
    $PY - "$WORK/sort.in" <<'EOF'
import random, sys
r = random.Random(1)
words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
with open(sys.argv[1], "w") as f:
    for i in range(100_000):
        f.write("%08x %s %d\n" % (r.getrandbits(32), r.choice(words), r.randrange(10**6)))
EOF
    LC_ALL=C trace_run sort "$(max_for sort)" sort --parallel=1 -S 64M -o "$WORK/sort.out" "$WORK/sort.in"
}

# Compressor: xz -6 (8 MiB dictionary), one thread, on 8 MB of generated text.
trace_xz() {
    need xz python3
    $PY - "$WORK/xz.in" <<'EOF'
import random, sys
r = random.Random(1)
vocab = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randrange(2, 10)))
         for _ in range(5000)]
with open(sys.argv[1], "w") as f:
    size = 0
    while size < 8_000_000:
        line = " ".join(r.choice(vocab) for _ in range(r.randrange(5, 15))) + "\n"
        f.write(line)
        size += len(line)
EOF
    trace_run xz "$(max_for xz)" xz -6 -T1 -c "$WORK/xz.in"
}

# Two processes: the numeric kernel and the key-value server, interleaved 100 records at a time.
trace_mix() {
    for t in numpy redis; do
        [[ -f $OUT/$t.trace.zst ]] || die "mix needs $OUT/$t.trace.zst: make it first"
    done
    mkdir -p "$OUT"
    "$LAB" trace mix --quantum 100 "$OUT/numpy.trace.zst" "$OUT/redis.trace.zst" -o "$WORK/mix.trace"
    zstd -q -19 -f "$WORK/mix.trace" -o "$OUT/mix-numpy-redis.trace.zst"
    echo "make-trace: $OUT/mix-numpy-redis.trace.zst ($(stat -c %s "$OUT/mix-numpy-redis.trace.zst") bytes)"
}

# --- The test set (traces/README.md): programs never used to tune the prefetchers. ---

# C compiler: GCC 12's cc1 (called directly: lackey does not follow the driver's exec) at -O2
# on libpng's pngtest.c (libpng-dev's examples), a real 63 KB source file with its headers.
trace_cc1() {
    need gcc
    [[ -f /usr/share/doc/libpng-dev/examples/pngtest.c ]] || die "cc1 needs libpng-dev"
    trace_run cc1 "$(max_for cc1)" "$(gcc -print-prog-name=cc1)" -quiet -imultiarch x86_64-linux-gnu \
        -I/usr/include/libpng16 -O2 /usr/share/doc/libpng-dev/examples/pngtest.c -o "$WORK/pngtest.s"
}

# Interpreter with a large hash: Perl 5.36 builds a hash of 200,000 string keys, then does
# 400,000 lookups and updates at random keys (Perl's own PRNG, seed 1).
trace_perl() {
    need perl
    trace_run perl "$(max_for perl)" perl -e '
srand(1);
my %h;
for my $i (0 .. 199_999) { $h{"key:$i"} = [$i, "v" x (8 + $i % 24)]; }
my $sum = 0;
for (1 .. 400_000) {
    my $k = "key:" . int(rand(200_000));
    $sum += $h{$k}[0];
    $h{$k}[0]++;
}
print "$sum\n";'
}

# Python with a large dict: 300,000 tuple-valued entries under string keys, then 600,000
# Zipf(0.9)-distributed lookups and updates (popularity not in insertion order).
trace_pydict() {
    need python3
    trace_run pydict "$(max_for pydict)" $PY -c '
import random
r = random.Random(1)
n = 300_000
d = {}
for i in range(n):
    d["user:%d" % i] = (i, r.random(), "x" * (i % 32))
order = list(range(n))
r.shuffle(order)
w = [1.0 / (k + 1) ** 0.9 for k in range(n)]
total = 0.0
for k in r.choices(order, weights=w, k=600_000):
    key = "user:%d" % k
    i, x, s = d[key]
    d[key] = (i, x + 1.0, s)
    total += x
print(total)'
}

# Graph computation: PageRank (20 power iterations, damping 0.85) in pure Python over a
# compressed-sparse-row graph of 60,000 vertices and about 480,000 edges with a power-law
# (preferential-attachment) degree distribution, generated first from seed 1 (no real graph
# ships in Debian; the generator is the traced program's first phase).
trace_pagerank() {
    need python3
    trace_run pagerank "$(max_for pagerank)" $PY -c '
import random
from array import array
r = random.Random(1)
n, m = 60_000, 8
targets = list(range(m))
ends = []
src, dst = array("l"), array("l")
for v in range(m, n):
    for t in set(r.choice(ends) if ends and r.random() < 0.9 else r.randrange(v) for _ in range(m)):
        src.append(v); dst.append(t); ends.append(t); ends.append(v)
deg = array("l", [0]) * n
for s in src:
    deg[s] += 1
off = array("l", [0]) * (n + 1)
for v in range(n):
    off[v + 1] = off[v] + deg[v]
col, fill = array("l", [0]) * len(src), array("l", off)
for s, t in zip(src, dst):
    col[fill[s]] = t; fill[s] += 1
rank = array("d", [1.0 / n]) * n
for it in range(20):
    nxt = array("d", [0.15 / n]) * n
    for v in range(n):
        a, b = off[v], off[v + 1]
        if b > a:
            share = 0.85 * rank[v] / (b - a)
            for e in range(a, b):
                nxt[col[e]] += share
    rank = nxt
print(max(rank))'
}

# JVM with a generational GC: OpenJDK 17, serial collector, a 64 MB heap; a program keeps a
# 200,000-entry HashMap of records it replaces at random (old generation) while allocating
# short-lived strings and arrays (young generation). Compiled natively with javac first.
trace_java() {
    need java javac
    mkdir -p "$WORK/java"
    cat >"$WORK/java/Churn.java" <<'EOF'
import java.util.HashMap;
import java.util.Random;

public class Churn {
    record Item(long id, String name, double[] values) {}

    public static void main(String[] args) {
        Random r = new Random(1);
        HashMap<Long, Item> live = new HashMap<>();
        long sum = 0;
        for (long i = 0; i < 5_000_000L; i++) {
            long k = r.nextInt(200_000);
            String name = "item-" + k + "-" + i;
            double[] v = new double[4 + r.nextInt(28)];
            v[0] = i;
            if (i % 4 == 0) {
                live.put(k, new Item(k, name, v));
            } else {
                Item it = live.get(k);
                if (it != null) sum += it.name().length() + (long) it.values()[0];
            }
        }
        System.out.println(sum + " " + live.size());
    }
}
EOF
    javac -d "$WORK/java" "$WORK/java/Churn.java"
    trace_run java "$(max_for java)" java -Xint -XX:+UseSerialGC -Xms64m -Xmx64m -Xshare:off \
        -XX:-UsePerfData -cp "$WORK/java" Churn
}

# JavaScript with a generational GC: Node.js 20 (V8), a Map of 150,000 objects replaced at
# random while short-lived strings and arrays are allocated.
trace_node() {
    need node
    trace_run node "$(max_for node)" node --max-old-space-size=128 -e '
let seed = 1;
const rand = () => { seed = (Math.imul(seed, 1103515245) + 12345) >>> 0; return seed / 4294967296; };
const live = new Map();
let sum = 0;
for (let i = 0; i < 3000000; i++) {
  const k = Math.floor(rand() * 150000);
  const tmp = new Array(4 + Math.floor(rand() * 28)).fill(i);
  if (i % 4 === 0) live.set(k, { id: k, name: "item-" + k + "-" + i, values: tmp });
  else { const it = live.get(k); if (it) sum += it.name.length + it.values[0]; }
}
console.log(sum, live.size);'
}

# Block-sorting compressor: bzip2 -9 (900 KB blocks) on 6 MB of generated text.
trace_bzip2() {
    need bzip2 python3
    $PY - "$WORK/bz.in" <<'EOF'
import random, sys
r = random.Random(2)
vocab = ["".join(r.choice("etaoinshrdlucmfwyp") for _ in range(r.randrange(2, 12)))
         for _ in range(8000)]
with open(sys.argv[1], "w") as f:
    size = 0
    while size < 6_000_000:
        line = " ".join(r.choice(vocab) for _ in range(r.randrange(4, 16))) + "\n"
        f.write(line)
        size += len(line)
EOF
    trace_run bzip2 "$(max_for bzip2)" bzip2 -9 -c "$WORK/bz.in"
}

# Two processes of the test set: the Python dict program and the graph computation,
# interleaved 100 records at a time.
trace_mix2() {
    for t in pydict pagerank; do
        [[ -f $OUT/$t.trace.zst ]] || die "mix2 needs $OUT/$t.trace.zst: make it first"
    done
    mkdir -p "$OUT"
    "$LAB" trace mix --quantum 100 "$OUT/pydict.trace.zst" "$OUT/pagerank.trace.zst" -o "$WORK/mix2.trace"
    zstd -q -19 -f "$WORK/mix2.trace" -o "$OUT/mix-pydict-pagerank.trace.zst"
    echo "make-trace: $OUT/mix-pydict-pagerank.trace.zst ($(stat -c %s "$OUT/mix-pydict-pagerank.trace.zst") bytes)"
}

if [[ ${1:-} == run ]]; then
    [[ $# -ge 5 && $4 == -- ]] || die "usage: $0 run NAME MAX_RECORDS -- COMMAND [ARGS...]"
    name=$2 max=$3
    shift 4
    trace_run "$name" "$max" "$@"
    exit 0
fi
todo=()
while (($#)); do
    case $1 in
    --out) OUT=$2; shift 2 ;;
    tuning) todo+=(sqlite redis numpy sort xz mix); shift ;;
    test) todo+=(cc1 perl pydict pagerank java node bzip2 mix2); shift ;;
    all) todo+=(sqlite redis numpy sort xz mix cc1 perl pydict pagerank java node bzip2 mix2); shift ;;
    sqlite | redis | numpy | sort | xz | mix | cc1 | perl | pydict | pagerank | java | node | bzip2 | mix2)
        todo+=("$1")
        shift
        ;;
    *) die "unknown workload \`$1\` (see the usage line)" ;;
    esac
done
((${#todo[@]})) || die "usage: $0 WORKLOAD... [--out DIR] (tuning set: sqlite redis numpy sort xz mix; test set: cc1 perl pydict pagerank java node bzip2 mix2; or tuning, test, all)"
for t in "${todo[@]}"; do
    "trace_$t"
done
