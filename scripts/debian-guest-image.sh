#!/usr/bin/env bash
# debian-guest-image.sh: an operator's Debian VM for farvm: a Debian root file system on a raw
# ext4 disk (root=/dev/vda), booted directly with the KVM lab's Debian kernel and the initramfs
# of scripts/linux-guest-image.sh (which loads virtio-mmio, virtio-blk, virtio-net and ext4,
# mounts root= and hands over to its /sbin/init). Built from Debian packages with mmdebstrap,
# reproducibly for the same package versions (fixed times, UUIDs, hash seed and file order),
# and cached outside the clone; the package versions are recorded beside the image.
#
# USAGE
#   scripts/debian-guest-image.sh [build]    build if missing; print the paths (shell variables)
#   scripts/debian-guest-image.sh --refresh  rebuild (fetching the suite's current packages)
#   scripts/debian-guest-image.sh --help
#
# OUTPUT (in DIR = CACHE/debian-<suite>-<kernel version>-<recipe hash>, printed as shell
# assignments; copy root.img before booting it: the guest writes to its root disk)
#   DEBIAN_KERNEL    the bzImage of the lab kernel
#   DEBIAN_INITRD    the initramfs (scripts/linux-guest-image.sh's)
#   DEBIAN_ROOT      root.img: a sparse 1 GiB raw ext4 image (label farvm-debian, about
#                    225 MiB used): Debian's minbase variant (dpkg, apt, bash, coreutils, ...)
#                    plus busybox-static, the farvm guest agent (module and daemon) and /sbin/init
#   DEBIAN_MANIFEST  manifest.txt: the suite, mirror, kernel, agent module's SHA-256 and every
#                    installed package with its version (dpkg-query)
#   DEBIAN_CMDLINE   console=ttyS0 root=/dev/vda rw panic=-1
#
# THE GUEST (/sbin/init, a shell script: no init system is installed)
#   mounts /proc, /sys, /dev/pts, /run and /tmp; sets the host name (farvm-debian); loads
#   /lib/modules/farvm/farvm_agent.ko and starts farvm-agentd (on a farvm VM they bind the
#   agent device, elsewhere they say so and the boot goes on); brings eth0 up with the static
#   address farvm_ip=ADDR/LEN from the kernel command line [192.168.100.2/24] (gateway
#   farvm_gw=ADDR if given); writes /srv/www/index.html (host name, kernel, the boot's
#   boot_id) and serves /srv/www with busybox httpd on port 80; runs a login shell (bash) on
#   ttyS0, which prints "farvm-debian: ready <boot_id> <address>" once it reads the console.
#   Leaving the shell, `poweroff` (S5, farvm exits 0) and `reboot` sync, remount / read-only
#   and act at once.
#
# ENVIRONMENT
#   FARVM_GUEST_CACHE   cache directory [${XDG_CACHE_HOME:-~/.cache}/farvm/linux-guest]
#   FARVM_DEBIAN_SUITE  the Debian suite [bookworm: the release the lab kernel's backport is for]
#   FARVM_DEBIAN_MIRROR the mirror [the first Debian archive in this machine's apt sources]
#   FARVM_GUEST_AGENT   a directory guest-agent/linux/build.sh built [it is run]
#   FARVM_LAB_*         passed to scripts/kvm-lab fetch (which kernel; see its --help)
#
# Needs root (mmdebstrap's root mode: file owners as in the packages), mmdebstrap, e2fsprogs
# and what scripts/linux-guest-image.sh and guest-agent/linux/build.sh need (scripts/setup.sh
# installs them all). Whatever is missing is named with the apt-get command that installs it.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
CACHE=${FARVM_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/farvm/linux-guest}
SUITE=${FARVM_DEBIAN_SUITE:-bookworm}
DISK_MIB=1024
PACKAGES=busybox-static
# Fixed identity of the file system (reproducible images).
FS_UUID=6661726d-7667-7565-7374-000000000003
EPOCH=1700000000

# shellcheck source=host-tools.sh
. "$HERE/host-tools.sh"
image_script_args debian-guest-image "$@"
require_tools debian-guest-image mmdebstrap:mmdebstrap mkfs.ext4:e2fsprogs debugfs:e2fsprogs \
    sha256sum:coreutils
((EUID == 0)) || die "needs root (mmdebstrap's root mode keeps the packages' file owners)"

