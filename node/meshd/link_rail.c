/*
 * Rails of an UP link (MESH_FEAT_RAILS; link_internal.h): a rail that fails while others carry the
 * link is buried (its QPs, its send slots), said to the peer (RailDown), dialled again by the
 * dialler with a join timeout that grows with its failures, and UP again once its QPs connected,
 * proved the key (the dialler's proof: link_rail_on_auth) and both sides sent RailUp. The rails'
 * state said when a link or rail goes DOWN (link_rails_diag) is link_core.c's, below link_fail.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <mesh/mesh.h>
#include "link_internal.h"
#include "log.h"
#include "mesh.h"
#include "util.h"

/* ---- rails ---- */

static uint64_t link_rail_mask(const struct link *l, uint32_t r)
{
	uint32_t q = l->mesh->cfg->qps_per_link;

	return ((q == 64 ? 0 : (1ull << q)) - 1) << (r * q);
}

/* Releases everything of rail r's current incarnation: its QPs (with whatever their CQs still
 * hold), their send-queue counts, the send slots posted on them and the rail's buffer registration.
 * Rail 0's registrations of the link stay: they live as long as the link. */
void link_rail_bury(struct link *l, uint32_t r)
{
	struct mesh *m = l->mesh;
	uint32_t q = m->cfg->qps_per_link;

	for (uint32_t i = r * q; i < (r + 1) * q; i++) {
		if (l->conns[i]) {
			xport_disconnect(l->conns[i]);
			mesh_bury_conn(m, l->conns[i]);
			l->conns[i] = NULL;
		}
		l->sq_used[i] = 0;
	}
	l->est_mask &= ~link_rail_mask(l, r);
	l->send_busy &= ~link_rail_slots_busy(l, r);
	l->recvs_posted &= ~(1u << r);
	l->rails_joining &= ~(1u << r);
	l->rails_peer_up &= ~(1u << r);
	l->rails_railup_sent &= ~(1u << r);
	l->rails_proof_sent &= ~(1u << r);
	l->rails_peer_proved &= ~(1u << r);
	if (r) {
		mesh_bury_mr(m, l->mr_rails[r]);
		l->mr_rails[r] = NULL;
	}
}

void link_send_raildowns(struct link *l)
{
	for (uint32_t r = 0; r < l->mesh->n_rails && l->raildown_pending; r++) {
		PeerMsg msg = PEER_MSG__INIT;
		RailDown d = RAIL_DOWN__INIT;
		int ret;

		if (!(l->raildown_pending & (1u << r)))
			continue;
		d.rail = r;
		d.gen = l->rail_gen[r];
		d.reason = l->raildown_reason[r];
		msg.body_case = PEER_MSG__BODY_RAIL_DOWN;
		msg.rail_down = &d;
		ret = mesh_link_send(l, &msg);
		if (ret == -ENOBUFS)
			return; /* the tick sends it */
		if (ret) {
			link_fail(l, ret, "cannot send RailDown for rail %u", r);
			return;
		}
		l->raildown_pending &= ~(1u << r);
	}
}

/* Rail r failed (a QP error or disconnect, a silent rail, the peer's RailDown) or its join did. The
 * link stays UP on its other rails when the peer fails rails over: the rail's QPs are released,
 * control moves to the next rail with what the peer has not acked, the peer hears RailDown, the
 * rail's channels move (mesh_upper.rail_down), and the dialler dials the rail again with backoff.
 * Without another UP rail, or without the feature, the link fails. */
