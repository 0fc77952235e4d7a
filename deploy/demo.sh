#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: installs the dependencies, builds rdmamesh, starts a
# local mesh of 4 meshd (2 QPs per link, transport "auto") and shows it with meshctl.
#   - on this machine's RDMA when its kernel has it (an RDMA device whose netdev has an IPv4
#     address; MESH_DEMO_ADDR=a.b.c.d picks the address);
#   - otherwise over the tcp provider on 127.0.0.1;
#   - with --vm: inside the project's Soft-RoCE VM (tests/rdma/rxe-vm), real verbs on Debian's own
#     kernel even where this kernel has no RDMA (about 10 s more).
# --hold keeps the mesh running until Ctrl-C (not with --vm).
set -euo pipefail
cd "$(dirname "$0")/.."
hold=()
vm=0
for a in "$@"; do
	case $a in
	--hold) hold=(--hold) ;;
	--vm) vm=1 ;;
	*) echo "usage: deploy/demo.sh [--hold] [--vm]" >&2; exit 2 ;;
	esac
done

bash deploy/install-deps.sh
# Its own build directory without the tests: the demo needs only meshd and meshctl.
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESH_TESTS=OFF >/dev/null
cmake --build build-demo -j "$(nproc)"

rdma_addr() {
	local g nd a
	[ -n "${MESH_DEMO_ADDR:-}" ] && { echo "$MESH_DEMO_ADDR"; return 0; }
	[ -e /dev/infiniband/rdma_cm ] || return 1
	for g in /sys/class/infiniband/*/ports/*/gid_attrs/ndevs/*; do
		nd=$(cat "$g" 2>/dev/null) || continue
		a=$(ip -4 -o addr show dev "$nd" 2>/dev/null | awk '{print $4}' | cut -d/ -f1 | head -1)
		[ -n "$a" ] && { echo "$a"; return 0; }
	done
	return 1
}

if [ "$vm" = 1 ]; then
	echo "== running the mesh on real verbs inside the Soft-RoCE VM (tests/rdma/rxe-vm)"
	exec tests/rdma/rxe-vm -t 600 -a 10.77.0.1/24 -- deploy/local-mesh.sh build-demo 10.77.0.1 4 auto
fi
if addr=$(rdma_addr); then
	echo "== RDMA on this machine: mesh on $addr"
	exec deploy/local-mesh.sh "${hold[@]}" build-demo "$addr" 4 auto
fi
echo "== no RDMA in this kernel: the mesh runs over the tcp provider on 127.0.0.1 (deploy/demo.sh --vm for real verbs)"
exec deploy/local-mesh.sh "${hold[@]}" build-demo 127.0.0.1 4 auto
