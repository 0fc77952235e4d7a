#!/usr/bin/env bash
# The whole test suite, from a fresh Debian 12 machine: installs what it needs (deploy/install-deps.sh),
# then
#   1. an AddressSanitizer + UBSan build (build-asan/): every ctest test, the rdma VM tests included
#      (some with lighter loads, and mesh_test over rdma on four addresses only: tests/integration);
#   2. valgrind over the unit tests of the release build and xport_test (the tcp provider on loopback);
#   3. libFuzzer, 60 s per fuzz target, as many at once as CPUs (tests/fuzz/run.sh, clang build in build-fuzz/);
#   4. the channel benchmark in the Soft-RoCE VM beside perftest, rsocket and TCP (3 rounds; figures
#      and ratios printed, never asserted; it fails only when meshbench or meshd fails), the pause
#      of a planned meshd restart (host tcp), two rails
#      against one (VM), a link's way back after whole-link outages (VM: wire back -> link UP), redis and an echo over the preload library against TCP and rsocket's (VM), and link formation of 16 nodes with and without the cluster key (host, then VM), of 64 nodes in
#      the VM against a raw rdma_cm mesh;
#   5. every build type users pick (Release and Debug, with gcc and clang), warnings as errors;
#   6. the release build (build/, -Wall -Wextra -Werror): the Go binding's overhead beside meshbench
#      (printed, never asserted), then every ctest test (go test -race of meshlib/go among them); its
#      summary closes the run, and the time taken (each step prints when it starts).
# Tests that need the Soft-RoCE VM are skipped with their reason where it cannot run, except with
# MESH_REQUIRE_RDMA=1 (set when CI=true), where that fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

bash deploy/install-deps.sh
if [ -n "${CI:-}" ]; then export MESH_REQUIRE_RDMA=${MESH_REQUIRE_RDMA:-1}; fi
jobs=$(nproc)

# Each step says when it starts, in minutes since the run began: CI's hour is the budget.
t_start=$(date +%s)
step() { printf '\n=== [%d:%02d] %s\n' $((($(date +%s) - t_start) / 60)) $((($(date +%s) - t_start) % 60)) "$*"; }

step "sanitizer build (ASan + UBSan)"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMESH_SANITIZE=ON -DMESH_WERROR=ON >/dev/null
cmake --build build-asan -j "$jobs"
# ctest names a skipped test but not why: tests/skip-reasons.py prints the reason each one gave.
step "ctest, sanitizer build"
asan_rc=0
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	ctest --test-dir build-asan --output-on-failure --output-junit ctest-junit.xml || asan_rc=$?
python3 tests/skip-reasons.py build-asan/ctest-junit.xml || true
[ "$asan_rc" = 0 ]

step "release build"
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESH_WERROR=ON >/dev/null
cmake --build build -j "$jobs"

step "valgrind, unit tests and the transports' test (tcp provider on loopback)"
vg_fail=0
for t in build/tests/unit/test_* build/tests/integration/xport_test; do
	[ -x "$t" ] || continue
	if valgrind -q --leak-check=full --errors-for-leak-kinds=definite,indirect --error-exitcode=1 "$t" >/dev/null 2>"$t.valgrind"; then
		echo "valgrind clean: ${t##*/}"
	else
		echo "valgrind FAILED: ${t##*/}"; cat "$t.valgrind"; vg_fail=1
	fi
done
[ "$vg_fail" = 0 ]

# New inputs against the wire decoders, on a copy of the committed corpus (which ctest replays in
# both builds); a crash fails the run and names its reproducer.
step "fuzzing, 60 s per target"
MESH_JOBS=$jobs bash tests/fuzz/run.sh 60

# The channel benchmark on real verbs beside perftest, rsocket and TCP (tests/bench): figures and
# ratios are printed for the record, never asserted; it fails only when meshbench or meshd fails.
step "benchmark, Soft-RoCE VM (3 rounds)"
bench_rc=0
tests/bench/run-vm-bench.sh -b build -- --rounds 3 --duration 3 --profile-secs 0 --reference-failures-ok ||
	bench_rc=$?
if [ "$bench_rc" = 77 ]; then
	echo "benchmark skipped: the VM cannot run here"
	[ "${MESH_REQUIRE_RDMA:-0}" = 1 ] && { echo "MESH_REQUIRE_RDMA=1: failing instead of skipping"; exit 1; }
