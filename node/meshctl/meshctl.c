/*
 * meshctl: shows what one meshd knows: its node and its links, as an aligned table or as JSON, and
 * asks it for a ping, a reload or a drain. This file is the command line: usage, the options, and
 * which command the words name (objects by any unambiguous beginning, as ip takes them); the commands
 * themselves are in show.c, ping.c and ops.c (meshctl.h lists what each file does).
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mesh/mesh.h>

#include "meshctl.h"
#include "util.h"

static void usage(FILE *out)
{
	fprintf(out,
		"Usage: meshctl [-j] [-p] [-L] [-o wide] [-w SEC] [-s SOCKET] [OBJECT [show] [PEER]]\n"
		"       meshctl [-j] [-s SOCKET] ping NODE [-c COUNT] [-i SEC] [-W SEC] [-r RAIL]\n"
		"       meshctl [-j] [-s SOCKET] reload\n"
		"       meshctl [-j] [-s SOCKET] [--deadline SEC] [--wait] drain\n"
		"       meshctl keygen\n"
		"\n"
		"Shows the state of the local meshd.\n"
		"\n"
		"Objects (any unambiguous beginning will do, as with ip: meshctl l, meshctl ch; links and\n"
		"channels take a peer's node id to show that peer's rows only: meshctl links 2):\n"
		"  links   (default) one row per configured peer: state, dialer, QPs, rails up, RTT, time\n"
		"          in its state, last error; -o wide: epoch, mailbox key, transport (JSON also:\n"
		"          down_error, why it last went DOWN from UP; the last rail_error, rail_failovers,\n"
		"          ctl_rail)\n"
		"  node    this node: id, cluster, address, transport, uptime, counters, NUMA placement,\n"
		"          its devices (one per rail) with their nodes, the data-path threads and their CPUs\n"
		"  ping    round trips to NODE's meshd through the mesh, on every UP rail of the link (-r:\n"
		"          one): a probe message on the rail's first QP, answered by the peer's meshd on the\n"
		"          same QP; a line per answer, then per rail as ping(8): probes sent, received, loss,\n"
		"          rtt min/avg/max/mdev. Exit 0 when an answer came, 1 when none did or meshd\n"
		"          refused (node unknown, link DOWN: said on stderr). Ctrl-C: the summary so far.\n"
		"          meshd runs 8 pings at once, 2 of one user (root's and meshd's excepted)\n"
		"  reload  meshd reads its configuration file again and applies what changed (as\n"
		"          SIGHUP): nodes added and removed, a node moved, limits, timeouts, log level,\n"
		"          metrics address, key file; links and channels the change is not about are\n"
		"          not touched. A file that does not load, or that changes a key only a start\n"
		"          applies, is refused as a whole: meshd keeps what it had, and this says why\n"
		"          (exit 2). Root or meshd's own user only. Prints the node's configuration\n"
		"          generation afterwards (meshctl node: config_*)\n"
		"  drain   for maintenance: meshd refuses new channels from now on (opened here, by\n"
		"          peers, or new ports: \"the node is draining\"), lets the open ones run, and\n"
		"          stops once none is left, at the latest after --deadline SEC (default 300;\n"
		"          what is left then fails with the same error). Again: a new deadline. With\n"
		"          --wait, meshctl waits until meshd has stopped, printing the channels left.\n"
		"          Root or meshd's own user only\n"
		"  keygen  print a fresh cluster key (32 bytes from getrandom, base64) in the format of\n"
		"          cluster.key_file: meshctl keygen > /etc/rdmamesh/cluster.key; chmod 600 it\n"
		"  channels  one row per open channel: ports, opener, state, rail, bytes each way, error;\n"
		"            -o wide: its user (the uid it counts against), QPs, device, ring, chunks each\n"
		"            way, writes in flight, credit stalls, resumes and the bytes they wrote again,\n"
		"            NUMA node of the ring pages (JSON also: rail_moves, writer: who posts\n"
		"            this side's writes, meshd or app, cluster.app_send, or offered: granted and\n"
		"            not taken yet; app_grants: times the application took them, again after\n"
		"            each resume; app_withdrawn: grants withdrawn before it took them)\n"
		"  ports   one row per listening port: its user and process, channels accepted there\n"
		"  metrics the node's metrics in Prometheus text format, the same as meshd serves at\n"
		"          /metrics (cluster.metrics_listen); for node_exporter's textfile collector:\n"
		"          meshctl metrics > DIR/rdmamesh.prom.$$ && mv DIR/rdmamesh.prom.$$ DIR/rdmamesh.prom\n"
		"\n"
		"Options:\n"
		"  -j, --json          print JSON (the links JSON is a stable interface)\n"
		"  -p, --pretty        indent the JSON\n"
		"  -o, --output wide   tables with every column (the default ones fit 100 columns)\n"
		"  -w, --watch[=SEC]   links, node, channels, ports: again every SEC seconds (default 2) until\n"
		"                      interrupted, as watch(1), under a header with the time; the screen is\n"
		"                      cleared on a terminal only; with -j one JSON document per look\n"
		"  -L, --live          node, links: wait for meshd's data path, however busy, rather than\n"
		"                      take the state it last published (exact counters after an event)\n"
		"  -c, --count N       ping: probes per rail, 1..10000 (default 5)\n"
		"  -i, --interval SEC  ping: between probes, 0.01..60 (default 1; users other than root and\n"
		"                      meshd's: at least 0.2)\n"
		"  -W, --timeout SEC   ping: a probe unanswered this long is lost, up to 60 (default 2)\n"
		"  -r, --rail R        ping: that rail only (default: every UP rail of the link)\n"
		"      --deadline SEC  drain: stop at the latest SEC seconds from now (default 300)\n"
		"      --wait          drain: return once meshd has stopped\n"
		"  -s, --socket PATH   meshd's control socket (default $%s, else %s)\n"
		"  -V, --version       print the version\n"
		"  -h, --help          this help\n"
		"\n"
		"A table's column is headed by its JSON key in capitals (STATE_MS: state_ms), durations\n"
		"written as 850ms, 12.3s, 4m05s, 2h03m or 3d04h (JSON: milliseconds).\n"
		"Link states: UP (all QPs connected, keys exchanged and proven), CONNECTING (the peer\n"
		"answered, handshake in progress), DOWN (no connection; the higher id re-dials). An UP\n"
		"link with several rails stays UP while one is; RAILS_UP counts those UP (a lost rail is\n"
		"dialled again and rejoins), and the channels of a lost rail move to another.\n"
		"Channel states: OPENING, OPEN, HALF_CLOSED (one side shut), RESUMING (its link is DOWN\n"
		"or its rail is lost: it waits up to cluster.resume_timeout_ms and resumes where it stood),\n"
		"CLOSING, ERROR.\n"
		"meshd's control socket has its own thread: when the data path is busy for over 20 ms\n"
		"(link set-up under a handshake storm), node and links come from the state it last\n"
		"published (a note on stderr says how old; JSON: from_snapshot, snapshot_age_ms) unless\n"
		"-L; the other objects wait for the data path.\n"
		"Exit status: 0 on success, 1 on a usage error, 2 when meshd cannot be reached or fails.\n",
		MESH_SOCKET_ENV, MESH_SOCKET_DEFAULT);
}

/* A number argument within lo..hi: 0, or 1 said. */
static int arg_number(const char *opt, const char *s, double lo, double hi, double *v)
{
	char *end;

	errno = 0;
	*v = strtod(s, &end);
	if (errno || !*s || *end || !(*v >= lo && *v <= hi)) {
		fprintf(stderr, "meshctl: %s %s: expected a number in %g..%g\n", opt, s, lo, hi);
		return 1;
	}
	return 0;
}

