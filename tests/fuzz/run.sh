#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (build-fuzz/: ASan + UBSan + libFuzzer) and fuzzes each
# for SECONDS (default 60), several at once (for hours: tests/fuzz/run.sh 14400, or one target
# alone: build-fuzz/tests/fuzz/fuzz_mesh_state -max_total_time=14400 CORPUS_DIR), on a copy of the
# committed corpus plus freshly generated seeds, so that the tree stays clean. Fails on any crash,
# leak, timeout or out-of-memory, and prints the reproducer.
#
#   tests/fuzz/run.sh [--update-corpus] [SECONDS]
#
# --update-corpus: after a clean run, minimise (-merge=1) what the run found into
# tests/fuzz/corpus/<target>/: the seed-* (generated) and regress-* (past findings) files stay,
# other inputs are kept only if they add coverage.
#
# Environment: MESH_FUZZ_BUILD (build directory, default build-fuzz), MESH_JOBS (build jobs,
# default nproc), MESH_FUZZ_PARALLEL (targets fuzzing at once, default nproc), MESH_FUZZ_MAX_LEN
# (largest input, default 4200: above MESH_CTL_REQ_MAX + 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

usage() {
	echo "usage: $0 [--update-corpus] [SECONDS]" >&2
	exit 2
}
update=0
if [ "${1:-}" = "--update-corpus" ]; then
	update=1
	shift
fi
[ $# -le 1 ] || usage
secs=${1:-60}
[[ "$secs" =~ ^[1-9][0-9]*$ ]] || usage

bdir=${MESH_FUZZ_BUILD:-$root/build-fuzz}
jobs=${MESH_JOBS:-$(nproc)}
max_len=${MESH_FUZZ_MAX_LEN:-4200}
targets=(tcp_frame peer_decoders mesh_state)

if ! command -v clang >/dev/null; then
	echo "fuzz: clang not found (deploy/install-deps.sh installs clang and libclang-rt-dev)" >&2
	exit 1
fi

echo "fuzz: building the targets in ${bdir#"$root"/}/ (clang, ASan + UBSan + libFuzzer)"
cmake -S "$root" -B "$bdir" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	-DMESH_SANITIZE=ON -DMESH_FUZZ=ON >/dev/null
cmake --build "$bdir" -j "$jobs" --target fuzz_make_seeds "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

run="$bdir/fuzz-run"
rm -rf "$run"
for t in "${targets[@]}"; do
	mkdir -p "$run/$t/corpus" "$run/$t/artifacts" "$run/$t/seeds"
done
"$bdir/tests/fuzz/fuzz_make_seeds" "$run/tcp_frame/seeds" "$run/peer_decoders/seeds"

# The targets fuzz side by side, as many at once as there are CPUs (MESH_FUZZ_PARALLEL): each still
# gets SECONDS of a whole CPU, and CI's fuzzing step takes a third of the time on two cores.
parallel=${MESH_FUZZ_PARALLEL:-$(nproc)}
[[ "$parallel" =~ ^[1-9][0-9]*$ ]] || parallel=1
fuzz_one() {
	local t=$1 work="$run/$1" status=0
	"$bdir/tests/fuzz/fuzz_$t" -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len="$max_len" \
		-artifact_prefix="$work/artifacts/" -print_final_stats=1 "$work/corpus" \
		>"$work/fuzz.log" 2>&1 || status=$?
	echo "$status" >"$work/status"
}
running=0
for t in "${targets[@]}"; do
	work="$run/$t"
	committed="$root/tests/fuzz/corpus/fuzz_$t"
	cp "$committed"/* "$work/corpus/"
	# The seeds of the current encoders win over committed ones (mesh_state has none: its corpus is
	# committed only).
	find "$work/seeds" -maxdepth 1 -type f -exec cp {} "$work/corpus/" \;
	n_in=$(find "$work/corpus" -type f | wc -l)
	echo "fuzz: fuzz_$t for ${secs}s on $n_in inputs (log: ${work#"$root"/}/fuzz.log)"
	if [ "$running" -ge "$parallel" ]; then
		wait -n || true
		running=$((running - 1))
	fi
	fuzz_one "$t" &
	running=$((running + 1))
done
wait

passed=0
failed=0
for t in "${targets[@]}"; do
	bin="$bdir/tests/fuzz/fuzz_$t"
	work="$run/$t"
	committed="$root/tests/fuzz/corpus/fuzz_$t"
	status=$(cat "$work/status" 2>/dev/null || echo "unknown (no status written)")

	# libFuzzer's last status line: "#runs DONE cov: ... ft: ... corp: n/size ... exec/s: ..."
	last=$(grep -E '^#[0-9]+' "$work/fuzz.log" | tail -n 1 || true)
	echo "fuzz: fuzz_$t: ${last:-no status line}"
	artifacts=$(find "$work/artifacts" -type f | sort)
	if [ "$status" != 0 ] || [ -n "$artifacts" ]; then
		failed=$((failed + 1))
		echo "fuzz: fuzz_$t FAILED (exit status $status); the end of its log:"
		tail -n 60 "$work/fuzz.log" | sed 's/^/    /'
		for a in $artifacts; do
			echo "fuzz: reproducer: $a"
			echo "fuzz:   rerun:  $bin $a"
			echo "fuzz:   keep:   cp $a tests/fuzz/crashes/"
		done
		continue
	fi
	passed=$((passed + 1))
	echo "fuzz: fuzz_$t passed: $(find "$work/corpus" -type f | wc -l) inputs in the working corpus"

	if [ "$update" = 1 ]; then
		merged="$work/merged"
		mkdir -p "$merged"
		find "$work/seeds" -maxdepth 1 -type f -exec cp {} "$merged/" \;
		find "$committed" -maxdepth 1 -type f -name 'seed-*' -exec cp -n {} "$merged/" \;
		find "$committed" -maxdepth 1 -type f -name 'regress-*' -exec cp {} "$merged/" \;
		"$bin" -merge=1 -rss_limit_mb=2048 -timeout=10 -max_len="$max_len" "$merged" "$work/corpus" \
			>"$work/merge.log" 2>&1 || { echo "fuzz: merge failed, see $work/merge.log" >&2; exit 1; }
		rm -f "$committed"/*
		cp "$merged"/* "$committed/"
		echo "fuzz: corpus/fuzz_$t: $(find "$committed" -type f | wc -l) inputs," \
			"$(du -sk "$committed" | cut -f1) KiB"
	fi
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
