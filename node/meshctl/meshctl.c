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

int main(int argc, char **argv)
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
	static const struct object objects[] = {
		{"links", CTL_OBJECT__CTL_OBJECT_LINKS, print_links}, /* first = default */
		{"node", CTL_OBJECT__CTL_OBJECT_NODE, print_node},
		{"channels", CTL_OBJECT__CTL_OBJECT_CHANNELS, print_channels},
		{"ports", CTL_OBJECT__CTL_OBJECT_PORTS, print_ports},
	};
	struct out o = {.first = true, .peer = -1};
	const char *sock = getenv(MESH_SOCKET_ENV);
	struct ping_args pa = {.count = 5, .interval_ms = MESH_PING_INTERVAL_DEFAULT_MS,
			       .timeout_ms = MESH_PING_TIMEOUT_DEFAULT_MS, .rail = -1};
	bool ping_opts = false;
	uint32_t watch_ms = 0;
	size_t obj = 0;
	bool live = false, wait = false;
	long deadline_s = 0;
	double v;
	int c;

	if (!sock || !*sock)
		sock = MESH_SOCKET_DEFAULT;
	while ((c = getopt_long(argc, argv, "jpLs:o:w:c:i:r:W:Vh", opts, NULL)) != -1) {
		switch (c) {
		case 'w':
			if (optarg && arg_number("--watch", optarg, 0.1, 86400, &v))
				return 1;
			watch_ms = optarg ? (uint32_t)(v * 1000 + 0.5) : 2000;
			break;
		case 'c':
			if (arg_uint("-c", optarg, 1, MESH_PING_COUNT_MAX, &pa.count))
				return 1;
			ping_opts = true;
			break;
		case 'W':
			if (arg_number("-W", optarg, 0.001, MESH_PING_TIMEOUT_MAX_MS / 1000.0, &v))
				return 1;
			pa.timeout_ms = (uint32_t)(v * 1000 + 0.5);
			ping_opts = true;
			break;
		case 'i':
			if (arg_number("-i", optarg, MESH_PING_INTERVAL_MIN_MS / 1000.0, MESH_PING_INTERVAL_MAX_MS / 1000.0, &v))
				return 1;
			pa.interval_ms = (uint32_t)(v * 1000 + 0.5);
			ping_opts = true;
			break;
		case 'r': {
			uint32_t rail;

			if (arg_uint("-r", optarg, 0, MESH_RAILS_MAX - 1, &rail))
				return 1;
			pa.rail = (int)rail;
			ping_opts = true;
			break;
		}
		case 'o':
			if (strcmp(optarg, "wide")) {
				fprintf(stderr, "meshctl: -o %s: expected wide\n", optarg);
				return 1;
			}
			o.wide = true;
			break;
		case 'L':
			live = true;
			break;
		case 'D': {
			char *end;

			errno = 0;
			deadline_s = strtol(optarg, &end, 10);
			if (errno || *end || end == optarg || deadline_s < 1 || deadline_s > MESH_DRAIN_MAX_MS / 1000) {
				fprintf(stderr, "meshctl: --deadline %s: expected seconds, 1..%u\n", optarg,
					MESH_DRAIN_MAX_MS / 1000);
				return 1;
			}
			break;
		}
		case 'A':
			wait = true;
			break;
		case 'j':
			o.json = true;
			break;
		case 'p':
			o.json = o.pretty = true;
			break;
		case 's':
			sock = optarg;
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
	/* Objects as `ip` takes them: any unambiguous beginning (meshctl l, meshctl ch). What changes
	 * the node (reload, drain) and keygen are written out. */
	if (optind < argc) {
		static const char *const shown[] = {"links", "node", "channels", "ports", "metrics"};
		const char *hit = NULL;

		for (size_t i = 0; i < ARRAY_SIZE(shown); i++)
			if (!strncmp(shown[i], argv[optind], strlen(argv[optind])) && argv[optind][0])
				hit = hit ? "" : shown[i];
		if (hit && *hit)
			argv[optind] = (char *)hit;
	}
	if (ping_opts && !(optind < argc && !strcmp(argv[optind], "ping"))) {
		fprintf(stderr, "meshctl: -c, -i, -r and -W are options of ping\n");
		return 1;
	}
	if (watch_ms && optind < argc &&
	    (!strcmp(argv[optind], "metrics") || !strcmp(argv[optind], "ping") || !strcmp(argv[optind], "reload") ||
	     !strcmp(argv[optind], "drain") || !strcmp(argv[optind], "keygen"))) {
		fprintf(stderr, "meshctl: --watch is for links, node, channels and ports, not %s\n", argv[optind]);
		return 1;
	}
	if (optind < argc && !strcmp(argv[optind], "ping")) {
		if (optind + 1 >= argc || arg_uint("ping", argv[optind + 1], 0, MESH_NODE_ID_MAX, &pa.node)) {
			if (optind + 1 >= argc)
				fprintf(stderr, "meshctl: ping: which node? (meshctl ping NODE [-c COUNT] [-i SEC] [-W SEC] [-r RAIL])\n");
			return 1;
		}
		if (optind + 2 < argc) {
			fprintf(stderr, "meshctl: unexpected argument '%s'\n", argv[optind + 2]);
			return 1;
		}
		return cmd_ping(sock, &o, &pa);
	}
	if (optind < argc && !strcmp(argv[optind], "metrics")) {
		/* Prometheus text, not a table: there is no JSON of it. */
		if (o.json) {
			fprintf(stderr, "meshctl: metrics is Prometheus text: -j does not apply (meshctl -j node has the counters)\n");
			return 1;
		}
		if (optind + 1 < argc && strcmp(argv[optind + 1], "show")) {
			fprintf(stderr, "meshctl: unknown command '%s' for metrics (expected: show)\n", argv[optind + 1]);
			return 1;
		}
		if (optind + 2 < argc) {
			fprintf(stderr, "meshctl: unexpected argument '%s'\n", argv[optind + 2]);
			return 1;
		}
		return cmd_metrics(sock);
	}
	if ((deadline_s || wait) && !(optind < argc && !strcmp(argv[optind], "drain"))) {
		fprintf(stderr, "meshctl: --deadline and --wait are options of drain\n");
		return 1;
	}
	if (optind < argc && !strcmp(argv[optind], "drain")) {
		if (optind + 1 < argc) {
			fprintf(stderr, "meshctl: unexpected argument '%s'\n", argv[optind + 1]);
			return 1;
		}
		return cmd_drain(sock, &o, (uint32_t)deadline_s * 1000, wait);
	}
	if (optind < argc && !strcmp(argv[optind], "reload")) {
		if (optind + 1 < argc) {
			fprintf(stderr, "meshctl: unexpected argument '%s'\n", argv[optind + 1]);
			return 1;
		}
		return cmd_reload(sock, &o);
	}
	if (optind < argc && !strcmp(argv[optind], "keygen")) {
		if (optind + 1 < argc) {
			fprintf(stderr, "meshctl: unexpected argument '%s'\n", argv[optind + 1]);
			return 1;
		}
		return cmd_keygen(&o);
	}
	if (optind < argc) {
		for (obj = 0; obj < ARRAY_SIZE(objects) && strcmp(objects[obj].name, argv[optind]); obj++)
			;
		if (obj == ARRAY_SIZE(objects)) {
			fprintf(stderr, "meshctl: unknown object '%s' (expected: links, node, channels, ports, metrics, ping, reload, drain, keygen)\n",
				argv[optind]);
			return 1;
		}
		optind++;
	}
	if (optind < argc && !strcmp(argv[optind], "show"))
		optind++;
	/* links and channels: one peer's rows (meshctl links 2) */
	if (optind < argc && (objects[obj].obj == CTL_OBJECT__CTL_OBJECT_LINKS ||
			      objects[obj].obj == CTL_OBJECT__CTL_OBJECT_CHANNELS)) {
		char *end;

		errno = 0;
		o.peer = strtol(argv[optind], &end, 10);
		if (!errno && *argv[optind] && !*end && o.peer >= 0 && o.peer <= 65535) {
			optind++;
		} else {
			o.peer = -1;
			fprintf(stderr, "meshctl: unknown command '%s' for %s (expected: show, or a peer's node id)\n",
				argv[optind], objects[obj].name);
			return 1;
		}
	} else if (optind < argc && strcmp(argv[optind], "show")) {
		fprintf(stderr, "meshctl: unknown command '%s' for %s (expected: show)\n", argv[optind],
			objects[obj].name);
		return 1;
	}
	if (optind < argc) {
		fprintf(stderr, "meshctl: unexpected argument '%s'\n", argv[optind]);
		return 1;
	}
	if (watch_ms) {
		char what[32];

		if (o.peer >= 0)
			snprintf(what, sizeof(what), "%s %ld", objects[obj].name, o.peer);
		else
			snprintf(what, sizeof(what), "%s", objects[obj].name);
		return cmd_watch(sock, &o, &objects[obj], live, watch_ms, what);
	}
	return cmd_show(sock, &o, &objects[obj], live);
}
