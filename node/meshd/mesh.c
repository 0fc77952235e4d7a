/*
 * The top of the link layer (link_internal.h): the links' messages dispatched by kind (each in its
 * control sequence, acknowledged), receives and completions, keepalives and the tick that judges
 * them, events handed in by meshd's loop (mesh_handle_event, and mesh_fast_event for a rail's
 * thread), the locks, and set-up and clean-up. It calls down into the other link files and none of
 * them calls back: dialling and accepting are in link_connect.c, the handshake in
 * link_handshake.c, rails in link_rail.c, pings in link_ping.c, a reload's changes in
 * link_reconf.c, admission's window in link_admit.c, and the primitives they all share (phases,
 * link_fail, registrations, sends and control messages, the table of links, the graveyard) in
 * link_core.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <mesh/mesh.h>

#include "link_internal.h"
#include "log.h"
#include "mesh.h"
#include "util.h"

_Static_assert(CONFIG_RAILS_MAX == MESH_RAILS_MAX, "config and wire disagree on the rails per node");
_Static_assert(MESH_CM_ACCEPT_PDATA_MAX <= XPORT_PDATA_MAX && MESH_CM_PDATA_MAX <= XPORT_CONNECT_PDATA_MAX,
	       "the transport cannot carry our private data");

/* The peer's cumulative ack: slots of messages it has are free again. */
static int link_on_ack(struct link *l, uint64_t ack)
{
	if (ack <= l->ctl_acked)
		return 0;
	if (ack > l->ctl_seq)
		return -MESH_EPEERMSG;
	l->ctl_acked = ack;
	for (uint32_t slot = 0; slot < LINK_SEND_BUFS; slot++)
		if ((l->send_unacked & (1u << slot)) && l->send_seq[slot] <= ack)
			l->send_unacked &= ~(1u << slot);
	return 0;
}

static void link_send_ack(struct link *l)
{
	PeerMsg msg = PEER_MSG__INIT;
	LinkAck a = LINK_ACK__INIT;

	msg.body_case = PEER_MSG__BODY_LINK_ACK;
	msg.link_ack = &a;
	link_send_on(l, link_ctl_qp(l), &msg); /* -ENOBUFS: the tick sends it */
}

/* A message on QP qp: the control QP (0) carries every kind, another rail's first QP only that
 * rail's keepalives. */
/* The control sequence of a message (after a control failover the peer sends again what we may
 * have had; a gap is a broken peer): true when the message is to be handled, false when it was a
 * repeat (dropped) or broke the link. */
static bool link_msg_in_sequence(struct link *l, const PeerMsg *msg)
{
	if (!msg->seq && !(link_sequenced(l) && msg_sequenced(msg->body_case)))
		return true;
	if (!link_sequenced(l) || !msg_sequenced(msg->body_case) || msg->seq > l->ctl_rcvd + 1 || !msg->seq) {
		link_fail(l, -MESH_EPEERMSG, "control message kind %d with sequence number %llu, expected %llu",
			  msg->body_case, (unsigned long long)msg->seq, (unsigned long long)(l->ctl_rcvd + 1));
		return false;
	}
	if (msg->seq <= l->ctl_rcvd)
		return false;
	l->ctl_rcvd = msg->seq;
	if (l->ctl_rcvd - l->ctl_ack_sent >= LINK_SEND_BUFS / 4)
		link_send_ack(l);
	return true;
}

static void link_on_ready(struct link *l, const Ready *r)
{
	if (r->link_epoch != l->epoch || !l->have_peer_hello) {
		link_fail(l, -MESH_EPEERMSG, "unexpected Ready (epoch %llu)", (unsigned long long)r->link_epoch);
		return;
	}
	l->peer_ready = true;
	link_progress(l);
}

/* A keepalive is answered on the rail it came by: that rail is alive. */
static void link_on_keepalive(struct link *l, uint32_t qp, const Keepalive *k)
{
	KeepaliveAck a = KEEPALIVE_ACK__INIT;
	PeerMsg reply = PEER_MSG__INIT;
	int ret;

	if (l->phase != LINK_UP || !(l->features & MESH_FEAT_KEEPALIVE))
		return;
	a.seq = k->seq;
	a.sent_us = k->sent_us;
	reply.body_case = PEER_MSG__BODY_KEEPALIVE_ACK;
	reply.keepalive_ack = &a;
	ret = link_send_on(l, qp, &reply);
	if (ret && ret != -ENOBUFS)
		link_rail_fail(l, link_qp_rail(l, qp), ret, "cannot answer a keepalive on QP %u", qp);
}

/* A keepalive's answer: the control rail's RTT, and a sample of the rail's RTT histogram for a
 * keepalive of ours not acked before (metrics.h). */
static void link_on_keepalive_ack(struct link *l, uint32_t qp, const KeepaliveAck *a)
{
	uint64_t t = util_now_us(), sent = a->sent_us;
	uint32_t r = link_qp_rail(l, qp);
	bool ours;

	if (a->seq & MESH_PING_TAG) {
		ping_on_ack(l, r, a->seq);
		return;
	}
	ours = link_metrics_ka_acked(&l->metrics, r, a->seq);

	if (qp == link_ctl_qp(l) && sent <= t)
		l->rtt_us = t - sent;
	if (ours && sent <= t)
		link_metrics_rtt(&l->metrics, r, t - sent);
}

