#!/usr/bin/env bash
# Runs the mesh integration test over the rdma provider inside the Soft-RoCE VM.
#   tests/rdma/run-mesh-vm.sh BUILD_DIR one|four
#     one:  4 meshd on one address of rxe0, 4 ports
#     four: 4 meshd on 4 addresses of rxe0, one port
# Exits 77 (skipped, with the reason) when the VM cannot run here, unless MESH_REQUIRE_RDMA=1
# (CI sets it), where that is a failure: the rdma provider's test must never be skipped silently.
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:?usage: run-mesh-vm.sh BUILD_DIR one|four}" && pwd)
mode=${2:-one}

if ! why=$("$here/rxe-vm" --check 2>&1); then
	echo "skip: the Soft-RoCE VM cannot run here: $why"
	[ "${MESH_REQUIRE_RDMA:-0}" = 1 ] && { echo "MESH_REQUIRE_RDMA=1: failing instead of skipping"; exit 1; }
	exit 77
fi
case $mode in
one)
	vm_addrs="10.77.0.1/24"
	addrs="10.77.0.1"
	;;
four)
	vm_addrs="10.77.0.1/24 10.77.0.2/24 10.77.0.3/24 10.77.0.4/24"
	addrs="10.77.0.1 10.77.0.2 10.77.0.3 10.77.0.4"
	;;
*)
	echo "run-mesh-vm.sh: mode must be one or four" >&2
	exit 2
	;;
esac
start=$(date +%s.%N)
"$here/rxe-vm" -t 600 -a "$vm_addrs" -- python3 "$here/../integration/mesh_test.py" --build "$build" \
	--transport rdma --addrs "$addrs"
rc=$?
echo "# VM integration test ($mode) took $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $start}") s, exit $rc"
exit $rc
