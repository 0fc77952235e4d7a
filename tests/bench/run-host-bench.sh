#!/usr/bin/env bash
# The channel benchmark on this machine over the tcp provider: 2 meshd on 127.0.0.1 (4 QPs per
# link), meshbench against plain TCP over loopback (rstream -T s, else python sockets), one table
# with the figures and the ratios (tests/bench/bench.py --mode tcp). With --perf, the profile runs
# are recorded with perf and the top symbols printed.
#
#   tests/bench/run-host-bench.sh [-b BUILD_DIR] [-o OUT_DIR] [--perf] [-- BENCH_ARGS...]
#
# Exit status: 0 when every tool ran (ratios are reported, not asserted), 1 when one failed.
# Raw outputs go to OUT_DIR (default BUILD_DIR/bench-host).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$root/build
out=
extra=()
while [ $# -gt 0 ]; do
	case $1 in
	-b) build=$2; shift 2 ;;
	-o) out=$2; shift 2 ;;
	--perf) extra+=(--perf); shift ;;
	--) shift; extra+=("$@"); break ;;
	-h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "run-host-bench.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
	esac
done
build=$(mkdir -p "$build" && cd "$build" && pwd)
out=${out:-$build/bench-host}
mkdir -p "$out"
[ -f "$build/CMakeCache.txt" ] || cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" --target meshd meshctl meshbench handoff tcp_ref >/dev/null
if [ ${#extra[@]} -gt 0 ] && [ "${extra[0]}" = --perf ] && ! command -v perf >/dev/null; then
	echo "run-host-bench.sh: --perf needs perf (apt-get install linux-perf)" >&2
	exit 1
fi
exec python3 "$here/bench.py" --mode tcp --build "$build" --out "$out" "${extra[@]}"
