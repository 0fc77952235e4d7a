/*
 * config_load(): a valid file parses into exactly the values written (defaults for the rest, nodes
 * sorted by id), and every kind of invalid file is refused with -MESH_ECONFIG and a message
 * "path:LINE: what" that points at the offending line.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "config.h"
#include "unit_main.h"
#include "util.h"
#include "wire.h"

/* Per test: the temp file (removed in teardown) and the loaded config (freed in teardown). */
struct cfg_test {
	char path[512];
	struct mesh_config cfg;
	char err[512];
};

static int cfg_setup(void **state)
{
	struct cfg_test *t = calloc(1, sizeof(*t));

	if (!t)
		return -1;
	*state = t;
	return 0;
}

static int cfg_teardown(void **state)
{
	struct cfg_test *t = *state;

	if (t->path[0])
		unlink(t->path);
	config_free(&t->cfg);
	free(t);
	return 0;
}

/* Writes text into a new temp file under $TMPDIR (or /tmp) and remembers its path. */
static void write_cfg(struct cfg_test *t, const char *text)
{
	const char *dir = getenv("TMPDIR");
	int fd;
	size_t len = strlen(text);

	if (!dir || !*dir)
		dir = "/tmp";
	if (t->path[0])
		unlink(t->path);
	snprintf(t->path, sizeof(t->path), "%s/meshd-test-XXXXXX", dir);
	fd = mkstemp(t->path);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, len), (ssize_t)len);
	assert_int_equal(close(fd), 0);
}

static int load_text(struct cfg_test *t, const char *text)
{
	config_free(&t->cfg);
	write_cfg(t, text);
	memset(t->err, 0, sizeof(t->err));
	return config_load(t->path, &t->cfg, t->err, sizeof(t->err));
}

/* The file must be refused with -MESH_ECONFIG, the message must start with "path:line: " (or
 * "path: " for line 0, a problem that has no line) and contain every needle. Nothing is left
 * allocated. */
static void expect_refused_at(struct cfg_test *t, const char *text, int line, const char *needle1,
			      const char *needle2)
{
	char prefix[600];
	int ret = load_text(t, text);

	if (ret != -MESH_ECONFIG)
		fail_msg("config_load returned %d (%s), expected -MESH_ECONFIG; err \"%s\"", ret, mesh_strerror(ret),
			 t->err);
	if (line > 0)
		snprintf(prefix, sizeof(prefix), "%s:%d: ", t->path, line);
	else
		snprintf(prefix, sizeof(prefix), "%s: ", t->path);
	if (strncmp(t->err, prefix, strlen(prefix)))
		fail_msg("error \"%s\" does not start with \"%s\"", t->err, prefix);
	if (needle1 && !strstr(t->err, needle1))
		fail_msg("error \"%s\" does not mention \"%s\"", t->err, needle1);
	if (needle2 && !strstr(t->err, needle2))
		fail_msg("error \"%s\" does not mention \"%s\"", t->err, needle2);
	assert_null(t->cfg.nodes);
	assert_int_equal(t->cfg.n_nodes, 0);
}

#define NODE1 "  { id = 1; addr = \"10.0.0.1\"; port = 7471; }"
#define NODES1 "nodes = (\n" NODE1 "\n);\n"

/* ---- valid files ---------------------------------------------------------------------------- */

static const char valid_text[] =
	"# rdmamesh test cluster\n"                               /* 1 */
	"cluster = {\n"                                            /* 2 */
	"  name = \"lab\";\n"                                      /* 3 */
	"  qps_per_link = 4;\n"                                    /* 4 */
	"  keepalive_interval_ms = 200;\n"                         /* 5 */
	"  keepalive_timeout_ms = 1000;\n"                         /* 6 */
	"  max_handshakes = 3;\n"                                  /* 7 */
	"  mailbox_size = 8192;\n"                                 /* 8 */
	"  log_level = \"debug\";\n"                               /* 9 */
	"};\n"                                                     /* 10 */
	"nodes = (\n"                                              /* 11 */
	"  { id = 30; addr = \"10.0.0.3\"; port = 7471; },\n"      /* 12 */
	"  { id = 1; addr = \"10.0.0.1\"; port = 7471; },\n"       /* 13 */
	"  { id = 2; addr = \"fe80::2\"; port = 7472; },\n"        /* 14 */
	"  { id = 65535; addr = \"10.0.0.1\"; port = 65535; },\n"  /* 15 */
	"  { id = 0; addr = \"10.0.0.9\"; port = 1; }\n"           /* 16 */
	");\n";                                                    /* 17 */

/* ---- reload: config_reload_check ------------------------------------------------------------ */

#define RELOAD_BASE \
	"cluster = { name = \"lab\"; qps_per_link = 2; max_channels_per_link = 100; log_level = \"info\"; };\n"
#define RELOAD_NODES \
	"nodes = (\n  { id = 1; addr = \"10.0.0.1\"; port = 7471; },\n  { id = 2; addr = \"10.0.0.2\"; port = 7471; }\n);\n"

/* Loads was_text and now_text and checks now against was for node 1. */
static int reload_check(struct cfg_test *t, const char *was_text, const char *now_text)
{
	struct mesh_config was;
	int ret;

	if (load_text(t, was_text))
		fail_msg("config_load (before): %s", t->err);
	was = t->cfg;
	memset(&t->cfg, 0, sizeof(t->cfg));
	if (load_text(t, now_text)) {
		config_free(&was);
		fail_msg("config_load (after): %s", t->err);
	}
	ret = config_reload_check(&was, &t->cfg, 1, t->err, sizeof(t->err));
	config_free(&was);
	return ret;
}

static void config_reload_check__limits_log_level_and_nodes__applied(void **state)
{
	struct cfg_test *t = *state;
	static const char now[] =
		"cluster = { name = \"lab\"; qps_per_link = 2; max_channels_per_link = 7; log_level = \"debug\"; "
		"resume_timeout_ms = 1000; key_file = \"k\"; metrics_listen = \":9999\"; };\n"
		"nodes = (\n  { id = 1; addr = \"10.0.0.1\"; port = 7471; },\n  { id = 3; addr = \"10.0.0.3\"; port = 7471; }\n);\n";

	assert_int_equal(reload_check(t, RELOAD_BASE RELOAD_NODES, now), 0);
	assert_string_equal(t->err, "");
}