# The kernel and initramfs (built and cached by linux-guest-image.sh), the agent.
guest_env=$("$HERE/linux-guest-image.sh") || die "scripts/linux-guest-image.sh failed"
kernel=$(sed -n 's/^GUEST_KERNEL=//p' <<<"$guest_env")
initrd=$(sed -n 's/^GUEST_INITRD=//p' <<<"$guest_env")
agent=${FARVM_GUEST_AGENT:-$("$REPO/guest-agent/linux/build.sh")} || die "guest-agent/linux/build.sh failed"
[[ -f $agent/farvm_agent.ko && -f $agent/farvm-agentd ]] || die "no farvm_agent.ko and farvm-agentd in $agent"
mirror=${FARVM_DEBIAN_MIRROR:-$("$HERE/kvm-lab" info | awk '$1 == "mirror:" { print $2 }')}
[[ -n $mirror ]] || die "no Debian mirror (set FARVM_DEBIAN_MIRROR)"
KV=$(basename "$(dirname "$kernel")")
KV=${KV%-*}

# The recipe (this script, the initramfs, the agent, the suite) names the output directory.
recipe=$( (cat "$0" "$initrd" "$agent/farvm_agent.ko" "$agent/farvm-agentd" && echo "$SUITE") | sha256sum | cut -c1-12)
OUT=$CACHE/debian-$SUITE-$KV-$recipe
mkdir -p "$CACHE"
exec 8>"$CACHE/.debian.lock"
flock 8
if ((refresh)) || [[ ! -f $OUT/.done ]]; then
    say "building in $OUT (mmdebstrap $SUITE from $mirror)"
    rm -rf "$OUT"
    mkdir -p "$OUT"
    # The tree is unpacked on a tmpfs in the tarball's order, so that mkfs.ext4 -d reads the
    # directories in that order on every host (a host ext4 would list them by hash).
    work=$(mktemp -d /dev/shm/farvm-debian.XXXXXX)
    trap 'rm -rf "$work"' EXIT
    export SOURCE_DATE_EPOCH=$EPOCH
    mmdebstrap --quiet --mode=root --variant=minbase --include="$PACKAGES" \
        --customize-hook='echo farvm-debian >"$1/etc/hostname"' \
        --customize-hook='rm -f "$1"/etc/machine-id "$1"/var/lib/dbus/machine-id; : >"$1/etc/machine-id"' \
        "$SUITE" "$work/rootfs.tar" "deb $mirror $SUITE main" >&2 || die "mmdebstrap failed"
    R=$work/root
    mkdir -p "$R"
    tar -C "$R" --numeric-owner -xpf "$work/rootfs.tar"

    # --- farvm's additions ---
    mkdir -p "$R/lib/modules/farvm" "$R/usr/local/sbin" "$R/srv/www"
    install -m 644 "$agent/farvm_agent.ko" "$R/lib/modules/farvm/farvm_agent.ko"
    install -m 755 "$agent/farvm-agentd" "$R/usr/local/sbin/farvm-agentd"
    # No init system: busybox's poweroff/reboot/halt signal PID 1 (our /sbin/init traps them).
    for a in poweroff reboot halt; do ln -sf /bin/busybox "$R/usr/local/sbin/$a"; done
    cat >"$R/etc/fstab" <<'EOF'
# <file system> <mount point> <type> <options> <dump> <pass>
LABEL=farvm-debian / ext4 rw,errors=remount-ro 0 1
EOF
    cat >"$R/sbin/init" <<'EOF'