/* Removed from the peer's configuration (a reload there): our channels to it fail with that, not as
 * at a stop, and our re-dials meet "unknown node" until we are added back. */
static void link_on_goodbye(struct link *l, const Goodbye *g)
{
	if (g->reason == MESH_EREMOVED)
		link_fail(l, -MESH_EREMOVED, "node %u removed this node from its configuration", l->peer->id);
	else if (g->reason == MESH_ERESTARTING)
		/* Its channels are kept for the next meshd: ours wait for it, as after any DOWN. */
		link_fail(l, -MESH_ERESTARTING, "node %u's meshd is restarting with its channels kept", l->peer->id);
	else
		link_fail(l, -MESH_ESHUTDOWN, "node %u said goodbye", l->peer->id);
}

static void link_on_rail_down(struct link *l, const RailDown *d)
{
	if (!link_sequenced(l) || d->rail >= l->mesh->n_rails) {
		link_fail(l, -MESH_EPEERMSG, "RailDown for rail %u", d->rail);
		return;
	}
	/* Of the rail's current incarnation only: not a late one about a rail that rejoined since. */
	if (d->gen == l->rail_gen[d->rail])
		link_rail_fail(l, d->rail, d->reason < 0 ? d->reason : -MESH_EPEERMSG, "node %u lost rail %u", l->peer->id,
			       d->rail);
}

static void link_on_rail_up(struct link *l, uint32_t qp, const RailUp *u)
{
	if (!link_sequenced(l) || u->rail != link_qp_rail(l, qp) || !link_qp_first(l, qp) ||
	    !(l->rails_joining & (1u << u->rail)) || u->gen != l->rail_gen[u->rail] || u->link_epoch != l->epoch) {
		link_fail(l, -MESH_EPEERMSG, "RailUp for rail %u gen %u on QP %u, not a rail joining here", u->rail, u->gen,
			  qp);
		return;
	}
	if (l->mesh->keys.n && !(l->rails_peer_proved & (1u << u->rail))) {
		link_rail_fail(l, u->rail, -MESH_EAUTH, "node %u sent RailUp for rail %u without proving the cluster key",
			       l->peer->id, u->rail);
		return;
	}
	l->rails_peer_up |= 1u << u->rail;
	link_rail_progress(l, u->rail);
}

/* A message of the layer above (channels), once the link is UP. */
static void link_on_upper(struct link *l, const PeerMsg *msg)
{
	int ret;

	if (l->phase != LINK_UP) {
		link_fail(l, -MESH_EPEERMSG, "channel message before the link was UP");
		return;
	}
	ret = l->mesh->upper ? l->mesh->upper->message(l, msg) : -MESH_EPEERMSG;
	if (ret)
		link_fail(l, ret, "channel message the link did not agree to");
}

static void link_on_message(struct link *l, uint32_t qp, const uint8_t *buf, uint32_t len)
{
	PeerMsg *msg;
	const char *why;
	int ret = mesh_peer_msg_decode(buf, len, &msg, &why);

	if (ret) {
		link_fail(l, -MESH_EPEERMSG, "undecodable message of %u bytes: %s", len, why);
		return;
	}
	l->rx_msgs++;
	l->last_rx_ms = now_ms();
	if (link_on_ack(l, msg->ack)) {
		link_fail(l, -MESH_EPEERMSG, "ack %llu of control messages, of %llu sent", (unsigned long long)msg->ack,
			  (unsigned long long)l->ctl_seq);
		goto out;
	}
	if (!link_msg_in_sequence(l, msg))
		goto out;
	/* Before the link is UP, and from peers that do not fail rails over, only QP 0 carries control;
	 * the other rails' first QPs carry their keepalives (and a joining rail its RailUp). */
	if (qp && !link_sequenced(l) && msg->body_case != PEER_MSG__BODY_KEEPALIVE &&
	    msg->body_case != PEER_MSG__BODY_KEEPALIVE_ACK && msg->body_case != PEER_MSG__BODY_LINK_ACK) {
		link_fail(l, -MESH_EPEERMSG, "message kind %d on QP %u, which carries only keepalives", msg->body_case, qp);
		goto out;
	}
	switch (msg->body_case) {
	case PEER_MSG__BODY_HELLO:
		link_on_hello(l, msg->hello);
		break;
	case PEER_MSG__BODY_READY:
		link_on_ready(l, msg->ready);
		break;
	case PEER_MSG__BODY_KEEPALIVE:
		link_on_keepalive(l, qp, msg->keepalive);
		break;
	case PEER_MSG__BODY_KEEPALIVE_ACK:
		link_on_keepalive_ack(l, qp, msg->keepalive_ack);
		break;
	case PEER_MSG__BODY_GOODBYE:
		link_on_goodbye(l, msg->goodbye);
		break;
	case PEER_MSG__BODY_LINK_ACK:
		break; /* its ack is all it says */
	case PEER_MSG__BODY_AUTH_PROOF:
		if (!link_rail_on_auth(l, qp, msg))
			link_on_auth(l, qp, msg);
		break;
	case PEER_MSG__BODY_RAIL_DOWN:
		link_on_rail_down(l, msg->rail_down);
		break;
	case PEER_MSG__BODY_RAIL_UP:
		link_on_rail_up(l, qp, msg->rail_up);
		break;
	default:
		link_on_upper(l, msg);
		break;
	}
out:
	mesh_peer_msg_free(msg);
}

