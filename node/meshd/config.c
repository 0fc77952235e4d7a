#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <libconfig.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <mesh/mesh.h>

#include "config.h"
#include "log.h"
#include "util.h"
#include "wire.h"

enum config_type {
	CFG_UINT,
	CFG_BYTES, /* 64-bit bytes: an integer, or a string with a suffix ("16G") */
	CFG_STRING,
	CFG_NUMA, /* "auto", "off" or a node number (an integer, or a string of digits) */
	CFG_LISTEN, /* "" (off), or "ADDR:PORT", "[V6ADDR]:PORT", ":PORT" (127.0.0.1; config_listen_parse) */
};

struct config_key {
	const char *name; /* member of the cluster group */
	enum config_type type;
	size_t offset;
	size_t size; /* string buffer size */
	const char *def;
	uint64_t min, max;
	const char *const *choices; /* strings: allowed values, NULL-terminated; NULL = any */
	const char *help;
};

static const char *const transport_choices[] = {"rdma", "tcp", "auto", NULL};
static const char *const log_choices[] = {"error", "warn", "info", "debug", NULL};
static const char *const polling_choices[] = {"adaptive", "busy", "event", NULL};
static const char *const onoff_choices[] = {"on", "off", NULL};

#define KEY_UINT(n, def, lo, hi, help) \
	{#n, CFG_UINT, offsetof(struct mesh_config, n), 0, def, lo, hi, NULL, help}
#define KEY_BYTES(n, def, lo, hi, help) \
	{#n, CFG_BYTES, offsetof(struct mesh_config, n), 0, def, lo, hi, NULL, help}
#define KEY_STR(n, field, def, choices, help) \
	{#n, CFG_STRING, offsetof(struct mesh_config, field), sizeof(((struct mesh_config *)0)->field), def, 0, 0, choices, help}

static const struct config_key config_keys[] = {
	KEY_STR(name, cluster_name, NULL, NULL,
		"cluster name (required); peers with another name are rejected"),
	KEY_STR(transport, transport, "rdma", transport_choices,
		"rdma (rdma_cm + verbs), tcp (TCP sockets), or auto: rdma when an RDMA device serves the node's address, "
		"then tcp as well for peers without RDMA"),
	KEY_UINT(qps_per_link, "2", 1, MESH_QPS_PER_LINK_MAX,
		 "RC queue pairs per link; both ends must agree"),
	KEY_UINT(keepalive_interval_ms, "1000", 10, 600000,
		 "interval between keepalives on an UP link"),
	KEY_UINT(keepalive_timeout_ms, "5000", 50, 3600000,
		 "a link with no message from the peer for this long goes DOWN"),
	KEY_UINT(connect_timeout_ms, "5000", 100, 600000,
		 "rdma_cm address and route resolution timeout (>= 2000 under emulation)"),
	KEY_UINT(handshake_timeout_ms, "15000", 100, 600000,
		 "a link attempt not UP within this time is abandoned and retried (a lost rail's rejoin: 1 s at "
		 "first, doubled per failure up to this)"),
	KEY_UINT(resume_timeout_ms, "30000", 0, 3600000,
		 "open channels of a link that goes DOWN wait this long for it to come back UP to the same peer "
		 "meshd, then resume where they stood (nothing lost); 0: they break at once (-ECONNRESET)"),
	KEY_UINT(backoff_initial_ms, "100", 1, 600000,
		 "first re-dial delay after a failed attempt; doubles per failure, jittered"),
	KEY_UINT(backoff_max_ms, "5000", 1, 3600000, "upper bound of the re-dial delay"),
	KEY_UINT(max_handshakes, "8", 1, 65535,
		 "link handshakes in flight at once (dialled + accepted); our dials are admitted below it by an "
		 "adaptive window (starts at 4, grows as attempts come UP, halves when they time out or peers "
		 "are busy), so a large cluster does not storm itself"),
	KEY_UINT(mailbox_size, "4096", MESH_MAILBOX_CFG_MIN, 1u << 20,
		 "bytes of the registered per-link mailbox the peer may write and read"),
	KEY_UINT(max_channels_per_link, "1024", 1, MESH_CHANNEL_SLOTS,
		 "channels a peer may have opened to this node at once; one more is refused (ChannelReject -EBUSY); "
		 "one local user other than root may hold at most half of it with one peer (-EDQUOT)"),
	KEY_UINT(max_ring_mib_per_link, "4096", 1, 1u << 20,
		 "MiB of ring memory (both directions, pinned) the channels a peer opened may take at once; a "
		 "channel beyond it is refused (ChannelReject -EBUSY); one local user other than root may hold at "
		 "most half of it with one peer (-EDQUOT)"),
	KEY_UINT(max_channels_per_uid, "4096", 1, 1u << 20,
		 "channels one local user (uid) may hold at once, opened or accepted; one more is refused "
		 "(-EDQUOT)"),
	KEY_BYTES(max_ring_bytes_per_uid, "16G", 1ull << 20, 1ull << 50,
		"bytes of ring memory (both directions, pinned) the channels of one local user (uid) may take at "
		"once; a channel beyond it is refused (-EDQUOT)"),
	KEY_STR(socket_group, socket_group, "rdmamesh", NULL,
		"group that may use the control socket (mode 0660): applications run in it; when the group does "
		"not exist, or for \"\", only meshd's user may (mode 0600)"),
	KEY_STR(polling, polling, "adaptive", polling_choices,
		"how meshd's data-path thread waits: event (sleeps in epoll, a wake-up per event, no CPU when "
		"idle), busy (polls completion queues and rings without end: lowest latency, one CPU always "
		"busy), adaptive (polls for poll_budget_us after channel data last moved, then sleeps)"),
	KEY_UINT(poll_budget_us, "200", 0, 1000000,
		 "adaptive polling: microseconds meshd keeps polling after channel data last moved (a keepalive, "
		 "the tick or a control message does not count) before it sleeps"),
	KEY_UINT(app_spin_us, "50", 0, 1000000,
		 "hint to libmesh: microseconds a blocking channel call polls its ring before it sleeps "
		 "(MESH_SPIN_US in the application's environment overrides it)"),
	KEY_UINT(control_priority, "1", 0, 99,
		 "SCHED_FIFO priority of meshd's control-socket thread, so that meshctl is answered at once "
		 "while the data path and handshakes keep every CPU busy; 0: normal scheduling. Needs "
		 "CAP_SYS_NICE or RLIMIT_RTPRIO at least this (LimitRTPRIO= in systemd), else a warning and "
		 "normal scheduling. Over 20 ms of CPU in 100 ms (a flood of requests) the thread runs at "
		 "normal scheduling until that window ends"),
	KEY_STR(direct_receive, direct_receive, "on", onoff_choices,
		"on: peers write a channel's arrival position straight into the application's ring page after "
		"the data (one small RDMA WRITE), so a polling application sees bytes without waiting for this "
		"meshd; off: only this meshd tells it (the peer is given no key for the page)"),
	KEY_STR(app_send, app_send, "on", onoff_choices,
		"on: over rdma, an application whose libmesh asks for it posts its channels' writes itself, on "
		"a QP of its own connected to the peer application's (both meshd must have it on), so that no "
		"meshd stands between a message and the wire; off: this meshd posts every write"),
	{"numa", CFG_NUMA, offsetof(struct mesh_config, numa), sizeof(((struct mesh_config *)0)->numa), "auto", 0,
	 CONFIG_NUMA_NODE_MAX, NULL,
	 "where the data-path thread runs and channel rings and registered memory live: auto (the RDMA "
	 "device's NUMA node, or the netdev's for tcp; unplaced when it has none), off (never placed), or a "
	 "node number (a node this machine lacks leaves meshd unplaced, with a warning)"},
	KEY_STR(key_file, key_file, "", NULL,
		"file with the cluster's secret key (`meshctl keygen` prints one; a second line is the next key "
		"of a rotation); relative to this file; mode 600 or stricter. Links prove it both ways before "
		"anything is given; without it any host that reaches the port can join"),
	{"metrics_listen", CFG_LISTEN, offsetof(struct mesh_config, metrics_listen),
	 sizeof(((struct mesh_config *)0)->metrics_listen), "", 0, 0, NULL,
	 "serve Prometheus metrics over HTTP at /metrics on this address and port (\"127.0.0.1:9464\", "
	 "\"[::1]:9464\"; \":9464\" is 127.0.0.1 only; every address must be named: \"0.0.0.0:9464\", or "
	 "\"[::]:9464\" for IPv6 and IPv4; no TLS, no authentication); \"\" serves none. A node entry may have "
	 "its own (several meshd on one host need one port each). `meshctl metrics` prints the same text either way"},
	KEY_STR(log_level, log_level, "info", log_choices, "error | warn | info | debug"),
};

struct node_key {
	const char *name;
	uint32_t min, max;
	const char *help;
};

static const struct node_key node_keys[] = {
	{"id", 0, MESH_NODE_ID_MAX, "node id, unique in the cluster (required)"},
	{"addr", 0, 0, "numeric IPv4/IPv6 address the node listens on (required)"},
	{"port", 1, 65535, "rdma_cm port the node listens on (required)"},
	{"numa", 0, 0, "optional: this node's own cluster.numa (machines differ), auto | off | a node number"},
	{"rails", 0, 0, "optional: more addresses of the node, one per further RDMA device (multi-rail); "
			"every node lists as many, rail r of each node on the same network"},
	{"metrics_listen", 0, 0,
	 "optional: this node's own cluster.metrics_listen, [ADDR]:PORT (no ADDR: 127.0.0.1), \"\" for none"},
};

/* Keys a reload cannot change in a running meshd (config_reload_check): what the transports, the
 * control socket and the data-path threads were set up with, and what both ends of every link
 * agreed on at its Hello. Every other key applies at a reload (docs/design.md, "Reload"). */
static const char *const restart_keys[] = {
	"name", "transport", "qps_per_link", "keepalive_timeout_ms", "connect_timeout_ms", "mailbox_size",
	"socket_group", "polling", "poll_budget_us", "control_priority", "direct_receive", "app_send", "numa",
};

static bool key_needs_restart(const char *name)
{
	for (size_t i = 0; i < ARRAY_SIZE(restart_keys); i++)
		if (!strcmp(restart_keys[i], name))
			return true;
	return false;
}

/* A key's choices joined by sep ("rdma|tcp|auto"), as much as fits in out. */
static void choices_join(const char *const *choices, const char *sep, char *out, size_t len)
{
	out[0] = '\0';
	for (const char *const *c = choices; *c; c++) {
		strncat(out, *c, len - strlen(out) - 1);
		if (c[1])
			strncat(out, sep, len - strlen(out) - 1);
	}
}

static int config_fail(char *err, size_t errlen, const char *path, int line, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

static int config_fail(char *err, size_t errlen, const char *path, int line, const char *fmt, ...)
{
	va_list ap;
	int n = line > 0 ? snprintf(err, errlen, "%s:%d: ", path, line) : snprintf(err, errlen, "%s: ", path);

	if (n >= 0 && (size_t)n < errlen) {
		va_start(ap, fmt);
		vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
		va_end(ap);
	}
	return -MESH_ECONFIG;
}

static int setting_line(const config_setting_t *s)
{
	return s ? (int)config_setting_source_line(s) : 0;
}

static int config_set_uint(struct mesh_config *cfg, const struct config_key *k, long long v,
			   const char *path, int line, char *err, size_t errlen)
{
	if (v < 0 || (uint64_t)v < k->min || (uint64_t)v > k->max)
		return config_fail(err, errlen, path, line, "cluster.%s %lld out of range %llu..%llu", k->name, v,
				   (unsigned long long)k->min, (unsigned long long)k->max);
	if (k->type == CFG_BYTES)
		*(uint64_t *)((char *)cfg + k->offset) = (uint64_t)v;
	else
		*(uint32_t *)((char *)cfg + k->offset) = (uint32_t)v;
	return 0;
}

static int config_set_str(struct mesh_config *cfg, const struct config_key *k, const char *v,
			  const char *path, int line, char *err, size_t errlen)
{
	char *dst = (char *)cfg + k->offset;

	if (strlen(v) >= k->size)
		return config_fail(err, errlen, path, line, "cluster.%s is longer than %zu characters", k->name,
				   k->size - 1);
	if (k->choices) {
		const char *const *c;

		for (c = k->choices; *c && strcmp(*c, v); c++)
			;
		if (!*c) {
			char list[128];

			choices_join(k->choices, " | ", list, sizeof(list));
			return config_fail(err, errlen, path, line, "cluster.%s \"%s\" is not one of %s", k->name, v,
					   list);
		}
	}
	util_strlcpy(dst, v, k->size);
	return 0;
}

/* "auto", "off" or a node number 0..CONFIG_NUMA_NODE_MAX into text (normalized) and *mode. */
static int numa_parse(const char *v, char *text, size_t len, int *mode, const char *key, const char *path, int line,
		      char *err, size_t errlen)
{
	char *end;
	long n;

	if (!strcmp(v, "auto") || !strcmp(v, "off")) {
		*mode = v[0] == 'a' ? CONFIG_NUMA_AUTO : CONFIG_NUMA_OFF;
		util_strlcpy(text, v, len);
		return 0;
	}
	errno = 0;
	n = strtol(v, &end, 10);
	if (!*v || *end || errno || n < 0 || n > CONFIG_NUMA_NODE_MAX || !isdigit((unsigned char)v[0]))
		return config_fail(err, errlen, path, line, "%s \"%s\" is not auto, off or a node number 0..%d", key, v,
				   CONFIG_NUMA_NODE_MAX);
	*mode = (int)n;
	snprintf(text, len, "%ld", n);
	return 0;
}

/* A numa setting: a string, or an integer (numa = 1;). */
static int numa_setting(const config_setting_t *s, char *text, size_t len, int *mode, const char *key, const char *path,
			char *err, size_t errlen)
{
	int t = config_setting_type(s), line = s ? (int)config_setting_source_line(s) : 0;
	char num[24];

	if (t == CONFIG_TYPE_INT || t == CONFIG_TYPE_INT64) {
		snprintf(num, sizeof(num), "%lld", config_setting_get_int64(s));
		return numa_parse(num, text, len, mode, key, path, line, err, errlen);
	}
	if (t == CONFIG_TYPE_STRING)
		return numa_parse(config_setting_get_string(s), text, len, mode, key, path, line, err, errlen);
	return config_fail(err, errlen, path, line, "%s must be \"auto\", \"off\" or a node number", key);
}

int config_listen_parse(const char *v, struct sockaddr_storage *ss, socklen_t *len, const char **why)
{
	char host[CONFIG_LISTEN_MAX];
	const char *colon = strrchr(v, ':'), *hs = v, *he;
	char *end;
	unsigned long port;

	memset(ss, 0, sizeof(*ss));
	if (!colon) {
		*why = "is not ADDR:PORT, [IPV6]:PORT or :PORT";
		return -EINVAL;
	}
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (!isdigit((unsigned char)colon[1]) || *end || errno || port < 1 || port > 65535) {
		*why = "has no port 1..65535 after its last ':'";
		return -EINVAL;
	}
	he = colon;
	if (*hs == '[') {
		if (he - hs < 2 || he[-1] != ']') {
			*why = "opens '[' without closing it right before the port";
			return -EINVAL;
		}
		hs++;
		he--;
	}
	if ((size_t)(he - hs) >= sizeof(host)) {
		*why = "has an address that is too long";
		return -EINVAL;
	}
	memcpy(host, hs, (size_t)(he - hs));
	host[he - hs] = '\0';
	/* ":PORT" is loopback only: it served every address, unauthenticated, to whoever reached the
	 * host (issue 38). Every address takes saying so: "0.0.0.0:PORT" or "[::]:PORT". */
	if (!host[0] && hs == v) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;

		s4->sin_family = AF_INET;
		s4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		s4->sin_port = htons((uint16_t)port);
		*len = sizeof(*s4);
		return 0;
	}
	if (hs == v && inet_pton(AF_INET, host, &((struct sockaddr_in *)ss)->sin_addr) == 1) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;

		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
		*len = sizeof(*s4);
		return 0;
	}
	if (hs != v && inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)ss)->sin6_addr) == 1) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
		*len = sizeof(*s6);
		return 0;
	}
	*why = hs == v && strchr(host, ':') ? "has an IPv6 address without [brackets]"
					     : "has no numeric IPv4 address or [IPv6] address before the port";
	return -EINVAL;
}

