#!/usr/bin/env bash
# Two applications outside the project, built against the libmesh installed under PREFIX, one with
# pkg-config (mesh.pc) and one with CMake (find_package(rdmamesh CONFIG), rdmamesh::mesh), then run
# against a live 2-node mesh of the meshd installed there (tcp on 127.0.0.1): each streams 4 MiB to
# the installed meshecho on node 2 through node 1 and checks the echo (consumer.c).
#   tests/install/consumers.sh PREFIX WORKDIR BASE_PORT
# MESH_CONSUMER_CFLAGS: extra flags for both (the sanitizer build's -fsanitize=..., which a program
# linking an instrumented libmesh needs too).
# Used by install_test.sh (a scratch prefix) and deb_test.sh (/usr, from the packages). Exit 0 when
# everything passed; prints one line per check.
set -u
prefix=$1
work=$2
port=$3
here=$(cd "$(dirname "$0")" && pwd)
fail=0
bad() { echo "FAIL $*"; fail=1; }
ok() { echo "ok   $*"; }
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
}
trap cleanup EXIT
mkdir -p "$work"

pc=$(find "$prefix/lib" -path '*/pkgconfig/mesh.pc' 2>/dev/null | head -1)
[ -n "$pc" ] || { echo "FAIL no mesh.pc under $prefix/lib"; exit 1; }
libdir=$(dirname "$(dirname "$pc")")
export LD_LIBRARY_PATH=$libdir

# pkg-config, as a Makefile would: cc $(pkg-config --cflags mesh) ... $(pkg-config --libs mesh)
cflags=$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --cflags mesh) &&
	libs=$(PKG_CONFIG_PATH=$libdir/pkgconfig pkg-config --libs mesh) &&
	cc -std=c11 -Wall -Wextra -Werror ${MESH_CONSUMER_CFLAGS:-} $cflags -o "$work/consumer_pc" "$here/consumer.c" $libs 2>"$work/pc.log" &&
	ok "pkg-config consumer built ($cflags $libs)" || { cat "$work/pc.log"; bad "pkg-config consumer did not build"; }
# CMake, as a project would: find_package(rdmamesh CONFIG REQUIRED)
if cmake -S "$here/cmake-consumer" -B "$work/cmake-consumer" -DCMAKE_PREFIX_PATH="$prefix" \
	-DCMAKE_C_FLAGS="-Wall -Wextra -Werror ${MESH_CONSUMER_CFLAGS:-}" >"$work/cmake.log" 2>&1 &&
	cmake --build "$work/cmake-consumer" >>"$work/cmake.log" 2>&1; then
	ok "CMake consumer built (find_package(rdmamesh) from $(grep -o 'rdmamesh_DIR:PATH=.*' "$work/cmake-consumer/CMakeCache.txt" | cut -d= -f2))"
else
	cat "$work/cmake.log"; bad "CMake consumer did not build"
fi
# Each must load the installed library, not one from a build tree.
for c in "$work/consumer_pc" "$work/cmake-consumer/consumer_cmake"; do
	[ -x "$c" ] || continue
	lib=$(ldd "$c" | awk '/libmesh\.so\.0/ {print $3}')
	[ "$(readlink -f "$lib")" = "$(readlink -f "$libdir/libmesh.so.0")" ] &&
		ok "${c##*/} loads $libdir/libmesh.so.0" || bad "${c##*/} loads libmesh from '$lib', not $libdir"
done

cat >"$work/mesh.conf" <<CONF
cluster = { name = "install"; transport = "tcp"; qps_per_link = 2; keepalive_interval_ms = 300; };
nodes = (
  { id = 1; addr = "127.0.0.1"; port = $port; },
  { id = 2; addr = "127.0.0.1"; port = $((port + 1)); }
);
CONF
for i in 1 2; do
	"$prefix/bin/meshd" -c "$work/mesh.conf" -n "$i" -s "$work/meshd$i.sock" >"$work/meshd$i.log" 2>&1 &
	pids+=($!)
done
up=0
for _ in $(seq 150); do
	if "$prefix/bin/meshctl" -s "$work/meshd1.sock" -j links 2>/dev/null | grep -q '"state":"UP"'; then
		up=1
		break
	fi
	sleep 0.1
done
[ "$up" = 1 ] && ok "the installed meshd: nodes 1 and 2 UP" || { tail "$work"/meshd*.log; bad "the link did not come UP"; }
"$prefix/bin/meshecho" -s "$work/meshd2.sock" -l 7000 >"$work/meshecho.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
	"$prefix/bin/meshctl" -s "$work/meshd2.sock" ports 2>/dev/null | grep -q 7000 && break
	sleep 0.1
done
for c in "$work/consumer_pc" "$work/cmake-consumer/consumer_cmake"; do
	[ -x "$c" ] || continue
	if out=$(timeout 60 "$c" "$work/meshd1.sock" 2 7000 4194304 2>&1); then
		ok "${c##*/}: ${out//$'\n'/; }"
	else
		bad "${c##*/}: $out"
		# What each side saw, for the one reading this: the channels as meshd has them now, and
		# the logs.
		for i in 1 2; do
			echo "--- meshd $i: channels"
			"$prefix/bin/meshctl" -s "$work/meshd$i.sock" channels 2>&1 | tail -n 5
			echo "--- meshd $i: log (tail)"
			tail -n 20 "$work/meshd$i.log"
		done
		echo "--- meshecho: log"
		tail -n 20 "$work/meshecho.log"
	fi
done
exit $fail
