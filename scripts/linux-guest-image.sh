#!/usr/bin/env bash
# linux-guest-image.sh: the Linux test guest for `farvm run --kernel`: the KVM lab's Debian kernel
# (scripts/kvm-lab fetch), a busybox initramfs that loads the kernel's virtio-mmio, virtio-pci
# (QEMU's transport, for scripts/io-compare-lab.sh), virtio-blk, virtio-net and ext4 modules,
# and an ext4 data disk. Built reproducibly (fixed times, owners, UUIDs and file order: the
# same inputs give the same bytes) and cached outside the clone.
#
# USAGE
#   scripts/linux-guest-image.sh [build]    build if missing; print the paths (shell variables)
#   scripts/linux-guest-image.sh --refresh  rebuild
#   scripts/linux-guest-image.sh --help
#
# OUTPUT (in DIR = CACHE/<kernel version>-<recipe hash>, printed as shell assignments)
#   GUEST_KERNEL   the bzImage (vmlinuz) of the lab kernel
#   GUEST_INITRD   initrd.img: busybox (static), the modules, /init
#   GUEST_DISK     disk.img: 64 MiB ext4 holding /blob (16 MiB of AES-CTR keystream, the same
#                  on every build) and /blob.sha256
#   GUEST_BLOB_SHA256  the blob's SHA-256
#   GUEST_CMDLINE  a command line for them: console=ttyS0 panic=-1 (no root=: the initramfs is
#                  the root, the disk is mounted at /mnt; with root=DEV [rw] the initramfs
#                  mounts DEV, ext4, and runs its /sbin/init instead: scripts/debian-guest-image.sh)
#
# THE GUEST
#   /init mounts proc, sys, devtmpfs, devpts and a tmpfs on /tmp, loads the modules, mounts
#   /dev/vda (if there is one) at /mnt, prints "farvm-guest: ready" and then
#   - with `farvm_run=PATH` on the kernel command line, runs that script (e.g. /mnt/x.sh) with
#     sh, prints "farvm-guest: exit N" and powers off;
#   - otherwise runs an interactive shell on the console; leaving it powers off.
#   `poweroff`, `halt` and `reboot` in the guest sync, unmount /mnt and act at once (ACPI S5 /
#   reset); so does leaving the shell (power off).
#
# ENVIRONMENT
#   FARVM_GUEST_CACHE  cache directory [${XDG_CACHE_HOME:-~/.cache}/farvm/linux-guest]
#   FARVM_LAB_*        passed to scripts/kvm-lab fetch (which kernel; see its --help)
#
# Needs: busybox-static, cpio, kmod, xz-utils, e2fsprogs (mkfs.ext4 -d), openssl, gzip
# (scripts/setup.sh installs them; scripts/kvm-lab fetch, which this runs, the first three).
# Whatever is missing is named with the apt-get command that installs it.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${FARVM_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/farvm/linux-guest}
# Modules /init loads, with their dependencies, in this order.
MODULES=(virtio_mmio virtio_pci virtio_blk virtio_net ext4)
DISK_MIB=64
BLOB_MIB=16
# Fixed identity of the file system (reproducible images).
FS_UUID=6661726d-7667-7565-7374-000000000001
EPOCH=1700000000


# shellcheck source=host-tools.sh
. "$HERE/host-tools.sh"
image_script_args linux-guest-image "$@"
# What kvm-lab fetch does not install; asked for before the kernel is downloaded.
require_tools linux-guest-image xz:xz-utils mkfs.ext4:e2fsprogs debugfs:e2fsprogs openssl:openssl \
    gzip:gzip sha256sum:coreutils
# The lab kernel (downloaded and unpacked by kvm-lab, which caches it). kvm-lab fetch also
# installs busybox-static, cpio and kmod when missing (apt), so they are checked after it.
"$HERE/kvm-lab" fetch >&2 || die "scripts/kvm-lab fetch failed"
require_tools linux-guest-image busybox:busybox-static cpio:cpio modprobe:kmod
busybox=$(command -v busybox)
[[ $(ldd "$busybox" 2>&1) == *'not a dynamic'* ]] || die "$busybox is not statically linked (install busybox-static)"
kdir=$("$HERE/kvm-lab" info | awk '$1 == "kernel:" { print $NF }')
[[ -d $kdir/root/lib/modules ]] || die "no kernel tree at $kdir"
KROOT=$kdir/root
KV=$(ls "$KROOT/lib/modules")

# The recipe (this script and busybox) names the output directory: a change rebuilds.
recipe=$( (cat "$0" "$busybox" && echo "$KV") | sha256sum | cut -c1-12)
OUT=$CACHE/$KV-$recipe
# One builder at a time (tests run concurrently; a second caller waits, then finds it built).
mkdir -p "$CACHE"
exec 8>"$CACHE/.lock"
flock 8
if ((refresh)) || [[ ! -f $OUT/.done ]]; then
    say "building in $OUT"
    rm -rf "$OUT"
    mkdir -p "$OUT"
    work=$(mktemp -d "$OUT/.work.XXXXXX")
    trap 'rm -rf "$work"' EXIT

    # --- initramfs ---
    R=$work/initramfs
    mkdir -p "$R"/{bin,sbin,proc,sys,dev,mnt,tmp,root,etc,lib/modules}
    cp "$busybox" "$R/bin/busybox"
    for a in $("$R/bin/busybox" --list | LC_ALL=C sort); do
        case $a in busybox | poweroff | reboot | halt) ;; *) ln -s busybox "$R/bin/$a" ;; esac
    done
    : >"$R/etc/modules"
    for m in "${MODULES[@]}"; do
        modprobe -d "$KROOT" -S "$KV" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
    done | awk '!seen[$0]++' | while read -r f; do
        b=$(basename "$f")
        b=${b%.xz}
        b=${b%.ko}
        case $f in
        *.xz) xz -dc "$f" >"$R/lib/modules/$b.ko" ;;
        *) cp "$f" "$R/lib/modules/$b.ko" ;;
        esac
        echo "$b" >>"$R/etc/modules"
    done
    cat >"$R/init" <<'EOF'
