#!/usr/bin/env bash
# Makes page-access traces of real programs: each program runs under valgrind's lackey
# (`valgrind --tool=lackey --trace-mem=yes`), whose memory log (a file, followed by `tail -f`)
# streams into `farvm-lab trace from-lackey` (data accesses -> 4 KiB pages, repeated accesses collapsed,
# reads and writes kept, bounded by --max-records), and the trace is compressed with zstd.
#
# Usage:
#   scripts/make-trace.sh WORKLOAD... [--out DIR]
#     WORKLOAD: the original tuning set sqlite redis numpy sort xz mix; the first test set (seen,
#     now tuning data) cc1 perl pydict pagerank java node bzip2 mix2; the second test set (seen,
#     now tuning data) gawk gzip zstd sqlite-range pyheap bfs lua jq; the third test set (seen,
#     now tuning data) ruby ocaml lame x264 magick cxxmap xmllint brotli; the test set git php
#     tcl pandoc gs cc1plus guile diff; the held-out set (not yet run through any prefetcher;
#     written with --out traces/held-out) dot minisat lz4 glpsol hunspell zopfli; or
#     tuning, test (the first test set), fresh (the second), third, fourth (the test set),
#     held-out, all (traces/README.md)
#   scripts/make-trace.sh run NAME MAX_RECORDS -- COMMAND [ARGS...]   any program
# Output: DIR/NAME.trace.zst (DIR defaults to traces/). Inputs are generated with fixed seeds,
# so a rerun gives the same trace up to scheduling (the redis trace depends on how requests
# batch up in the server's event loop). Needs: valgrind, zstd, python3, and per workload
# sqlite3, redis-server, python3-numpy (Debian's /usr/bin/python3), coreutils sort, xz-utils,
# gawk, gzip, zstd, gcc, lua5.4, jq, ruby, ocaml-nox, lame, x264, imagemagick (6), g++,
# libxml2-utils, brotli, git, php-cli, tcl, pandoc, ghostscript, guile-3.0; LACKEY_SECONDS stops a capture after that many seconds;
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
    zstd) default=472436 ;;
    jq) default=219300 ;;
    gawk | gzip | sqlite-range | pyheap | bfs | lua) default=1000000 ;;
    ruby | ocaml | lame | x264 | magick | cxxmap | xmllint | brotli) default=1000000 ;;
    git | php | tcl | pandoc | gs | cc1plus | guile | diff) default=1000000 ;;
    dot | minisat | lz4 | glpsol | hunspell | zopfli) default=1000000 ;;
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

[[ -z ${LACKEY_SECONDS:-} || $LACKEY_SECONDS =~ ^[1-9][0-9]{0,8}$ ]] ||
    die "LACKEY_SECONDS must be a whole number of seconds (1 or more), got \`$LACKEY_SECONDS\`"

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

# lackey_finish NAME: waits until the program ends, the converter has its records or
# LACKEY_SECONDS (if set) have passed under lackey, then compresses the trace into $OUT.
lackey_finish() {
    local name=$1 deadline=$((SECONDS + ${LACKEY_SECONDS:-1000000000}))
    while kill -0 "$VG" 2>/dev/null && kill -0 "$CONV" 2>/dev/null; do
        ((SECONDS < deadline)) || {
            echo "make-trace: $name: stopped after ${LACKEY_SECONDS}s under lackey" >&2
            break
        }
        sleep 1
    done
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

# --- The first test set (traces/README.md): seen once, tuning data since. ---

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

# Two processes of the first test set: the Python dict program and the graph computation,
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

# --- The second test set (traces/README.md): captured after the first test set's results were
# seen; tuning data since its own results were seen. ---

# Text processing with an associative array: GNU awk counts the words of 3 MB of generated
# text (Zipf-like vocabulary of 40,000 words), then prints them in sorted order.
trace_gawk() {
    need gawk python3
    $PY - "$WORK/gawk.in" <<'EOF'
import random, sys
r = random.Random(3)
vocab = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randrange(3, 12)))
         for _ in range(40_000)]
weights = [1.0 / (k + 1) ** 0.8 for k in range(len(vocab))]
with open(sys.argv[1], "w") as f:
    size = 0
    while size < 3_000_000:
        line = " ".join(r.choices(vocab, weights=weights, k=r.randrange(6, 14))) + "\n"
        f.write(line)
        size += len(line)
EOF
    trace_run gawk "$(max_for gawk)" gawk '{ for (i = 1; i <= NF; i++) n[$i]++ }
END { PROCINFO["sorted_in"] = "@val_num_desc"; for (w in n) print n[w], w }' "$WORK/gawk.in"
}

