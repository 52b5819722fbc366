#!/usr/bin/env bash
# io-compare-lab: a stock Linux guest's virtio-net and virtio-blk throughput under farvm and under
# QEMU, in one KVM lab run (scripts/kvm-lab): the same kernel and initramfs
# (scripts/linux-guest-image.sh), the same RAM and vCPUs, a fresh copy of the same bench disk and
# a tap with the same addresses for each boot. The guest runs /mnt/bench.sh from the disk
# (`farvm_run=` on the kernel command line) and powers off:
#   net_tx      32 MiB of zeros to a host receiver over TCP (busybox nc; the host closes once
#               every byte arrived), timed in the guest
#   disk_write  64 MiB written to a new file with dd conv=fsync (the file system on virtio-blk)
#   disk_read   the same file read back after dropping the guest's page cache
# VMMs: QEMU (-accel kvm -cpu host; virtio-net-pci on the tap and virtio-blk-pci, both over PCI
# where farvm's are virtio-mmio; the disk through the host page cache as farvm's), farvm with all
# RAM local (--local-only) and farvm with 40% local (the rest on its loopback memory server).
# Runs alternate (qemu, farvm, farvm-remote, qemu, ...) --repeat times; the table gives each
# VMM's median MiB/s and farvm's ratio to QEMU's. The lab is QEMU-TCG: ratios within one run,
# never absolute rates.
#
# USAGE
#   scripts/io-compare-lab.sh [--out DIR] [--repeat N] [--timeout SECS]
#     --out DIR       where io-compare.md and the guests' consoles go [docs/bench/io-compare-lab]
#     --repeat N      boots per VMM [1]
#   FARVM_IO_NET_MIB and FARVM_IO_DISK_MIB change the sizes (the lab moves about 0.1-1 MiB/s
#   through a guest's network stack on a loaded host: 256 MiB is an hour a boot there).
#     --timeout SECS  the lab's time bound [5400]
#
# Needs root (the tap), QEMU (qemu-system-x86), python3 (the host receiver), busybox-static,
# e2fsprogs, and a release build of farvm and farvm-memserver. Exit status: the lab's (CMD's
# status; 124 timeout; 125 the lab could not run).
set -euo pipefail

HOST_IP=10.77.0.1
GUEST_IP=10.77.0.2
PORT=5001
NET_MIB=${FARVM_IO_NET_MIB:-32}
DISK_MIB=${FARVM_IO_DISK_MIB:-64}
MEMORY_MIB=384

inside() {
    # The host's file systems are read-only in the lab: everything written goes to $LAB_OUT.
    local dir=$1 repeat=$2 tap=fvio0 out=$LAB_OUT
    # shellcheck disable=SC1091
    . "$dir/env"
    ip link del "$tap" 2>/dev/null || true
    ip tuntap add dev "$tap" mode tap
    ip addr add "$HOST_IP/24" dev "$tap"
    ip link set "$tap" up
    local results=$out/results.txt
    : >"$results"
    local n vmm log
    for ((n = 1; n <= repeat; n++)); do
        for vmm in qemu farvm farvm-remote; do
            log=$out/console-$vmm-$n.log
            cp --sparse=always "$dir/bench.img" "$out/run.img"
            python3 - "$HOST_IP" "$PORT" "$((NET_MIB << 20))" <<'PY' &
import socket, sys
host, port, want = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port))
s.listen(1)
s.settimeout(1800)
c, _ = s.accept()
got = 0
while got < want:
    b = c.recv(1 << 16)
    if not b:
        break
    got += len(b)
c.close()
print(f"receiver: {got} bytes", file=sys.stderr)
PY
            local receiver=$!
            sleep 0.5
            local cmdline="console=ttyS0 panic=-1 farvm_run=/mnt/bench.sh"
            case $vmm in
            qemu)
                timeout 1500 qemu-system-x86_64 -accel kvm -cpu host -smp 1 -m "$MEMORY_MIB" \
                    -kernel "$GUEST_KERNEL" -initrd "$GUEST_INITRD" -append "$cmdline" \
                    -drive "file=$out/run.img,if=none,id=d0,format=raw" \
                    -device virtio-blk-pci,drive=d0 \
                    -netdev "tap,id=n0,ifname=$tap,script=no,downscript=no" \
                    -device virtio-net-pci,netdev=n0,mac=52:54:00:77:00:02 \
                    -display none -monitor none -serial "file:$log" -no-reboot || true
                ;;
            farvm*)
                local memory=(--local-only)
                [[ $vmm == farvm-remote ]] && memory=(--local-memory 40%)
                timeout 1500 "$FARVM" run --kernel "$GUEST_KERNEL" --initrd "$GUEST_INITRD" \
                    --cmdline "$cmdline" --disk "$out/run.img" \
                    --net "tap=$tap,mac=52:54:00:77:00:02" --vcpus 1 --memory "${MEMORY_MIB}M" \
                    "${memory[@]}" --serial "$log" --serial-in none --no-control-socket \
                    --timeout 1400 || true
                ;;
            esac
            kill "$receiver" 2>/dev/null || true
            wait "$receiver" 2>/dev/null || true
            awk -v vmm="$vmm" -v n="$n" '/^BENCH / { print vmm, n, $2, $3, $5 - $4 }' "$log" \
                | tee -a "$results"
        done
    done
    ip link del "$tap" 2>/dev/null || true
    rm -f "$out/run.img"
}