/* A whole number within lo..hi: 0, or 1 said. */
static int arg_uint(const char *opt, const char *s, unsigned long lo, unsigned long hi, uint32_t *v)
{
	unsigned long n;
	char *end;

	errno = 0;
	n = strtoul(s, &end, 10);
	if (errno || *s < '0' || *s > '9' || *end || n < lo || n > hi) {
		fprintf(stderr, "meshctl: %s %s: expected a whole number in %lu..%lu\n", opt, s, lo, hi);
		return 1;
	}
	*v = (uint32_t)n;
	return 0;
}

/* What the command line asks for. */
struct args {
	struct out o;
	const char *sock;
	struct ping_args pa;
	bool ping_opts; /* -c, -i, -r or -W given */
	uint32_t watch_ms;
	bool live, wait;
	long deadline_s;
};

/* An option of ping (-c, -W, -i, -r) into a->pa: 0, or 1 said. */
static int ping_option(int c, const char *arg, struct args *a)
{
	double v;

	switch (c) {
	case 'c':
		if (arg_uint("-c", arg, 1, MESH_PING_COUNT_MAX, &a->pa.count))
			return 1;
		break;
	case 'W':
		if (arg_number("-W", arg, 0.001, MESH_PING_TIMEOUT_MAX_MS / 1000.0, &v))
			return 1;
		a->pa.timeout_ms = (uint32_t)(v * 1000 + 0.5);
		break;
	case 'i':
		if (arg_number("-i", arg, MESH_PING_INTERVAL_MIN_MS / 1000.0, MESH_PING_INTERVAL_MAX_MS / 1000.0, &v))
			return 1;
		a->pa.interval_ms = (uint32_t)(v * 1000 + 0.5);
		break;
	case 'r': {
		uint32_t rail;

		if (arg_uint("-r", arg, 0, MESH_RAILS_MAX - 1, &rail))
			return 1;
		a->pa.rail = (int)rail;
		break;
	}
	}
	a->ping_opts = true;
	return 0;
}