# Deflate: gzip -9 of 8 MB of generated log lines (timestamps, addresses, counters).
trace_gzip() {
    need gzip python3
    $PY - "$WORK/gzip.in" <<'EOF'
import random, sys
r = random.Random(4)
paths = ["/api/v1/%s/%d" % (r.choice(["user", "item", "cart", "order"]), r.randrange(1000))
         for _ in range(3000)]
with open(sys.argv[1], "w") as f:
    size, t = 0, 1_700_000_000
    while size < 8_000_000:
        t += r.randrange(0, 3)
        line = "%d 10.%d.%d.%d GET %s %d %d\n" % (t, r.randrange(256), r.randrange(256),
               r.randrange(256), r.choice(paths), r.choice([200, 200, 200, 304, 404]),
               r.randrange(100, 50_000))
        f.write(line)
        size += len(line)
EOF
    trace_run gzip "$(max_for gzip)" gzip -9 -c "$WORK/gzip.in"
}

# Zstandard at level 19 (8 MiB window, binary-tree match finder), one thread, on 8 MB of
# generated text.
trace_zstd() {
    need zstd python3
    $PY - "$WORK/zstd.in" <<'EOF'
import random, sys
r = random.Random(5)
vocab = ["".join(r.choice("aeioubcdfghklmnprstvz") for _ in range(r.randrange(2, 11)))
         for _ in range(12_000)]
with open(sys.argv[1], "w") as f:
    size = 0
    while size < 8_000_000:
        line = " ".join(r.choice(vocab) for _ in range(r.randrange(3, 18))) + ".\n"
        f.write(line)
        size += len(line)
EOF
    trace_run zstd "$(max_for zstd)" zstd -19 --single-thread -q -c "$WORK/zstd.in"
}

# Analytics on SQLite: an in-memory table of 60,000 orders with two secondary indexes, then
# range scans over the indexes, a GROUP BY, an ORDER BY ... LIMIT and a self-join.
trace_sqlite_range() {
    need sqlite3 python3
    $PY - "$WORK/range.sql" <<'EOF'
import random, sys
r = random.Random(6)
n = 60_000
with open(sys.argv[1], "w") as f:
    f.write("CREATE TABLE orders(id INTEGER PRIMARY KEY, customer INTEGER, day INTEGER, amount REAL, note TEXT);\n")
    f.write(f"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x<{n}) "
            "INSERT INTO orders SELECT x, abs(random()) % 5000, abs(random()) % 3650, "
            "(abs(random()) % 100000) / 100.0, printf('%040d', x) FROM c;\n")
    f.write("CREATE INDEX orders_day ON orders(day);\n")
    f.write("CREATE INDEX orders_customer ON orders(customer, amount);\n")
    for q in range(400):
        d = r.randrange(0, 3600)
        c = r.randrange(0, 5000)
        f.write(f"SELECT count(*), sum(amount) FROM orders WHERE day BETWEEN {d} AND {d + r.randrange(5, 60)};\n")
        f.write(f"SELECT id, amount FROM orders WHERE customer = {c} ORDER BY amount DESC LIMIT 5;\n")
        if q % 40 == 0:
            f.write("SELECT customer, sum(amount) AS s FROM orders GROUP BY customer ORDER BY s DESC LIMIT 10;\n")
            f.write(f"SELECT count(*) FROM orders a JOIN orders b ON a.customer = b.customer "
                    f"WHERE a.day BETWEEN {d} AND {d + 3} AND b.amount > a.amount;\n")
EOF
    STDIN="$WORK/range.sql" trace_run sqlite-range "$(max_for sqlite-range)" sqlite3 :memory:
}

# Priority queue: Dijkstra's shortest paths in Python (heapq) over a 250x250 grid graph with
# random edge weights, its distances and adjacency in lists.
trace_pyheap() {
    need python3
    trace_run pyheap "$(max_for pyheap)" $PY -c '
import heapq, random
r = random.Random(7)
w = h = 250
n = w * h
adj = [[] for _ in range(n)]
for v in range(n):
    x, y = v % w, v // w
    if x + 1 < w:
        c = r.randrange(1, 100); adj[v].append((v + 1, c)); adj[v + 1].append((v, c))
    if y + 1 < h:
        c = r.randrange(1, 100); adj[v].append((v + w, c)); adj[v + w].append((v, c))
for src in (0, n // 2 + w // 2):
    dist = [1 << 60] * n
    dist[src] = 0
    pq = [(0, src)]
    while pq:
        d, v = heapq.heappop(pq)
        if d > dist[v]:
            continue
        for u, c in adj[v]:
            nd = d + c
            if nd < dist[u]:
                dist[u] = nd
                heapq.heappush(pq, (nd, u))
    print(max(dist))'
}

# Graph traversal in C: breadth-first search from 8 sources over a random graph of 60,000
# vertices and 480,000 directed edges in compressed sparse rows, built by the program (a
# counting sort of the edge list). Compiled natively with gcc -O2 first.
trace_bfs() {
    need gcc
    cat >"$WORK/bfs.c" <<'EOF'
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t state = 8;
static uint32_t next_random(void) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(state >> 33);
}

int main(void) {
    const uint32_t n = 60000, m = 480000;
    uint32_t *src = malloc(m * sizeof *src), *dst = malloc(m * sizeof *dst);
    uint32_t *off = calloc(n + 1, sizeof *off), *col = malloc(m * sizeof *col);
    int32_t *level = malloc(n * sizeof *level);
    uint32_t *queue = malloc(n * sizeof *queue);
    if (!src || !dst || !off || !col || !level || !queue) return 1;
    for (uint32_t e = 0; e < m; e++) {
        src[e] = next_random() % n;
        dst[e] = next_random() % n;
        off[src[e] + 1]++;
    }
    for (uint32_t v = 0; v < n; v++) off[v + 1] += off[v];
    for (uint32_t e = 0; e < m; e++) col[off[src[e]]++] = dst[e];
    for (uint32_t v = n; v > 0; v--) off[v] = off[v - 1];
    off[0] = 0;
    uint64_t reached = 0;
    for (int s = 0; s < 8; s++) {
        for (uint32_t v = 0; v < n; v++) level[v] = -1;
        uint32_t head = 0, tail = 0, root = next_random() % n;
        level[root] = 0;
        queue[tail++] = root;
        while (head < tail) {
            uint32_t v = queue[head++];
            for (uint32_t e = off[v]; e < off[v + 1]; e++)
                if (level[col[e]] < 0) {
                    level[col[e]] = level[v] + 1;
                    queue[tail++] = col[e];
                }
        }
        reached += tail;
    }
    printf("%llu\n", (unsigned long long)reached);
    return 0;
}
EOF
    gcc -O2 -o "$WORK/bfs" "$WORK/bfs.c"
    trace_run bfs "$(max_for bfs)" "$WORK/bfs"
}