static void config_reload_check__restart_keys_and_own_address__refused_naming_each(void **state)
{
	struct cfg_test *t = *state;
	static const char now[] =
		"cluster = { name = \"lab\"; qps_per_link = 4; max_channels_per_link = 100; transport = \"tcp\"; };\n"
		"nodes = (\n  { id = 1; addr = \"10.0.0.9\"; port = 7400; },\n  { id = 2; addr = \"10.0.0.2\"; port = 7471; }\n);\n";

	assert_int_equal(reload_check(t, RELOAD_BASE RELOAD_NODES, now), -MESH_ECONFIG);
	assert_non_null(strstr(t->err, "cluster.qps_per_link changed (2 -> 4)"));
	assert_non_null(strstr(t->err, "cluster.transport changed (\"rdma\" -> \"tcp\")"));
	assert_non_null(strstr(t->err, "line 3: this node's addr changed (10.0.0.1 -> 10.0.0.9)"));
	assert_non_null(strstr(t->err, "this node's port changed (7471 -> 7400)"));
	assert_non_null(strstr(t->err, "a restart applies these, a reload cannot"));
	assert_null(strstr(t->err, "max_channels_per_link"));
}

static void config_reload_check__this_node_removed__refused(void **state)
{
	struct cfg_test *t = *state;
	static const char now[] = RELOAD_BASE "nodes = (\n  { id = 2; addr = \"10.0.0.2\"; port = 7471; }\n);\n";

	assert_int_equal(reload_check(t, RELOAD_BASE RELOAD_NODES, now), -MESH_ECONFIG);
	assert_non_null(strstr(t->err, "node 1 (this node) is no longer in nodes"));
}

static void config_load__valid_file__every_value_parsed_and_defaults_applied(void **state)
{
	struct cfg_test *t = *state;
	const struct mesh_config *c = &t->cfg;
	int ret = load_text(t, valid_text);

	if (ret)
		fail_msg("config_load: %d: %s", ret, t->err);
	assert_string_equal(c->path, t->path);
	assert_string_equal(c->cluster_name, "lab");
	assert_int_equal(c->qps_per_link, 4);
	assert_int_equal(c->keepalive_interval_ms, 200);
	assert_int_equal(c->keepalive_timeout_ms, 1000);
	assert_int_equal(c->max_handshakes, 3);
	assert_int_equal(c->mailbox_size, 8192);
	assert_string_equal(c->log_level, "debug");
	/* Not in the file: the table's defaults. */
	assert_string_equal(c->transport, "rdma");
	assert_int_equal(c->connect_timeout_ms, 5000);
	assert_int_equal(c->handshake_timeout_ms, 15000);
	assert_int_equal(c->backoff_initial_ms, 100);
	assert_int_equal(c->backoff_max_ms, 5000);
	assert_int_equal(c->nodes_line, 11);
	assert_int_equal(c->n_nodes, 5);
	assert_non_null(c->nodes);
}

static void config_load__valid_file__nodes_sorted_by_id_with_lines(void **state)
{
	struct cfg_test *t = *state;
	const struct mesh_config *c = &t->cfg;
	static const struct {
		uint16_t id, port;
		const char *addr;
		int line;
	} want[] = {
		{0, 1, "10.0.0.9", 16},
		{1, 7471, "10.0.0.1", 13},
		{2, 7472, "fe80::2", 14},
		{30, 7471, "10.0.0.3", 12},
		{65535, 65535, "10.0.0.1", 15},
	};

	assert_int_equal(load_text(t, valid_text), 0);
	assert_int_equal(c->n_nodes, sizeof(want) / sizeof(want[0]));
	for (size_t i = 0; i < c->n_nodes; i++) {
		assert_int_equal(c->nodes[i].id, want[i].id);
		assert_int_equal(c->nodes[i].port, want[i].port);
		assert_string_equal(c->nodes[i].addr, want[i].addr);
		assert_int_equal(c->nodes[i].line, want[i].line);
	}
}

static void config_node_find__loaded_ids__found_and_others_null(void **state)
{
	struct cfg_test *t = *state;
	const struct config_node *n;

	assert_int_equal(load_text(t, valid_text), 0);
	n = config_node_find(&t->cfg, 2);
	assert_non_null(n);
	assert_int_equal(n->id, 2);
	assert_string_equal(n->addr, "fe80::2");
	n = config_node_find(&t->cfg, 0);
	assert_non_null(n);
	assert_int_equal(n->id, 0);
	n = config_node_find(&t->cfg, 65535);
	assert_non_null(n);
	assert_int_equal(n->port, 65535);
	assert_null(config_node_find(&t->cfg, 3));
	assert_null(config_node_find(&t->cfg, 29));
	/* Above the id range: must not be truncated to 16 bits (65536 + 2 would find node 2). */
	assert_null(config_node_find(&t->cfg, 65536 + 2));
	assert_null(config_node_find(&t->cfg, 70000));
}

static void config_load__minimal_file__all_defaults(void **state)
{
	struct cfg_test *t = *state;
	const struct mesh_config *c = &t->cfg;
	int ret = load_text(t, "cluster = { name = \"c\"; };\n" NODES1);

	if (ret)
		fail_msg("config_load: %d: %s", ret, t->err);
	assert_string_equal(c->cluster_name, "c");
	assert_string_equal(c->transport, "rdma");
	assert_string_equal(c->log_level, "info");
	assert_int_equal(c->qps_per_link, 2);
	assert_int_equal(c->keepalive_interval_ms, 1000);
	assert_int_equal(c->keepalive_timeout_ms, 5000);
	assert_int_equal(c->connect_timeout_ms, 5000);
	assert_int_equal(c->handshake_timeout_ms, 15000);
	assert_int_equal(c->backoff_initial_ms, 100);
	assert_int_equal(c->backoff_max_ms, 5000);
	assert_int_equal(c->max_handshakes, 8);
	assert_int_equal(c->mailbox_size, 4096);
	assert_string_equal(c->polling, "adaptive");
	assert_int_equal(c->poll_budget_us, 200);
	assert_int_equal(c->app_spin_us, 50);
	assert_string_equal(c->direct_receive, "on");
	assert_string_equal(c->app_send, "on");
	assert_string_equal(c->numa, "auto");
	assert_int_equal(c->numa_mode, CONFIG_NUMA_AUTO);
	assert_int_equal(c->n_nodes, 1);
	assert_int_equal(c->nodes[0].id, 1);
}