/* --deadline SEC of drain into a->deadline_s: 0, or 1 said. */
static int deadline_option(const char *arg, struct args *a)
{
	char *end;

	errno = 0;
	a->deadline_s = strtol(arg, &end, 10);
	if (errno || *end || end == arg || a->deadline_s < 1 || a->deadline_s > MESH_DRAIN_MAX_MS / 1000) {
		fprintf(stderr, "meshctl: --deadline %s: expected seconds, 1..%u\n", arg, MESH_DRAIN_MAX_MS / 1000);
		return 1;
	}
	return 0;
}

/* The options into *a: -1 to go on with the words after them (argv + optind), else the exit status:
 * 0 after -V or -h, 1 on a usage error (said). */
static int parse_options(int argc, char **argv, struct args *a)
{
	static const struct option opts[] = {
		{"json", no_argument, NULL, 'j'},    {"pretty", no_argument, NULL, 'p'},
		{"live", no_argument, NULL, 'L'},
		{"socket", required_argument, NULL, 's'}, {"version", no_argument, NULL, 'V'},
		{"help", no_argument, NULL, 'h'},    {"deadline", required_argument, NULL, 'D'},
		{"wait", no_argument, NULL, 'A'},    {"output", required_argument, NULL, 'o'},
		{"watch", optional_argument, NULL, 'w'}, {"count", required_argument, NULL, 'c'},
		{"interval", required_argument, NULL, 'i'}, {"rail", required_argument, NULL, 'r'},
		{"timeout", required_argument, NULL, 'W'},
		{NULL, 0, NULL, 0},
	};
	double v;
	int c;

	while ((c = getopt_long(argc, argv, "jpLs:o:w:c:i:r:W:Vh", opts, NULL)) != -1) {
		switch (c) {
		case 'w':
			if (optarg && arg_number("--watch", optarg, 0.1, 86400, &v))
				return 1;
			a->watch_ms = optarg ? (uint32_t)(v * 1000 + 0.5) : 2000;
			break;
		case 'c':
		case 'W':
		case 'i':
		case 'r':
			if (ping_option(c, optarg, a))
				return 1;
			break;
		case 'o':
			if (strcmp(optarg, "wide")) {
				fprintf(stderr, "meshctl: -o %s: expected wide\n", optarg);
				return 1;
			}
			a->o.wide = true;
			break;
		case 'L':
			a->live = true;
			break;
		case 'D':
			if (deadline_option(optarg, a))
				return 1;
			break;
		case 'A':
			a->wait = true;
			break;
		case 'j':
			a->o.json = true;
			break;
		case 'p':
			a->o.json = a->o.pretty = true;
			break;
		case 's':
			a->sock = optarg;
			break;
		case 'V':
			printf("meshctl %d.%d\n", MESH_VERSION_MAJOR, MESH_VERSION_MINOR);
			return 0;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 1;
		}
	}
	return -1;
}