/* A receive's wr_id names a slot of its QP: a buffered one of the rail's first QP, or one of a
 * data QP's plain receives. */
static bool link_recv_wr_ok(const struct link *l, const xport_conn_t *c, uint32_t rail, bool buffered, uint32_t idx)
{
	return buffered ? idx / LINK_RECV_BUFS == rail : idx < LINK_DATA_RECVS && link_qp_first(l, c->index) == buffered;
}

/* The receive of slot idx (wr_id) posted again where it completed. */
static int link_repost_recv(struct link *l, xport_conn_t *c, uint32_t rail, bool buffered, uint32_t idx,
			    uint64_t wr_id)
{
	if (buffered)
		return xport_post_recv(c, link_buf_mr(l, rail), l->buf + BUF_RECV_OFF + idx * MESH_PEER_MSG_MAX,
				       MESH_PEER_MSG_MAX, wr_id);
	return xport_post_recv(c, l->mr_local, NULL, 0, wr_id);
}

/* A receive completed: a data immediate for the layer above, or a control message in our buffer
 * (only on a rail's first QP); then the receive is posted again. */
static void link_on_recv(struct link *l, const struct xport_event *ev, uint32_t kind, uint32_t idx)
{
	xport_conn_t *c = ev->conn;
	bool buffered = kind == WR_RECV;
	uint32_t rail = link_qp_rail(l, c->index);
	int ret;

	if (!link_recv_wr_ok(l, c, rail, buffered, idx)) {
		link_fail(l, -EPROTO, "receive completion with unknown wr_id 0x%llx", (unsigned long long)ev->wr_id);
		return;
	}
	l->rail_rx_ms[rail] = now_ms();
	if (ev->has_imm) {
		/* The data path: the immediate names the channel, nothing landed in our buffer. */
		if (l->phase != LINK_UP || !(l->features & MESH_FEAT_CHANNELS)) {
			link_fail(l, -MESH_EPEERMSG, "data immediate 0x%x before channels were agreed", ev->imm);
			return;
		}
		ret = l->mesh->upper ? l->mesh->upper->imm(l, ev->imm, ev->byte_len) : -MESH_EPEERMSG;
		if (ret) {
			link_fail(l, ret, "bad data immediate 0x%x", ev->imm);
			return;
		}
	} else if (!buffered) {
		link_fail(l, -MESH_EPEERMSG, "a message on data QP %u", c->index);
		return;
	} else if (ev->byte_len > MESH_PEER_MSG_MAX) {
		link_fail(l, -MESH_EPEERMSG, "message of %u bytes", ev->byte_len);
		return;
	} else {
		link_on_message(l, c->index, l->buf + BUF_RECV_OFF + idx * MESH_PEER_MSG_MAX, ev->byte_len);
	}
	if (l->phase == LINK_IDLE || c->ctx != l)
		return; /* the message ended the attempt */
	ret = link_repost_recv(l, c, rail, buffered, idx, ev->wr_id);
	if (ret)
		link_fail(l, ret, "cannot repost a receive on QP %u", c->index);
}

/* The peer's NIC acknowledged a keepalive write (idx: its number's low half); the latest one gives
 * a round trip on rail 0. */
static void link_on_ka_written(struct link *l, uint32_t idx)
{
	uint64_t t = util_now_us();
	uint64_t seq = l->ka_write_seq - (uint32_t)((uint32_t)l->ka_write_seq - idx);
	bool ours = link_metrics_ka_acked(&l->metrics, 0, seq);

	if (seq == l->ka_write_seq && l->ka_write_us <= t) {
		if (l->ctl_rail == 0)
			l->rtt_us = t - l->ka_write_us;
		if (ours) /* an older write's post time is gone: no sample */
			link_metrics_rtt(&l->metrics, 0, t - l->ka_write_us);
	}
}

/* A proof's read came back: it must hold what our write put in the peer's mailbox. */
static void link_on_proof_read(struct link *l, uint32_t idx)
{
	if (idx >= l->mesh->cfg->qps_per_link || l->phase != LINK_PROOF) {
		link_fail(l, -EPROTO, "unexpected proof completion for QP %u", idx);
		return;
	}
	if (memcmp(l->buf + BUF_PROOF_OFF(l->mesh) + idx * MESH_PROOF_LEN, l->buf + BUF_TOKEN_OFF(l->mesh), MESH_PROOF_LEN)) {
		link_fail(l, -MESH_EPROOF, "QP %u read back other bytes than it wrote to 0x%llx rkey 0x%x", idx,
			  (unsigned long long)(l->peer_mb_addr + idx * MESH_PROOF_LEN), l->peer_mb_rkey);
		return;
	}
	l->proofs_done++;
	link_progress(l);
}

