#!/usr/bin/env bash
# linux-guest-programs.sh: a disk of real programs for the Linux test guest — sqlite3, xz, sort
# and python3 with numpy, from the Debian release the KVM lab's kernel comes from (its suite
# without "-backports", e.g. bookworm), with fixed inputs and a runner that runs each program
# on them and prints the SHA-256 of its output. The packages (with their dependencies, no
# recommends) are fetched with apt-get from this machine's Debian mirror (the one
# `scripts/kvm-lab` uses) and unpacked, not installed: no maintainer script runs. Built
# reproducibly (fixed times, owners, UUID and file order) and cached outside the clone.
#
# USAGE
#   scripts/linux-guest-programs.sh [build]    build if missing; print the paths (shell variables)
#   scripts/linux-guest-programs.sh --refresh  rebuild (the downloaded packages stay cached)
#   scripts/linux-guest-programs.sh --help
#
# OUTPUT (in DIR = CACHE/programs-<suite>-<recipe hash>, printed as shell assignments)
#   PROGRAMS_ROOT  the unpacked tree (the disk's content), to run the same programs on the host:
#                  chroot "$PROGRAMS_ROOT" /farvm/busybox sh /farvm/run-programs
#   PROGRAMS_DISK  programs.img: an ext4 image of that tree
#   PROGRAMS_LIST  packages.txt: the packages and versions it holds
#
# THE RUNNER
#   /farvm/run-programs (busybox sh, inside a chroot of the tree; needs no writable file and no
#   /proc) prints one line per program, `farvm-prog NAME SHA256`, NAME being the process name
#   (comm) the program runs under, and `farvm-prog done` at the end:
#   - sort     LC_ALL=C sort of 6 MiB of base64 lines (AES-CTR keystream under a fixed key);
#   - xz       xz -6 -T1 of 1 MiB of text (the sorted lines' source, as text);
#   - sqlite3  an in-memory database of 120,000 rows built by a recursive query, an index,
#              joins and aggregates (temp_store in memory);
#   - python3  numpy on integers only (a seeded generator, sort, unique, cumulative sums, an
#              integer matrix product: exact, whichever SIMD or BLAS code the CPU selects).
#
# ENVIRONMENT
#   FARVM_GUEST_CACHE  cache directory [${XDG_CACHE_HOME:-~/.cache}/farvm/linux-guest]
#   FARVM_LAB_SUITE, FARVM_LAB_MIRROR  as for scripts/kvm-lab (which suite, which mirror)
#
# Needs: apt-get, dpkg-deb, busybox-static, e2fsprogs (mkfs.ext4 -d, debugfs), openssl
# (scripts/setup.sh installs them; whatever is missing is named with the apt-get command that
# installs it), and root (chroot) to precompile the Python modules in the tree.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${FARVM_GUEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/farvm/linux-guest}
SUITE=${FARVM_LAB_SUITE:-bookworm-backports}
SUITE=${SUITE%-backports}
PACKAGES=(sqlite3 xz-utils coreutils python3-numpy)
# Fixed identity of the file system (reproducible images).
FS_UUID=6661726d-7667-7565-7374-000000000002
EPOCH=1700000000
KEY=000102030405060708090a0b0c0d0e0f

# shellcheck source=host-tools.sh
. "$HERE/host-tools.sh"
image_script_args linux-guest-programs "$@"
require_tools linux-guest-programs apt-get:apt dpkg-deb:dpkg busybox:busybox-static \
    mkfs.ext4:e2fsprogs debugfs:e2fsprogs openssl:openssl sha256sum:coreutils chroot:coreutils
PATH=$PATH:/usr/sbin:/sbin
busybox=$(command -v busybox)
[[ $(ldd "$busybox" 2>&1) == *'not a dynamic'* ]] || die "$busybox is not statically linked (install busybox-static)"
[[ $(id -u) -eq 0 ]] || die "needs root (chroot into the tree to precompile its Python modules)"