/* A listen value of key `key`: "" or a valid address and port, copied to out. */
static int listen_setting(const config_setting_t *s, char *out, size_t len, const char *key, const char *path,
			  char *err, size_t errlen)
{
	int line = setting_line(s);
	const char *v, *why;
	struct sockaddr_storage ss;
	socklen_t sl;

	if (config_setting_type(s) != CONFIG_TYPE_STRING)
		return config_fail(err, errlen, path, line, "%s must be a string \"ADDR:PORT\" (or \"\": none)", key);
	v = config_setting_get_string(s);
	if (strlen(v) >= len)
		return config_fail(err, errlen, path, line, "%s is longer than %zu characters", key, len - 1);
	if (v[0] && config_listen_parse(v, &ss, &sl, &why))
		return config_fail(err, errlen, path, line, "%s \"%s\" %s", key, v, why);
	util_strlcpy(out, v, len);
	return 0;
}

const char *config_node_metrics_listen(const struct mesh_config *cfg, const struct config_node *node)
{
	return node && node->has_metrics_listen ? node->metrics_listen : cfg->metrics_listen;
}

int config_node_numa(const struct mesh_config *cfg, const struct config_node *node)
{
	return node && node->numa[0] ? node->numa_mode : cfg->numa_mode;
}

static int config_defaults(struct mesh_config *cfg)
{
	for (size_t i = 0; i < ARRAY_SIZE(config_keys); i++) {
		const struct config_key *k = &config_keys[i];

		if (!k->def)
			continue;
		if (k->type == CFG_UINT)
			*(uint32_t *)((char *)cfg + k->offset) = (uint32_t)strtoul(k->def, NULL, 10);
		else if (k->type == CFG_BYTES)
			util_parse_bytes(k->def, (uint64_t *)((char *)cfg + k->offset));
		else if (k->type == CFG_NUMA)
			numa_parse(k->def, cfg->numa, sizeof(cfg->numa), &cfg->numa_mode, k->name, "", 0, NULL, 0);
		else
			util_strlcpy((char *)cfg + k->offset, k->def, k->size);
	}
	return 0;
}

