#!/usr/bin/env bash
# Installs, by Debian package name, everything rdmamesh needs to build, test and run its
# real-RDMA harness on a fresh Debian 12 machine. Idempotent; needs root (or sudo).
#   deploy/install-deps.sh          build + test + Soft-RoCE VM harness
#   deploy/install-deps.sh --build  only what building and the host tests need
set -euo pipefail

build_pkgs=(
    build-essential cmake pkg-config git
    libibverbs-dev librdmacm-dev rdma-core ibverbs-providers
    libconfig-dev protobuf-c-compiler libprotobuf-c-dev libnuma-dev libcmocka-dev nettle-dev
    libsystemd-dev libmicrohttpd-dev iproute2 python3
    prometheus    # its promtool checks meshd's metrics text (tests/integration/metrics_test.py)
    scdoc man-db
    # Packaging and the unit's checks (tests/install): cpack's dpkg-shlibdeps (dpkg-dev) and file,
    # lintian, strace; the Kubernetes manifests' test reads YAML.
    dpkg-dev file lintian strace systemd python3-yaml
    # The Go binding (meshlib/go) and its tests.
    golang-go
    # Real programs under libmesh_preload.so (tests/integration/preload_test.py), each started by the
    # test on its own port in its own namespace. Debian starts redis-server and memcached as services
    # on 127.0.0.1:6379 and :11211 where systemd runs; the tests never use those.
    redis-server redis-tools memcached libmemcached-tools
    # Servers that fork per connection or into workers (preload_test.py --part fork): nginx with
    # `daemon on` and two workers, socat's TCP-LISTEN,fork. Debian's nginx is not started here.
    nginx-light socat
)
# The Soft-RoCE VM (tests/rdma/rxe-vm): Debian's own kernel has rdma_rxe as a module.
vm_pkgs=(
    qemu-system-x86 linux-image-amd64 busybox-static kmod xz-utils cpio
    ibverbs-utils rdmacm-utils perftest
)
# Fuzzing and leak checking.
tool_pkgs=(clang libclang-rt-dev valgrind)

pkgs=("${build_pkgs[@]}")
if [ "${1:-}" != "--build" ]; then
    pkgs+=("${vm_pkgs[@]}" "${tool_pkgs[@]}")
fi

missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "install-deps: all ${#pkgs[@]} packages present"
    exit 0
fi
SUDO=
[ "$(id -u)" -eq 0 ] || SUDO=sudo
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
