#!/usr/bin/env bash
# The channel benchmark on real verbs: boots the Soft-RoCE VM once (tests/rdma/rxe-vm) and inside it,
# on rxe0, runs 2 meshd (transport rdma, 10.77.0.1, two ports, 4 QPs per link), perftest
# (ib_write_bw -R, ib_write_lat -R), rstream (rsocket), TCP over the VM's loopback (rstream -T s) and
# meshbench, then prints one table with the figures and the ratios the project tracks
# (tests/bench/bench.py does the work).
#
#   tests/bench/run-vm-bench.sh [-b BUILD_DIR] [-o OUT_DIR] [-- BENCH_ARGS...]
#   tests/bench/run-vm-bench.sh --numa [...]         a VM with two NUMA nodes: channel bandwidth with
#                                                    the rings on meshd's node vs the other node
#   tests/bench/run-vm-bench.sh --host-tcp [...]     the same on this machine over the tcp provider
#                                                    (tests/bench/run-host-bench.sh, --perf there)
#
# Exit status: 0 when every tool ran (the ratios are reported, never asserted: emulation is noisy),
# 1 when a tool failed to run, 77 when the VM cannot run here (125 when it did not boot).
# Raw outputs, meshd logs and results.json (one JSON object per figure) go to OUT_DIR
# (default BUILD_DIR/bench-vm).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ "${1:-}" = --host-tcp ]; then
	shift
	exec "$here/run-host-bench.sh" "$@"
fi
build=$root/build
out=
extra=()
vmnuma=()
while [ $# -gt 0 ]; do
	case $1 in
	-b) build=$2; shift 2 ;;
	-o) out=$2; shift 2 ;;
	--numa) vmnuma=(-n 2); extra+=(--numa-compare); shift ;;
	--) shift; extra+=("$@"); break ;;
	-h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "run-vm-bench.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
	esac
done
build=$(mkdir -p "$build" && cd "$build" && pwd)
out=${out:-$build/bench-vm}
mkdir -p "$out"
out=$(cd "$out" && pwd)

if ! why=$("$root/tests/rdma/rxe-vm" --check 2>&1); then
	echo "skip: the Soft-RoCE VM cannot run here: $why"
	exit 77
fi
for t in ib_write_bw ib_write_lat rstream; do
	command -v "$t" >/dev/null || { echo "run-vm-bench.sh: $t is missing (apt-get install perftest rdmacm-utils)" >&2; exit 1; }
done
# The binaries the VM runs (a no-op when they are up to date).
[ -f "$build/CMakeCache.txt" ] || cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target meshd meshctl meshbench handoff >/dev/null

# Emulation shares the host's cores: anything else running now shows up as noise.
echo "# host load average before the VM: $(cut -d' ' -f1-3 /proc/loadavg) ($(nproc) CPUs)"
start=$(date +%s.%N)
set +e
# One VM, generous time: everything runs under TCG (about 100x slower than a real machine).
"$root/tests/rdma/rxe-vm" -t 1800 -a "10.77.0.1/24" "${vmnuma[@]}" -w "$out" -- \
	python3 "$here/bench.py" --mode rdma --build "$build" --out "$out" "${extra[@]}"
rc=$?
set -e
echo "# host load average after the VM: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# VM benchmark took $(awk "BEGIN{printf \"%.0f\", $(date +%s.%N) - $start}") s (boot included), exit $rc; raw outputs in $out"
exit $rc