static int config_read_cluster(struct mesh_config *cfg, config_setting_t *grp, const char *path,
			       char *err, size_t errlen)
{
	int n = config_setting_length(grp);

	if (!config_setting_is_group(grp))
		return config_fail(err, errlen, path, setting_line(grp), "cluster must be a group { ... }");
	for (int i = 0; i < n; i++) {
		config_setting_t *s = config_setting_get_elem(grp, (unsigned)i);
		const char *name = config_setting_name(s);
		const struct config_key *k = NULL;
		int line = setting_line(s), ret;

		for (size_t j = 0; j < ARRAY_SIZE(config_keys); j++)
			if (!strcmp(config_keys[j].name, name))
				k = &config_keys[j];
		if (!k)
			return config_fail(err, errlen, path, line,
					   "unknown key cluster.%s (meshd --dump-config lists the keys)", name);
		if (k->type == CFG_BYTES && config_setting_type(s) == CONFIG_TYPE_STRING) {
			uint64_t v;

			if (util_parse_bytes(config_setting_get_string(s), &v) || v > INT64_MAX)
				return config_fail(err, errlen, path, line,
						   "cluster.%s \"%s\" is not a size (digits with an optional K, M, G or T)",
						   name, config_setting_get_string(s));
			ret = config_set_uint(cfg, k, (long long)v, path, line, err, errlen);
		} else if (k->type == CFG_UINT || k->type == CFG_BYTES) {
			int t = config_setting_type(s);

			if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64)
				return config_fail(err, errlen, path, line, "cluster.%s must be an integer%s", name,
						   k->type == CFG_BYTES ? " or a size string (\"16G\")" : "");
			/* libconfig reads a number beyond 32 bits without the L suffix as 0. */
			if (t == CONFIG_TYPE_INT && k->type == CFG_BYTES && !config_setting_get_int64(s))
				return config_fail(err, errlen, path, line,
						   "cluster.%s is 0 or too large for a plain integer: write a size string "
						   "(\"16G\") or add the L suffix (17179869184L)", name);
			ret = config_set_uint(cfg, k, config_setting_get_int64(s), path, line, err, errlen);
		} else if (k->type == CFG_NUMA) {
			ret = numa_setting(s, cfg->numa, sizeof(cfg->numa), &cfg->numa_mode, "cluster.numa", path, err,
					   errlen);
		} else if (k->type == CFG_LISTEN) {
			ret = listen_setting(s, (char *)cfg + k->offset, k->size, "cluster.metrics_listen", path, err, errlen);
		} else {
			if (config_setting_type(s) != CONFIG_TYPE_STRING)
				return config_fail(err, errlen, path, line, "cluster.%s must be a string", name);
			ret = config_set_str(cfg, k, config_setting_get_string(s), path, line, err, errlen);
		}
		if (ret)
			return ret;
	}
	if (!cfg->cluster_name[0])
		return config_fail(err, errlen, path, setting_line(grp), "cluster.name is required");
	if (cfg->keepalive_timeout_ms <= cfg->keepalive_interval_ms)
		return config_fail(err, errlen, path, setting_line(grp),
				   "cluster.keepalive_timeout_ms (%u) must exceed keepalive_interval_ms (%u)",
				   cfg->keepalive_timeout_ms, cfg->keepalive_interval_ms);
	if (cfg->backoff_max_ms < cfg->backoff_initial_ms)
		return config_fail(err, errlen, path, setting_line(grp),
				   "cluster.backoff_max_ms (%u) is below backoff_initial_ms (%u)", cfg->backoff_max_ms,
				   cfg->backoff_initial_ms);
	return 0;
}

