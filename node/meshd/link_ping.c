/*
 * `meshctl ping` (ping.h): rounds of probes to a peer's meshd, one probe per rail and round, each a
 * Keepalive message tagged MESH_PING_TAG on the rail's first QP, timed from its post to the arrival
 * of the peer's KeepaliveAck. A probe goes only where channel data could go too: never into the send
 * slots or send-queue entries kept for control messages, so a ping cannot hold up a channel.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <mesh/mesh.h>

#include "link_internal.h"
#include "mesh.h"
#include "ping.h"
#include "util.h"

const char *ping_status_text(int status)
{
	switch (status) {
	case 0:
		return "";
	case -ETIMEDOUT:
		return "no answer within the timeout";
	case -ENETDOWN:
		return "the link is not UP on this rail";
	case -ENOBUFS:
		return "not sent: the link's send slots are busy (channels first)";
	default:
		return mesh_strerror(status);
	}
}

void ping_init(struct mesh *m)
{
	for (uint32_t i = 0; i < MESH_PING_MAX; i++)
		m->pings.p[i].fd = -1;
}

static void ping_free(struct ping *p)
{
	memset(p, 0, sizeof(*p));
	p->fd = -1;
}

/* Tells the client; one that cannot take it loses its ping (false). */
static bool ping_report(struct mesh *m, struct ping *p, uint32_t rail, uint32_t seq, int status, uint64_t rtt_us,
			bool done)
{
	struct ping_result res = {.rail = rail, .seq = seq, .status = status, .rtt_us = rtt_us, .done = done};

	if (!m->pings.ops.report || m->pings.ops.report(m->pings.ops.ctx, p->fd, &res)) {
		ping_free(p);
		return false;
	}
	return true;
}

/* Every round sent and every probe answered or given up: the last report. */
static void ping_maybe_done(struct mesh *m, struct ping *p)
{
	if (p->sent < p->count)
		return;
	for (uint32_t r = 0; r < MESH_RAILS_MAX; r++)
		if (p->n_flight[r])
			return;
	ping_report(m, p, 0, 0, 0, 0, true);
	ping_free(p);
}

static int ping_refuse(struct mesh *m, const char **why, int err, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int ping_refuse(struct mesh *m, const char **why, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m->pings.why, sizeof(m->pings.why), fmt, ap);
	va_end(ap);
	*why = m->pings.why;
	return err;
}

int ping_start(struct mesh *m, int fd, const struct ping_request *rq, uint32_t *rails, const char **why)
{
	struct link *l = mesh_link_find(m, rq->peer);
	struct ping *p = NULL;
	uint32_t mine = 0, mask = 0;

	if (rq->peer == m->self->id)
		return ping_refuse(m, why, -EINVAL, "node %u is this node", rq->peer);
	if (!l)
		return ping_refuse(m, why, -EHOSTUNREACH, "node %u is not in the configuration (meshctl links lists the nodes)",
				   rq->peer);
	if (link_state(l) != LINK_STATE_UP_)
		return ping_refuse(m, why, -ENETUNREACH, "the link to node %u is %s (meshctl links %u says why)", rq->peer,
				   link_state_name(link_state(l)), rq->peer);
	if (!(l->features & MESH_FEAT_KEEPALIVE))
		return ping_refuse(m, why, -EOPNOTSUPP,
				   "node %u's meshd answers no probes: it did not agree keepalives (an older version?)", rq->peer);
	if (rq->rail >= 0 && (uint32_t)rq->rail >= m->n_rails)
		return ping_refuse(m, why, -EINVAL, "rail %d: this node has %u rail%s", rq->rail, m->n_rails,
				   m->n_rails == 1 ? " (rail 0)" : "s");
	if (rq->rail >= 0 && !mesh_link_rail_up(l, (uint32_t)rq->rail))
		return ping_refuse(m, why, -ENETUNREACH, "rail %d of the link to node %u is DOWN", rq->rail, rq->peer);
	for (uint32_t i = 0; i < MESH_PING_MAX; i++) {
		struct ping *q = &m->pings.p[i];

		if (q->fd < 0) {
			p = p ? p : q;
			continue;
		}
		if (q->fd == fd)
			return ping_refuse(m, why, -EBUSY, "a ping runs on this connection already");
		mine += q->uid == rq->uid;
	}
	if (!p)
		return ping_refuse(m, why, -EBUSY, "%u pings run already, the most meshd runs at once: try again later",
				   MESH_PING_MAX);
	if (!rq->privileged && mine >= MESH_PING_PER_UID)
		return ping_refuse(m, why, -EBUSY, "uid %u runs %u pings already, the most one user may", rq->uid, mine);
	for (uint32_t r = 0; r < m->n_rails; r++)
		if (rq->rail < 0 ? mesh_link_rail_up(l, r) : r == (uint32_t)rq->rail)
			mask |= 1u << r;
	ping_free(p);
	p->fd = fd;
	p->uid = rq->uid;
	if (++m->pings.last_id > 0x7fffffffu)
		m->pings.last_id = 1;
	p->id = m->pings.last_id;
	p->peer = rq->peer;
	p->rails = mask;
	p->count = rq->count;
	p->interval_ms = rq->interval_ms;
	p->timeout_ms = rq->timeout_ms;
	p->next_ms = 0; /* the first round with the next tick */
	*rails = mask;
	return 0;
}