#!/bin/sh
# /init of farvm's Linux test guest (scripts/linux-guest-image.sh).
export PATH=/sbin:/bin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp
for m in $(cat /etc/modules); do
    insmod "/lib/modules/$m.ko" 2>/dev/null || echo "farvm-guest: insmod $m failed"
done
# The disk's device node appears once virtio_blk probed it.
i=0
while [ ! -b /dev/vda ] && [ $i -lt 20 ] && grep -q LNRO0005 /sys/bus/platform/devices/*/modalias 2>/dev/null; do
    sleep 0.1
    i=$((i + 1))
done
# With root=DEV on the kernel command line (scripts/debian-guest-image.sh's root disk): mount
# it (read-write with `rw`) and hand over to its /sbin/init; the modules stay loaded.
root="" rootmode=ro
for w in $(cat /proc/cmdline); do
    case $w in root=*) root=${w#root=} ;; rw) rootmode=rw ;; esac
done
if [ -n "$root" ]; then
    mkdir -p /newroot
    if mount -t ext4 -o "$rootmode" "$root" /newroot && [ -x /newroot/sbin/init ]; then
        umount /dev/pts /tmp /sys /proc
        mount --move /dev /newroot/dev
        exec switch_root /newroot /sbin/init
    fi
    echo "farvm-guest: cannot mount $root or it has no /sbin/init; staying in the initramfs"
elif [ -b /dev/vda ]; then
    mount -t ext4 /dev/vda /mnt || echo "farvm-guest: cannot mount /dev/vda"
fi
# busybox's poweroff, halt and reboot signal init (USR2, USR1, TERM): act on them at once.
down() {
    sync
    umount /mnt 2>/dev/null
    exec busybox "$1" -f
}
trap 'down poweroff' USR2 USR1
trap 'down reboot' TERM
echo "farvm-guest: ready ($(nproc) cpus, $(awk '/MemTotal/ { print $2 }' /proc/meminfo) kB)"
if [ -n "${farvm_run:-}" ]; then
    sh "$farvm_run" </dev/console >/dev/console 2>&1
    echo "farvm-guest: exit $?"
else
    setsid cttyhack sh -l &
    # A trapped signal interrupts the wait; the shell's end powers off.
    wait
fi
down poweroff
EOF
    chmod 755 "$R/init"
    find "$R" -exec touch -h -d "@$EPOCH" {} +
    (cd "$R" && find . | LC_ALL=C sort | cpio -o -H newc -R 0:0 --reproducible --quiet | gzip -9n) \
        >"$OUT/initrd.img"

    # --- data disk ---
    D=$work/disk
    mkdir -p "$D"
    # AES-128-CTR keystream under a fixed key: incompressible, the same on every host.
    head -c $((BLOB_MIB << 20)) /dev/zero \
        | openssl enc -aes-128-ctr -nosalt -K 000102030405060708090a0b0c0d0e0f -iv 00000000000000000000000000000000 >"$D/blob"
    (cd "$D" && sha256sum blob >blob.sha256)
    find "$D" -exec touch -h -d "@$EPOCH" {} +
    truncate -s "${DISK_MIB}M" "$OUT/disk.img"
    E2FSPROGS_FAKE_TIME=$EPOCH SOURCE_DATE_EPOCH=$EPOCH mkfs.ext4 -q -F -d "$D" -U "$FS_UUID" \
        -E "hash_seed=$FS_UUID,root_owner=0:0,lazy_itable_init=0,lazy_journal_init=0" \
        -L farvm-data "$OUT/disk.img"
    # mke2fs copies each file's ctime, which no tool can set on the source: fix it here.
    for f in blob blob.sha256; do
        E2FSPROGS_FAKE_TIME=$EPOCH debugfs -w -R "sif /$f ctime @$EPOCH" "$OUT/disk.img" >/dev/null 2>&1 || die "debugfs on disk.img failed"
    done
    blob_sha=$(cut -d' ' -f1 "$D/blob.sha256")

    cp "$kdir/vmlinuz" "$OUT/vmlinuz"
    cat >"$OUT/env" <<EOF
GUEST_KERNEL=$OUT/vmlinuz
GUEST_INITRD=$OUT/initrd.img
GUEST_DISK=$OUT/disk.img
GUEST_BLOB_SHA256=$blob_sha
GUEST_CMDLINE='console=ttyS0 panic=-1'
EOF
    touch "$OUT/.done"
    say "done"
fi
cat "$OUT/env"
