#!/usr/bin/env bash
# A rolling upgrade of a running cluster: 16 meshd of the base revision (tests/upgrade/BASE: the
# release this one must upgrade from) under meshd-keeper, a ring of streams between applications
# built against the base's libmesh, and every node upgraded in turn to this build's meshd (the
# keeper's program replaced, then a planned restart): each new meshd restores the channels the old
# one kept, mixed versions talk meanwhile, and every stream ends intact. See restart_test.py
# (--rolling, --from).
#   tests/upgrade/upgrade_test.sh BUILD_DIR SOURCE_DIR [BASE_PORT]
# Skipped (77, with the reason) when the base revision is not in the repository (a shallow clone)
# or cannot be built here.
set -u
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
port=${3:-17930}
base=$(tr -d ' \n' <"$src/tests/upgrade/BASE")
git -C "$src" cat-file -e "$base^{commit}" 2>/dev/null ||
	{ echo "skip: the base revision $base is not in this clone (a shallow clone?)"; exit 77; }
work=$(mktemp -d /tmp/mesh-upgrade.XXXXXX)
trap 'git -C "$src" worktree remove --force "$work/src" >/dev/null 2>&1; rm -rf "$work"' EXIT
echo "# base revision $base ($(git -C "$src" log -1 --format=%cs "$base")), built in $work"
git -C "$src" worktree add --detach "$work/src" "$base" >/dev/null 2>&1 ||
	{ echo "skip: cannot check out $base"; exit 77; }
t0=$(date +%s)
if ! cmake -S "$work/src" -B "$work/build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$work/cmake.log" 2>&1 ||
	! cmake --build "$work/build" -j "$(nproc)" --target meshd meshd-keeper chan_test >>"$work/cmake.log" 2>&1; then
	tail -20 "$work/cmake.log"
	echo "FAIL the base revision $base does not build"
	exit 1
fi
echo "# base built in $(($(date +%s) - t0)) s"
python3 "$src/tests/integration/restart_test.py" --build "$build" --from "$work/build" --rolling 16 \
	--rate 262144 --base-port "$port"