# Lua tables: Lua 5.4 builds a table of 150,000 records under string keys, sorts an array of
# them with a comparison function, then updates random keys.
trace_lua() {
    need lua5.4
    trace_run lua "$(max_for lua)" lua5.4 -e '
math.randomseed(9)
local t, arr = {}, {}
for i = 1, 150000 do
  local rec = { id = i, score = math.random(), name = "rec" .. i }
  t["k" .. i] = rec
  arr[#arr + 1] = rec
end
table.sort(arr, function(a, b) return a.score < b.score end)
local sum = 0
for _ = 1, 600000 do
  local rec = t["k" .. math.random(150000)]
  rec.score = rec.score + 1
  sum = sum + rec.id
end
print(sum, arr[1].id)'
}

# JSON: jq parses 4 MB of generated JSON (an array of 40,000 objects), then groups, sorts and
# sums them.
trace_jq() {
    need jq python3
    $PY - "$WORK/jq.json" <<'EOF'
import json, random, sys
r = random.Random(10)
items = [{"id": i, "user": "u%d" % r.randrange(3000), "tags": [r.choice("abcdefgh") for _ in range(r.randrange(1, 5))],
          "price": r.randrange(100, 100000) / 100, "qty": r.randrange(1, 20)} for i in range(40_000)]
with open(sys.argv[1], "w") as f:
    json.dump(items, f)
EOF
    trace_run jq "$(max_for jq)" jq -c 'group_by(.user) | map({user: .[0].user, total: (map(.price * .qty) | add), n: length}) | sort_by(-.total) | .[:20]' "$WORK/jq.json"
}

# --- The third test set (traces/README.md; seen once, tuning data since): captured after the
# second test set's results were seen. They were captured with LACKEY_SECONDS=480: a program
# still running after 8 minutes under lackey was stopped there, its trace the records so far. ---

# Garbage-collected allocation in Ruby: binary trees of depth 4..16 built and checked, with a
# long-lived tree kept alive beside them (Ruby 3.1's generational mark-and-sweep).
trace_ruby() {
    need ruby
    trace_run ruby "$(max_for ruby)" ruby -e '
Node = Struct.new(:left, :right)
def make(d) = d.zero? ? Node.new(nil, nil) : Node.new(make(d - 1), make(d - 1))
def check(n) = n.left ? 1 + check(n.left) + check(n.right) : 1
long_lived = make(16)
total = 0
4.step(16, 2) do |d|
  (1 << (16 - d + 4)).times { total += check(make(d)) }
end
puts total + check(long_lived)'
}

# A functional program in OCaml (native code, ocamlopt): a persistent balanced-tree map of
# 200,000 integer keys built and updated at random, lists sorted and folded (OCaml's
# generational collector: a bump-allocated minor heap, promotion into the major heap).
trace_ocaml() {
    need ocamlopt
    cat >"$WORK/omap.ml" <<'EOF'
module M = Map.Make (Int)

let () =
  Random.init 12;
  let n = 200_000 in
  let m = ref M.empty in
  for i = 1 to n do
    m := M.add (Random.int (4 * n)) (i, string_of_int i) !m
  done;
  for _ = 1 to 300_000 do
    let k = Random.int (4 * n) in
    m := M.update k (function None -> Some (k, "new") | Some (a, s) -> Some (a + 1, s)) !m
  done;
  let l = M.bindings !m |> List.map (fun (k, (a, _)) -> (a * 7919) mod 1_000_003 + k) in
  let s = List.sort compare l in
  Printf.printf "%d %d\n" (M.cardinal !m) (List.fold_left ( + ) 0 s)
EOF
    (cd "$WORK" && ocamlopt -O2 -o omap omap.ml 2>/dev/null || ocamlopt -o omap omap.ml)
    trace_run ocaml "$(max_for ocaml)" "$WORK/omap"
}

# An audio encoder: LAME encodes 60 s of generated 44.1 kHz stereo (chords, noise bursts) to a
# 192 kbit/s MP3 at its highest quality setting (-q 0).
trace_lame() {
    need lame python3
    $PY - "$WORK/in.wav" <<'EOF'
import math, random, struct, sys, wave
r = random.Random(13)
rate, secs = 44100, 60
with wave.open(sys.argv[1], "wb") as w:
    w.setnchannels(2); w.setsampwidth(2); w.setframerate(rate)
    freqs = [220.0, 277.2, 329.6]
    frames = bytearray()
    for i in range(rate * secs):
        if i % rate == 0:
            freqs = [r.choice([110, 147, 196, 220, 262, 330, 392, 440]) * k for k in (1, 1.26, 1.5)]
        t = i / rate
        s = sum(math.sin(2 * math.pi * f * t) for f in freqs) / 3
        if (i // 4410) % 7 == 3:
            s += r.uniform(-0.3, 0.3)
        v = int(12000 * s)
        frames += struct.pack("<hh", v, int(v * 0.8))
    w.writeframes(bytes(frames))
EOF
    trace_run lame "$(max_for lame)" lame --quiet -q 0 -b 192 "$WORK/in.wav" "$WORK/out.mp3"
}

# A video encoder: x264 (preset slow, one thread, no lookahead thread) encodes 40 generated
# 480x272 frames (moving gradients and squares over noise) to H.264: motion search over
# reference frames.
trace_x264() {
    need x264 python3
    $PY - "$WORK/in.y4m" <<'EOF'
import random, sys
r = random.Random(14)
w, h, n = 480, 272, 40
noise = bytes(r.randrange(0, 24) for _ in range(w * h))
with open(sys.argv[1], "wb") as f:
    f.write(b"YUV4MPEG2 W%d H%d F25:1 Ip A1:1 C420jpeg\n" % (w, h))
    for k in range(n):
        y = bytearray(w * h)
        for row in range(h):
            base = row * w
            for col in range(w):
                y[base + col] = ((col + 3 * k) ^ (row - 2 * k)) & 0xFF
        for (sx, sy, vx, vy) in ((40, 30, 5, 2), (300, 150, -4, 3), (200, 60, 2, -2)):
            x0, y0 = (sx + vx * k) % (w - 48), (sy + vy * k) % (h - 48)
            for row in range(y0, y0 + 48):
                y[row * w + x0: row * w + x0 + 48] = bytes([200]) * 48
        for i in range(0, w * h, 7):
            y[i] = (y[i] + noise[i]) & 0xFF
        f.write(b"FRAME\n" + bytes(y) + bytes([128]) * (w * h // 2))
EOF
    trace_run x264 "$(max_for x264)" x264 --quiet --preset slow --threads 1 --no-progress \
        --log-level none -o "$WORK/out.264" "$WORK/in.y4m"
}

# Image processing: ImageMagick 6 (one thread) blurs, rotates and resizes a generated
# 1200x1200 RGB image: separable filters, row and column passes.
trace_magick() {
    need convert-im6.q16 python3
    $PY - "$WORK/in.ppm" <<'EOF'
import random, sys
r = random.Random(15)
w = h = 1200
with open(sys.argv[1], "wb") as f:
    f.write(b"P6 %d %d 255\n" % (w, h))
    row = bytearray(3 * w)
    for y in range(h):
        for x in range(w):
            row[3 * x] = (x * 255 // w) & 0xFF
            row[3 * x + 1] = (y * 255 // h) & 0xFF
            row[3 * x + 2] = ((x ^ y) + r.randrange(16)) & 0xFF
        f.write(bytes(row))
EOF
    MAGICK_THREAD_LIMIT=1 trace_run magick "$(max_for magick)" convert-im6.q16 -limit thread 1 \
        "$WORK/in.ppm" -blur 0x4 -rotate 17 -resize 70% "$WORK/out.ppm"
}

# Pointer-chasing containers in C++ (g++ -O2, libstdc++): a std::map (red-black tree) of
# 200,000 string values under random keys, lookups and erasures through it, a std::unordered_map
# of the same keys, then a std::sort of a vector of records.
trace_cxxmap() {
    need g++
    cat >"$WORK/cxxmap.cc" <<'EOF'
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

struct Rec { uint64_t key; double score; std::string name; };

int main() {
    std::mt19937_64 rng(16);
    std::map<uint64_t, std::string> tree;
    std::unordered_map<uint64_t, uint32_t> hash;
    for (uint32_t i = 0; i < 200000; i++) {
        uint64_t k = rng() % 1000000;
        tree[k] = "value-" + std::to_string(i);
        hash[k] = i;
    }
    uint64_t sum = 0;
    for (uint32_t i = 0; i < 300000; i++) {
        uint64_t k = rng() % 1000000;
        auto it = tree.lower_bound(k);
        if (it != tree.end()) { sum += it->second.size(); if (i % 3 == 0) tree.erase(it); }
        auto h = hash.find(k);
        if (h != hash.end()) sum += h->second;
    }
    std::vector<Rec> v;
    for (auto &kv : tree) v.push_back({kv.first, double(rng() % 100000), kv.second});
    std::sort(v.begin(), v.end(), [](const Rec &a, const Rec &b) { return a.score < b.score; });
    std::printf("%zu %llu %s\n", v.size(), (unsigned long long)sum, v[0].name.c_str());
    return 0;
}
EOF
    g++ -O2 -o "$WORK/cxxmap" "$WORK/cxxmap.cc"
    trace_run cxxmap "$(max_for cxxmap)" "$WORK/cxxmap"
}

# XML: libxml2's xmllint parses 3 MB of generated XML into a tree (40,000 elements with
# attributes and text), then evaluates an XPath expression over it.
trace_xmllint() {
    need xmllint python3
    $PY - "$WORK/in.xml" <<'EOF'
import random, sys
r = random.Random(17)
with open(sys.argv[1], "w") as f:
    f.write("<catalog>\n")
    for i in range(40_000):
        f.write('<item id="%d" cat="c%d" price="%.2f"><name>%s</name><tags>%s</tags></item>\n' % (
            i, r.randrange(300), r.randrange(100, 100000) / 100,
            "".join(r.choice("abcdefghijklmnop") for _ in range(r.randrange(5, 20))),
            " ".join(r.choice(["red", "blue", "big", "small", "new", "old"]) for _ in range(r.randrange(1, 5)))))
    f.write("</catalog>\n")
EOF
    trace_run xmllint "$(max_for xmllint)" xmllint --noout \
        --xpath 'sum(//item[@cat="c7" or contains(tags, "big")]/@price)' "$WORK/in.xml"
}

# Brotli at quality 11 with a 4 MiB window (-w 22; its Zopfli-style optimal parsing and
# hash-binary-tree match finder) on 6 MB of generated source-like text.
trace_brotli() {
    need brotli python3
    $PY - "$WORK/brotli.in" <<'EOF'
import random, sys
r = random.Random(18)
idents = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(r.randrange(3, 14)))
          for _ in range(5000)]
with open(sys.argv[1], "w") as f:
    size = 0
    while size < 6_000_000:
        a, b, c = r.choice(idents), r.choice(idents), r.choice(idents)
        line = r.choice(["    let %s = %s(%s);\n", "    if %s > %s { return %s; }\n",
                         "fn %s(%s: u64) -> %s {\n", "    %s.push(%s + %s);\n"]) % (a, b, c)
        f.write(line)
        size += len(line)
EOF
    trace_run brotli "$(max_for brotli)" brotli -q 11 -w 22 -c "$WORK/brotli.in"
}

# --- The test set, first held out (traces/README.md; `fourth`): captured after the third test set's
# results were seen, and not run through any prefetcher until its split was recorded. Captured
# with LACKEY_SECONDS=480. ---

# Delta compression in git: `git pack-objects` (one thread, window 50) packs every object of a
# generated repository of 200 commits that edit 40 text files.
trace_git() {
    need git python3
    local repo="$WORK/repo"
    git init -q "$repo"
    $PY - "$repo" <<'EOF'
import os, random, subprocess, sys
repo = sys.argv[1]
r = random.Random(21)
words = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randrange(3, 9))) for _ in range(3000)]
files = {f"src/f{i:02}.txt": [" ".join(r.choice(words) for _ in range(12)) for _ in range(400)] for i in range(40)}
env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
           GIT_COMMITTER_EMAIL="t@e", GIT_AUTHOR_DATE="2026-01-01T00:00:00Z",
           GIT_COMMITTER_DATE="2026-01-01T00:00:00Z")
os.makedirs(os.path.join(repo, "src"), exist_ok=True)
for c in range(200):
    for name in r.sample(sorted(files), 6):
        lines = files[name]
        for _ in range(r.randrange(1, 12)):
            lines[r.randrange(len(lines))] = " ".join(r.choice(words) for _ in range(12))
        if r.random() < 0.3:
            lines.insert(r.randrange(len(lines)), " ".join(r.choice(words) for _ in range(12)))
    for name, lines in files.items():
        with open(os.path.join(repo, name), "w") as f:
            f.write("\n".join(lines) + "\n")
    subprocess.run(["git", "-C", repo, "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", repo, "commit", "-q", "-m", f"c{c}"], check=True, env=env)
EOF
    git -C "$repo" rev-list --objects --all >"$WORK/objects"
    STDIN="$WORK/objects" trace_run git "$(max_for git)" git -C "$repo" pack-objects \
        --threads=1 --window=50 --depth=50 -q "$WORK/pack"
}

