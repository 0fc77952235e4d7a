/*
 * The primitives every file of the link layer stands on (link_internal.h): a link's phase and the
 * state meshctl shows, the table of links (m->links, by peer id), the graveyard (what is detached
 * now and destroyed after the batch of events: mesh_reap), the end of an attempt or of an UP link
 * (link_fail, with each rail's state said: link_rails_diag), a link's registrations and receives,
 * its send slots and control messages (sequenced, held until acknowledged, sent again on another
 * rail after a failover), and a link's memory made and freed. Of the link layer it calls only
 * admission's window (link_admit.c); outside it, the transport, the log, util and the metrics'
 * counting. mesh.c and the other link files call it; it calls none of them.
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

static const char *const phase_names[] = {"IDLE", "QPS", "AUTH", "HELLO", "PROOF", "READY_WAIT", "UP"};

const char *link_phase_name(enum link_phase p)
{
	return phase_names[p];
}

bool phase_in_handshake(enum link_phase p)
{
	return p >= LINK_QPS && p <= LINK_READY_WAIT;
}

enum link_state link_state(const struct link *l)
{
	if (l->phase == LINK_UP)
		return LINK_STATE_UP_;
	/* A dial nobody has answered yet is still DOWN; CONNECTING means the peer is talking to us. */
	if (l->phase == LINK_IDLE || (l->phase == LINK_QPS && l->dialer && link_qps_established(l) == 0))
		return LINK_STATE_DOWN_;
	return LINK_STATE_CONNECTING_;
}

const char *link_state_name(enum link_state s)
{
	switch (s) {
	case LINK_STATE_UP_:
		return "UP";
	case LINK_STATE_CONNECTING_:
		return "CONNECTING";
	default:
		return "DOWN";
	}
}

const char *link_transport(const struct link *l)
{
	return xport_name(mesh_xport(l->mesh, l->xp, 0));
}

uint32_t mesh_links_up(const struct mesh *m)
{
	uint32_t n = 0;

	for (size_t i = 0; i < m->n_links; i++)
		n += m->links[i]->phase == LINK_UP;
	return n;
}

