/*
 * meshctl: shows what one meshd knows: its node and its links, as an aligned table or as JSON.
 * Every field is described once in a table below and printed through the same helpers for both
 * forms, so text and JSON never drift. The JSON of `meshctl -j links` is a stable interface.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "auth.h"
#include "sockerr.h"
#include "util.h"
#include "wire.h"

#define REPLY_TIMEOUT_S 5

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

/* ---- output: one set of helpers for table and JSON ---- */

struct out {
	bool json, pretty;
	bool wide;  /* -o wide: every table column */
	long peer;  /* links, channels PEER: that peer's rows only; -1 all */
	int depth;
	bool first; /* no comma before the next JSON member */
};

static void json_str(const char *s)
{
	putchar('"');
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

static void json_sep(struct out *o)
{
	if (!o->first)
		putchar(',');
	o->first = false;
	if (o->pretty)
		printf("\n%*s", o->depth * 2, "");
}

static void json_key(struct out *o, const char *key)
{
	json_sep(o);
	json_str(key);
	putchar(':');
	if (o->pretty)
		putchar(' ');
}

static void json_open(struct out *o, const char *key, char brace)
{
	if (key)
		json_key(o, key);
	else if (o->depth)
		json_sep(o);
	putchar(brace);
	o->depth++;
	o->first = true;
}

static void json_close(struct out *o, char brace)
{
	o->depth--;
	if (o->pretty && !o->first)
		printf("\n%*s", o->depth * 2, "");
	putchar(brace);
	o->first = false;
}

enum field_kind {
	F_U32,
	F_I32,
	F_U64,
	F_STR,
	F_BOOL,
	F_STATE,
	F_MAILBOX,
	F_NODE, /* a NUMA node: JSON the number; table "-" for -1 (none/unknown), "spread" for -2 */
	F_WALL_US, /* wall clock in us: JSON the number; table UTC time, "-" for 0 */
	F_DURATION_MS, /* milliseconds: JSON the number; table 850ms, 12.3s, 4m05s, 2h03m, 3d04h */
};

struct field {
	const char *key;   /* JSON member */
	bool table;        /* a table column, headed by the JSON key in capitals; false: JSON only */
	int width;         /* table column width, negative = left aligned */
	enum field_kind kind;
	size_t off;
	bool wide; /* a table column only with -o wide (the default table fits 100 columns) */
};

#define LF(key, table, width, kind, member) {key, table, width, kind, offsetof(LinkInfo, member), false}
#define LW(key, table, width, kind, member) {key, table, width, kind, offsetof(LinkInfo, member), true}
static const struct field link_fields[] = {
	LF("peer", true, 5, F_U32, peer),
	LF("addr", true, -15, F_STR, peer_addr),
	LF("port", true, 5, F_U32, peer_port),
	LF("state", true, -10, F_STATE, state),
	LF("dialer", true, -6, F_BOOL, dialer),
	LF("qps", true, 3, F_U32, qps),
	LF("qps_configured", false, 0, F_U32, qps_configured),
	LF("rails_up", true, 8, F_U32, rails_up),
	LF("rails", false, 0, F_U32, rails),
	LF("rail_failovers", false, 0, F_U64, rail_failovers),
	LF("ctl_rail", false, 0, F_U32, ctl_rail),
	LF("rail_error", false, 0, F_STR, rail_error),
	LW("epoch", true, 16, F_U64, epoch),
	LF("rtt_us", true, 6, F_U64, rtt_us),
	LW("mailbox", true, -30, F_MAILBOX, mailbox),
	LW("transport", true, -9, F_STR, transport),
	LF("state_ms", true, 8, F_DURATION_MS, state_ms),
	LF("ups", true, 4, F_U32, ups),
	LF("attempts", false, 0, F_U32, attempts),
	LF("peer_boot_epoch", false, 0, F_U64, peer_boot_epoch),
	LF("tx_msgs", false, 0, F_U64, tx_msgs),
	LF("rx_msgs", false, 0, F_U64, rx_msgs),
	LF("down_error", false, 0, F_STR, down_error),
	LF("last_error", true, -1, F_STR, last_error),
};

#define CF(key, table, width, kind, member) {key, table, width, kind, offsetof(ChannelInfo, member), false}
#define CW(key, table, width, kind, member) {key, table, width, kind, offsetof(ChannelInfo, member), true}
static const struct field channel_fields[] = {
	CF("id", true, 5, F_U32, id),
	CF("local_node", false, 0, F_U32, local_node),
	CF("local_port", true, 10, F_U32, local_port),
	CF("peer_node", true, 9, F_U32, peer_node),
	CF("peer_port", true, 9, F_U32, peer_port),
	CF("opener", true, -6, F_BOOL, opener),
	CW("owner_uid", true, 9, F_U32, owner_uid),
	CF("state", true, -11, F_STR, state),
	CW("qps", true, 3, F_U32, qps),
	CF("rail", true, 4, F_U32, rail),
	CW("device", true, -8, F_STR, device),
	CW("ring_size", true, 9, F_U64, ring_size),
	CF("tx_bytes", true, 10, F_U64, tx_bytes),
	CF("rx_bytes", true, 10, F_U64, rx_bytes),
	CW("tx_chunks", true, 9, F_U64, tx_chunks),
	CW("rx_chunks", true, 9, F_U64, rx_chunks),
	CW("in_flight", true, 9, F_U32, in_flight),
	CW("credit_stalls", true, 13, F_U64, credit_stalls),
	CW("resumes", true, 7, F_U64, resumes),
	CW("rewritten_bytes", true, 15, F_U64, rewritten_bytes),
	CF("rail_moves", false, 0, F_U64, rail_moves),
	CF("direct_writes", false, 0, F_U64, direct_writes),
	CF("direct_paused", false, 0, F_BOOL, direct_paused),
	CF("pair_hints", false, 0, F_U64, pair_hints),
	CF("writer", false, 0, F_STR, writer),
	CF("peer_app_writes", false, 0, F_BOOL, peer_app_writes),
	CF("app_grants", false, 0, F_U64, app_grants),
	CF("app_withdrawn", false, 0, F_U64, app_withdrawn),
	CW("numa_node", true, 9, F_NODE, numa_node),
	CF("numa_want", false, 0, F_NODE, numa_want),
	CF("tx_pending", false, 0, F_U64, tx_pending),
	CF("rx_unread", false, 0, F_U64, rx_unread),
	CF("error", true, -1, F_STR, error),
};

#define NF(key, kind, member) {key, true, 0, kind, offsetof(NodeInfo, member), false}
static const struct field node_fields[] = {
	NF("id", F_U32, id),
	NF("cluster", F_STR, cluster),
	NF("cluster_hash", F_U32, cluster_hash),
	NF("addr", F_STR, addr),
	NF("port", F_U32, port),
	NF("transport", F_STR, transport),
	NF("qps_per_link", F_U32, qps_per_link),
	NF("peers", F_U32, peers),
	NF("links_up", F_U32, links_up),
	NF("boot_epoch", F_U64, boot_epoch),
	NF("uptime_ms", F_U64, uptime_ms),
	NF("pid", F_U32, pid),
	NF("version", F_STR, version),
	NF("ctl_errors", F_U64, ctl_errors),
	NF("peer_rejects", F_U64, peer_rejects),
	NF("link_flaps", F_U64, link_flaps),
	NF("channel_resumes", F_U64, channel_resumes),
	NF("rail_failovers", F_U64, rail_failovers),
	NF("handshakes", F_U32, handshakes),
	NF("dial_window", F_U32, dial_window),
	NF("handshake_ms", F_U64, handshake_ms),
	NF("admission_cuts", F_U64, admission_cuts),
	NF("from_snapshot", F_BOOL, from_snapshot),
	NF("snapshot_age_ms", F_U64, snapshot_age_ms),
	NF("snapshot_replies", F_U64, snapshot_replies),
	NF("queued_replies", F_U64, queued_replies),
	NF("ctl_priority", F_U32, ctl_priority),
	NF("ctl_demotions", F_U64, ctl_demotions),
	NF("ctl_tid", F_U32, ctl_tid),
	NF("numa", F_STR, numa),
	NF("numa_usable", F_BOOL, numa_usable),
	NF("numa_nodes", F_U32, numa_nodes),
	NF("numa_home", F_NODE, numa_home),
	NF("numa_why", F_STR, numa_why),
	NF("config_path", F_STR, config_path),
	NF("config_generation", F_U64, config_generation),
	NF("config_loaded_us", F_WALL_US, config_loaded_us),
	NF("config_reloads", F_U64, config_reloads),
	NF("config_refused", F_U64, config_refused),
	NF("config_error", F_STR, config_error),
	NF("log_level", F_STR, log_level),
	NF("draining", F_BOOL, draining),
	NF("drain_left_ms", F_U64, drain_left_ms),
	NF("channels", F_U32, channels),
	NF("fd_store", F_BOOL, fd_store),
	NF("channels_kept", F_U32, channels_kept),
	NF("predecessor_epoch", F_U64, predecessor_epoch),
};

#define DF(key, table, width, kind, member) {key, table, width, kind, offsetof(NumaDevice, member), false}
static const struct field device_fields[] = {
	DF("name", true, -10, F_STR, name),
	DF("provider", true, -8, F_STR, provider),
	DF("rail", true, 4, F_U32, rail),
	DF("address", true, -16, F_STR, address),
	DF("numa_node", true, 9, F_NODE, numa_node),
	DF("cpus", true, -12, F_STR, cpus),
	DF("netdev", true, -1, F_STR, netdev),
};

#define TF(key, table, width, kind, member) {key, table, width, kind, offsetof(DataPathThread, member), false}
#define TW(key, table, width, kind, member) {key, table, width, kind, offsetof(DataPathThread, member), true}
static const struct field thread_fields[] = {
	TF("name", true, -15, F_STR, name),
	TF("tid", true, 7, F_U32, tid),
	TF("rail", true, 4, F_U32, rail),
	TF("devices", true, -10, F_STR, devices),
	TF("numa_node", true, 9, F_NODE, numa_node),
	TF("cpus", true, -12, F_STR, cpus),
	TF("polling", true, -8, F_STR, polling),
	TW("poll_budget_us", true, 14, F_U32, poll_budget_us),
	TF("fast_events", true, 11, F_U64, fast_events),
	TW("deferred_events", true, 15, F_U64, deferred_events),
	TW("slow_sections", true, 13, F_U64, slow_sections),
	TF("kicks", true, -1, F_U64, kicks),
};

static const char *state_name(int s)
{
	switch (s) {
	case LINK_STATE__LINK_STATE_UP:
		return "UP";
	case LINK_STATE__LINK_STATE_CONNECTING:
		return "CONNECTING";
	default:
		return "DOWN";
	}
}

/* Formats one field as table text (json = false) or as a JSON value. */
static void field_print(struct out *o, const struct field *f, const void *obj, bool table)
{
	const char *p = (const char *)obj + f->off;
	char buf[96];
	const char *s = NULL;
	bool quote = false;

	switch (f->kind) {
	case F_U32:
		snprintf(buf, sizeof(buf), "%" PRIu32, *(const uint32_t *)p);
		break;
	case F_I32:
		snprintf(buf, sizeof(buf), "%" PRId32, *(const int32_t *)p);
		break;
	case F_U64:
		snprintf(buf, sizeof(buf), "%" PRIu64, *(const uint64_t *)p);
		break;
	case F_BOOL:
		snprintf(buf, sizeof(buf), "%s", *(const protobuf_c_boolean *)p ? "true" : "false");
		break;
	case F_DURATION_MS: {
		uint64_t ms = *(const uint64_t *)p, secs = ms / 1000;

		if (!table)
			snprintf(buf, sizeof(buf), "%" PRIu64, ms);
		else if (ms < 1000)
			snprintf(buf, sizeof(buf), "%" PRIu64 "ms", ms);
		else if (secs < 60)
			snprintf(buf, sizeof(buf), "%" PRIu64 ".%" PRIu64 "s", secs, ms % 1000 / 100);
		else if (secs < 3600)
			snprintf(buf, sizeof(buf), "%" PRIu64 "m%02" PRIu64 "s", secs / 60, secs % 60);
		else if (secs < 86400)
			snprintf(buf, sizeof(buf), "%" PRIu64 "h%02" PRIu64 "m", secs / 3600, secs % 3600 / 60);
		else
			snprintf(buf, sizeof(buf), "%" PRIu64 "d%02" PRIu64 "h", secs / 86400, secs % 86400 / 3600);
		break;
	}
	case F_WALL_US: {
		uint64_t us = *(const uint64_t *)p;
		time_t t = (time_t)(us / 1000000);
		struct tm tm;

		if (table && !us)
			s = "-";
		else if (table && gmtime_r(&t, &tm))
			strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
		else
			snprintf(buf, sizeof(buf), "%" PRIu64, us);
		break;
	}
	case F_NODE: {
		int32_t v = *(const int32_t *)p;

		if (table && v < 0)
			s = v == -2 ? "spread" : "-";
		else
			snprintf(buf, sizeof(buf), "%" PRId32, v);
		break;
	}
	case F_STR:
		s = *(char *const *)p ? *(char *const *)p : "";
		quote = true;
		if (table && !*s)
			s = "-";
		break;
	case F_STATE:
		s = state_name(*(const int *)p);
		quote = true;
		break;
	case F_MAILBOX: {
		const MailboxInfo *mb = *(MailboxInfo *const *)p;
		uint64_t addr = mb ? mb->addr : 0;
		uint32_t len = mb ? mb->len : 0, rkey = mb ? mb->rkey : 0;

		if (!table) {
			json_open(o, f->key, '{');
			json_key(o, "addr");
			printf("%" PRIu64, addr);
			json_key(o, "len");
			printf("%" PRIu32, len);
			json_key(o, "rkey");
			printf("%" PRIu32, rkey);
			json_close(o, '}');
			return;
		}
		if (len)
			snprintf(buf, sizeof(buf), "0x%" PRIx64 ":%" PRIu32 ":0x%" PRIx32, addr, len, rkey);
		else
			snprintf(buf, sizeof(buf), "-");
		break;
	}
	}
	if (!s)
		s = buf;
	if (table) {
		printf("%*s", f->width == -1 ? 0 : f->width, s);
		return;
	}
	json_key(o, f->key);
	if (quote)
		json_str(s);
	else
		fputs(s, stdout);
}

/* A column's header: its JSON key in capitals, so that a table and its JSON name a value alike. */
static void print_head(const struct field *f, bool more)
{
	char head[64];
	size_t i;

	for (i = 0; f->key[i] && i + 1 < sizeof(head); i++)
		head[i] = (char)(f->key[i] >= 'a' && f->key[i] <= 'z' ? f->key[i] - 'a' + 'A' : f->key[i]);
	head[i] = '\0';
	printf("%*s%s", f->width == -1 ? 0 : f->width, head, more ? "  " : "");
}

/* A table or a JSON array of objects, from a field table. */
static void print_rows(struct out *o, const char *key, const struct field *fields, size_t nf, void *const *rows,
		       size_t n)
{
	if (o->json) {
		json_open(o, key, '[');
		for (size_t i = 0; i < n; i++) {
			json_open(o, NULL, '{');
			for (size_t f = 0; f < nf; f++)
				field_print(o, &fields[f], rows[i], false);
			json_close(o, '}');
		}
		json_close(o, ']');
		return;
	}
	for (size_t f = 0; f < nf; f++)
		if (fields[f].table && (o->wide || !fields[f].wide))
			print_head(&fields[f], f + 1 < nf);
	putchar('\n');
	for (size_t i = 0; i < n; i++) {
		for (size_t f = 0; f < nf; f++) {
			if (!fields[f].table || (fields[f].wide && !o->wide))
				continue;
			field_print(o, &fields[f], rows[i], true);
			if (f + 1 < nf)
				fputs("  ", stdout);
		}
		putchar('\n');
	}
}

/* A list object: JSON {"node": id, key: [rows]}, or a title line (when meshd named its node) over
 * the table. */
static void print_list(struct out *o, const CtlReply *r, const char *key, const struct field *fields, size_t nf,
		       void *const *rows, size_t n, const char *title)
{
	if (o->json) {
		json_open(o, NULL, '{');
		json_key(o, "node");
		printf("%" PRIu32, r->node ? r->node->id : 0);
		print_rows(o, key, fields, nf, rows, n);
		json_close(o, '}');
		putchar('\n');
		return;
	}
	if (r->node)
		puts(title);
	print_rows(o, NULL, fields, nf, rows, n);
}

/* The rows of one peer (o->peer, meshctl links 2), in place; all of them without. */
static size_t peer_rows(const struct out *o, void **rows, size_t n, bool links)
{
	size_t k = 0;

	if (o->peer < 0)
		return n;
	for (size_t i = 0; i < n; i++) {
		uint32_t peer = links ? ((const LinkInfo *)rows[i])->peer : ((const ChannelInfo *)rows[i])->peer_node;

		if (peer == (uint32_t)o->peer)
			rows[k++] = rows[i];
	}
	return k;
}

static void print_channels(struct out *o, const CtlReply *r)
{
	char title[160];
	size_t n = peer_rows(o, (void **)r->channels, r->n_channels, false);

	snprintf(title, sizeof(title), "node %" PRIu32 " (%s): %zu channel%s%s", r->node ? r->node->id : 0,
		 r->node ? r->node->cluster : "", n, n == 1 ? "" : "s", o->peer >= 0 ? " with that peer" : "");
	print_list(o, r, "channels", channel_fields, ARRAY_SIZE(channel_fields), (void *const *)r->channels, n, title);
}

#define PF(key, table, width, kind, member) {key, table, width, kind, offsetof(PortInfo, member), false}
static const struct field port_fields[] = {
	PF("port", true, 5, F_U32, port),
	PF("owner_uid", true, 9, F_U32, owner_uid),
	PF("owner_pid", true, 9, F_I32, owner_pid),
	PF("channels", true, 8, F_U32, channels),
};

static void print_ports(struct out *o, const CtlReply *r)
{
	char title[160];

	snprintf(title, sizeof(title), "node %" PRIu32 " (%s): %zu listening port%s", r->node ? r->node->id : 0,
		 r->node ? r->node->cluster : "", r->n_ports, r->n_ports == 1 ? "" : "s");
	print_list(o, r, "ports", port_fields, ARRAY_SIZE(port_fields), (void *const *)r->ports, r->n_ports, title);
}

static void print_links(struct out *o, const CtlReply *r)
{
	char title[160];

	snprintf(title, sizeof(title), "node %" PRIu32 " (%s) links: %" PRIu32 " of %" PRIu32 " UP",
		 r->node ? r->node->id : 0, r->node ? r->node->cluster : "", r->node ? r->node->links_up : 0,
		 r->node ? r->node->peers : 0);
	print_list(o, r, "links", link_fields, ARRAY_SIZE(link_fields), (void *const *)r->links,
		   peer_rows(o, (void **)r->links, r->n_links, true), title);
}

static void print_node(struct out *o, const CtlReply *r)
{
	if (!r->node)
		return;
	const NodeInfo *n = r->node;

	if (o->json) {
		json_open(o, NULL, '{');
		for (size_t f = 0; f < ARRAY_SIZE(node_fields); f++)
			field_print(o, &node_fields[f], n, false);
		print_rows(o, "devices", device_fields, ARRAY_SIZE(device_fields), (void *const *)n->devices, n->n_devices);
		print_rows(o, "threads", thread_fields, ARRAY_SIZE(thread_fields), (void *const *)n->threads, n->n_threads);
		json_close(o, '}');
		putchar('\n');
		return;
	}
	for (size_t f = 0; f < ARRAY_SIZE(node_fields); f++) {
		printf("%-14s ", node_fields[f].key);
		field_print(o, &node_fields[f], n, true);
		putchar('\n');
	}
	if (n->n_devices) {
		putchar('\n');
		print_rows(o, NULL, device_fields, ARRAY_SIZE(device_fields), (void *const *)n->devices, n->n_devices);
	}
	if (n->n_threads) {
		putchar('\n');
		print_rows(o, NULL, thread_fields, ARRAY_SIZE(thread_fields), (void *const *)n->threads, n->n_threads);
	}
}

/* ---- talking to meshd ---- */

/* Set while `drain --wait` polls a meshd that is about to go: its absence is the answer, not an error. */
static bool ctl_quiet;

static int ctl_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = REPLY_TIMEOUT_S};
	int fd, ret;

	if (strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "meshctl: socket path %s is too long\n", path);
		return -ENAMETOOLONG;
	}
	util_strlcpy(sa.sun_path, path, sizeof(sa.sun_path));
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa))) {
		char why[320];

		ret = -errno;
		mesh_sock_explain(path, ret, why, sizeof(why));
		if (!ctl_quiet)
			fprintf(stderr, "meshctl: %s%s\n", why,
				ret == -ENOENT || ret == -ECONNREFUSED ? "; -s or $" MESH_SOCKET_ENV " names another socket" : "");
		close(fd);
		return ret;
	}
	/* Never hang on a stuck daemon. */
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	return fd;
}

