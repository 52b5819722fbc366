# Sourced by scripts/kvm-lab and the image scripts (scripts/*-guest-*.sh): which of the host
# commands a script runs are missing, and the Debian packages that give them. Each argument is
# CMD:PACKAGE. A command is also looked for in /usr/sbin and /sbin, which a user's PATH may lack
# (modprobe, depmod, mkfs.ext4, debugfs, chroot live there).

# Sets MISSING_CMDS (in argument order) and MISSING_PKGS (sorted, each once).
find_missing_tools() {
    MISSING_CMDS=() MISSING_PKGS=()
    local t
    for t in "$@"; do
        command -v "${t%%:*}" >/dev/null || PATH=$PATH:/usr/sbin:/sbin command -v "${t%%:*}" >/dev/null \
            || { MISSING_CMDS+=("${t%%:*}") && MISSING_PKGS+=("${t#*:}"); }
    done
    if ((${#MISSING_PKGS[@]})); then
        mapfile -t MISSING_PKGS < <(printf '%s\n' "${MISSING_PKGS[@]}" | sort -u)
    fi
}

# Returns unless a CMD:PACKAGE is missing; then says, as $1, which commands are missing and the
# command that installs their packages, and exits 1.
require_tools() {
    local who=$1
    shift
    find_missing_tools "$@"
    ((${#MISSING_CMDS[@]})) || return 0
    echo "$who: missing ${MISSING_CMDS[*]}; install them with: sudo apt-get install --no-install-recommends ${MISSING_PKGS[*]} (or run scripts/setup.sh, which installs what every script needs)" >&2
    exit 1
}

# The command line of the image scripts (scripts/linux-guest-image.sh, linux-guest-programs.sh,
# debian-guest-image.sh): `build` (the default), `--refresh` or `--help` (the script's
# header comment, up to its `set -Eeuo` line). Defines say and die (messages prefixed with
# WHO, on stderr) and sets refresh=1 for --refresh. Usage: image_script_args WHO "$@".
image_script_args() {
    IMAGE_SCRIPT=$1
    shift
    say() { echo "$IMAGE_SCRIPT: $*" >&2; }
    die() {
        say "$*"
        exit 1
    }
    usage() {
        sed -n '2,/^set -Eeuo/{/^set -Eeuo/d;s/^# \{0,1\}//;p}' "$0"
        exit "${1:-64}"
    }
    refresh=0
    case ${1:-build} in
    build) ;;
    --refresh) refresh=1 ;;
    --help | -h) usage 0 ;;
    *) usage ;;
    esac
}
