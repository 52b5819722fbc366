#!/usr/bin/env bash
# Installs the system packages farvm needs to build and test (Debian/Ubuntu), then builds the
# release binaries: farvm (the VMM), farvm-memserver and farvm-lab (benchmarks and trace tools).
# Idempotent: a second run only rebuilds what changed.
#   libclang-dev, linux-libc-dev  bindgen generates the rdma-core bindings of the RDMA transport
#                                 (feature `rdma`) from C headers (userfaultfd's are hand-written)
#   cmake, pkg-config             the RDMA transport's verbs shim (feature `rdma`, on by default in
#                                 farvm and farvm-memserver), built by rdma-mummy-sys with cmake
#   rdma-core, libibverbs-dev, librdmacm-dev, ibverbs-providers
#                                 rdma-core's libraries and device providers (Soft-RoCE's librxe),
#                                 loaded at run time by `rdma://` links and `farvm-memserver --rdma`
#   iproute2                      network-namespace tests (`ip netns`), scripts/cluster.sh
#   etcd-server, etcd-client      the pool directory's tests and scripts/cluster.sh run a real etcd
#   protobuf-compiler             protoc, for the etcd client's gRPC bindings (etcd-client crate)
#   libvirt-clients, libxml2-utils
#                                 virt-xml-validate (and the xmllint it runs): the domain XML
#                                 fixtures are checked against libvirt's schema
#   acpica-tools                  iasl: the generated ACPI tables are checked with ACPICA's
#                                 disassembler
#   qemu-system-x86               QEMU: the KVM lab (scripts/kvm-lab), the test guest under QEMU
#                                 (tests/tests/qemu_guest.rs) and bench compare's QEMU setups
#   busybox-static, cpio, kmod,   the KVM lab's initramfs (scripts/kvm-lab: a static busybox,
#   xz-utils                      cpio, depmod/modprobe on the lab kernel's .ko.xz modules) and
#                                 the Linux test guest's (scripts/linux-guest-image.sh)
#   e2fsprogs, openssl            the Linux test guest's disks (mkfs.ext4 -d, debugfs; fixed
#                                 AES-CTR data): scripts/linux-guest-image.sh and
#                                 scripts/linux-guest-programs.sh
#   mmdebstrap                    the Debian guest's root file system from Debian packages
#                                 (scripts/debian-guest-image.sh)
#   gcc-12, make, dwarves         the Linux guest agent module (guest-agent/linux/build.sh) is
#                                 built against the lab kernel's headers (pahole for its BTF)
#   python3                       scripts/kvm-lab.d/hlt-exits and lab/scripts/*
#   fonts-dejavu-core             the PNG charts of farvm-lab's benchmarks (without a TrueType
#                                 font they are skipped)
#   ibverbs-utils                 ibv_rc_pingpong, for scripts/kvm-lab.d/rxe-netns
# Not installed here: scripts/compare-lab.sh installs nbd-server and nbd-client itself, and
# scripts/libvirt-ch.sh libvirt's build dependencies; scripts/make-trace.sh (regenerating
# traces/) needs valgrind, zstd, sqlite3, redis-server and python3-numpy.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
for pkg in qemu-system-x86 libclang-dev linux-libc-dev cmake pkg-config iproute2 rdma-core libibverbs-dev librdmacm-dev ibverbs-providers \
    libvirt-clients libxml2-utils etcd-server etcd-client protobuf-compiler acpica-tools gcc-12 make dwarves \
    busybox-static cpio kmod xz-utils e2fsprogs openssl mmdebstrap python3 fonts-dejavu-core ibverbs-utils; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if ((${#need[@]})); then
    echo "setup: installing ${need[*]}"
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
if [[ ! -w /dev/kvm ]]; then
    echo "setup: warning: /dev/kvm is missing or not writable; VMs cannot run here" >&2
fi
cargo build --release --workspace --bins
echo "setup: done; binaries in target/release/ (farvm, farvm-memserver, farvm-lab, farvm-pool, farvm-delay-proxy)"