/* Set by SIGINT and SIGTERM during ping and --watch: stop, say what there is. */
static volatile sig_atomic_t interrupted;

/* One request on a connected socket. */
static int ctl_send(int fd, const char *path, const CtlRequest *req)
{
	uint8_t qbuf[96];
	size_t qlen;

	qlen = ctl_request__pack(req, qbuf);
	/* (meshd may have refused us before we asked, and hung up: its reason is the reply below.) */
	if (send(fd, qbuf, qlen, MSG_NOSIGNAL) != (ssize_t)qlen && errno != EPIPE && errno != ECONNRESET) {
		int ret = -errno;

		fprintf(stderr, "meshctl: send to %s: %s\n", path, strerror(errno));
		return ret;
	}
	return 0;
}

/* One reply (decoded; free with ctl_reply__free_unpacked). -EINTR, unsaid, when interrupted. */
static int ctl_recv(int fd, const char *path, CtlReply **out)
{
	uint8_t *rbuf;
	ssize_t n;
	int ret;

	rbuf = malloc(MESH_CTL_REPLY_MAX);
	if (!rbuf)
		return -ENOMEM;
	n = recv(fd, rbuf, MESH_CTL_REPLY_MAX, MSG_TRUNC);
	ret = -errno;
	if (n < 0 && ret == -EINTR && interrupted) {
		free(rbuf);
		return ret;
	}
	if (n <= 0 || n > (ssize_t)MESH_CTL_REPLY_MAX) {
		if (n == 0 || n > (ssize_t)MESH_CTL_REPLY_MAX)
			ret = -EPROTO;
		fprintf(stderr, "meshctl: no reply from meshd at %s: %s\n", path,
			n == 0 ? "connection closed" : n > 0 ? "reply too large" : strerror(-ret));
		free(rbuf);
		return ret;
	}
	*out = ctl_reply__unpack(NULL, (size_t)n, rbuf);
	free(rbuf);
	if (!*out) {
		fprintf(stderr, "meshctl: undecodable reply from meshd at %s\n", path);
		return -EBADMSG;
	}
	return 0;
}