void link_rail_fail(struct link *l, uint32_t r, int err, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

void link_rail_fail(struct link *l, uint32_t r, int err, const char *fmt, ...)
{
	struct mesh *m = l->mesh;
	char why[LINK_ERR_MAX - 32];
	bool was_up = l->rails_up & (1u << r);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (!link_sequenced(l) || (was_up && !(l->rails_up & ~(1u << r)))) {
		link_fail(l, err, "%s", why);
		return;
	}
	if (!was_up && !(l->rails_joining & (1u << r)))
		return; /* nothing of the rail is there */
	snprintf(l->rail_error[r], sizeof(l->rail_error[r]), "%s (%s)", why, mesh_strerror(err));
	snprintf(l->rail_last_error, sizeof(l->rail_last_error), "rail %u: %s", r, l->rail_error[r]);
	if (was_up)
		link_rails_diag(l, now_ms(), m->stopping ? LOG_LVL_DEBUG : LOG_LVL_WARN); /* before its state goes */
	link_rail_bury(l, r);
	if (was_up) {
		l->rails_up &= ~(1u << r);
		l->rail_failovers++;
		m->rail_failovers++;
		l->rail_failures[r] = 0;
		log_warn("link to node %u: rail %u (%s) DOWN: %s; the link stays UP on %u rail%s", l->peer->id, r,
			 mesh_node_addr(l->peer, r), l->rail_error[r], __builtin_popcount(l->rails_up),
			 __builtin_popcount(l->rails_up) > 1 ? "s" : "");
		if (r == l->ctl_rail) {
			l->ctl_rail = (uint32_t)__builtin_ctz(l->rails_up);
			l->ctl_resend = l->ctl_acked + 1;
			log_info("link to node %u: control messages move to rail %u; %llu sent again", l->peer->id, l->ctl_rail,
				 (unsigned long long)(l->ctl_seq - l->ctl_acked));
			link_ctl_resend(l);
			if (l->phase != LINK_UP)
				return;
		}
		l->raildown_pending |= 1u << r;
		l->raildown_reason[r] = err;
		link_send_raildowns(l);
		if (l->phase != LINK_UP)
			return;
		if (m->upper)
			m->upper->rail_down(l, r);
	} else {
		if (!(l->rail_failures[r] & (l->rail_failures[r] - 1)))
			log_info("link to node %u: rail %u join (gen %u) failed (%u before it): %s", l->peer->id, r,
				 l->rail_gen[r], l->rail_failures[r], l->rail_error[r]);
		l->rail_failures[r]++;
	}
	if (l->dialer) {
		uint64_t backoff = doubled(m->cfg->backoff_initial_ms, l->rail_failures[r], m->cfg->backoff_max_ms);

		l->rail_next_dial_ms[r] = now_ms() + backoff / 2 + util_rand_below(backoff / 2 + 1);
	}
}

/* How long the join of rail r may take. The dialler's first attempt after the rail was lost gets
 * RAIL_JOIN_FIRST_MS and each failure doubles it, up to handshake_timeout_ms: that first dial goes
 * out backoff_initial_ms after the dialler saw the rail fail, often while the cable is still cut
 * (the peer sees the loss later, and whoever mends it later still), and its connection request is
 * lost. The transport would send it again only seconds later (the IB CM after 4.3 s, TCP's SYN after
 * 1 s and then 3 s), long after the cable is back; a new attempt (a newer rail_gen, which replaces
 * the old one at the acceptor) goes at once. The acceptor, which does not dial, keeps the full time. */
#define RAIL_JOIN_FIRST_MS 1000

uint64_t rail_join_timeout_ms(const struct link *l, uint32_t r)
{
	uint64_t max = l->mesh->cfg->handshake_timeout_ms;

	return l->dialer ? doubled(RAIL_JOIN_FIRST_MS, l->rail_failures[r], max) : max;
}

/* A transport failure on one QP: with rails failing over, only its rail is lost. */

void link_conn_fail(struct link *l, xport_conn_t *c, int err, const char *fmt, ...)
{
	char why[LINK_ERR_MAX - 32];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	if (l->phase == LINK_UP && link_sequenced(l))
		link_rail_fail(l, link_qp_rail(l, c->index), err, "%s", why);
	else
		link_fail(l, err, "%s", why);
}

/* The dialler dials the QPs of a failed rail of an UP link again, as a new incarnation (gen). */
void link_rail_dial(struct link *l, uint32_t r)
{
	struct mesh *m = l->mesh;
	uint8_t pdata[XPORT_PDATA_MAX];
	uint32_t q = m->cfg->qps_per_link;
	struct mesh_cm_pdata pd = {
		.kind = MESH_CM_CONNECT,
		.qp_count = (uint8_t)q,
		.rail = (uint8_t)r,
		.rail_count = (uint8_t)m->n_rails,
		.flags = MESH_CM_F_RAIL_JOIN,
		.rail_gen = ++l->rail_gen[r],
		.cluster_hash = m->cluster_hash,
		.src_node = m->self->id,
		.dst_node = l->peer->id,
		.link_epoch = l->epoch,
		.boot_epoch = m->boot_epoch,
	};

	if (util_random(l->rail_nonce_ours[r], AUTH_NONCE_LEN)) {
		link_rail_fail(l, r, -EIO, "no random bytes for rail %u's nonce", r);
		return;
	}
	memcpy(pd.nonce, l->rail_nonce_ours[r], AUTH_NONCE_LEN);
	l->rails_joining |= 1u << r;
	l->rails_peer_up &= ~(1u << r);
	l->rail_attempt_ms[r] = now_ms();
	log_debug("node %u: dialling rail %u again (gen %u)", l->peer->id, r, pd.rail_gen);
	for (uint32_t i = 0; i < q; i++) {
		int len, ret;

		pd.qp_index = (uint8_t)i;
		len = mesh_cm_pdata_encode(&pd, pdata, sizeof(pdata));
		ret = xport_connect(mesh_xport(m, l->xp, r), mesh_node_addr(m->self, r), mesh_node_addr(l->peer, r),
				    l->peer->port, pdata, (size_t)len, l, r * q + i, &l->conns[r * q + i]);
		if (ret) {
			l->conns[r * q + i] = NULL;
			link_rail_fail(l, r, ret, "cannot dial %s:%u (rail %u)", mesh_node_addr(l->peer, r), l->peer->port, r);
			return;
		}
		l->conns[r * q + i]->scope = l->scope;
	}
}

/* A joining rail is UP once all its QPs are connected and both sides sent RailUp on it. */
void link_rail_progress(struct link *l, uint32_t r)
{
	uint64_t mask = link_rail_mask(l, r);

	if (!(l->rails_joining & (1u << r)) || (l->est_mask & mask) != mask)
		return;
	if (l->mesh->keys.n) {
		/* The join proves the cluster key on its first QP before it may carry anything: the
		 * acceptor did in its accept, the dialler does now. */
		uint32_t qp = r * l->mesh->cfg->qps_per_link, bit = 1u << r;
		int ret = 0;

		if (!(l->rails_proof_sent & bit)) {
			ret = link_send_proof(l, qp, r, l->rail_gen[r], l->rail_nonce_ours[r], l->rail_nonce_peer[r]);
			if (!ret)
				l->rails_proof_sent |= bit;
		}
		if (ret == -ENOBUFS)
			return; /* the tick tries again */
		if (ret) {
			link_rail_fail(l, r, ret, "cannot send the proof of the cluster key on rail %u", r);
			return;
		}
		if (!(l->rails_peer_proved & bit))
			return;
	}
	if (!(l->rails_railup_sent & (1u << r))) {
		PeerMsg msg = PEER_MSG__INIT;
		RailUp u = RAIL_UP__INIT;
		int ret;

		u.rail = r;
		u.gen = l->rail_gen[r];
		u.link_epoch = l->epoch;
		msg.body_case = PEER_MSG__BODY_RAIL_UP;
		msg.rail_up = &u;
		ret = link_send_on(l, r * l->mesh->cfg->qps_per_link, &msg);
		if (ret == -ENOBUFS)
			return; /* the tick tries again */
		if (ret) {
			link_rail_fail(l, r, ret, "cannot send RailUp");
			return;
		}
		l->rails_railup_sent |= 1u << r;
	}
	if (!(l->rails_peer_up & (1u << r)))
		return;
	l->rails_joining &= ~(1u << r);
	l->rails_peer_up &= ~(1u << r);
	l->rails_railup_sent &= ~(1u << r);
	l->rails_up |= 1u << r;
	l->rail_failures[r] = 0;
	l->rail_rx_ms[r] = now_ms();
	log_info("link to node %u: rail %u (%s) UP again (gen %u), %llu ms after it was dialled", l->peer->id, r,
		 mesh_node_addr(l->peer, r), l->rail_gen[r], (unsigned long long)(now_ms() - l->rail_attempt_ms[r]));
}

/* AuthProof on the first QP of a rail joining the UP link: the dialler's proof for the join, before
 * its RailUp (the acceptor proved itself in its accept). false when it is no join's, or when we have
 * no key: link_on_auth judges it then (mesh.c asks here first). */
bool link_rail_on_auth(struct link *l, uint32_t qp, const PeerMsg *msg)
{
	uint32_t r = link_qp_rail(l, qp), bit = 1u << r;
	bool joining = l->phase == LINK_UP && (l->rails_joining & bit) && link_qp_first(l, qp);
	const AuthProof *p = msg->auth_proof;

	if (!l->mesh->keys.n || !joining)
		return false;
	if (!(l->rails_proof_sent & bit) || (l->rails_peer_proved & bit) || l->dialer) {
		link_rail_fail(l, r, -MESH_EPEERMSG, "unexpected AuthProof on rail %u's join", r);
		return true;
	}
	if (!link_check_proof(l, r, l->rail_gen[r], l->rail_nonce_ours[r], l->rail_nonce_peer[r], p->mac.data,
			      p->mac.len)) {
		link_rail_fail(l, r, -MESH_EAUTH, "node %u's proof of the cluster key for rail %u does not verify",
			       l->peer->id, r);
		return true;
	}
	l->rails_peer_proved |= bit;
	link_rail_progress(l, r);
	return true;
}