static void link_on_completion(struct link *l, const struct xport_event *ev)
{
	uint32_t kind = WR_KIND(ev->wr_id), idx = WR_IDX(ev->wr_id);
	int ret;

	if (ev->status) {
		static const char *const kinds[] = {"?",           "receive",         "send",
						    "proof write", "proof read",      "channel data",
						    "channel credit", "data receive", "keepalive write",
						    "channel direct pair"};

		link_conn_fail(l, ev->conn, ev->status, "QP %u: %s %u failed: %s", ev->conn->index,
			       kind < ARRAY_SIZE(kinds) ? kinds[kind] : "?", idx, ev->status_str ? ev->status_str : "?");
		return;
	}
	switch (kind) {
	case WR_RECV:
	case WR_RECV_DATA:
		link_on_recv(l, ev, kind, idx);
		return;
	case WR_SEND:
		if (idx < LINK_SEND_BUFS)
			l->send_busy &= ~(1u << idx);
		l->sq_used[ev->conn->index]--;
		return;
	case WR_CH_DATA:
	case WR_CH_CREDIT:
	case WR_CH_DIRECT:
	case WR_CH_HINT:
		l->sq_used[ev->conn->index]--;
		ret = l->mesh->upper ? l->mesh->upper->completion(l, kind, idx, 0) : -EPROTO;
		if (ret)
			link_fail(l, ret, "channel completion for an unknown channel (wr_id 0x%llx)",
				  (unsigned long long)ev->wr_id);
		return;
	case WR_PROOF_WRITE:
		l->sq_used[ev->conn->index]--;
		return;
	case WR_KA_WRITE:
		l->sq_used[ev->conn->index]--;
		link_on_ka_written(l, idx);
		return;
	case WR_PROOF_READ:
		l->sq_used[ev->conn->index]--;
		link_on_proof_read(l, idx);
		return;
	default:
		link_fail(l, -EPROTO, "completion with unknown wr_id 0x%llx", (unsigned long long)ev->wr_id);
	}
}

/* The mesh reason of a refusal (a negative MESH_E* code), 0 when it carried none. */
static int reject_code(const struct xport_event *ev)
{
	struct mesh_cm_pdata pd;

	if (mesh_cm_pdata_decode(ev->pdata, ev->pdata_len, &pd) || pd.kind != MESH_CM_REJECT)
		return 0;
	return pd.reason;
}

static const char *reject_reason(const struct xport_event *ev)
{
	int code = reject_code(ev);

	return code ? mesh_strerror(code) : "no mesh reason: nobody listening, or not a meshd";
}

static void mesh_on_event(struct mesh *m, const struct xport_event *ev);

/* An event, then the next dial at once if it ended an attempt of ours: admission is clocked by our
 * attempts ending, as TCP's sending by acknowledgements, not by the timer (which catches up with
 * backoffs that expired and with room that accepted attempts left). */
void mesh_handle_event(struct mesh *m, const struct xport_event *ev)
{
	mesh_on_event(m, ev);
	if (m->adm.ended)
		mesh_admit(m, now_ms());
}

static void mesh_on_event(struct mesh *m, const struct xport_event *ev)
{
	struct link *l;

	if (ev->type == XPORT_EV_CONNECT_REQUEST) {
		if (m->stopping) {
			mesh_reject(m, ev->conn, -MESH_ESHUTDOWN, LOG_LVL_INFO, ": we are stopping");
			return;
		}
		mesh_on_request(m, ev);
		return;
	}
	l = ev->conn->ctx;
	if (!l)
		return; /* detached earlier in this batch */
	switch (ev->type) {
	case XPORT_EV_ESTABLISHED:
		mesh_on_established(l, ev);
		break;
	case XPORT_EV_REJECTED:
		if (l->dialer && l->phase != LINK_UP && reject_code(ev) == -MESH_EBUSY)
			mesh_adm_on_congestion(m, now_ms());
		link_conn_fail(l, ev->conn, ev->status, "node %u at %s rejected QP %u: %s", l->peer->id, ev->conn->peer_addr,
			  ev->conn->index, reject_reason(ev));
		break;
	case XPORT_EV_CONNECT_ERROR:
		link_conn_fail(l, ev->conn, ev->status, "QP %u to %s: %s", ev->conn->index, ev->conn->peer_addr,
			  ev->status_str ? ev->status_str : "connect failed");
		break;
	case XPORT_EV_DISCONNECTED:
		link_conn_fail(l, ev->conn, ev->status, "QP %u disconnected: %s", ev->conn->index,
			  ev->status_str ? ev->status_str : "connection lost");
		break;
	case XPORT_EV_COMPLETION:
		link_on_completion(l, ev);
		break;
	default:
		break;
	}
}