void ping_client_gone(struct mesh *m, int fd)
{
	for (uint32_t i = 0; i < MESH_PING_MAX; i++)
		if (m->pings.p[i].fd == fd && fd >= 0)
			ping_free(&m->pings.p[i]);
}

/* A probe on rail r: 0 and in flight, or why it did not go. */
static int ping_probe(struct ping *p, struct link *l, uint32_t r, uint32_t seq, uint64_t now_ms)
{
	uint32_t qp = r * l->mesh->cfg->qps_per_link;
	Keepalive k = KEEPALIVE__INIT;
	PeerMsg msg = PEER_MSG__INIT;
	uint64_t t;
	int ret;

	if (!mesh_link_rail_up(l, r) || !l->conns[qp])
		return -ENETDOWN;
	/* Only what channel data could take: half the send slots free, and the queue's room. */
	if (__builtin_popcount(l->send_busy | l->send_unacked) >= LINK_SEND_BUFS / 2 || !mesh_link_sq_room(l, qp))
		return -ENOBUFS;
	t = util_now_us();
	k.seq = MESH_PING_SEQ(p->id, seq);
	k.sent_us = t;
	msg.body_case = PEER_MSG__BODY_KEEPALIVE;
	msg.keepalive = &k;
	ret = link_send_on(l, qp, &msg);
	if (ret)
		return ret;
	p->flight[r][p->n_flight[r]].seq = seq;
	p->flight[r][p->n_flight[r]].sent_us = t;
	p->flight[r][p->n_flight[r]].sent_ms = now_ms;
	p->n_flight[r]++;
	return 0;
}

/* The next round, when every rail probed has room for it; false when the ping is gone. */
static bool ping_round(struct mesh *m, struct ping *p, uint64_t now)
{
	struct link *l = mesh_link_find(m, p->peer);
	uint32_t seq;

	for (uint32_t r = 0; r < m->n_rails; r++)
		if ((p->rails & (1u << r)) && p->n_flight[r] >= PING_WINDOW)
			return true; /* answers are slow: the round waits, it is not counted lost */
	seq = ++p->sent;
	for (uint32_t r = 0; r < m->n_rails; r++) {
		int ret;

		if (!(p->rails & (1u << r)))
			continue;
		ret = l ? ping_probe(p, l, r, seq, now) : -ENETDOWN;
		if (ret && !ping_report(m, p, r, seq, ret == -ENOTCONN ? -ENETDOWN : ret, 0, false))
			return false;
	}
	p->next_ms = p->next_ms && p->next_ms + p->interval_ms > now ? p->next_ms + p->interval_ms : now + p->interval_ms;
	return true;
}

/* Probes unanswered for the ping's timeout are lost; false when the ping is gone. */
static bool ping_expire(struct mesh *m, struct ping *p, uint64_t now_ms)
{
	for (uint32_t r = 0; r < MESH_RAILS_MAX; r++) {
		while (p->n_flight[r] && now_ms >= p->flight[r][0].sent_ms + p->timeout_ms) {
			uint32_t seq = p->flight[r][0].seq;

			memmove(&p->flight[r][0], &p->flight[r][1], --p->n_flight[r] * sizeof(p->flight[r][0]));
			if (!ping_report(m, p, r, seq, -ETIMEDOUT, 0, false))
				return false;
		}
	}
	return true;
}

void ping_tick(struct mesh *m, uint64_t now_ms)
{
	for (uint32_t i = 0; i < MESH_PING_MAX; i++) {
		struct ping *p = &m->pings.p[i];

		if (p->fd < 0 || !ping_expire(m, p, now_ms))
			continue;
		if (p->sent < p->count && now_ms >= p->next_ms && !ping_round(m, p, now_ms))
			continue;
		ping_maybe_done(m, p);
	}
}

void ping_on_ack(struct link *l, uint32_t r, uint64_t seq)
{
	struct mesh *m = l->mesh;
	uint32_t id = MESH_PING_SEQ_ID(seq), n = MESH_PING_SEQ_N(seq);
	uint64_t t = util_now_us();

	if (r >= MESH_RAILS_MAX)
		return;
	for (uint32_t i = 0; i < MESH_PING_MAX; i++) {
		struct ping *p = &m->pings.p[i];

		if (p->fd < 0 || p->id != id || p->peer != l->peer->id)
			continue;
		/* Ours to time, not the echo's: a peer could put any sent_us in its answer. */
		for (uint32_t k = 0; k < p->n_flight[r]; k++) {
			uint64_t sent = p->flight[r][k].sent_us;

			if (p->flight[r][k].seq != n)
				continue;
			memmove(&p->flight[r][k], &p->flight[r][k + 1], (--p->n_flight[r] - k) * sizeof(p->flight[r][0]));
			if (ping_report(m, p, r, n, 0, t > sent ? t - sent : 0, false))
				ping_maybe_done(m, p);
			return;
		}
		return; /* late (given up already) or made up: nothing to time */
	}
}