static int node_cmp(const void *a, const void *b)
{
	const struct config_node *x = a, *y = b;

	return (int)x->id - (int)y->id;
}

/* Same address, however it is written ("fe80::2" and "FE80:0::2" are one address). */
static bool addr_equal(const char *a, const char *b)
{
	unsigned char x[16], y[16];

	if (inet_pton(AF_INET, a, x) == 1)
		return inet_pton(AF_INET, b, y) == 1 && !memcmp(x, y, 4);
	if (inet_pton(AF_INET6, a, x) == 1)
		return inet_pton(AF_INET6, b, y) == 1 && !memcmp(x, y, 16);
	return !strcmp(a, b);
}

/* A numeric address that fits: copied to out. */
static bool addr_valid(const char *a, char out[CONFIG_ADDR_MAX])
{
	unsigned char tmp[16];

	if (!a || strlen(a) >= CONFIG_ADDR_MAX || (inet_pton(AF_INET, a, tmp) != 1 && inet_pton(AF_INET6, a, tmp) != 1))
		return false;
	util_strlcpy(out, a, CONFIG_ADDR_MAX);
	return true;
}

static int config_read_node(struct config_node *node, config_setting_t *grp, const char *path,
			    char *err, size_t errlen)
{
	int n = config_setting_length(grp), have = 0;
	int line = setting_line(grp);

	if (!config_setting_is_group(grp))
		return config_fail(err, errlen, path, line, "each entry of nodes must be a group { id; addr; port; }");
	node->line = line;
	for (int i = 0; i < n; i++) {
		config_setting_t *s = config_setting_get_elem(grp, (unsigned)i);
		const char *name = config_setting_name(s);
		int sl = setting_line(s), t = config_setting_type(s);
		size_t j;

		for (j = 0; j < ARRAY_SIZE(node_keys) && strcmp(node_keys[j].name, name); j++)
			;
		if (j == ARRAY_SIZE(node_keys))
			return config_fail(err, errlen, path, sl,
					   "unknown key nodes.%s (expected id, addr, port, numa, rails, metrics_listen)",
					   name);
		have |= 1 << j;
		if (!strcmp(name, "numa")) {
			int ret = numa_setting(s, node->numa, sizeof(node->numa), &node->numa_mode, "nodes.numa", path, err,
					       errlen);

			if (ret)
				return ret;
		} else if (!strcmp(name, "metrics_listen")) {
			int ret = listen_setting(s, node->metrics_listen, sizeof(node->metrics_listen),
						 "nodes.metrics_listen", path, err, errlen);

			if (ret)
				return ret;
			node->has_metrics_listen = true;
		} else if (!strcmp(name, "addr")) {
			if (t != CONFIG_TYPE_STRING)
				return config_fail(err, errlen, path, sl, "nodes.addr must be a string");
			if (!addr_valid(config_setting_get_string(s), node->addr))
				return config_fail(err, errlen, path, sl,
						   "nodes.addr \"%s\" is not a numeric IPv4 or IPv6 address",
						   config_setting_get_string(s));
		} else if (!strcmp(name, "rails")) {
			int nr = config_setting_length(s);

			if (!config_setting_is_array(s) && !config_setting_is_list(s))
				return config_fail(err, errlen, path, sl,
						   "nodes.rails must be a list of addresses [ \"10.1.0.1\", ... ]");
			if (nr < 1 || nr > CONFIG_RAILS_MAX - 1)
				return config_fail(err, errlen, path, sl,
						   "nodes.rails lists %d addresses; 1..%d (with addr, %d rails at most)", nr,
						   CONFIG_RAILS_MAX - 1, CONFIG_RAILS_MAX);
			for (int r = 0; r < nr; r++) {
				config_setting_t *e = config_setting_get_elem(s, (unsigned)r);
				const char *a = config_setting_get_string(e);

				if (config_setting_type(e) != CONFIG_TYPE_STRING || !addr_valid(a, node->rail[r + 1]))
					return config_fail(err, errlen, path, sl,
							   "nodes.rails[%d] is not a numeric IPv4 or IPv6 address", r);
			}
			node->n_rails = (uint8_t)(nr + 1);
		} else {
			long long v;

			if (t != CONFIG_TYPE_INT && t != CONFIG_TYPE_INT64)
				return config_fail(err, errlen, path, sl, "nodes.%s must be an integer", name);
			v = config_setting_get_int64(s);
			if (v < node_keys[j].min || v > node_keys[j].max)
				return config_fail(err, errlen, path, sl, "node %s %lld out of range %u..%u", name, v,
						   node_keys[j].min, node_keys[j].max);
			if (!strcmp(name, "id"))
				node->id = (uint16_t)v;
			else
				node->port = (uint16_t)v;
		}
	}
	for (size_t j = 0; j < ARRAY_SIZE(node_keys); j++)
		if (!(have & (1 << j)) && strcmp(node_keys[j].name, "numa") && strcmp(node_keys[j].name, "rails") &&
		    strcmp(node_keys[j].name, "metrics_listen"))
			return config_fail(err, errlen, path, line, "node is missing %s", node_keys[j].name);
	if (!node->n_rails)
		node->n_rails = 1;
	util_strlcpy(node->rail[0], node->addr, sizeof(node->rail[0]));
	for (unsigned r = 1; r < node->n_rails; r++)
		for (unsigned q = 0; q < r; q++)
			if (addr_equal(node->rail[r], node->rail[q]))
				return config_fail(err, errlen, path, line, "node %u has address %s on two rails",
						   node->id, node->rail[r]);
	return 0;
}