elif [ "$bench_rc" != 0 ]; then
	echo "benchmark FAILED (exit $bench_rc)"
	exit 1
fi

# The same over the tcp provider on this machine, beside TCP itself (tcp_ref: a C stream, a ping-pong
# sleeping in recv and one busy-polling) and rstream's sockets; printed, never asserted.
step "benchmark, host tcp provider against TCP (3 rounds)"
tests/bench/run-host-bench.sh -b build -- --rounds 3 --duration 3 --profile-secs 0 ||
	{ echo "host benchmark FAILED"; exit 1; }

# The pause each application sees per planned restart of its meshd (issue 40's goal: median at
# most 250 ms on the host over tcp), 8 restarts under two paced streams, one each way
# (tests/integration/restart_test.py --bench); printed, never asserted beyond the streams' bytes.
step "benchmark: the pause of a planned meshd restart (host tcp, 8 restarts)"
python3 tests/integration/restart_test.py --build build --bench 8 --base-port 17990 >build/restart-bench.log 2>&1 ||
	{ cat build/restart-bench.log; echo "restart benchmark FAILED"; exit 1; }
grep -E '^# planned restart' build/restart-bench.log || true

# Two rails against one (tests/bench/rails_bench.py): the same two streams on one device or on two,
# each device's thread moving its data under its own lock; printed, never asserted.
step "benchmark: two rails against one (Soft-RoCE VM, two devices)"
rails_rc=0
tests/rdma/vm-test.sh -n 2 -r 10.78.0.1/24 -r 10.79.0.1/24 -- python3 "$(pwd)/tests/bench/rails_bench.py" \
	--build "$(pwd)/build" --transport rdma --rails "10.78.0.1 10.79.0.1" --rounds 3 || rails_rc=$?
if [ "$rails_rc" = 77 ]; then
	echo "rails benchmark skipped: the VM cannot run here"
elif [ "$rails_rc" != 0 ]; then
	echo "rails benchmark FAILED (exit $rails_rc)"
	exit 1
fi

# A link's way back after whole-link outages (both cables of two cabled rails cut past the keepalive
# timeout, then mended) under a paced stream: the time from the wire back to the link UP, and to the
# channel's bytes moving again (tests/integration/resilience_test.py; printed, never asserted beyond
# the test's own checks).
step "benchmark: a link's way back after whole-link outages (Soft-RoCE VM, two cabled rails, 4 outages)"
back_rc=0
tests/rdma/vm-test.sh -c "10.78.0.1/24 10.78.0.2/24" -c "10.79.0.1/24 10.79.0.2/24" -- python3 \
	"$(pwd)/tests/integration/resilience_test.py" --build "$(pwd)/build" --transport rdma --devices "rail0 rail1" \
	--cabled --addrs1 "10.78.0.1 10.79.0.1" --addrs2 "10.78.0.2 10.79.0.2" --outage link --rail-flaps 0 \
	--outages 4 --ka-interval 300 --ka-timeout 2000 --resume-timeout 20000 --rate 1000000 --no-ends >build/way-back.log 2>&1 ||
	back_rc=$?
grep -E '^# (outage|wire back|failover)' build/way-back.log || true
if [ "$back_rc" = 77 ]; then
	echo "way-back benchmark skipped: the VM cannot run here"
elif [ "$back_rc" != 0 ]; then
	cat build/way-back.log
	echo "way-back benchmark FAILED (exit $back_rc)"
	exit 1
fi

# Unmodified programs over the preload library (tests/bench/preload_bench.py): redis-benchmark and the
# test's own blocking echo pair over libmesh_preload.so, against kernel TCP and rsocket's
# librspreload.so in the same VM; printed, never asserted (where rsocket's crashes, the row says so).
step "benchmark: redis and an echo over the preload library against kernel TCP and rsocket's (Soft-RoCE VM)"
preload_rc=0
tests/rdma/vm-test.sh -a "10.77.0.1/24 10.77.0.2/24" -- python3 "$(pwd)/tests/bench/preload_bench.py" \
	--build "$(pwd)/build" --transport rdma --addrs "10.77.0.1 10.77.0.2" -n 10000 --rtt-count 2000 || preload_rc=$?
