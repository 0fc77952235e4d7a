#!/usr/bin/env bash
# Runs one test command inside the Soft-RoCE VM (tests/rdma/rxe-vm), for ctest.
#   tests/rdma/vm-test.sh [-a "ADDR/PREFIX ..."] [-n NUMA_NODES] [-m MB] [-r "ADDR/PREFIX ..."]...
#                         [-c "ADDR/PREFIX ADDR/PREFIX"]... -- COMMAND [ARG...]   (rxe-vm's options)
# Exits 77 (skipped, with the reason) when the VM cannot run here, unless MESH_REQUIRE_RDMA=1
# (CI sets it): then that is a failure, because the rdma provider's tests must never be skipped
# silently. Inside the VM, MESH_REQUIRE_RDMA=1 is always set: there RDMA must work.
set -u
here=$(cd "$(dirname "$0")" && pwd)
addrs="10.77.0.1/24"
numa=() rails=() mem=()
while [ $# -gt 0 ]; do
	case $1 in
	-a) addrs=$2; shift 2 ;;
	-n) numa=(-n "$2"); shift 2 ;;
	-m) mem=(-m "$2"); shift 2 ;;
	-r) rails+=(-r "$2"); shift 2 ;;
	-c) rails+=(-c "$2"); shift 2 ;;
	--) shift; break ;;
	*) break ;;
	esac
done
[ $# -ge 1 ] || { echo "usage: vm-test.sh [-a ADDRS] [-n NUMA_NODES] [-m MB] [-r RAIL_ADDRS]... [-c "ADDR ADDR"]... -- COMMAND..." >&2; exit 2; }

if ! why=$("$here/rxe-vm" --check 2>&1); then
	echo "skip: the Soft-RoCE VM cannot run here: $why"
	[ "${MESH_REQUIRE_RDMA:-0}" = 1 ] && { echo "MESH_REQUIRE_RDMA=1: failing instead of skipping"; exit 1; }
	exit 77
fi
start=$(date +%s.%N)
"$here/rxe-vm" -t 900 -a "$addrs" "${numa[@]}" "${mem[@]}" "${rails[@]}" -e MESH_REQUIRE_RDMA=1 -- "$@"
rc=$?
echo "# VM test took $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $start}") s (boot included), exit $rc"
exit $rc