static int config_read_nodes(struct mesh_config *cfg, config_setting_t *list, const char *path,
			     char *err, size_t errlen)
{
	int n = config_setting_length(list), ret;

	cfg->nodes_line = setting_line(list);
	if (!config_setting_is_list(list) && !config_setting_is_array(list))
		return config_fail(err, errlen, path, cfg->nodes_line, "nodes must be a list ( {...}, {...} )");
	if (n < 1)
		return config_fail(err, errlen, path, cfg->nodes_line, "nodes is empty");
	if (n > (int)MESH_NODE_ID_MAX + 1)
		return config_fail(err, errlen, path, cfg->nodes_line, "more than 65536 nodes");
	cfg->nodes = calloc((size_t)n, sizeof(*cfg->nodes));
	if (!cfg->nodes)
		return -ENOMEM;
	cfg->n_nodes = (size_t)n;
	for (int i = 0; i < n; i++) {
		ret = config_read_node(&cfg->nodes[i], config_setting_get_elem(list, (unsigned)i), path, err, errlen);
		if (ret)
			return ret;
		for (int j = 0; j < i; j++) {
			if (cfg->nodes[j].id == cfg->nodes[i].id)
				return config_fail(err, errlen, path, cfg->nodes[i].line,
						   "duplicate node id %u (first defined at line %d)", cfg->nodes[i].id,
						   cfg->nodes[j].line);
			if (cfg->nodes[j].n_rails != cfg->nodes[i].n_rails)
				return config_fail(err, errlen, path, cfg->nodes[i].line,
						   "node %u has %u rails, node %u at line %d has %u: every node needs "
						   "as many (rail r of each node on the same network)",
						   cfg->nodes[i].id, cfg->nodes[i].n_rails, cfg->nodes[j].id,
						   cfg->nodes[j].line, cfg->nodes[j].n_rails);
			for (unsigned a = 0; a < cfg->nodes[i].n_rails; a++)
				for (unsigned b = 0; b < cfg->nodes[j].n_rails; b++)
					if (cfg->nodes[j].port == cfg->nodes[i].port &&
					    addr_equal(cfg->nodes[j].rail[b], cfg->nodes[i].rail[a]))
						return config_fail(err, errlen, path, cfg->nodes[i].line,
								   "node %u uses %s port %u, like node %u at line %d",
								   cfg->nodes[i].id, cfg->nodes[i].rail[a],
								   cfg->nodes[i].port, cfg->nodes[j].id,
								   cfg->nodes[j].line);
		}
	}
	qsort(cfg->nodes, cfg->n_nodes, sizeof(*cfg->nodes), node_cmp);
	return 0;
}