bool mesh_fast_event(struct mesh *m, uint32_t rail, const struct xport_event *ev)
{
	const struct mesh_upper *up = m->upper;
	xport_conn_t *c = ev->conn;
	uint32_t kind = WR_KIND(ev->wr_id), idx = WR_IDX(ev->wr_id);
	struct link *l;

	if (ev->type != XPORT_EV_COMPLETION || ev->status || !up || !up->fast_completion)
		return false;
	l = c->ctx;
	if (!l)
		return true; /* detached earlier: mesh_on_event ignores it as well */
	if (l->phase != LINK_UP || c->index >= mesh_link_qps(m) || link_qp_rail(l, c->index) != rail ||
	    !(l->rails_up & (1u << rail)))
		return false;
	switch (kind) {
	case WR_CH_DATA:
	case WR_CH_CREDIT:
	case WR_CH_DIRECT:
	case WR_CH_HINT:
		/* As link_on_completion: the room first, the channel's pump may use it. */
		if (!l->sq_used[c->index])
			return false;
		l->sq_used[c->index]--;
		if (up->fast_completion(l, rail, kind, idx))
			return true;
		l->sq_used[c->index]++;
		return false;
	case WR_RECV:
	case WR_RECV_DATA: {
		bool buffered = kind == WR_RECV;

		if (!ev->has_imm || !(l->features & MESH_FEAT_CHANNELS) || !link_recv_wr_ok(l, c, rail, buffered, idx) ||
		    !up->fast_imm_ok(l, rail, ev->imm))
			return false;
		/* Posted again before the immediate is taken: if that fails, the usual way tries again
		 * and fails the link, and nothing was taken twice. */
		if (link_repost_recv(l, c, rail, buffered, idx, ev->wr_id))
			return false;
		l->rail_rx_ms[rail] = now_ms();
		up->fast_imm(l, rail, ev->imm, ev->byte_len);
		return true;
	}
	default:
		return false;
	}
}

/* ---- the locks (struct mesh_locks) ---- */

void mesh_locks_init(struct mesh_locks *k)
{
	util_mutex_init_pi(&k->ctl);
	for (uint32_t r = 0; r < MESH_RAILS_MAX; r++)
		util_mutex_init_pi(&k->rail[r]);
	k->n_rails = 1;
	atomic_init(&k->all_waiting, 0);
}

void mesh_locks_destroy(struct mesh_locks *k)
{
	pthread_mutex_destroy(&k->ctl);
	for (uint32_t r = 0; r < MESH_RAILS_MAX; r++)
		pthread_mutex_destroy(&k->rail[r]);
}

static void mesh_lock_rails(struct mesh_locks *k)
{
	for (uint32_t r = 0; r < k->n_rails; r++)
		pthread_mutex_lock(&k->rail[r]);
}

void mesh_lock_all(struct mesh_locks *k)
{
	atomic_fetch_add(&k->all_waiting, 1);
	pthread_mutex_lock(&k->ctl);
	mesh_lock_rails(k);
	atomic_fetch_sub(&k->all_waiting, 1);
}

/* Gives back ctl and the first n rails' locks (a timed or tried mesh_lock_all that failed). */
static void mesh_unlock_first(struct mesh_locks *k, uint32_t n)
{
	while (n-- > 0)
		pthread_mutex_unlock(&k->rail[n]);
	pthread_mutex_unlock(&k->ctl);
}

/* The rails' locks are waited for by abs too: a rail's thread holds its lock while its transport
 * works inside a poll (connection requests: QPs and CQs created, routes resolved), which under a
 * handshake storm took seconds, and the control socket must not wait behind it. */
int mesh_lock_all_by(struct mesh_locks *k, const struct timespec *abs)
{
	int ret;

	atomic_fetch_add(&k->all_waiting, 1);
	ret = pthread_mutex_clocklock(&k->ctl, CLOCK_MONOTONIC, abs);
	for (uint32_t r = 0; !ret && r < k->n_rails; r++) {
		ret = pthread_mutex_clocklock(&k->rail[r], CLOCK_MONOTONIC, abs);
		if (ret)
			mesh_unlock_first(k, r);
	}
	atomic_fetch_sub(&k->all_waiting, 1);
	return ret;
}

int mesh_trylock_all(struct mesh_locks *k)
{
	int ret = pthread_mutex_trylock(&k->ctl);

	for (uint32_t r = 0; !ret && r < k->n_rails; r++) {
		ret = pthread_mutex_trylock(&k->rail[r]);
		if (ret)
			mesh_unlock_first(k, r);
	}
	return ret;
}

void mesh_unlock_all(struct mesh_locks *k)
{
	for (uint32_t r = k->n_rails; r-- > 0;)
		pthread_mutex_unlock(&k->rail[r]);
	pthread_mutex_unlock(&k->ctl);
}

/* Rail 0's keepalive by WRITE (MESH_FEAT_KA_WRITE): the sequence number into the peer's mailbox
 * word, every interval whether or not the last one completed. Its completion waits for the peer's
 * acknowledgement, which over tcp queues behind everything the peer sends us (a stream moved onto
 * rail 0 took it past the timeout): the peer must see the word change all the same. The source
 * word is shared by the writes in flight: one may carry a newer number, any change is life. */