if [ "$preload_rc" = 77 ]; then
	echo "preload benchmark skipped: the VM cannot run here"
elif [ "$preload_rc" != 0 ]; then
	echo "preload benchmark FAILED (exit $preload_rc)"
	exit 1
fi

# Link formation of 16 nodes with and without the cluster key: what the proof costs (figures and
# ratios printed, never asserted; fails only when a mesh does not form).
step "benchmark: formation of 16 nodes with and without the key, 32 and 64 keyed (host tcp), then 16 in the VM"
python3 tests/bench/formation.py --build build --rounds 3
python3 tests/bench/formation.py --build build --nodes 32 --rounds 1 --only keyed
python3 tests/bench/formation.py --build build --nodes 64 --rounds 1 --only keyed --hold 10 --storm-probe
form_rc=0
tests/rdma/vm-test.sh -a "10.77.0.1/24" -- python3 "$(pwd)/tests/bench/formation.py" --build "$(pwd)/build" \
	--transport rdma --addr 10.77.0.1 --rounds 3 --raw-cm || form_rc=$?
if [ "$form_rc" = 77 ]; then
	echo "formation benchmark in the VM skipped: the VM cannot run here"
elif [ "$form_rc" != 0 ]; then
	echo "formation benchmark in the VM FAILED (exit $form_rc)"
	exit 1
fi
# Scale: 64 meshd over rdma in one VM (4 GiB) against a raw rdma_cm mesh of the same size, with
# max_handshakes as large as the mesh (adaptive admission must keep it from storming); the mesh is held
# 20 s (every link stays UP, the control socket timed: a minute told nothing more in CI's hour) and
# must stop cleanly. The control socket is timed during formation in every round; the extra round
# probed from a real-time client runs on the host above (here it was 70 s of CI's hour). (32 nodes, between
# the 16 above and these 64, were two minutes of CI's hour that told nothing the two do not.)
step "benchmark: formation of 64 nodes over rdma in the VM, against raw rdma_cm"
form_rc=0
tests/rdma/vm-test.sh -m 4096 -a "10.77.0.1/24" -- python3 "$(pwd)/tests/bench/formation.py" \
	--build "$(pwd)/build" --transport rdma --addr 10.77.0.1 --nodes 64 --rounds 1 --only keyed --raw-cm \
	--timeout 300 --hold 20 || form_rc=$?
if [ "$form_rc" = 77 ]; then
	echo "formation benchmark of 64 nodes skipped: the VM cannot run here"
elif [ "$form_rc" != 0 ]; then
	echo "formation benchmark of 64 nodes FAILED (exit $form_rc)"
	exit 1
fi

# Users build Release (and Debug) with either compiler: optimisation levels change what the compilers
# can prove and so what they warn about (a Release-only -Wnonnull once broke users' builds).
step "build types: Release and Debug with gcc and clang, warnings as errors"
for cc in gcc clang; do
	for type in Release Debug; do
		dir=build-$cc-${type,,}
		CC=$cc cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type" -DMESH_WERROR=ON >/dev/null
		cmake --build "$dir" -j "$jobs" >"$dir/build.log" 2>&1 || { cat "$dir/build.log"; echo "build FAILED: $cc $type"; exit 1; }
		echo "built warning-free: $cc $type"
	done
done

# The Go binding beside meshbench in one run (ratios printed, never asserted; fails only when a
# benchmark fails). Its go test -race runs in ctest below (go_binding_tcp_loopback).
step "Go binding: bandwidth and latency beside meshbench (tcp loopback)"
go_rc=0
meshlib/go/run-tests.sh -b build --bench || go_rc=$?
if [ "$go_rc" = 77 ]; then
	echo "Go benchmark skipped (reason above)"
elif [ "$go_rc" != 0 ]; then
	echo "Go benchmark FAILED (exit $go_rc)"
	exit 1
fi

step "ctest, release build"
cd "$root"
ctest_rc=0
ctest --test-dir build --output-on-failure --output-junit ctest-junit.xml || ctest_rc=$?
python3 tests/skip-reasons.py build/ctest-junit.xml || true
step "end (ctest exit $ctest_rc)"
exit "$ctest_rc"