/* Line `line` (from 1) of f, without its newline, into buf; false when the file has no such line. */
static bool file_line(FILE *f, int line, char *buf, size_t len)
{
	int c, at = 1;
	size_t n = 0;

	if (line < 1 || fseek(f, 0, SEEK_SET))
		return false;
	while (at < line && (c = getc(f)) != EOF)
		if (c == '\n')
			at++;
	if (at < line)
		return false;
	while ((c = getc(f)) != EOF && c != '\n')
		if (n + 1 < len)
			buf[n++] = (char)c;
	buf[n] = '\0';
	return true;
}

/* The settings ("name =" or "name :") of one line, in order: at most max, each NUL-terminated in
 * names[i]. Returns how many. Text in quotes is skipped. */
static int line_settings(const char *l, char names[][CONFIG_NAME_MAX], int max)
{
	int n = 0;

	for (const char *p = l; *p && n < max;) {
		const char *b = p, *e;

		if (*p == '"') {
			for (p++; *p && *p != '"'; p++)
				if (*p == '\\' && p[1])
					p++;
			p += *p == '"';
			continue;
		}
		if (*p == '#' || (*p == '/' && (p[1] == '/' || p[1] == '*')))
			break;
		if (!isalpha((unsigned char)*p) && *p != '*') {
			p++;
			continue;
		}
		while (isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '*')
			p++;
		e = p;
		while (*p == ' ' || *p == '\t')
			p++;
		if ((*p == '=' || *p == ':') && (size_t)(e - b) < CONFIG_NAME_MAX) {
			memcpy(names[n], b, (size_t)(e - b));
			names[n++][e - b] = '\0';
		}
	}
	return n;
}

/* Whether the line sets a value that is a bare word (transport = tcp;): libconfig reads a string
 * only in quotes and says no more than "syntax error". */