/* One request on a connected socket, one reply back (decoded; free with ctl_reply__free_unpacked). */
static int ctl_call(int fd, const char *path, const CtlRequest *req, CtlReply **out)
{
	int ret = ctl_send(fd, path, req);

	return ret ? ret : ctl_recv(fd, path, out);
}

/* One listing: every reply (meshd pages lists: CtlReply.total), and a view of the first whose lists
 * are every page's items (arrays of pointers owned here, the items by their pages). */
struct listing {
	CtlReply **pages;
	size_t n_pages;
	CtlReply view;
};

static void listing_free(struct listing *ls)
{
	free(ls->view.links);
	free(ls->view.channels);
	free(ls->view.ports);
	for (size_t i = 0; i < ls->n_pages; i++)
		ctl_reply__free_unpacked(ls->pages[i], NULL);
	free(ls->pages);
	memset(ls, 0, sizeof(*ls));
}

/* Appends n items of a page to the list *all of *len items. */
static int list_append(void ***all, size_t *len, void *const *items, size_t n)
{
	void **a = realloc(*all, (*len + n + 1) * sizeof(*a));

	if (!a)
		return -ENOMEM;
	if (n)
		memcpy(a + *len, items, n * sizeof(*a));
	*all = a;
	*len += n;
	return 0;
}