static void config_free__after_failure_and_twice__safe(void **state)
{
	struct cfg_test *t = *state;

	assert_int_equal(load_text(t, "cluster = { name = \"c\"; };\n" NODES1), 0);
	config_free(&t->cfg);
	assert_null(t->cfg.nodes);
	assert_int_equal(t->cfg.n_nodes, 0);
	config_free(&t->cfg);
	config_free(NULL);
}

/* ---- invalid files: one test per kind of mistake -------------------------------------------- */

static void config_load__unknown_cluster_key__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  qps_per_lnk = 2;\n"
			  "};\n" NODES1,
			  3, "unknown key cluster.qps_per_lnk", NULL);
}

static void config_load__unknown_top_level_key__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n" NODES1 "\n"
			  "transport = \"rdma\";\n",
			  6, "unknown key transport", "expected cluster and nodes");
}

static void config_load__unknown_node_key__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n" NODE1 ",\n"
			  "  { id = 2;\n"
			  "    address = \"10.0.0.2\"; port = 7471; }\n"
			  ");\n",
			  5, "unknown key nodes.address", NULL);
}

static void config_load__duplicate_node_id__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = 1; addr = \"10.0.0.1\"; port = 7471; },\n"
			  "  { id = 2; addr = \"10.0.0.2\"; port = 7471; },\n"
			  "  { id = 1; addr = \"10.0.0.3\"; port = 7471; }\n"
			  ");\n",
			  5, "duplicate node id 1", "line 3");
}

static void config_load__node_id_70000__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n" NODE1 ",\n"
			  "  {\n"
			  "    id = 70000;\n"
			  "    addr = \"10.0.0.2\"; port = 7471;\n"
			  "  }\n"
			  ");\n",
			  5, "node id 70000 out of range 0..65535", NULL);
}

static void config_load__negative_node_id__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = -1; addr = \"10.0.0.2\"; port = 7471; }\n"
			  ");\n",
			  3, "node id -1 out of range", NULL);
}

static void config_load__port_0__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n" NODE1 ",\n"
			  "  { id = 2; addr = \"10.0.0.2\";\n"
			  "    port = 0; }\n"
			  ");\n",
			  5, "node port 0 out of range 1..65535", NULL);
}

static void config_load__port_65536__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = 2; addr = \"10.0.0.2\"; port = 65536; }\n"
			  ");\n",
			  3, "node port 65536 out of range 1..65535", NULL);
}

static void config_load__qps_per_link_0__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "\n"
			  "  qps_per_link = 0;\n"
			  "};\n" NODES1,
			  4, "cluster.qps_per_link 0 out of range 1..16", NULL);
}

static void config_load__qps_per_link_17__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  qps_per_link = 17;\n"
			  "};\n" NODES1,
			  3, "cluster.qps_per_link 17 out of range 1..16", NULL);
}

static void config_load__qps_per_link_16__accepted(void **state)
{
	struct cfg_test *t = *state;
	int ret = load_text(t, "cluster = { name = \"lab\"; qps_per_link = 16; };\n" NODES1);

	if (ret)
		fail_msg("config_load: %d: %s", ret, t->err);
	assert_int_equal(t->cfg.qps_per_link, 16);
}

static void config_load__transport_foo__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  transport = \"foo\";\n"
			  "};\n" NODES1,
			  3, "cluster.transport \"foo\" is not one of rdma", NULL);
}

static void config_load__log_level_loud__rejected_with_choices(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  log_level = \"loud\";\n"
			  "};\n" NODES1,
			  3, "cluster.log_level \"loud\"", "error | warn | info | debug");
}

static void config_load__polling_spin__rejected_with_choices(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  polling = \"spin\";\n"
			  "};\n" NODES1,
			  3, "cluster.polling \"spin\"", "adaptive | busy | event");
}

static void config_load__direct_receive_maybe__rejected_with_choices(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  direct_receive = \"maybe\";\n"
			  "};\n" NODES1,
			  3, "cluster.direct_receive \"maybe\"", "on | off");
}

static void config_load__poll_budget_too_large__rejected_with_range(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  poll_budget_us = 2000000;\n"
			  "};\n" NODES1,
			  3, "cluster.poll_budget_us 2000000 out of range", "0..1000000");
}

/* 64 GiB does not fit a 32-bit integer: the byte budget is read as 64 bits. */
static void config_load__uid_quotas_and_group__loaded(void **state)
{
	struct cfg_test *t = *state;
	int ret = load_text(t, "cluster = {\n  name = \"lab\";\n  max_channels_per_uid = 10;\n"
			       "  max_ring_bytes_per_uid = 68719476736L;\n  socket_group = \"users\";\n};\n" NODES1);

	if (ret)
		fail_msg("config_load: %d: %s", ret, t->err);
	assert_int_equal(t->cfg.max_channels_per_uid, 10);
	assert_true(t->cfg.max_ring_bytes_per_uid == 68719476736ull);
	assert_string_equal(t->cfg.socket_group, "users");
	ret = load_text(t, "cluster = {\n  name = \"lab\";\n};\n" NODES1);
	assert_int_equal(ret, 0);
	assert_int_equal(t->cfg.max_channels_per_uid, 4096);
	assert_true(t->cfg.max_ring_bytes_per_uid == 16ull << 30);
	assert_string_equal(t->cfg.socket_group, "rdmamesh");
	ret = load_text(t, "cluster = {\n  name = \"lab\";\n  max_ring_bytes_per_uid = \"512M\";\n};\n" NODES1);
	assert_int_equal(ret, 0);
	assert_true(t->cfg.max_ring_bytes_per_uid == 512ull << 20);
}