if [[ ${1:-} == --inside ]]; then
    inside "$2" "$3"
    exit 0
fi

cd "$(dirname "$0")/.."
out=docs/bench/io-compare-lab
repeat=1
timeout=5400
while (($#)); do
    case "$1" in
    --out) out=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "io-compare-lab: unknown option $1 (see --help)" >&2; exit 64 ;;
    esac
done
for bin in farvm farvm-memserver; do
    [[ -x target/release/$bin ]] || cargo build --release -p farvm-vmm -p farvm-memserver
done
command -v qemu-system-x86_64 >/dev/null || { echo "io-compare-lab: install qemu-system-x86" >&2; exit 1; }
image_env=$(scripts/linux-guest-image.sh)

# The work directory must be visible inside the lab (not under /tmp).
work=$(pwd)/target/io-compare-lab
rm -rf "$work"
mkdir -p "$work/disk" "$out"
echo "$image_env" >"$work/env"
echo "FARVM=$(pwd)/target/release/farvm" >>"$work/env"
cat >"$work/disk/bench.sh" <<EOF
# The guest's side of scripts/io-compare-lab.sh (busybox sh; times from /proc/uptime).
now() { cut -d' ' -f1 /proc/uptime; }
ip link set eth0 up && ip addr add $GUEST_IP/24 dev eth0 || exit 1
i=0
while ! ping -c 1 -W 1 $HOST_IP >/dev/null 2>&1 && [ \$i -lt 60 ]; do i=\$((i + 1)); done
s=\$(now)
dd if=/dev/zero bs=65536 count=$((NET_MIB * 16)) 2>/dev/null | nc $HOST_IP $PORT
echo "BENCH net_tx $NET_MIB \$s \$(now)"
s=\$(now)
dd if=/dev/zero of=/mnt/big bs=1048576 count=$DISK_MIB conv=fsync 2>/dev/null
echo "BENCH disk_write $DISK_MIB \$s \$(now)"
sync
echo 3 >/proc/sys/vm/drop_caches
s=\$(now)
dd if=/mnt/big of=/dev/null bs=1048576 2>/dev/null
echo "BENCH disk_read $DISK_MIB \$s \$(now)"
rm -f /mnt/big
EOF
truncate -s $((DISK_MIB + 64))M "$work/bench.img"
mkfs.ext4 -q -F -d "$work/disk" -L farvm-bench "$work/bench.img"

rc=0
scripts/kvm-lab run --cpus 1 --modules tun --timeout "$timeout" --out "$work/lab" -- \
    "$(pwd)/scripts/io-compare-lab.sh" --inside "$work" "$repeat" || rc=$?
cp "$work"/lab/console-*.log "$out/" 2>/dev/null || true
[[ -s $work/lab/results.txt ]] || { echo "io-compare-lab: no results (lab status $rc)" >&2; exit "$((rc ? rc : 1))"; }
cp "$work/lab/results.txt" "$out/results.txt"

# Median MiB/s per VMM and test; farvm's ratios to QEMU's.
python3 - "$out/results.txt" "$repeat" >"$out/io-compare.md" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
rate = {}
for vmm, _n, test, mib, secs in rows:
    rate.setdefault((vmm, test), []).append(float(mib) / max(float(secs), 1e-3))
tests = ["net_tx", "disk_write", "disk_read"]
vmms = ["qemu", "farvm", "farvm-remote"]
print(f"Linux guest I/O in the KVM lab (QEMU-TCG: ratios, not rates), {sys.argv[2]} boots per VMM, median MiB/s:\n")
print("| test | QEMU | farvm (all local) | farvm (40% local) | farvm / QEMU | farvm 40% / QEMU |")
print("|---|---:|---:|---:|---:|---:|")
for t in tests:
    med = {v: statistics.median(rate[(v, t)]) if rate.get((v, t)) else None for v in vmms}
    def f(x): return "n/a" if x is None else f"{x:.1f}"
    def r(a, b): return "n/a" if a is None or not b else f"{a / b:.2f}"
    print(f"| {t} | {f(med['qemu'])} | {f(med['farvm'])} | {f(med['farvm-remote'])} | "
          f"{r(med['farvm'], med['qemu'])} | {r(med['farvm-remote'], med['qemu'])} |")
PY
cat "$out/io-compare.md"
exit "$rc"