# PHP arrays: PHP 8.2 builds an array of 200,000 records under string keys, sorts a copy with a
# comparison function, then updates random keys.
trace_php() {
    need php
    trace_run php "$(max_for php)" php -r '
mt_srand(22);
$t = [];
for ($i = 0; $i < 200000; $i++) { $t["k$i"] = ["id" => $i, "score" => mt_rand() / mt_getrandmax(), "name" => "rec$i"]; }
$a = array_values($t);
usort($a, fn($x, $y) => $x["score"] <=> $y["score"]);
$sum = 0;
for ($i = 0; $i < 400000; $i++) { $k = "k" . mt_rand(0, 199999); $t[$k]["score"] += 1; $sum += $t[$k]["id"]; }
echo $sum, " ", $a[0]["id"], "\n";'
}

# Tcl dictionaries: tclsh 8.6 builds a dict of 150,000 entries, sorts its keys by value, then
# updates random keys.
trace_tcl() {
    need tclsh
    cat >"$WORK/dict.tcl" <<'EOF'
expr {srand(23)}
set d [dict create]
for {set i 0} {$i < 150000} {incr i} { dict set d "k$i" [expr {rand()}] }
set sorted [lsort -real -stride 2 -index 1 $d]
set sum 0.0
for {set i 0} {$i < 300000} {incr i} {
    set k "k[expr {int(rand() * 150000)}]"
    dict set d $k [expr {[dict get $d $k] + 1.0}]
    set sum [expr {$sum + [dict get $d $k]}]
}
puts "[llength $sorted] $sum"
EOF
    trace_run tcl "$(max_for tcl)" tclsh "$WORK/dict.tcl"
}