/* Objects as `ip` takes them: any unambiguous beginning (meshctl l, meshctl ch). What changes
 * the node (reload, drain) and keygen are written out. */
static void expand_abbreviation(int n, char **w)
{
	static const char *const shown[] = {"links", "node", "channels", "ports", "metrics"};
	const char *hit = NULL;

	if (n < 1)
		return;
	for (size_t i = 0; i < ARRAY_SIZE(shown); i++)
		if (!strncmp(shown[i], w[0], strlen(w[0])) && w[0][0])
			hit = hit ? "" : shown[i];
	if (hit && *hit)
		w[0] = (char *)hit;
}

/* 1 said when there is a word w[i] where none is expected, else 0. */
static int extra_word(int n, char **w, int i)
{
	if (i >= n)
		return 0;
	fprintf(stderr, "meshctl: unexpected argument '%s'\n", w[i]);
	return 1;
}

/* `meshctl ping NODE` */
static int run_ping(int n, char **w, struct args *a)
{
	if (n < 2 || arg_uint("ping", w[1], 0, MESH_NODE_ID_MAX, &a->pa.node)) {
		if (n < 2)
			fprintf(stderr, "meshctl: ping: which node? (meshctl ping NODE [-c COUNT] [-i SEC] [-W SEC] [-r RAIL])\n");
		return 1;
	}
	if (extra_word(n, w, 2))
		return 1;
	return cmd_ping(a->sock, &a->o, &a->pa);
}

/* `meshctl metrics [show]` */
static int run_metrics(int n, char **w, struct args *a)
{
	/* Prometheus text, not a table: there is no JSON of it. */
	if (a->o.json) {
		fprintf(stderr, "meshctl: metrics is Prometheus text: -j does not apply (meshctl -j node has the counters)\n");
		return 1;
	}
	if (n > 1 && strcmp(w[1], "show")) {
		fprintf(stderr, "meshctl: unknown command '%s' for metrics (expected: show)\n", w[1]);
		return 1;
	}
	if (extra_word(n, w, 2))
		return 1;
	return cmd_metrics(a->sock);
}