static bool line_has_bare_word(const char *l)
{
	for (const char *p = strpbrk(l, "=:"); p; p = strpbrk(p + 1, "=:")) {
		const char *w = p + 1, *e;

		while (*w == ' ' || *w == '\t')
			w++;
		for (e = w; isalnum((unsigned char)*e) || *e == '_' || *e == '-' || *e == '.'; e++)
			;
		if (e > w && isalpha((unsigned char)*w) && !(e - w == 4 && !strncasecmp(w, "true", 4)) &&
		    !(e - w == 5 && !strncasecmp(w, "false", 5)))
			return true;
	}
	return false;
}

/* libconfig's words for a parse error at line, with what it leaves out: the name of a duplicate
 * setting, the quotes a string needs. */
static void parse_error_explain(FILE *f, int line, const char *text, char *out, size_t len)
{
	char l[512], names[16][CONFIG_NAME_MAX];
	int n;

	snprintf(out, len, "%s", text ? text : "parse error");
	if (!text || !file_line(f, line, l, sizeof(l)))
		return;
	if (!strcmp(text, "duplicate setting name")) {
		/* The repeated one is the one the line sets twice, else the line's last setting. */
		int dup;

		n = line_settings(l, names, (int)ARRAY_SIZE(names));
		dup = n - 1;
		for (int i = 0; i < n; i++)
			for (int j = i + 1; j < n; j++)
				if (!strcmp(names[i], names[j]) && dup == n - 1)
					dup = i;
		if (n)
			snprintf(out, len, "duplicate setting %.*s: each key may be set once in its group",
				 CONFIG_NAME_MAX - 1, names[dup]);
	} else if (!strcmp(text, "syntax error") && line_has_bare_word(l)) {
		snprintf(out, len, "syntax error: strings need quotes (transport = \"tcp\";)");
	}
}

int config_load(const char *path, struct mesh_config *cfg, char *err, size_t errlen)
{
	config_t lc;
	config_setting_t *root, *s;
	struct stat st;
	FILE *f;
	int ret = 0;

	memset(cfg, 0, sizeof(*cfg));
	util_strlcpy(cfg->path, path, sizeof(cfg->path));
	config_defaults(cfg);
	/* Open ourselves: libconfig reports a missing file as a parse error without errno. */
	f = fopen(path, "r");
	if (!f) {
		ret = -errno;
		snprintf(err, errlen, "%s: cannot open: %s", path, strerror(errno));
		return ret;
	}
	/* A directory opens but its read fails inside libconfig's scanner, which then exits. */
	if (fstat(fileno(f), &st)) {
		ret = -errno;
		snprintf(err, errlen, "%s: cannot read: %s", path, strerror(errno));
		fclose(f);
		return ret;
	}
	if (S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "%s: is a directory, not a configuration file", path);
		fclose(f);
		return -EISDIR;
	}
	config_init(&lc);
	if (!config_read(&lc, f)) {
		char why[160];

		parse_error_explain(f, config_error_line(&lc), config_error_text(&lc), why, sizeof(why));
		ret = config_fail(err, errlen, path, config_error_line(&lc), "%s", why);
		goto out;
	}
	root = config_root_setting(&lc);
	for (int i = 0; i < config_setting_length(root); i++) {
		s = config_setting_get_elem(root, (unsigned)i);
		if (strcmp(config_setting_name(s), "cluster") && strcmp(config_setting_name(s), "nodes")) {
			ret = config_fail(err, errlen, path, setting_line(s),
					  "unknown key %s (expected cluster and nodes)", config_setting_name(s));
			goto out;
		}
	}
	s = config_lookup(&lc, "cluster");
	if (!s) {
		ret = config_fail(err, errlen, path, 0, "missing cluster = { name = \"...\"; ... };");
		goto out;
	}
	ret = config_read_cluster(cfg, s, path, err, errlen);
	if (ret)
		goto out;
	s = config_lookup(&lc, "nodes");
	if (!s) {
		ret = config_fail(err, errlen, path, 0, "missing nodes = ( { id; addr; port; }, ... );");
		goto out;
	}
	ret = config_read_nodes(cfg, s, path, err, errlen);
out:
	config_destroy(&lc);
	fclose(f);
	if (ret)
		config_free(cfg);
	return ret;
}

void config_free(struct mesh_config *cfg)
{
	if (!cfg)
		return;
	free(cfg->nodes);
	cfg->nodes = NULL;
	cfg->n_nodes = 0;
}

const struct config_node *config_node_find(const struct mesh_config *cfg, uint32_t id)
{
	struct config_node key = {.id = (uint16_t)id};

	if (id > MESH_NODE_ID_MAX || !cfg->nodes)
		return NULL;
	return bsearch(&key, cfg->nodes, cfg->n_nodes, sizeof(key), node_cmp);
}

/* The value of key k in cfg, as the file would write it. */
static void key_value(const struct config_key *k, const struct mesh_config *cfg, char *out, size_t len)
{
	const char *p = (const char *)cfg + k->offset;

	if (k->type == CFG_BYTES)
		snprintf(out, len, "%llu", (unsigned long long)*(const uint64_t *)p);
	else if (k->type == CFG_UINT)
		snprintf(out, len, "%u", *(const uint32_t *)p);
	else
		snprintf(out, len, "\"%s\"", p);
}