# A Haskell program: pandoc 2.17 converts 1 MB of generated Markdown (headings, lists, emphasis,
# links, code) to HTML (GHC's generational copying collector).
trace_pandoc() {
    need pandoc python3
    $PY - "$WORK/in.md" <<'EOF'
import random, sys
r = random.Random(24)
words = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randrange(2, 10))) for _ in range(4000)]
def sentence():
    out = []
    for _ in range(r.randrange(6, 18)):
        w = r.choice(words)
        x = r.random()
        out.append(f"*{w}*" if x < 0.05 else f"[{w}](https://example.org/{w})" if x < 0.08 else f"`{w}`" if x < 0.1 else w)
    return " ".join(out) + "."
with open(sys.argv[1], "w") as f:
    size = 0
    while size < 1_000_000:
        block = r.random()
        if block < 0.1:
            s = "\n## " + " ".join(r.choice(words) for _ in range(4)) + "\n\n"
        elif block < 0.3:
            s = "".join(f"- {sentence()}\n" for _ in range(r.randrange(2, 6))) + "\n"
        else:
            s = " ".join(sentence() for _ in range(r.randrange(2, 6))) + "\n\n"
        f.write(s)
        size += len(s)
EOF
    trace_run pandoc "$(max_for pandoc)" pandoc -f markdown -t html -o "$WORK/out.html" "$WORK/in.md"
}