/* `meshctl [OBJECT [show] [PEER]]`, links when no object is named: once, or every a->watch_ms. */
static int run_object(int n, char **w, struct args *a)
{
	static const struct object objects[] = {
		{"links", CTL_OBJECT__CTL_OBJECT_LINKS, print_links}, /* first = default */
		{"node", CTL_OBJECT__CTL_OBJECT_NODE, print_node},
		{"channels", CTL_OBJECT__CTL_OBJECT_CHANNELS, print_channels},
		{"ports", CTL_OBJECT__CTL_OBJECT_PORTS, print_ports},
	};
	size_t obj = 0;
	int i = 0;

	if (i < n) {
		for (obj = 0; obj < ARRAY_SIZE(objects) && strcmp(objects[obj].name, w[i]); obj++)
			;
		if (obj == ARRAY_SIZE(objects)) {
			fprintf(stderr, "meshctl: unknown object '%s' (expected: links, node, channels, ports, metrics, ping, reload, drain, keygen)\n",
				w[i]);
			return 1;
		}
		i++;
	}
	if (i < n && !strcmp(w[i], "show"))
		i++;
	/* links and channels: one peer's rows (meshctl links 2) */
	if (i < n && (objects[obj].obj == CTL_OBJECT__CTL_OBJECT_LINKS ||
		      objects[obj].obj == CTL_OBJECT__CTL_OBJECT_CHANNELS)) {
		char *end;

		errno = 0;
		a->o.peer = strtol(w[i], &end, 10);
		if (!errno && *w[i] && !*end && a->o.peer >= 0 && a->o.peer <= 65535) {
			i++;
		} else {
			a->o.peer = -1;
			fprintf(stderr, "meshctl: unknown command '%s' for %s (expected: show, or a peer's node id)\n",
				w[i], objects[obj].name);
			return 1;
		}
	} else if (i < n && strcmp(w[i], "show")) {
		fprintf(stderr, "meshctl: unknown command '%s' for %s (expected: show)\n", w[i], objects[obj].name);
		return 1;
	}
	if (extra_word(n, w, i))
		return 1;
	if (a->watch_ms) {
		char what[32];

		if (a->o.peer >= 0)
			snprintf(what, sizeof(what), "%s %ld", objects[obj].name, a->o.peer);
		else
			snprintf(what, sizeof(what), "%s", objects[obj].name);
		return cmd_watch(a->sock, &a->o, &objects[obj], a->live, a->watch_ms, what);
	}
	return cmd_show(a->sock, &a->o, &objects[obj], a->live);
}

/* The command the words w[0..n) name, checked against the options given: its exit status. The
 * checks go in this order, so that of two mistakes the same one is said as before. */
static int run(int n, char **w, struct args *a)
{
	const char *cmd = n > 0 ? w[0] : ""; /* no word: links */

	if (a->ping_opts && strcmp(cmd, "ping")) {
		fprintf(stderr, "meshctl: -c, -i, -r and -W are options of ping\n");
		return 1;
	}
	if (a->watch_ms && (!strcmp(cmd, "metrics") || !strcmp(cmd, "ping") || !strcmp(cmd, "reload") ||
			    !strcmp(cmd, "drain") || !strcmp(cmd, "keygen"))) {
		fprintf(stderr, "meshctl: --watch is for links, node, channels and ports, not %s\n", cmd);
		return 1;
	}
	if (!strcmp(cmd, "ping"))
		return run_ping(n, w, a);
	if (!strcmp(cmd, "metrics"))
		return run_metrics(n, w, a);
	if ((a->deadline_s || a->wait) && strcmp(cmd, "drain")) {
		fprintf(stderr, "meshctl: --deadline and --wait are options of drain\n");
		return 1;
	}
	if (!strcmp(cmd, "drain"))
		return extra_word(n, w, 1) ? 1 : cmd_drain(a->sock, &a->o, (uint32_t)a->deadline_s * 1000, a->wait);
	if (!strcmp(cmd, "reload"))
		return extra_word(n, w, 1) ? 1 : cmd_reload(a->sock, &a->o);
	if (!strcmp(cmd, "keygen"))
		return extra_word(n, w, 1) ? 1 : cmd_keygen(&a->o);
	return run_object(n, w, a);
}

int main(int argc, char **argv)
{
	struct args a = {
		.o = {.first = true, .peer = -1},
		.sock = getenv(MESH_SOCKET_ENV),
		.pa = {.count = 5, .interval_ms = MESH_PING_INTERVAL_DEFAULT_MS,
		       .timeout_ms = MESH_PING_TIMEOUT_DEFAULT_MS, .rail = -1},
	};
	int ret;

	if (!a.sock || !*a.sock)
		a.sock = MESH_SOCKET_DEFAULT;
	ret = parse_options(argc, argv, &a);
	if (ret >= 0)
		return ret;
	expand_abbreviation(argc - optind, argv + optind);
	return run(argc - optind, argv + optind, &a);
}
