#!/usr/bin/env bash
# Starts a local mesh of N meshd on one address (N ports), waits for the full mesh, opens channels
# from node 1 to an echo server on every other node (meshcat -> meshecho, 4 MiB each, checked),
# shows links and channels with meshctl, then stops every meshd cleanly (or keeps them running with
# --hold until Ctrl-C).
#   deploy/local-mesh.sh [--hold] BUILD_DIR ADDR [NODES] [TRANSPORT]
set -euo pipefail
hold=0
if [ "${1:-}" = --hold ]; then hold=1; shift; fi
build=$(cd "${1:?usage: local-mesh.sh [--hold] BUILD_DIR ADDR [NODES] [TRANSPORT]}" && pwd)
addr=${2:?address}
nodes=${3:-4}
transport=${4:-rdma}
dir=$(mktemp -d /tmp/rdmamesh-demo.XXXXXX)
pids=()

stop() {
	local p
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop EXIT
trap 'exit 130' INT TERM

# The cluster's key: links prove it both ways before anything else (mode 600, as meshd insists).
(umask 077 && "$build/node/meshctl" keygen >"$dir/cluster.key")
{
	echo "cluster = { name = \"demo\"; transport = \"$transport\"; qps_per_link = 2;"
	echo "            keepalive_interval_ms = 500; keepalive_timeout_ms = 3000; key_file = \"cluster.key\"; };"
	echo "nodes = ("
	for ((i = 1; i <= nodes; i++)); do
		printf '  { id = %d; addr = "%s"; port = %d; }%s\n' "$i" "$addr" $((7470 + i)) "$([ $i -lt "$nodes" ] && echo ,)"
	done
	echo ");"
} >"$dir/mesh.conf"
echo "== config $dir/mesh.conf"
cat "$dir/mesh.conf"

t0=$(date +%s.%N)
for ((i = 1; i <= nodes; i++)); do
	"$build/node/meshd" -c "$dir/mesh.conf" -n "$i" -s "$dir/meshd$i.sock" 2>"$dir/meshd$i.log" &
	pids+=($!)
done
want=$((nodes - 1))
for ((try = 0; try < 600; try++)); do
	up=0
	for ((i = 1; i <= nodes; i++)); do
		n=$("$build/node/meshctl" -j -s "$dir/meshd$i.sock" node 2>/dev/null | grep -o '"links_up":[0-9]*' | cut -d: -f2) || n=0
		[ "${n:-0}" = "$want" ] && up=$((up + 1))
	done
	[ "$up" = "$nodes" ] && break
	sleep 0.1
done
if [ "$up" != "$nodes" ]; then
	echo "== the mesh did not form within 60 s; logs:" >&2
	tail -n 20 "$dir"/meshd*.log >&2
	exit 1
fi
echo "== full mesh of $nodes nodes UP after $(awk "BEGIN{printf \"%.2f\", $(date +%s.%N) - $t0}") s"
for ((i = 1; i <= nodes; i++)); do
	echo
	echo "== meshctl -s $dir/meshd$i.sock links"
	"$build/node/meshctl" -s "$dir/meshd$i.sock" links
done
echo
echo "== meshctl -s $dir/meshd1.sock node"
"$build/node/meshctl" -s "$dir/meshd1.sock" node

# Channels: an echo server on every other node; node 1 streams 4 MiB to each and checks the echo.
for ((i = 2; i <= nodes; i++)); do
	"$build/meshlib/meshecho" -s "$dir/meshd$i.sock" -l 6000 2>>"$dir/meshecho$i.log" &
	pids+=($!)
done
sleep 0.5
head -c $((4 << 20)) /dev/urandom >"$dir/payload"
want=$(sha256sum <"$dir/payload" | cut -d' ' -f1)
cat_pids=()
for ((i = 2; i <= nodes; i++)); do
	# The sleep keeps each channel open while meshctl shows it.
	{ cat "$dir/payload"; sleep 2; } | "$build/meshlib/meshcat" -s "$dir/meshd1.sock" "$i" 6000 >"$dir/echo$i" &
	cat_pids+=($!)
done
sleep 1
echo
echo "== meshctl -s $dir/meshd1.sock channels   (node 1 -> echo servers on nodes 2..$nodes)"
"$build/node/meshctl" -s "$dir/meshd1.sock" channels
ok=0
for ((k = 0; k < ${#cat_pids[@]}; k++)); do
	i=$((k + 2))
	if wait "${cat_pids[k]}" && [ "$(sha256sum <"$dir/echo$i" | cut -d' ' -f1)" = "$want" ]; then
		ok=$((ok + 1))
	else
		echo "== channel to node $i: the echo differs or meshcat failed" >&2
	fi
done
echo
echo "== $ok of $((nodes - 1)) channels echoed 4 MiB back intact"
[ "$ok" = $((nodes - 1)) ] || exit 1
if [ "$hold" = 1 ]; then
	echo
	echo "== running; try: $build/node/meshctl -s $dir/meshd1.sock -p links   (Ctrl-C stops)"
	wait
fi
echo
echo "== stopping (SIGTERM)"