/* Keeps page r of the listing and adds its items to the view. */
static int listing_add(struct listing *ls, CtlReply *r)
{
	CtlReply **pages = realloc(ls->pages, (ls->n_pages + 1) * sizeof(*pages));
	CtlReply *v = &ls->view;

	if (!pages) {
		ctl_reply__free_unpacked(r, NULL);
		return -ENOMEM;
	}
	ls->pages = pages;
	ls->pages[ls->n_pages++] = r;
	if (ls->n_pages == 1) {
		*v = *r;
		v->n_links = v->n_channels = v->n_ports = 0;
		v->links = NULL;
		v->channels = NULL;
		v->ports = NULL;
	}
	if (list_append((void ***)&v->links, &v->n_links, (void *const *)r->links, r->n_links) ||
	    list_append((void ***)&v->channels, &v->n_channels, (void *const *)r->channels, r->n_channels) ||
	    list_append((void ***)&v->ports, &v->n_ports, (void *const *)r->ports, r->n_ports))
		return -ENOMEM;
	return 0;
}

/* One listing, page after page on one connection until the first reply's total is reached. */
static int request(const char *path, CtlObject obj, bool live, struct listing *ls)
{
	CtlRequest req = CTL_REQUEST__INIT;
	int fd = ctl_connect(path), ret;
	const CtlReply *v = &ls->view;
	CtlReply *r;

	memset(ls, 0, sizeof(*ls));
	if (fd < 0)
		return fd;
	req.version = MESH_CTL_VERSION;
	req.object = obj;
	req.live = live;
	ret = ctl_call(fd, path, &req, &r);
	if (!ret)
		ret = listing_add(ls, r);
	while (!ret && !v->status) {
		size_t got = obj == CTL_OBJECT__CTL_OBJECT_LINKS ? v->n_links
			     : obj == CTL_OBJECT__CTL_OBJECT_CHANNELS ? v->n_channels
			     : obj == CTL_OBJECT__CTL_OBJECT_PORTS ? v->n_ports : 0;

		if (got >= v->total)
			break;
		req.offset = got;
		ret = ctl_call(fd, path, &req, &r);
		if (ret)
			break;
		if (r->status || !(r->n_links + r->n_channels + r->n_ports)) {
			/* The list shrank under us, or meshd refused the page: what we have is the listing. */
			if (r->status)
				fprintf(stderr, "meshctl: meshd: page at %zu: %s\n", got, r->error ? r->error : "error");
			ctl_reply__free_unpacked(r, NULL);
			break;
		}
		ret = listing_add(ls, r);
	}
	close(fd);
	if (ret)
		listing_free(ls);
	return ret;
}