static int link_ka_write(struct link *l, uint64_t seq)
{
	uint8_t *src = l->buf + BUF_KA_OFF(l->mesh); /* the WRITE's source must be registered memory */
	int ret;

	if (!l->conns[0] || l->sq_used[0] >= LINK_SQ_DEPTH)
		return -ENOBUFS; /* all slots busy: the peer is not completing our sends, the timeout decides */
	memcpy(src, &seq, MESH_KA_LEN);
	ret = xport_post_write(l->conns[0], l->mr_local, src, MESH_KA_LEN, l->peer_mb_addr + MESH_KA_OFF,
			       l->peer_mb_rkey, WR_ID(WR_KA_WRITE, (uint32_t)seq));
	if (ret)
		return ret;
	l->sq_used[0]++;
	l->ka_write_us = util_now_us();
	l->ka_write_seq = seq;
	link_metrics_ka_sent(&l->metrics, 0, seq); /* counts a miss if the last one is not completed */
	return 0;
}

/* The peer's keepalive word in our mailbox: changed since the last look, the peer (on rail 0) is
 * alive. Any value counts: the peer writes what it likes into its mailbox slot, and a word read
 * while a write lands may be half new, which is as much a sign of life. */
static void link_ka_look(struct link *l, uint64_t t)
{
	uint64_t w;

	if (!(l->features & MESH_FEAT_KA_WRITE) || !(l->rails_up & 1u))
		return;
	w = link_ka_word(l);
	if (w != l->ka_word_seen) {
		l->ka_word_seen = w;
		l->last_rx_ms = t;
		l->rail_rx_ms[0] = t;
	}
}

/* How long the dialler's attempt may wait for its QPs. A link that was UP and went DOWN is dialled
 * again within backoff_initial_ms, often while the cable is still cut (its peer sees the loss later,
 * and whoever mends it later still): connection requests sent then are lost, and the CM sends them
 * again only after 4.3 s (cma's response timeout; rdma_cm offers no way to shorten it), long after
 * the wire is back. In the Soft-RoCE VM the link came UP 4.4 s after the cable was mended, the
 * rail that was mended last holding the attempt, and a channel waiting to resume was lost for want
 * of that second (tests/integration/resilience_test.py). So such a re-dial gets
 * LINK_REDIAL_FIRST_MS for all of its QPs, each failure doubling it up to adm_no_answer_ms, as TCP
 * doubles its SYN's timeout and a rail's join does here (rail_join_timeout_ms), but never past
 * LINK_REDIAL_MAX_MS, below the CM's own 4.3 s, unless attempts take longer now (admission's
 * smoothed time): waiting longer for a request that was lost gains nothing. The next attempt, a
 * newer epoch, replaces the half-made one at the acceptor. A link's first formation keeps
 * adm_no_answer_ms: a mesh forming at once answers late, and admission paces it. */
#define LINK_REDIAL_FIRST_MS 1000
#define LINK_REDIAL_MAX_MS 4000

static uint64_t link_qps_wait_ms(const struct link *l)
{
	const struct mesh *m = l->mesh;
	uint64_t max = mesh_adm_no_answer_ms(m);

	if (!l->ups)
		return max;
	max = MIN(max, MAX((uint64_t)LINK_REDIAL_MAX_MS, m->adm.srtt_ms + 4 * m->adm.rttvar_ms));
	/* failures counts the DOWN itself (link_fail): the first re-dial comes after one. */
	return doubled(LINK_REDIAL_FIRST_MS, l->failures ? l->failures - 1 : 0, max);
}

/* An UP link's liveness: nothing from the peer within the keepalive timeout takes it DOWN, and a
 * rail that stays silent is lost. false: the link went DOWN. */
static bool link_tick_liveness(struct link *l, uint64_t t)
{
	struct mesh *m = l->mesh;
	/* Without agreed keepalives the peer sends nothing periodic: only disconnects count; nor does a
	 * tick after a stall judge (mesh.h tick_no_liveness). */
	bool judge = (l->features & MESH_FEAT_KEEPALIVE) && !m->tick_no_liveness;

	link_ka_look(l, t);
	if (judge && t - l->last_rx_ms > m->cfg->keepalive_timeout_ms) {
		link_fail(l, -MESH_EKEEPALIVE, "nothing from node %u for %llu ms", l->peer->id,
			  (unsigned long long)(t - l->last_rx_ms));
		return false;
	}
	/* Every rail answers on its own: a rail that dies while no channel writes on it is seen. */
	for (uint32_t r = 0; r < m->n_rails && judge && m->n_rails > 1; r++) {
		if ((l->rails_up & (1u << r)) && t - l->rail_rx_ms[r] > m->cfg->keepalive_timeout_ms) {
			link_rail_fail(l, r, -MESH_EKEEPALIVE, "nothing from node %u on rail %u (%s) for %llu ms", l->peer->id,
				       r, mesh_node_addr(l->peer, r), (unsigned long long)(t - l->rail_rx_ms[r]));
			if (l->phase != LINK_UP)
				return false;
		}
	}
	return true;
}

/* A sequenced link's control: messages to send again, RailDowns and acks owed, and its rails: the
 * dialler re-dials a failed one, a join that takes too long fails. false: the link went DOWN. */