# Rasterizing: Ghostscript 10 renders a generated PostScript page of 3,000 random filled and
# stroked curves and 2,000 strings to a 200 dpi RGB image (one rendering thread).
trace_gs() {
    need gs python3
    $PY - "$WORK/in.ps" <<'EOF'
import random, sys
r = random.Random(25)
with open(sys.argv[1], "w") as f:
    f.write("%!PS\n/Helvetica findfont 9 scalefont setfont\n")
    for _ in range(3000):
        pts = [(r.uniform(0, 612), r.uniform(0, 792)) for _ in range(4)]
        f.write("%.3f %.3f %.3f setrgbcolor newpath %.1f %.1f moveto %.1f %.1f %.1f %.1f %.1f %.1f curveto closepath %s\n" % (
            r.random(), r.random(), r.random(), *pts[0], *pts[1], *pts[2], *pts[3], r.choice(["fill", "stroke"])))
    for i in range(2000):
        f.write("0 setgray %.1f %.1f moveto (item %d) show\n" % (r.uniform(0, 560), r.uniform(0, 780), i))
    f.write("showpage\n")
EOF
    trace_run gs "$(max_for gs)" gs -q -dSAFER -dBATCH -dNOPAUSE -dNumRenderingThreads=1 \
        -sDEVICE=png16m -r200 -sOutputFile="$WORK/out.png" "$WORK/in.ps"
}

# A C++ compile: GCC 12's `cc1plus -O2` on a generated translation unit of 120 functions over
# std::map, std::vector, std::string and std::sort (preprocessed natively first).
trace_cc1plus() {
    need g++ python3
    $PY - "$WORK/gen.cc" <<'EOF'
import random, sys
r = random.Random(26)
with open(sys.argv[1], "w") as f:
    f.write("#include <algorithm>\n#include <map>\n#include <string>\n#include <vector>\n")
    for i in range(120):
        k = r.choice(["int", "long", "std::string"])
        f.write(f"""
std::vector<{k}> f{i}(const std::map<{k}, int> &m, int n) {{
    std::vector<{k}> v;
    for (auto &kv : m) if (kv.second % {r.randrange(2, 9)} == n) v.push_back(kv.first);
    std::sort(v.begin(), v.end(), [](const {k} &a, const {k} &b) {{ return {'a > b' if r.random() < 0.5 else 'b > a'}; }});
    v.erase(std::unique(v.begin(), v.end()), v.end());
    return v;
}}
""")
EOF
    g++ -O2 -E -o "$WORK/gen.ii" "$WORK/gen.cc"
    trace_run cc1plus "$(max_for cc1plus)" "$(g++ -print-prog-name=cc1plus)" -quiet -O2 \
        "$WORK/gen.ii" -o "$WORK/gen.s"
}

