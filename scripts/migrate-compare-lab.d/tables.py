"""The tables of scripts/migrate-compare-lab.sh from its raw outputs in OUT: QEMU's
(farvm-lab bench qemu-migrate's JSON) beside farvm's (`farvm migrate --json` lines, and
scripts/snapshot-bench.sh's table), with farvm's ratios to QEMU.

Usage: tables.py OUT lab|host LIVE_MEMORY SAVE_MEMORY"""
import json
import os
import sys

out, where, live_mem, save_mem = sys.argv[1:5]


def load(name):
    path = os.path.join(out, name)
    return json.load(open(path)) if os.path.exists(path) else None


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def failed(row):
    """A failure's text for a table cell (the guest's console lines joined)."""
    return " / ".join(line.strip() for line in str(row.get("failed")).splitlines())


def ratio(a, b):
    return f"{a / b:.2f}×" if a is not None and b else "-"


def size_bytes(text):
    """snapshot-bench's numfmt --to=iec-i sizes (e.g. 129MiB, 1.1GiB, 4.0KiB)."""
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    for u in sorted(units, key=len, reverse=True):
        if text.endswith(u):
            return float(text[: -len(u)]) * units[u]
    return float(text)


qlive = load("qemu-live-qemu-migrate.json")
qsave = load("qemu-save-qemu-migrate.json")
flive = {}
path = os.path.join(out, "farvm-live.jsonl")
if os.path.exists(path):
    for line in open(path):
        if line.strip():
            r = json.loads(line)
            flive[r["workload"]] = r

version = open(os.path.join(out, "versions.txt")).read().strip() if os.path.exists(
    os.path.join(out, "versions.txt")) else "QEMU"
if where == "lab":
    print(f"One KVM-lab run (QEMU-TCG with nested SVM; {version} with -accel kvm inside it). "
          "Times are the lab's: compare ratios, never absolute times.\n")
else:
    print(f"One run on the development host ({version}, -accel kvm on the host's /dev/kvm), "
          "other workers' builds and tests sharing its 2 cores.\n")

print(f"### Live migration, {live_mem} guest\n")
print("QEMU: all guest RAM local, pre-copy to a second QEMU over loopback TCP (QEMU's "
      "query-migrate: bytes are ram.transferred, a zero page travels as a flag; the pause is its "
      "downtime, in whole ms). farvm: 25% local, the rest on a pool on loopback (a private etcd, "
      "two memory servers); `farvm migrate --json`. Both start in the workload's measured "
      "phase.\n")
print("| workload | VMM | bytes sent | of guest RAM | rounds | total s | guest paused ms | "
      "migration start → workload end s | checksum |")
print("|---|---|---:|---:|---:|---:|---:|---:|---|")
for q in (qlive or {}).get("live", []):
    w = q["workload"]
    native = q["native_checksum"]
    ram = qlive["memory_bytes"]
    qr = q.get("result")
    if qr:
        s = qr["stats"]
        print(f"| `{w}` | QEMU pre-copy | {mib(s['bytes_sent'])} | {s['bytes_sent'] / ram:.2f} | "
              f"{s['dirty_syncs']} | {s['total_secs']:.2f} | {s['downtime_secs'] * 1e3:.0f} | "
              f"{qr['finish_secs']:.1f} | native |")
    else:
        print(f"| `{w}` | QEMU pre-copy | failed: {failed(q)} | | | | | | |")
    f = flive.get(w)
    if f and "failed" in f:
        print(f"| | farvm | failed: {failed(f)} | | | | | | |")
    elif f:
        m = f["migrate"]
        ok = "native" if f["checksum"] == str(native) else f"WRONG ({f['checksum']})"
        rounds = len(m.get("pages_per_round") or [])
        print(f"| | farvm (resident {mib(m['resident_pages'] * 4096)}, remote "
              f"{mib(m['remote_pages'] * 4096)}) | {mib(m['bytes_sent'])} | "
              f"{m['bytes_sent'] / ram:.2f} | {rounds} | {m['total_secs']:.2f} | "
              f"{m['paused_secs'] * 1e3:.0f} | {f['finish_secs']:.1f} | {ok} |")
        if qr:
            s = qr["stats"]
            print(f"| | farvm / QEMU | {ratio(m['bytes_sent'], s['bytes_sent'])} | | | "
                  f"{ratio(m['total_secs'], s['total_secs'])} | "
                  f"{ratio(m['paused_secs'], s['downtime_secs'])} | "
                  f"{ratio(f['finish_secs'], qr['finish_secs'])} | |")
    else:
        print("| | farvm | failed (see the lab console) | | | | | | |")
print()

print(f"### Save to a file and restore, {save_mem} guest\n")
print("QEMU: stop, migrate to exec:cat > FILE, a new QEMU loads it (-incoming), cont. farvm: "
      "`farvm snapshot` of the 25%-local VM (pool: resident pages only; full: every page, "
      "the same VM on an embedded memory server), `farvm run --restore` (eager).\n")
print("| workload | VMM, snapshot | bytes written | save s | restore → running s | "
      "restore → workload end s | × QEMU bytes | × QEMU restore → end | checksum |")
print("|---|---|---:|---:|---:|---:|---:|---:|---|")
qs = ((qsave or {}).get("save") or [None])[0]
if qs:
    w = qs["workload"]
    qr = qs.get("result")
    if qr:
        print(f"| `{w}` | QEMU | {mib(qr['bytes_written'])} | {qr['save_secs']:.2f} | "
              f"{qr['restore_to_run_secs']:.2f} | {qr['finish_secs']:.1f} | 1.00× | 1.00× | "
              "native |")
    else:
        print(f"| `{w}` | QEMU | failed: {failed(qs)} | | | | | | |")
    path = os.path.join(out, "farvm-save.md")
    rows = [ln for ln in open(path)] if os.path.exists(path) else []
    for ln in rows:
        c = [x.strip() for x in ln.strip().strip("|").split("|")]
        if len(c) != 10 or c[0] not in ("pool", "full"):
            continue
        kind, _mode, written, save_s, run_s, finish_s, _x, _fp, _pp, ck = c
        b = size_bytes(written)
        ok = "native" if ck == str(qs["native_checksum"]) else f"WRONG ({ck})"
        print(f"| | farvm, {kind} | {mib(b)} | {float(save_s):.2f} | {float(run_s):.2f} | "
              f"{float(finish_s):.1f} | {ratio(b, qr and qr['bytes_written'])} | "
              f"{ratio(float(finish_s), qr and qr['finish_secs'])} | {ok} |")