#!/bin/sh
# /sbin/init of farvm's Debian guest (scripts/debian-guest-image.sh): no init system.
export PATH=/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=vt100
mount -t proc proc /proc
mount -t sysfs sysfs /sys
[ -c /dev/null ] || mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -o remount,rw / 2>/dev/null
busybox hostname -F /etc/hostname
busybox ip link set lo up
ip=192.168.100.2/24 gw=""
for w in $(cat /proc/cmdline); do
    case $w in farvm_ip=*) ip=${w#farvm_ip=} ;; farvm_gw=*) gw=${w#farvm_gw=} ;; esac
done
# The guest agent: binds farvm's agent device and names the processes (docs/guest-agent.md).
if insmod /lib/modules/farvm/farvm_agent.ko 2>/dev/null || busybox insmod /lib/modules/farvm/farvm_agent.ko; then
    farvm-agentd >/run/farvm-agentd.log 2>&1 &
else
    echo "farvm-debian: farvm_agent.ko did not load"
fi
if [ -e /sys/class/net/eth0 ]; then
    busybox ip link set eth0 up
    busybox ip addr add "$ip" dev eth0
    [ -z "$gw" ] || busybox ip route add default via "$gw"
else
    echo "farvm-debian: no eth0"
fi
boot_id=$(cat /proc/sys/kernel/random/boot_id)
printf '<html><body><h1>%s</h1><p>%s</p><p>boot %s</p></body></html>\n' \
    "$(hostname)" "$(uname -sr)" "$boot_id" >/srv/www/index.html
busybox httpd -p 80 -h /srv/www
# busybox's poweroff, halt and reboot signal init (USR2, USR1, TERM): act on them at once.
down() {
    sync
    mount -o remount,ro / 2>/dev/null
    exec busybox "$1" -f
}
trap 'down poweroff' USR2 USR1
trap 'down reboot' TERM
# The login shell says ready (/etc/profile.d/zz-farvm-ready.sh) once it has the console open:
# input typed before that would be lost.
FARVM_READY="$boot_id ${ip%/*}" setsid busybox cttyhack bash -l &
# A trapped signal interrupts the wait; the shell's end powers off.
wait
down poweroff
EOF
    chmod 755 "$R/sbin/init"
    # Bash's bracketed-paste mode would wrap each command's output in escape sequences on the
    # console, where programs (and tests) read lines.
    echo 'set enable-bracketed-paste off' >>"$R/etc/inputrc"
    cat >"$R/etc/profile.d/zz-farvm-ready.sh" <<'EOF'
# farvm's Debian guest (scripts/debian-guest-image.sh): the first login shell on the console
# tells whoever waits on it that the guest is up.
if [ -n "${FARVM_READY:-}" ]; then
    echo "farvm-debian: ready $FARVM_READY"
    unset FARVM_READY
fi
EOF

    # The record: what this image is made of.
    {
        echo "suite: $SUITE"
        echo "mirror: $mirror"
        echo "kernel: $KV ($(sha256sum "$kernel" | cut -c1-64))"
        echo "initrd: $(sha256sum "$initrd" | cut -c1-64)"
        echo "farvm_agent.ko: $(sha256sum "$agent/farvm_agent.ko" | cut -c1-64)"
        echo "farvm-agentd: $(sha256sum "$agent/farvm-agentd" | cut -c1-64)"
        echo "packages:"
        dpkg-query --admindir="$R/var/lib/dpkg" -W -f '${Package} ${Version} ${Architecture}\n' | LC_ALL=C sort
    } >"$OUT/manifest.txt"

    # Fixed times everywhere; mke2fs copies each inode's ctime too, which no tool can set on
    # the source: fix them in the image afterwards, all in one debugfs run.
    find "$R" -exec touch -h -d "@$EPOCH" {} +
    truncate -s "${DISK_MIB}M" "$OUT/root.img"
    E2FSPROGS_FAKE_TIME=$EPOCH mkfs.ext4 -q -F -d "$R" -U "$FS_UUID" \
        -E "hash_seed=$FS_UUID,root_owner=0:0,lazy_itable_init=0,lazy_journal_init=0" \
        -L farvm-debian "$OUT/root.img" || die "mkfs.ext4 failed"
    (cd "$R" && find . -mindepth 1 | LC_ALL=C sort | sed "s|^\.\(.*\)$|sif \"\1\" ctime @$EPOCH|") >"$work/ctimes"
    E2FSPROGS_FAKE_TIME=$EPOCH debugfs -w -f "$work/ctimes" "$OUT/root.img" >/dev/null 2>&1 || die "debugfs on root.img failed"
    e2fsck -fn "$OUT/root.img" >&2 || die "root.img does not check clean"

    cp "$kernel" "$OUT/vmlinuz"
    cp "$initrd" "$OUT/initrd.img"
    cat >"$OUT/env" <<EOF
DEBIAN_KERNEL=$OUT/vmlinuz
DEBIAN_INITRD=$OUT/initrd.img
DEBIAN_ROOT=$OUT/root.img
DEBIAN_MANIFEST=$OUT/manifest.txt
DEBIAN_CMDLINE='console=ttyS0 root=/dev/vda rw panic=-1'
EOF
    touch "$OUT/.done"
    say "done: $(du -h --apparent-size "$OUT/root.img" | cut -f1) image, $(du -h "$OUT/root.img" | cut -f1) used"
fi
cat "$OUT/env"
