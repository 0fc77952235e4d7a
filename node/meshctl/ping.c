/*
 * `meshctl ping NODE`: meshd probes each UP rail of the link to NODE (CTL_OP_PING) and streams the
 * answers on the same connection; this prints a line per answer, then per rail what ping(8) sums up
 * (probes sent, received, loss, rtt min/avg/max/mdev), as text or JSON. Ctrl-C ends the stream and
 * prints the summary so far.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <mesh/mesh.h>

#include "meshctl.h"

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

/* The head of the output, from meshd's first answer (which rails it pings): a line of text, or the
 * JSON object opened up to its "replies" array. */
static void ping_head(struct out *o, const struct ping_args *pa, const CtlReply *r, uint32_t rails)
{
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
}

/* The answers as they come, each printed and counted in st[its rail], until meshd says done or an
 * interrupt: 0 (interrupted too), or 2 when meshd broke off (said). *received counts the answered
 * probes. */
static int ping_stream(int fd, const char *path, struct out *o, const struct ping_args *pa, uint32_t rails,
		       struct ping_stats *st, uint32_t *received)
{
	int status = 0, ret;
	bool done = false;
	CtlReply *r;

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
				(*received)++;
			}
			ping_line(o, pa->node, p);
		}
		ctl_reply__free_unpacked(r, NULL);
		if (status)
			break;
	}
	return status;
}

/* The tail: per rail pinged, its summary; the JSON object closed. */
static void ping_tail(struct out *o, const struct ping_args *pa, uint32_t rails, const struct ping_stats *st)
{
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
}

/* `meshctl ping NODE`: meshd probes each rail of the link (CTL_OP_PING) and streams the answers.
 * Returns 0 when an answer came, 1 when none did (or meshd refused: the node is unknown, its link
 * DOWN), 2 when meshd cannot be reached or broke off. */
int cmd_ping(const char *path, struct out *o, const struct ping_args *pa)
{
	CtlRequest req = CTL_REQUEST__INIT;
	struct ping_stats st[MESH_RAILS_MAX] = {{0}};
	uint32_t rails = 0, received = 0;
	struct timeval tv;
	int fd, status = 0, ret;
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
	ping_head(o, pa, r, rails);
	ctl_reply__free_unpacked(r, NULL);
	status = ping_stream(fd, path, o, pa, rails, st, &received);
	close(fd); /* interrupted: meshd stops the ping */
	ping_tail(o, pa, rails, st);
	return status ? status : received ? 0 : 1;
}