static bool link_tick_rails(struct link *l, uint64_t t)
{
	struct mesh *m = l->mesh;

	link_ctl_resend(l);
	link_send_raildowns(l);
	if (l->phase != LINK_UP)
		return false;
	if (l->ctl_rcvd != l->ctl_ack_sent)
		link_send_ack(l);
	for (uint32_t r = 0; r < m->n_rails; r++) {
		if (!(l->rails_joining & (1u << r))) {
			/* The dialler brings a failed rail back; not while the peer has yet to hear that it
			 * failed. */
			if (l->dialer && !(l->rails_up & (1u << r)) && !(l->raildown_pending & (1u << r)) &&
			    t >= l->rail_next_dial_ms[r])
				link_rail_dial(l, r);
		} else if (t - l->rail_attempt_ms[r] > rail_join_timeout_ms(l, r)) {
			link_rail_fail(l, r, -MESH_EHANDSHAKE, "rail %u not UP %llu ms after it was dialled", r,
				       (unsigned long long)(t - l->rail_attempt_ms[r]));
		} else {
			link_rail_progress(l, r); /* a RailUp that found no send slot */
		}
		if (l->phase != LINK_UP)
			return false;
	}
	return true;
}

/* A keepalive on every UP rail: rail 0's by WRITE where agreed, the others as messages. */
static void link_tick_keepalives(struct link *l, uint64_t t)
{
	struct mesh *m = l->mesh;
	Keepalive k = KEEPALIVE__INIT;
	PeerMsg msg = PEER_MSG__INIT;
	int ret;

	k.seq = ++l->ka_seq;
	msg.body_case = PEER_MSG__BODY_KEEPALIVE;
	msg.keepalive = &k;
	for (uint32_t r = 0; r < m->n_rails; r++) {
		if (!(l->rails_up & (1u << r)))
			continue;
		if (r == 0 && (l->features & MESH_FEAT_KA_WRITE)) {
			ret = link_ka_write(l, k.seq);
		} else {
			/* Read the clock only for a message: rail 0's write needs none here, and a clock
			 * read is a system call where the clock source is an emulated HPET. */
			if (!k.sent_us)
				k.sent_us = util_now_us();
			ret = link_send_on(l, r * m->cfg->qps_per_link, &msg);
			if (!ret)
				link_metrics_ka_sent(&l->metrics, r, k.seq);
		}
		if (!ret)
			l->ka_tx_ms[r] = t;
		/* All slots busy means the peer is not completing our sends: the timeout decides (and
		 * its DOWN says how many were skipped). */
		if (ret == -ENOBUFS)
			l->ka_skipped[r]++;
		else if (ret) {
			link_rail_fail(l, r, ret, "cannot send a keepalive on rail %u", r);
			if (l->phase != LINK_UP)
				return;
		}
	}
	l->next_ka_ms = t + m->cfg->keepalive_interval_ms;
}

/* An attempt in its handshake: a dial nobody answers (no listener, or an address RDMA cannot
 * reach, where the CM would retry for long) is given up after adm_no_answer_ms: twice the resolve
 * timeout, or longer while attempts take longer. A re-dial of a link that was UP is given up
 * sooner, whenever some of its QPs are missing (link_qps_wait_ms). Any attempt ends at the
 * handshake timeout. */
static void link_tick_attempt(struct link *l, uint64_t t)
{
	uint32_t est = link_qps_established(l);

	if (l->dialer && l->phase == LINK_QPS && (est == 0 || l->ups) && t - l->attempt_ms > link_qps_wait_ms(l))
		link_fail(l, -ETIMEDOUT, "%s from %s:%u over %s within %llu ms", est ? "not every QP answered" : "no answer",
			  l->peer->addr, l->peer->port, link_transport(l), (unsigned long long)(t - l->attempt_ms));
	else if (t - l->attempt_ms > l->mesh->cfg->handshake_timeout_ms)
		link_fail(l, -MESH_EHANDSHAKE, "not UP after %llu ms in phase %s", (unsigned long long)(t - l->attempt_ms),
			  link_phase_name(l->phase));
}

static void link_tick(struct link *l, uint64_t t)
{
	if (phase_in_handshake(l->phase)) {
		link_tick_attempt(l, t);
		return;
	}
	if (l->phase != LINK_UP || !link_tick_liveness(l, t))
		return;
	if (link_sequenced(l) && !link_tick_rails(l, t))
		return;
	if (t >= l->next_ka_ms && (l->features & MESH_FEAT_KEEPALIVE))
		link_tick_keepalives(l, t);
}

/* A packet lost on a rail (a congested switch, a dropping virtual NIC) is sent again by the NIC
 * only after the QP's ACK timeout, and everything queued behind it on that QP waits: the rail's
 * keepalives too. Go-back-N sends the whole window again, which can be lost again: a failover's
 * burst onto the surviving rail of the Soft-RoCE VM lost packets up to six times in a row, 0.54 s
 * each at rdma_cm's default, and the link went DOWN with both of its peers alive (its other rail
 * was the one cut). So each attempt gets at most an eighth of the keepalive timeout: a few losses
 * in a row are repaired within it. The NIC gives up after 8 attempts (retry_count 7), so a rail
 * whose peer NIC answers nothing for about that long fails at once with a QP error, before the
 * keepalive timeout: the same verdict, sooner. */
