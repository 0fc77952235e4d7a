/*
 * The metrics of meshd (node/meshd/metrics.h): label values escaped as the text format wants, the
 * renderer's text well formed (every sample under its family's HELP and TYPE, counters ending in
 * _total) and true to the mesh, and the counters added for it counted where the events happen:
 * link downs and failed attempts by reason (link_fail), keepalive misses per rail, over a mesh
 * driven on the fake transport.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <mesh/mesh.h>

#include "log.h"
#include "mesh_harness.h"
#include "metrics.h"
#include "unit_main.h"
#include "util.h"

static const uint16_t ids123[] = {1, 2, 3};

/* The text of the mesh, NUL-terminated; free it. */
static char *render(struct mt *t)
{
	struct metrics_buf b = {0};
	struct metrics_extra x = {.ctl_errors = 7, .http_scrapes = 3, .http_renders = 2};
	size_t len;
	char *s;

	assert_int_equal(metrics_render(&t->m, &x, &b), 0);
	s = metrics_buf_take(&b, &len);
	assert_non_null(s);
	assert_int_equal(strlen(s), len);
	return s;
}

static void assert_has(const char *text, const char *line)
{
	char want[512];

	snprintf(want, sizeof(want), "\n%s\n", line);
	if (!strstr(text, want))
		fail_msg("the metrics lack the line\n  %s\nin:\n%s", line, text);
}

static void metrics_buf_label_value__quote_backslash_newline__escaped(void **state)
{
	struct metrics_buf b = {0};

	(void)state;
	metrics_buf_label_value(&b, "a\"b\\c\nd\te");
	assert_false(b.oom);
	assert_string_equal(b.s, "a\\\"b\\\\c\\nd\te");
	metrics_buf_label_value(&b, "");
	assert_string_equal(b.s, "a\\\"b\\\\c\\nd\te");
	metrics_buf_free(&b);
	assert_null(b.s);
	metrics_buf_free(NULL);
}

static void metrics_buf_printf__beyond_first_block__grows_intact(void **state)
{
	struct metrics_buf b = {0};
	char big[10000];
	size_t len;
	char *s;

	(void)state;
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	metrics_buf_printf(&b, "<%s>", big);
	metrics_buf_printf(&b, "%d", 42);
	s = metrics_buf_take(&b, &len);
	assert_int_equal(len, sizeof(big) - 1 + 4);
	assert_int_equal(s[0], '<');
	assert_int_equal(s[sizeof(big)], '>');
	assert_string_equal(s + sizeof(big) + 1, "42");
	assert_null(b.s);
	free(s);
}

static void metrics_render__cluster_name_with_quote_backslash_newline__escaped_in_node_info(void **state)
{
	struct mt *t = *state;
	char *s, want[128];

	mt_init(t, 2, ids123, 3);
	snprintf(t->cfg.cluster_name, sizeof(t->cfg.cluster_name), "q\"b\\s\nn");
	s = render(t);
	snprintf(want, sizeof(want), "rdmamesh_node_info{node=\"2\",cluster=\"q\\\"b\\\\s\\nn\",version=\"%d.%d\"} 1",
		 MESH_VERSION_MAJOR, MESH_VERSION_MINOR);
	assert_has(s, want);
	/* No raw newline inside a sample: every line is a comment or a sample of ours. */
	for (const char *p = s; *p; p = strchr(p, '\n') + 1) {
		if (strncmp(p, "# ", 2) && strncmp(p, "rdmamesh_", 9) && strncmp(p, "process_", 8))
			fail_msg("a line that is neither a comment nor a sample: %.60s", p);
		assert_non_null(strchr(p, '\n'));
	}
	free(s);
	mt_finish(t);
}

/* Every sample's name is the family last declared by TYPE, which follows its HELP (a histogram's
 * with _bucket, _sum or _count after it); each family is declared once; counters end in _total;
 * every name has the prefix, but the process_* families of the client libraries. */