/* meshd's metrics text, page by page on one connection (the pages of one rendering), to stdout
 * as it comes. Returns the exit status: 0, or 2 (meshd cannot be reached, refused or answered
 * wrongly). */
static int print_metrics(const char *path)
{
	CtlRequest req = CTL_REQUEST__INIT;
	uint64_t off = 0, total = 0;
	int fd = ctl_connect(path), status = 0;

	if (fd < 0)
		return 2;
	req.version = MESH_CTL_VERSION;
	req.object = CTL_OBJECT__CTL_OBJECT_METRICS;
	do {
		CtlReply *r = NULL;
		const MetricsPage *p;

		req.offset = off;
		if (ctl_call(fd, path, &req, &r)) {
			status = 2;
			break;
		}
		p = r->metrics;
		if (r->status) {
			fprintf(stderr, "meshctl: meshd: %s (%s)\n", r->error && *r->error ? r->error : "error",
				mesh_strerror(r->status));
			status = 2;
		} else if (!p || p->offset != off || (off && p->total != total) || !p->text.len ||
			   p->text.len > p->total - off) {
			fprintf(stderr, "meshctl: meshd at %s sent a metrics page that does not fit (offset %" PRIu64
				"): is it of another version?\n", path, off);
			status = 2;
		} else {
			total = p->total;
			fwrite(p->text.data, 1, p->text.len, stdout);
			off += p->text.len;
		}
		ctl_reply__free_unpacked(r, NULL);
	} while (!status && off < total);
	close(fd);
	if (!status && fflush(stdout)) {
		fprintf(stderr, "meshctl: writing the metrics: %s\n", strerror(errno));
		status = 2;
	}
	return status;
}