/* libconfig reads 68719476736 without L as 0: say so rather than "0 out of range". */
static void config_load__ring_bytes_per_uid_beyond_32_bits_without_l__rejected_naming_the_fix(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  max_ring_bytes_per_uid = 68719476736;\n"
			  "};\n" NODES1,
			  3, "cluster.max_ring_bytes_per_uid is 0 or too large", "\"16G\"");
}

static void config_load__ring_bytes_per_uid_bad_suffix__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  max_ring_bytes_per_uid = \"16GB\";\n"
			  "};\n" NODES1,
			  3, "\"16GB\" is not a size", NULL);
}

static void config_load__ring_bytes_per_uid_below_1mib__rejected_with_range(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  max_ring_bytes_per_uid = 4096;\n"
			  "};\n" NODES1,
			  3, "cluster.max_ring_bytes_per_uid 4096 out of range", "1048576..1125899906842624");
}

static void config_load__busy_polling__loaded(void **state)
{
	struct cfg_test *t = *state;
	int ret = load_text(t, "cluster = {\n  name = \"lab\";\n  polling = \"busy\";\n  poll_budget_us = 0;\n"
			       "  app_spin_us = 1000;\n};\n" NODES1);

	if (ret)
		fail_msg("config_load: %d: %s", ret, t->err);
	assert_string_equal(t->cfg.polling, "busy");
	assert_int_equal(t->cfg.poll_budget_us, 0);
	assert_int_equal(t->cfg.app_spin_us, 1000);
}

static void config_load__numa_each_form__mode_parsed(void **state)
{
	static const struct {
		const char *text, *shown;
		int mode;
	} cases[] = {
		{"numa = 1;", "1", 1}, {"numa = \"off\";", "off", CONFIG_NUMA_OFF},
		{"numa = \"auto\";", "auto", CONFIG_NUMA_AUTO}, {"numa = \"0\";", "0", 0}, {"numa = 63;", "63", 63},
	};
	struct cfg_test *t = *state;
	char text[256];

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(text, sizeof(text), "cluster = {\n  name = \"lab\";\n  %s\n};\n" NODES1, cases[i].text);
		if (t->path[0])
			unlink(t->path);
		config_free(&t->cfg);
		if (load_text(t, text))
			fail_msg("%s: %s", cases[i].text, t->err);
		assert_string_equal(t->cfg.numa, cases[i].shown);
		assert_int_equal(t->cfg.numa_mode, cases[i].mode);
	}
}

static void config_load__node_numa__overrides_cluster_for_that_node_only(void **state)
{
	struct cfg_test *t = *state;
	int ret = load_text(t, "cluster = {\n  name = \"lab\";\n  numa = \"off\";\n};\n"
			       "nodes = (\n  { id = 1; addr = \"10.0.0.1\"; port = 7471; numa = 1; },\n"
			       "  { id = 2; addr = \"10.0.0.2\"; port = 7471; }\n);\n");

	if (ret)
		fail_msg("config_load: %d: %s", ret, t->err);
	assert_int_equal(config_node_numa(&t->cfg, config_node_find(&t->cfg, 1)), 1);
	assert_string_equal(config_node_find(&t->cfg, 1)->numa, "1");
	assert_int_equal(config_node_numa(&t->cfg, config_node_find(&t->cfg, 2)), CONFIG_NUMA_OFF);
}

static void config_load__metrics_listen_each_form__accepted_and_parsed(void **state)
{
	static const struct {
		const char *v;
		int family;
		uint16_t port;
	} forms[] = {
		{"127.0.0.1:9464", AF_INET, 9464}, {"[::1]:9465", AF_INET6, 9465}, {":1", AF_INET, 1},
		{"0.0.0.0:65535", AF_INET, 65535}, {"[fe80::2]:80", AF_INET6, 80},
	};
	struct cfg_test *t = *state;
	char text[256];

	for (size_t i = 0; i < ARRAY_SIZE(forms); i++) {
		struct sockaddr_storage ss;
		socklen_t len;
		const char *why = NULL;
		int ret;

		snprintf(text, sizeof(text), "cluster = { name = \"lab\"; metrics_listen = \"%s\"; };\n" NODES1, forms[i].v);
		ret = load_text(t, text);
		if (ret)
			fail_msg("%s: config_load: %d: %s", forms[i].v, ret, t->err);
		assert_string_equal(t->cfg.metrics_listen, forms[i].v);
		assert_string_equal(config_node_metrics_listen(&t->cfg, config_node_find(&t->cfg, 1)), forms[i].v);
		assert_int_equal(config_listen_parse(forms[i].v, &ss, &len, &why), 0);
		assert_int_equal(ss.ss_family, forms[i].family);
		assert_int_equal(ntohs(forms[i].family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
								   : ((struct sockaddr_in6 *)&ss)->sin6_port),
				 forms[i].port);
	}
	assert_int_equal(load_text(t, "cluster = { name = \"lab\"; };\n" NODES1), 0);
	assert_string_equal(t->cfg.metrics_listen, ""); /* default: off */
}

/* ":PORT" served every address without authentication (issue 38): it is loopback now, and every
 * address is what "0.0.0.0:PORT" or "[::]:PORT" says. */
static void config_listen_parse__no_address__loopback_only(void **state)
{
	struct sockaddr_storage ss;
	const char *why = NULL;
	socklen_t len;

	(void)state;
	assert_int_equal(config_listen_parse(":9464", &ss, &len, &why), 0);
	assert_int_equal(ss.ss_family, AF_INET);
	assert_int_equal(len, sizeof(struct sockaddr_in));
	assert_int_equal(ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr), INADDR_LOOPBACK);
	assert_int_equal(ntohs(((struct sockaddr_in *)&ss)->sin_port), 9464);
	assert_int_equal(config_listen_parse("0.0.0.0:9464", &ss, &len, &why), 0);
	assert_int_equal(ntohl(((struct sockaddr_in *)&ss)->sin_addr.s_addr), INADDR_ANY);
	assert_int_equal(config_listen_parse("[::]:9464", &ss, &len, &why), 0);
	assert_int_equal(ss.ss_family, AF_INET6);
	assert_memory_equal(&((struct sockaddr_in6 *)&ss)->sin6_addr, &in6addr_any, sizeof(in6addr_any));
}

