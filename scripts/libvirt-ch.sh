#!/usr/bin/env bash
# libvirt with its Cloud Hypervisor ("ch") driver, for running farvm under real libvirt.
#
# Debian builds libvirt without the ch driver (no virtchd), so this script builds Debian's own
# libvirt source with `-Ddriver_ch=enabled` once, into a cache directory outside the repository,
# and then runs virtchd as an unprivileged per-user daemon (`ch:///session`) whose PATH holds farvm
# under the name `cloud-hypervisor`. The source is that of Debian trixie (libvirt 11.3), whose ch
# driver follows its VMM through `--event-monitor` (a guest powering off, `virsh shutdown`: the
# domain goes "shut off"); it builds on bookworm as well. FARVM_LIBVIRT_SUITE=bookworm builds
# bookworm's libvirt 9.0 instead, whose driver does not watch its VMM.
#
# Usage: scripts/libvirt-ch.sh build | start | env | virsh ARGS... | stop | status
#
#   build   fetch Debian's libvirt source (apt-get source, through a private deb-src list derived
#           from this machine's apt configuration), apply farvm's fixes to the ch driver
#           (scripts/libvirt-ch.d/patches/SUITE/, each patch's header says what it fixes), install the
#           build dependencies, build with the ch driver and install it under the cache. Does
#           nothing when the cache is complete and built with the current patches.
#   start   start virtchd in session mode under a new temporary runtime directory, with farvm on
#           its PATH as `cloud-hypervisor`; print the URI and environment to use.
#   env     print the URI and environment of the running daemon again (shell `export` lines).
#   virsh   run virsh ARGS against the running daemon (as the daemon's user).
#   stop    stop the daemon started by `start` (by its PID) and remove its temporary directories.
#   status  say whether the cache is built and whether a daemon is running.
#
# Environment:
#   FARVM_LIBVIRT_SUITE  the Debian release whose libvirt source is built (default: trixie); the
#                        deb-src list takes this machine's Debian sources with their release
#                        replaced (bookworm, bookworm-updates -> trixie, trixie-updates)
#   FARVM_LIBVIRT_CACHE  cache directory (default: $HOME/.cache/farvm/libvirt-ch-<suite>)
#   FARVM_BIN            the farvm binary to expose as cloud-hypervisor (default: the workspace's
#                        target/release/farvm, else `farvm` on PATH)
#   FARVM_LIBVIRT_USER   user to run the daemon as when invoked as root (default: nobody); when
#                        invoked as another user the daemon runs as that user
#   FARVM_LIBVIRT_JOBS   parallel build jobs (default: number of CPUs)
#   FARVM_LIBVIRT_STATE  file recording the running daemon's runtime directory (default:
#                        <cache>/session); give each concurrent daemon its own
#
# When run as root the daemon drops to FARVM_LIBVIRT_USER; files it must read (libvirt's installed
# tree, farvm itself, kernels named in domain XML) must then be readable by that user. If the cache
# is not reachable by it (a cache under /root usually is not), `start` copies the installed tree
# into its runtime directory and points libvirt's module and library lookups at the copy. The
# daemon (and so every VMM it starts) gets /dev/kvm's group as its one supplementary group, and
# CAP_NET_ADMIN alone of root's capabilities (libvirt creates the taps of a domain's ethernet
# interfaces and passes them to farvm with vm.add-net). farvm
# pages guest memory with userfaultfd, which an unprivileged process may use through
# /dev/userfaultfd: when the daemon's user cannot open it, `start` (as root) gives the device to
# /dev/kvm's group with mode 0660, as a udev rule on a farvm host would; that stays until reboot.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
suite=${FARVM_LIBVIRT_SUITE:-trixie}
[[ $suite =~ ^[a-z]+$ ]] || { echo "libvirt-ch: FARVM_LIBVIRT_SUITE must be a Debian release name (trixie, bookworm)" >&2; exit 2; }
cache=${FARVM_LIBVIRT_CACHE:-$HOME/.cache/farvm/libvirt-ch-$suite}
prefix=$cache/prefix
stamp=$cache/built.stamp
# Fixes to libvirt's ch driver that farvm carries on top of Debian's source, one directory per
# suite (each patch's header says what and why; bookworm's libvirt 9.0 has none), applied in
# name order; the build records their digest in its stamp, and a build made without the
# current set is rebuilt.
patch_dir=$repo/scripts/libvirt-ch.d/patches/$suite
patch_set=$({ cat "$patch_dir"/*.patch 2>/dev/null || true; } | sha256sum | cut -c1-12)
state=${FARVM_LIBVIRT_STATE:-$cache/session} # path of the running session's runtime directory

die() {
    echo "libvirt-ch: $*" >&2
    exit 1
}
note() { echo "libvirt-ch: $*" >&2; }

as_root() {
    if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo "$@"; fi
}

# --- build -----------------------------------------------------------------------------------

# JSON: libvirt 9 uses yajl, libvirt 10 and later json-c.
build_deps=(dpkg-dev meson ninja-build pkg-config gcc libglib2.0-dev libyajl-dev libjson-c-dev
    libcurl4-gnutls-dev xsltproc python3-docutils libxml2-dev libxml2-utils libgnutls28-dev
    libtirpc-dev libdevmapper-dev libnl-3-dev libnl-route-3-dev libpciaccess-dev
    libselinux1-dev libacl1-dev libattr1-dev libcap-ng-dev libudev-dev libparted-dev
    libreadline-dev)

install_build_deps() {
    local need=() pkg
    for pkg in "${build_deps[@]}"; do
        dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
    done
    ((${#need[@]})) || return 0
    note "installing build dependencies: ${need[*]}"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# Writes deb-src entries for every enabled apt source of this release into "$1" (a deb822 file),
# with the release in each suite name replaced by $suite (bookworm-security -> trixie-security).
# Only sources whose suite belongs to this machine's release are taken: third-party repositories
# rarely publish Sources indexes.
write_src_list() {
    local out=$1 codename parts list f
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [[ -n $codename ]] || die "cannot tell this machine's release (no VERSION_CODENAME in /etc/os-release)"
    eval "$(apt-config shell list Dir::Etc::sourcelist/f parts Dir::Etc::sourceparts/d)"
    : >"$out"
    # One-line format: "deb [options] URI SUITE COMPONENTS..."
    for f in "$list" "$parts"/*.list; do
        [[ -f $f ]] || continue
        awk -v cn="$codename" -v to="$suite" '
            $1 == "deb" {
                i = 2; opts = ""
                if ($2 ~ /^\[/) { while ($i !~ /\]$/) { opts = opts " " $i; i++ }; opts = opts " " $i; i++ }
                uri = $i; suite = $(i + 1)
                if (index(suite, cn) != 1) next
                suite = to substr(suite, length(cn) + 1)
                comps = ""; for (j = i + 2; j <= NF; j++) comps = comps " " $j
                gsub(/^ *\[|\] *$/, "", opts)
                n = split(opts, o, " "); signed = ""
                for (k = 1; k <= n; k++) if (o[k] ~ /^signed-by=/) signed = substr(o[k], 11)
                printf "Types: deb-src\nURIs: %s\nSuites: %s\nComponents:%s\n", uri, suite, comps
                if (signed != "") printf "Signed-By: %s\n", signed
                printf "\n"
            }' "$f" >>"$out"
    done
    # deb822 format: paragraphs with Types/URIs/Suites/Components/Signed-By.
    for f in "$parts"/*.sources; do
        [[ -f $f ]] || continue
        awk -v cn="$codename" -v to="$suite" '
            function flush() {
                if (types ~ /(^| )deb( |$)/ && enabled != "no" && suites != "") {
                    n = split(suites, s, " "); keep = ""
                    for (k = 1; k <= n; k++) if (index(s[k], cn) == 1) keep = keep " " to substr(s[k], length(cn) + 1)
                    if (keep != "") {
                        printf "Types: deb-src\nURIs: %s\nSuites:%s\nComponents: %s\n", uris, keep, comps
                        if (signed != "") printf "Signed-By: %s\n", signed
                        printf "\n"
                    }
                }
                types = uris = suites = comps = signed = enabled = ""
            }
            /^[ \t]*#/ { next }
            /^[ \t]*$/ { flush(); next }
            { key = tolower($1); sub(/:$/, "", key); $1 = ""; sub(/^ /, "")
              if (key == "types") types = $0; else if (key == "uris") uris = $0
              else if (key == "suites") suites = $0; else if (key == "components") comps = $0
              else if (key == "signed-by") signed = $0; else if (key == "enabled") enabled = tolower($0) }
            END { flush() }' "$f" >>"$out"
    done
    [[ -s $out ]] || die "found no apt source for release '$codename' to derive a deb-src list from"
}

fetch_source() {
    local work=$1 apt
    mkdir -p "$work/apt/sources.list.d" "$work/apt/lists/partial" "$work/apt/cache/archives/partial"
    write_src_list "$work/apt/sources.list.d/farvm-deb-src.sources"
    apt=(apt-get -q -o "Dir::Etc::sourcelist=/dev/null"
        -o "Dir::Etc::sourceparts=$work/apt/sources.list.d"
        -o "Dir::State::lists=$work/apt/lists" -o "Dir::Cache=$work/apt/cache"
        -o "APT::Sandbox::User=root")
    note "fetching Debian $suite's libvirt source"
    "${apt[@]}" update >"$work/apt/update.log" 2>&1 || note "apt-get update reported errors (see $work/apt/update.log)"
    (cd "$work" && "${apt[@]}" source libvirt) >"$work/apt/source.log" 2>&1 && return 0
    # apt-get source unpacks with dpkg-source, which needs the .dsc. A mirror that serves the
    # tarballs but not the .dsc (seen behind caching proxies) leaves the tarballs apt fetched,
    # each checked against the signed Sources index: unpack those and apply Debian's patch series.
    local orig deb ver src p
    # find stops at its first match (-quit) rather than `| head -n1` SIGPIPE-ing it (pipefail).
    orig=$(find "$work" -maxdepth 1 -name 'libvirt_*.orig.tar.*' ! -name '*.asc' -print -quit)
    deb=$(find "$work" -maxdepth 1 -name 'libvirt_*.debian.tar.*' -print -quit)
    [[ -n $orig && -n $deb ]] || die "apt-get source libvirt failed; see $work/apt/source.log"
    ver=$(basename "$orig")
    ver=${ver#libvirt_}
    ver=${ver%.orig.tar.*}
    note "apt-get source could not unpack (see $work/apt/source.log); unpacking $(basename "$orig") and $(basename "$deb")"
    src=$work/libvirt-$ver
    rm -rf "$src"
    mkdir -p "$src"
    tar -xf "$orig" -C "$src" --strip-components=1
    tar -xf "$deb" -C "$src"
    if [[ -f $src/debian/patches/series ]]; then
        while read -r p _; do
            [[ -z $p || $p == \#* ]] && continue
            patch -d "$src" -p1 -s --no-backup-if-mismatch <"$src/debian/patches/$p" >>"$work/apt/source.log" 2>&1 ||
                die "Debian patch $p does not apply to $(basename "$orig"); see $work/apt/source.log"
        done <"$src/debian/patches/series"
    fi
}

# Is the cache built, with the current patch set?
built_current() {
    [[ -f $stamp ]] && grep -q "farvm patches $patch_set" "$stamp"
}

# Applies farvm's patches to the unpacked source "$1" and marks it so.
apply_patches() {
    local src=$1 p
    for p in "$patch_dir"/*.patch; do
        [[ -f $p ]] || continue
        note "applying $(basename "$p")"
        patch -d "$src" -p1 -s --no-backup-if-mismatch <"$p" ||
            die "farvm's patch $(basename "$p") does not apply to $(basename "$src")"
    done
    echo "$patch_set" >"$src/.farvm-patches"
}

cmd_build() {
    if built_current; then
        note "already built: $prefix ($(cat "$stamp"))"
        return 0
    fi
    [[ -f $stamp ]] && note "rebuilding: the cache was built without farvm's current patches ($(cat "$stamp"))"
    rm -f "$stamp"
    command -v apt-get >/dev/null || die "apt-get not found: this script builds Debian's libvirt source"
    install_build_deps
    local work=$cache/work src started
    started=$(date +%s)
    # A source fetched by an earlier, interrupted build is reused; its build tree is not.
    rm -rf "$work/build" "$prefix"
    mkdir -p "$work"
    src=$(find "$work" -maxdepth 1 -type d -name 'libvirt-[0-9]*' -print -quit)
    # A source patched with another set (or interrupted mid-patch) is unpacked again.
    if [[ -n $src && $(cat "$src/.farvm-patches" 2>/dev/null) != "$patch_set" ]]; then
        rm -rf "$src"
        src=""
    fi
    if [[ -z $src ]]; then
        fetch_source "$work"
        src=$(find "$work" -maxdepth 1 -type d -name 'libvirt-[0-9]*' -print -quit)
        [[ -n $src ]] || die "no unpacked libvirt source under $work"
        apply_patches "$src"
    fi
    [[ -f $src/src/ch/ch_conf.c ]] || die "$src has no ch driver sources"
    note "configuring $(basename "$src") with the ch driver into $prefix"
    meson setup "$work/build" "$src" --prefix="$prefix" --libdir=lib --buildtype=release \
        -Ddriver_ch=enabled -Ddriver_qemu=disabled -Ddriver_lxc=disabled -Ddriver_libxl=disabled \
        -Ddriver_vbox=disabled -Ddriver_esx=disabled -Ddriver_hyperv=disabled \
        -Ddriver_vmware=disabled -Ddriver_openvz=disabled -Ddriver_vz=disabled \
        -Ddriver_bhyve=disabled -Ddocs=disabled -Dtests=disabled \
        -Dnls=disabled -Dinit_script=none >"$work/meson-setup.log" 2>&1 ||
        die "meson setup failed; see $work/meson-setup.log"
    note "compiling (about 8-15 minutes on 2 cores)"
    ninja -C "$work/build" -j "${FARVM_LIBVIRT_JOBS:-$(nproc)}" >"$work/ninja.log" 2>&1 ||
        die "build failed; see $work/ninja.log"
    ninja -C "$work/build" install >"$work/install.log" 2>&1 || die "install failed; see $work/install.log"
    [[ -x $prefix/sbin/virtchd && -x $prefix/bin/virsh ]] || die "install produced no virtchd/virsh under $prefix"
    # The source and object tree are only needed to build; keep the installed tree and the logs.
    mkdir -p "$cache/logs"
    cp "$work"/*.log "$work"/apt/*.log "$cache/logs/"
    rm -rf "$work"
    echo "$(basename "$src") (Debian $suite source, farvm patches $patch_set) built in $(($(date +%s) - started)) s on $(date -u +%FT%TZ)" >"$stamp"
    note "built: $(cat "$stamp"); installed tree $(du -sh "$prefix" | cut -f1)"
}

# --- run -------------------------------------------------------------------------------------

require_built() {
    [[ -f $stamp ]] || die "libvirt with the ch driver is not built yet; run: $0 build"
    built_current || die "libvirt with the ch driver was built without farvm's current patches; run: $0 build"
}

find_farvm() {
    local bin=${FARVM_BIN:-}
    if [[ -z $bin && -x $repo/target/release/farvm ]]; then bin=$repo/target/release/farvm; fi
    if [[ -z $bin ]]; then bin=$(command -v farvm || true); fi
    [[ -n $bin && -x $bin ]] || die "no farvm binary (build it with cargo build --release, or set FARVM_BIN)"
    readlink -f "$bin"
}

# Runs "$@" as the daemon's user (from the session's recorded uid).
as_daemon_user() {
    local uid=$1
    shift
    if [[ $uid -eq $(id -u) ]]; then
        "$@"
    else
        setpriv --reuid="$uid" --regid="$(id -g "$uid")" --clear-groups -- "$@"
    fi
}

# Is path $2 readable (and, for directories, traversable) by uid $1?
readable_by() {
    as_daemon_user "$1" test -r "$2" 2>/dev/null && as_daemon_user "$1" test -x "$2" 2>/dev/null
}

session_dir() {
    [[ -f $state ]] || return 1
    local dir
    dir=$(cat "$state")
    [[ -d $dir && -f $dir/virtchd.pid ]] || return 1
    echo "$dir"
}

session_env() {
    local dir=$1
    # shellcheck disable=SC1091
    . "$dir/env"
}

print_env() {
    local dir=$1
    cat "$dir/env"
    echo "# virsh: $0 virsh ARGS   (or: virsh -c \"\$FARVM_LIBVIRT_URI\" ARGS as uid \$FARVM_LIBVIRT_UID)"
}

cmd_start() {
    require_built
    if dir=$(session_dir); then
        if kill -0 "$(cat "$dir/virtchd.pid")" 2>/dev/null; then
            note "already running (runtime directory $dir)"
            print_env "$dir"
            return 0
        fi
        note "removing the runtime directory of a daemon that is no longer running: $dir"
        rm -rf "$dir" "$state"
    fi
    local uid user farvm dir run_prefix libdir kvm_groups=--clear-groups
    if [[ $(id -u) -eq 0 ]]; then
        user=${FARVM_LIBVIRT_USER:-nobody}
        uid=$(id -u "$user") || die "no such user: $user"
        [[ $uid -ne 0 ]] || die "FARVM_LIBVIRT_USER must not be root: the daemon is the per-user one"
    else
        uid=$(id -u)
        user=$(id -un)
    fi
    # farvm opens /dev/kvm and /dev/userfaultfd as the daemon's user: give it their group.
    if [[ -e /dev/kvm ]]; then kvm_groups="--groups $(stat -c %g /dev/kvm)"; fi
    if [[ $uid -ne $(id -u) && -e /dev/kvm && -e /dev/userfaultfd ]] &&
        ! setpriv --reuid="$uid" --regid="$(id -g "$uid")" $kvm_groups -- \
            sh -c 'exec 3<>/dev/userfaultfd' 2>/dev/null; then
        note "giving /dev/userfaultfd to /dev/kvm's group (mode 0660) so farvm can page guest memory as $user"
        chgrp "$(stat -c %g /dev/kvm)" /dev/userfaultfd
        chmod 0660 /dev/userfaultfd
    fi
    farvm=$(find_farvm)
    dir=$(mktemp -d "${TMPDIR:-/tmp}/farvm-libvirt-ch.XXXXXX")
    chmod 0755 "$dir"
    mkdir -p "$dir/bin" "$dir/home" "$dir/runtime" "$dir/config" "$dir/cache"
    # The ch driver writes each VMM's output to its domain log there but does not create it.
    mkdir -p "$dir/cache/libvirt/ch/log"
    run_prefix=$prefix
    if ! readable_by "$uid" "$prefix/sbin/virtchd"; then
        note "$prefix is not reachable by $user; using a copy in $dir/prefix"
        cp -a "$prefix" "$dir/prefix"
        run_prefix=$dir/prefix
    fi
    if ! readable_by "$uid" "$farvm"; then
        note "$farvm is not reachable by $user; using a copy in $dir/farvm"
        cp "$farvm" "$dir/farvm"
        # farvm's embedded memory server is the farvm-memserver binary beside it.
        if [[ -x $(dirname "$farvm")/farvm-memserver ]]; then cp "$(dirname "$farvm")/farvm-memserver" "$dir/"; fi
        farvm=$dir/farvm
    fi
    # The ch driver looks up `cloud-hypervisor` on PATH and asks it for its version.
    ln -s "$farvm" "$dir/bin/cloud-hypervisor"
    chown -R "$uid:$(id -g "$uid")" "$dir/home" "$dir/runtime" "$dir/config" "$dir/cache"
    chmod 0700 "$dir/runtime"
    libdir=$run_prefix/lib
    cat >"$dir/env" <<EOF
export FARVM_LIBVIRT_URI='ch:///session?socket=$dir/runtime/libvirt/virtchd-sock'
export FARVM_LIBVIRT_UID=$uid
export FARVM_LIBVIRT_PREFIX='$run_prefix'
export FARVM_LIBVIRT_RUNTIME='$dir'
export LD_LIBRARY_PATH='$libdir'
export LIBVIRT_DRIVER_DIR='$libdir/libvirt/connection-driver'
export LIBVIRT_STORAGE_BACKEND_DIR='$libdir/libvirt/storage-backend'
export LIBVIRT_STORAGE_FILE_DIR='$libdir/libvirt/storage-file'
export LIBVIRT_LOCK_MANAGER_PLUGIN_DIR='$libdir/libvirt/lock-driver'
export HOME='$dir/home'
export XDG_RUNTIME_DIR='$dir/runtime'
export XDG_CONFIG_HOME='$dir/config'
export XDG_CACHE_HOME='$dir/cache'
export PATH='$dir/bin:$run_prefix/bin:$run_prefix/sbin:/usr/sbin:/usr/bin:/sbin:/bin'
EOF
    # The subshell execs (through setpriv and setsid, which exec too) into virtchd, so the PID
    # recorded for `stop` is virtchd's own; setsid detaches it from this terminal's session.
    (
        session_env "$dir"
        cd "$dir/home"
        if [[ $uid -eq $(id -u) ]]; then
            exec setsid "$run_prefix/sbin/virtchd"
        else
            # CAP_NET_ADMIN (ambient, so the VMMs it starts keep it too): libvirt creates the
            # tap of an <interface type='ethernet'> itself and hands farvm its descriptor.
            exec setpriv --reuid="$uid" --regid="$(id -g "$uid")" $kvm_groups \
                --inh-caps=+net_admin --ambient-caps=+net_admin -- \
                setsid "$run_prefix/sbin/virtchd"
        fi
    ) </dev/null >"$dir/virtchd.log" 2>&1 &
    echo $! >"$dir/virtchd.pid"
    echo "$dir" >"$state"
    local i
    for ((i = 0; i < 100; i++)); do
        [[ -S $dir/runtime/libvirt/virtchd-sock ]] && break
        kill -0 "$(cat "$dir/virtchd.pid")" 2>/dev/null ||
            die "virtchd exited during start-up; its log: $dir/virtchd.log"
        sleep 0.1
    done
    [[ -S $dir/runtime/libvirt/virtchd-sock ]] || die "virtchd made no socket in 10 s; its log: $dir/virtchd.log"
    note "virtchd running as $user (pid $(cat "$dir/virtchd.pid")), cloud-hypervisor -> $farvm"
    print_env "$dir"
}

cmd_env() {
    local dir
    dir=$(session_dir) || die "no daemon started (run: $0 start)"
    print_env "$dir"
}

cmd_virsh() {
    local dir
    dir=$(session_dir) || die "no daemon started (run: $0 start)"
    session_env "$dir"
    as_daemon_user "$FARVM_LIBVIRT_UID" "$FARVM_LIBVIRT_PREFIX/bin/virsh" -c "$FARVM_LIBVIRT_URI" "$@"
}

cmd_stop() {
    local dir pid i
    if ! dir=$(session_dir); then
        rm -f "$state"
        note "no daemon started"
        return 0
    fi
    pid=$(cat "$dir/virtchd.pid")
    if kill -0 "$pid" 2>/dev/null && [[ $(cat "/proc/$pid/comm" 2>/dev/null) == virtchd ]]; then
        # Running domains first: libvirt stops each VMM it started by its PID.
        local doms d
        doms=$(cmd_virsh list --name 2>/dev/null || true)
        for d in $doms; do
            cmd_virsh destroy "$d" >/dev/null 2>&1 || note "could not destroy domain $d"
        done
        kill -TERM "$pid"
        for ((i = 0; i < 100; i++)); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            note "virtchd (pid $pid) ignored SIGTERM for 10 s; sending SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
        fi
    fi
    rm -rf "$dir" "$state"
    note "stopped virtchd (pid $pid) and removed $dir"
}

cmd_status() {
    if built_current; then
        echo "built: $(cat "$stamp") in $prefix"
    elif [[ -f $stamp ]]; then
        echo "out of date: $(cat "$stamp"), without farvm's current patches ($patch_set); run: $0 build"
    else
        echo "not built ($cache)"
    fi
    local dir
    if dir=$(session_dir) && kill -0 "$(cat "$dir/virtchd.pid")" 2>/dev/null; then
        echo "running: pid $(cat "$dir/virtchd.pid"), runtime directory $dir"
    else
        echo "not running"
    fi
}

case ${1:-} in
build) cmd_build ;;
start) cmd_start ;;
env) cmd_env ;;
virsh)
    shift
    cmd_virsh "$@"
    ;;
stop) cmd_stop ;;
status) cmd_status ;;
*)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