# The recipe (this script and busybox) names the output directory: a change rebuilds.
recipe=$( (cat "$0" "$busybox" && echo "$SUITE ${PACKAGES[*]}") | sha256sum | cut -c1-12)
OUT=$CACHE/programs-$SUITE-$recipe
mkdir -p "$CACHE"
exec 8>"$CACHE/.programs.lock"
flock 8
if ((refresh)) || [[ ! -f $OUT/.done ]]; then
    say "building in $OUT"
    rm -rf "$OUT"
    mkdir -p "$OUT"
    work=$(mktemp -d "$OUT/.work.XXXXXX")
    trap 'rm -rf "$work"' EXIT

    # --- packages: the suite's, from the mirror kvm-lab uses, cached by file name ---
    mirror=$("$HERE/kvm-lab" info | awk '$1 == "mirror:" { print $2 }')
    [[ $mirror == http* || $mirror == file:* ]] || die "no Debian mirror (scripts/kvm-lab info; set FARVM_LAB_MIRROR)"
    A=$CACHE/programs-apt
    mkdir -p "$A"/{lists/partial,cache/archives/partial,empty.d}
    signed=""
    [[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]] && signed="[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
    echo "deb ${signed}$mirror $SUITE main" >"$A/sources.list"
    APT=(-o Dir::Etc::SourceList="$A/sources.list" -o Dir::Etc::SourceParts="$A/empty.d"
        -o Dir::State::Lists="$A/lists" -o Dir::State::status=/dev/null
        -o Dir::Cache="$A/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)")
    say "apt: $mirror $SUITE: ${PACKAGES[*]}"
    apt-get "${APT[@]}" -qq update || die "apt-get update of $mirror $SUITE failed"
    # Everything they depend on, as if nothing were installed.
    DEBIAN_FRONTEND=noninteractive apt-get "${APT[@]}" -qq -y --no-install-recommends \
        --download-only install "${PACKAGES[@]}" >/dev/null || die "apt-get cannot fetch ${PACKAGES[*]}"
    apt-get "${APT[@]}" -s --no-install-recommends install "${PACKAGES[@]}" 2>/dev/null \
        | awk '$1 == "Inst" { v = $3; gsub(/[()]/, "", v); if (v ~ /^\[/) v = $4; gsub(/[()]/, "", v); print $2, v }' \
        | LC_ALL=C sort >"$OUT/packages.txt"
    [[ -s $OUT/packages.txt ]] || die "apt resolved no packages"

    # --- the tree ---
    R=$OUT/root
    mkdir -p "$R"
    while read -r p v; do
        deb=""
        for f in "$A/cache/archives/${p}_${v//:/%3a}_"*.deb; do
            [[ -e $f ]] && deb=$f && break
        done
        [[ -n $deb ]] || die "no downloaded .deb for $p $v"
        dpkg-deb -x "$deb" "$R"
    done <"$OUT/packages.txt"
    rm -rf "$R"/usr/share/{doc,man,info,locale,lintian,bug}
    find "$R" -depth -type d \( -name tests -o -name test \) -path '*python3*' -exec rm -rf {} +
    # numpy's BLAS and LAPACK are alternatives (set by maintainer scripts, which do not run).
    for l in libblas.so.3 liblapack.so.3; do
        d=${l%%.so*}
        d=${d#lib}
        [[ -e $R/usr/lib/x86_64-linux-gnu/$d/$l ]] || die "no $d/$l in the tree"
        ln -sf "$d/$l" "$R/usr/lib/x86_64-linux-gnu/$l"
    done
    mkdir -p "$R"/{proc,dev,sys,tmp,farvm}
    cp "$busybox" "$R/farvm/busybox"

    # Fixed inputs: base64 lines of AES-CTR keystream under a fixed key.
    head -c $((9 << 20)) /dev/zero \
        | openssl enc -aes-128-ctr -nosalt -K "$KEY" -iv 00000000000000000000000000000000 \
        | openssl base64 -e >"$work/b64"
    head -c $((6 << 20)) "$work/b64" >"$R/farvm/lines.txt"
    # Compressible text for xz: the lines as words of a small vocabulary (keystream bytes mod 64).
    head -c $((1 << 20)) "$work/b64" | tr 'A-Za-z0-9+/' 'aeiouaeiouaeiouaeioubcdfghjklmnpqrstvwxyz     \n\n\nth' \
        >"$R/farvm/text.txt"
    cat >"$R/farvm/db.sql" <<'EOF'
PRAGMA temp_store = MEMORY;
CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, grp INTEGER, s TEXT);
WITH RECURSIVE n(i, x) AS (
    SELECT 1, 12345
    UNION ALL
    SELECT i + 1, (x * 1103515245 + 12345) % 2147483648 FROM n WHERE i < 120000
)
INSERT INTO t SELECT i, x, x % 997, printf('%08x-%d', x, i) FROM n;
CREATE INDEX t_k ON t(k);
CREATE TABLE g AS SELECT grp, count(*) AS c, sum(k) AS sk, min(s) AS ms FROM t GROUP BY grp;
SELECT grp, c, sk, ms FROM g ORDER BY grp;
SELECT a.id, b.id FROM t a JOIN t b ON a.k = b.k + 1 ORDER BY a.id LIMIT 1000;
SELECT count(*), sum(length(s)), max(k) FROM t WHERE k BETWEEN 1000000 AND 1500000000;
SELECT s FROM t ORDER BY s DESC LIMIT 2000;
EOF
    cat >"$R/farvm/np.py" <<'EOF'