/* One request that changes the node (reload, drain) on a connection of its own: 0 with its reply
 * (free with ctl_reply__free_unpacked), or -1 when meshd cannot be reached or answered wrongly (said). */
static int node_op(const char *path, CtlOp op, uint32_t drain_ms, CtlReply **out)
{
	CtlRequest req = CTL_REQUEST__INIT;
	int fd = ctl_connect(path), ret;

	if (fd < 0)
		return -1;
	req.version = MESH_CTL_VERSION;
	req.object = CTL_OBJECT__CTL_OBJECT_NODE;
	req.op = op;
	req.drain_ms = drain_ms;
	ret = ctl_call(fd, path, &req, out);
	close(fd);
	return ret ? -1 : 0;
}

/* `meshctl reload`: 0 when meshd applied the file, 2 when it refused it (its reason on stderr) or
 * cannot be reached. Prints the configuration in force afterwards either way. */
static int reload(const char *path, struct out *o)
{
	int status = 0;
	CtlReply *r;

	if (node_op(path, CTL_OP__CTL_OP_RELOAD, 0, &r))
		return 2;
	if (r->status) {
		fprintf(stderr, "meshctl: reload refused, nothing was changed: %s\n",
			r->error && *r->error ? r->error : mesh_strerror(r->status));
		status = 2;
	}
	if (r->node && o->json) {
		json_open(o, NULL, '{');
		json_key(o, "reloaded");
		fputs(r->status ? "false" : "true", stdout);
		for (size_t f = 0; f < ARRAY_SIZE(node_fields); f++)
			if (!strncmp(node_fields[f].key, "config_", 7))
				field_print(o, &node_fields[f], r->node, false);
		json_close(o, '}');
		putchar('\n');
	} else if (r->node && !r->status) {
		printf("reloaded %s: generation %" PRIu64 " (%" PRIu64 " reload%s, %" PRIu64 " refused)\n",
		       r->node->config_path, r->node->config_generation, r->node->config_reloads,
		       r->node->config_reloads == 1 ? "" : "s", r->node->config_refused);
	}
	ctl_reply__free_unpacked(r, NULL);
	return status;
}

/* `meshctl drain`: 0 once meshd drains (with wait: once it stopped), 2 when it refused or cannot be
 * reached. */
static int request(const char *path, CtlObject obj, bool live, struct listing *ls);

static int drain(const char *path, struct out *o, uint32_t deadline_ms, bool wait)
{
	int status = 0;
	CtlReply *r;

	if (node_op(path, CTL_OP__CTL_OP_DRAIN, deadline_ms, &r))
		return 2;
	if (r->status || !r->node) {
		fprintf(stderr, "meshctl: drain refused: %s\n",
			r->error && *r->error ? r->error : mesh_strerror(r->status ? r->status : -EPROTO));
		ctl_reply__free_unpacked(r, NULL);
		return 2;
	}
	if (o->json) {
		json_open(o, NULL, '{');
		json_key(o, "draining");
		fputs("true", stdout);
		for (size_t f = 0; f < ARRAY_SIZE(node_fields); f++)
			if (!strcmp(node_fields[f].key, "channels") || !strcmp(node_fields[f].key, "drain_left_ms"))
				field_print(o, &node_fields[f], r->node, false);
		json_close(o, '}');
		putchar('\n');
	} else {
		printf("node %u draining: no new channels; %u channel%s open; meshd stops once none is left, at the latest "
		       "in %" PRIu64 " s\n", r->node->id, r->node->channels, r->node->channels == 1 ? "" : "s",
		       (r->node->drain_left_ms + 999) / 1000);
	}
	ctl_reply__free_unpacked(r, NULL);
	fflush(stdout);
	/* Until the control socket is gone: meshd stopped. */
	while (wait && !status) {
		struct listing ls;
		uint32_t left;

		sleep(1);
		ctl_quiet = true;
		if (request(path, CTL_OBJECT__CTL_OBJECT_NODE, false, &ls)) {
			if (!o->json)
				printf("meshd stopped\n");
			break;
		}
		left = ls.view.node ? ls.view.node->channels : 0;
		listing_free(&ls);
		if (!o->json)
			printf("%u channel%s left\n", left, left == 1 ? "" : "s");
		fflush(stdout);
	}
	return status;
}

/* ---- ping ---- */

static void on_interrupt(int sig)
{
	(void)sig;
	interrupted = 1;
}