# Scheme: Guile 3.0 builds a hash table of 150,000 entries and a list of pairs, sorts the list,
# then updates random keys (the Boehm-Demers-Weiser collector).
trace_guile() {
    need guile
    trace_run guile "$(max_for guile)" guile --no-auto-compile -c '
(use-modules (srfi srfi-1))
(define state (seed->random-state 27))
(define t (make-hash-table))
(define l (list-tabulate 150000 (lambda (i) (cons i (random 1000000 state)))))
(for-each (lambda (p) (hash-set! t (car p) (cdr p))) l)
(define s (sort l (lambda (a b) (< (cdr a) (cdr b)))))
(let loop ((i 0) (sum 0))
  (if (< i 300000)
      (let ((k (random 150000 state)))
        (hash-set! t k (+ 1 (hash-ref t k 0)))
        (loop (+ i 1) (+ sum (hash-ref t k 0))))
      (begin (display (list (length s) sum)) (newline))))'
}

# Text differences: GNU diff compares two 18 MB generated files that differ in scattered lines.
trace_diff() {
    need diff python3
    $PY - "$WORK/a.txt" "$WORK/b.txt" <<'EOF'
import random, sys
r = random.Random(28)
words = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randrange(2, 9))) for _ in range(5000)]
lines = [" ".join(r.choice(words) for _ in range(r.randrange(4, 12))) for _ in range(400_000)]
b = list(lines)
for _ in range(12000):
    i = r.randrange(len(b))
    x = r.random()
    if x < 0.4:
        b[i] = " ".join(r.choice(words) for _ in range(8))
    elif x < 0.7:
        del b[i]
    else:
        b.insert(i, " ".join(r.choice(words) for _ in range(6)))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
open(sys.argv[2], "w").write("\n".join(b) + "\n")
EOF
    trace_run diff "$(max_for diff)" diff "$WORK/a.txt" "$WORK/b.txt"
}

# --- The held-out set (traces/held-out/README.md): captured after the fourth test set's results
# were seen, and not run through any prefetcher: the next test set. Captured with
# LACKEY_SECONDS=300 (two captures at a time). ---

# Graph layout: Graphviz `dot` lays out a generated directed graph of 1,500 nodes and 3,000
# edges (rank assignment, crossing minimisation, coordinates; pointer-linked node and edge lists).
trace_dot() {
    need dot python3
    $PY - "$WORK/g.dot" <<'EOF'
import random, sys
r = random.Random(31)
with open(sys.argv[1], "w") as f:
    f.write("digraph g {\n")
    for i in range(1500):
        f.write(f'  n{i} [label="node {i}"];\n')
    for _ in range(3000):
        a = r.randrange(1500)
        f.write(f"  n{a} -> n{min(1499, a + r.randrange(1, 60))};\n")
    f.write("}\n")
EOF
    trace_run dot "$(max_for dot)" dot -Tsvg -o "$WORK/g.svg" "$WORK/g.dot"
}

# SAT solving: MiniSat 2.2 on a generated random 3-SAT instance of 250 variables at a clause
# ratio of 4.26 (the hard region): clause database, watch lists, learnt clauses.
trace_minisat() {
    need minisat python3
    $PY - "$WORK/f.cnf" <<'EOF'
import random, sys
r = random.Random(32)
n, m = 250, 1065
with open(sys.argv[1], "w") as f:
    f.write(f"p cnf {n} {m}\n")
    for _ in range(m):
        vs = r.sample(range(1, n + 1), 3)
        f.write(" ".join(str(v if r.random() < 0.5 else -v) for v in vs) + " 0\n")
EOF
    trace_run minisat "$(max_for minisat)" minisat -verb=0 "$WORK/f.cnf" "$WORK/f.out"
}

# Fast compression: `lz4 -9` (one thread) of 24 MB of generated log-like text: a streaming
# window and a hash chain over it.
trace_lz4() {
    need lz4 python3
    $PY - "$WORK/lz4.in" <<'EOF'
import random, sys
r = random.Random(34)
words = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(r.randrange(3, 10))) for _ in range(3000)]
with open(sys.argv[1], "w") as f:
    size = 0
    while size < 24_000_000:
        line = f"2026-01-{r.randrange(1, 29):02d} {r.randrange(24):02d}:{r.randrange(60):02d} host{r.randrange(40)} " + " ".join(r.choice(words) for _ in range(r.randrange(4, 14))) + "\n"
        f.write(line)
        size += len(line)
EOF
    trace_run lz4 "$(max_for lz4)" lz4 -9 -f -q "$WORK/lz4.in" "$WORK/lz4.out"
}