static void config_load__metrics_listen_bad__rejected_with_line_and_why(void **state)
{
	static const struct {
		const char *v, *why;
	} bad[] = {
		{"9464", "is not ADDR:PORT"},
		{"localhost:9464", "no numeric IPv4"},
		{"127.0.0.1:0", "no port 1..65535"},
		{"127.0.0.1:65536", "no port 1..65535"},
		{"127.0.0.1:", "no port"},
		{"127.0.0.1:94a", "no port"},
		{"127.0.0.1:-1", "no port"},
		{"::1:9464", "without [brackets]"},
		{"[::1:9464", "'['"},
		{"[127.0.0.1]:9464", "no numeric"},
		{"[]:9464", "no numeric"},
	};
	struct cfg_test *t = *state;
	char text[256], want[64];

	for (size_t i = 0; i < ARRAY_SIZE(bad); i++) {
		snprintf(text, sizeof(text), "cluster = {\n  name = \"lab\";\n  metrics_listen = \"%s\";\n};\n" NODES1,
			 bad[i].v);
		snprintf(want, sizeof(want), "cluster.metrics_listen \"%s\"", bad[i].v);
		expect_refused_at(t, text, 3, want, bad[i].why);
	}
	expect_refused_at(t, "cluster = {\n  name = \"lab\";\n  metrics_listen = 9464;\n};\n" NODES1, 3,
			  "cluster.metrics_listen must be a string", NULL);
	expect_refused_at(t,
			  "cluster = { name = \"lab\"; };\nnodes = (\n"
			  "  { id = 1; addr = \"10.0.0.1\"; port = 7471;\n    metrics_listen = \"1.2.3.4\"; }\n);\n",
			  4, "nodes.metrics_listen \"1.2.3.4\"", NULL);
}

static void config_load__node_metrics_listen__overrides_cluster_for_that_node_only(void **state)
{
	struct cfg_test *t = *state;
	int ret = load_text(t, "cluster = {\n  name = \"lab\";\n  metrics_listen = \":9464\";\n};\n"
			       "nodes = (\n  { id = 1; addr = \"10.0.0.1\"; port = 7471; metrics_listen = \"127.0.0.1:9501\"; },\n"
			       "  { id = 2; addr = \"10.0.0.2\"; port = 7471; metrics_listen = \"\"; },\n"
			       "  { id = 3; addr = \"10.0.0.3\"; port = 7471; }\n);\n");

	if (ret)
		fail_msg("config_load: %d: %s", ret, t->err);
	assert_string_equal(config_node_metrics_listen(&t->cfg, config_node_find(&t->cfg, 1)), "127.0.0.1:9501");
	assert_string_equal(config_node_metrics_listen(&t->cfg, config_node_find(&t->cfg, 2)), "");
	assert_string_equal(config_node_metrics_listen(&t->cfg, config_node_find(&t->cfg, 3)), ":9464");
}

static void config_load__node_numa_garbage__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "};\n"
			  "nodes = (\n"
			  "  { id = 1; addr = \"10.0.0.1\"; port = 7471;\n"
			  "    numa = \"socket0\"; }\n"
			  ");\n",
			  6, "nodes.numa \"socket0\"", "auto, off or a node number");
}

static void config_load__numa_near__rejected_with_choices(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  numa = \"near\";\n"
			  "};\n" NODES1,
			  3, "cluster.numa \"near\"", "auto, off or a node number 0..63");
}

static void config_load__numa_64__rejected_with_range(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  numa = 64;\n"
			  "};\n" NODES1,
			  3, "cluster.numa \"64\"", "0..63");
}

static void config_load__numa_negative__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  numa = -1;\n"
			  "};\n" NODES1,
			  3, "cluster.numa \"-1\"", "0..63");
}

static void config_load__numa_float__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  numa = 1.5;\n"
			  "};\n" NODES1,
			  3, "cluster.numa must be", "node number");
}

static void config_load__string_for_integer__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  keepalive_interval_ms = \"1000\";\n"
			  "};\n" NODES1,
			  3, "cluster.keepalive_interval_ms must be an integer", NULL);
}

static void config_load__float_for_integer__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  qps_per_link = 2.5;\n"
			  "};\n" NODES1,
			  3, "cluster.qps_per_link must be an integer", NULL);
}

static void config_load__string_for_node_port__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = 1; addr = \"10.0.0.1\"; port = \"7471\"; }\n"
			  ");\n",
			  3, "nodes.port must be an integer", NULL);
}

static void config_load__integer_for_name__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = 5;\n"
			  "};\n" NODES1,
			  2, "cluster.name must be a string", NULL);
}

static void config_load__name_too_long__rejected_with_line(void **state)
{
	char text[512];

	snprintf(text, sizeof(text), "cluster = {\n  name = \"%064d\";\n};\n" NODES1, 0);
	expect_refused_at(*state, text, 2, "cluster.name is longer than 63 characters", NULL);
}

static void config_load__missing_cluster_name__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "\n"
			  "cluster = {\n"
			  "  qps_per_link = 2;\n"
			  "};\n" NODES1,
			  2, "cluster.name is required", NULL);
}

/* Missing groups have no line to point at: the message names the file and what to add. */
static void config_load__missing_cluster__rejected_naming_it(void **state)
{
	expect_refused_at(*state, NODES1, 0, "missing cluster", NULL);
}

static void config_load__missing_nodes__rejected_naming_it(void **state)
{
	expect_refused_at(*state, "cluster = { name = \"lab\"; };\n", 0, "missing nodes", NULL);
}

static void config_load__empty_nodes__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "\n"
			  "nodes = ( );\n",
			  3, "nodes is empty", NULL);
}