/* SIGINT and SIGTERM end a ping or a watch (their blocking calls return EINTR), not the process. */
static void catch_interrupts(void)
{
	struct sigaction sa = {.sa_handler = on_interrupt}; /* no SA_RESTART */

	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

struct ping_args {
	uint32_t node, count, interval_ms, timeout_ms;
	int rail; /* -1: every UP rail */
};

/* Per rail, as ping(8) sums them up. */
struct ping_stats {
	uint32_t sent, received;
	uint64_t min_us, max_us;
	double sum_us, sum2_us;
};

static void ping_summary(struct out *o, uint32_t rail, const struct ping_stats *s)
{
	double avg = s->received ? s->sum_us / s->received : 0;
	double var = s->received ? s->sum2_us / s->received - avg * avg : 0;
	double mdev = var > 0 ? sqrt(var) : 0;
	double loss = s->sent ? 100.0 * (s->sent - s->received) / s->sent : 0;

	if (o->json) {
		json_open(o, NULL, '{');
		json_key(o, "rail");
		printf("%" PRIu32, rail);
		json_key(o, "sent");
		printf("%" PRIu32, s->sent);
		json_key(o, "received");
		printf("%" PRIu32, s->received);
		json_key(o, "loss_pct");
		printf("%.1f", loss);
		json_key(o, "min_us");
		printf("%" PRIu64, s->received ? s->min_us : 0);
		json_key(o, "avg_us");
		printf("%.1f", avg);
		json_key(o, "max_us");
		printf("%" PRIu64, s->max_us);
		json_key(o, "mdev_us");
		printf("%.1f", mdev);
		json_close(o, '}');
		return;
	}
	printf("rail %" PRIu32 ": %" PRIu32 " probe%s sent, %" PRIu32 " received, %.0f%% loss", rail, s->sent,
	       s->sent == 1 ? "" : "s", s->received, loss);
	if (s->received)
		printf(", rtt min/avg/max/mdev = %.3f/%.3f/%.3f/%.3f ms", (s->received ? s->min_us : 0) / 1000.0,
		       avg / 1000.0, s->max_us / 1000.0, mdev / 1000.0);
	putchar('\n');
}

/* One answer of the stream: a line of text, or a member of the JSON "replies" array. */
static void ping_line(struct out *o, uint32_t node, const PingReply *p)
{
	if (o->json) {
		json_open(o, NULL, '{');
		json_key(o, "rail");
		printf("%" PRIu32, p->rail);
		json_key(o, "seq");
		printf("%" PRIu32, p->seq);
		json_key(o, "status");
		printf("%" PRId32, p->status);
		json_key(o, "rtt_us");
		printf("%" PRIu64, p->status ? 0 : p->rtt_us);
		json_key(o, "error");
		json_str(p->status ? (p->error && *p->error ? p->error : mesh_strerror(p->status)) : "");
		json_close(o, '}');
		return;
	}
	if (!p->status)
		printf("reply from node %" PRIu32 ": rail=%" PRIu32 " seq=%" PRIu32 " time=%.3f ms\n", node, p->rail, p->seq,
		       p->rtt_us / 1000.0);
	else
		printf("no reply from node %" PRIu32 ": rail=%" PRIu32 " seq=%" PRIu32 ": %s\n", node, p->rail, p->seq,
		       p->error && *p->error ? p->error : mesh_strerror(p->status));
	fflush(stdout);
}

/* `meshctl ping NODE`: meshd probes each rail of the link (CTL_OP_PING) and streams the answers.
 * Returns 0 when an answer came, 1 when none did (or meshd refused: the node is unknown, its link
 * DOWN), 2 when meshd cannot be reached or broke off. */
static int ping(const char *path, struct out *o, const struct ping_args *pa)
{
	CtlRequest req = CTL_REQUEST__INIT;
	struct ping_stats st[MESH_RAILS_MAX] = {{0}};
	uint32_t rails = 0, received = 0;
	struct timeval tv;
	int fd, status = 0, ret;
	bool done = false;
	CtlReply *r;

	fd = ctl_connect(path);
	if (fd < 0)
		return 2;
	/* An answer comes at least every interval (a probe's, or its timeout's) */
	tv.tv_sec = (pa->interval_ms + pa->timeout_ms) / 1000 + REPLY_TIMEOUT_S;
	tv.tv_usec = 0;
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	catch_interrupts();
	req.version = MESH_CTL_VERSION;
	req.op = CTL_OP__CTL_OP_PING;
	req.node = pa->node;
	req.count = pa->count;
	req.interval_ms = pa->interval_ms;
	req.timeout_ms = pa->timeout_ms;
	req.has_rail = pa->rail >= 0;
	req.rail = pa->rail >= 0 ? (uint32_t)pa->rail : 0;
	ret = ctl_call(fd, path, &req, &r);
	if (ret) {
		close(fd);
		return ret == -EINTR ? 1 : 2;
	}
	if (r->status || !r->ping) {
		/* An older meshd's decoder knows no CTL_OP_PING: "unknown op". */
		bool old = !r->status || (r->status == -EPROTO && r->error && !strcmp(r->error, "unknown op"));

		fprintf(stderr, "meshctl: ping node %" PRIu32 ": %s\n", pa->node,
			old ? "the meshd at this socket does not know ping (an older version: upgrade it)"
			    : r->error && *r->error ? r->error : mesh_strerror(r->status));
		ctl_reply__free_unpacked(r, NULL);
		close(fd);
		return 1;
	}
	rails = r->ping->rails;
	if (o->json) {
		json_open(o, NULL, '{');
		json_key(o, "node");
		printf("%" PRIu32, r->node ? r->node->id : 0);
		json_key(o, "peer");
		printf("%" PRIu32, pa->node);
		json_key(o, "peer_addr");
		json_str(r->ping->peer_addr ? r->ping->peer_addr : "");
		json_key(o, "transport");
		json_str(r->ping->transport ? r->ping->transport : "");
		json_open(o, "replies", '[');
	} else {
		uint32_t n = (uint32_t)__builtin_popcount(rails);

		printf("PING node %" PRIu32 " (%s, %s): %s", pa->node, r->ping->peer_addr, r->ping->transport,
		       n == 1 ? "rail" : "rails");
		for (uint32_t k = 0; k < MESH_RAILS_MAX; k++)
			if (rails & (1u << k))
				printf(" %" PRIu32, k);
		printf(", %" PRIu32 " probe%s each, every %.3f s\n", pa->count, pa->count == 1 ? "" : "s",
		       pa->interval_ms / 1000.0);
		fflush(stdout);
	}
	ctl_reply__free_unpacked(r, NULL);
	while (!done && !interrupted) {
		const PingReply *p;

		ret = ctl_recv(fd, path, &r);
		if (ret) {
			status = ret == -EINTR ? 0 : 2;
			break;
		}
		p = r->ping;
		if (r->status || !p) {
			fprintf(stderr, "meshctl: ping node %" PRIu32 ": %s\n", pa->node,
				r->error && *r->error ? r->error : "meshd answered without a ping");
			status = 2;
		} else if (p->done) {
			done = true;
		} else if (p->rail < MESH_RAILS_MAX && (rails & (1u << p->rail))) {
			struct ping_stats *s = &st[p->rail];

			s->sent++;
			if (!p->status) {
				if (!s->received++ || p->rtt_us < s->min_us)
					s->min_us = p->rtt_us;
				s->max_us = p->rtt_us > s->max_us ? p->rtt_us : s->max_us;
				s->sum_us += (double)p->rtt_us;
				s->sum2_us += (double)p->rtt_us * (double)p->rtt_us;
				received++;
			}
			ping_line(o, pa->node, p);
		}
		ctl_reply__free_unpacked(r, NULL);
		if (status)
			break;
	}
	close(fd); /* interrupted: meshd stops the ping */
	if (o->json) {
		json_close(o, ']');
		json_open(o, "rails", '[');
	} else {
		printf("--- node %" PRIu32 " ping statistics ---\n", pa->node);
	}
	for (uint32_t k = 0; k < MESH_RAILS_MAX; k++)
		if (rails & (1u << k))
			ping_summary(o, k, &st[k]);
	if (o->json) {
		json_close(o, ']');
		json_close(o, '}');
		putchar('\n');
	}
	fflush(stdout);
	return status ? status : received ? 0 : 1;
}

/* ---- show, once or every few seconds ---- */

struct object {
	const char *name;
	CtlObject obj;
	void (*print)(struct out *, const CtlReply *);
};

/* One look at an object: 0, or 2 when meshd cannot be reached or refused (said). */
static int show(const char *path, struct out *o, const struct object *ob, bool live)
{
	struct listing ls;
	CtlReply *r;

	if (request(path, ob->obj, live, &ls))
		return 2;
	r = &ls.view;
	if (r->status) {
		fprintf(stderr, "meshctl: meshd: %s (%s)\n", r->error && *r->error ? r->error : "error",
			mesh_strerror(r->status));
		listing_free(&ls);
		return 2;
	}
	/* meshd answered from what its data path last published (admin.h): say how old it is. */
	if (r->node && r->node->from_snapshot)
		fprintf(stderr, "meshctl: meshd's data path is busy (link work): its state of %" PRIu64 " ms ago\n",
			r->node->snapshot_age_ms);
	o->first = true;
	o->depth = 0;
	ob->print(o, r);
	listing_free(&ls);
	return 0;
}

/* `meshctl -w SEC OBJECT`: as watch(1), the object again every SEC seconds until interrupted (exit 0),
 * under a header with the time; the screen cleared first on a terminal, one look after the other
 * otherwise (a log); with -j one JSON document per look, no header. meshd unreachable for a while
 * is said on stderr and looked at again. */
static int watch(const char *path, struct out *o, const struct object *ob, bool live, uint32_t every_ms,
		 const char *what)
{
	bool tty = isatty(STDOUT_FILENO);

	catch_interrupts();
	while (!interrupted) {
		struct timespec ts = {.tv_sec = every_ms / 1000, .tv_nsec = (long)(every_ms % 1000) * 1000000L};
		char when[32];
		time_t now = time(NULL);
		struct tm tm;

		if (tty && !o->json)
			fputs("\033[H\033[2J", stdout);
		if (!o->json) {
			strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S%z", localtime_r(&now, &tm) ? &tm : gmtime_r(&now, &tm));
			printf("Every %.1fs: meshctl %s    %s\n\n", every_ms / 1000.0, what, when);
		}
		show(path, o, ob, live);
		if (!tty && !o->json)
			putchar('\n');
		fflush(stdout);
		while (!interrupted && nanosleep(&ts, &ts) && errno == EINTR)
			;
	}
	return 0;
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
	int c, ret;

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
		return ping(sock, &o, &pa);
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
		return print_metrics(sock);
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
		return drain(sock, &o, (uint32_t)deadline_s * 1000, wait);
	}
	if (optind < argc && !strcmp(argv[optind], "reload")) {
		if (optind + 1 < argc) {
			fprintf(stderr, "meshctl: unexpected argument '%s'\n", argv[optind + 1]);
			return 1;
		}
		return reload(sock, &o);
	}
	if (optind < argc && !strcmp(argv[optind], "keygen")) {
		/* A fresh cluster key (getrandom) in cluster.key_file's format; needs no meshd. */
		char key[AUTH_KEY_B64_LEN + 1];

		if (optind + 1 < argc) {
			fprintf(stderr, "meshctl: unexpected argument '%s'\n", argv[optind + 1]);
			return 1;
		}
		ret = auth_keygen(key, sizeof(key));
		if (ret) {
			fprintf(stderr, "meshctl: keygen: %s\n", mesh_strerror(ret));
			return 2;
		}
		if (o.json) {
			json_open(&o, NULL, '{');
			json_key(&o, "key");
			json_str(key);
			json_close(&o, '}');
			putchar('\n');
		} else {
			printf("%s\n", key);
		}
		explicit_bzero(key, sizeof(key));
		return 0;
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
		return watch(sock, &o, &objects[obj], live, watch_ms, what);
	}
	return show(sock, &o, &objects[obj], live);
}
