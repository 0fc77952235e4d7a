#!/usr/bin/env bash
# Command-line contract of meshd and meshctl, runnable on any machine (no RDMA needed):
# every bad configuration is refused with file:line and a non-zero exit, usage errors are named,
# and meshctl never hangs on a missing daemon.
#   tests/integration/cli_test.sh BUILD_DIR
set -u
B=${1:?usage: cli_test.sh BUILD_DIR}
MESHD=$B/node/meshd
MESHCTL=$B/node/meshctl
MESHCAT=$B/meshlib/meshcat
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
pass=0 fail=0

ok() { pass=$((pass + 1)); echo "ok   $1"; }
bad() { fail=$((fail + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && sed 's/^/     /' <<<"$2"; }

# expect EXIT_CODE PATTERN DESCRIPTION -- COMMAND...: exit status and a line of stderr+stdout.
expect() {
	local code=$1 pat=$2 what=$3 out rc
	shift 4
	out=$(timeout 20 "$@" 2>&1)
	rc=$?
	if [ "$rc" = "$code" ] && grep -qE -- "$pat" <<<"$out"; then
		ok "$what"
	else
		bad "$what (exit $rc, want $code; want /$pat/)" "$out"
	fi
}

good_cluster='cluster = { name = "t"; qps_per_link = 2; };'
good_nodes='nodes = (
  { id = 1; addr = "127.0.0.1"; port = 7471; },
  { id = 2; addr = "127.0.0.1"; port = 7472; }
);'

conf() { # NAME CONTENT
	printf '%s\n' "$2" >"$T/$1.conf"
	echo "$T/$1.conf"
}

c=$(conf unknown_key "cluster = { name = \"t\";
  qps_per_lnk = 2; };
$good_nodes")
expect 1 "unknown_key.conf:2: unknown key cluster.qps_per_lnk" "unknown config key: file:line, exit 1" -- \
	"$MESHD" -c "$c" -n 1 -s "$T/s"

c=$(conf dup_id "$good_cluster
nodes = (
  { id = 1; addr = \"127.0.0.1\"; port = 7471; },
  { id = 1; addr = \"127.0.0.1\"; port = 7472; }
);")
expect 1 "dup_id.conf:4: duplicate node id 1 \(first defined at line 3\)" "duplicate node id: file:line, exit 1" -- \
	"$MESHD" -c "$c" -n 1 -s "$T/s"

c=$(conf range "$good_cluster
nodes = (
  { id = 1; addr = \"127.0.0.1\"; port = 7471; },
  { id = 70000; addr = \"127.0.0.1\"; port = 7472; }
);")
expect 1 "range.conf:4: node id 70000 out of range 0..65535" "node id out of range: file:line, exit 1" -- \
	"$MESHD" -c "$c" -n 1 -s "$T/s"

c=$(conf qps "cluster = { name = \"t\"; qps_per_link = 99; };
$good_nodes")
expect 1 "qps.conf:1: cluster.qps_per_link 99 out of range 1..16" "qps_per_link out of range: file:line" -- \
	"$MESHD" -c "$c" -n 1 -s "$T/s"

c=$(conf syntax "cluster = { name = \"t\";
  qps_per_link = ; };
$good_nodes")
expect 1 "syntax.conf:2: syntax error" "syntax error: file:line" -- "$MESHD" -c "$c" -n 1 -s "$T/s"

# Under systemd the error reaches the journal as one (journalctl -p err): $JOURNAL_STREAM names
# meshd's stderr, so the line starts with sd-daemon's <3>. A $JOURNAL_STREAM naming another file
# (inherited, stderr redirected) leaves the line as it is.
jerr="$T/journal.err"
: >"$jerr"
JOURNAL_STREAM=$(stat -c %d:%i "$jerr") timeout 20 "$MESHD" -c "$c" -n 1 -s "$T/s" 2>"$jerr"
if grep -qE '^<3>meshd error: .*syntax.conf:2: syntax error' "$jerr"; then
	ok "a configuration error under the journal has priority <3>"
else
	bad "a configuration error under the journal has priority <3>" "$(cat "$jerr")"
fi
JOURNAL_STREAM=$(stat -c %d:%i "$T") timeout 20 "$MESHD" -c "$c" -n 1 -s "$T/s" 2>"$jerr"
if grep -qE '^meshd error: .*syntax.conf:2: syntax error' "$jerr"; then
	ok "with \$JOURNAL_STREAM naming another file: no priority prefix"
else
	bad "with \$JOURNAL_STREAM naming another file: no priority prefix" "$(cat "$jerr")"
fi

c=$(conf addr "$good_cluster
nodes = ( { id = 1; addr = \"node-a\"; port = 7471; } );")
expect 1 "addr.conf:2: nodes.addr \"node-a\" is not a numeric" "non-numeric address: file:line" -- \
	"$MESHD" -c "$c" -n 1 -s "$T/s"

c=$(conf metrics "$good_cluster
nodes = ( { id = 1; addr = \"127.0.0.1\"; port = 7471;
            metrics_listen = \"localhost:9464\"; } );")
expect 1 "metrics.conf:3: nodes.metrics_listen \"localhost:9464\" has no numeric IPv4" \
	"bad metrics_listen: file:line, exit 1" -- "$MESHD" -c "$c" -n 1 -s "$T/s"

expect 1 "$T/missing.conf: cannot open: No such file or directory" "missing config file: named, exit 1" -- \
	"$MESHD" -c "$T/missing.conf" -n 1 -s "$T/s"

# The cluster key: meshctl keygen prints one; meshd refuses a missing, short or too open key file.
key=$("$MESHCTL" keygen)
if [[ "$key" =~ ^[A-Za-z0-9+/]{43}=$ ]] && [ "$key" != "$("$MESHCTL" keygen)" ]; then
	ok "meshctl keygen: a fresh base64 key of 32 bytes each time"
else
	bad "meshctl keygen: a fresh base64 key of 32 bytes each time" "$key"
fi
c=$(conf keyed "cluster = { name = \"t\"; key_file = \"t.key\"; };
$good_nodes")
expect 1 "cluster.key_file $T/t.key: cannot open: No such file" "key file missing: named, exit 1" -- \
	"$MESHD" -c "$c" -n 1 -s "$T/s"
(umask 022 && echo "$key" >"$T/t.key")
expect 1 "permissions 0644 are too open.*chmod 600" "key file readable by others: refused as ssh does" -- \
	"$MESHD" -c "$c" -n 1 -s "$T/s"
(umask 077 && echo "AAECAwQFBgcICQoLDA0ODw==" >"$T/t.key")
chmod 600 "$T/t.key"
expect 1 "t.key:1: not a key .*shorter key is refused" "short key: refused with file:line" -- \
	"$MESHD" -c "$c" -n 1 -s "$T/s"

c=$(conf good "$good_cluster
$good_nodes")
expect 1 "good.conf:2: node id 9 is not in nodes" "node id not in the file: file:line, exit 1" -- \
	"$MESHD" -c "$c" -n 9 -s "$T/s"
expect 1 "expected a number 0..65535" "--node-id that is not a number" -- "$MESHD" -c "$c" -n abc
expect 1 "--config and --node-id are required" "meshd without arguments" -- "$MESHD"
expect 0 "Usage: meshd" "meshd --help" -- "$MESHD" --help
expect 0 "cluster.keepalive_timeout_ms .*in force: 5000" "meshd --dump-config --config shows values in force" -- \
	"$MESHD" --dump-config -c "$c"
expect 0 "nodes.port" "meshd --dump-config lists node keys" -- "$MESHD" --dump-config

# meshd --check: everything a start checks, without starting; one line per problem naming
# file:line or the key, exit 1; a good file exit 0. Ports are the kernel's free ones (tests run in
# parallel); 192.0.2.1 (TEST-NET-1) is never an address of this host.
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Holds a listening TCP port until killed; its number in "$T/$1.port".
hold_port() {
	python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
open(sys.argv[1], "w").write(str(s.getsockname()[1])); time.sleep(120)' "$T/$1.port" &
	hold_pid=$!
	for _ in $(seq 100); do [ -s "$T/$1.port" ] && break; sleep 0.05; done
}
hold_port busy
busy=$(cat "$T/busy.port")
p1=$(free_port)
(umask 077 && "$MESHCTL" keygen >"$T/ck.key")
ck_cluster='cluster = { name = "t"; transport = "tcp"; key_file = "ck.key"; };'
ck_nodes="nodes = (
  { id = 1; addr = \"127.0.0.1\"; port = $p1; },
  { id = 2; addr = \"192.0.2.1\"; port = $p1; }
);"
c=$(conf ckgood "$ck_cluster
$ck_nodes")
expect 0 "ckgood.conf: good for node 1 \(tcp on 127.0.0.1 port $p1" "meshd --check: a good file and node, exit 0" -- \
	"$MESHD" --check -c "$c" -n 1 -s "$T/ck.sock"
expect 0 "ckgood.conf: good \(2 nodes" "meshd --check without --node-id: the file and the key, exit 0" -- \
	"$MESHD" --check -c "$c"
# --dump-config takes a node the file lacks; --check does not.
expect 0 "cluster.name" "meshd --dump-config -n 9 (a node not in the file) still dumps" -- "$MESHD" --dump-config -c "$c" -n 9
expect 1 "ckgood.conf:2: node id 9 is not in nodes" "meshd --check 1: node id not in the file: file:line" -- \
	"$MESHD" --check -c "$c" -n 9 -s "$T/ck.sock"
chmod 644 "$T/ck.key"
expect 1 "cluster.key_file $T/ck.key: permissions 0644 are too open" "meshd --check 2: key file mode 0644: named" -- \
	"$MESHD" --check -c "$c" -n 1 -s "$T/ck.sock"
expect 1 "cluster.key_file $T/ck.key: permissions 0644" "meshd --check 2b: key file 0644 without --node-id too" -- \
	"$MESHD" --check -c "$c"
chmod 600 "$T/ck.key"
c=$(conf cknokey "cluster = { name = \"t\"; transport = \"tcp\"; key_file = \"nokey.key\"; };
$ck_nodes")
expect 1 "cluster.key_file $T/nokey.key: cannot open" "meshd --check 3: key file missing: named" -- \
	"$MESHD" --check -c "$c" -n 1 -s "$T/ck.sock"
expect 1 "ckgood.conf:4: node 2: cannot listen on 192.0.2.1 port $p1 \(tcp, rail 0\): 192.0.2.1 is not an address of this host: is this host node 2 \(--node-id\)" \
	"meshd --check 4: an address not on this host: file:line and the hint" -- \
	"$MESHD" --check -c "$T/ckgood.conf" -n 2 -s "$T/ck.sock"
c=$(conf ckbusy "$ck_cluster
nodes = ( { id = 1; addr = \"127.0.0.1\"; port = $busy; } );")
expect 1 "ckbusy.conf:2: node 1: cannot listen on 127.0.0.1 port $busy \(tcp, rail 0\): port $busy of 127.0.0.1 is in use" \
	"meshd --check 5: listen port in use: file:line" -- "$MESHD" --check -c "$c" -n 1 -s "$T/ck.sock"
c=$(conf ckmetrics "$ck_cluster
nodes = ( { id = 1; addr = \"127.0.0.1\"; port = $p1;
            metrics_listen = \"127.0.0.1:$busy\"; } );")
expect 1 "ckmetrics.conf:2: node 1: metrics_listen \"127.0.0.1:$busy\": port $busy of 127.0.0.1 is in use" \
	"meshd --check 6: metrics port in use: file:line" -- "$MESHD" --check -c "$c" -n 1 -s "$T/ck.sock"
c=$(conf ckquote "cluster = { name = \"t\"; transport = tcp; };
$ck_nodes")
expect 1 "ckquote.conf:1: syntax error: strings need quotes" "meshd --check 7: unquoted string: file:line, the hint" -- \
	"$MESHD" --check -c "$c" -n 1 -s "$T/ck.sock"
c=$(conf ckdup "cluster = { name = \"t\";
  transport = \"tcp\";
  transport = \"rdma\"; };
$ck_nodes")
expect 1 "ckdup.conf:3: duplicate setting transport" "meshd --check 8: a repeated key: file:line, named" -- \
	"$MESHD" --check -c "$c" -n 1 -s "$T/ck.sock"
expect 1 "$T: is a directory" "meshd --check 9: a directory as the file: named, exit 1" -- \
	"$MESHD" --check -c "$T" -n 1 -s "$T/ck.sock"
c=$(conf ckqps "cluster = { name = \"t\"; qps_per_link = 99; };
$ck_nodes")
expect 1 "ckqps.conf:1: cluster.qps_per_link 99 out of range 1..16" "meshd --check 10: a value out of range: file:line" -- \
	"$MESHD" --check -c "$c" -n 1 -s "$T/ck.sock"
c=$(conf ckrdma "cluster = { name = \"t\"; transport = \"rdma\"; };
nodes = ( { id = 1; addr = \"127.0.0.1\"; port = $p1; } );")
if [ ! -e /dev/infiniband/rdma_cm ]; then
	expect 1 "ckrdma.conf:2: node 1, rail 0: no RDMA device serves 127.0.0.1" \
		"meshd --check 11: rdma without a device on the address: named" -- \
		"$MESHD" --check -c "$c" -n 1 -s "$T/ck.sock"
else
	echo "skip meshd --check without RDMA: this machine has /dev/infiniband/rdma_cm"
fi
# Every problem at once, one line each: a key file too open and an address not on this host.
chmod 640 "$T/ck.key"
out=$("$MESHD" --check -c "$T/ckgood.conf" -n 2 -s "$T/ck.sock" 2>&1 >/dev/null)
rc=$?
chmod 600 "$T/ck.key"
if [ "$rc" = 1 ] && [ "$(wc -l <<<"$out")" = 2 ] && grep -q "permissions 0640" <<<"$out" &&
	grep -q "192.0.2.1 is not an address of this host" <<<"$out"; then
	ok "meshd --check: two problems, two lines"
else
	bad "meshd --check: two problems, two lines (exit $rc)" "$out"
fi

# The same problems at a real start: said once, with what to do.
out=$(timeout 20 "$MESHD" -c "$T/ckgood.conf" -n 2 -s "$T/ck.sock" 2>&1)
if [ "$(grep -c 'not an address of this host' <<<"$out")" = 1 ] && ! grep -q "Cannot assign" <<<"$out"; then
	ok "meshd start on an address not of this host: one line, with the hint"
else
	bad "meshd start on an address not of this host: one line, with the hint" "$out"
fi
expect 1 "metrics_listen \"127.0.0.1:$busy\": port $busy of 127.0.0.1 is in use" \
	"meshd start with its metrics port in use: address and port named" -- \
	"$MESHD" -c "$T/ckmetrics.conf" -n 1 -s "$T/ck.sock"
if grep -q "port 0" <<<"$("$MESHD" -c "$T/ckmetrics.conf" -n 1 -s "$T/ck.sock" 2>&1)"; then
	bad "meshd start with its metrics port in use: libmicrohttpd's \"port 0\" is not said"
else
	ok "meshd start with its metrics port in use: libmicrohttpd's \"port 0\" is not said"
fi
kill "$hold_pid"
wait "$hold_pid" 2>/dev/null

expect 0 "Usage: meshctl" "meshctl --help" -- "$MESHCTL" --help
expect 1 "unknown object 'linkz' \(expected: links, node, channels, ports, metrics, ping, reload, drain, keygen\)" "meshctl unknown object" -- "$MESHCTL" -s "$T/s" linkz
expect 1 "unexpected argument .now." "meshctl reload takes no argument" -- "$MESHCTL" -s "$T/s" reload now
# ping and --watch: what meshctl refuses before it asks meshd (meshd's own bounds: mesh_test.py)
expect 1 "ping: which node\?" "meshctl ping without a node" -- "$MESHCTL" -s "$T/s" ping
expect 1 "-c 0: expected a whole number in 1..10000" "meshctl ping -c 0" -- "$MESHCTL" -s "$T/s" ping 2 -c 0
expect 1 "-c 20000: expected a whole number in 1..10000" "meshctl ping -c past meshd's bound" -- "$MESHCTL" -s "$T/s" ping 2 -c 20000
expect 1 "-i 0.001: expected a number in 0.01..60" "meshctl ping -i below 10 ms" -- "$MESHCTL" -s "$T/s" ping 2 -i 0.001
expect 1 "-r 4: expected a whole number in 0..3" "meshctl ping -r past the rails" -- "$MESHCTL" -s "$T/s" ping 2 -r 4
expect 1 "ping 70000: expected a whole number in 0..65535" "meshctl ping to a node id out of range" -- "$MESHCTL" -s "$T/s" ping 70000
expect 1 "-c, -i, -r and -W are options of ping" "meshctl -c without ping" -- "$MESHCTL" -s "$T/s" -c 3 links
expect 1 "--watch is for links, node, channels and ports, not ping" "meshctl -w ping" -- "$MESHCTL" -s "$T/s" -w 1 ping 2
expect 1 "--watch 0: expected a number in 0.1..86400" "meshctl -w 0" -- "$MESHCTL" -s "$T/s" -w 0 links
expect 2 "meshd is not running at $T/nosock" "meshctl ping without a daemon: named, exit 2" -- "$MESHCTL" -s "$T/nosock" ping 2
expect 2 "meshd is not running at $T/nosock \(no such socket\)" "meshctl reload without a daemon: named, exit 2" -- "$MESHCTL" -s "$T/nosock" reload
expect 1 "unknown command 'drop' for links" "meshctl unknown command" -- "$MESHCTL" -s "$T/s" links drop
expect 1 "metrics is Prometheus text: -j does not apply" "meshctl -j metrics: an error, not the text" -- \
	"$MESHCTL" -j -s "$T/nosock" metrics
expect 0 '^\{"key":"[A-Za-z0-9+/=]{44}"\}$' "meshctl -j keygen: the key as JSON" -- "$MESHCTL" -j keygen
expect 1 "-o ls: expected wide" "meshctl -o with another value" -- "$MESHCTL" -o ls links
expect 2 "meshd is not running at $T/nosock \(no such socket\)" "meshctl without a daemon: named, exit 2" -- "$MESHCTL" -s "$T/nosock"
expect 2 "meshd is not running at $T/nosock \(no such socket\)" "meshctl metrics without a daemon: named, exit 2" -- \
	"$MESHCTL" -s "$T/nosock" metrics
expect 1 "unknown command 'drop' for metrics" "meshctl metrics unknown command" -- "$MESHCTL" -s "$T/s" metrics drop
MESH_SOCKET="$T/envsock" expect 2 "meshd is not running at $T/envsock" "meshctl honours MESH_SOCKET" -- "$MESHCTL"

# An application that cannot reach meshd is told which socket and why, not an errno that reads as
# the peer node's ("connect to node 2 port 17550: No such file or directory").
expect 2 "^meshcat: connect to node 2 port 17550: meshd is not running at $T/nosuch.sock \(no such socket\)$" \
	"meshcat without meshd: the socket path, meshd not running" -- "$MESHCAT" -s "$T/nosuch.sock" 2 17550 </dev/null
: >"$T/plain"
expect 2 "$T/plain is not a socket" "meshcat on a file that is no socket: said" -- "$MESHCAT" -s "$T/plain" 2 17550 </dev/null
# A user outside the socket's group: which group to join, and the socket's owner, group and mode.
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
	mkdir -p "$T/pub"
	chmod 711 "$T"
	chmod 755 "$T/pub"
	python3 -c '
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); s.bind(sys.argv[1]); s.listen()
os.chown(sys.argv[1], 0, 0); os.chmod(sys.argv[1], 0o660); open(sys.argv[1] + ".up", "w").close(); time.sleep(60)' \
		"$T/pub/m.sock" &
	acc_pid=$!
	for _ in $(seq 100); do [ -e "$T/pub/m.sock.up" ] && break; sleep 0.05; done
	expect 2 "meshcat: connect to node 2 port 17550: no permission for $T/pub/m.sock: join group root \(the socket is root:root 0660\)" \
		"meshcat as a user outside the socket's group: join which group" -- \
		setpriv --reuid=65534 --regid=65534 --clear-groups "$MESHCAT" -s "$T/pub/m.sock" 2 17550 </dev/null
	expect 2 "meshctl: no permission for $T/pub/m.sock: join group root \(the socket is root:root 0660\)" \
		"meshctl as a user outside the socket's group: join which group" -- \
		setpriv --reuid=65534 --regid=65534 --clear-groups "$MESHCTL" -s "$T/pub/m.sock"
	kill "$acc_pid"
	wait "$acc_pid" 2>/dev/null
	chmod 700 "$T"
else
	echo "skip a user outside the socket's group: needs root and setpriv"
fi
# A port nobody listens on: said once, not "Connection refused (meshd: node 1 refused: Connection refused)".
pr=$(free_port)
c=$(conf refuse "cluster = { name = \"t\"; transport = \"tcp\"; };
nodes = ( { id = 1; addr = \"127.0.0.1\"; port = $pr; } );")
"$MESHD" -c "$c" -n 1 -s "$T/refuse.sock" >"$T/refuse.log" 2>&1 &
refuse_pid=$!
for _ in $(seq 200); do [ -S "$T/refuse.sock" ] && break; sleep 0.05; done
out=$(timeout 20 "$MESHCAT" -s "$T/refuse.sock" 1 17550 </dev/null 2>&1)
if [ "$out" = "meshcat: connect to node 1 port 17550: nobody listens on that port" ]; then
	ok "meshcat to a port nobody listens on: one reason, no word twice"
else
	bad "meshcat to a port nobody listens on: one reason, no word twice" "$out$(tail -n 3 "$T/refuse.log")"
fi
kill "$refuse_pid"
wait "$refuse_pid"

# On a machine without RDMA meshd must say so and exit, not hang.
if [ ! -e /dev/infiniband/rdma_cm ]; then
	expect 1 "cannot start the rdma transport|cannot listen" "meshd without RDMA: clear error, exit 1" -- \
		"$MESHD" -c "$T/good.conf" -n 1 -s "$T/s"
else
	echo "skip meshd without RDMA: this machine has /dev/infiniband/rdma_cm"
fi

# The benchmark's handoff tool (tests/bench/handoff.c): a figure, named errors, and never a hang.
HANDOFF=$B/tests/bench/handoff
expect 0 '^\{"procs": 3, "mode": "futex", "laps": 200, "cpus": [0-9]+, "hop_us": [0-9.]+, "lap_us": [0-9.]+\}$' \
	"handoff -j prints one JSON figure" -- "$HANDOFF" -n 3 -m futex -l 200 -j
expect 1 "-n 1: want 2..16 processes" "handoff -n out of range is named" -- "$HANDOFF" -n 1
expect 1 "-m fast: want spin, yield or futex" "handoff unknown wait mode is named" -- "$HANDOFF" -m fast
# 6 processes spinning on this machine's few CPUs cannot finish 10^7 laps in a second: -T ends it.
expect 2 "did not finish 10000000 laps within 1 s" "handoff -T stops a ring that does not finish" -- \
	"$HANDOFF" -n 6 -m spin -l 10000000 -T 1
sleep 0.5
if pgrep -x handoff >/dev/null; then
	bad "handoff -T leaves no process of its ring behind" "$(pgrep -a -x handoff)"
else
	ok "handoff -T leaves no process of its ring behind"
fi

# meshctl lists any number of links: meshd pages a listing (a reply is one datagram) and meshctl
# asks again until it has them all. 2500 configured peers (none of them running) take several pages.
if command -v strace >/dev/null; then
	python3 -c '
import sys
n = int(sys.argv[2])
print("cluster = { name = \"pages\"; transport = \"tcp\"; };")
print("nodes = (" + ",\n".join(f"{{ id = {i}; addr = \"127.0.0.1\"; port = {47800 + i}; }}" for i in range(1, n + 1)) + ");")
' x 2501 >"$T/pages.conf"
	"$MESHD" -c "$T/pages.conf" -n 1 -s "$T/pages.sock" >"$T/pages.log" 2>&1 &
	pages_pid=$!
	for _ in $(seq 600); do [ -S "$T/pages.sock" ] && break; sleep 0.1; done
	# Once under strace to count meshd's replies (LeakSanitizer cannot run under ptrace: off there),
	# once as it is for the listing itself.
	ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
		strace -o "$T/pages.strace" -e trace=recvfrom "$MESHCTL" -j -s "$T/pages.sock" links >/dev/null 2>"$T/pages.err"
	npages=$(grep -c '^recvfrom' "$T/pages.strace")
	"$MESHCTL" -j -s "$T/pages.sock" links >"$T/pages.json" 2>>"$T/pages.err"
	rc=$?
	if [ "$rc" = 0 ] && [ "$npages" -ge 2 ] && python3 -c '
import json, sys
p = [l["peer"] for l in json.load(open(sys.argv[1]))["links"]]
sys.exit(0 if p == list(range(2, 2502)) else 1)' "$T/pages.json"; then
		ok "meshctl links lists 2500 links, each once and in order, from $npages pages of meshd's"
	else
		bad "meshctl links over 2500 links (exit $rc, $npages pages)" "$(tail -c 300 "$T/pages.err"; tail -n 5 "$T/pages.log")"
	fi
	# One peer's row, by a prefix of the object as ip takes them; the wide table's columns.
	row=$("$MESHCTL" -s "$T/pages.sock" l 7 2>&1 | tail -n +3)
	[ "$(wc -l <<<"$row")" = 1 ] && [ "$(awk '{print $1}' <<<"$row")" = 7 ] &&
		ok "meshctl l 7: links abbreviated, node 7's row alone" || bad "meshctl l 7" "$row"
	narrow=$("$MESHCTL" -s "$T/pages.sock" links 7 | sed -n 2p)
	wide=$("$MESHCTL" -s "$T/pages.sock" -o wide links show 7 | sed -n 2p)
	! grep -q EPOCH <<<"$narrow" && [ "${#narrow}" -le 100 ] && grep -q 'EPOCH.*MAILBOX' <<<"$wide" &&
		ok "meshctl links fits 100 columns (${#narrow}); -o wide adds the epoch and the mailbox" ||
		bad "meshctl links -o wide" "$narrow / $wide"
	kill "$pages_pid"
	wait "$pages_pid"
else
	echo "skip meshctl paging: strace not installed (deploy/install-deps.sh installs it)"
fi

echo "$pass passed, $fail failed"
[ "$fail" = 0 ]