static void metrics_render__every_sample__under_its_help_and_type(void **state)
{
	struct mt *t = *state;
	char family[128] = "", ftype[32] = "", seen[8192] = " ";
	char *s, *save = NULL;

	mt_init(t, 2, ids123, 3);
	tick(t);
	drive_to_up(t, lk(t, 1));
	s = render(t);
	for (char *line = strtok_r(s, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		char name[128], type[32], key[140];

		if (sscanf(line, "# HELP %127s", name) == 1) {
			snprintf(key, sizeof(key), " %s ", name);
			if (strstr(seen, key))
				fail_msg("family %s declared twice", name);
			assert_true(strlen(seen) + strlen(key) < sizeof(seen));
			strcat(seen, key + 1);
			snprintf(family, sizeof(family), "%s", name);
			if (strncmp(name, "rdmamesh_", 9) && strncmp(name, "process_", 8))
				fail_msg("family %s: neither rdmamesh_ nor process_", name);
			continue;
		}
		if (sscanf(line, "# TYPE %127s %31s", name, type) == 2) {
			assert_string_equal(name, family);
			if (!strcmp(type, "counter"))
				assert_string_equal(name + strlen(name) - 6, "_total");
			else if (strcmp(type, "histogram"))
				assert_string_equal(type, "gauge");
			snprintf(ftype, sizeof(ftype), "%s", type);
			continue;
		}
		assert_true(line[0] != '#');
		snprintf(name, sizeof(name), "%.*s", (int)strcspn(line, "{ "), line);
		if (!strcmp(ftype, "histogram") && !strncmp(name, family, strlen(family)) &&
		    (!strcmp(name + strlen(family), "_bucket") || !strcmp(name + strlen(family), "_sum") ||
		     !strcmp(name + strlen(family), "_count")))
			continue;
		if (strcmp(name, family))
			fail_msg("sample %s under family %s", line, family);
	}
	free(s);
	mt_finish(t);
}

static void metrics_render__one_link_up__link_up_state_and_counts(void **state)
{
	struct mt *t = *state;
	char *s;

	mt_init(t, 2, ids123, 3);
	tick(t);
	drive_to_up(t, lk(t, 1));
	s = render(t);
	assert_has(s, "rdmamesh_peers 2");
	assert_has(s, "rdmamesh_links_up 1");
	assert_has(s, "rdmamesh_control_errors_total 7");
	assert_has(s, "rdmamesh_metrics_scrapes_total 3");
	assert_has(s, "rdmamesh_metrics_renders_total 2");
	assert_has(s, "rdmamesh_link_up{peer=\"1\"} 1");
	assert_has(s, "rdmamesh_link_up{peer=\"3\"} 0");
	assert_has(s, "rdmamesh_link_state{peer=\"1\",state=\"UP\"} 1");
	assert_has(s, "rdmamesh_link_state{peer=\"1\",state=\"DOWN\"} 0");
	assert_has(s, "rdmamesh_link_state{peer=\"3\",state=\"DOWN\"} 1");
	assert_has(s, "rdmamesh_link_rail_up{peer=\"1\",rail=\"0\"} 1");
	assert_has(s, "rdmamesh_link_ups_total{peer=\"1\"} 1");
	assert_has(s, "rdmamesh_link_info{peer=\"1\",addr=\"10.0.0.1\",transport=\"fake\"} 1");
	assert_has(s, "rdmamesh_link_bytes_total{peer=\"1\",direction=\"tx\"} 0");
	/* The link's buffers and mailbox are registered: the gauge counts them. */
	assert_non_null(strstr(s, "\nrdmamesh_memory_registered_bytes{transport=\"fake\"} "));
	assert_null(strstr(s, "\nrdmamesh_memory_registered_bytes{transport=\"fake\"} 0\n"));
	/* Nothing failed: every reason is there at 0, for every link, so that increase() sees the
	 * first one. */
	for (int r = 0; r < METRICS_REASONS; r++)
		for (uint32_t peer = 1; peer <= 3; peer += 2) {
			char want[160];

			snprintf(want, sizeof(want), "rdmamesh_link_downs_total{peer=\"%u\",reason=\"%s\"} 0", peer,
				 metrics_reason_name((enum metrics_reason)r));
			assert_has(s, want);
			snprintf(want, sizeof(want), "rdmamesh_link_handshake_failures_total{peer=\"%u\",reason=\"%s\"} 0",
				 peer, metrics_reason_name((enum metrics_reason)r));
			assert_has(s, want);
		}
	/* meshd as a process: what every client library exports. */
	assert_non_null(strstr(s, "\n# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes "));
	assert_null(strstr(s, "\nprocess_resident_memory_bytes 0\n"));
	assert_non_null(strstr(s, "\nprocess_cpu_seconds_total "));
	assert_non_null(strstr(s, "\nprocess_open_fds "));
	assert_non_null(strstr(s, "\nprocess_max_fds "));
	assert_non_null(strstr(s, "\nprocess_start_time_seconds "));
	free(s);
	mt_finish(t);
}

static void link_metrics__keepalive_timeout__down_counted_as_keepalive(void **state)
{
	struct mt *t = *state;
	struct link *l;
	char *s;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	tick_at(t, util_now_ms() + t->cfg.keepalive_timeout_ms + 1);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_int_equal(l->metrics.downs[METRICS_REASON_KEEPALIVE], 1);
	for (int r = 0; r < METRICS_REASONS; r++)
		assert_int_equal(l->metrics.hs_failures[r], 0);
	s = render(t);
	assert_has(s, "rdmamesh_link_downs_total{peer=\"1\",reason=\"keepalive\"} 1");
	assert_has(s, "rdmamesh_link_up{peer=\"1\"} 0");
	free(s);
	mt_finish(t);
}

static void link_metrics__goodbye__down_counted_as_shutdown(void **state)
{
	struct mt *t = *state;
	struct link *l;
	PeerMsg m = PEER_MSG__INIT;
	Goodbye g = GOODBYE__INIT;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	g.reason = MESH_ESHUTDOWN;
	m.body_case = PEER_MSG__BODY_GOODBYE;
	m.goodbye = &g;
	peer_send(t, l, &m);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_int_equal(l->metrics.downs[METRICS_REASON_SHUTDOWN], 1);
	assert_int_equal(l->metrics.downs[METRICS_REASON_KEEPALIVE], 0);
	mt_finish(t);
}

static void link_metrics__handshake_timeout__failure_counted_not_down(void **state)
{
	struct mt *t = *state;
	struct link *l;
	char *s;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	establish_qp(t, l, 0);
	tick_at(t, util_now_ms() + t->cfg.handshake_timeout_ms + 1);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_int_equal(l->metrics.hs_failures[METRICS_REASON_HANDSHAKE_TIMEOUT], 1);
	for (int r = 0; r < METRICS_REASONS; r++)
		assert_int_equal(l->metrics.downs[r], 0);
	s = render(t);
	assert_has(s, "rdmamesh_link_handshake_failures_total{peer=\"1\",reason=\"handshake_timeout\"} 1");
	assert_has(s, "rdmamesh_link_handshake_failures_total{peer=\"1\",reason=\"no_answer\"} 0");
	assert_has(s, "rdmamesh_link_downs_total{peer=\"1\",reason=\"handshake_timeout\"} 0");
	free(s);
	mt_finish(t);
}

static void link_metrics__bad_hello__failure_counted_as_mismatch(void **state)
{
	struct mt *t = *state;
	struct link *l;
	Hello h;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	establish_qp(t, l, 0);
	establish_qp(t, l, 1);
	h = peer_hello(t, l);
	h.qp_count = 5;
	peer_send_hello(t, l, &h);
	assert_int_equal(link_state(l), LINK_STATE_DOWN_);
	assert_int_equal(l->metrics.hs_failures[METRICS_REASON_MISMATCH], 1);
	mt_finish(t);
}

/* A keepalive not acked when the next goes out is a miss; an ack in time is none; an ack of a
 * keepalive never sent changes nothing. */
static void link_metrics__keepalive_unanswered__miss_counted(void **state)
{
	struct mt *t = *state;
	struct link *l;
	uint64_t t0;
	KeepaliveAck a = KEEPALIVE_ACK__INIT;
	PeerMsg m = PEER_MSG__INIT;
	char *s;

	t->peer_feat_off = MESH_FEAT_KA_WRITE; /* keepalive messages and their acks */
	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	t0 = util_now_ms();
	tick_at(t, t0); /* keepalive 1 */
	assert_true(l->metrics.ka_sent[0] == l->ka_seq);
	assert_int_equal(l->metrics.ka_misses[0], 0);
	tick_at(t, t0 + t->cfg.keepalive_interval_ms + 1); /* keepalive 2: 1 was not acked */
	assert_int_equal(l->metrics.ka_misses[0], 1);
	a.seq = l->ka_seq;
	a.sent_us = util_now_us();
	m.body_case = PEER_MSG__BODY_KEEPALIVE_ACK;
	m.keepalive_ack = &a;
	peer_send(t, l, &m);
	tick_at(t, t0 + 2 * t->cfg.keepalive_interval_ms + 2); /* keepalive 3: 2 was acked */
	assert_int_equal(l->metrics.ka_misses[0], 1);
	a.seq = l->ka_seq + 1000; /* never sent */
	peer_send(t, l, &m);
	tick_at(t, t0 + 3 * t->cfg.keepalive_interval_ms + 3); /* keepalive 4: 3 was not acked */
	assert_int_equal(link_state(l), LINK_STATE_UP_);
	assert_int_equal(l->metrics.ka_misses[0], 2);
	s = render(t);
	assert_has(s, "rdmamesh_link_keepalive_misses_total{peer=\"1\",rail=\"0\"} 2");
	free(s);
	mt_finish(t);
}

/* A sample goes into the first bucket whose bound is at least the sample: a bound itself into its
 * own bucket, one microsecond more into the next, beyond the last into +Inf alone. */
static void metrics_rtt_bucket__bounds_and_beyond__first_bound_not_below(void **state)
{
	(void)state;
	assert_int_equal(metrics_rtt_bounds_us[0], 10);
	assert_int_equal(metrics_rtt_bounds_us[METRICS_RTT_BUCKETS - 1], 1000000);
	assert_int_equal(metrics_rtt_bucket(0), 0);
	for (uint32_t k = 0; k < METRICS_RTT_BUCKETS; k++) {
		if (k)
			assert_true(metrics_rtt_bounds_us[k] > metrics_rtt_bounds_us[k - 1]);
		assert_int_equal(metrics_rtt_bucket(metrics_rtt_bounds_us[k]), k);
		assert_int_equal(metrics_rtt_bucket(metrics_rtt_bounds_us[k] + 1), k + 1);
	}
	assert_int_equal(metrics_rtt_bucket(UINT64_MAX), METRICS_RTT_BUCKETS);
}

/* The value of the sample line that starts with prefix (up to the space before the value). */
static double sample_value(const char *text, const char *prefix)
{
	char want[256];
	const char *p;

	snprintf(want, sizeof(want), "\n%s ", prefix);
	p = strstr(text, want);
	if (!p)
		fail_msg("no sample %s", prefix);
	return strtod(p + strlen(want), NULL);
}

/* The histogram's buckets are cumulative (each at least the one before), +Inf and _count are the
 * number of samples and _sum their total, per peer and rail; a link that never measured one has
 * every bucket at 0. */
static void metrics_render__rtt_samples__cumulative_buckets_sum_and_count(void **state)
{
	static const uint64_t us[] = {7, 10, 11, 3000, 2000000};
	struct mt *t = *state;
	struct link *l;
	double prev = 0;
	char *s;

	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	for (size_t i = 0; i < ARRAY_SIZE(us); i++)
		link_metrics_rtt(&l->metrics, 0, us[i]);
	link_metrics_rtt(&l->metrics, MESH_RAILS_MAX, 5); /* no such rail: nothing */
	s = render(t);
	assert_has(s, "# TYPE rdmamesh_link_rtt_seconds histogram");
	assert_has(s, "rdmamesh_link_rtt_seconds_bucket{peer=\"1\",rail=\"0\",le=\"1e-05\"} 2");
	assert_has(s, "rdmamesh_link_rtt_seconds_bucket{peer=\"1\",rail=\"0\",le=\"2.5e-05\"} 3");
	assert_has(s, "rdmamesh_link_rtt_seconds_bucket{peer=\"1\",rail=\"0\",le=\"0.0025\"} 3");
	assert_has(s, "rdmamesh_link_rtt_seconds_bucket{peer=\"1\",rail=\"0\",le=\"0.005\"} 4");
	assert_has(s, "rdmamesh_link_rtt_seconds_bucket{peer=\"1\",rail=\"0\",le=\"1\"} 4");
	assert_has(s, "rdmamesh_link_rtt_seconds_bucket{peer=\"1\",rail=\"0\",le=\"+Inf\"} 5");
	assert_has(s, "rdmamesh_link_rtt_seconds_count{peer=\"1\",rail=\"0\"} 5");
	assert_has(s, "rdmamesh_link_rtt_seconds_sum{peer=\"1\",rail=\"0\"} 2.003028");
	for (uint32_t k = 0; k < METRICS_RTT_BUCKETS; k++) {
		char prefix[128];
		double v;

		snprintf(prefix, sizeof(prefix), "rdmamesh_link_rtt_seconds_bucket{peer=\"1\",rail=\"0\",le=\"%g\"}",
			 metrics_rtt_bounds_us[k] / 1e6);
		v = sample_value(s, prefix);
		assert_true(v >= prev);
		prev = v;
		snprintf(prefix, sizeof(prefix), "rdmamesh_link_rtt_seconds_bucket{peer=\"3\",rail=\"0\",le=\"%g\"}",
			 metrics_rtt_bounds_us[k] / 1e6);
		assert_true(sample_value(s, prefix) == 0);
	}
	assert_has(s, "rdmamesh_link_rtt_seconds_count{peer=\"3\",rail=\"0\"} 0");
	assert_has(s, "rdmamesh_link_rtt_seconds_sum{peer=\"3\",rail=\"0\"} 0.000000");
	free(s);
	mt_finish(t);
}

static uint64_t rtt_count(const struct link *l, uint32_t r)
{
	uint64_t n = 0;

	for (uint32_t k = 0; k <= METRICS_RTT_BUCKETS; k++)
		n += l->metrics.rtt[r].n[k];
	return n;
}

/* Each ack of a keepalive we sent is one sample, from the time it echoes; an ack repeated, one of
 * a keepalive never sent and one from the future add none. */
static void link_metrics__keepalive_acks__one_rtt_sample_per_keepalive_sent(void **state)
{
	struct mt *t = *state;
	struct link *l;
	uint64_t t0, now;
	KeepaliveAck a = KEEPALIVE_ACK__INIT;
	PeerMsg m = PEER_MSG__INIT;
	uint32_t k300 = metrics_rtt_bucket(300000);

	t->peer_feat_off = MESH_FEAT_KA_WRITE; /* keepalive messages and their acks */
	mt_init(t, 2, ids123, 3);
	l = lk(t, 1);
	tick(t);
	drive_to_up(t, l);
	t0 = util_now_ms();
	tick_at(t, t0); /* keepalive 1 */
	m.body_case = PEER_MSG__BODY_KEEPALIVE_ACK;
	m.keepalive_ack = &a;
	a.seq = l->ka_seq;
	now = util_now_us();
	a.sent_us = now - 300000; /* 300 ms ago: bucket le=0.5, later ones if this thread stalled */
	peer_send(t, l, &m);
	assert_int_equal(rtt_count(l, 0), 1);
	for (uint32_t k = 0; k < k300; k++)
		assert_int_equal(l->metrics.rtt[0].n[k], 0);
	assert_true(l->metrics.rtt[0].sum_us >= 300000 && l->metrics.rtt[0].sum_us <= util_now_us() - a.sent_us);
	peer_send(t, l, &m); /* the same ack again */
	a.seq = l->ka_seq + 1000; /* never sent */
	peer_send(t, l, &m);
	assert_int_equal(rtt_count(l, 0), 1);
	tick_at(t, t0 + t->cfg.keepalive_interval_ms + 1); /* keepalive 2 */
	a.seq = l->ka_seq;
	a.sent_us = util_now_us() + 10000000; /* a clock the peer made up */
	peer_send(t, l, &m);
	assert_true(l->metrics.ka_acked[0] == l->ka_seq);
	assert_int_equal(rtt_count(l, 0), 1);
	tick_at(t, t0 + 2 * t->cfg.keepalive_interval_ms + 2); /* keepalive 3, acked at once */
	a.seq = l->ka_seq;
	a.sent_us = util_now_us();
	peer_send(t, l, &m);
	assert_int_equal(rtt_count(l, 0), 2);
	/* An echo from the dawn of the clock: +Inf, and the sum grows by the cap alone. */
	tick_at(t, t0 + 3 * t->cfg.keepalive_interval_ms + 3);
	a.seq = l->ka_seq;
	a.sent_us = 0;
	now = l->metrics.rtt[0].sum_us;
	peer_send(t, l, &m);
	assert_int_equal(rtt_count(l, 0), 3);
	assert_int_equal(l->metrics.rtt[0].n[METRICS_RTT_BUCKETS], 1);
	assert_true(l->metrics.rtt[0].sum_us - now <= METRICS_RTT_MAX_US);
	mt_finish(t);
}

static void metrics_proc_stat_parse__command_with_parens_and_spaces__fields_after_it(void **state)
{
	/* proc(5): pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt
	 * utime stime cutime cstime priority nice num_threads itrealvalue starttime vsize rss ... */
	static const char stat[] = "4242 (me) (sh) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 150 0 0 20 0 "
				   "5 0 12345 104857600 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0\n";
	struct metrics_proc p;

	(void)state;
	assert_int_equal(metrics_proc_stat_parse(stat, 100, 4096, 1700000000, &p), 0);
	assert_true(p.cpu_seconds == 4.0);
	assert_true(p.start_time_s == 1700000000 + 123.45);
	assert_true(p.virtual_bytes == 104857600);
	assert_true(p.resident_bytes == 2048 * 4096);
	assert_int_equal(metrics_proc_stat_parse("4242 (me S 1 2 3", 100, 4096, 0, &p), -EINVAL);
	assert_int_equal(metrics_proc_stat_parse("4242 (me) S 1 2 3 4 5 6 7 8 9 10 11 12\n", 100, 4096, 0, &p),
			 -EINVAL);
	assert_int_equal(metrics_proc_stat_parse("4242 (me) S 1 2 3 4 5 6 7 8 9 10 x 12 13 14 15 16 17 18 19 20 21",
						 100, 4096, 0, &p),
			 -EINVAL);
	assert_int_equal(metrics_proc_stat_parse(stat, 0, 4096, 0, &p), -EINVAL);
}

/* /healthz: "ok" when every link is UP, else how many are not and one line each (peer, state,
 * last error), an error with a newline kept on its line. */
static void metrics_health_render__links_not_up__listed_one_line_each(void **state)
{
	struct mt *t = *state;
	struct metrics_buf b = {0};
	size_t lines = 0;

	mt_init(t, 3, ids123, 3); /* node 3 dials both */
	tick(t);
	snprintf(lk(t, 2)->last_error, sizeof(lk(t, 2)->last_error), "no route\nto host");
	assert_int_equal(metrics_health_render(&t->m, &b), 2);
	assert_non_null(strstr(b.s, "2 of 2 links not UP\n"));
	assert_non_null(strstr(b.s, "\npeer 2 DOWN: no route to host\n"));
	assert_non_null(strstr(b.s, "\npeer 1 "));
	metrics_buf_free(&b);
	drive_to_up(t, lk(t, 1));
	assert_int_equal(metrics_health_render(&t->m, &b), 1);
	for (const char *p = b.s; (p = strchr(p, '\n')); p++)
		lines++;
	assert_int_equal(lines, 2);
	assert_non_null(strstr(b.s, "1 of 2 links not UP\npeer 2 "));
	assert_null(strstr(b.s, "peer 1 "));
	metrics_buf_free(&b);
	drive_to_up(t, lk(t, 2));
	assert_int_equal(metrics_health_render(&t->m, &b), 0);
	assert_string_equal(b.s, "ok\n");
	metrics_buf_free(&b);
	mt_finish(t);
}

static void metrics_reason_of__codes__fixed_names(void **state)
{
	(void)state;
	assert_string_equal(metrics_reason_name(metrics_reason_of(-MESH_EKEEPALIVE)), "keepalive");
	assert_string_equal(metrics_reason_name(metrics_reason_of(-MESH_EAUTH)), "auth");
	assert_string_equal(metrics_reason_name(metrics_reason_of(-ECONNRESET)), "connection");
	assert_string_equal(metrics_reason_name(metrics_reason_of(-ETIMEDOUT)), "no_answer");
	assert_string_equal(metrics_reason_name(metrics_reason_of(-12345)), "other");
	assert_string_equal(metrics_reason_name(metrics_reason_of(0)), "other");
	assert_string_equal(metrics_reason_name((enum metrics_reason)99), "other");
	for (int r = 0; r < METRICS_REASONS; r++)
		assert_non_null(metrics_reason_name((enum metrics_reason)r));
}

#define T(f) cmocka_unit_test_setup_teardown(f, mt_setup, mt_teardown)
static const struct CMUnitTest tests[] = {
	T(metrics_buf_label_value__quote_backslash_newline__escaped),
	T(metrics_buf_printf__beyond_first_block__grows_intact),
	T(metrics_render__cluster_name_with_quote_backslash_newline__escaped_in_node_info),
	T(metrics_render__every_sample__under_its_help_and_type),
	T(metrics_render__one_link_up__link_up_state_and_counts),
	T(link_metrics__keepalive_timeout__down_counted_as_keepalive),
	T(link_metrics__goodbye__down_counted_as_shutdown),
	T(link_metrics__handshake_timeout__failure_counted_not_down),
	T(link_metrics__bad_hello__failure_counted_as_mismatch),
	T(link_metrics__keepalive_unanswered__miss_counted),
	T(metrics_reason_of__codes__fixed_names),
	T(metrics_rtt_bucket__bounds_and_beyond__first_bound_not_below),
	T(metrics_render__rtt_samples__cumulative_buckets_sum_and_count),
	T(link_metrics__keepalive_acks__one_rtt_sample_per_keepalive_sent),
	T(metrics_proc_stat_parse__command_with_parens_and_spaces__fields_after_it),
	T(metrics_health_render__links_not_up__listed_one_line_each),
};

static int group_setup(void **state)
{
	(void)state;
	log_set_level(getenv("MESH_TEST_QUIET") ? LOG_LVL_ERROR : LOG_LVL_DEBUG);
	return 0;
}

UNIT_MAIN("metrics", tests, group_setup, NULL)