static void config_load__nodes_not_a_list__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = { id = 1; addr = \"10.0.0.1\"; port = 7471; };\n",
			  2, "nodes must be a list", NULL);
}

static void config_load__node_missing_port__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n" NODE1 ",\n"
			  "  { id = 2; addr = \"10.0.0.2\"; }\n"
			  ");\n",
			  4, "node is missing port", NULL);
}

static void config_load__non_numeric_addr__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n" NODE1 ",\n"
			  "  { id = 2;\n"
			  "    addr = \"node-a\";\n"
			  "    port = 7471; }\n"
			  ");\n",
			  5, "nodes.addr \"node-a\" is not a numeric IPv4 or IPv6 address", NULL);
}

static void config_load__duplicate_addr_and_port__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = 1; addr = \"10.0.0.1\"; port = 7471; },\n"
			  "  { id = 2; addr = \"10.0.0.2\"; port = 7471; },\n"
			  "  { id = 3; addr = \"10.0.0.1\"; port = 7471; }\n"
			  ");\n",
			  5, "node 3 uses 10.0.0.1 port 7471", "like node 1 at line 3");
}

static void config_load__same_ipv6_addr_written_differently__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = 1; addr = \"fe80::2\"; port = 7471; },\n"
			  "  { id = 2; addr = \"FE80:0::2\"; port = 7471; }\n"
			  ");\n",
			  4, "node 2 uses FE80:0::2 port 7471", "like node 1 at line 3");
}

static void config_load__keepalive_timeout_equal_interval__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "# keepalive\n"
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  keepalive_interval_ms = 1000;\n"
			  "  keepalive_timeout_ms = 1000;\n"
			  "};\n" NODES1,
			  2, "keepalive_timeout_ms (1000) must exceed keepalive_interval_ms (1000)", NULL);
}

static void config_load__keepalive_timeout_below_interval__rejected_with_line(void **state)
{
	/* Only the interval is set: the default timeout (5000) is below it. */
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  keepalive_interval_ms = 6000;\n"
			  "};\n" NODES1,
			  1, "keepalive_timeout_ms (5000) must exceed keepalive_interval_ms (6000)", NULL);
}

static void config_load__backoff_max_below_initial__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  backoff_initial_ms = 2000;\n"
			  "  backoff_max_ms = 1000;\n"
			  "};\n" NODES1,
			  1, "backoff_max_ms (1000) is below backoff_initial_ms (2000)", NULL);
}

static void config_load__mailbox_below_minimum__rejected_with_line(void **state)
{
	char want[64];

	snprintf(want, sizeof(want), "cluster.mailbox_size 100 out of range %u..", MESH_MAILBOX_CFG_MIN);
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  mailbox_size = 100;\n"
			  "};\n" NODES1,
			  3, want, NULL);
}

static void config_load__syntax_error__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  qps_per_link = = 2;\n"
			  "};\n" NODES1,
			  3, "syntax error", NULL);
}

/* libconfig says only "syntax error" for a bare word: the message adds that strings need quotes. */
static void config_load__unquoted_string__syntax_error_says_quotes(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  transport = tcp;\n"
			  "};\n" NODES1,
			  3, "syntax error", "strings need quotes");
}

/* libconfig's "duplicate setting name" without the name: the message names it. */
static void config_load__repeated_key__named(void **state)
{
	expect_refused_at(*state,
			  "cluster = {\n"
			  "  name = \"lab\";\n"
			  "  transport = \"tcp\";\n"
			  "  transport = \"rdma\";\n"
			  "};\n" NODES1,
			  4, "duplicate setting transport", NULL);
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; qps_per_link = 2; name = \"b\"; };\n" NODES1,
			  1, "duplicate setting name", NULL);
}

/* A directory opens but cannot be read: named as one, not left to libconfig's scanner (which exits). */
static void config_load__directory__refused_naming_it(void **state)
{
	struct cfg_test *t = *state;
	const char *dir = getenv("TMPDIR");
	int ret;

	ret = config_load(dir && *dir ? dir : "/tmp", &t->cfg, t->err, sizeof(t->err));
	assert_int_equal(ret, -EISDIR);
	if (!strstr(t->err, "is a directory"))
		fail_msg("error \"%s\" does not say it is a directory", t->err);
	assert_null(t->cfg.nodes);
}

static void config_load__missing_file__enoent_naming_path(void **state)
{
	struct cfg_test *t = *state;
	char path[600];
	int ret;

	write_cfg(t, "");
	snprintf(path, sizeof(path), "%s.does-not-exist", t->path);
	ret = config_load(path, &t->cfg, t->err, sizeof(t->err));
	assert_int_equal(ret, -ENOENT);
	if (strncmp(t->err, path, strlen(path)) || !strstr(t->err, strerror(ENOENT)))
		fail_msg("error \"%s\" does not name %s and the errno", t->err, path);
	assert_null(t->cfg.nodes);
}

static void config_load__small_error_buffer__truncated_not_overrun(void **state)
{
	struct cfg_test *t = *state;
	char small[8 + 8];
	int ret;

	memset(small, 'X', sizeof(small));
	write_cfg(t, "cluster = { name = \"lab\"; qps = 1; };\n" NODES1);
	ret = config_load(t->path, &t->cfg, small, 8);
	assert_int_equal(ret, -MESH_ECONFIG);
	assert_int_equal(strlen(small), 7);
	for (size_t i = 8; i < sizeof(small); i++)
		assert_int_equal(small[i], 'X');
}

/* ---- config_dump ---------------------------------------------------------------------------- */

static char *dump_to_string(const struct mesh_config *cfg)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);

	assert_non_null(f);
	config_dump(f, cfg);
	assert_int_equal(fclose(f), 0);
	assert_non_null(buf);
	return buf;
}

static const char *const cluster_keys[] = {
	"name", "transport", "qps_per_link", "keepalive_interval_ms", "keepalive_timeout_ms", "connect_timeout_ms",
	"handshake_timeout_ms", "resume_timeout_ms", "backoff_initial_ms", "backoff_max_ms", "max_handshakes", "mailbox_size",
	"max_channels_per_link", "max_ring_mib_per_link", "max_channels_per_uid", "max_ring_bytes_per_uid", "socket_group",
	"polling", "poll_budget_us", "app_spin_us", "control_priority", "direct_receive", "app_send", "numa", "key_file",
	"metrics_listen", "log_level",
};