/* Appends ", what" (or "what" first) to err. */
static void reload_say(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void reload_say(char *err, size_t errlen, const char *fmt, ...)
{
	size_t n = strlen(err);
	va_list ap;

	if (n && n + 2 < errlen) {
		memcpy(err + n, "; ", 3);
		n += 2;
	}
	if (n + 1 >= errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err + n, errlen - n, fmt, ap);
	va_end(ap);
}

int config_reload_check(const struct mesh_config *was, const struct mesh_config *now, uint32_t self_id, char *err,
			size_t errlen)
{
	const struct config_node *a = config_node_find(was, self_id), *b = config_node_find(now, self_id);

	err[0] = '\0';
	for (size_t i = 0; i < ARRAY_SIZE(config_keys); i++) {
		const struct config_key *k = &config_keys[i];
		char va[CONFIG_LISTEN_MAX + 8], vb[CONFIG_LISTEN_MAX + 8];

		if (!key_needs_restart(k->name))
			continue;
		key_value(k, was, va, sizeof(va));
		key_value(k, now, vb, sizeof(vb));
		if (strcmp(va, vb))
			reload_say(err, errlen, "cluster.%s changed (%s -> %s)", k->name, va, vb);
	}
	if (!b) {
		reload_say(err, errlen, "node %u (this node) is no longer in nodes", self_id);
	} else if (a) {
		bool rails = MAX(1u, a->n_rails) != MAX(1u, b->n_rails);

		for (uint32_t r = 1; !rails && r < MAX(1u, a->n_rails); r++)
			rails = strcmp(a->rail[r], b->rail[r]) != 0;
		if (strcmp(a->addr, b->addr))
			reload_say(err, errlen, "line %d: this node's addr changed (%s -> %s)", b->line, a->addr, b->addr);
		if (a->port != b->port)
			reload_say(err, errlen, "line %d: this node's port changed (%u -> %u)", b->line, a->port, b->port);
		if (rails)
			reload_say(err, errlen, "line %d: this node's rails changed", b->line);
		if (strcmp(a->numa, b->numa))
			reload_say(err, errlen, "line %d: this node's numa changed (\"%s\" -> \"%s\")", b->line, a->numa,
				   b->numa);
	}
	if (!err[0])
		return 0;
	reload_say(err, errlen, "a restart applies these, a reload cannot (restart meshd, or put them back and reload)");
	return -MESH_ECONFIG;
}

void config_dump(FILE *out, const struct mesh_config *cfg)
{
	/* As the dump (and mesh.conf(5), made from it) names each type. */
	static const char *const type_names[] = {
		[CFG_UINT] = "integer", [CFG_BYTES] = "size", [CFG_STRING] = "string", [CFG_NUMA] = "string", [CFG_LISTEN] = "string"};

	fprintf(out, "# cluster = { ... };  every key, with its default, range and meaning\n");
	for (size_t i = 0; i < ARRAY_SIZE(config_keys); i++) {
		const struct config_key *k = &config_keys[i];
		char range[48], cur[CONFIG_NAME_MAX + 8] = "";

		if (k->type == CFG_UINT || k->type == CFG_BYTES) {
			snprintf(range, sizeof(range), "%llu..%llu", (unsigned long long)k->min, (unsigned long long)k->max);
			if (cfg && k->type == CFG_BYTES)
				snprintf(cur, sizeof(cur), "%llu",
					 (unsigned long long)*(const uint64_t *)((const char *)cfg + k->offset));
			else if (cfg)
				snprintf(cur, sizeof(cur), "%u", *(const uint32_t *)((const char *)cfg + k->offset));
		} else {
			if (k->type == CFG_NUMA)
				snprintf(range, sizeof(range), "auto|off|0..%llu", (unsigned long long)k->max);
			else if (k->type == CFG_LISTEN)
				snprintf(range, sizeof(range), "[ADDR]:PORT");
			else if (k->choices)
				choices_join(k->choices, "|", range, sizeof(range));
			else
				snprintf(range, sizeof(range), "string");
			if (cfg)
				snprintf(cur, sizeof(cur), "\"%s\"", (const char *)cfg + k->offset);
		}
		fprintf(out, "cluster.%-22s %-8s default %-8s range %-14s %s (%s)%s%s\n", k->name, type_names[k->type],
			!k->def ? "(none)" : !k->def[0] ? "\"\"" : k->def, range, k->help,
			key_needs_restart(k->name) ? "a restart applies it" : "a reload applies it", cfg ? "; in force: " : "",
			cur);
	}
	fprintf(out, "# nodes = ( { ... }, ... );  one entry per node\n");
	for (size_t i = 0; i < ARRAY_SIZE(node_keys); i++) {
		char range[32];

		bool numa = !strcmp(node_keys[i].name, "numa"), rails = !strcmp(node_keys[i].name, "rails");
		bool listen = !strcmp(node_keys[i].name, "metrics_listen");

		if (node_keys[i].max)
			snprintf(range, sizeof(range), "%u..%u", node_keys[i].min, node_keys[i].max);
		else if (numa)
			snprintf(range, sizeof(range), "auto|off|0..%d", CONFIG_NUMA_NODE_MAX);
		else if (rails)
			snprintf(range, sizeof(range), "1..%d addresses", CONFIG_RAILS_MAX - 1);
		else if (listen)
			snprintf(range, sizeof(range), "[ADDR]:PORT");
		else
			snprintf(range, sizeof(range), "address");
		fprintf(out, "nodes.%-24s %-8s default %-8s range %-14s %s\n", node_keys[i].name,
			node_keys[i].max ? "integer" : rails ? "list" : "string",
			numa || listen ? "cluster" : rails ? "[]" : "(none)", range, node_keys[i].help);
	}
}