uint8_t mesh_ack_timeout(uint32_t keepalive_timeout_ms)
{
	uint64_t budget_ns = (uint64_t)keepalive_timeout_ms * 1000000ull / 8;
	uint8_t n = MESH_ACK_TIMEOUT_MIN;

	if ((4096ull << MESH_ACK_TIMEOUT_DEFAULT) <= budget_ns)
		return 0;
	while (n + 1 < MESH_ACK_TIMEOUT_DEFAULT && (4096ull << (n + 1)) <= budget_ns)
		n++;
	return n;
}

void mesh_tick(struct mesh *m, uint64_t t)
{
	m->adm.ticks++;
	for (uint32_t r = 0; r < m->n_rails; r++) {
		struct mesh_numa_thread *th = &m->numa.threads[r];

		if (th->wakes != th->wakes_seen || !th->wake_seen_ms) {
			th->wakes_seen = th->wakes;
			th->wake_seen_ms = t;
		}
	}
	for (size_t i = 0; i < m->n_links; i++)
		link_tick(m->links[i], t);
	mesh_leaving_tick(m, t, false);
	mesh_admit(m, t);
	ping_tick(m, t);
	if (m->upper)
		m->upper->tick(m, t);
}

void mesh_stop(struct mesh *m, int reason)
{
	m->stopping = true;
	for (size_t i = 0; i < m->n_links; i++) {
		struct link *l = m->links[i];

		if (l->phase == LINK_UP && (l->features & MESH_FEAT_GOODBYE)) {
			Goodbye g = GOODBYE__INIT;
			PeerMsg msg = PEER_MSG__INIT;

			g.reason = (uint32_t)reason;
			msg.body_case = PEER_MSG__BODY_GOODBYE;
			msg.goodbye = &g;
			mesh_link_send(l, &msg);
		}
	}
}

/* Called after mesh_stop() once the goodbyes had their chance: disconnect everything. */
static void mesh_disconnect_all(struct mesh *m)
{
	for (size_t i = 0; i < m->n_links; i++)
		link_fail(m->links[i], -ECANCELED, "meshd is stopping");
	mesh_reap(m);
}

int mesh_init(struct mesh *m, const struct mesh_config *cfg, const struct config_node *self, xport_t *const *xports,
	      size_t n_xports)
{
	memset(m, 0, sizeof(*m));
	ping_init(m);
	m->numa.home = -1; /* unplaced until main.c learns the topology */
	for (size_t r = 0; r < MESH_RAILS_MAX; r++)
		m->numa.rail_node[r] = -1;
	m->numa.why = "not set up";
	m->n_rails = MAX(1u, self->n_rails);
	if (!n_xports || n_xports > MESH_XPORT_INSTANCES || m->n_rails > MESH_RAILS_MAX || n_xports % m->n_rails)
		return -EINVAL;
	m->cfg = cfg;
	m->self = self;
	for (size_t i = 0; i < n_xports; i++) {
		m->xports[i] = xports[i];
		if (i % m->n_rails)
			continue;
		if (i)
			strncat(m->xport_names, "+", sizeof(m->xport_names) - strlen(m->xport_names) - 1);
		strncat(m->xport_names, xport_name(xports[i]), sizeof(m->xport_names) - strlen(m->xport_names) - 1);
	}
	m->n_xports = n_xports / m->n_rails;
	m->cluster_hash = mesh_cluster_hash(cfg->cluster_name);
	m->reject_log.burst = REJECT_LOG_BURST;
	m->reject_log.interval_ms = REJECT_LOG_INTERVAL_MS;
	m->boot_epoch = util_wall_us();
	m->start_ms = now_ms();
	m->links = calloc(cfg->n_nodes, sizeof(*m->links));
	if (!m->links)
		return -ENOMEM;
	m->links_cap = cfg->n_nodes;
	for (size_t i = 0; i < cfg->n_nodes; i++) {
		struct link *l;

		if (cfg->nodes[i].id == self->id)
			continue;
		l = mesh_link_new(m, &cfg->nodes[i]);
		if (!l) {
			mesh_cleanup(m);
			return -ENOMEM;
		}
		m->links[m->n_links++] = l;
	}
	mesh_adm_init(m);
	return 0;
}

void mesh_cleanup(struct mesh *m)
{
	if (!m->links)
		return;
	if (m->upper)
		m->upper->cleanup(m);
	mesh_leaving_tick(m, now_ms(), true);
	mesh_disconnect_all(m);
	for (size_t i = 0; i < m->n_links; i++)
		mesh_link_free(m, m->links[i], false);
	free(m->links);
	m->links = NULL;
	m->n_links = m->links_cap = 0;
	explicit_bzero(&m->keys, sizeof(m->keys));
	free(m->grave.conns);
	free(m->grave.mrs);
	free(m->grave.maps);
	memset(&m->grave, 0, sizeof(m->grave));
}