static void config_dump__no_config__names_every_key(void **state)
{
	char *s = dump_to_string(NULL);
	char want[64];

	(void)state;
	for (size_t i = 0; i < sizeof(cluster_keys) / sizeof(cluster_keys[0]); i++) {
		snprintf(want, sizeof(want), "cluster.%s ", cluster_keys[i]);
		if (!strstr(s, want))
			fail_msg("dump lacks %s:\n%s", want, s);
	}
	assert_non_null(strstr(s, "nodes.id "));
	assert_non_null(strstr(s, "nodes.addr "));
	assert_non_null(strstr(s, "nodes.port "));
	assert_null(strstr(s, "in force"));
	free(s);
}

/* The dump's line for KEY must contain WANT; the line is copied out of the dump, so nothing writes
 * into the buffer open_memstream handed back. */
static void assert_dump_line_has(const char *dump, const char *key, const char *want)
{
	const char *line = strstr(dump, key);
	char copy[512];

	assert_non_null(line);
	snprintf(copy, sizeof(copy), "%.*s", (int)strcspn(line, "\n"), line);
	if (!strstr(copy, want))
		fail_msg("%s line: %s", key, copy);
}

static void config_dump__loaded_config__shows_values_in_force(void **state)
{
	struct cfg_test *t = *state;
	char *s;

	assert_int_equal(load_text(t, valid_text), 0);
	s = dump_to_string(&t->cfg);
	assert_dump_line_has(s, "cluster.qps_per_link ", "in force: 4");
	assert_dump_line_has(s, "cluster.name ", "in force: \"lab\"");
	free(s);
}

/* A key with a fixed set of values shows them as its range, not "string". */
static void config_dump__enum_keys__range_lists_choices(void **state)
{
	char *s = dump_to_string(NULL);

	(void)state;
	assert_dump_line_has(s, "cluster.transport ", "range rdma|tcp|auto ");
	assert_dump_line_has(s, "cluster.log_level ", "range error|warn|info|debug ");
	assert_dump_line_has(s, "cluster.polling ", "range adaptive|busy|event ");
	free(s);
}

/* The table that prints the keys is the table that parses them: a file setting every printed key
 * to its printed default loads, and yields exactly those values. */
static void config_dump__every_printed_default__loads_back(void **state)
{
	struct cfg_test *t = *state;
	char *s = dump_to_string(NULL), *save = NULL, text[4096];
	size_t n = 0, keys = 0;
	int ret;

	n += (size_t)snprintf(text + n, sizeof(text) - n, "cluster = {\n");
	for (char *line = strtok_r(s, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char key[64], type[16], def[64];

		if (strncmp(line, "cluster.", 8))
			continue;
		assert_int_equal(sscanf(line, "cluster.%63s %15s default %63s", key, type, def), 3);
		if (!strcmp(def, "(none)")) {
			assert_string_equal(key, "name");
			snprintf(def, sizeof(def), "lab");
		}
		if (!strcmp(def, "\"\""))
			def[0] = '\0'; /* an empty default, printed quoted */
		if (!strcmp(type, "string") || !strcmp(type, "size"))
			n += (size_t)snprintf(text + n, sizeof(text) - n, "  %s = \"%s\";\n", key, def);
		else
			n += (size_t)snprintf(text + n, sizeof(text) - n, "  %s = %s;\n", key, def);
		assert_true(n < sizeof(text));
		keys++;
	}
	snprintf(text + n, sizeof(text) - n, "};\n" NODES1);
	free(s);
	assert_int_equal(keys, sizeof(cluster_keys) / sizeof(cluster_keys[0]));
	ret = load_text(t, text);
	if (ret)
		fail_msg("%s\n%s", t->err, text);
	assert_int_equal(t->cfg.qps_per_link, 2);
	assert_int_equal(t->cfg.mailbox_size, 4096);
	assert_int_equal(t->cfg.control_priority, 1);
	assert_string_equal(t->cfg.transport, "rdma");
}

#define T(f) cmocka_unit_test_setup_teardown(f, cfg_setup, cfg_teardown)

static void config_load__rails__addresses_per_rail_and_every_node_as_many(void **state)
{
	struct cfg_test *t = *state;
	int ret = load_text(t, "cluster = { name = \"lab\"; };\n"
			       "nodes = (\n"
			       "  { id = 1; addr = \"10.0.0.1\"; port = 7471; rails = [ \"10.1.0.1\", \"10.2.0.1\" ]; },\n"
			       "  { id = 2; addr = \"10.0.0.2\"; port = 7471; rails = [ \"10.1.0.2\", \"10.2.0.2\" ]; }\n"
			       ");\n");

	assert_int_equal(ret, 0);
	assert_int_equal(t->cfg.nodes[0].n_rails, 3);
	assert_string_equal(t->cfg.nodes[0].rail[0], "10.0.0.1");
	assert_string_equal(t->cfg.nodes[0].rail[2], "10.2.0.1");
	assert_string_equal(t->cfg.nodes[1].rail[1], "10.1.0.2");
}

static void config_load__no_rails__one_rail_the_address(void **state)
{
	struct cfg_test *t = *state;

	assert_int_equal(load_text(t, "cluster = { name = \"c\"; };\n" NODES1), 0);
	assert_int_equal(t->cfg.nodes[0].n_rails, 1);
	assert_string_equal(t->cfg.nodes[0].rail[0], "10.0.0.1");
}

static void config_load__rails_count_differs__rejected_naming_both_nodes(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = 1; addr = \"10.0.0.1\"; port = 7471; rails = [ \"10.1.0.1\" ]; },\n"
			  "  { id = 2; addr = \"10.0.0.2\"; port = 7471; }\n"
			  ");\n",
			  4, "node 2 has 1 rails, node 1 at line 3 has 2", NULL);
}