import hashlib
import numpy as np

h = hashlib.sha256()
rng = np.random.default_rng(20261126)
a = rng.integers(0, 1 << 40, size=250_000, dtype=np.int64)
for arr in (np.sort(a), np.unique(a % 100_003), np.cumsum(a % 1_000_003),
            np.argsort(a, kind="stable")[:20_000]):
    h.update(arr.tobytes())
m = rng.integers(-1000, 1000, size=(128, 128), dtype=np.int64)
h.update((m @ m @ m).tobytes())
print(h.hexdigest())
EOF
    cat >"$R/farvm/run-programs" <<'EOF'
# The programs on fixed inputs (scripts/linux-guest-programs.sh): `farvm-prog NAME SHA256`.
# Run inside a chroot of the programs tree: /farvm/busybox sh /farvm/run-programs
set -eo pipefail
cd /farvm
export PATH=/usr/bin:/bin LC_ALL=C HOME=/farvm PYTHONHASHSEED=0 PYTHONDONTWRITEBYTECODE=1 \
    OPENBLAS_NUM_THREADS=1
sum() { /usr/bin/sha256sum | /farvm/busybox cut -d' ' -f1; }
s=$(/usr/bin/sort lines.txt | sum)
echo "farvm-prog sort $s"
s=$(/usr/bin/xz -6 -T1 -c text.txt | sum)
echo "farvm-prog xz $s"
s=$(/usr/bin/sqlite3 -bail :memory: <db.sql | sum)
echo "farvm-prog sqlite3 $s"
s=$(/usr/bin/python3 np.py)
echo "farvm-prog python3 $s"
echo "farvm-prog done"
EOF
    # Precompile the Python modules (read-only in use; checked by hash, not by time).
    chroot "$R" /usr/bin/python3 -m compileall -q -j 1 --invalidation-mode unchecked-hash \
        /usr/lib/python3.11 /usr/lib/python3/dist-packages >/dev/null || die "compileall in the tree failed"
    # Files' times and owners fixed; the image from a sorted tree.
    chown -R -h 0:0 "$R"
    find "$R" -exec touch -h -d "@$EPOCH" {} +
    mb=$(du -sm "$R" | cut -f1)
    size=$(((mb * 5 / 4 + 16) / 4 * 4))
    truncate -s "${size}M" "$OUT/programs.img"
    E2FSPROGS_FAKE_TIME=$EPOCH SOURCE_DATE_EPOCH=$EPOCH mkfs.ext4 -q -F -d "$R" -U "$FS_UUID" \
        -E "hash_seed=$FS_UUID,root_owner=0:0,lazy_itable_init=0,lazy_journal_init=0" \
        -L farvm-programs "$OUT/programs.img"
    # mke2fs copies each file's ctime, which no tool can set on the source, and its atime,
    # which reading it for the copy may have changed: fix both here.
    (cd "$R" && find . -mindepth 1 | LC_ALL=C sort \
        | sed "s|^\.\(.*\)|sif \"\1\" ctime @$EPOCH\nsif \"\1\" atime @$EPOCH|") >"$work/ctime"
    E2FSPROGS_FAKE_TIME=$EPOCH debugfs -w -f "$work/ctime" "$OUT/programs.img" >/dev/null 2>&1 || die "debugfs on programs.img failed"
    cat >"$OUT/env" <<EOF
PROGRAMS_ROOT=$R
PROGRAMS_DISK=$OUT/programs.img
PROGRAMS_LIST=$OUT/packages.txt
EOF
    touch "$OUT/.done"
    say "done ($(wc -l <"$OUT/packages.txt") packages, ${size} MiB disk)"
fi
cat "$OUT/env"