# Linear programming: GLPK's `glpsol` (simplex) on a generated sparse LP of 2,000 rows and
# 3,000 columns: sparse matrix factorisation and updates.
trace_glpsol() {
    need glpsol python3
    $PY - "$WORK/p.lp" <<'EOF'
import random, sys
r = random.Random(35)
rows, cols = 2000, 3000
with open(sys.argv[1], "w") as f:
    f.write("Maximize\n obj: " + " + ".join(f"{r.randrange(1, 20)} x{j}" for j in range(cols)) + "\nSubject To\n")
    for i in range(rows):
        terms = " + ".join(f"{r.randrange(1, 9)} x{j}" for j in sorted(r.sample(range(cols), 8)))
        f.write(f" c{i}: {terms} <= {r.randrange(50, 500)}\n")
    f.write("Bounds\n" + "".join(f" x{j} <= 40\n" for j in range(cols)) + "End\n")
EOF
    trace_run glpsol "$(max_for glpsol)" glpsol --lp "$WORK/p.lp" -o "$WORK/p.out"
}

# Spell checking: `hunspell -l` (Debian's en_US dictionary) over 2 MB of generated text, a third
# of its words misspelt: affix rules and hash-table lookups into the loaded dictionary.
trace_hunspell() {
    need hunspell python3
    $PY - "$WORK/text.txt" <<'EOF'
import random, sys
r = random.Random(37)
words = [w.split("/")[0] for w in open("/usr/share/hunspell/en_US.dic", encoding="latin-1").read().split("\n")[1:] if w and w[0].islower()]
with open(sys.argv[1], "w") as f:
    size = 0
    while size < 2_000_000:
        w = r.choice(words)
        if r.random() < 0.33 and len(w) > 3:
            i = r.randrange(len(w) - 1)
            w = w[:i] + w[i + 1] + w[i] + w[i + 2:]
        f.write(w + (" " if r.random() < 0.9 else ".\n"))
        size += len(w) + 1
EOF
    STDIN="$WORK/text.txt" trace_run hunspell "$(max_for hunspell)" hunspell -d en_US -l
}

# Exhaustive compression: `zopfli` (15 iterations) of 3 MB of generated source-like text: a
# deflate encoder's optimal parsing over a long-match cache.
trace_zopfli() {
    need zopfli python3
    $PY - "$WORK/zopfli.in" <<'EOF'
import random, sys
r = random.Random(38)
idents = ["".join(r.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(r.randrange(3, 12))) for _ in range(2000)]
with open(sys.argv[1], "w") as f:
    size = 0
    while size < 3_000_000:
        line = "    " * r.randrange(0, 4) + f"{r.choice(idents)} = {r.choice(idents)}({r.choice(idents)}, {r.randrange(1000)});\n"
        f.write(line)
        size += len(line)
EOF
    trace_run zopfli "$(max_for zopfli)" zopfli --i15 -c "$WORK/zopfli.in"
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
    fresh) todo+=(gawk gzip zstd sqlite_range pyheap bfs lua jq); shift ;;
    third) todo+=(ruby ocaml lame x264 magick cxxmap xmllint brotli); shift ;;
    fourth) todo+=(git php tcl pandoc gs cc1plus guile diff); shift ;;
    held-out) todo+=(dot minisat lz4 glpsol hunspell zopfli); shift ;;
    all) todo+=(sqlite redis numpy sort xz mix cc1 perl pydict pagerank java node bzip2 mix2 gawk gzip zstd sqlite_range pyheap bfs lua jq ruby ocaml lame x264 magick cxxmap xmllint brotli git php tcl pandoc gs cc1plus guile diff); shift ;;
    sqlite | redis | numpy | sort | xz | mix | cc1 | perl | pydict | pagerank | java | node | bzip2 | mix2 | gawk | gzip | zstd | pyheap | bfs | lua | jq | \
        ruby | ocaml | lame | x264 | magick | cxxmap | xmllint | brotli | \
        git | php | tcl | pandoc | gs | cc1plus | guile | diff | \
        dot | minisat | lz4 | glpsol | hunspell | zopfli)
        todo+=("$1")
        shift
        ;;
    sqlite-range)
        todo+=(sqlite_range)
        shift
        ;;
    *) die "unknown workload \`$1\` (see the usage line)" ;;
    esac
done
((${#todo[@]})) || die "usage: $0 WORKLOAD... [--out DIR] (original tuning set: sqlite redis numpy sort xz mix; first and second test sets, now tuning data: cc1 perl pydict pagerank java node bzip2 mix2, gawk gzip zstd sqlite-range pyheap bfs lua jq; third test set, now tuning data: ruby ocaml lame x264 magick cxxmap xmllint brotli; test set: git php tcl pandoc gs cc1plus guile diff; held-out set (--out traces/held-out): dot minisat lz4 glpsol hunspell zopfli; or tuning, test, fresh, third, fourth, held-out, all)"
for t in "${todo[@]}"; do
    "trace_$t"
done