/* Where a link to peer is or would go in m->links (sorted by peer id). */
size_t mesh_link_slot(const struct mesh *m, uint32_t peer)
{
	size_t lo = 0, hi = m->n_links;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (m->links[mid]->peer->id < peer)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct link *mesh_link_find(struct mesh *m, uint32_t peer)
{
	size_t k = mesh_link_slot(m, peer);

	return k < m->n_links && m->links[k]->peer->id == peer ? m->links[k] : NULL;
}

size_t mesh_link_index(const struct mesh *m, const struct link *l)
{
	size_t k = mesh_link_slot(m, l->peer->id);

	return k < m->n_links && m->links[k] == l ? k : m->n_links;
}

static int grave_push(void ***arr, size_t *n, size_t *cap, void *p)
{
	if (*n == *cap) {
		size_t nc = *cap ? *cap * 2 : 16;
		void **a = realloc(*arr, nc * sizeof(*a));

		if (!a)
			return -ENOMEM;
		*arr = a;
		*cap = nc;
	}
	(*arr)[(*n)++] = p;
	return 0;
}

/* Detaches a connection: no event for it reaches a link again, and it is destroyed in mesh_reap. */
void mesh_bury_conn(struct mesh *m, xport_conn_t *c)
{
	c->ctx = NULL;
	if (grave_push((void ***)&m->grave.conns, &m->grave.n_conns, &m->grave.cap_conns, c)) {
		/* Out of memory: destroying now is safe unless later events of this batch refer to it,
		 * and those are skipped by ctx == NULL only while it exists; accept the leak instead. */
		log_error("out of memory: leaking a connection to %s", c->peer_addr);
	}
}

void mesh_bury_mr(struct mesh *m, xport_mr_t *mr)
{
	if (mr && grave_push((void ***)&m->grave.mrs, &m->grave.n_mrs, &m->grave.cap_mrs, mr))
		log_error("out of memory: leaking a memory registration");
}

void mesh_bury_map(struct mesh *m, void *addr, size_t len)
{
	struct mesh_graveyard *g = &m->grave;

	if (!addr)
		return;
	if (g->n_maps == g->cap_maps) {
		size_t nc = g->cap_maps ? g->cap_maps * 2 : 16;
		struct mesh_map *a = realloc(g->maps, nc * sizeof(*a));

		if (!a) {
			log_error("out of memory: leaking %zu bytes of channel memory", len);
			return;
		}
		g->maps = a;
		g->cap_maps = nc;
	}
	g->maps[g->n_maps].addr = addr;
	g->maps[g->n_maps++].len = len;
}

void mesh_reap(struct mesh *m)
{
	for (uint32_t r = 0; r < MESH_RAILS_MAX; r++)
		if (m->rail_deferring[r])
			return; /* that rail's thread reaps once it has handled them */
	for (size_t i = 0; i < m->grave.n_conns; i++)
		xport_conn_destroy(m->grave.conns[i]);
	m->grave.n_conns = 0;
	/* MRs after the QPs that could still reference them. */
	for (size_t i = 0; i < m->grave.n_mrs; i++)
		xport_mr_dereg(m->grave.mrs[i]);
	m->grave.n_mrs = 0;
	/* Memory after its registrations. */
	for (size_t i = 0; i < m->grave.n_maps; i++) {
		if (m->grave.maps[i].len)
			munmap(m->grave.maps[i].addr, m->grave.maps[i].len);
		else
			free(m->grave.maps[i].addr);
	}
	m->grave.n_maps = 0;
}

/* Keeps the time of the state meshctl shows, which changes with phases and connected QPs. */
void link_note_state(struct link *l)
{
	enum link_state s = link_state(l);

	if (s != l->shown) {
		l->shown = s;
		l->shown_ms = now_ms();
	}
}

void link_set_phase(struct link *l, enum link_phase p)
{
	struct mesh *m = l->mesh;

	if (phase_in_handshake(l->phase) && !phase_in_handshake(p)) {
		m->handshakes--;
		m->adm.dials -= l->dialer;
		m->adm.ended |= l->dialer;
	} else if (!phase_in_handshake(l->phase) && phase_in_handshake(p)) {
		m->handshakes++;
		m->adm.dials += l->dialer;
	}
	log_debug("node %u: %s -> %s", l->peer->id, phase_names[l->phase], phase_names[p]);
	l->phase = p;
	l->phase_ms = now_ms();
	link_note_state(l);
}

/* The acceptor, as an attempt ends: with a key, an attempt whose dialler has not proved it leaves no
 * trace, whatever ended it (a failed proof, a timeout, a close, a reject). Anyone who reaches our
 * port can send a CONNECT claiming a node with an epoch minutes ahead and go away; were that epoch
 * kept, the real node's next attempts would look stale until its clock caught up. epoch_ended still
 * tells a late QP of this very attempt from a new one. */
static void link_epoch_forget_unproven(struct link *l)
{
	l->epoch_ended = l->epoch;
	if (!l->dialer && l->mesh->keys.n && !l->peer_proved)
		l->epoch = l->epoch_proven;
}

/* Ends the current attempt (or the UP link): logs why once, releases its QPs and registrations,
 * and schedules the next dial when we are the dialler. */
void link_fail(struct link *l, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

void link_fail(struct link *l, int err, const char *fmt, ...)
{
	struct mesh *m = l->mesh;
	char why[LINK_ERR_MAX - 32];
	va_list ap;
	bool was_up = l->phase == LINK_UP;

	bool unanswered = !was_up && link_qps_established(l) == 0;

	if (l->phase == LINK_IDLE)
		return;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	snprintf(l->last_error, sizeof(l->last_error), "%s (%s)", why, mesh_strerror(err));
	/* A peer that stays away is not worth a line per re-dial: the failures numbered 0, 1, 2, 4, 8...
	 * are logged (causes may alternate during a partition, so "once per cause" is not enough).
	 * A DOWN that the peer's goodbye or our own stop explains is no warning, and its rails' state
	 * explains nothing: only an unexpected DOWN is a warning followed by the rails' state. */
	if (was_up) {
		/* ECANCELED: we ended it on purpose (a stop, or the peer moved in the configuration). */
		bool expected = err == -MESH_ESHUTDOWN || err == -MESH_EREMOVED || err == -MESH_ERESTARTING ||
				err == -ECANCELED || m->stopping ||
				l->leave_ms;

		log_at(expected ? LOG_LVL_INFO : LOG_LVL_WARN, "link to node %u DOWN: %s", l->peer->id, l->last_error);
		link_rails_diag(l, now_ms(), expected ? LOG_LVL_DEBUG : LOG_LVL_WARN);
	} else if (!m->stopping && !(l->failures & (l->failures - 1)))
		log_info("link to node %u: attempt epoch %llu failed (%u before it): %s%s", l->peer->id,
			 (unsigned long long)l->epoch, l->failures, l->last_error,
			 l->dialer ? "; re-dialling with backoff" : "");
	else
		log_debug("link to node %u: attempt epoch %llu failed: %s", l->peer->id,
			  (unsigned long long)l->epoch, l->last_error);
	if (was_up && !l->leave_ms) {
		m->link_flaps++;
		l->down_ms = now_ms();
		memcpy(l->down_error, l->last_error, sizeof(l->down_error));
	} else if (l->dialer && (err == -ETIMEDOUT || err == -MESH_EHANDSHAKE))
		mesh_adm_on_congestion(m, now_ms());
	link_metrics_failed(&l->metrics, was_up, err);
	link_epoch_forget_unproven(l);
	if (m->upper)
		m->upper->link_down(l, err, err != -MESH_ESHUTDOWN && err != -MESH_EREMOVED && !m->stopping);
	memset(l->sq_used, 0, sizeof(l->sq_used));
	l->n_rejects = 0;
	for (uint32_t i = 0; i < LINK_CONNS_MAX; i++) {
		if (!l->conns[i])
			continue;
		xport_disconnect(l->conns[i]);
		mesh_bury_conn(m, l->conns[i]);
		l->conns[i] = NULL;
	}
	mesh_bury_mr(m, l->mr_local);
	mesh_bury_mr(m, l->mr_mailbox);
	l->mr_local = l->mr_mailbox = NULL;
	for (uint32_t r = 1; r < MESH_RAILS_MAX; r++) {
		mesh_bury_mr(m, l->mr_rails[r]);
		l->mr_rails[r] = NULL;
	}
	l->est_mask = 0;
	l->send_busy = l->send_unacked = 0;
	l->recvs_posted = 0;
	l->rails_up = l->rails_joining = l->rails_peer_up = l->raildown_pending = 0;
	l->ctl_rail = 0;
	l->ctl_seq = l->ctl_acked = l->ctl_rcvd = l->ctl_ack_sent = l->ctl_resend = 0;
	memset(l->rail_gen, 0, sizeof(l->rail_gen));
	l->have_peer_hello = false;
	l->peer_ready = false;
	l->proofs_done = 0;
	l->auth_proof_sent = l->peer_proved = false;
	l->rails_proof_sent = l->rails_peer_proved = 0;
	link_set_phase(l, LINK_IDLE);
	if (l->dialer) {
		uint64_t backoff = doubled(m->cfg->backoff_initial_ms, l->failures, m->cfg->backoff_max_ms);

		l->failed_tick = m->adm.ticks; /* a tick's own timeouts are judged before its dials */
		/* Nobody answered over this provider: the peer may have only the other one (a mixed
		 * cluster with transport "auto"). A link that was UP retries its provider for
		 * LINK_XP_STICKY_MS first: its peer meshd is restarting, most likely. */
		if (unanswered && m->n_xports > 1 &&
		    !(l->ups && l->xp == l->xp_up && now_ms() - l->down_ms < LINK_XP_STICKY_MS))
			l->xp = (uint8_t)((l->xp + 1) % m->n_xports);

		/* Full jitter over the upper half: restarts of many nodes do not re-dial in lockstep. */
		l->next_dial_ms = now_ms() + backoff / 2 + util_rand_below(backoff / 2 + 1);
		l->failures++;
	}
}

/* The rail of a QP of the link, and whether it is its rail's first (buffered receives: control on
 * rail 0, keepalives on every rail). */
uint32_t link_qp_rail(const struct link *l, uint32_t qp)
{
	return qp / l->mesh->cfg->qps_per_link;
}

bool link_qp_first(const struct link *l, uint32_t qp)
{
	return qp % l->mesh->cfg->qps_per_link == 0;
}

/* The registration of link->buf usable on rail r's device. */
xport_mr_t *link_buf_mr(const struct link *l, uint32_t r)
{
	return r ? l->mr_rails[r] : l->mr_local;
}

/* Registers the link's memory on rail 0's device, with the first of its connections of an attempt,
 * and the send and receive buffers again on every other rail's device with that rail's first QP
 * (which carries the rail's keepalives; the rest of those rails' QPs carry only data, into channel
 * memory registered on their own device). */
int link_register(struct link *l, xport_conn_t *c)
{
	uint32_t r = link_qp_rail(l, c->index);

	if (!link_qp_first(l, c->index))
		return 0;
	if (r)
		return l->mr_rails[r] ? 0 : xport_mr_reg(c, l->buf, l->buf_len, XPORT_ACCESS_LOCAL, &l->mr_rails[r]);
	if (l->mr_local)
		return 0;
	return xport_mr_reg(c, l->buf, l->buf_len, XPORT_ACCESS_LOCAL, &l->mr_local);
}

/* The mailbox, the one memory of ours a peer may write before channels exist: registered only as
 * our Hello announces it, that is once the peer proved the cluster key (with one), so no QP of an
 * attempt that proved nothing can reach it, whatever key it guesses. */
int link_register_mailbox(struct link *l)
{
	if (l->mr_mailbox)
		return 0;
	memset(l->mailbox, 0, l->mesh->cfg->mailbox_size);
	l->ka_word_seen = 0;
	return xport_mr_reg(l->conns[0], l->mailbox, l->mesh->cfg->mailbox_size,
			    XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_WRITE | XPORT_ACCESS_REMOTE_READ, &l->mr_mailbox);
}

/* Control messages use QP 0 only, keepalives the first QP of every rail: those get receives with
 * buffers (rail r's slots r * LINK_RECV_BUFS ...) as soon as they exist. The other QPs get receives
 * without a buffer, for the immediates of the data path. */
int link_post_recvs(struct link *l, xport_conn_t *c)
{
	uint32_t r = link_qp_rail(l, c->index);
	int ret;

	if (link_qp_first(l, c->index)) {
		if ((l->recvs_posted & (1u << r)) || !link_buf_mr(l, r))
			return 0;
		for (uint32_t i = r * LINK_RECV_BUFS; i < (r + 1) * LINK_RECV_BUFS; i++) {
			ret = xport_post_recv(c, link_buf_mr(l, r), l->buf + BUF_RECV_OFF + i * MESH_PEER_MSG_MAX,
					      MESH_PEER_MSG_MAX, WR_ID(WR_RECV, i));
			if (ret)
				return ret;
		}
		l->recvs_posted |= 1u << r;
		return 0;
	}
	for (uint32_t i = 0; i < LINK_DATA_RECVS; i++) {
		ret = xport_post_recv(c, NULL, NULL, 0, WR_ID(WR_RECV_DATA, i));
		if (ret)
			return ret;
	}
	return 0;
}

bool mesh_link_sq_room(const struct link *l, uint32_t qp)
{
	return l->sq_used[qp] < LINK_SQ_DEPTH - LINK_SQ_CONTROL;
}

void mesh_link_sq_take(struct link *l, uint32_t qp)
{
	l->sq_used[qp]++;
}

/* Control messages are sequenced (PeerMsg.seq) on an UP link whose peer fails rails over: they can
 * then be sent again on another rail when theirs fails, and the receiver drops what it had. */
bool link_sequenced(const struct link *l)
{
	return l->phase == LINK_UP && (l->features & MESH_FEAT_RAILS) && l->mesh->n_rails > 1;
}

bool msg_sequenced(PeerMsg__BodyCase k)
{
	return (k >= PEER_MSG__BODY_CHANNEL_OPEN && k <= PEER_MSG__BODY_CHANNEL_RESUME) || k == PEER_MSG__BODY_RAIL_DOWN ||
	       k == PEER_MSG__BODY_CHANNEL_APP_QP;
}

bool mesh_link_rail_up(const struct link *l, uint32_t r)
{
	return l->phase == LINK_UP && r < l->mesh->n_rails && (l->rails_up & (1u << r));
}

int mesh_link_pick_rail(const struct link *l, int want)
{
	if (want >= 0 && mesh_link_rail_up(l, (uint32_t)want))
		return want;
	for (uint32_t r = 0; r < l->mesh->n_rails; r++)
		if (mesh_link_rail_up(l, r))
			return (int)r;
	return -1;
}

/* The first QP of the rail that carries our control messages. */
uint32_t link_ctl_qp(const struct link *l)
{
	return l->ctl_rail * l->mesh->cfg->qps_per_link;
}

static int link_post_slot(struct link *l, uint32_t qp, uint32_t slot)
{
	int ret;

	if (!l->conns[qp] || !link_buf_mr(l, link_qp_rail(l, qp)))
		return -ENOTCONN;
	if (l->sq_used[qp] >= LINK_SQ_DEPTH)
		return -ENOBUFS;
	ret = xport_post_send(l->conns[qp], link_buf_mr(l, link_qp_rail(l, qp)),
			      l->buf + BUF_SEND_OFF(l->mesh) + slot * MESH_PEER_MSG_MAX, l->send_len[slot],
			      WR_ID(WR_SEND, slot));
	if (ret)
		return ret;
	l->sq_used[qp]++;
	l->send_busy |= 1u << slot;
	l->send_qp[slot] = (uint8_t)qp;
	l->tx_msgs++;
	return 0;
}

/* A message on QP qp (the first of its rail): control on the control rail's, a rail's keepalives on
 * its own. A sequenced message keeps its slot until the peer acks it; while messages are being sent
 * again after a control failover, new ones wait (-ENOBUFS) so that the order holds. */
int link_send_on(struct link *l, uint32_t qp, const PeerMsg *msg)
{
	PeerMsg m = *msg;
	bool seqd = link_sequenced(l) && msg_sequenced(msg->body_case);
	uint32_t slot;
	int len, ret;

	/* A peer slow to ack holds slots: keep a few for keepalives and acks, which nothing holds. */
	if (seqd && (l->ctl_resend || __builtin_popcount(l->send_busy | l->send_unacked) >= LINK_SEND_BUFS - 4))
		return -ENOBUFS;
	for (slot = 0; slot < LINK_SEND_BUFS && ((l->send_busy | l->send_unacked) & (1u << slot)); slot++)
		;
	if (slot == LINK_SEND_BUFS)
		return -ENOBUFS;
	m.seq = seqd ? l->ctl_seq + 1 : 0;
	m.ack = link_sequenced(l) ? l->ctl_rcvd : 0;
	len = mesh_peer_msg_encode(&m, l->buf + BUF_SEND_OFF(l->mesh) + slot * MESH_PEER_MSG_MAX, MESH_PEER_MSG_MAX);
	if (len < 0)
		return len;
	l->send_len[slot] = (uint16_t)len;
	ret = link_post_slot(l, qp, slot);
	if (ret)
		return ret;
	l->send_seq[slot] = m.seq;
	if (seqd) {
		l->ctl_seq++;
		l->send_unacked |= 1u << slot;
	}
	l->ctl_ack_sent = MAX(l->ctl_ack_sent, m.ack);
	return 0;
}

int mesh_link_send(struct link *l, const PeerMsg *msg)
{
	return link_send_on(l, link_ctl_qp(l), msg);
}

/* After a control failover: the messages the peer has not acked go again, oldest first, on the new
 * control rail (the send slots still hold them). Stops when the send queue is full; the tick goes on. */
void link_ctl_resend(struct link *l)
{
	while (l->ctl_resend && l->ctl_resend <= l->ctl_seq) {
		uint32_t slot;

		for (slot = 0; slot < LINK_SEND_BUFS; slot++)
			if ((l->send_unacked & (1u << slot)) && l->send_seq[slot] == l->ctl_resend)
				break;
		if (slot < LINK_SEND_BUFS) {
			int ret;

			if (l->send_busy & (1u << slot))
				return; /* still posted on a live QP: wait for its completion */
			ret = link_post_slot(l, link_ctl_qp(l), slot);
			if (ret == -ENOBUFS)
				return;
			if (ret) {
				link_fail(l, ret, "cannot send control message %llu again on rail %u",
					  (unsigned long long)l->ctl_resend, l->ctl_rail);
				return;
			}
		}
		/* not found: acked meanwhile */
		l->ctl_resend++;
	}
	l->ctl_resend = 0;
}

/* The peer's keepalive word, as it is in our mailbox now (its NIC writes it at any time). */
uint64_t link_ka_word(const struct link *l)
{
	return __atomic_load_n((const uint64_t *)(const void *)(l->mailbox + MESH_KA_OFF), __ATOMIC_RELAXED);
}

/* The send slots in flight on rail r's QPs (bitmap of send_busy). */
uint32_t link_rail_slots_busy(const struct link *l, uint32_t r)
{
	uint32_t mask = 0;

	for (uint32_t slot = 0; slot < LINK_SEND_BUFS; slot++)
		if ((l->send_busy & (1u << slot)) && link_qp_rail(l, l->send_qp[slot]) == r)
			mask |= 1u << slot;
	return mask;
}

/* Said when an UP link or one of its rails goes DOWN, before their state is released: each rail's
 * state, how long since it last received and since our last keepalive on it went out (how many
 * found no free send slot or queue entry, how many the peer answered), what it has in flight, when
 * its data-path thread last woke. Tells a peer gone quiet from our own sends stuck behind a dead
 * rail, or from a thread of ours that slept through its work. At lvl: a warning after an
 * unexpected DOWN, debug after a goodbye or our own stop. */
void link_rails_diag(const struct link *l, uint64_t t, enum log_level lvl)
{
	char buf[160 * MESH_RAILS_MAX + 64];
	size_t n = 0;

	if (lvl > log_current_level)
		return;
	buf[0] = '\0';
	for (uint32_t r = 0; r < l->mesh->n_rails && n < sizeof(buf); r++) {
		uint32_t qp = r * l->mesh->cfg->qps_per_link;

		n += (size_t)snprintf(buf + n, sizeof(buf) - n,
				      "%srail %u %s (gen %u): received %lld ms ago, keepalive out %lld ms ago (%llu skipped; "
				      "%llu acked of %llu), %u send slots and %u queue entries in flight",
				      r ? "; " : "", r,
				      (l->rails_up & (1u << r)) ? "UP" : (l->rails_joining & (1u << r)) ? "joining" : "down",
				      l->rail_gen[r], (long long)(t - l->rail_rx_ms[r]),
				      l->ka_tx_ms[r] ? (long long)(t - l->ka_tx_ms[r]) : -1LL,
				      (unsigned long long)l->ka_skipped[r], (unsigned long long)l->metrics.ka_acked[r],
				      (unsigned long long)l->metrics.ka_sent[r],
				      (unsigned)__builtin_popcount(link_rail_slots_busy(l, r)), l->sq_used[qp]);
		if (n < sizeof(buf))
			n += (size_t)snprintf(buf + n, sizeof(buf) - n, ", its thread last woke %lld ms ago (%s)",
					      (long long)(t - l->mesh->numa.threads[r].wake_seen_ms),
					      l->mesh->polling[r] ? "polling" : "sleeps between events");
	}
	/* Rail 0's keepalive words: our last number out, and the peer's as last seen and as now in
	 * the mailbox (one that moved since the last look was read too late; one that did not, the
	 * peer's writes did not land). */
	log_at(lvl, "link to node %u, its rails: %s; control on rail %u, %u slots held unacked (seq %llu, "
		 "acked %llu); keepalive words: ours %llu, the peer's %llu when last seen, %llu now", l->peer->id, buf,
		 l->ctl_rail, (unsigned)__builtin_popcount(l->send_unacked), (unsigned long long)l->ctl_seq,
		 (unsigned long long)l->ctl_acked, (unsigned long long)l->ka_write_seq,
		 (unsigned long long)l->ka_word_seen, l->mailbox ? (unsigned long long)link_ka_word(l) : 0ull);
}

/* A link's buffers and mailbox: whole pages of their own (registered, the mailbox for the peer's
 * writes), zero, and touched only when a link registers them: with 63 peers, allocating and clearing
 * them all at start was 6 MiB of memset per meshd before its first dial. mmap and munmap round len up
 * to whole pages themselves. NULL on failure. */
static void *link_mem_alloc(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static void link_mem_free(void *p, size_t len)
{
	if (p)
		munmap(p, len);
}

/* A link to node, idle (a dialler dials at once), with its buffers; NULL when out of memory. */
struct link *mesh_link_new(struct mesh *m, const struct config_node *node)
{
	struct link *l = calloc(1, sizeof(*l));
	uint64_t t = now_ms();

	if (!l)
		return NULL;
	l->mesh = m;
	l->peer = node;
	l->dialer = mesh_dials(m->self->id, node->id);
	l->phase = LINK_IDLE;
	l->phase_ms = t;
	l->shown = LINK_STATE_DOWN_;
	l->shown_ms = t;
	l->next_dial_ms = t;
	l->buf_len = BUF_LEN(m);
	l->buf = link_mem_alloc(l->buf_len);
	l->mailbox = link_mem_alloc(m->cfg->mailbox_size);
	if (!l->buf || !l->mailbox) {
		mesh_link_free(m, l, false);
		return NULL;
	}
	return l;
}

/* Frees an idle link (link_fail'ed: nothing of it is posted or connected). buried: its memory may
 * still be registered (the registrations wait in the graveyard), so it goes after them. */
void mesh_link_free(struct mesh *m, struct link *l, bool buried)
{
	if (buried) {
		if (l->buf)
			mesh_bury_map(m, l->buf, l->buf_len);
		if (l->mailbox)
			mesh_bury_map(m, l->mailbox, m->cfg->mailbox_size);
	} else {
		link_mem_free(l->buf, l->buf_len);
		link_mem_free(l->mailbox, m->cfg->mailbox_size);
	}
	free(l->ch_slots);
	free(l->peer_own);
	free(l);
}