static void config_load__bad_rails__rejected_with_line(void **state)
{
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = 1; addr = \"10.0.0.1\"; port = 7471; rails = [ \"10.1.0.x\" ]; }\n"
			  ");\n",
			  3, "nodes.rails[0] is not a numeric IPv4 or IPv6 address", NULL);
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = 1; addr = \"10.0.0.1\"; port = 7471;\n"
			  "    rails = [ \"10.1.0.1\", \"10.2.0.1\", \"10.3.0.1\", \"10.4.0.1\" ]; }\n"
			  ");\n",
			  4, "nodes.rails lists 4 addresses; 1..3", NULL);
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = 1; addr = \"10.0.0.1\"; port = 7471; rails = [ \"10.0.0.1\" ]; }\n"
			  ");\n",
			  3, "node 1 has address 10.0.0.1 on two rails", NULL);
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = 1; addr = \"10.0.0.1\"; port = 7471; rails = [ \"10.1.0.1\" ]; },\n"
			  "  { id = 2; addr = \"10.0.0.2\"; port = 7471; rails = [ \"10.1.0.1\" ]; }\n"
			  ");\n",
			  4, "node 2 uses 10.1.0.1 port 7471, like node 1", NULL);
	expect_refused_at(*state,
			  "cluster = { name = \"lab\"; };\n"
			  "nodes = (\n"
			  "  { id = 1; addr = \"10.0.0.1\"; port = 7471; rails = \"10.1.0.1\"; }\n"
			  ");\n",
			  3, "nodes.rails must be a list", NULL);
}

static const struct CMUnitTest tests[] = {
	T(config_reload_check__limits_log_level_and_nodes__applied),
	T(config_reload_check__restart_keys_and_own_address__refused_naming_each),
	T(config_reload_check__this_node_removed__refused),
	T(config_load__valid_file__every_value_parsed_and_defaults_applied),
	T(config_load__valid_file__nodes_sorted_by_id_with_lines),
	T(config_node_find__loaded_ids__found_and_others_null),
	T(config_load__rails__addresses_per_rail_and_every_node_as_many),
	T(config_load__no_rails__one_rail_the_address),
	T(config_load__rails_count_differs__rejected_naming_both_nodes),
	T(config_load__bad_rails__rejected_with_line),
	T(config_load__minimal_file__all_defaults),
	T(config_free__after_failure_and_twice__safe),
	T(config_load__unknown_cluster_key__rejected_with_line),
	T(config_load__unknown_top_level_key__rejected_with_line),
	T(config_load__unknown_node_key__rejected_with_line),
	T(config_load__duplicate_node_id__rejected_with_line),
	T(config_load__node_id_70000__rejected_with_line),
	T(config_load__negative_node_id__rejected_with_line),
	T(config_load__port_0__rejected_with_line),
	T(config_load__port_65536__rejected_with_line),
	T(config_load__qps_per_link_0__rejected_with_line),
	T(config_load__qps_per_link_17__rejected_with_line),
	T(config_load__qps_per_link_16__accepted),
	T(config_load__transport_foo__rejected_with_line),
	T(config_load__log_level_loud__rejected_with_choices),
	T(config_load__polling_spin__rejected_with_choices),
	T(config_load__direct_receive_maybe__rejected_with_choices),
	T(config_load__poll_budget_too_large__rejected_with_range),
	T(config_load__uid_quotas_and_group__loaded),
	T(config_load__ring_bytes_per_uid_below_1mib__rejected_with_range),
	T(config_load__ring_bytes_per_uid_beyond_32_bits_without_l__rejected_naming_the_fix),
	T(config_load__ring_bytes_per_uid_bad_suffix__rejected_with_line),
	T(config_load__busy_polling__loaded),
	T(config_load__numa_each_form__mode_parsed),
	T(config_load__numa_near__rejected_with_choices),
	T(config_load__node_numa__overrides_cluster_for_that_node_only),
	T(config_load__node_numa_garbage__rejected_with_line),
	T(config_load__metrics_listen_each_form__accepted_and_parsed),
	T(config_listen_parse__no_address__loopback_only),
	T(config_load__metrics_listen_bad__rejected_with_line_and_why),
	T(config_load__node_metrics_listen__overrides_cluster_for_that_node_only),
	T(config_load__numa_64__rejected_with_range),
	T(config_load__numa_negative__rejected_with_line),
	T(config_load__numa_float__rejected_with_line),
	T(config_load__string_for_integer__rejected_with_line),
	T(config_load__float_for_integer__rejected_with_line),
	T(config_load__string_for_node_port__rejected_with_line),
	T(config_load__integer_for_name__rejected_with_line),
	T(config_load__name_too_long__rejected_with_line),
	T(config_load__missing_cluster_name__rejected_with_line),
	T(config_load__missing_cluster__rejected_naming_it),
	T(config_load__missing_nodes__rejected_naming_it),
	T(config_load__empty_nodes__rejected_with_line),
	T(config_load__nodes_not_a_list__rejected_with_line),
	T(config_load__node_missing_port__rejected_with_line),
	T(config_load__non_numeric_addr__rejected_with_line),
	T(config_load__duplicate_addr_and_port__rejected_with_line),
	T(config_load__same_ipv6_addr_written_differently__rejected_with_line),
	T(config_load__keepalive_timeout_equal_interval__rejected_with_line),
	T(config_load__keepalive_timeout_below_interval__rejected_with_line),
	T(config_load__backoff_max_below_initial__rejected_with_line),
	T(config_load__mailbox_below_minimum__rejected_with_line),
	T(config_load__syntax_error__rejected_with_line),
	T(config_load__unquoted_string__syntax_error_says_quotes),
	T(config_load__repeated_key__named),
	T(config_load__directory__refused_naming_it),
	T(config_load__missing_file__enoent_naming_path),
	T(config_load__small_error_buffer__truncated_not_overrun),
	T(config_dump__no_config__names_every_key),
	T(config_dump__loaded_config__shows_values_in_force),
	T(config_dump__enum_keys__range_lists_choices),
	T(config_dump__every_printed_default__loads_back),
};

UNIT_MAIN("config", tests, NULL, NULL)
